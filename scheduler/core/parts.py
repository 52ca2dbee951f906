"""What the layers above plug into core, gathered in one object the composition root builds.

Core defines the contracts; pipeline steps, features (delivery, evidence, approvals) and
plugins implement them; ``scheduler.runtime`` (the composition root used by ``scheduler run``,
the CLI and ``scheduler.testing``) wires them together and hands core one ``Parts``. Core never
imports a step or a feature: everything it calls above itself arrives here.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class Parts:
    """The collaborators core calls but does not own (each field's contract is in its own core module)."""

    #: The run pipeline: registered steps in the order they run (contract: ``scheduler.core.steps``).
    steps: tuple[Any, ...] = ()
    #: Participants in the completion transaction (contract: ``scheduler.core.participants``).
    completion: tuple[Any, ...] = ()
    #: Participants in crash recovery (contract: ``scheduler.core.participants``).
    recovery: tuple[Any, ...] = ()
