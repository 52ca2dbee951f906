"""Keep the documentation honest: signatures, hook tests, CLI reference, quick start, the example plugin.

* every hookspec (``scheduler.plugins.hookspecs.scheduler_*``) appears in ``docs/plugins.md``
  with its exact signature, in a section of its own that states its firstresult semantics;
* every public method (and attribute) of every provider Protocol in ``PROVIDER_KINDS``, of
  ``RunControl`` and of the store Protocols appears there with its exact signature;
* every hookspec is named by at least one test file (kernel, plugins, providers);
* ``docs/cli.md`` has a section for every command of the click tree, naming each option;
* the README's quick start is exactly ``make run`` and ``make test``;
* the ten-line executor in ``docs/plugins.md`` is the walkthrough's real code, and it passes
  the conformance cases it claims to.

Fast and without a database: it reads files, imports modules and runs a few tiny processes.
"""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest

from scheduler.core.execution import RunControl
from scheduler.core.store.base import Store, Tx
from scheduler.plugins import hookspecs
from scheduler.plugins.protocols import PROVIDER_KINDS

ROOT = Path(__file__).resolve().parents[1]
PLUGINS_MD = ROOT / "docs" / "plugins.md"
CLI_MD = ROOT / "docs" / "cli.md"
README = ROOT / "README.md"
EXAMPLE_DIST = ROOT / "examples" / "plugin-walkthrough" / "scheduler-executor-hello"
EXAMPLE_EXECUTOR = EXAMPLE_DIST / "scheduler_executor_hello" / "executor.py"
THIS_FILE = Path(__file__).resolve()

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^```(\w*)\s*$")


# --------------------------------------------------------------------------- helpers


def _read(path: Path) -> str:
    assert path.is_file(), f"{path.relative_to(ROOT)} does not exist"
    return path.read_text(encoding="utf-8")


def code_blocks(markdown: str, language: str | None = None) -> list[str]:
    """The fenced code blocks of a markdown text (of one language when given)."""
    blocks: list[str] = []
    current: list[str] | None = None
    lang = ""
    for line in markdown.splitlines():
        fence = _FENCE.match(line.strip())
        if current is None:
            if fence:
                current, lang = [], fence.group(1)
        elif line.strip() == "```":
            if language is None or lang == language:
                blocks.append("\n".join(current))
            current = None
        else:
            current.append(line)
    return blocks


def python_lines(markdown: str) -> set[str]:
    """Every line (stripped) of every ```python block."""
    return {line.strip() for block in code_blocks(markdown, "python") for line in block.splitlines()}


def sections(markdown: str) -> list[tuple[int, str, str]]:
    """``(level, heading text without backticks, body up to the next heading of the same or a higher level)``."""
    lines = markdown.splitlines()
    heads: list[tuple[int, int, str]] = []
    in_code = False
    for index, line in enumerate(lines):
        if _FENCE.match(line.strip()) or line.strip() == "```":
            in_code = not in_code
            continue
        match = None if in_code else _HEADING.match(line)
        if match:
            heads.append((index, len(match.group(1)), match.group(2).replace("`", "").strip()))
    out = []
    for pos, (index, level, text) in enumerate(heads):
        end = next((i for i, lvl, _ in heads[pos + 1 :] if lvl <= level), len(lines))
        out.append((level, text, "\n".join(lines[index + 1 : end])))
    return out


def section(markdown: str, heading: str) -> str | None:
    """The body of the first section whose heading is exactly ``heading`` (backticks ignored)."""
    return next((body for _, text, body in sections(markdown) if text == heading), None)


def _annotation(value: Any, where: str) -> str:
    # The kernel modules use ``from __future__ import annotations``: annotations are the source text.
    assert isinstance(value, str), (
        f"{where}: annotation {value!r} is not a string (is `from __future__ import annotations` gone?)"
    )
    return value


