"""The stock channel conformance cases against the telegram channel, loaded through its entry point as the kernel loads it.

Each case runs against the loopback stand-in that ``scheduler_channel_telegram.conformance.TelegramService``
starts (found through its ``scheduler.conformance_adapters`` entry point); cases for capabilities
the channel does not declare, or answers its service cannot give, are skipped with the reason.
"""

from __future__ import annotations

from scheduler.testing import ChannelConformance


class TestTelegramConformance(ChannelConformance):
    provider_name = "telegram"
