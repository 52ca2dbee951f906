"""The public plugin API: the contract in ``scheduler.api``, the toolkit beside it, the import rule, the old names.

* the import rule: first-party plugins import ``scheduler.api``, ``scheduler_toolkit`` and
  ``scheduler.testing`` of the kernel's code, nothing else; the toolkit alone may import
  kernel internals (it is released with the kernel), and the kernel never imports it;
* the contract stays small: at most 35 public names across ``scheduler.api`` and its
  submodules (``scheduler.api.ops``, another facade, aside), and importing it stays cheap;
* every name the API exported before the split still imports from its old place, with a
  ``DeprecationWarning`` naming the new import, and no first-party code triggers it;
* error codes: a registry, documented, and the only codes the kernel raises.
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_TREES = ("plugins", "providers", "examples", "tests/support")
#: The one distribution allowed to import kernel internals: released with the kernel, pinned to its minor series.
TOOLKIT = "plugins/scheduler-toolkit"
ALLOWED = re.compile(r"^scheduler\.(api|testing)(\.|$)")
#: Distributions another engineer is moving right now: their imports are listed in that work, not checked here yet.
PENDING_IMPORT_MOVES: tuple[str, ...] = ()


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


def _plugin_sources(root: Path) -> list[Path]:
    """Every Python file of the first-party plugin trees under ``root``."""
    return sorted(p for tree in PLUGIN_TREES if (root / tree).is_dir() for p in (root / tree).rglob("*.py"))


def boundary_offenders(root: Path) -> list[str]:
    """Kernel imports of plugin code outside the public API (``scheduler.api``, ``scheduler.testing``), the toolkit aside."""
    offenders = []
    for path in _plugin_sources(root):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(TOOLKIT + "/"):
            continue
        offenders.extend(f"{rel}: {name}" for name in _kernel_imports(path) if not ALLOWED.match(name.split(" ")[0]))
    return offenders


# -- the import rule -----------------------------------------------------------------------------


def test_plugins_import_only_the_public_api() -> None:
    """Plugins, providers, examples and the test distributions import scheduler.api, scheduler_toolkit and scheduler.testing."""
    assert _plugin_sources(ROOT), "no plugin sources found"
    offenders = boundary_offenders(ROOT)
    assert not offenders, "plugins must import only scheduler.api / scheduler_toolkit / scheduler.testing:\n" + "\n".join(offenders)


def test_the_boundary_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    """A plugin importing a kernel internal is named; the toolkit importing one, or anyone importing the toolkit, is not."""
    plugin = tmp_path / "plugins" / "scheduler-channel-x" / "scheduler_channel_x"
    plugin.mkdir(parents=True)
    (plugin / "channel.py").write_text("import os\nfrom scheduler.api import Channel\nfrom scheduler.core.spec import JobSpec\n"
                                       "from scheduler import artifacts\nimport scheduler.testing\n"
                                       "from scheduler_toolkit.http import read_attachment\n")
    toolkit = tmp_path / TOOLKIT / "scheduler_toolkit"
    toolkit.mkdir(parents=True)
    (toolkit / "output.py").write_text("from scheduler.core.outputs import StreamRecorder\n")
    example = tmp_path / "tests" / "support" / "scheduler-step-x" / "step.py"
    example.parent.mkdir(parents=True)
    example.write_text("def hook():\n    from scheduler.core.steps import StepBase\n")
    assert boundary_offenders(tmp_path) == [
        "plugins/scheduler-channel-x/scheduler_channel_x/channel.py: scheduler.core.spec (line 3)",
        "plugins/scheduler-channel-x/scheduler_channel_x/channel.py: scheduler.artifacts (line 4)",
        "tests/support/scheduler-step-x/step.py: scheduler.core.steps (line 2)",
    ]


def test_the_kernel_never_imports_the_toolkit() -> None:
    """The toolkit sits above the kernel: no kernel module imports ``scheduler_toolkit`` (the old-name shims name it as data)."""
    offenders = []
    for path in sorted((ROOT / "scheduler").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n.split(".")[0] == "scheduler_toolkit"]
    assert offenders == []


# -- the contract --------------------------------------------------------------------------------

#: The whole contract, by kind (scheduler.api's docstring lists the same; a change to either is a decision).
CONTRACT = {
    "scheduler.api": {
        "PLUGIN_API_VERSION", "hookimpl",
        "SchedulerError", "TransientDeliveryError", "PermanentDeliveryError",
        "Executor", "ExecutionRequest", "RunControl", "ExecutionResult", "RecoveryRequest", "RecoveryOutcome",
        "Channel", "DeliveryPart", "DeliveryRoute", "DeliveryReceipt",
        "EvidenceProvider", "EvidencePayload", "EvidenceDeclaration", "EvidenceEnvelope", "EvidenceVerification",
        "CredentialProvider", "CredentialBinding", "CredentialContext", "ResolvedCredential",
        "AuthorizationProvider", "AuthorizationRequest", "AuthorizationDecision",
        "ProofVerifier", "VerifiedProof",
        "DeclaresOptions", "Configurable", "Recoverable", "PolicyChecking",
    },
    "scheduler.api.store": {"Store", "Tx"},
    "scheduler.api.process": set(),
    "scheduler.api.cli": set(),
}
MAX_CONTRACT_NAMES = 35
#: Modules of ``scheduler.`` that ``import scheduler.api`` loads in a fresh interpreter (84 before the contract was cut down;
#: 29 at plugin API 3, 30 since ``scheduler.core.rows``, attrs only, types the run a stream is read from).
MAX_MODULES_FOR_THE_CONTRACT = 30


def _api_modules() -> list[str]:
    """``scheduler.api`` and each of its submodules except ``ops`` (a facade of its own, counted apart)."""
    api = importlib.import_module("scheduler.api")
    return ["scheduler.api"] + sorted(f"scheduler.api.{m.name}" for m in pkgutil.iter_modules(api.__path__) if m.name != "ops")


def _public_names(module: types.ModuleType) -> set[str]:
    """What a module binds publicly, beyond submodules and ``from __future__`` features."""
    return {name for name, value in vars(module).items() if not name.startswith("_")
            and not isinstance(value, types.ModuleType) and type(value).__name__ != "_Feature"}


def test_the_contract_is_at_most_35_names() -> None:
    """Every public name of scheduler.api and its submodules is the contract; there are at most 35 (listed on failure)."""
    names = {}
    for module_name in _api_modules():
        module = importlib.import_module(module_name)
        assert set(module.__all__) == _public_names(module), f"{module_name}: __all__ is not every public name"
        names[module_name] = sorted(module.__all__)
    total = sum(len(v) for v in names.values())
    listing = "\n".join(f"{m}: {', '.join(v)}" for m, v in names.items())
    assert total <= MAX_CONTRACT_NAMES, f"the contract has {total} names, more than {MAX_CONTRACT_NAMES}:\n{listing}"
    assert {m: set(v) for m, v in names.items()} == CONTRACT, listing


def test_importing_the_contract_stays_cheap() -> None:
    """``import scheduler.api`` in a fresh interpreter loads at most MAX_MODULES_FOR_THE_CONTRACT kernel modules."""
    code = "import json, sys, scheduler.api; print(json.dumps(sorted(m for m in sys.modules if m == 'scheduler' or m.startswith('scheduler.'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    loaded = json.loads(out)
    assert len(loaded) <= MAX_MODULES_FOR_THE_CONTRACT, f"{len(loaded)} modules:\n" + "\n".join(loaded)
    assert not [m for m in loaded if m.startswith(("scheduler.cli", "scheduler.runtime", "scheduler.conformance"))], loaded


def test_every_public_name_imports() -> None:
    toolkit = importlib.import_module("scheduler_toolkit")
    toolkit_modules = [f"scheduler_toolkit.{m.name}" for m in pkgutil.iter_modules(toolkit.__path__)]
    assert len(toolkit_modules) >= 15, toolkit_modules
    for module_name in [*_api_modules(), "scheduler.testing", *toolkit_modules]:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module_name}.{name}"


def test_api_exports_a_protocol_per_provider_kind() -> None:
    import scheduler.api as api
    from scheduler.plugins.protocols import PROVIDER_KINDS

    for kind, (_group, protocol) in PROVIDER_KINDS.items():
        assert getattr(api, protocol.__name__) is protocol, kind
    assert api.PLUGIN_API_VERSION == 3


def test_capability_names_are_kebab_case() -> None:
    from scheduler_toolkit.types import KNOWN_CAPABILITIES

    from scheduler.plugins.loader import load_provider

    kebab = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
    assert all(kebab.match(c) for c in KNOWN_CAPABILITIES)
    shell = load_provider("executor", "shell")
    assert set(shell.capabilities) <= KNOWN_CAPABILITIES, set(shell.capabilities) - KNOWN_CAPABILITIES


# -- the old names, for one release --------------------------------------------------------------

#: What each module exported before the contract was cut down (plugin API v2 as released): each still imports.
FORMER_NAMES = {
    "scheduler.api": """
        AbortableRequest AuthorizationDecision AuthorizationProvider AuthorizationRequest CANONICALIZATION CancellationToken
        Channel ChannelLimits CheckedPayload Constraints CredentialBinding CredentialContext CredentialPresent
        CredentialPresentation CredentialProvider DEFAULT_EXCERPT_BYTES DEFAULT_OFFLOAD_BYTES Delegation DeliveryError
        DeliveryPart DeliveryReceipt DeliveryRoute EXECUTION_STATUSES ErrorCode EvidenceDeclaration EvidenceEnvelope
        EvidenceFailure EvidencePayload EvidenceProvider EvidenceVerification ExecutionRequest ExecutionResult Executor
        INJECTION_PATTERNS JobSpec KNOWN_CAPABILITIES MemoryProviderSessions PAYLOAD_FORMAT PLUGIN_API_VERSION
        PermanentDeliveryError PooledHttpClient ProviderSessions REVOKE_CODES RecoveryOutcome RecoveryRequest RefreshResult
        ResolvedCredential ResolvedIdentity RevokeResult Run RunControl SESSION_STATUSES SchedulerError SecretRef Step
        StepBase StreamCapture StreamRecorder StrictJSONError TRUST_LEVELS TransientDeliveryError TriggerContext UNDEFINED
        build_options canonical_bytes canonical_digest canonical_json catalogue check_bound_payload check_keys check_payload
        check_requested_methods declared_options endpoint_label envelope_parts error_for_exception error_for_status
        find_injection fold_text hash_bytes hash_text hookimpl is_digest now_ms options_to_json parse_canonical
        plugin_settings read_artifact read_attachment register_secret_scheme reload_settings requested_methods
        retry_after_seconds sanitise_text strict_json structured_from_capture to_iso unparsed_record""",
    "scheduler.api.store": """
        DIALECTS MIGRATIONS Migration PLUGIN_API_VERSION Params SCHEMA_VERSION SchedulerError SchemaConnection StepHook
        Store Tx UpgradeFailed migrate now_ms open_store redact_url schema_fingerprint schema_indexes schema_sql
        schema_statements schema_tables schema_triggers upgrade""",
    "scheduler.api.process": """
        Completed group_alive kill_group leftovers_after_reap live_group_members minimal_env orphan_group_safe_to_kill
        process_identity run_bounded same_process snippet""",
    "scheduler.api.cli": "emit table",
}
MOVED = [(module, name) for module, names in FORMER_NAMES.items() for name in names.split()
         if name not in CONTRACT[module]]


def test_every_former_name_is_in_the_contract_or_moved() -> None:
    for module_name, names in FORMER_NAMES.items():
        module = importlib.import_module(module_name)
        moved = set(module.__getattr__.moves)
        assert set(names.split()) <= set(module.__all__) | moved, module_name
        assert not moved & set(module.__all__), module_name


@pytest.mark.parametrize(("module_name", "name"), MOVED, ids=[f"{m}.{n}" for m, n in MOVED])
def test_a_former_name_warns_and_is_the_new_homes_object(module_name: str, name: str) -> None:
    module = importlib.import_module(module_name)
    new = module.__getattr__.new_module(name)
    assert new.startswith(("scheduler_toolkit.", "scheduler.testing", "scheduler.api")), new
    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(module, name)
    assert len(caught) == 1 and caught[0].filename == __file__  # points at the importing line
    message = str(caught[0].message)
    assert f"{module_name}.{name}" in message and f"from {new} import {name}" in message, message
    home = importlib.import_module(new)
    assert getattr(home, name) is value and name in home.__all__
    assert name not in vars(module)  # never cached: the next import warns again


def test_from_import_of_a_former_name_warns() -> None:
    with pytest.warns(DeprecationWarning, match=r"from scheduler_toolkit\.http import PooledHttpClient"):
        from scheduler.api import PooledHttpClient
    from scheduler_toolkit.http import PooledHttpClient as new

    assert PooledHttpClient is new
    with pytest.raises(ImportError):
        from scheduler.api import NoSuchName  # noqa: F401


# -- no first-party code uses an old name --------------------------------------------------------


#: The tests of the old names themselves import them on purpose.
IMPORTS_FORMER_NAMES_ON_PURPOSE = ("tests/test_api.py", "tests/test_deprecation.py")


def _first_party_files() -> list[Path]:
    """Plugin trees (tests included) and the kernel's tests, without the distributions being moved by another engineer."""
    files = _plugin_sources(ROOT) + sorted((ROOT / "tests").glob("*.py"))
    return [p for p in files if not p.relative_to(ROOT).as_posix().startswith((*PENDING_IMPORT_MOVES, *IMPORTS_FORMER_NAMES_ON_PURPOSE))]


