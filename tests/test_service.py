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
    status = _status(tmp_path, "sched-test")
    assert status["installed"] and status["ours"] and status["database"] == f"{tmp_path}/data dir/s.db"
    if not shutil.which("systemctl"):
        assert "systemctl not found" in status["systemctl"]
    assert svc(tmp_path, "uninstall", "--name", "sched-test").returncode == 0
    assert not unit.exists()
    again = svc(tmp_path, "uninstall", "--name", "sched-test")
    assert json.loads(again.stdout)["code"] == "SERVICE_NOT_INSTALLED"
    assert _status(tmp_path, "sched-test")["installed"] is False


def _status(tmp_path: Path, name: str) -> dict:
    """`service status`'s answer: the service object, or (no reachable systemd here) the error's details."""
    out = svc(tmp_path, "status", "--name", name)
    body = json.loads(out.stdout)
    if out.returncode == 0:
        return body["service"]
    assert body["code"] == "SERVICE_MANAGER_UNREACHABLE", body
    return body["details"]


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


STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: systemd-analyze security --offline=yes of the system unit: 9.6 (UNSAFE) before hardening, 6.7 (MEDIUM) after,
#: measured with systemd 252 on a unit for root; the test fails above this.
EXPOSURE_LIMIT = 7.0


def test_user_unit_has_no_network_target_and_a_clean_path(tmp_path: Path) -> None:
    """Issue 32 stumble 6: network-online.target means nothing to a user manager, and the installing shell's PATH
    (pyenv shims, duplicates) is not copied: the venv's bin and the standard system directories, once each."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "PATH": f"{tmp_path}/.pyenv/shims:/usr/bin:{tmp_path}/.pyenv/shims:/usr/bin:{os.environ['PATH']}"}
    env.pop("SCHEDULER_CONFIG", None)
    out = subprocess.run([*scheduler_cmd(), "--db", str(tmp_path / "s.db"), "--json", "service", "install", "--dry-run"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out
    text = json.loads(out.stdout)["service"]["text"]
    assert "network-online.target" not in text
    bindir = str(Path(sys.executable).absolute().parent)
    paths = next(ln for ln in text.splitlines() if ln.startswith("Environment=PATH=")).split("=", 2)[2].split(":")
    assert paths[0] == bindir and ":".join(p for p in paths[1:]) == ":".join(
        p for p in STANDARD_PATH.split(":") if p != bindir), paths
    system = json.loads(svc(tmp_path, "install", "--system", "--dry-run").stdout)["service"]["text"]
    assert "After=network-online.target" in system and "Wants=network-online.target" in system  # a system manager has it


def _exposure(path: Path) -> float:
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(path)], capture_output=True, text=True, timeout=60)
    line = next(ln for ln in (out.stdout + out.stderr).splitlines() if "Overall exposure level" in ln)
    return float(line.split(":", 1)[1].split()[0])


def test_system_unit_is_hardened(tmp_path: Path) -> None:
    """NoNewPrivileges, ProtectSystem=strict with the database directory and the artifacts root writable, PrivateTmp,
    ProtectHome=read-only; systemd-analyze (when installed) verifies the unit and rates it below EXPOSURE_LIMIT."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "SCHEDULER_ARTIFACTS_DIR": str(tmp_path / "art")}
    env.pop("SCHEDULER_CONFIG", None)
    out = subprocess.run([*scheduler_cmd(), "--db", str(tmp_path / "data dir" / "s.db"), "--json", "service", "install",
                          "--system", "--dry-run"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out
    text = json.loads(out.stdout)["service"]["text"]
    lines = text.splitlines()
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "ProtectHome=read-only",
                 f'ReadWritePaths="-{tmp_path}/data dir"', f"ReadWritePaths=-{tmp_path}/art"):
        assert line in lines, line
    user_text = json.loads(svc(tmp_path, "install", "--dry-run").stdout)["service"]["text"]
    assert "ProtectSystem" not in user_text and "NoNewPrivileges" not in user_text  # a user manager cannot apply them
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed: the unit text was checked, not its rating")
    unit = tmp_path / "scheduler.service"
    unit.write_text(text)
    from scheduler.ops.service_unit import verify

    assert verify(unit)["ok"], verify(unit)
    assert _exposure(unit) < EXPOSURE_LIMIT
    unhardened = tmp_path / "unhardened.service"  # the rating can fail: the same unit without its sandbox is UNSAFE
    unhardened.write_text("\n".join(ln for ln in lines if not ln.startswith(("NoNewPrivileges", "Protect", "Private", "ReadWrite",
                                                                            "Restrict", "Lock", "SystemCall"))) + "\n")
    assert _exposure(unhardened) > 9


def test_system_install_and_doctor_name_jobs_that_write_outside_the_sandbox(tmp_path: Path) -> None:
    db = tmp_path / "data" / "s.db"
    store = open_store(db)
    add_job(store, executor="shell", name="logs-to-var", payload_message="date >> /var/log/sched-test.log")
    add_job(store, executor="shell", name="tees-to-etc", payload_message="echo x | tee -a /etc/motd")
    add_job(store, executor="shell", name="tmp-only", payload_message="echo x > /tmp/x.txt 2>&1; echo y >/dev/null")
    add_job(store, executor="shell", name="beside-db", payload_message=f"echo x >> {tmp_path}/data/out.txt; echo >&2 no")
    store.close()
    crontab = tmp_path / "root.crontab"
    crontab.write_text("17 3 * * * /usr/sbin/logrotate /etc/logrotate.conf\n")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    env.pop("SCHEDULER_CONFIG", None)
    imported = subprocess.run([*scheduler_cmd(), "--db", str(db), "--json", "import", "crontab", str(crontab)],
                              capture_output=True, text=True, timeout=60, env=env)
    assert imported.returncode == 0, imported
    expected = {"logs-to-var", "tees-to-etc", next(j["name"] for j in json.loads(imported.stdout)["results"])}
    assert len(expected) == 3 and any(n.startswith("cron-") for n in expected)
    out = svc(tmp_path, "install", "--system", "--dry-run", db=str(db))
    assert out.returncode == 0, out
    warnings = json.loads(out.stdout)["service"]["sandbox_warnings"]
    assert {w["job"] for w in warnings} == expected, warnings
    assert next(w for w in warnings if w["job"] == "logs-to-var")["paths"] == ["/var/log/sched-test.log"]
    human = subprocess.run([*scheduler_cmd(), "--db", str(db), "service", "install", "--system", "--dry-run"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert human.returncode == 0 and "logs-to-var" in human.stderr and "ProtectSystem=strict" in human.stderr, human
    assert json.loads(svc(tmp_path, "install", "--dry-run", db=str(db)).stdout)["service"]["sandbox_warnings"] == []
    doctor = subprocess.run([*scheduler_cmd(), "--db", str(db), "--json", "doctor"], capture_output=True, text=True,
                            timeout=120, env=env)
    body = json.loads(doctor.stdout)
    checks = body.get("checks") or body.get("details")
    check = next(c for c in checks if c["check"] == "service_sandbox")
    assert check["ok"] and check["warning"] and {w["job"] for w in check["jobs"]} == expected, check
    assert all(name in check["detail"] for name in expected)


def test_status_without_a_reachable_service_manager_is_a_coded_error(tmp_path: Path) -> None:
    """`service status` cannot say whether the unit runs without systemd's bus: SERVICE_MANAGER_UNREACHABLE, exit 1,
    with what it could read (the unit file) in details."""
    base = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    base.pop("SCHEDULER_CONFIG", None)
    (tmp_path / "run").mkdir()
    no_bus = {**base, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "DBUS_SESSION_BUS_ADDRESS": f"unix:path={tmp_path}/run/none"}
    (tmp_path / "bin").mkdir()
    no_systemctl = {**base, "PATH": str(tmp_path / "bin")}
    cases = [no_systemctl] + ([no_bus] if shutil.which("systemctl") else [])
    for env in cases:
        out = subprocess.run([*scheduler_cmd(), "--db", str(tmp_path / "s.db"), "--json", "service", "status"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 1, out
        body = json.loads(out.stdout)
        assert body["code"] == "SERVICE_MANAGER_UNREACHABLE" and body["details"]["installed"] is False, body
        human = subprocess.run([*scheduler_cmd(), "--db", str(tmp_path / "s.db"), "service", "status"],
                               capture_output=True, text=True, timeout=60, env=env)
        assert human.returncode == 1 and "SERVICE_MANAGER_UNREACHABLE" in human.stderr and "unit" in human.stdout, human
