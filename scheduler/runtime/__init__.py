"""The composition root: builds the kernel's ``Parts`` from the layers above core and hands them to core.

Core defines what it calls (``scheduler.core.parts``); the pipeline, the features and the
plugins implement it; this package is the one place that knows both sides. ``scheduler run``,
``scheduler.testing`` and the CLI get their dispatcher here (``dispatcher``), and ``install``
gives the process its defaults (the observers of transitions committed outside a dispatcher).
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.approvals.decisions import expire_due as expire_due_approvals
from scheduler.artifacts.handoff_kind import HANDOFF_KIND
from scheduler.core import observers, steps, submissions
from scheduler.core.dispatcher import Dispatcher, DispatcherConfig
from scheduler.core.observers import Observers
from scheduler.core.parts import Parts
from scheduler.core.store.base import Store
from scheduler.pipeline import installed_steps
from scheduler.pipeline.participants import default_completion_participants, default_recovery_participants
from scheduler.plugins.hooks import Hooks
from scheduler.plugins.loaded import LoadedProviders
from scheduler.plugins.options import check_routes
from scheduler.runtime import duties

__all__ = ["EXECUTOR_RETRY_S", "dispatcher", "dispatcher_parts", "install"]

#: How long a failed executor load is remembered before the dispatcher tries again.
EXECUTOR_RETRY_S = 30.0


def install() -> None:
    """Give this process its defaults: transitions committed without naming their observers (a CLI ``runs cancel``)
    tell the entry-point hook modules (built only when there is something to tell); the run pipeline's steps
    (built-in and ``scheduler.steps`` entry points, ``scheduler.pipeline.installed_steps``) are installed into core,
    and so is the handoff v4 kind of submitted artifacts (``scheduler.core.submissions``)."""
    observers.install_default(Hooks)
    steps.install(installed_steps)
    submissions.install(HANDOFF_KIND)


def loaded_executors() -> LoadedProviders:
    """A dispatcher's executors, loaded on first use and kept (a failed load is retried after ``EXECUTOR_RETRY_S``)."""
    return LoadedProviders("executor", unavailable_code="EXECUTOR_NOT_AVAILABLE", noun="executor", retry_s=EXECUTOR_RETRY_S)


def dispatcher_parts(*, hooks: Observers | None = None) -> Parts:
    """Everything a dispatcher calls above core: observers (``hooks``, default the entry-point hook modules),
    executors, the completion and recovery participants, the delivery and retention duties, approval timeouts, and the
    check a settings reload must pass (the channels' judgement of ``[notifications] routes``)."""
    return Parts(
        observers=hooks if hooks is not None else Hooks(),
        executors=loaded_executors(),
        duties=(duties.delivery, duties.retention),
        expiries=(expire_due_approvals,),
        completion=default_completion_participants(),
        recovery=default_recovery_participants(),
        settings_check=check_routes,
    )


def dispatcher(store: Store, config: DispatcherConfig | None = None, *, hooks: Observers | None = None,
               say: Callable[[str], None] | None = None) -> Dispatcher:
    """A dispatcher on ``store`` with its parts (see ``dispatcher_parts``); the process's defaults are installed too."""
    install()
    return Dispatcher(store, dispatcher_parts(hooks=hooks), config, say=say)
