"""The conformance setup adapter of ``teams`` (entry point ``scheduler.conformance_adapters:teams``).

The scheduler's conformance engine asks it, per case, for a "policy" saying something about
the conformance subject; for ``teams`` that is a team (the policy ref) and its members
(``provider_config``), or a ``teams_file``:

* permit: the subject is a member; deny: it is not (``others = "deny"``); escalate: it is not
  and ``others = "escalate"``;
* invalid: ``teams_file`` is not TOML; missing: a team nobody is in;
* slow: ``teams_file`` is a FIFO, so reading it blocks until the case is over.

``teams`` decides by principal only, so a policy on the job's name is declined
(``NotImplementedError``: the engine skips the case with the reason, it never passes it).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any


class _Setup:
    """What the engine needs: settings, the policy ref, the job's provider_config; ``close`` releases a FIFO."""

    def __init__(self, policy_ref: str, provider_config: dict[str, Any], teams_file: Path | None = None,
                 fifo: bool = False) -> None:
        self.settings: dict[str, Any] = {"teams_file": str(teams_file)} if teams_file else {}
        self.policy_ref = policy_ref
        self.provider_config = provider_config
        self.secrets: dict[str, str] = {}
        self.fifo = teams_file if fifo else None

    def close(self) -> None:
        """Open the FIFO for writing and close it at once: a provider blocked reading it gets an empty file."""
        if self.fifo is None:
            return
        with contextlib.suppress(OSError):
            os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
        with contextlib.suppress(OSError):
            self.fifo.unlink()


class TeamsPolicies:
    """The setup adapter of the example provider."""

    def conformance_policy(self, request: Any) -> _Setup:
        """A team saying the case's policy about ``request.principal`` (see the module docstring)."""
        if request.condition != "principal":
            raise NotImplementedError("teams decides by the run's principal only, never by the job's name")
        stranger = "service:not-" + request.principal_name
        if request.policy == "permit":
            return _Setup("ops", {"members": [request.principal]})
        if request.policy == "deny":
            return _Setup("ops", {"members": [stranger], "others": "deny"})
        if request.policy == "escalate":
            return _Setup("ops", {"members": [stranger], "others": "escalate"})
        if request.policy == "missing":
            return _Setup("nobody", {})
        teams_file = Path(request.workdir) / "teams.toml"
        if request.policy == "invalid":
            teams_file.write_text("ops = [service:unquoted\n")
            return _Setup("ops", {"members": [request.principal]}, teams_file)
        if request.policy == "slow":
            os.mkfifo(teams_file)
            return _Setup("ops", {"members": [request.principal]}, teams_file, fifo=True)
        raise NotImplementedError(f"no team for {request.policy!r}")
