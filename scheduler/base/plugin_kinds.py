"""The one registry of plugin kinds: entry-point group, contract, settings section, conformance.

Everything that needs to know what kinds of plugins exist reads this table: the loader
(``scheduler.plugins.loader``), the inventory behind ``plugins list`` and ``doctor``, the
settings (which file section holds a kind's tables), the conformance runner (which kinds it
has a corpus for), the missing-plugin codes (``<KIND>_NOT_AVAILABLE``), the docs and their
tests. Adding a kind is one line here plus its Protocol.

It sits at the bottom of the kernel (it is data: names, no classes) so that the settings
layer can read the sections without importing the plugin layer. The Protocol of a kind is
named here and bound in ``scheduler.plugins.kinds`` (``protocol_of``), where a test checks
that every name resolves.
"""

from __future__ import annotations

import attrs

from scheduler.base.entry_points import entry_point_names, is_disabled
from scheduler.base.errors import SchedulerError


@attrs.frozen
class PluginKind:
    """One kind of plugin and everything the kernel knows about it."""

    #: What users, the conformance runner and the error codes call it (``executor`` -> ``EXECUTOR_NOT_AVAILABLE``).
    name: str
    #: The entry-point group its distributions register in.
    group: str
    #: What one entry point is, in a few words (``plugins list``, docs/plugins.md).
    what: str
    #: The Protocol its objects implement, by name in ``scheduler.plugins.protocols`` (None: no object contract).
    protocol: str | None = None
    #: Loaded by ``load_provider``: instantiated, checked for ``plugin_api``, ``capabilities`` and its Protocol.
    provider: bool = False
    #: Settings-file section of its per-plugin tables (``[executors.NAME]``), None when it has none.
    section: str | None = None
    #: Whether the conformance runner has a corpus for it (``scheduler conformance run KIND``).
    conformance: bool = False
    #: Whether its objects declare ``plugin_api`` and ``capabilities`` (checked at load); providers always do.
    versioned: bool = attrs.field(default=attrs.Factory(lambda self: self.provider, takes_self=True))


#: Every kind, in display order (``plugins list``).
KINDS: tuple[PluginKind, ...] = (
    PluginKind("executor", "scheduler.executors", "runs a job's payload", "Executor",
               provider=True, section="executors", conformance=True),
    PluginKind("channel", "scheduler.channels", "delivers a run's output", "Channel",
               provider=True, section="channels", conformance=True),
    PluginKind("evidence", "scheduler.evidence_providers", "attests and verifies a run's evidence", "EvidenceProvider",
               provider=True, section="providers", conformance=True),
    PluginKind("credential", "scheduler.credential_providers", "resolves credential bindings at run time",
               "CredentialProvider", provider=True, section="providers", conformance=True),
    PluginKind("authorization", "scheduler.authorization_providers", "decides an authorization_ref",
               "AuthorizationProvider", provider=True, section="providers", conformance=True),
    PluginKind("proof_verifier", "scheduler.proof_verifiers", "verifies one authorization-proof format",
               "ProofVerifier", provider=True, section="providers", conformance=True),
    PluginKind("store", "scheduler.stores", "a database the scheduler runs on", "Store", versioned=True),
    PluginKind("hook", "scheduler.hooks", "a module of pluggy hook implementations"),
    PluginKind("step", "scheduler.steps", "a run pipeline step", "Step"),
    PluginKind("secret_scheme", "scheduler.secret_schemes", "a scheme of secret references in the settings (name:...)"),
    PluginKind("conformance_adapter", "scheduler.conformance_adapters",
               "sets up the conformance runner's cases for one provider"),
)

_BY_NAME = {k.name: k for k in KINDS}
_BY_GROUP = {k.group: k for k in KINDS}