def _imports_of_former_names(source: str) -> list[tuple[int, str]]:
    """``(line, module.name)`` of each ``from scheduler.api[.x] import name`` outside the contract (submodules aside)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in CONTRACT:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if a.name not in CONTRACT[node.module] and f"{node.module}.{a.name}" not in (*CONTRACT, "scheduler.api.ops")]
    return found


def test_no_first_party_code_imports_a_former_name() -> None:
    """Every ``from scheduler.api... import X`` in first-party code names the contract: inside functions too, and in the
    plugin sources tests write out (a string that parses as Python and imports from scheduler.api)."""
    offenders = []
    for path in _first_party_files():
        text = path.read_text(encoding="utf-8")
        sources = [text] + [node.value for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Constant)
                            and isinstance(node.value, str) and "from scheduler.api" in node.value]
        for source in sources:
            try:
                found = _imports_of_former_names(textwrap.dedent(source))
            except SyntaxError:  # a string that only mentions an import
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in found]
    assert offenders == [], "\n".join(offenders)


def _distribution_modules() -> list[tuple[str, str]]:
    """``(distribution dir, module)`` for every module of every first-party plugin package (tests are not modules)."""
    found = []
    for pyproject in sorted(p for tree in PLUGIN_TREES for p in (ROOT / tree).glob("**/pyproject.toml")):
        dist = pyproject.parent
        if dist.relative_to(ROOT).as_posix().startswith(PENDING_IMPORT_MOVES):
            continue
        for package in sorted(p.parent for p in dist.glob("*/__init__.py")):
            if package.name == "tests" or package.name.endswith(".egg-info"):
                continue
            for path in sorted(package.rglob("*.py")):
                parts = list(path.relative_to(dist).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                found.append((str(dist), ".".join(parts)))
    return found


#: Modules that fail to import on purpose (a stand-in for a missing dependency).
BROKEN_ON_PURPOSE = {"scheduler_executor_broken.import_error"}


def test_first_party_modules_import_without_a_deprecation_warning() -> None:
    """Every module of every first-party plugin imports in a fresh interpreter with DeprecationWarning as an error."""
    modules = _distribution_modules()
    assert len(modules) > 50, modules
    script = textwrap.dedent("""
        import importlib, json, sys, warnings
        warnings.simplefilter("error", DeprecationWarning)
        failed = {}
        for dist, module in json.loads(sys.argv[1]):
            if dist not in sys.path:
                sys.path.append(dist)
            try:
                importlib.import_module(module)
            except BaseException as exc:
                failed[module] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(failed))
    """)
    done = subprocess.run([sys.executable, "-c", script, json.dumps(modules)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(failed) == BROKEN_ON_PURPOSE, json.dumps(failed, indent=1)


# -- error codes ---------------------------------------------------------------------------------


def _documented_codes() -> set[str]:
    """The codes of the tables (first column) in the ``### Error codes`` section of docs/cli.md."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text[text.index("### Error codes"):]
    section = section[: section.index("\n## ")]
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", section, re.MULTILINE))


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
    from scheduler.testing import run_cli

    code, out, err = run_cli("--json", "schema", "jobs", "--executor", "shell")
    assert code == 0, err
    doc = json.loads(out)
    names = [o["name"] for o in doc["options"]["executor_options"]]
    assert names == ["env_policy", "env_allow", "working_dir", "stdin_text", "user", "added_by", "added_by_uid"]
    assert "executor_options" in [f["name"] for f in doc["fields"]]
    assert not {"shell_env_policy", "working_dir", "stdin_text"} & {f["name"] for f in doc["fields"]}
    code, out, _ = run_cli("--json", "schema", "jobs", "--executor", "nosuch")
    assert code == 1 and json.loads(out)["code"] == "EXECUTOR_NOT_AVAILABLE"
