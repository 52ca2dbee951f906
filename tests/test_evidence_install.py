"""Installs from built wheels, the way a PyPI user meets them (editable installs hide missing package data).

Two checks share one set of wheels. First, the kernel's wheel alone in a fresh venv: it installs
without PyJWT or httpx (the trust formats and HTTP live in plugins since plugin API 3) and
``scheduler version`` runs; then the default plugins of ``make run``'s demo (the toolkit, the shell
executor, checksum evidence) from their wheels, and the demo itself: its jobs run and their
evidence verifies. Second, ``pip install ./providers/scheduler-provider-ssh`` into a venv holding
only the kernel and the shell executor.

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

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Top-level trees of the checkout the kernel's build does not need.
_TOP = {".venv", ".git", "tests", ".demo", "bench", "docs", "examples", "plugins", "providers", "node_modules"}
#: Build leftovers, at any depth (the copy keeps the checkout clean of build/).
_LEFTOVERS = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__")


def _ignore(directory: str, names: list[str]) -> set[str]:
    skip = set(_LEFTOVERS(directory, names))
    return skip | (_TOP & set(names)) if Path(directory) == ROOT else skip


#: The distributions built from this checkout besides the kernel (the demo's default plugins and the SSH provider).
_DISTRIBUTIONS = (("toolkit", "plugins/scheduler-toolkit"), ("shell", "plugins/scheduler-executor-shell"),
                  ("checksum", "providers/scheduler-provider-checksum"), ("ssh", "providers/scheduler-provider-ssh"))


def _copy_sources(dest: Path) -> dict[str, Path]:
    """Copy the kernel and the plugin sources (pip builds in the copy, never in the checkout)."""
    kernel = dest / "kernel"
    shutil.copytree(ROOT, kernel, ignore=_ignore, symlinks=True)
    out = {"kernel": kernel}
    for key, rel in _DISTRIBUTIONS:
        out[key] = dest / Path(rel).name
        shutil.copytree(ROOT / rel, out[key], ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    return out


def _run(argv: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _third_party_requirements() -> list[str]:
    """The third-party dependencies of the kernel and of the distributions built here, as their pyproject.toml declare them."""
    import tomllib

    found: list[str] = []
    for directory in (ROOT, *(ROOT / rel for _key, rel in _DISTRIBUTIONS)):
        for requirement in tomllib.loads((directory / "pyproject.toml").read_text())["project"]["dependencies"]:
            if not requirement.startswith("scheduler-") and requirement not in found:
                found.append(requirement)
    return found


def _wheelhouses(sources: dict[str, Path], dest: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """(local wheels, third-party wheels): the distributions built without isolation or the index, their third-party
    dependencies downloaded at the same time (two processes, so the download's waiting overlaps the builds)."""
    pip = [sys.executable, "-m", "pip"]
    local, deps = dest / "local", dest / "deps"
    download = subprocess.Popen([*pip, "download", "-q", "-d", str(deps), *_third_party_requirements()], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    built = _run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(local),
                  *(str(path) for path in sources.values())], env)
    _, err = download.communicate(timeout=240)
    assert built.returncode == 0, built.stderr[-3000:]
    assert download.returncode == 0, err[-3000:]
    return local, deps


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(local wheels, third-party wheels), built and downloaded once for this module's venvs."""
    work = tmp_path_factory.mktemp("wheels")
    return _wheelhouses(_copy_sources(work / "src"), work / "wheels", _clean_env())


def _clean_env(venv: Path | None = None) -> dict[str, str]:
    """The environment without this checkout's venv, settings or test switches (the fresh venv first on PATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEDULER_", "PYTHON", "VIRTUAL_ENV"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def _fresh_venv(path: Path) -> tuple[str, str]:
    """A venv without pip or system site-packages: (its python, its scheduler script)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120, capture_output=True)
    return str(path / "bin" / "python"), str(path / "bin" / "scheduler")


def _installed(venv_pip: list[str], env: dict[str, str]) -> set[str]:
    return {p["name"].lower() for p in json.loads(_run([*venv_pip, "list", "--format=json"], env).stdout)}


def test_the_kernel_wheel_installs_without_pyjwt_or_httpx_and_the_demo_runs_from_wheels(
        wheels: tuple[Path, Path], tmp_path: Path) -> None:
    local, deps = wheels
    venv = tmp_path / "venv"
    py, scheduler = _fresh_venv(venv)
    env = _clean_env(venv)
    venv_pip = [sys.executable, "-m", "pip", "--python", py]
    pip = [*venv_pip, "install", "-q", "--no-index", "--find-links", str(local), "--find-links", str(deps)]
    done = _run([*pip, "scheduler-kernel"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    names = _installed(venv_pip, env)
    assert "scheduler-kernel" in names and not names & {"pyjwt", "httpx", "httpcore", "scheduler-toolkit"}, names
    for module in ("jwt", "httpx"):
        probe = _run([py, "-c", f"import {module}"], env)
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, (module, probe.stderr)
    version = _run([scheduler, "--json", "version"], env)
    assert version.returncode == 0 and json.loads(version.stdout)["ok"], version.stdout + version.stderr
    # The kernel alone imports every one of its modules without either library.
    walked = _run([py, "-c", ("import pkgutil, importlib, scheduler; [importlib.import_module(m.name) for m in "
                   "pkgutil.walk_packages(scheduler.__path__, 'scheduler.') if not m.name.startswith(("
                   "'scheduler.testing', 'scheduler.conformance.pytest_plugin', 'scheduler.__main__'))]")], env)
    assert walked.returncode == 0, walked.stderr[-3000:]

    done = _run([*pip, "scheduler-toolkit", "scheduler-executor-shell", "scheduler-provider-checksum"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    db = tmp_path / "demo" / "scheduler.db"
    demo = [scheduler, "--db", str(db)]
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"))
    added = _run([*demo, "--json", "jobs", "add", "--file", str(ROOT / "examples" / "demo-jobs.json")], env)
    assert added.returncode == 0, added.stdout + added.stderr
    ran = _run([*demo, "run", "--duration", "6s"], env, timeout=90)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    runs = json.loads(_run([*demo, "--json", "runs", "list", "--limit", "50"], env).stdout)["runs"]
    names = {j["id"]: j["name"] for j in json.loads(_run([*demo, "--json", "jobs", "list"], env).stdout)["jobs"]}
    outcomes = [(names.get(r["job_id"]), r["status"], r.get("error_code"), r.get("error_message")) for r in runs]
    assert {name for name, status, *_ in outcomes if status == "ok"} >= {"hello", "load-json"}, outcomes
    evidence = _run([*demo, "--json", "runs", "evidence", "--all"], env)
    assert evidence.returncode == 0, evidence.stdout + evidence.stderr
    assert "Traceback" not in ran.stdout + ran.stderr + evidence.stderr


def test_pip_install_ssh_provider_signs_verifies_and_uninstalls_cleanly(wheels: tuple[Path, Path], tmp_path: Path) -> None:
    local, deps = wheels
    venv = tmp_path / "venv"
    py, scheduler = _fresh_venv(venv)
    env = _clean_env(venv)
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
