"""``{credential = "oauth2:CLIENT"}``: an access token of a configured client as a settings reference.

A channel or executor setting can then hold a short-lived token instead of a static
one (``token = {credential = "oauth2:slack-bot"}``). The reference resolves through one
provider instance shared by the process, so its token cache applies too.

Nothing is registered on import: call ``register_secret_schemes()`` once, or let a kernel
that loads the ``scheduler.secret_schemes`` entry points do it (``OAUTH2_SCHEME``).
"""

from __future__ import annotations

import errno
import threading

import attrs
from scheduler_toolkit.settings import register_secret_scheme
from scheduler_toolkit.types import CredentialPresent

from scheduler.api import CredentialBinding, CredentialContext, SchedulerError
from scheduler_provider_oauth2.settings import CLIENT_NAME

_shared_lock = threading.Lock()
_shared: object | None = None


def _provider():  # type: ignore[no-untyped-def]
    global _shared
    with _shared_lock:
        if _shared is None:
            from scheduler_provider_oauth2.provider import OAuth2CredentialProvider

            _shared = OAuth2CredentialProvider()  # reads [providers.oauth2] at each resolve
        return _shared


def read_token(target: str) -> str | None:
    """A valid access token of client ``target``; None when no such client is configured; ``OSError`` otherwise."""
    binding = CredentialBinding(name=f"settings:{target}", provider="oauth2", ref=target,
                                present=CredentialPresent(medium="env", key="UNUSED"))
    try:
        credential = _provider().resolve(binding, CredentialContext(run_id="settings", job_id="settings"))
    except SchedulerError as exc:
        if exc.code == "CREDENTIAL_NOT_FOUND":
            return None
        raise OSError(errno.EIO, f"{exc.code}: {exc.message}") from None
    value = credential.value
    return value if isinstance(value, str) else value.decode("utf-8")


def check_client(target: str) -> str | None:
    """Load-time check of an ``oauth2:`` target."""
    return None if CLIENT_NAME.match(target) else "the name of a [providers.oauth2] client ([a-z0-9][a-z0-9_.-]{0,63})"


@attrs.frozen
class Scheme:
    """One reference scheme as ``register_secret_scheme`` takes it."""

    name: str
    read: object
    check: object

    def register(self) -> None:
        register_secret_scheme(self.name, self.read, check=self.check)  # type: ignore[arg-type]


OAUTH2_SCHEME = Scheme("oauth2", read_token, check_client)


def register_secret_schemes() -> list[str]:
    """Register ``oauth2:``; the names registered."""
    OAUTH2_SCHEME.register()
    return [OAUTH2_SCHEME.name]
