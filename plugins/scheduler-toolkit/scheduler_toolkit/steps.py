"""The run step contract, for distributions that add a step to the run pipeline (entry-point group ``scheduler.steps``).

``Step`` is the Protocol a step implements (its fields, artifact sections and per-run hooks,
placed by ``runs_after``); ``StepBase`` implements every hook as a no-op, so a step writes only
the ones it needs; ``Run`` is what each hook is handed about the run. A step extends the
kernel's own pipeline, which is why its contract comes with the toolkit, pinned to the
kernel's minor series, rather than with the provider contract of ``scheduler.api``. The
kernel's own code (``scheduler.core.steps``), re-exported.
"""

from __future__ import annotations

from scheduler.core.steps import Run, Step, StepBase

__all__ = ["Run", "Step", "StepBase"]
