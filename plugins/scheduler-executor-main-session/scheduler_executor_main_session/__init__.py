"""scheduler-executor-main-session: the ``main-session`` executor driver of the scheduler.

Delivers a job's payload to the agent's main session (``session_target: main``): a
synchronous chat turn over an OpenAI-compatible endpoint with the main session key, or a
fire-and-forget ``openclaw system event``. Credentials are refused for this target. See
``README.md`` for settings, options, codes and capabilities.
"""

from __future__ import annotations

from scheduler_executor_main_session.executor import MainSessionExecutor
from scheduler_executor_main_session.options import MainSessionOptions
from scheduler_executor_main_session.settings import MainSessionSettings

__version__ = "0.1.0"

__all__ = ["MainSessionExecutor", "MainSessionOptions", "MainSessionSettings", "__version__"]
