"""``CancellationToken`` makes its event only when a cancel or a wait needs it: every order of cancel and wait behaves
as with an event made up front (the first reason wins, a waiter is woken, a cancel before any wait is seen)."""

from __future__ import annotations

import threading

from scheduler.core.execution import CancellationToken, LocalRunControl


def test_a_token_never_cancelled_is_not_cancelled_and_a_wait_times_out() -> None:
    token = CancellationToken()
    assert not token.is_cancelled() and token.cancel_reason() is None
    assert token.wait_cancelled(0.01) is False
    assert token.wait_cancelled(-1) is False  # a negative timeout waits for nothing
    assert not token.is_cancelled()


def test_a_cancel_before_any_wait_is_seen_and_the_first_reason_wins() -> None:
    token = LocalRunControl()
    token.cancel("deadline")
    token.cancel("user")
    assert token.is_cancelled() and token.cancel_reason() == "deadline"
    assert token.wait_cancelled(5.0) is True


def test_a_waiter_blocked_before_the_cancel_is_woken_by_it() -> None:
    token = CancellationToken()
    waiting, woken = threading.Event(), []

    def wait() -> None:
        waiting.set()
        woken.append(token.wait_cancelled(30.0))

    thread = threading.Thread(target=wait)
    thread.start()
    assert waiting.wait(5.0)
    token.cancel("shutdown")
    thread.join(10.0)
    assert woken == [True] and token.cancel_reason() == "shutdown"


def test_tokens_racing_a_cancel_against_waits_all_see_it() -> None:
    """Many waiters and a cancel started together: every waiter returns True (one event per token, never two)."""
    for _ in range(50):
        token = CancellationToken()
        start, results = threading.Barrier(5), []

        def wait(token: CancellationToken = token, start: threading.Barrier = start, results: list[bool] = results) -> None:
            start.wait()
            results.append(token.wait_cancelled(30.0))

        threads = [threading.Thread(target=wait) for _ in range(4)]
        for t in threads:
            t.start()
        start.wait()
        token.cancel("user")
        for t in threads:
            t.join(10.0)
        assert results == [True] * 4 and token.is_cancelled()