#: Every entry-point group the kernel reads, in display order.
GROUPS: tuple[str, ...] = tuple(k.group for k in KINDS)
#: The group of pluggy hook modules (registered into the plugin manager, not loaded as providers).
HOOKS_GROUP: str = _BY_NAME["hook"].group
#: The kinds ``load_provider`` makes (instantiated and checked against their Protocol).
PROVIDER_KIND_NAMES: tuple[str, ...] = tuple(k.name for k in KINDS if k.provider)


def kind_named(name: str) -> PluginKind:
    """The kind called ``name``; ``PLUGIN_KIND_UNKNOWN`` naming the known ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise SchedulerError("PLUGIN_KIND_UNKNOWN", f"unknown plugin kind {name!r} (known: {', '.join(_BY_NAME)})",
                             details={"kind": name}) from None


def kind_of_group(group: str) -> PluginKind:
    """The kind whose entry-point group is ``group``; ``PLUGIN_KIND_UNKNOWN`` otherwise."""
    try:
        return _BY_GROUP[group]
    except KeyError:
        raise SchedulerError("PLUGIN_KIND_UNKNOWN", f"unknown entry-point group {group!r} (known: {', '.join(GROUPS)})",
                             details={"group": group}) from None


def declares_api(group: str) -> bool:
    """Whether objects of ``group`` must declare ``plugin_api`` (an unknown group: yes, fail closed)."""
    found = _BY_GROUP.get(group)
    return True if found is None else found.versioned


def settings_sections() -> dict[str, str]:
    """``kind -> settings-file section`` of every kind whose plugins have host settings."""
    return {k.name: k.section for k in KINDS if k.section is not None}


@attrs.frozen
class Feature:
    """A ``capabilities`` feature the kernel implements and which the installed plugins make usable.

    ``needs`` lists ``(kind, driver)`` pairs, ``driver`` ``"*"`` for any driver of the kind; the feature
    is on when one of them is installed and not switched off (``SCHEDULER_DISABLE_PLUGINS``). No need:
    the kernel alone provides it. Read from entry-point metadata only: nothing is imported.
    """

    key: str
    needs: tuple[tuple[str, str], ...] = ()
    #: What it is, for docs/cli.md.
    what: str = ""


#: The seed's feature keys of ``scheduler capabilities`` whose value follows what is installed.
FEATURES: tuple[Feature, ...] = (
    Feature("artifact_bound_proofs", (("proof_verifier", "*"),),
            "authorization proofs bound to the job's artifact digest and dispatch, checked by a proof verifier plugin"),
    Feature("provider_session_cache", (("credential", "oauth2"),),
            "a credential provider that caches sessions across runs, recorded in provider_sessions (the OAuth2 provider)"),
    Feature("credential_presentation", (("credential", "*"),),
            "credential bindings resolved by a provider and presented as env, file or stdin with their digests recorded"),
    Feature("source_run_bound_delegation", (),
            "a chain child's delegation is proven from the run that triggered it (the kernel's identity step)"),
    Feature("gateway_capability_discovery", (("executor", "agent"),),
            "the agent executor reads a gateway's declared capabilities (GET /v1/info, /health)"),
    Feature("gateway_env_injection_negotiation", (("executor", "agent"),),
            "the agent executor sends credentials to a gateway only when it declares chat-completions-env-inject-v1"),
)


def feature_values() -> dict[str, bool]:
    """Each ``FEATURES`` key and whether it is on now: its kernel part always is, its plugins per the metadata."""
    names: dict[str, set[str]] = {}
    out: dict[str, bool] = {}
    for feature in FEATURES:
        on = not feature.needs
        for kind, driver in feature.needs:
            group = _BY_NAME[kind].group
            if group not in names:
                names[group] = entry_point_names(group)
            if any(not is_disabled(group, n) for n in names[group] if driver in ("*", n)):
                on = True
        out[feature.key] = on
    return out


__all__ = [
    "FEATURES", "GROUPS", "HOOKS_GROUP", "KINDS", "PROVIDER_KIND_NAMES", "Feature", "PluginKind", "declares_api",
    "feature_values", "kind_named", "kind_of_group", "settings_sections",
]
