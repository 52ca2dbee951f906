"""A main-session turn through a real ``scheduler run`` process against a loopback chat server.

(The agent executor's turn through a real ``scheduler run`` is in ``test_examples.py``.)
"""

from __future__ import annotations

import json
from pathlib import Path

from kernel_testing import add_job, run_rows, wait_for
from test_dispatcher_process import Proc

from scheduler.core.queue import enqueue_manual
from scheduler.plugins.stores import open_store


def test_a_main_session_turn_through_scheduler_run(tmp_path: Path) -> None:
    from scheduler_executor_main_session.loopback import LoopbackChat

    chat = LoopbackChat().start()
    db = tmp_path / "scheduler.db"
    store = open_store(db)
    job = add_job(store, session_target="main", executor=None, payload_message="Remind me about the backup.")
    enqueue_manual(store, job["id"])
    env = {"SCHEDULER_AGENT_BASE_URL": chat.base_url, "SCHEDULER_AGENT_MODEL": "loopback", "SCHEDULER_AGENT_API_KEY": "k-secret-1"}
    proc = Proc(db, log=tmp_path / "dispatcher.log", env=env)
    try:
        proc.wait_ready()
        (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] != "running"], timeout=30,
                          what=f"main-session turn ({proc.output()[-300:]})")
    finally:
        proc.kill(15)
        proc.p.wait(20)
        proc.close()
        chat.stop()
        store.close()
    assert (run["status"], run["executor"], run["stdout_excerpt"]) == ("ok", "main-session", "Noted in the main session.")
    (seen,) = chat.requests
    assert seen.headers["authorization"] == "Bearer k-secret-1"
    assert "Remind me about the backup." in json.dumps(seen.body)
    for path in (db, Path(f"{db}-wal")):  # the key never reaches the database (nor its write-ahead log)
        assert not path.exists() or b"k-secret-1" not in path.read_bytes()