def signature_line(name: str, func: Callable[..., Any]) -> str:
    """``def name(params) -> ret:`` exactly as written in the source."""
    sig = inspect.signature(func)
    parts: list[str] = []
    star_written = False
    params = list(sig.parameters.values())
    for index, param in enumerate(params):
        if param.kind is param.KEYWORD_ONLY and not star_written:
            parts.append("*")
            star_written = True
        if param.kind is param.VAR_POSITIONAL:
            text = "*" + param.name
            star_written = True
        elif param.kind is param.VAR_KEYWORD:
            text = "**" + param.name
        else:
            text = param.name
        if param.annotation is not param.empty:
            text += ": " + _annotation(param.annotation, f"{name}({param.name})")
        if param.default is not param.empty:
            text += (" = " if param.annotation is not param.empty else "=") + repr(param.default)
        parts.append(text)
        is_last_positional_only = param.kind is param.POSITIONAL_ONLY and (
            index + 1 == len(params) or params[index + 1].kind is not param.POSITIONAL_ONLY
        )
        if is_last_positional_only:
            parts.append("/")
    ret = "" if sig.return_annotation is sig.empty else " -> " + _annotation(sig.return_annotation, f"{name} return")
    return f"def {name}({', '.join(parts)}){ret}:"


def hookspec_functions() -> list[tuple[str, Callable[..., Any]]]:
    """Every ``scheduler_*`` hookspec function, in source order."""
    found = [
        (name, obj)
        for name, obj in vars(hookspecs).items()
        if name.startswith("scheduler_") and inspect.isfunction(obj) and obj.__module__ == hookspecs.__name__
    ]
    assert found, "scheduler.plugins.hookspecs defines no scheduler_* hookspec"
    return found


def documented_protocols() -> list[type]:
    """Every Protocol whose methods docs/plugins.md must show: one per provider kind, RunControl, the store's."""
    protocols = [protocol for _group, protocol in PROVIDER_KINDS.values()]
    return [*protocols, RunControl, Store, Tx]


def protocol_members(protocol: type) -> list[tuple[str, str]]:
    """``(member, expected line)`` for each public method and declared attribute of a Protocol."""
    out: list[tuple[str, str]] = []
    for attr, annotation in vars(protocol).get("__annotations__", {}).items():
        if not attr.startswith("_"):
            out.append((attr, f"{attr}: {_annotation(annotation, f'{protocol.__name__}.{attr}')}"))
    for name, member in vars(protocol).items():
        if inspect.isfunction(member) and not name.startswith("_"):
            out.append((name, signature_line(name, member)))
    return out


HOOKSPECS = hookspec_functions()
HOOK_IDS = [name for name, _ in HOOKSPECS]


# --------------------------------------------------------------------------- (a) hookspecs in docs/plugins.md


def test_signature_renderer_reproduces_the_source() -> None:
    """The expected lines are built from ``inspect``; prove they are the literal source text."""
    funcs: list[tuple[str, Callable[..., Any]]] = list(HOOKSPECS)
    for protocol in documented_protocols():
        funcs += [(n, m) for n, m in vars(protocol).items() if inspect.isfunction(m) and not n.startswith("_")]
    for name, func in funcs:
        source = " ".join(inspect.getsource(func).split())
        expected = " ".join(signature_line(name, func).split())
        assert expected in source, f"rendered {expected!r} is not in the source of {func.__qualname__}"


@pytest.mark.parametrize(("name", "func"), HOOKSPECS, ids=HOOK_IDS)
def test_hookspec_signature_is_documented(name: str, func: Callable[..., Any]) -> None:
    expected = signature_line(name, func)
    assert expected in python_lines(_read(PLUGINS_MD)), (
        f"docs/plugins.md has no ```python block with the exact signature of hookspec {name}:\n    {expected}"
    )


