"""Settings references through these providers: ``command:NAME`` and the checked ``file:`` reader.

Registering a scheme changes process-wide state, so the registry itself is exercised
in a fresh interpreter; the readers are also called directly here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from scheduler_provider_local.schemes import COMMAND_SCHEME, check_command, read_command

PROBE = r"""
import json, sys
from scheduler_provider_local.schemes import register_secret_schemes
from scheduler.api import SchedulerError
from scheduler_toolkit.settings import SecretRef
print(json.dumps(register_secret_schemes(strict_file=True)))
for ref in sys.argv[1:]:
    try:
        print(json.dumps({"ref": ref, "value": SecretRef.parse(ref).resolve()}))
    except SchedulerError as e:
        print(json.dumps({"ref": ref, "code": e.code, "message": e.message}))
    except ValueError as e:
        print(json.dumps({"ref": ref, "invalid": str(e)}))
"""


def probe(settings: Path, *refs: str) -> list[dict]:
    env = {**os.environ, "SCHEDULER_CONFIG": str(settings)}
    done = subprocess.run([sys.executable, "-c", PROBE, *refs], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_settings_references_resolve_through_the_local_providers(tmp_path, write_settings, secret) -> None:
    helper = tmp_path / "helper"
    helper.write_text(f"#!/bin/sh\necho '{secret}'\n")
    helper.chmod(0o700)
    failing = tmp_path / "failing"
    failing.write_text(f"#!/bin/sh\necho '{secret}' >&2\nexit 2\n")
    failing.chmod(0o700)
    good = tmp_path / "good"
    good.write_text(secret + "\n")
    good.chmod(0o600)
    loose = tmp_path / "loose"
    loose.write_text(secret)
    loose.chmod(0o644)
    settings = write_settings({"providers.command": {"commands": {"slack-token": str(helper), "broken": str(failing)}}})
    names, *answers = probe(settings, "command:slack-token", "command:broken", "command:unknown", "command:Bad Name",
                            f"file:{good}", f"file:{loose}")
    assert names == ["command", "file"]
    by_ref = {a["ref"]: a for a in answers}
    assert by_ref["command:slack-token"]["value"] == secret
    assert by_ref["command:broken"]["code"] == "SECRET_UNRESOLVED"
    assert "CREDENTIAL_COMMAND_FAILED" in by_ref["command:broken"]["message"]
    assert by_ref["command:unknown"] == {"ref": "command:unknown", "code": "SECRET_UNRESOLVED",
                                         "message": "secret command:unknown does not exist"}
    assert "[providers.command] command" in by_ref["command:Bad Name"]["invalid"]
    assert by_ref[f"file:{good}"]["value"] == secret
    assert by_ref[f"file:{loose}"]["code"] == "SECRET_UNRESOLVED" and "0644" in by_ref[f"file:{loose}"]["message"]
    assert secret not in json.dumps([a for a in answers if "value" not in a])


def test_importing_the_package_registers_nothing_and_the_kernel_loads_command_by_entry_point(tmp_path) -> None:
    code = ("import scheduler_provider_local, scheduler_provider_local.schemes\n"
            "from scheduler.settings.secret import secret_schemes\n"
            "from scheduler_toolkit.settings import SecretRef\n"
            "print(','.join(secret_schemes()))\n"
            "print(SecretRef.parse('command:x').reference, ','.join(secret_schemes()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["env,file", "command:x", "command,env,file"], done.stderr


def test_the_reader_directly(tmp_path, write_settings) -> None:
    write_settings({"providers.command": {"commands": {"t": "/bin/echo from-command"}}})
    assert read_command("t") == "from-command"
    assert read_command("nope") is None
    assert check_command("t") is None and check_command("../x")


def test_the_scheme_is_declared_as_an_entry_point() -> None:
    (ep,) = [e for e in entry_points(group="scheduler.secret_schemes") if e.name == "command"]
    assert ep.load() is COMMAND_SCHEME and COMMAND_SCHEME.name == "command"


@pytest.mark.parametrize("driver", ["env", "file", "command"])
def test_each_driver_is_loaded_and_listed(driver) -> None:
    from scheduler_toolkit.types import KNOWN_CAPABILITIES

    from scheduler.api import PLUGIN_API_VERSION, CredentialProvider
    from scheduler.testing import load_provider, run_cli

    provider = load_provider("credential", driver)
    assert isinstance(provider, CredentialProvider) and provider.plugin_api == PLUGIN_API_VERSION
    assert provider.capabilities == frozenset() and set(provider.capabilities) <= KNOWN_CAPABILITIES
    assert not hasattr(provider, "refresh") and not hasattr(provider, "revoke")
    code, out, err = run_cli("--json", "plugins", "list")
    assert code == 0, err
    rows = [r for r in json.loads(out)["plugins"] if r["name"] == driver and "credential" in r["group"]]
    assert rows and rows[0]["status"] == "ok" and rows[0]["distribution"] == "scheduler-provider-local"
