"""Reading one staged outbox attachment: its bytes, with the size and SHA-256 the kernel recorded checked."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler.api import PermanentDeliveryError


def read_attachment(attachment: Mapping[str, Any], *, max_bytes: int, prefix: str) -> tuple[str, str, bytes]:
    """``(name, mime_type, content)`` of one outbox attachment, its size and SHA-256 checked.

    The kernel stages attachments as ``{"name", "mime_type", "size_bytes", "sha256"}`` plus
    either ``content`` (bytes) or ``path`` (a file it controls). Anything missing, too large
    or not matching its digest is a permanent failure: retrying cannot repair it.
    """
    name = str(attachment.get("name") or "attachment")
    mime = str(attachment.get("mime_type") or "application/octet-stream")
    content = attachment.get("content")
    if content is None:
        path = attachment.get("path")
        if not path:
            raise PermanentDeliveryError(f"attachment {name!r} has neither content nor path", code=f"{prefix}_ATTACHMENT_INVALID")
        try:
            size = Path(path).stat().st_size
            if size > max_bytes:
                raise PermanentDeliveryError(f"attachment {name!r} is {size} bytes, over the channel's limit of {max_bytes}",
                                             code=f"{prefix}_ATTACHMENT_TOO_LARGE")
            data = Path(path).read_bytes()
        except OSError as exc:
            raise PermanentDeliveryError(f"attachment {name!r} cannot be read: {exc.strerror or type(exc).__name__}",
                                         code=f"{prefix}_ATTACHMENT_INVALID") from None
    elif isinstance(content, str):
        data = content.encode("utf-8")
    else:
        data = bytes(content)
    if len(data) > max_bytes:
        raise PermanentDeliveryError(f"attachment {name!r} is {len(data)} bytes, over the channel's limit of {max_bytes}",
                                     code=f"{prefix}_ATTACHMENT_TOO_LARGE")
    expected_size = attachment.get("size_bytes")
    if expected_size is not None and int(expected_size) != len(data):
        raise PermanentDeliveryError(f"attachment {name!r} is {len(data)} bytes, staged as {expected_size}",
                                     code=f"{prefix}_ATTACHMENT_INVALID")
    expected = attachment.get("sha256")
    if expected and hashlib.sha256(data).hexdigest() != str(expected).lower().removeprefix("sha256:"):
        raise PermanentDeliveryError(f"attachment {name!r} does not match its staged SHA-256", code=f"{prefix}_ATTACHMENT_INVALID")
    return name, mime, data
