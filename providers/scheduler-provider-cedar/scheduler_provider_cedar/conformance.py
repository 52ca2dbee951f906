"""Conformance setup adapter of the cedar provider (entry point ``scheduler.conformance_adapters:cedar``).

For each authorization case it writes a Cedar policy set into a fresh ``policy_dir`` saying
what the case asks about the conformance subject (``Service::"conformance"`` or
``Job::"conformance-job"``): a ``permit``, a ``forbid`` beside a permit for everyone, an
``@escalate`` permit, a syntax error, nothing at all, or a policy set whose file is a FIFO
(reading it blocks until the case is over: a slow provider). Only the conformance engine
imports this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scheduler.testing import PolicySetup, write_policy_setup


class CedarPolicies:
    """The setup adapter: every policy of the corpus, in Cedar."""

    def conformance_policy(self, request: Any) -> PolicySetup:
        """Write the case's policy (see the module docstring) and point ``[providers.cedar] policy_dir`` at it."""
        policy_dir = Path(request.workdir) / "cedar-policies"
        policy_dir.mkdir(parents=True, exist_ok=True)
        if request.condition == "principal":
            kind = request.principal_kind.capitalize()
            scope = f'principal == {kind}::"{request.principal_name}", action, resource'
        else:
            scope = f'principal, action, resource == Job::"{request.job_name}"'
        texts = {
            "permit": f'@id("conformance-permit")\npermit({scope});\n',
            "deny": f'@id("everyone")\npermit(principal, action, resource);\n@id("conformance-forbid")\nforbid({scope});\n',
            "escalate": f'@id("conformance-approval")\n@escalate("high")\npermit({scope});\n',
            "invalid": f"permit({scope}) when {{ context.time.hour >>> }};\n",
        }
        return write_policy_setup(request, policy_dir, texts, suffix=".cedar", missing_ref="no-such-policy",
                                  slow_fifo=policy_dir / "slow" / "policy.cedar")
