"""Optional provider members: each a small Protocol of its own, checked once at load.

A provider implements its kind's Protocol (``scheduler.plugins.protocols``) and may also
implement any of these. The kernel asks ``isinstance(provider, Recoverable)`` (and reads
``options_class_of``) instead of probing attributes with ``getattr``; the loader
(``scheduler.plugins.loader``) refuses a provider that declares half of one (a
``settings_class`` without ``configure``, an ``options_class`` that is not an attrs class).
They live in core because core itself asks two of them (per-run options, crash recovery);
plugins import them from ``scheduler.api``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from scheduler.core.execution import RecoveryOutcome, RecoveryRequest


@runtime_checkable
class DeclaresOptions(Protocol):
    """A provider with per-job options: the job's options block is validated against ``options_class``.

    ``options_class`` is an attrs class (``build_options`` builds it from the job's JSON
    object, refusing unknown keys); the kernel stores the result as JSON and never names
    its fields.
    """

    options_class: type


@runtime_checkable
class Configurable(Protocol):
    """A provider with host settings: its settings-file table is validated against ``settings_class``.

    The loader builds the settings (``[executors.shell]``, ``[channels.slack]``,
    ``[providers.NAME]``, with ``SCHEDULER_<SECTION>_<NAME>_<KEY>`` overrides) and calls
    ``configure(settings)`` once, before the provider is first used.
    """

    settings_class: type

    def configure(self, settings: Any) -> None:
        """Take the validated host settings (an instance of ``settings_class``)."""


@runtime_checkable
class Recoverable(Protocol):
    """An executor that stops what a dead dispatcher's run left behind (declare the ``recover`` capability).

    Crash recovery calls ``recover`` with the handle the run recorded (a process group,
    a remote agent turn); an executor that is not ``Recoverable`` cannot confirm anything,
    so its orphaned runs are reported ``unknown``.
    """

    def recover(self, request: RecoveryRequest) -> RecoveryOutcome:
        """Stop the recorded work and say what was found and done."""


@runtime_checkable
class PolicyChecking(Protocol):
    """An authorization provider that checks a policy reference before any run (at add, and in ``doctor``)."""

    def check_policy(self, policy_ref: str, options: Any) -> list[str]:
        """Problems found with the policy (syntax errors, a missing file); empty when it is usable."""


#: Each optional Protocol with the members that, declared alone, make a provider half of it.
OPTIONAL_MEMBERS: tuple[tuple[type, tuple[str, ...]], ...] = (
    (DeclaresOptions, ("options_class",)),
    (Configurable, ("settings_class", "configure")),
    (Recoverable, ("recover",)),
    (PolicyChecking, ("check_policy",)),
)


def options_class_of(provider: Any) -> type | None:
    """The provider's options class, or None when it takes no per-job options (``options_class = None`` too)."""
    return provider.options_class if isinstance(provider, DeclaresOptions) else None


def declared_members(provider: Any, members: tuple[str, ...]) -> list[str]:
    """Which of ``members`` the provider declares; a class attribute set to None (``options_class = None``) is not declared."""
    return [m for m in members if getattr(provider, m, None) is not None]


__all__ = ["Configurable", "DeclaresOptions", "OPTIONAL_MEMBERS", "PolicyChecking", "Recoverable", "declared_members", "options_class_of"]
