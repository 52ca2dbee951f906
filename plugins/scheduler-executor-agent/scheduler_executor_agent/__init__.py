"""scheduler-executor-agent: the ``agent`` executor driver of the scheduler.

Runs a job's payload as one agent turn against any OpenAI-compatible chat-completions
endpoint (OpenClaw Gateway, Ollama, vLLM, llama.cpp server, hosted APIs), streaming the
reply into the kernel's output capture. See ``README.md`` for settings, options and
guarantees.
"""

from __future__ import annotations

from scheduler_executor_agent.executor import AgentExecutor
from scheduler_executor_agent.options import AgentOptions
from scheduler_executor_agent.settings import AgentSettings

__version__ = "0.1.0"

__all__ = ["AgentExecutor", "AgentOptions", "AgentSettings", "__version__"]
