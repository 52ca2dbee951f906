"""scheduler service install/status/uninstall into a temporary XDG config dir (unit text, systemd-analyze verify when
available), and SIGHUP reloading the settings of a real `scheduler run` process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kernel_testing import add_job, run_rows, scheduler_cmd, wait_for

from scheduler.core.queue import enqueue_manual
from scheduler.plugins.stores import open_store


def svc(tmp_path: Path, *args: str, db: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    env.pop("SCHEDULER_CONFIG", None)
    return subprocess.run([*scheduler_cmd(), "--db", db or str(tmp_path / "data dir" / "s.db"), "--json", "service", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_install_writes_a_user_unit_with_the_environment_and_policies(tmp_path: Path) -> None:
    (tmp_path / "xdg" / "scheduler").mkdir(parents=True)
    (tmp_path / "xdg" / "scheduler" / "config.toml").write_text("[dispatcher]\ngrace_s = 20\n")
    dry = svc(tmp_path, "install", "--dry-run", "--name", "sched-test")
    assert dry.returncode == 0, dry
    unit = tmp_path / "xdg" / "systemd" / "user" / "sched-test.service"
    assert not unit.exists() and json.loads(dry.stdout)["service"]["path"] == str(unit)
    out = svc(tmp_path, "install", "--name", "sched-test")
    assert out.returncode == 0, out
    text = unit.read_text()
    assert text == json.loads(dry.stdout)["service"]["text"]
    bindir = str(Path(sys.executable).absolute().parent)
    assert f"ExecStart={bindir}/scheduler run\n" in text
    assert f'Environment="SCHEDULER_DB={tmp_path}/data dir/s.db"\n' in text  # quoted: the path has a space
    assert f"Environment=SCHEDULER_CONFIG={tmp_path}/xdg/scheduler/config.toml\n" in text
    assert f"Environment=PATH={bindir}:" in text
    for line in ("Restart=on-failure", "KillMode=mixed", "KillSignal=SIGTERM", "ExecReload=/bin/kill -HUP $MAINPID",
                 "TimeoutStopSec=37s", "WantedBy=default.target"):  # 20 s grace + 2 s kill grace + 15 s
        assert f"\n{line}\n" in text, line
    verify = json.loads(out.stdout)["service"]["verify"]
    if shutil.which("systemd-analyze"):
        assert verify["ok"], verify["output"]
    else:
        assert verify is None
    status = json.loads(svc(tmp_path, "status", "--name", "sched-test").stdout)["service"]
    assert status["installed"] and status["ours"] and status["database"] == f"{tmp_path}/data dir/s.db"
    if not shutil.which("systemctl"):
        assert "systemctl not found" in status["systemctl"]
    assert svc(tmp_path, "uninstall", "--name", "sched-test").returncode == 0
    assert not unit.exists()
    again = svc(tmp_path, "uninstall", "--name", "sched-test")
    assert json.loads(again.stdout)["code"] == "SERVICE_NOT_INSTALLED"
    assert json.loads(svc(tmp_path, "status", "--name", "sched-test").stdout)["service"]["installed"] is False


def test_system_unit_dry_run_and_refusals(tmp_path: Path) -> None:
    out = json.loads(svc(tmp_path, "install", "--system", "--dry-run").stdout)["service"]
    assert out["path"] == "/etc/systemd/system/scheduler.service" and not out["written"]
    assert "WantedBy=multi-user.target" in out["text"] and "\nUser=" in out["text"]
    bad = json.loads(svc(tmp_path, "install", "--dry-run", db="postgresql://u:secret@127.0.0.1/test").stdout)
    assert bad["code"] == "INVALID_ARGUMENT" and "secret" not in json.dumps(bad)
    assert json.loads(svc(tmp_path, "install", "--name", "../evil").stdout)["code"] == "INVALID_ARGUMENT"
    foreign = tmp_path / "xdg" / "systemd" / "user" / "other.service"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("[Service]\nExecStart=/bin/true\n")
    assert json.loads(svc(tmp_path, "uninstall", "--name", "other").stdout)["code"] == "SERVICE_UNSUPPORTED"
    assert foreign.exists()


def test_sighup_reloads_settings_and_keeps_them_when_the_new_file_is_invalid(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    cfg = tmp_path / "config.toml"
    cfg.write_text("[executors.shell]\nmax_output_bytes = 1048576\n")
    store = open_store(db)
    job = add_job(store, executor="shell", name="talk", payload_message="head -c 5000 /dev/zero | tr '\\0' y")
    log = tmp_path / "run.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([*scheduler_cmd(), "--db", str(db), "run", "--grace", "1s"], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "SCHEDULER_CONFIG": str(cfg)})
    try:
        wait_for(lambda: "holds lease" in log.read_text(), timeout=30, what="dispatcher ready")

        def run_once(n: int) -> dict:
            enqueue_manual(store, job["id"])
            return wait_for(lambda: len(done := [r for r in run_rows(store, job["id"]) if r["terminal_at"]]) >= n and done,
                            timeout=30, what=f"run {n}")

        assert all(r["status"] == "ok" for r in run_once(1))
        cfg.write_text("[executors.shell]\nmax_output_bytes = 100\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "settings reloaded from file:" in log.read_text(), timeout=20, what="reload")
        second = max(run_once(2), key=lambda r: r["created_at"])
        assert second["status"] == "error" and second["error_code"] == "OUTPUT_LIMIT_EXCEEDED", second
        cfg.write_text("[executors.shell]\nmax_output_bytes = 'lots'\n[nonsense]\nx = 1\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "settings reload failed (CONFIG_INVALID), keeping the previous settings" in log.read_text(),
                 timeout=20, what="refused reload")
        assert proc.poll() is None
        third = max(run_once(3), key=lambda r: r["created_at"])
        assert third["error_code"] == "OUTPUT_LIMIT_EXCEEDED", third  # the previous (valid) settings still apply
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        store.close()
    assert proc.returncode == 0, log.read_text()


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    from scheduler.ops.service_unit import verify

    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart=relative/path run\nKillMode=sometimes\n")
    assert verify(bad)["ok"] is False
