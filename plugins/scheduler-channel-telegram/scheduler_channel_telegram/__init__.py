"""scheduler-channel-telegram: the ``telegram`` delivery channel of the scheduler.

Delivers each outbox part through the Telegram Bot API (``sendMessage``, and
``sendDocument`` / ``sendMediaGroup`` for attachments). See ``README.md``.
"""

from __future__ import annotations

from scheduler_channel_telegram.channel import TelegramChannel, TelegramOptions, TelegramSettings, __version__

__all__ = ["TelegramChannel", "TelegramOptions", "TelegramSettings", "__version__"]
