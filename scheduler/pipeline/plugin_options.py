"""Plugin options: the step that checks ``executor_options`` and ``delivery_options`` against the installed plugins.

It takes no part in a run (the executor builds its options from the stored object when the run
starts, ``scheduler.core.request``; a channel when it sends). At ``jobs add`` / ``jobs validate``
it validates each object with its plugin's ``options_class`` and stores it normalised.
"""

from __future__ import annotations

from scheduler.core.rows import JSONObject
from scheduler.core.spec import JobSpec
from scheduler.core.steps import Problem, StepBase
from scheduler.plugins.options import option_problems_of


class PluginOptionsStep(StepBase):
    """Validation only: each plugin-owned options object against its installed plugin."""

    name = "plugin_options"

    def check_installed(self, spec: JobSpec) -> tuple[JSONObject, list[Problem]]:
        """The normalised options objects, and what their plugins refuse."""
        changed, problems = option_problems_of(spec)
        normalised: JSONObject = dict(changed)
        return normalised, problems
