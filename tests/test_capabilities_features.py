"""Issue 28 item 3: the seed's plugin-dependent keys of ``capabilities --json`` follow what is installed.

``artifact_bound_proofs``, ``provider_session_cache``, ``credential_presentation``,
``source_run_bound_delegation``, ``gateway_capability_discovery`` and
``gateway_env_injection_negotiation`` come from the plugin-kind registry
(``scheduler.base.plugin_kinds.FEATURES``) read against entry-point metadata: switching a
distribution off (``SCHEDULER_DISABLE_PLUGINS``) or side-loading one changes the value, and
the command imports no plugin. Real ``scheduler`` subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import uuid
from pathlib import Path
from typing import Any

from kernel_testing import scheduler_cmd, sideload_distribution

KEYS = ("artifact_bound_proofs", "provider_session_cache", "credential_presentation", "source_run_bound_delegation",
        "gateway_capability_discovery", "gateway_env_injection_negotiation")


def capabilities(tmp_path: Path, **env: str) -> dict[str, Any]:
    out = subprocess.run([*scheduler_cmd(), "--json", "capabilities"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    caps: dict[str, Any] = json.loads(out.stdout)["capabilities"]
    return caps


def installed(group: str) -> list[str]:
    import importlib.metadata

    return sorted(ep.name for ep in importlib.metadata.entry_points(group=group))


def test_every_key_is_true_with_the_suite_installed(tmp_path: Path) -> None:
    caps = capabilities(tmp_path)
    assert {k: caps[k] for k in KEYS} == dict.fromkeys(KEYS, True)


def test_switching_a_distribution_off_turns_its_keys_off(tmp_path: Path) -> None:
    agent = capabilities(tmp_path, SCHEDULER_DISABLE_PLUGINS="executors:agent")
    assert (agent["gateway_capability_discovery"], agent["gateway_env_injection_negotiation"]) == (False, False)
    assert agent["provider_session_cache"] and agent["artifact_bound_proofs"]
    oauth2 = capabilities(tmp_path, SCHEDULER_DISABLE_PLUGINS="credential_providers:oauth2")
    assert (oauth2["provider_session_cache"], oauth2["credential_presentation"]) == (False, True)
    creds = capabilities(tmp_path, SCHEDULER_DISABLE_PLUGINS="credential_providers:*")
    assert (creds["provider_session_cache"], creds["credential_presentation"]) == (False, False)
    proofs = capabilities(tmp_path, SCHEDULER_DISABLE_PLUGINS="proof_verifiers:*")
    assert proofs["artifact_bound_proofs"] is False
    nothing = capabilities(tmp_path, SCHEDULER_DISABLE_PLUGINS="all")
    assert {k: nothing[k] for k in KEYS} == {**dict.fromkeys(KEYS, False), "source_run_bound_delegation": True}


def test_installing_a_distribution_turns_its_key_on_without_importing_it(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    project = tmp_path / "scheduler-provider-vault"
    (project / f"vault_{tag}").mkdir(parents=True)
    marker = tmp_path / "imported"
    (project / "pyproject.toml").write_text(textwrap.dedent(f"""
        [project]
        name = "scheduler-provider-vault"
        version = "0.1.0"

        [project.entry-points."scheduler.credential_providers"]
        vault = "vault_{tag}:Provider"
    """))
    (project / f"vault_{tag}" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError('never imported')\n")
    others = ",".join(f"credential_providers:{name}" for name in installed("scheduler.credential_providers"))
    before = capabilities(tmp_path, SCHEDULER_DISABLE_PLUGINS=others)
    assert before["credential_presentation"] is False
    paths = sideload_distribution(project, tmp_path / "site")
    after = capabilities(tmp_path, SCHEDULER_DISABLE_PLUGINS=others, PYTHONPATH=os.pathsep.join(paths))
    assert after["credential_presentation"] is True
    assert after["provider_session_cache"] is False  # sessions are the OAuth2 provider's, which is still off
    assert not marker.exists()
