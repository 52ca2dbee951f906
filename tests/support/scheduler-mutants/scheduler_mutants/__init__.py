"""Deliberately broken providers: each an honest first-party provider with ONE method overridden (tests only).

Every variant subclasses the honest reference of its kind (``REFERENCES``), so it loads, declares
the honest one's ``plugin_api`` and capabilities, and uses the honest one's conformance adapter;
its one overridden method breaks exactly the promise it is named after (``Variant.promise``).
``tests/test_conformance_mutants.py`` runs the stock corpus against each, stopping at the first
failing case, and fails unless a corpus case (not a load error) catches it; docs/plugins.md
lists what catches each. Side-loaded by that test only, never installed (the Makefile leaves
this distribution out of the dev venv, like ``scheduler-executor-broken``).
"""

from __future__ import annotations

import attrs

#: Kind -> (the honest reference's driver name, its conformance adapter entry point).
REFERENCES: dict[str, tuple[str, str]] = {
    "executor": ("shell", "scheduler_executor_shell.conformance:ShellPayloadAdapter"),
    "channel": ("webhook", "scheduler_channel_webhook.conformance:WebhookService"),
    "credential": ("command", "scheduler_provider_local.conformance:CommandSource"),
    "evidence": ("ssh", "scheduler_provider_ssh.conformance:SshSetup"),
    "authorization": ("policyfile", "scheduler_provider_policyfile.conformance:PolicyFilePolicies"),
    "proof_verifier": ("jwt", "scheduler_provider_proofs.conformance:JwtProofs"),
}
#: The entry-point name of a variant: ``mutant-<variant>``.
PREFIX = "mutant-"


@attrs.frozen
class Variant:
    """One broken provider: its kind, its name (the promise it breaks, kebab-case), the promise, its class path."""

    kind: str
    name: str
    promise: str
    target: str

    @property
    def driver(self) -> str:
        """The entry-point name it is registered under."""
        return PREFIX + self.name