@pytest.mark.parametrize(("name", "func"), HOOKSPECS, ids=HOOK_IDS)
def test_hookspec_has_a_section_stating_firstresult(name: str, func: Callable[..., Any]) -> None:
    body = section(_read(PLUGINS_MD), name)
    assert body is not None, f"docs/plugins.md has no heading `{name}` for the hookspec"
    assert signature_line(name, func) in {line.strip() for line in body.splitlines()}, f"the `{name}` section lacks its signature"
    body = " ".join(body.split())  # prose may wrap anywhere
    firstresult = bool(getattr(func, f"{hookspecs.PROJECT}_spec", {}).get("firstresult"))
    if firstresult:
        assert re.search(r"\*\*firstresult\*\*|\bis firstresult\b", body), f"`{name}` is firstresult; its section must say so"
    else:
        assert "Not firstresult" in body, f"`{name}` is not firstresult; its section must say `Not firstresult`"


# --------------------------------------------------------------------------- (b) Protocols in docs/plugins.md


@pytest.mark.parametrize("protocol", documented_protocols(), ids=lambda p: p.__name__)
def test_protocol_methods_are_documented(protocol: type) -> None:
    members = protocol_members(protocol)
    assert members, f"{protocol.__name__} has no public member to document"
    documented = python_lines(_read(PLUGINS_MD))
    missing = [line for _name, line in members if line not in documented]
    assert not missing, f"docs/plugins.md lacks the exact signature(s) of {protocol.__name__}:\n" + "\n".join(
        f"    {line}" for line in missing
    )


def test_every_provider_kind_and_group_is_documented() -> None:
    text = _read(PLUGINS_MD)
    for kind, (group, protocol) in PROVIDER_KINDS.items():
        assert f"`{group}`" in text and f"`{kind}`" in text, f"entry-point group {group} (kind {kind}) is not in docs/plugins.md"
        assert section(text, protocol.__name__) is not None, f"docs/plugins.md has no section `{protocol.__name__}`"
    from scheduler.plugins.protocols import GROUPS

    for group in GROUPS:
        assert f"`{group}`" in text, f"entry-point group {group} is not in docs/plugins.md"


def test_loader_codes_and_switches_are_documented() -> None:
    text = _read(PLUGINS_MD)
    for needle in ("PLUGIN_NOT_FOUND", "PLUGIN_LOAD_FAILED", "PLUGIN_API_MISMATCH", "PLUGIN_INVALID",
                   "SCHEDULER_DISABLE_PLUGINS", "SCHEDULER_STRICT_PLUGINS", "PLUGIN_API_VERSION"):
        assert needle in text, f"docs/plugins.md does not mention {needle}"
    loader = (ROOT / "scheduler" / "plugins" / "loader.py").read_text(encoding="utf-8")
    for code in set(re.findall(r'"(PLUGIN_[A-Z_]+)"', loader)):
        assert code in text, f"loader.py raises {code}, which docs/plugins.md does not explain"


# --------------------------------------------------------------------------- (c) every hookspec has a test


def _test_files() -> list[Path]:
    patterns = ["tests/**/test_*.py", "tests/**/*_test.py", "plugins/*/tests/**/*.py", "providers/*/tests/**/*.py"]
    files = {path.resolve() for pattern in patterns for path in ROOT.glob(pattern) if path.is_file()}
    files.discard(THIS_FILE)
    return sorted(files)


@pytest.mark.parametrize("name", HOOK_IDS)
def test_hookspec_has_a_test(name: str) -> None:
    word = re.compile(rf"\b{re.escape(name)}\b")
    users = [path for path in _test_files() if word.search(path.read_text(encoding="utf-8", errors="replace"))]
    assert users, (
        f"hookspec {name} has no test: no test file under tests/, plugins/*/tests/ or providers/*/tests/ "
        f"(other than tests/test_docs.py) mentions it"
    )


# --------------------------------------------------------------------------- (d) docs/cli.md covers the CLI


