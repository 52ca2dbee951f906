"""Conformance setup adapter of the cedar provider (entry point ``scheduler.conformance_adapters:cedar``).

For each authorization case it writes a Cedar policy set into a fresh ``policy_dir`` saying
what the case asks about the conformance subject (``Service::"conformance"`` or
``Job::"conformance-job"``): a ``permit``, a ``forbid`` beside a permit for everyone, an
``@escalate`` permit, a syntax error, nothing at all, or a policy set whose file is a FIFO
(reading it blocks until the case is over: a slow provider). Only the conformance engine
imports this module.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any


class _Setup:
    """A ``policy_dir`` and the ref of one policy in it; ``close`` releases a FIFO a reader may still wait on."""

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


class CedarPolicies:
    """The setup adapter: every policy of the corpus, in Cedar."""

    def conformance_policy(self, request: Any) -> _Setup:
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
        if request.policy in texts:
            (policy_dir / "conformance.cedar").write_text(texts[request.policy])
            return _Setup(policy_dir, "conformance")
        if request.policy == "missing":
            return _Setup(policy_dir, "no-such-policy")
        if request.policy == "slow":
            policy_set = policy_dir / "slow"
            policy_set.mkdir()
            fifo = policy_set / "policy.cedar"
            os.mkfifo(fifo)
            return _Setup(policy_dir, "slow", fifo)
        raise NotImplementedError(f"no Cedar policy for {request.policy!r}")
