"""What the layers above plug into core, gathered in one object the composition root builds.

Core defines the contracts; pipeline steps, features (delivery, evidence, approvals) and
plugins implement them; ``scheduler.runtime`` (the composition root used by ``scheduler run``,
the CLI and ``scheduler.testing``) wires them together and hands core one ``Parts``. Core never
imports a step or a feature: everything it calls above itself arrives here. The run pipeline's
steps are the one exception: spec validation and the artifact projection need them outside any
dispatcher, so the composition root installs them process-wide (``scheduler.core.steps.install``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

    from scheduler.core.contracts import Expiry, LoadedExecutors
    from scheduler.core.duty import DutyFactory
    from scheduler.core.observers import Observers
    from scheduler.core.participants import CompletionParticipants, RecoveryParticipants
    from scheduler.settings.load import Settings


@attrs.frozen
class Parts:
    """The collaborators core calls but does not own (each field's contract is in its own core module)."""

    #: Participants in the completion transaction (contract: ``scheduler.core.participants``; the defaults:
    #: ``scheduler.pipeline.participants.default_completion_participants``).
    completion: CompletionParticipants | None = None
    #: Participants in crash recovery (contract: ``scheduler.core.participants``; the defaults:
    #: ``scheduler.pipeline.participants.default_recovery_participants``).
    recovery: RecoveryParticipants | None = None
    #: The observers of run transitions and the dispatch veto (contract: ``scheduler.core.observers``).
    observers: Observers | None = None
    #: The loaded executors by name (contract: ``scheduler.core.contracts.LoadedExecutors``).
    executors: LoadedExecutors | None = None
    #: Background duties started with the lease, in this order (contract: ``scheduler.core.duty``).
    duties: tuple[DutyFactory, ...] = ()
    #: Due work each pass enforces before claiming (contract: ``scheduler.core.contracts.Expiry``).
    expiries: tuple[Expiry, ...] = ()
    #: Judges settings before a reload installs them, raising a ``SchedulerError`` to keep the previous ones
    #: (the runtime's: ``scheduler.plugins.options.check_routes``, the channels on ``[notifications] routes``).
    settings_check: Callable[[Settings], None] | None = None
