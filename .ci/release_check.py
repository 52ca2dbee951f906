"""Release check: every distribution as a PyPI user meets it.

Builds each distribution's sdist and wheel (``python -m build``: the wheel is built from the sdist, so a file
missing from the sdist fails here), runs ``twine check --strict`` on them, checks each carries the LICENSE, then
installs ``scheduler-suite`` from the built wheels (not editable) into one fresh venv and runs the README's demo
there (``make run``'s commands against a temporary database), then installs every other wheel into the same
venv and checks every plugin loads.

Run it with a Python that has ``build``, ``twine``, ``setuptools>=77``, ``wheel`` and ``trove-classifiers``
(``.ci/run`` installs the first two into ``.venv``, whose test extra brings the rest)::

    .venv/bin/python .ci/release_check.py [--keep]

Nothing is written into the checkout: sources are copied to a temporary directory and built there.
Exits 0 when every step passed, 1 (with the failing step's output) otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The distributions published from this checkout: the kernel and every directory under plugins/ and providers/.
DIST_TREES = ("plugins", "providers")
#: Top-level entries of the checkout the kernel's build does not need.
KERNEL_SKIP = {".venv", ".git", ".ci", "tests", ".demo", "bench", "docs", "examples", "plugins", "providers",
               "node_modules", "build", "dist"}
LEFTOVERS = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache")
#: The one install the README names, and the demo jobs that must succeed with it alone.
SUITE = "scheduler-suite"
DEMO_JOBS = ROOT / "examples" / "demo-jobs.json"
MUST_SUCCEED = {"hello", "after-hello", "load-json", "one-shot"}
DEMO_SECONDS = 7


class CheckFailed(Exception):
    """A step of the release check failed; the message holds what to show."""


def distributions() -> list[Path]:
    """The directory of every published distribution, the kernel first."""
    found = [ROOT]
    for tree in DIST_TREES:
        found += sorted(p.parent for p in (ROOT / tree).glob("*/pyproject.toml"))
    return found


def project_name(directory: Path) -> str:
    """The distribution name its pyproject.toml declares."""
    return str(tomllib.loads((directory / "pyproject.toml").read_text(encoding="utf-8"))["project"]["name"])


def run(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300,
        what: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; a non-zero exit raises CheckFailed with its output's tail, naming ``what``."""
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise CheckFailed(f"{what}: exit {done.returncode}\n$ {' '.join(argv)}\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    return done


def copy_sources(dest: Path) -> list[Path]:
    """Copy every distribution's sources under ``dest`` (builds never write build/ or egg-info into the checkout).
    The kernel keeps its symlinks (its package links schema.sql and the fixtures); a plugin's LICENSE symlink is
    copied as the file it names."""
    out = []
    for directory in distributions():
        target = dest / (project_name(directory))
        if directory == ROOT:
            def ignore(path: str, names: list[str]) -> set[str]:
                skip = set(LEFTOVERS(path, names))
                return skip | (KERNEL_SKIP & set(names)) if Path(path) == ROOT else skip
            shutil.copytree(ROOT, target, ignore=ignore, symlinks=True)
        else:
            shutil.copytree(directory, target, ignore=LEFTOVERS)
        out.append(target)
    return out


def build_all(sources: list[Path], outdir: Path) -> None:
    """``python -m build`` (sdist, then the wheel from it) for every source, in parallel, with this interpreter's
    setuptools (no isolation: no build environment per distribution)."""
    def one(src: Path) -> None:
        run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir), str(src)], timeout=300,
            what=f"building {src.name}")

    workers = max(2, min(4, (os.cpu_count() or 2) + 1))  # the builds wait on the disk part of the time
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        errors = [f.exception() for f in [pool.submit(one, s) for s in sources]]
    failed = [str(e) for e in errors if e is not None]
    if failed:
        raise CheckFailed("\n\n".join(failed))


