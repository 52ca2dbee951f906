"""Conformance source adapters of the local providers (entry points ``scheduler.conformance_adapters:env|file|command``).

Each starts a stand-in credential source in the case's directory and gives the case's
``source`` answer in its own terms; what a local source cannot do (a variable cannot
expire, a file is never slow) is ``NotImplementedError`` and the case is skipped.
Only the conformance engine imports this module.
"""

from __future__ import annotations

import os
import secrets
import shlex
from pathlib import Path
from typing import Any


def _value() -> str:
    return "lc-" + secrets.token_urlsafe(24)


class _Source:
    settings: dict[str, Any]
    secrets: dict[str, str]
    ref: str

    def __init__(self) -> None:
        self._values: list[str] = []

    def values(self) -> list[str]:
        """Every value this source held."""
        return list(self._values)

    def close(self) -> None:
        """Nothing to stop (the engine removes the case's directory)."""


class EnvSource:
    """``env``: a variable of the dispatcher's environment (the engine sets it while the case runs)."""

    def conformance_source(self, request: Any) -> _Source:
        """``value``, ``missing`` (unset), ``empty``, ``refused`` (denied by ``[providers.env] deny``)."""
        source = _Source()
        name = f"CONFORMANCE_CRED_{secrets.token_hex(6).upper()}"
        value = _value()
        source.ref, source.settings, source.secrets = name, {}, {}
        if request.source in ("value", "refused"):
            source.secrets = {name: value}
            source._values.append(value)
            if request.source == "refused":
                source.settings = {"deny": ["SCHEDULER_*", name]}
        elif request.source == "empty":
            source.secrets = {name: ""}
        elif request.source != "missing":
            raise NotImplementedError(f"a variable cannot be {request.source}")
        return source


class FileSource:
    """``file``: a private file under a configured root."""

    def conformance_source(self, request: Any) -> _Source:
        """``value``, ``missing``, ``empty``, ``refused`` (mode 0644: readable by others)."""
        source = _Source()
        root = Path(request.workdir) / "credentials"
        root.mkdir(mode=0o700)
        path = root / "secret"
        source.ref, source.settings, source.secrets = str(path), {"roots": [str(root)]}, {}
        value = _value()
        if request.source in ("value", "refused", "empty"):
            content = "" if request.source == "empty" else value + "\n"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(content)
            if request.source != "empty":
                source._values.append(value)
            if request.source == "refused":
                os.chmod(path, 0o644)
        elif request.source != "missing":
            raise NotImplementedError(f"a file cannot be {request.source}")
        return source


class CommandSource:
    """``command``: a configured command printing the value."""

    def conformance_source(self, request: Any) -> _Source:
        """``value``, ``missing`` (no such command), ``empty``, ``failure`` (exit 3), ``slow`` (sleeps past the timeout)."""
        source = _Source()
        value = _value()
        script = Path(request.workdir) / "print-secret.sh"
        bodies = {
            "value": f"printf '%s\\n' '{value}'\n",
            "missing": f"printf '%s\\n' '{value}'\n",
            "empty": "exit 0\n",
            "failure": "echo 'helper failed' >&2\nexit 3\n",
            "slow": f"sleep {request.timeout_s + 5:g}\nprintf '%s\\n' '{value}'\n",
        }
        if request.source not in bodies:
            raise NotImplementedError(f"a command cannot be {request.source}")
        script.write_text("#!/bin/sh\n" + bodies[request.source])
        script.chmod(0o700)
        if request.source in ("value", "slow", "missing"):
            source._values.append(value)
        source.ref = "absent" if request.source == "missing" else "conformance"
        source.settings = {"commands": {"conformance": f"/bin/sh {shlex.quote(str(script))}"}, "timeout_s": request.timeout_s}
        source.secrets = {}
        return source


__all__ = ["CommandSource", "EnvSource", "FileSource"]
