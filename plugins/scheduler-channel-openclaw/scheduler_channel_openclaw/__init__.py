"""scheduler-channel-openclaw: the ``openclaw`` delivery channel of the scheduler.

Delivers each outbox part through an OpenClaw Gateway's ``message`` tool
(``POST /tools/invoke``), which sends it on the chat service the Gateway is
connected to. See ``README.md``.
"""

from __future__ import annotations

from scheduler_channel_openclaw.channel import OpenClawChannel, OpenClawOptions, OpenClawSettings, __version__

__all__ = ["OpenClawChannel", "OpenClawOptions", "OpenClawSettings", "__version__"]
