"""LISTEN/NOTIFY wake-ups: another instance, another process, transactional delivery, isolation, timeouts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from scheduler_store_postgres import PostgresStore
from scheduler_store_postgres.notify import channel_name

import scheduler.api

pytestmark = pytest.mark.postgres

MakeStore = Callable[..., PostgresStore]
WAKE_LIMIT_S = 0.1


class Waiter:
    """Runs ``wait_for_change`` in a thread and records when and how it returned."""

    def __init__(self, store: PostgresStore, timeout_s: float) -> None:
        store.wait_for_change(0)  # start LISTENing before anything is sent
        self.result: bool | None = None
        self.woke_mono = 0.0
        self.woke_wall = 0.0
        self._thread = threading.Thread(target=self._run, args=(store, timeout_s))
        self._thread.start()
        time.sleep(0.1)  # let it block in select

    def _run(self, store: PostgresStore, timeout_s: float) -> None:
        self.result = store.wait_for_change(timeout_s)
        self.woke_mono, self.woke_wall = time.monotonic(), time.time()

    def join(self) -> bool | None:
        self._thread.join(10)
        return self.result


def test_wakes_on_notify_from_another_instance(store: PostgresStore, make_store: MakeStore) -> None:
    other = make_store()
    other.notify_change()  # warm the notifier's pool so the timing below is the wake-up, not a connect
    store.wait_for_change(0)
    waiter = Waiter(store, 5)
    sent = time.monotonic()
    other.notify_change()
    assert waiter.join() is True
    assert waiter.woke_mono - sent < WAKE_LIMIT_S


def test_wakes_on_notify_from_another_process(store: PostgresStore) -> None:
    plugin_root = Path(__file__).resolve().parents[1]
    kernel_root = Path(scheduler.api.__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin_root), str(kernel_root), os.environ.get("PYTHONPATH", "")]))
    script = (
        "import sys, time\n"
        "from scheduler_store_postgres import PostgresStore\n"
        "s = PostgresStore(sys.argv[1]); s.initialize()\n"
        "with s.read() as tx: tx.scalar('SELECT 1')\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "t = time.time(); s.notify_change()\n"
        "print(t, flush=True)\n"
        "s.close()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, store.url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        waiter = Waiter(store, 10)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        sent = float(proc.stdout.readline())
        assert waiter.join() is True
        assert waiter.woke_wall - sent < WAKE_LIMIT_S
    finally:
        proc.wait(10)
    assert proc.returncode == 0


def test_times_out_without_notify(store: PostgresStore) -> None:
    started = time.monotonic()
    assert store.wait_for_change(0.3) is False
    elapsed = time.monotonic() - started
    assert 0.29 <= elapsed < 0.6
    assert store.wait_for_change(0) is False


def test_notify_inside_transaction_is_delivered_at_commit_only(store: PostgresStore, make_store: MakeStore) -> None:
    listener = make_store()
    listener.wait_for_change(0)
    with pytest.raises(RuntimeError), store.transaction():
        store.notify_change()
        raise RuntimeError("rolled back")
    assert listener.wait_for_change(0.2) is False
    with store.transaction():
        store.notify_change()
        assert listener.wait_for_change(0.2) is False  # not yet committed
    assert listener.wait_for_change(1) is True


def test_notification_between_waits_is_not_lost(store: PostgresStore, make_store: MakeStore) -> None:
    other = make_store()
    store.wait_for_change(0)  # listening
    other.notify_change()
    other.notify_change()
    time.sleep(0.05)  # the dispatcher is busy, not waiting
    assert store.wait_for_change(0.5) is True
    assert store.wait_for_change(0.1) is False  # both queued notifications consumed by one wake-up


def test_schemas_do_not_wake_each_other(store: PostgresStore, make_store: MakeStore, pg_base_url: str, admin: object) -> None:
    other_schema = store.schema + "_b"  # type: ignore[operator]
    try:
        other = make_store(f"{pg_base_url}?schema={other_schema}")
        assert other.channel != store.channel
        store.wait_for_change(0)
        other.notify_change()
        assert store.wait_for_change(0.2) is False
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{other_schema}" CASCADE')  # type: ignore[attr-defined]


def test_close_interrupts_a_wait(make_store: MakeStore) -> None:
    store = make_store()
    waiter = Waiter(store, 10)
    started = time.monotonic()
    store.close()
    assert waiter.join() is False
    assert time.monotonic() - started < 1.0


def test_channel_names_fit_identifier_limit() -> None:
    assert channel_name("t_abc") == "scheduler_wakeup_t_abc"
    long = channel_name("x" * 63)
    assert len(long) <= 63 and long.startswith("scheduler_wakeup_")
    assert long != channel_name("x" * 62 + "y")


def test_listener_survives_a_terminated_connection(store: PostgresStore, make_store: MakeStore, admin: object) -> None:
    other = make_store()
    store.wait_for_change(0)
    pid = store._listener._conn.info.backend_pid  # type: ignore[union-attr]
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))  # type: ignore[attr-defined]
    time.sleep(0.1)
    started = time.monotonic()
    assert store.wait_for_change(2) is True  # reconnected: a change may have been missed meanwhile
    assert time.monotonic() - started < 1.5
    waiter = Waiter(store, 5)
    other.notify_change()
    assert waiter.join() is True
