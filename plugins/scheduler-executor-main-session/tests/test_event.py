"""Event mode with real fake `openclaw` executables written into tmp_path (ok, refusing, failing, hanging, garbage)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from scheduler_toolkit.process import group_alive

from scheduler.api import SchedulerError
from scheduler.testing import LocalRunControl, wait_for


@pytest.fixture
def use(monkeypatch):
    """Point [executors.main-session] openclaw_path (and other keys) at values, the kernel's override way."""

    def set_(**keys: object) -> None:
        for key, value in keys.items():
            monkeypatch.setenv(f"SCHEDULER_EXECUTORS_MAIN_SESSION_{key.upper()}", str(value))

    return set_


def test_an_event_is_sent_without_a_shell(fake_openclaw, calls, use, run_main, tmp_path) -> None:
    path, record = fake_openclaw("ok")
    use(openclaw_path=path)
    text = "Backups done; $(touch pwned) `touch pwned2` ; rm -rf x"
    ran = run_main(text, name="nightly", executor_options={"mode": "event", "event_mode": "queue"})
    r = ran.result
    assert (r.status, r.error_code, r.exit_code) == ("ok", None, 0), r
    (call,) = calls(record)
    assert call["argv"] == ["system", "event", "--text", f"[scheduler:{ran.request.job_id} nightly]\n{text}",
                            "--mode", "queue", "--json"]
    assert call["stdin"] == "" and not list(tmp_path.rglob("pwned*"))
    assert json.loads(r.stdout.excerpt) == {"ok": True, "mode": "queue", "eventId": "evt-1"}
    (handle,) = ran.control.handles
    assert handle["kind"] == "main-session-event" and handle["pgid"] == call["pgid"] == handle["pid"]
    assert r.details["event_mode"] == "queue" and r.details["answer_keys"] == ["eventId", "mode", "ok"]
    assert not any(name.startswith(("SCHEDULER_EXECUTORS", "MAIN_SESSION_TEST")) for name in call["env"])
    assert {"SCHEDULER_RUN_ID", "SCHEDULER_JOB_ID"} <= set(call["env"])


def test_the_default_mode_can_be_event(fake_openclaw, calls, use, run_main) -> None:
    path, record = fake_openclaw("ok")
    use(openclaw_path=path, default_mode="event")
    assert run_main().result.status == "ok"
    assert calls(record)[0]["argv"][-3:] == ["--mode", "now", "--json"]


def test_a_missing_binary_is_a_coded_error(use, run_main, tmp_path) -> None:
    use(openclaw_path=tmp_path / "nowhere" / "openclaw")
    r = run_main(executor_options={"mode": "event"}).result
    assert (r.status, r.error_code) == ("error", "MAIN_SESSION_COMMAND_NOT_FOUND")
    use(openclaw_path="openclaw-not-on-path-3f1c")
    assert run_main(executor_options={"mode": "event"}).result.error_code == "MAIN_SESSION_COMMAND_NOT_FOUND"
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\n")
    use(openclaw_path=plain)
    assert run_main(executor_options={"mode": "event"}).result.error_code == "MAIN_SESSION_COMMAND_NOT_FOUND"


@pytest.mark.parametrize(("variant", "code", "fragment"), [
    ("rejected", "MAIN_SESSION_EVENT_REJECTED", "gateway is draining"),
    ("fails", "MAIN_SESSION_COMMAND_FAILED", "gateway unreachable"),
    ("garbage", "MAIN_SESSION_EVENT_ANSWER_MALFORMED", "Event queued"),
    ("duplicate", "MAIN_SESSION_EVENT_ANSWER_MALFORMED", "duplicate"),
    ("trailing", "MAIN_SESSION_EVENT_ANSWER_MALFORMED", "and more"),
])
def test_answers_are_parsed_strictly(fake_openclaw, use, run_main, variant, code, fragment) -> None:
    path, _ = fake_openclaw(variant)
    use(openclaw_path=path)
    r = run_main(executor_options={"mode": "event"}).result
    assert (r.status, r.error_code) == ("error", code), r
    assert fragment in r.error_message


def test_output_is_bounded(fake_openclaw, use, run_main) -> None:
    path, _ = fake_openclaw("huge")
    use(openclaw_path=path, event_max_output_bytes=4096)
    r = run_main(executor_options={"mode": "event"}).result
    assert r.error_code == "MAIN_SESSION_COMMAND_OUTPUT_TOO_LARGE" and r.stdout.bytes == 4096


def _child_of(record: Path) -> int:
    child = Path(str(record) + ".child")
    wait_for(lambda: child.exists() and child.read_text(), what="the fake to start its child")
    return int(child.read_text())


def _runs(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a reaped-later zombie can no longer act)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_cancel_kills_the_whole_group_at_once(fake_openclaw, calls, use, run_main) -> None:
    path, record = fake_openclaw("hang")
    use(openclaw_path=path)
    control = LocalRunControl()
    out: dict = {}
    worker = threading.Thread(target=lambda: out.update(ran=run_main(control=control, executor_options={"mode": "event"})))
    worker.start()
    child = _child_of(record)
    pgid = calls(record)[0]["pgid"]
    control.cancel("user")
    worker.join(5)
    ran = out["ran"]
    assert (ran.result.status, ran.result.error_code) == ("cancelled", "RUN_CANCELLED")
    assert control.terminations and control.terminations[0] in ("SIGTERM", "SIGKILL")
    assert not group_alive(pgid)
    assert not _runs(child)


def test_the_command_timeout_and_the_run_deadline(fake_openclaw, calls, use, run_main) -> None:
    path, record = fake_openclaw("hang")
    use(openclaw_path=path, event_timeout_s=0.5)
    ran = run_main(executor_options={"mode": "event"})
    assert (ran.result.status, ran.result.error_code) == ("error", "MAIN_SESSION_COMMAND_TIMEOUT") and ran.elapsed < 4
    assert not group_alive(calls(record)[0]["pgid"])
    use(event_timeout_s=60)
    ran = run_main(executor_options={"mode": "event"}, run_timeout_ms=600)
    assert (ran.result.status, ran.result.error_code) == ("timeout", "RUN_TIMEOUT") and ran.control.terminations


def test_event_mode_refuses_what_it_cannot_deliver(fake_openclaw, use, run_main) -> None:
    path, _ = fake_openclaw("ok")
    use(openclaw_path=path)
    assert run_main(executor_options={"mode": "event", "agent_id": "ops"}).result.error_code == \
        "MAIN_SESSION_EVENT_AGENT_UNSUPPORTED"
    assert run_main(executor_options={"mode": "event", "model": "m"}).result.error_code == \
        "MAIN_SESSION_EVENT_MODEL_UNSUPPORTED"


def test_a_lost_fence_never_opens_the_gate(fake_openclaw, calls, use, run_main) -> None:
    path, record = fake_openclaw("ok")
    use(openclaw_path=path)

    class Fenced(LocalRunControl):
        def record_handle(self, handle):
            self.seen = handle
            raise SchedulerError("LEASE_LOST", "gone")

    control = Fenced()
    ran = run_main(control=control, executor_options={"mode": "event"})
    assert ran.result.error_code == "LEASE_LOST" and calls(record) == []
    assert not group_alive(control.seen["pgid"])


def test_a_bad_openclaw_path_setting_is_config_invalid(use, run_main) -> None:
    use(openclaw_path="relative/openclaw")
    assert run_main(executor_options={"mode": "event"}).result.error_code == "CONFIG_INVALID"
