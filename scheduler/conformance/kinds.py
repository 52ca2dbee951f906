"""What the trust-provider conformance kinds (``authorization``, ``credential``, ``evidence``) share.

Each of those kinds drives its provider through a per-case adapter that the provider ships
(a setup adapter writing a policy or keys, a source adapter standing in for a secret store)
and, per case, hands the provider a ``[providers.NAME]`` table from that adapter. Finding the
adapter, validating and applying that table, and reading a case's expected codes are the same
for all three, so they live here once; each kind module says only its method, its words and
its code.
"""

from __future__ import annotations

from typing import Any

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.conformance.engine import _DRIVER_NAME, _adapter_label, configure_provider
from scheduler.conformance.payload import adapter_from_entry_points, load_adapter_spec
from scheduler.conformance.service import _instantiate


@attrs.frozen(kw_only=True)
class ProviderContext:
    """What every case of one provider's run shares: the name its jobs use and its per-case adapter."""

    name: str
    adapter: Any


def adapter_label(adapter: Any) -> str:
    """The adapter's class name, for messages (an adapter may be a class or an instance)."""
    return _adapter_label(adapter)


def resolve_adapter(name: str | None, provider: Any, explicit: Any, *, method: str, role: str, subject: str,
                    missing_code: str, missing_why: str) -> Any:
    """The ``role`` adapter (an object with ``method``) of ``subject`` provider ``name``.

    Looked for in order: ``explicit`` (an object, a class or ``MODULE:ATTR``; one without
    ``method`` is ``CONFORMANCE_ADAPTER_INVALID``), the provider itself when it has ``method``,
    the entry point named ``name`` in ``scheduler.conformance_adapters``. None of them is
    ``missing_code``, the message saying ``missing_why`` (what the cases lack without one).
    """
    if explicit is not None:
        adapter = load_adapter_spec(explicit, role) if isinstance(explicit, str) else _instantiate(explicit)
        if not callable(getattr(adapter, method, None)):
            raise SchedulerError("CONFORMANCE_ADAPTER_INVALID", f"{role} adapter {explicit!r} has no {method}() method")
        return adapter
    if callable(getattr(provider, method, None)):
        return provider
    if name:
        found = adapter_from_entry_points(name, method, role)
        if found is not None:
            return found
    label = f"{subject} provider {name!r}" if name else f"{subject} provider {type(provider).__name__}"
    raise SchedulerError(
        missing_code,
        f"{label} has no conformance {role} adapter, so {missing_why}: give the provider a {method}(request) method, "
        f"register an entry point named {name or 'after the provider'!r} in the group scheduler.conformance_adapters, "
        "or pass one explicitly (--adapter MODULE:ATTR)",
    )


def provider_context(name: str | None, adapter: Any, anonymous: str) -> ProviderContext:
    """The run's context: ``name`` when it is a valid driver name (else ``anonymous``) and the adapter found."""
    return ProviderContext(name=name if name and _DRIVER_NAME.match(name) else anonymous, adapter=adapter)


def expected_codes(expect: dict[str, Any]) -> list[str]:
    """A case's ``expect.error_code`` as a list: none, one code, or any of several."""
    code = expect.get("error_code")
    return [] if code is None else [code] if isinstance(code, str) else list(code)


__all__ = ["ProviderContext", "adapter_label", "configure_provider", "expected_codes", "provider_context",
           "resolve_adapter"]
