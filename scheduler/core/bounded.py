"""Bounded in-process calls: a provider call in a daemon thread, waited for at most a deadline.

``call_bounded`` is what credential and authorization providers, proof verifiers and their
conformance engines are called through: a hung provider cannot hold the run, and an answer
that arrives too late is never used. (Running a helper *program* within a deadline and output
caps, ``run_bounded``, is a plugin helper: ``scheduler_toolkit.process``.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TypeVar

from scheduler.base.errors import SchedulerError

_T = TypeVar("_T")


def call_bounded(fn: Callable[[], _T], timeout_s: float, *, code: str, what: str, details: Mapping[str, object],
                 name: str = "bounded-call") -> _T:
    """``fn()`` in a daemon thread, waited for at most ``timeout_s``: ``SchedulerError(code)`` when it takes longer.

    The one bounded in-process call of the kernel (credential providers, authorization providers,
    their conformance engines): a late answer is dropped (the thread is a daemon and its result is
    never read), so a hung provider cannot hold the run, and a value or a permit that arrives too
    late is never used. An exception ``fn`` raises in time is re-raised here.
    """
    value: list[_T] = []
    error: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            value.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            error.append(exc)
        finally:
            done.set()

    threading.Thread(target=target, daemon=True, name=name).start()
    if not done.wait(max(0.0, timeout_s)):
        raise SchedulerError(code, f"{what} did not answer within {timeout_s:.1f}s", details={**details, "timeout_s": timeout_s})
    if error:
        raise error[0]
    return value[0]


__all__ = ["call_bounded"]
