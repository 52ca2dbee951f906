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

import attrs

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


@runtime_checkable
class Named(Protocol):
    """A provider told the entry-point name it is registered under (one class may serve several names).

    The loader calls ``registered_as(name)`` once, before ``configure`` and before first use,
    so a provider can name itself in what it returns (an evidence envelope's ``provider``, a
    verification's) instead of hard-coding the name a deployment might register it under.
    """

    def registered_as(self, name: str) -> None:
        """Take the name of the entry point this instance was loaded from (``[providers.NAME]``'s NAME)."""


@runtime_checkable
class HealthReporting(Protocol):
    """A provider that reports on what this host gives it, for ``scheduler doctor`` (the shell executor's process containment).

    ``health_checks()`` returns doctor checks, each ``{"check", "ok", "detail", ...}``
    (``warning`` when it only warns, ``code`` when it fails with one); a failing check makes
    ``doctor`` exit 1. It must be cheap and leave nothing changed.
    """

    def health_checks(self) -> list[dict[str, Any]]:
        """This provider's doctor checks of the host."""


@runtime_checkable
class JobChecking(Protocol):
    """A provider that judges a job it would run against its host settings, when the job is added.

    ``check_job(options, spec)`` gets the job's validated ``options_class`` instance (None
    without one) and its ``JobSpec``; each problem is ``{"field", "code", "error"}`` and
    refuses the job (``VALIDATION_FAILED``) at ``jobs add`` / ``update`` / ``apply`` /
    ``import`` / ``validate``, so a job that could only fail every run is not stored. The
    run-time checks stay: the settings may change after the job was added.
    """

    def check_job(self, options: Any, spec: Any) -> list[dict[str, str]]:
        """Problems of a job this provider would run, judged with this host's settings; empty when none."""


@runtime_checkable
class _DeclaresSettingsClass(Protocol):
    """Half of ``Configurable``: what a provider declaring settings but no ``configure`` looks like."""

    settings_class: Any


@runtime_checkable
class _DeclaresConfigure(Protocol):
    """The other half of ``Configurable``."""

    def configure(self, settings: Any) -> None:
        """See ``Configurable.configure``."""


#: Per provider class: whether the class itself declares ``options_class``, and whether it answers attributes
#: dynamically (``__getattr__``: a proxy, asked per instance).
_OPTIONS_BY_CLASS: dict[type, tuple[bool, bool]] = {}


def options_class_of(provider: Any) -> type | None:
    """The provider's options class, or None when it takes no per-job options (``options_class = None`` too).

    Asked for every run (the executor's options), so the Protocol is asked of the provider's
    class once and remembered (``isinstance`` on a runtime-checkable Protocol costs microseconds):
    a class that declares it answers for every instance; otherwise an instance declares it only
    in its own ``__dict__``, or through a ``__getattr__`` (then the Protocol is asked each time).
    """
    kind = type(provider)
    known = _OPTIONS_BY_CLASS.get(kind)
    if known is None:
        known = _OPTIONS_BY_CLASS[kind] = (isinstance(kind, DeclaresOptions), hasattr(kind, "__getattr__"))
    declared, dynamic = known
    if declared:
        return provider.options_class
    if dynamic or "options_class" in getattr(provider, "__dict__", ()):
        return provider.options_class if isinstance(provider, DeclaresOptions) else None
    return None


def settings_class_of(provider: Any) -> type | None:
    """The provider's host-settings class, or None when it has no host settings (``settings_class = None`` too)."""
    return provider.settings_class if isinstance(provider, _DeclaresSettingsClass) else None


def member_problems(provider: Any) -> list[tuple[str, str]]:
    """``(protocol, what is wrong)`` for each optional member the provider declares only in part, or wrongly.

    Asked once, when the provider is loaded: a ``settings_class`` without ``configure``
    (its settings would be validated and then silently ignored), ``configure`` without a
    ``settings_class``, an ``options_class`` or ``settings_class`` that is not an attrs class,
    a ``recover`` or ``check_policy`` that cannot be called. ``None`` for a class declares none.
    """
    problems: list[tuple[str, str]] = []
    options = options_class_of(provider)
    if options is not None and not attrs.has(options):
        problems.append(("DeclaresOptions", f"options_class must be an attrs class, not {type(options).__name__}"))
    settings = settings_class_of(provider)
    configure = isinstance(provider, _DeclaresConfigure)
    if settings is not None and not configure:
        problems.append(("Configurable", ("declares settings_class but not configure (the optional Configurable protocol "
                                          "needs both: the loader hands the validated settings to configure)")))
    elif configure and settings is None:
        problems.append(("Configurable", ("declares configure but not settings_class (the optional Configurable protocol "
                                          "needs both)")))
    elif settings is not None and not attrs.has(settings):
        problems.append(("Configurable", f"settings_class must be an attrs class, not {type(settings).__name__}"))
    elif configure and not callable(provider.configure):
        problems.append(("Configurable", "configure must be callable"))
    if isinstance(provider, Recoverable) and not callable(provider.recover):
        problems.append(("Recoverable", f"recover must be callable, not {type(provider.recover).__name__}"))
    if isinstance(provider, JobChecking) and not callable(provider.check_job):
        problems.append(("JobChecking", f"check_job must be callable, not {type(provider.check_job).__name__}"))
    if isinstance(provider, HealthReporting) and not callable(provider.health_checks):
        problems.append(("HealthReporting", f"health_checks must be callable, not {type(provider.health_checks).__name__}"))
    if isinstance(provider, PolicyChecking) and not callable(provider.check_policy):
        problems.append(("PolicyChecking", f"check_policy must be callable, not {type(provider.check_policy).__name__}"))
    return problems


__all__ = ["Configurable", "DeclaresOptions", "HealthReporting", "JobChecking", "PolicyChecking", "Recoverable", "member_problems", "options_class_of", "settings_class_of"]
