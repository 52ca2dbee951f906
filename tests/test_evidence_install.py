"""``pip install ./providers/scheduler-provider-ssh`` into a venv holding only the kernel and the shell executor.

The first thing many users type. A fresh venv (no system site-packages) gets the kernel and
the shell executor, then the SSH evidence provider: normal, non-editable installs of wheels
pip builds from a copy of this checkout (``pip wheel``: what ``pip install DIR`` does before it
installs). A real ``scheduler run`` process runs a job with SSH evidence signed by a real
``ssh-keygen`` key, ``runs evidence`` verifies it; after ``pip uninstall`` of the provider,
``runs evidence`` says ``EVIDENCE_PROVIDER_NOT_LOADED`` with no traceback.

Fast (about 80 s before, most of it pip waiting on the package index and ``ensurepip``): the
venv is made ``--without-pip`` and the test's own pip installs into it (``pip --python``); the
local distributions are built once, without build isolation or the index; the kernel's
third-party dependencies are fetched once (``pip download``, while the wheels build) and
every install runs ``--no-index`` from those two directories, so pip resolves exactly what
the venv must hold and nothing else reaches it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Top-level trees of the checkout the kernel's build does not need.
_TOP = {".venv", ".git", "tests", ".demo", "bench", "docs", "examples", "plugins", "providers", "node_modules"}
#: Build leftovers, at any depth (the copy keeps the checkout clean of build/).
_LEFTOVERS = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__")


def _ignore(directory: str, names: list[str]) -> set[str]:
    skip = set(_LEFTOVERS(directory, names))
    return skip | (_TOP & set(names)) if Path(directory) == ROOT else skip


def _copy_sources(dest: Path) -> dict[str, Path]:
    """Copy the kernel, the shell executor and the SSH provider sources (pip builds in the copy, never in the checkout)."""
    kernel = dest / "kernel"
    shutil.copytree(ROOT, kernel, ignore=_ignore, symlinks=True)
    out = {"kernel": kernel}
    for key, rel in (("shell", "plugins/scheduler-executor-shell"), ("ssh", "providers/scheduler-provider-ssh")):
        out[key] = dest / Path(rel).name
        shutil.copytree(ROOT / rel, out[key], ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    return out


def _run(argv: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _third_party_requirements() -> list[str]:
    """The kernel's own dependencies, as its pyproject.toml declares them (what a kernel install pulls in)."""
    import tomllib

    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def _wheelhouses(sources: dict[str, Path], dest: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """(local wheels, third-party wheels): the three distributions built without isolation or the index, the kernel's
    dependencies downloaded at the same time (two processes, so the download's waiting overlaps the builds)."""
    pip = [sys.executable, "-m", "pip"]
    local, deps = dest / "local", dest / "deps"
    download = subprocess.Popen([*pip, "download", "-q", "-d", str(deps), *_third_party_requirements()], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    built = _run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(local),
                  *(str(sources[k]) for k in ("kernel", "shell", "ssh"))], env)
    _, err = download.communicate(timeout=240)
    assert built.returncode == 0, built.stderr[-3000:]
    assert download.returncode == 0, err[-3000:]
    return local, deps


def test_pip_install_ssh_provider_signs_verifies_and_uninstalls_cleanly(tmp_path: Path) -> None:
    sources = _copy_sources(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120, capture_output=True)
    py, scheduler = str(venv / "bin" / "python"), str(venv / "bin" / "scheduler")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEDULER_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}")
    local, deps = _wheelhouses(sources, tmp_path / "wheels", env)
    venv_pip = [sys.executable, "-m", "pip", "--python", py]
    pip = [*venv_pip, "install", "-q", "--no-index", "--find-links", str(local), "--find-links", str(deps)]
    done = _run([*pip, "scheduler-kernel", "scheduler-executor-shell"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = _run([*venv_pip, "list", "--format=json"], env)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"scheduler-kernel", "scheduler-executor-shell"} <= names and not any(
        n.startswith("scheduler-provider") for n in names), names
    assert "pip" not in names and "setuptools" not in names, names  # nothing but what the kernel and the shell need
    (ssh_wheel,) = local.glob("scheduler_provider_ssh-*.whl")
    done = _run([*pip, str(ssh_wheel)], env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "scheduler-provider-ssh" in {p["name"].lower() for p in json.loads(_run([*venv_pip, "list", "--format=json"],
                                                                                  env).stdout)}

    keys = tmp_path / "keys"
    keys.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "signer", "-f", str(keys / "signer")],
                   check=True, capture_output=True, timeout=30)
    (keys / "allowed_signers").write_text(f"ops@example.org {(keys / 'signer.pub').read_text().strip()}\n")
    config = tmp_path / "config.toml"
    config.write_text(f'[providers.ssh]\nkey = "{keys / "signer"}"\nprincipal = "ops@example.org"\n'
                      f'allowed_signers = "{keys / "allowed_signers"}"\n')
    env.update(SCHEDULER_DB=str(tmp_path / "scheduler.db"), SCHEDULER_CONFIG=str(config),
               SCHEDULER_ARTIFACTS_DIR=str(tmp_path / "artifacts"))

    spec = {"name": "signed", "schedule_kind": "manual", "payload_message": "echo signed output",
            "evidence": {"provider": "ssh", "retention": "90d"}}
    added = _run([scheduler, "--json", "jobs", "add", json.dumps(spec)], env)
    assert added.returncode == 0, added.stdout + added.stderr
    assert _run([scheduler, "--json", "jobs", "run", "signed"], env).returncode == 0
    ran = _run([scheduler, "run", "--duration", "3s"], env, timeout=60)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    runs = json.loads(_run([scheduler, "--json", "runs", "list", "signed"], env).stdout)["runs"]
    assert [r["status"] for r in runs] == ["ok"], runs
    run_id = runs[0]["id"]

    verified = _run([scheduler, "--json", "runs", "evidence", run_id], env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    view = json.loads(verified.stdout)
    assert (view["ok"], view["verified"], view["provider"], view["method"]) == (True, True, "ssh", "ssh-signature")

    gone = _run([*venv_pip, "uninstall", "-y", "-q", "scheduler-provider-ssh"], env)
    assert gone.returncode == 0, gone.stderr
    for argv in ([scheduler, "--json", "runs", "evidence", run_id], [scheduler, "runs", "evidence", run_id]):
        refused = _run(argv, env)
        assert refused.returncode != 0
        assert "Traceback" not in refused.stdout + refused.stderr, refused.stderr
        assert "EVIDENCE_PROVIDER_NOT_LOADED" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    assert json.loads(_run([scheduler, "--json", "runs", "evidence", run_id], env).stdout)["code"] == "EVIDENCE_PROVIDER_NOT_LOADED"
