"""Conformance setup adapter of the policyfile provider (entry point ``scheduler.conformance_adapters:policyfile``).

For each authorization case it writes a rules file into a fresh ``policy_dir`` saying what
the case asks about the conformance subject (the principal ``service:conformance`` or the
job ``conformance-job``): a permit rule, a deny rule before a rule permitting everyone, an
escalate rule, a file that is not TOML, no file, or a FIFO where the file should be
(reading it blocks until the case is over: a slow provider). Only the conformance engine
imports this module.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


class _Setup:
    """A ``policy_dir`` and the ref of one rules file in it; ``close`` releases a FIFO a reader may still wait on."""

    def __init__(self, policy_dir: Path, policy_ref: str, fifo: Path | None = None) -> None:
        self.settings: dict[str, Any] = {"policy_dir": str(policy_dir)}
        self.policy_ref = policy_ref
        self.provider_config: dict[str, Any] = {}
        self.secrets: dict[str, str] = {}
        self.fifo = fifo

    def close(self) -> None:
        """Open the FIFO for writing and close it at once: a provider blocked reading it gets an empty file and returns."""
        if self.fifo is None:
            return
        with contextlib.suppress(OSError):
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        with contextlib.suppress(OSError):
            self.fifo.unlink()


class PolicyFilePolicies:
    """The setup adapter: every policy of the corpus, as rules."""

    def conformance_policy(self, request: Any) -> _Setup:
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
        if request.policy in texts:
            (policy_dir / "conformance.toml").write_text(texts[request.policy])
            return _Setup(policy_dir, "conformance")
        if request.policy == "missing":
            return _Setup(policy_dir, "no-such-rules")
        if request.policy == "slow":
            fifo = policy_dir / "slow.toml"
            os.mkfifo(fifo)
            return _Setup(policy_dir, "slow", fifo)
        raise NotImplementedError(f"no rules file for {request.policy!r}")
