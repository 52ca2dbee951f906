"""scheduler-channel-slack: the ``slack`` delivery channel of the scheduler.

Delivers each outbox part through an incoming webhook or the Web API
(``chat.postMessage``, threads, external file uploads). See ``README.md``.
"""

from __future__ import annotations

from scheduler_channel_slack.channel import SlackChannel, SlackOptions, SlackSettings, __version__

__all__ = ["SlackChannel", "SlackOptions", "SlackSettings", "__version__"]
