"""The public plugin API: one module for plugins, a registry of error codes, kebab-case capabilities."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_TREES = ("plugins", "providers", "examples")
ALLOWED = re.compile(r"^scheduler\.(api|testing)(\.|$)")


def _kernel_imports(path: Path) -> list[str]:
    """Kernel modules a Python file imports (``scheduler`` and ``scheduler.*``), with line numbers."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "scheduler" else [f"scheduler.{a.name}" for a in node.names]
        for name in names:
            if name == "scheduler" or name.startswith("scheduler."):
                found.append(f"{name} (line {node.lineno})")
    return found


def test_plugins_import_only_the_public_api() -> None:
    """Everything under plugins/, providers/ and examples/ imports scheduler.api (and scheduler.testing), nothing else."""
    offenders = []
    files = [p for tree in PLUGIN_TREES if (ROOT / tree).is_dir() for p in (ROOT / tree).rglob("*.py")]
    assert files, "no plugin sources found"
    for path in files:
        for name in _kernel_imports(path):
            if not ALLOWED.match(name.split(" ")[0]):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, "plugins must import only scheduler.api / scheduler.testing:\n" + "\n".join(offenders)


def test_the_boundary_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import os\nfrom scheduler.api import Executor\nfrom scheduler.core.spec import JobSpec\n"
                      "from scheduler import artifacts\nimport scheduler.testing\n")
    bad = [n for n in _kernel_imports(sample) if not ALLOWED.match(n.split(" ")[0])]
    assert bad == ["scheduler.core.spec (line 3)", "scheduler.artifacts (line 4)"]


def test_every_public_name_imports() -> None:
    for module in ("scheduler.api", "scheduler.api.process", "scheduler.api.cli", "scheduler.testing"):
        mod = importlib.import_module(module)
        for name in mod.__all__:
            assert getattr(mod, name) is not None, f"{module}.{name}"


def test_api_exports_a_protocol_per_provider_kind() -> None:
    import scheduler.api as api
    from scheduler.plugins.protocols import PROVIDER_KINDS

    for kind, (_group, protocol) in PROVIDER_KINDS.items():
        assert getattr(api, protocol.__name__) is protocol, kind
    assert api.PLUGIN_API_VERSION == 2


def test_capability_names_are_kebab_case() -> None:
    from scheduler.api import KNOWN_CAPABILITIES
    from scheduler.plugins.loader import load_provider

    kebab = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
    assert all(kebab.match(c) for c in KNOWN_CAPABILITIES)
    shell = load_provider("executor", "shell")
    assert set(shell.capabilities) <= KNOWN_CAPABILITIES, set(shell.capabilities) - KNOWN_CAPABILITIES


# -- error codes ---------------------------------------------------------------------------------


def _documented_codes() -> set[str]:
    """The codes of the tables (first column) in the ``### Error codes`` section of docs/cli.md."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text[text.index("### Error codes"):]
    section = section[: section.index("\n## ")]
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", section, re.M))


def test_every_registered_code_is_documented() -> None:
    from scheduler.base.errors import ErrorCode

    missing = sorted(c.value for c in ErrorCode if c.value not in _documented_codes())
    assert not missing, "docs/cli.md (### Error codes) does not explain: " + ", ".join(missing)


def test_every_documented_code_is_registered() -> None:
    from scheduler.base.errors import ErrorCode

    registered = {c.value for c in ErrorCode}
    unknown = sorted(_documented_codes() - registered)
    assert not unknown, "docs/cli.md documents codes the registry does not know: " + ", ".join(unknown)


def test_kernel_raises_only_registered_codes() -> None:
    """Every literal code in ``SchedulerError("CODE", ...)`` and ``error_code = 'CODE'`` in scheduler/ is registered."""
    from scheduler.base.errors import ErrorCode

    registered = {c.value for c in ErrorCode}
    patterns = (
        re.compile(r'SchedulerError\(\s*"([A-Z][A-Z0-9_]+)"'),
        re.compile(r"""error_code\s*[=:]\s*['"]([A-Z][A-Z0-9_]+)['"]"""),
        re.compile(r"""error_code = '([A-Z][A-Z0-9_]+)'"""),
        re.compile(r'"code":\s*"([A-Z][A-Z0-9_]+)"'),
    )
    unknown = {}
    for path in (ROOT / "scheduler").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for pattern in patterns:
            for code in pattern.findall(text):
                if code not in registered:
                    unknown.setdefault(code, str(path.relative_to(ROOT)))
    assert not unknown, f"codes used in the kernel but missing from ErrorCode: {unknown}"


@pytest.mark.parametrize("code", ["DB_BUSY"])
def test_retryable_codes(code: str) -> None:
    from scheduler.base.errors import SchedulerError

    assert SchedulerError(code, "x").retryable
    assert not SchedulerError("DB_INIT_FAILED", "x").retryable


def test_schema_jobs_lists_an_executors_own_options() -> None:
    import json

    from scheduler.testing import run_cli

    code, out, err = run_cli("--json", "schema", "jobs", "--executor", "shell")
    assert code == 0, err
    doc = json.loads(out)
    names = [o["name"] for o in doc["options"]["executor_options"]]
    assert names == ["env_policy", "env_allow", "working_dir", "stdin_text"]
    assert "executor_options" in [f["name"] for f in doc["fields"]]
    assert not {"shell_env_policy", "working_dir", "stdin_text"} & {f["name"] for f in doc["fields"]}
    code, out, _ = run_cli("--json", "schema", "jobs", "--executor", "nosuch")
    assert code == 1 and json.loads(out)["code"] == "EXECUTOR_NOT_AVAILABLE"
