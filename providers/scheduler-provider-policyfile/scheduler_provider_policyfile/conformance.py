"""Conformance setup adapter of the policyfile provider (entry point ``scheduler.conformance_adapters:policyfile``).

For each authorization case it writes a rules file into a fresh ``policy_dir`` saying what
the case asks about the conformance subject (the principal ``service:conformance`` or the
job ``conformance-job``): a permit rule, a deny rule before a rule permitting everyone, an
escalate rule, a file that is not TOML, no file, or a FIFO where the file should be
(reading it blocks until the case is over: a slow provider). Only the conformance engine
imports this module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scheduler.testing import PolicySetup, write_policy_setup


class PolicyFilePolicies:
    """The setup adapter: every policy of the corpus, as rules."""

    def conformance_policy(self, request: Any) -> PolicySetup:
        """Write the case's rules file (see the module docstring) and point ``[providers.policyfile] policy_dir`` at it."""
        policy_dir = Path(request.workdir) / "rules"
        policy_dir.mkdir(parents=True, exist_ok=True)
        if request.condition == "principal":
            match = f"principals = [{json.dumps(request.principal)}]"
        else:
            match = f"jobs = [{json.dumps(request.job_name)}]"
        texts = {
            "permit": f'[[rule]]\neffect = "permit"\nreason = "the conformance subject"\n{match}\n',
            "deny": (f'[[rule]]\neffect = "deny"\nreason = "not the conformance subject"\n{match}\n\n'
                     '[[rule]]\neffect = "permit"\nreason = "everyone else"\n'),
            "escalate": f'[[rule]]\neffect = "escalate"\nreason = "the conformance subject needs an approval"\n{match}\n',
            "invalid": f'[[rule]]\neffect = "permit"\n{match}\nhours = 01:00-05:00\n',
        }
        return write_policy_setup(request, policy_dir, texts, suffix=".toml", missing_ref="no-such-rules",
                                  slow_fifo=policy_dir / "slow.toml")