def cli_tree() -> list[tuple[str, click.Command]]:
    """``(full command path, command)`` for every kernel command, walking lazy and nested groups."""
    from scheduler.cli.main import LAZY_COMMANDS, cli, help_cmd

    top: dict[str, click.Command] = {name: getattr(importlib.import_module(module), attr)
                                     for name, (module, attr, _help) in LAZY_COMMANDS.items()}
    top["help"] = help_cmd
    for name, command in cli.commands.items():  # statically attached commands; plugin-added ones are not the kernel's
        callback = command.callback
        if callback is not None and callback.__module__.startswith("scheduler."):
            top.setdefault(name, command)
    out: list[tuple[str, click.Command]] = []

    def walk(command: click.Command, path: str) -> None:
        out.append((path, command))
        if isinstance(command, click.Group):
            for sub_name, sub in sorted(command.commands.items()):
                walk(sub, f"{path} {sub_name}")

    for name in sorted(top):
        walk(top[name], f"scheduler {name}")
    return out


CLI_COMMANDS = cli_tree()


def _option_strings(command: click.Command) -> list[str]:
    return [opt for param in command.params if isinstance(param, click.Option) for opt in (*param.opts, *param.secondary_opts)]


def _mentions(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


@pytest.mark.parametrize(("path", "command"), CLI_COMMANDS, ids=[p for p, _ in CLI_COMMANDS])
def test_cli_command_is_documented(path: str, command: click.Command) -> None:
    body = section(_read(CLI_MD), path)
    assert body is not None, f"docs/cli.md has no heading `{path}`"
    missing = [opt for opt in _option_strings(command) if not _mentions(body, opt)]
    assert not missing, f"the `{path}` section of docs/cli.md does not mention {', '.join(missing)}"


def test_global_options_are_documented() -> None:
    from scheduler.cli.main import cli

    text = _read(CLI_MD)
    body = section(text, "Global options")
    assert body is not None, "docs/cli.md has no `Global options` section"
    missing = [opt for opt in _option_strings(cli) if not _mentions(body, opt)]
    assert not missing, f"Global options section of docs/cli.md does not mention {', '.join(missing)}"
    for needle in ("SCHEDULER_DB", '"ok": true', '"ok": false', '"code"'):
        assert needle in text, f"docs/cli.md does not mention {needle}"


# The error-code registry (scheduler.base.errors.ErrorCode) is checked against docs/cli.md, in both
# directions, by tests/test_api.py.


# --------------------------------------------------------------------------- (e) the README quick start


def _quick_start_commands(readme: str) -> list[str]:
    body = next((b for _level, text, b in sections(readme) if re.search(r"quick\s*-?\s*start", text, re.IGNORECASE)), None)
    assert body is not None, "README.md has no Quick start section"
    blocks = code_blocks(body)
    candidates = [line for block in blocks for line in block.splitlines()] if blocks else re.findall(r"`([^`]+)`", body)
    commands = []
    for line in candidates:
        line = re.sub(r"^\s*\$\s*", "", line).split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def test_readme_quick_start_is_make_run_and_make_test() -> None:
    commands = _quick_start_commands(_read(README))
    assert sorted(commands) == ["make run", "make test"], (
        f"README quick start commands are {commands}, not `make run` and `make test`"
    )


# --------------------------------------------------------------------------- the walkthrough example


def _executor_source_body() -> str:
    """``executor.py`` without its module docstring and ``from __future__`` line."""
    text = EXAMPLE_EXECUTOR.read_text(encoding="utf-8")
    text = re.sub(r'^""".*?"""\s*', "", text, count=1, flags=re.DOTALL)
    text = text.replace("from __future__ import annotations\n", "", 1)
    return text.strip()


def test_ten_line_executor_in_docs_is_the_example_code() -> None:
    blocks = [block.strip() for block in code_blocks(_read(PLUGINS_MD), "python")]
    body = section(_read(PLUGINS_MD), "A ten-line executor")
    assert body is not None, "docs/plugins.md has no `A ten-line executor` section"
    assert _executor_source_body() in blocks, (
        "the executor in docs/plugins.md differs from "
        f"{EXAMPLE_EXECUTOR.relative_to(ROOT)}; copy the file's code (after the docstring) into the docs block"
    )


def test_example_distribution_follows_the_packaging_rules() -> None:
    meta = tomllib.loads((EXAMPLE_DIST / "pyproject.toml").read_text(encoding="utf-8"))
    project = meta["project"]
    assert project["name"] == "scheduler-executor-hello" == EXAMPLE_DIST.name
    assert (EXAMPLE_DIST / "scheduler_executor_hello" / "__init__.py").is_file()
    assert (EXAMPLE_DIST / "README.md").is_file() and (EXAMPLE_DIST / "tests").is_dir()
    entry_points = project["entry-points"]
    assert entry_points["scheduler.executors"] == {"hello": "scheduler_executor_hello:HelloExecutor"}
    assert entry_points["scheduler.hooks"] == {"hello": "scheduler_executor_hello.hooks"}


@pytest.fixture
def hello_executor_class(monkeypatch: pytest.MonkeyPatch) -> type:
    monkeypatch.syspath_prepend(str(EXAMPLE_DIST))
    return importlib.import_module("scheduler_executor_hello.executor").HelloExecutor


def test_example_executor_passes_what_it_claims(hello_executor_class: type) -> None:
    """Capability-free cases pass (the portable behaviours and the POSIX shell ones, written by the stock
    shell payload adapter the example registers); every case that requires a capability is skipped (never passed), and so
    is the empty-settings case (the example needs no host settings)."""
    from scheduler.conformance.engine import load_cases, run_kind
    from scheduler.conformance.payload import PosixShellPayloads
    from scheduler.plugins.loader import check_api

    meta = tomllib.loads((EXAMPLE_DIST / "pyproject.toml").read_text(encoding="utf-8"))
    assert meta["project"]["entry-points"]["scheduler.conformance_adapters"] == {"hello": "scheduler.testing:PosixShellPayloads"}
    provider = hello_executor_class()
    check_api(provider, group="scheduler.executors", name="hello", dist="scheduler-executor-hello")
    report = run_kind("executor", "hello", provider=provider, payload_adapter=PosixShellPayloads)
    assert report.ok, [r.to_json() for r in report.results if r.outcome == "failed"]
    by_id = {result.id: result.outcome for result in report.results}
    for case in load_cases("executor"):
        unconfigured = case.input.get("settings") == "empty"
        assert by_id[case.id] == ("skipped" if case.requires or unconfigured else "passed"), (case.id, by_id[case.id])
    assert report.passed >= 10


def test_example_hook_module_registers_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler.plugins.hooks import Hooks, make_plugin_manager

    monkeypatch.syspath_prepend(str(EXAMPLE_DIST))
    module = importlib.import_module("scheduler_executor_hello.hooks")
    hooks = Hooks(make_plugin_manager([module], load_entry_points=False))  # check_pending: no misspelled hook
    assert hooks.dispatch_veto({"executor": "hello"}, "schedule") is None


# --------------------------------------------------------------------------- documented exit statuses


def test_conformance_run_exits_non_zero_through_the_real_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/cli.md and docs/plugins.md promise a non-zero exit when a conformance run fails."""
    from scheduler.cli.main import main

    code = main(["conformance", "run", "executor", "no-such-driver-for-the-docs-test"])
    out = capsys.readouterr()
    assert "PLUGIN_NOT_FOUND" in out.err and out.out.strip().endswith("failed, 0 skipped"), out
    assert code == 1, (
        f"`scheduler conformance run` of a provider that is not installed exited {code}: "
        "scheduler.cli.main.main ignores the exit code click returns for ctx.exit() in standalone_mode=False"
    )
