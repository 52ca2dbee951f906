"""scheduler-channel-email: the ``email`` delivery channel of the scheduler.

Delivers each outbox part as one e-mail over SMTP (STARTTLS, implicit TLS, or plain
to a loopback relay), with login, a text body and attachments. See ``README.md``.
"""

from __future__ import annotations

from scheduler_channel_email.channel import EmailChannel, EmailOptions, EmailSettings, __version__

__all__ = ["EmailChannel", "EmailOptions", "EmailSettings", "__version__"]