def check_archives(outdir: Path, names: list[str]) -> tuple[list[Path], list[Path]]:
    """Exactly one sdist and one wheel per distribution, each carrying the LICENSE and declaring it
    (License-Expression: MIT, License-File: LICENSE)."""
    wheels, sdists, problems = [], [], []
    for name in names:
        stem = name.replace("-", "_")
        wheel = sorted(outdir.glob(f"{stem}-*.whl"))
        sdist = sorted(outdir.glob(f"{stem}-*.tar.gz"))
        if len(wheel) != 1 or len(sdist) != 1:
            problems.append(f"{name}: wheels {[p.name for p in wheel]}, sdists {[p.name for p in sdist]}")
            continue
        wheels += wheel
        sdists += sdist
        with zipfile.ZipFile(wheel[0]) as zf:
            files = zf.namelist()
            metadata = zf.read(next(f for f in files if f.endswith(".dist-info/METADATA"))).decode()
            if not any(f.endswith(".dist-info/licenses/LICENSE") for f in files):
                problems.append(f"{wheel[0].name}: no .dist-info/licenses/LICENSE")
        if "License-Expression: MIT" not in metadata or "License-File: LICENSE" not in metadata:
            problems.append(f"{wheel[0].name}: METADATA lacks License-Expression: MIT or License-File: LICENSE")
        with tarfile.open(sdist[0]) as tf:
            members = {m.name: m for m in tf.getmembers()}
            top = sdist[0].name.removesuffix(".tar.gz")
            lic = members.get(f"{top}/LICENSE")
            if lic is None or not lic.isfile():
                problems.append(f"{sdist[0].name}: no LICENSE file (a symlink does not count)")
    if problems:
        raise CheckFailed("archives:\n" + "\n".join(problems))
    return wheels, sdists


