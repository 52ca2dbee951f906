"""scheduler run --metrics-port: Prometheus text scraped over loopback with httpx from a real `scheduler run` process,
on SQLite and PostgreSQL; a port in use is a coded error."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from kernel_testing import add_job, scheduler_cmd, wait_for

from scheduler.plugins.stores import open_store


def _sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None


def test_metrics_are_served_over_loopback_from_a_real_dispatcher(store_url: str, tmp_path: Path) -> None:
    store = open_store(store_url)
    add_job(store, executor="shell", name="fast", schedule_kind="every", schedule_every="1s", payload_message="true")
    add_job(store, executor="shell", name="failing", schedule_kind="every", schedule_every="1s", payload_message="exit 3")
    store.close()
    log = tmp_path / "run.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([*scheduler_cmd(), "--db", store_url, "run", "--metrics-port", "0", "--lease-ttl", "3s",
                                 "--grace", "1s"], stdout=fh, stderr=subprocess.STDOUT)
    try:
        url = wait_for(lambda: re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", log.read_text()), timeout=30,
                       what="metrics address").group(1)

        def scrape() -> str:
            r = httpx.get(url, timeout=5)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            return r.text

        def counted() -> str | None:
            t = scrape()
            fast = _sample(t, "scheduler_runs_finished_total", job="fast", status="ok") or 0
            failing = _sample(t, "scheduler_runs_finished_total", job="failing", status="error") or 0
            return t if fast >= 2 and failing >= 1 else None

        text = wait_for(counted, timeout=30, what="runs counted")
        assert _sample(text, "scheduler_run_lateness_seconds_count")
        assert (_sample(text, "scheduler_run_lateness_seconds_bucket", le="+Inf") or 0) >= 3
        assert _sample(text, "scheduler_run_duration_seconds_count", status="ok")
        assert _sample(text, "scheduler_queue_depth", status="pending") is not None
        assert _sample(text, "scheduler_database_up") == 1
        holder = [ln for ln in text.splitlines() if ln.startswith("scheduler_lease_holder{")]
        assert holder and f":{proc.pid}:" in holder[0] and 'token="' in holder[0], holder
        assert "# TYPE scheduler_plugin_load_failures gauge" in text
        assert "# TYPE scheduler_outbox_parts gauge" in text
        # listening on loopback only
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        host_ips = {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1", "127.0.1.1"}
        for ip in host_ips:
            with socket.socket() as s:
                s.settimeout(1)
                assert s.connect_ex((ip, port)) != 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_metrics_port_in_use_is_a_coded_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run([*scheduler_cmd(), "--db", str(tmp_path / "s.db"), "--json", "run", "--metrics-port", str(port)],
                             capture_output=True, text=True, timeout=60, env={**os.environ})
    assert out.returncode != 0
    assert '"code": "METRICS_PORT_UNAVAILABLE"' in out.stdout, out


def test_no_metrics_flag_imports_no_prometheus_client(tmp_path: Path) -> Any:
    code = ("import sys; from scheduler.cli.main import main; main(['--db', sys.argv[1], 'run', '--duration', '200ms']);"
            " print('prometheus_client' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.db")], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "False", out
