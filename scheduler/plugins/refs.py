"""One rule for missing plugins: which plugins a job spec names, and which of them are not installed.

A job names plugins in several places: its executor (``executor``, or the default of its
``session_target``), its delivery channel, its watchdog alert channel, its evidence and
credential providers, the verifier of its ``authorization_proof`` and its authorization
provider. ``jobs add``, ``jobs update``, ``jobs validate`` and ``jobs add --dry-run`` refuse a
spec naming a plugin that is not installed, with ``<KIND>_NOT_AVAILABLE``
(``EXECUTOR_NOT_AVAILABLE``, ``CHANNEL_NOT_AVAILABLE``, ``PROOF_VERIFIER_NOT_AVAILABLE`` ...),
unless the operator passes ``--allow-missing-plugins`` (a job prepared for another host).
Failing at add time is the point: otherwise the job is stored and every one of its runs fails
later, far from the typo that caused it.

"Installed" means an entry point of that name exists in the kind's group and is not switched
off by ``SCHEDULER_DISABLE_PLUGINS``. Presence is read from the package metadata only: no
plugin is imported to check it (a plugin that is present but broken is ``doctor``'s business,
and the run reports it).

Adding a place where a spec names a plugin is one line in ``SPEC_REFERENCES``; adding a kind
is one line in ``scheduler.plugins.protocols.PROVIDER_KINDS`` (its error code is derived).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from scheduler.base.entry_points import entry_point_names, is_disabled
from scheduler.base.errors import SchedulerError
from scheduler.plugins.protocols import PROVIDER_KINDS, proof_verifier_name


def not_available_code(kind: str) -> str:
    """``<KIND>_NOT_AVAILABLE`` (``PROOF_VERIFIER_NOT_AVAILABLE`` ...): the code of a missing plugin of ``kind``, at add and at run."""
    return f"{kind.upper()}_NOT_AVAILABLE"


@attrs.frozen
class PluginRef:
    """One place where a job spec names a plugin: ``field`` of the spec names ``name`` of ``kind``."""

    kind: str
    name: str
    field: str
    #: Why the spec names it, when the name is implied rather than written (shown in the message).
    implied_by: str | None = None

    @property
    def group(self) -> str:
        """The entry-point group plugins of this kind register in."""
        return PROVIDER_KINDS[self.kind][0]

    @property
    def code(self) -> str:
        """``<KIND>_NOT_AVAILABLE``: the error when this plugin is not installed (each is in the code registry)."""
        return not_available_code(self.kind)


@attrs.frozen
class MissingPlugin:
    """A referenced plugin that is not installed, and why (``not installed`` or ``disabled``)."""

    ref: PluginRef
    reason: str

    def describe(self) -> str:
        """What is missing and why, without the field (the ``error`` of a detail)."""
        ref = self.ref
        what = f"{ref.kind} {ref.name!r}" + (f" (the default for {ref.implied_by})" if ref.implied_by else "")
        if self.reason == "disabled":
            return f"{what} is disabled by SCHEDULER_DISABLE_PLUGINS"
        return f"{what} is not installed (no entry point {ref.name!r} in group {ref.group})"

    def message(self) -> str:
        """A sentence naming the field and the plugin."""
        return f"{self.ref.field}: {self.describe()}"

    def to_detail(self) -> dict[str, Any]:
        """The ``details`` item of the error (the keys of a validation detail, plus kind, name and reason)."""
        return {"field": self.ref.field, "code": self.ref.code, "error": self.describe(), "kind": self.ref.kind,
                "name": self.ref.name, "reason": self.reason}


def _field(kind: str, attr: str) -> Callable[[Any], Iterable[PluginRef]]:
    """References made by a plain spec field holding a driver name (None when the field is unset or absent)."""

    def refs(spec: Any) -> Iterable[PluginRef]:
        name = getattr(spec, attr, None)
        return [PluginRef(kind, name, attr)] if isinstance(name, str) and name else []

    return refs


def _proof_verifier(spec: Any) -> Iterable[PluginRef]:
    """The verifier of ``authorization_proof``: named by its ``method`` (``format`` for a detached ``ssh`` signature)."""
    declaration = getattr(spec, "authorization_proof", None)
    if not declaration:
        return []
    name = proof_verifier_name(declaration)
    return [PluginRef("proof_verifier", name, "authorization_proof.method" if name == declaration.get("method")
                      else "authorization_proof.format")]


def _executor(spec: Any) -> Iterable[PluginRef]:
    """The executor: written in ``executor``, or implied by ``session_target``."""
    name = spec.executor_name()
    implied = None if getattr(spec, "executor", None) else f"session_target={spec.session_target}"
    return [PluginRef("executor", name, "executor", implied)]


#: Every place a job spec names a plugin, in the order errors are reported. New fields
#: (evidence, credentials, authorization) add one line each, for example
#: ``lambda s: [PluginRef("evidence", s.evidence["provider"], "evidence.provider")] if s.evidence else []``.
SPEC_REFERENCES: tuple[Callable[[Any], Iterable[PluginRef]], ...] = (
    _executor,
    _field("channel", "delivery_channel"),
    _field("channel", "watchdog_alert_channel"),
    lambda s: [PluginRef("evidence", s.evidence["provider"], "evidence.provider")] if getattr(s, "evidence", None) else [],
    lambda s: [PluginRef("credential", b["provider"], f"credentials[{i}].provider")
               for i, b in enumerate(getattr(s, "credentials", None) or [])],
    _proof_verifier,
    lambda s: ([PluginRef("authorization", s.authorization_ref.partition(":")[0], "authorization_ref")]
               if getattr(s, "authorization_ref", None) else []),
)


def plugin_refs(spec: Any) -> list[PluginRef]:
    """Every plugin a validated ``JobSpec`` names, one entry per place (duplicates kept: each field is reported)."""
    return [ref for refs in SPEC_REFERENCES for ref in refs(spec)]


def missing_plugins(refs: Iterable[PluginRef]) -> list[MissingPlugin]:
    """The references whose plugin is not installed or is disabled (reads metadata once per group, imports nothing)."""
    installed: dict[str, set[str]] = {}
    missing: list[MissingPlugin] = []
    for ref in refs:
        if ref.group not in installed:
            installed[ref.group] = entry_point_names(ref.group)
        if ref.name not in installed[ref.group]:
            missing.append(MissingPlugin(ref, "not installed"))
        elif is_disabled(ref.group, ref.name):
            missing.append(MissingPlugin(ref, "disabled"))
    return missing


def require_plugins(specs: Sequence[Any], *, previous: Sequence[Any | None] | None = None, indexed: bool = False) -> None:
    """Refuse specs naming a plugin that is not installed: ``<KIND>_NOT_AVAILABLE`` listing each one in ``details``.

    ``previous`` (parallel to ``specs``) holds the stored spec an update replaces: a reference
    the update leaves unchanged was accepted when it was written and is not checked again, so
    editing an unrelated field of a job prepared for another host needs no override. With
    ``indexed`` each detail carries the ``index`` of its spec (arrays). The code is that of the
    first missing plugin in ``SPEC_REFERENCES`` order; every missing one is in ``details``.
    """
    details: list[dict[str, Any]] = []
    first: MissingPlugin | None = None
    for index, spec in enumerate(specs):
        old = previous[index] if previous is not None else None
        kept = {(r.kind, r.name, r.field) for r in plugin_refs(old)} if old is not None else set()
        refs = [r for r in plugin_refs(spec) if (r.kind, r.name, r.field) not in kept]
        for item in missing_plugins(refs):
            first = first or item
            detail = item.to_detail()
            if indexed:
                detail["index"] = index
            details.append(detail)
    if first is None:
        return
    more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    raise SchedulerError(
        first.ref.code,
        f"{first.message()}{more}; install the plugin, or pass --allow-missing-plugins to store the job anyway",
        details=details,
    )