def clean_env(venv: Path, home: Path) -> dict[str, str]:
    """This environment without the checkout's venv, settings or test switches; the fresh venv first on PATH and
    HOME and the XDG directories in ``home``, so no user setting or database is read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEDULER_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}", HOME=str(home), PIP_DISABLE_PIP_VERSION_CHECK="1",
               XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"), XDG_STATE_HOME=str(home / "state"))
    return env


def demo(scheduler: Path, db: Path, env: dict[str, str], cwd: Path) -> str:
    """``make run``'s commands against ``db``; checks the jobs that must succeed did and nothing crashed.
    Returns the runs table for the log."""
    base = [str(scheduler), "--db", str(db)]
    out = []
    for argv, what in (([*base, "jobs", "add", "--file", str(DEMO_JOBS)], "jobs add"),
                       ([*base, "jobs", "list"], "jobs list"),
                       ([*base, "run", "--duration", f"{DEMO_SECONDS}s"], "run"),
                       ([*base, "runs", "list", "--limit", "20"], "runs list"),
                       ([*base, "status"], "status"),
                       ([*base, "runs", "evidence", "--all"], "runs evidence --all")):
        done = run(argv, env=env, cwd=cwd, timeout=120, what=f"demo: scheduler {what}")
        out.append(done.stdout + done.stderr)
    text = "".join(out)
    if "Traceback" in text:
        raise CheckFailed(f"demo: a traceback in its output\n{text[-6000:]}")
    jobs = {j["id"]: j["name"] for j in json.loads(run([*base, "--json", "jobs", "list"], env=env, cwd=cwd,
                                                       what="demo: jobs list --json").stdout)["jobs"]}
    runs = json.loads(run([*base, "--json", "runs", "list", "--limit", "100"], env=env, cwd=cwd,
                          what="demo: runs list --json").stdout)["runs"]
    ok = {jobs.get(r["job_id"]) for r in runs if r["status"] == "ok"}
    if not ok >= MUST_SUCCEED:
        outcomes = [(jobs.get(r["job_id"]), r["status"], r.get("error_code"), r.get("error_message")) for r in runs]
        raise CheckFailed(f"demo: no successful run of {sorted(MUST_SUCCEED - ok)}\n{outcomes}\n{text[-4000:]}")
    return out[3]


def check_plugins(scheduler: Path, env: dict[str, str], cwd: Path, names: list[str]) -> int:
    """With every wheel installed, every plugin entry point loads (``plugins list``) and every distribution is the
    one built here (same version as its pyproject.toml). Returns the number of plugins listed."""
    listed = json.loads(run([str(scheduler), "--json", "plugins", "list"], env=env, cwd=cwd,
                            what="plugins list --json").stdout)
    plugins = listed.get("plugins", [])
    bad = [p for p in plugins if p.get("status") != "ok"]
    if not plugins or bad:
        raise CheckFailed(f"plugins list: {bad or listed}")
    return len(plugins)


def installed_versions(python: Path, env: dict[str, str]) -> dict[str, str]:
    """Distribution name -> version installed in the venv of ``python``."""
    script = "import json, importlib.metadata as m; print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))"
    return dict(json.loads(run([str(python), "-c", script], env=env, what="listing the venv").stdout))


def main(argv: list[str] | None = None) -> int:
    """Run every step, print one line per step with its time, and the total."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the work directory (its path is printed)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="release-check-"))
    mark = start

    def step(text: str) -> None:
        nonlocal mark
        now = time.monotonic()
        print(f"release check: {text} ({now - mark:.1f} s)", flush=True)
        mark = now

    try:
        dirs = distributions()
        names = [project_name(d) for d in dirs]
        expected = {n: str(tomllib.loads((d / "pyproject.toml").read_text())["project"]["version"]) for n, d in zip(names, dirs, strict=True)}
        sources = copy_sources(work / "src")
        outdir = work / "dist"
        build_all(sources, outdir)
        wheels, sdists = check_archives(outdir, names)
        step(f"built {len(sdists)} sdists and {len(wheels)} wheels")
        run([sys.executable, "-m", "twine", "check", "--strict", *map(str, sdists + wheels)], what="twine check")
        step(f"twine check --strict passed on {len(sdists) + len(wheels)} files")

        venv = work / "venv"
        run([sys.executable, "-m", "venv", "--without-pip", str(venv)], what="creating the venv")
        env = clean_env(venv, work / "home")
        (work / "home").mkdir()
        python, scheduler = venv / "bin" / "python", venv / "bin" / "scheduler"
        pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--only-binary", "scheduler-*",
               "--find-links", str(outdir)]
        run([*pip, SUITE], env=env, timeout=300, what=f"pip install {SUITE}")
        versions = installed_versions(python, env)
        ours = {n: v for n, v in versions.items() if n in expected}
        wrong = {n: v for n, v in ours.items() if v != expected[n]}
        if "scheduler-kernel" not in ours or "scheduler-executor-shell" not in ours or wrong:
            raise CheckFailed(f"pip install {SUITE}: installed {ours}; not the versions built here: {wrong}")
        step(f"pip install {SUITE} from the wheels: {', '.join(sorted(ours))}")
        table = demo(scheduler, work / "demo" / "scheduler.db", env, work)
        step(f"the demo ran ({DEMO_SECONDS} s dispatcher): {', '.join(sorted(MUST_SUCCEED))} succeeded")
        print(table, end="" if table.endswith("\n") else "\n")

        run([*pip, *map(str, wheels)], env=env, timeout=300, what="pip install every wheel")
        versions = installed_versions(python, env)
        missing = sorted(n for n in expected if versions.get(n) != expected[n])
        if missing:
            raise CheckFailed(f"after installing every wheel, not installed at the version built: {missing}")
        count = check_plugins(scheduler, env, work, names)
        step(f"every wheel installed together; plugins list: {count} plugins, all ok")
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        print(f"release check FAILED after {time.monotonic() - start:.1f} s: {exc}", file=sys.stderr)
        print(f"work directory kept: {work}", file=sys.stderr)
        return 1
    if args.keep:
        print(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"release check passed: {len(names)} distributions in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
