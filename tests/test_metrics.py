"""scheduler run --metrics-port: Prometheus text scraped over loopback with httpx from a real `scheduler run` process,
on SQLite and PostgreSQL; a port in use is a coded error."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from kernel_testing import add_job, scheduler_cmd, wait_for

from scheduler.plugins.stores import open_store


def _sample(text: str, metric: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(metric):
            continue
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? (\S+)$", line)
        if not m or m.group(1) != metric:
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
            fast = _sample(t, "scheduler_runs_finished_total", status="ok") or 0
            failing = _sample(t, "scheduler_runs_finished_total", status="error") or 0
            return t if fast >= 2 and failing >= 1 else None

        text = wait_for(counted, timeout=30, what="runs counted")
        assert _sample(text, "scheduler_run_lateness_seconds_count")
        assert (_sample(text, "scheduler_run_lateness_seconds_bucket", le="+Inf") or 0) >= 3
        assert _sample(text, "scheduler_run_duration_seconds_count", status="ok")
        assert _sample(text, "scheduler_queue_depth", status="pending") is not None
        assert _sample(text, "scheduler_database_up") == 1
        assert _sample(text, "scheduler_lease_holder", name="dispatcher", host=socket.gethostname()) == 1
        assert (_sample(text, "scheduler_lease_token", name="dispatcher") or 0) >= 1
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
        from scheduler.plugins.stores import open_store

        open_store(tmp_path / "s.db").close()  # `scheduler run` refuses a missing database (issue 30)
        out = subprocess.run([*scheduler_cmd(), "--db", str(tmp_path / "s.db"), "--json", "run", "--metrics-port", str(port)],
                             capture_output=True, text=True, timeout=60, env={**os.environ})
    assert out.returncode != 0
    assert '"code": "METRICS_PORT_UNAVAILABLE"' in out.stdout, out


def test_no_metrics_flag_imports_no_prometheus_client(tmp_path: Path) -> Any:
    code = ("import sys; from scheduler.cli.main import main; main(['--db', sys.argv[1], 'run', '--duration', '200ms']);"
            " print('prometheus_client' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.db")], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "False", out


def _families(url: str) -> dict[str, Any]:
    """One scrape over loopback, parsed by prometheus_client's own text parser: family name -> family."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(url, timeout=5)
    assert r.status_code == 200, r
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def _samples(families: dict[str, Any], sample_name: str) -> list[Any]:
    return [s for f in families.values() for s in f.samples if s.name == sample_name]


def _start_metrics_dispatcher(store_url: str, log: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    with open(log, "wb") as fh:
        proc = subprocess.Popen([*scheduler_cmd(), "--db", store_url, "run", "--metrics-port", "0", "--lease-ttl", "3s",
                                 "--grace", "1s"], stdout=fh, stderr=subprocess.STDOUT, env=env)
    url = wait_for(lambda: re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", log.read_text()), timeout=30,
                   what="metrics address").group(1)
    return proc, url


def test_series_are_stable_across_restarts_and_catch_ups_are_counted_apart(store_url: str, tmp_path: Path) -> None:
    """Issue 32 stumble 5: lease series keep their labels over a restart, no per-job label unless the host opts in,
    no ``_created`` series, and a past one-shot's catch-up stays out of the lateness histogram."""
    store = open_store(store_url)
    add_job(store, executor="shell", name="fast", schedule_kind="every", schedule_every="1s", payload_message="true")
    year_ago = int(time.time() * 1000) - 365 * 86_400_000
    add_job(store, executor="shell", name="overdue", schedule_kind="at", schedule_at=year_ago, allow_past_at=True,
            payload_message="true")
    store.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_DISPATCHER_")}
    holders: list[list[dict[str, str]]] = []
    for round_, extra in enumerate(({}, {"SCHEDULER_DISPATCHER_METRICS_JOB_LABEL": "true"})):
        proc, url = _start_metrics_dispatcher(store_url, tmp_path / f"run{round_}.log", {**env, **extra})
        try:
            def counted(url: str = url) -> dict[str, Any] | None:
                fams = _families(url)
                ok = sum(s.value for s in _samples(fams, "scheduler_runs_finished_total") if s.labels.get("status") == "ok")
                return fams if ok >= 3 else None

            fams = wait_for(counted, timeout=30, what="runs counted")
            assert not [s for f in fams.values() for s in f.samples if s.name.endswith("_created")]
            runs = _samples(fams, "scheduler_runs_finished_total")
            if round_ == 0:
                assert runs and all(set(s.labels) == {"status"} for s in runs), runs
                # the year-late one-shot ran in this round: it is a catch-up, not lateness
                catch_up = _samples(fams, "scheduler_run_catch_up_lateness_seconds_count")
                assert catch_up and catch_up[0].value == 1, catch_up
                assert _samples(fams, "scheduler_run_catch_up_lateness_seconds_sum")[0].value > 300 * 86_400
                late_sum = _samples(fams, "scheduler_run_lateness_seconds_sum")[0].value
                late_count = _samples(fams, "scheduler_run_lateness_seconds_count")[0].value
                assert late_count >= 2 and late_sum < 60, (late_count, late_sum)
            else:
                assert {s.labels.get("job") for s in runs} == {"fast"}, runs  # opted in: the job label is back
            # no label carries the pid, the owner id or the token (on PostgreSQL each dispatcher's lease is named
            # dispatcher:<host>:<pid>:<random>; it is counted as kind "dispatcher")
            lease_samples = [s for f in fams.values() if f.name.startswith("scheduler_lease") for s in f.samples]
            assert lease_samples and not [s for s in lease_samples if set(s.labels) - {"name", "host"}
                                          or any(str(proc.pid) in v or ":" in v for v in s.labels.values())], lease_samples
            holder = [s for s in _samples(fams, "scheduler_lease_holder") if s.labels["name"] == "dispatcher"]
            assert [(s.labels["host"], s.value) for s in holder] == [(socket.gethostname(), 1)], holder
            holders.append(sorted(tuple(sorted(s.labels.items())) for s in lease_samples))
            token = [s for s in _samples(fams, "scheduler_lease_token") if s.labels == {"name": "dispatcher"}]
            assert len(token) == 1 and token[0].value >= 1, token
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    assert holders[0] == holders[1]  # the restart continued the same series
