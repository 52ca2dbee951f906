"""Every first-party channel receives a job's result through a real ``scheduler run``, after a fault.

The loopback stand-ins are the channels' own conformance service adapters (the Bot API,
Slack's Web API, an SMTP server, the OpenClaw Gateway, a webhook receiver): each answers the
first attempt with a server error and accepts the retry, so the path under test is the
whole one: completion enqueues, the dispatcher's consumer claims, the channel sends, the
failure is retried, the receipt recorded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, wait_for
from test_dispatcher_process import Proc

from scheduler.core.queue import enqueue_manual
from scheduler.plugins.stores import open_store
from scheduler.testing import ServiceAnswer, ServiceRequest

CHANNELS = ("webhook", "slack", "telegram", "email", "openclaw")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_result_reaches_the_channel_through_scheduler_run_after_a_fault(channel: str, tmp_path: Path) -> None:
    from scheduler.conformance.service import resolve_service_adapter

    adapter = resolve_service_adapter(channel, None)
    answers = (ServiceAnswer(kind="server_error"), ServiceAnswer(kind="accept"))
    workdir = tmp_path / "service"
    workdir.mkdir()
    stand = adapter.conformance_service(ServiceRequest(case_id="through-scheduler-run", channel=channel, answers=answers,
                                                       workdir=workdir, timeout_s=3.0))
    config = tmp_path / "scheduler.toml"
    lines = [f"[channels.{channel}]", *(f"{k} = {_toml(v)}" for k, v in stand.settings.items()),
             "[delivery]", "retry_base_ms = 50", "retry_max_ms = 200"]
    config.write_text("\n".join(lines) + "\n")
    env = {"SCHEDULER_CONFIG": str(config), **stand.secrets}
    db = tmp_path / "scheduler.db"
    store = open_store(db)
    job = add_job(store, payload_message=f"echo:hello through {channel}", delivery_mode="always", delivery_channel=channel,
                  delivery_to=stand.target, delivery_options=dict(stand.options or {}))
    stand.respond_with(answers[0])
    enqueue_manual(store, job["id"])
    proc = Proc(db, log=tmp_path / "dispatcher.log", env=env)
    try:
        proc.wait_ready()
        wait_for(stand.received, timeout=20, what=f"first attempt at {channel} ({proc.output()[-300:]})")
        stand.respond_with(answers[1])

        def delivered() -> list[dict[str, Any]]:
            with store.read() as tx:
                return tx.all("SELECT * FROM delivery_outbox WHERE job_id = ? AND status = 'delivered'", (job["id"],))

        (row,) = wait_for(delivered, timeout=20, what=f"delivered through {channel} ({proc.output()[-300:]})")
    finally:
        proc.kill(15)
        proc.p.wait(20)
        proc.close()
        stand.close()
        store.close()
    accepted = [m for m in stand.received() if m.accepted]
    assert len(accepted) == 1 and f"hello through {channel}" in accepted[0].text, stand.received()
    assert row["attempts"] == 2 and stand.problems == []
    log = (tmp_path / "dispatcher.log").read_text(errors="replace")
    assert not any(value in log for value in stand.secrets.values() if value)  # no secret in the dispatcher's log
