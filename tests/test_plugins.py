"""Plugin loading and hooks: discovery, failure policy, switches, API checks, the hook facade,
CLI commands from hook plugins, and hooks called by a real dispatcher.

Fake plugins are real distributions: a ``*.dist-info`` directory with ``entry_points.txt``
and a module beside it, put on ``sys.path`` (in-process) or ``PYTHONPATH`` (subprocess).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import uuid
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import scheduler_cmd

from scheduler import PLUGIN_API_VERSION
from scheduler.base.errors import SchedulerError
from scheduler.plugins.drivers import load_driver
from scheduler.plugins.hooks import Hooks, make_plugin_manager
from scheduler.plugins.hookspecs import hookimpl
from scheduler.plugins.inventory import inventory
from scheduler.plugins.loader import load_provider
from scheduler.plugins.stores import open_store


def make_dist(site: Path, dist: str, entry_points: dict[str, dict[str, str]], modules: dict[str, str], version: str = "0.1") -> Path:
    """Write an installed-looking distribution into ``site``."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(
        "".join(f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in eps.items()) for group, eps in entry_points.items())
    )
    for name, source in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(source))
    return site


FAKE_MODULE = """
    from scheduler import PLUGIN_API_VERSION
    from scheduler.core.execution import ExecutionResult


    class Executor:
        plugin_api = PLUGIN_API_VERSION
        capabilities = frozenset({"cancel"})

        def execute(self, request, control):
            return ExecutionResult(status="ok", exit_code=0)


    class FutureExecutor(Executor):
        plugin_api = PLUGIN_API_VERSION + 1


    class NoExecute:
        plugin_api = PLUGIN_API_VERSION
        capabilities = frozenset()


    class BadCaps(Executor):
        capabilities = ["cancel"]


    class InitFails(Executor):
        def __init__(self):
            raise RuntimeError("needs a licence key")
"""


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Fake executor and channel distributions on ``sys.path`` for this test; returns their driver names."""
    tag = uuid.uuid4().hex[:8]
    site = tmp_path / "site"
    site.mkdir()
    mod = f"fakeplug_{tag}"
    names = {k: f"{k}-{tag}" for k in ("good", "future", "noexec", "badcaps", "initfails", "importfails", "nochannel")}
    make_dist(site, f"scheduler-executor-fake{tag}", {
        "scheduler.executors": {
            names["good"]: f"{mod}:Executor",
            names["future"]: f"{mod}:FutureExecutor",
            names["noexec"]: f"{mod}:NoExecute",
            names["badcaps"]: f"{mod}:BadCaps",
            names["initfails"]: f"{mod}:InitFails",
            names["importfails"]: f"{mod}_broken:Executor",
        },
        "scheduler.channels": {names["nochannel"]: f"{mod}:Executor"},
    }, {
        mod: FAKE_MODULE,
        f"{mod}_broken": "import no_such_dependency_for_the_test\n",
    })
    monkeypatch.syspath_prepend(str(site))
    names["dist"] = f"scheduler-executor-fake{tag}"
    return names


def plugin_code(fn: Any, *args: Any) -> SchedulerError:
    with pytest.raises(SchedulerError) as info:
        fn(*args)
    return info.value


def run_cli(*args: str) -> tuple[int, str, str]:
    from scheduler.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def sub(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, **(env or {})}
    return subprocess.run([*scheduler_cmd(), *args], capture_output=True, text=True, env=full, timeout=60)


# --- discovery and listing ------------------------------------------------------------------------


def test_plugins_list_shows_the_installed_testkit_executor() -> None:
    code, out, _ = run_cli("--json", "plugins", "list")
    assert code == 0
    rows = json.loads(out)["plugins"]
    testkit = next(r for r in rows if r["group"] == "scheduler.executors" and r["name"] == "testkit")
    assert testkit["distribution"] == "scheduler-executor-testkit" and testkit["status"] == "ok"
    assert testkit["plugin_api"] == PLUGIN_API_VERSION and "cancel" in testkit["capabilities"]
    sqlite = next(r for r in rows if r["group"] == "scheduler.stores" and r["name"] == "sqlite")
    assert sqlite["distribution"] == "scheduler-kernel" and sqlite["status"] == "ok"
    code, out, _ = run_cli("--json", "plugins", "list", "--no-load")
    assert {r["status"] for r in json.loads(out)["plugins"]} <= {"not loaded", "disabled"}


def test_failures_are_reported_per_plugin_not_raised(fake_site: dict[str, str]) -> None:
    rows = {r["name"]: r for r in inventory(load=True)}
    assert rows[fake_site["good"]]["status"] == "ok" and rows[fake_site["good"]]["distribution"] == fake_site["dist"]
    broken = rows[fake_site["importfails"]]
    assert broken["status"] == "failed" and broken["distribution"] == fake_site["dist"]
    assert "ModuleNotFoundError" in broken["error"] and "no_such_dependency_for_the_test" in broken["error"]
    future = rows[fake_site["future"]]
    assert future["status"] == "invalid" and "PLUGIN_API_MISMATCH" in future["error"]
    assert rows[fake_site["badcaps"]]["status"] == "invalid" and "PLUGIN_INVALID" in rows[fake_site["badcaps"]]["error"]


def test_strict_mode_turns_a_load_failure_into_an_error(fake_site: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_STRICT_PLUGINS", "1")
    err = plugin_code(inventory, True)
    assert err.code == "PLUGIN_LOAD_FAILED"
    assert any(d["name"] == fake_site["importfails"] for d in err.details)
    code, out, _ = run_cli("--json", "plugins", "list")
    assert code == 1 and json.loads(out)["code"] == "PLUGIN_LOAD_FAILED"


def test_disable_switch_hides_drivers(fake_site: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    good = fake_site["good"]
    assert load_driver("scheduler.executors", good)
    monkeypatch.setenv("SCHEDULER_DISABLE_PLUGINS", f"executors:{good}")
    assert plugin_code(load_driver, "scheduler.executors", good).code == "PLUGIN_NOT_FOUND"
    rows = {r["name"]: r for r in inventory(load=True)}
    assert rows[good]["status"] == "disabled" and rows[fake_site["future"]]["status"] == "invalid"
    monkeypatch.setenv("SCHEDULER_DISABLE_PLUGINS", "executors:*")
    assert {r["status"] for r in inventory(load=True) if r["group"] == "scheduler.executors"} == {"disabled"}
    assert plugin_code(load_provider, "executor", "testkit").code == "PLUGIN_NOT_FOUND"
    monkeypatch.setenv("SCHEDULER_DISABLE_PLUGINS", "all")
    assert {r["status"] for r in inventory(load=True)} == {"disabled"}
    # disabled failures are not failures: strict mode has nothing to complain about
    monkeypatch.setenv("SCHEDULER_STRICT_PLUGINS", "1")
    inventory(load=True)


def test_broken_plugin_is_reported_by_a_real_process_and_never_breaks_jobs_list(tmp_path: Path) -> None:
    site = make_dist(tmp_path / "site", "scheduler-channel-kaputt", {"scheduler.channels": {"kaputt": "kaputt_channel:Channel"}},
                     {"kaputt_channel": "raise ImportError('libkaputt.so: cannot open shared object file')\n"})
    env = {"PYTHONPATH": str(site), "SCHEDULER_DISABLE_PLUGINS": "", "SCHEDULER_STRICT_PLUGINS": ""}
    res = sub("--json", "plugins", "list", env=env)
    assert res.returncode == 0 and "Traceback" not in res.stderr
    row = next(r for r in json.loads(res.stdout)["plugins"] if r["name"] == "kaputt")
    assert (row["group"], row["distribution"], row["status"]) == ("scheduler.channels", "scheduler-channel-kaputt", "failed")
    assert "libkaputt.so" in row["error"]
    human = sub("plugins", "list", env=env)
    assert human.returncode == 0 and "kaputt" in human.stdout and "scheduler-channel-kaputt" in human.stdout
    db = str(tmp_path / "s.db")
    open_store(db).close()  # read commands never create a database (issue 30): it exists first
    res = sub("--db", db, "--json", "jobs", "list", env=env)
    assert res.returncode == 0 and json.loads(res.stdout) == {"ok": True, "jobs": []}
    res = sub("--db", db, "--json", "plugins", "list", env={**env, "SCHEDULER_STRICT_PLUGINS": "1"})
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and doc["code"] == "PLUGIN_LOAD_FAILED"
    assert [(d["name"], d["distribution"]) for d in doc["details"] if d["name"] == "kaputt"] == [("kaputt", "scheduler-channel-kaputt")]


# --- loading a configured driver ---------------------------------------------------------------------


def test_load_provider_returns_a_checked_instance(fake_site: dict[str, str]) -> None:
    from scheduler.plugins.protocols import Executor

    provider = load_provider("executor", fake_site["good"])
    assert isinstance(provider, Executor) and provider.plugin_api == PLUGIN_API_VERSION
    testkit = load_provider("executor", "testkit")
    assert type(testkit).__name__ == "TestkitExecutor"


def test_load_provider_refuses_another_api_major(fake_site: dict[str, str]) -> None:
    err = plugin_code(load_provider, "executor", fake_site["future"])
    assert err.code == "PLUGIN_API_MISMATCH"
    assert fake_site["dist"] in err.message and str(PLUGIN_API_VERSION + 1) in err.message


def test_load_provider_refuses_missing_protocol_methods(fake_site: dict[str, str]) -> None:
    err = plugin_code(load_provider, "executor", fake_site["noexec"])
    assert err.code == "PLUGIN_INVALID" and "execute" in err.message and fake_site["dist"] in err.message
    err = plugin_code(load_provider, "channel", fake_site["nochannel"])  # an executor registered as a channel
    from scheduler.plugins.protocols import Channel

    required = [m for m in dir(Channel) if not m.startswith("_") and callable(getattr(Channel, m))]
    assert err.code == "PLUGIN_INVALID" and "Channel protocol" in err.message and all(m in err.message for m in required)


def test_load_provider_refuses_bad_capabilities(fake_site: dict[str, str]) -> None:
    assert plugin_code(load_provider, "executor", fake_site["badcaps"]).code == "PLUGIN_INVALID"


def test_configured_driver_failures_name_the_distribution(fake_site: dict[str, str]) -> None:
    err = plugin_code(load_provider, "executor", fake_site["importfails"])
    assert err.code == "PLUGIN_LOAD_FAILED" and fake_site["dist"] in err.message and "no_such_dependency_for_the_test" in err.message
    err = plugin_code(load_provider, "executor", fake_site["initfails"])
    assert err.code == "PLUGIN_LOAD_FAILED" and fake_site["dist"] in err.message and "licence key" in err.message
    assert plugin_code(load_provider, "executor", "no-such-driver").code == "PLUGIN_NOT_FOUND"


def test_driver_installed_after_the_group_was_first_read_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: stevedore caches a group's entry points per process, so a driver installed while a
    dispatcher ran was listed by importlib.metadata yet failed PLUGIN_LOAD_FAILED "NoMatches"."""
    load_driver("scheduler.executors", "testkit")  # the group is now cached in this process
    tag = uuid.uuid4().hex[:8]
    site = make_dist(tmp_path / "site", f"scheduler-executor-late{tag}", {"scheduler.executors": {f"late-{tag}": f"late_{tag}:Executor"}},
                     {f"late_{tag}": FAKE_MODULE})
    monkeypatch.syspath_prepend(str(site))
    assert load_driver("scheduler.executors", f"late-{tag}").__name__ == "Executor"
    assert load_provider("executor", "testkit")


def test_only_the_named_driver_is_imported(fake_site: dict[str, str]) -> None:
    mod = f"fakeplug_{fake_site['good'].split('-')[1]}"
    assert mod not in sys.modules
    load_driver("scheduler.executors", "testkit")
    assert mod not in sys.modules
    load_driver("scheduler.executors", fake_site["good"])
    assert mod in sys.modules and f"{mod}_broken" not in sys.modules


# --- hooks ----------------------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    @hookimpl
    def scheduler_run_state_changed(self, run_id: str, job_id: str, old_status: str | None, new_status: str, at_ms: int) -> None:
        self.calls.append(("state", (run_id, job_id, old_status, new_status, at_ms)))

    @hookimpl
    def scheduler_run_completed(self, run: dict[str, Any]) -> None:
        self.calls.append(("completed", run))


def test_make_plugin_manager_registers_entry_point_hook_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = uuid.uuid4().hex[:8]
    site = make_dist(tmp_path / "site", f"scheduler-hooks-audit{tag}", {"scheduler.hooks": {f"audit{tag}": f"audit_hooks_{tag}"}}, {
        f"audit_hooks_{tag}": """
            from scheduler.plugins.hookspecs import hookimpl
            SEEN = []

            @hookimpl
            def scheduler_run_state_changed(run_id, job_id, old_status, new_status, at_ms):
                SEEN.append((run_id, new_status))

            @hookimpl
            def scheduler_config_defaults():
                return {"audit.enabled": True}
        """})
    monkeypatch.syspath_prepend(str(site))
    pm = make_plugin_manager()
    module = pm.get_plugin(f"entrypoint:audit{tag}")
    assert module is not None and module.__name__ == f"audit_hooks_{tag}"
    hooks = Hooks(pm)
    hooks.run_state_changed("r1", "j1", "running", "ok", 5)
    assert module.SEEN == [("r1", "ok")]
    assert hooks.config_defaults()["audit.enabled"] is True
    monkeypatch.setenv("SCHEDULER_DISABLE_PLUGINS", f"hooks:audit{tag}")
    assert make_plugin_manager().get_plugin(f"entrypoint:audit{tag}") is None


def test_failing_hook_module_is_recorded_unless_strict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = uuid.uuid4().hex[:8]
    site = make_dist(tmp_path / "site", f"scheduler-hooks-bad{tag}", {"scheduler.hooks": {f"bad{tag}": f"bad_hooks_{tag}"}},
                     {f"bad_hooks_{tag}": "raise RuntimeError('hook module exploded')\n"})
    monkeypatch.syspath_prepend(str(site))
    pm = make_plugin_manager()
    assert pm.get_plugin(f"entrypoint:bad{tag}") is None
    monkeypatch.setenv("SCHEDULER_STRICT_PLUGINS", "1")
    err = plugin_code(make_plugin_manager)
    assert err.code == "PLUGIN_LOAD_FAILED" and f"scheduler-hooks-bad{tag}" in err.message


def test_hook_manager_is_not_built_at_import_time() -> None:
    code = ("import sys, scheduler.plugins.hooks, scheduler.cli.main, scheduler.core.dispatcher;"
            "print(sorted(m for m in sys.modules if m.startswith('scheduler_')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"  # no plugin module imported just by importing the kernel


def test_dispatch_veto_is_firstresult() -> None:
    calls: list[str] = []

    class Allow:
        @hookimpl
        def scheduler_dispatch_veto(self, job: dict[str, Any], dispatch_kind: str) -> str | None:
            calls.append("allow")
            return None

    class Deny:
        @hookimpl
        def scheduler_dispatch_veto(self, job: dict[str, Any], dispatch_kind: str) -> str | None:
            calls.append("deny")
            return f"maintenance window ({dispatch_kind})"

    class Later:
        @hookimpl(trylast=True)
        def scheduler_dispatch_veto(self, job: dict[str, Any], dispatch_kind: str) -> str | None:
            calls.append("later")
            return "never asked"

    assert Hooks(make_plugin_manager(load_entry_points=False)).dispatch_veto({"id": "j"}, "schedule") is None
    hooks = Hooks(make_plugin_manager([Later(), Allow(), Deny()], load_entry_points=False))
    assert hooks.dispatch_veto({"id": "j"}, "manual") == "maintenance window (manual)"
    assert "later" not in calls  # the first answer ends the call
    calls.clear()
    hooks = Hooks(make_plugin_manager([Deny(), Allow()], load_entry_points=False))
    assert hooks.dispatch_veto({"id": "j"}, "schedule") == "maintenance window (schedule)"
    assert calls == ["allow", "deny"]


def test_dispatch_veto_fails_closed() -> None:
    class Broken:
        @hookimpl
        def scheduler_dispatch_veto(self, job: dict[str, Any], dispatch_kind: str) -> str | None:
            raise KeyError("policy store offline")

    reason = Hooks(make_plugin_manager([Broken()], load_entry_points=False)).dispatch_veto({"id": "j"}, "schedule")
    assert reason and "KeyError" in reason


def test_observer_hooks_never_raise() -> None:
    class Broken:
        @hookimpl
        def scheduler_run_state_changed(self, **kw: Any) -> None:
            raise RuntimeError("metrics down")

        @hookimpl
        def scheduler_run_completed(self, run: dict[str, Any]) -> None:
            raise RuntimeError("metrics down")

    hooks = Hooks(make_plugin_manager([Broken()], load_entry_points=False))
    hooks.run_state_changed("r", "j", "running", "ok", 1)
    hooks.run_completed({"id": "r"})


def test_config_defaults_merge_earlier_registrations_win() -> None:
    class First:
        @hookimpl
        def scheduler_config_defaults(self) -> dict[str, Any]:
            return {"shared": "first", "a": 1}

    class Second:
        @hookimpl
        def scheduler_config_defaults(self) -> dict[str, Any]:
            return {"shared": "second", "b": 2}

    class Nothing:
        @hookimpl
        def scheduler_config_defaults(self) -> Any:
            return None

    merged = Hooks(make_plugin_manager([First(), Second(), Nothing()], load_entry_points=False)).config_defaults()
    assert merged == {"shared": "first", "a": 1, "b": 2}


def test_register_commands_hook_adds_a_cli_command(tmp_path: Path) -> None:
    site = make_dist(tmp_path / "site", "scheduler-hooks-hello", {"scheduler.hooks": {"hello": "hello_hooks"}}, {
        "hello_hooks": """
            import click
            from scheduler.plugins.hookspecs import hookimpl

            @hookimpl
            def scheduler_register_commands(cli):
                @cli.command("hello")
                @click.argument("who", default="world")
                def hello(who):
                    \"\"\"Say hello.\"\"\"
                    from scheduler.cli.output import emit
                    emit({"greeting": f"hello {who}"}, lambda: click.echo(f"hello {who}"))
        """})
    env = {"PYTHONPATH": str(site), "SCHEDULER_DISABLE_PLUGINS": ""}
    res = sub("hello", "plugins", env=env)
    assert res.returncode == 0 and res.stdout == "hello plugins\n", res.stderr
    res = sub("--json", "hello", env=env)
    assert json.loads(res.stdout) == {"ok": True, "greeting": "hello world"}
    res = sub("--json", "hello", env={**env, "SCHEDULER_DISABLE_PLUGINS": "hooks:hello"})
    assert res.returncode == 2 and json.loads(res.stdout)["code"] == "INVALID_ARGUMENT"
    # ... and the hook module costs nothing on the common paths.
    res = subprocess.run([*scheduler_cmd()[:1], "-X", "importtime", *scheduler_cmd()[1:], "version"], capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=60)
    assert res.returncode == 0
    imported = {ln.rsplit("|", 1)[1].strip() for ln in res.stderr.splitlines() if ln.startswith("import time:")}
    assert "scheduler.cli.main" in imported and "hello_hooks" not in imported and "pluggy" not in imported


def test_dispatcher_calls_state_and_completion_hooks(db_path: Path) -> None:
    from scheduler.core.dispatcher import DispatcherConfig
    from scheduler.core.jobs import create_jobs
    from scheduler.core.queue import enqueue_manual
    from scheduler.core.spec import validate_spec
    from scheduler.plugins.stores import open_store
    from scheduler.runtime import dispatcher as Dispatcher

    store = open_store(db_path)
    job = create_jobs(store, [validate_spec({"name": "hooked", "schedule_kind": "manual", "executor": "testkit",
                                             "payload_message": "echo:hi"})])[0]
    enqueue_manual(store, "hooked")
    recorder = Recorder()
    dispatcher = Dispatcher(store, DispatcherConfig(lease_ttl_ms=2000), hooks=Hooks(make_plugin_manager(extra=[recorder])))
    assert dispatcher.run(duration_s=1.5) == 0
    with store.read() as tx:
        run = tx.one("SELECT * FROM runs WHERE job_id = ?", (job.id,))
    store.close()
    assert run is not None and run["status"] == "ok"
    states = [args for kind, args in recorder.calls if kind == "state"]
    assert [(s[0], s[1], s[2], s[3]) for s in states] == [(run["id"], job.id, None, "running"),
                                                          (run["id"], job.id, "running", "ok")]
    assert states[0][4] == run["started_at"] and states[1][4] == run["finished_at"]
    completed = [args for kind, args in recorder.calls if kind == "completed"]
    assert len(completed) == 1
    assert completed[0]["id"] == run["id"] and completed[0]["status"] == "ok" and completed[0]["job_id"] == job.id
    assert "hi" in (completed[0]["stdout_excerpt"] or completed[0]["summary"] or "")
    assert [k for k, _ in recorder.calls] == ["state", "state", "completed"]


def test_one_failing_observer_does_not_silence_the_others() -> None:
    seen: list[str] = []

    class Broken:
        @hookimpl
        def scheduler_run_completed(self, run: dict[str, Any]) -> None:
            raise RuntimeError("metrics down")

    class Listener:
        @hookimpl
        def scheduler_run_completed(self, run: dict[str, Any]) -> None:
            seen.append(run["id"])

    # registration order decides call order (last registered first): put the broken one first in line
    hooks = Hooks(make_plugin_manager([Listener(), Broken()], load_entry_points=False))
    hooks.run_completed({"id": "r1"})
    assert seen == ["r1"]


def test_hook_module_with_an_unknown_hook_is_rejected_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = make_dist(tmp_path / "site", "scheduler-hooks-typo", {"scheduler.hooks": {"typo": "typo_hooks", "fine": "fine_hooks"}}, {
        "typo_hooks": """
            from scheduler.plugins.hookspecs import hookimpl

            @hookimpl
            def scheduler_run_state_chnaged(run_id, job_id, old_status, new_status, at_ms):
                pass
        """,
        "fine_hooks": """
            from scheduler.plugins.hookspecs import hookimpl

            @hookimpl
            def scheduler_config_defaults():
                return {"fine.greeting": "hi", "db": "/tmp/hijacked.db"}
        """})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("SCHEDULER_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("SCHEDULER_STRICT_PLUGINS", raising=False)
    pm = make_plugin_manager()
    names = {pm.get_name(p) for p in pm.get_plugins()}
    assert "entrypoint:fine" in names and "entrypoint:typo" not in names
    # the good module still contributes configuration, and cannot override a kernel key
    res = sub("--json", "--db", str(tmp_path / "x.db"), "config", env={"PYTHONPATH": str(site), "SCHEDULER_DISABLE_PLUGINS": ""})
    out = json.loads(res.stdout)
    assert res.returncode == 0 and out["config"]["fine.greeting"] == "hi" and out["sources"]["fine.greeting"] == "plugin"
    assert out["config"]["db"] == str(tmp_path / "x.db") and out["sources"]["db"] != "plugin"  # the --db option, not the hook
    assert not (tmp_path / "x.db").exists()  # config never opens the database
    monkeypatch.setenv("SCHEDULER_STRICT_PLUGINS", "1")
    with pytest.raises(SchedulerError) as info:
        make_plugin_manager()
    assert info.value.code == "PLUGIN_LOAD_FAILED" and "typo" in info.value.message


# --- hook modules that did not load are reported (issue 8) ------------------------------------------------------------


BROKEN_HOOKS = {
    "typo": """
        from scheduler.plugins.hookspecs import hookimpl

        @hookimpl
        def scheduler_run_state_chnaged(run_id, job_id, old_status, new_status, at_ms):
            pass
    """,
    "boom": "raise ImportError('libaudit.so: cannot open shared object file')\n",
    "fine": """
        from scheduler.plugins.hookspecs import hookimpl

        @hookimpl
        def scheduler_config_defaults():
            return {"fine.loaded": True}
    """,
}
#: Every provider group off, so doctor's verdict depends on the hook modules alone.
NO_PROVIDERS = "executors:*,channels:*,evidence_providers:*,credential_providers:*,authorization_providers:*"


def sideload_hooks(tmp_path: Path) -> tuple[dict[str, str], str]:
    """A hook distribution with a misspelled hook, a module that fails to import and a good one, side-loaded
    like the broken executors (``kernel_testing.sideload_distribution``); returns the child environment and the tag."""
    from kernel_testing import sideload_distribution

    tag = uuid.uuid4().hex[:8]
    project = tmp_path / f"scheduler-hooks-broken{tag}"
    package = project / f"broken_hooks_{tag}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, source in BROKEN_HOOKS.items():
        (package / f"{name}.py").write_text(textwrap.dedent(source))
    entry_points = "".join(f'{name}{tag} = "broken_hooks_{tag}.{name}"\n' for name in BROKEN_HOOKS)
    (project / "pyproject.toml").write_text(
        f'[project]\nname = "scheduler-hooks-broken{tag}"\nversion = "0.1.0"\n\n[project.entry-points."scheduler.hooks"]\n{entry_points}'
    )
    paths = sideload_distribution(project, tmp_path / "site")
    return {"PYTHONPATH": os.pathsep.join(paths), "SCHEDULER_DISABLE_PLUGINS": NO_PROVIDERS, "SCHEDULER_STRICT_PLUGINS": ""}, tag


def test_plugins_list_shows_a_misspelled_or_failing_hook_module_and_doctor_fails(tmp_path: Path) -> None:
    env, tag = sideload_hooks(tmp_path)
    res = sub("--json", "plugins", "list", env=env)
    assert res.returncode == 0 and "Traceback" not in res.stderr  # shown, never fatal
    rows = {r["name"]: r for r in json.loads(res.stdout)["plugins"] if r["group"] == "scheduler.hooks"}
    typo, boom, fine = rows[f"typo{tag}"], rows[f"boom{tag}"], rows[f"fine{tag}"]
    assert typo["status"] == "invalid" and "scheduler_run_state_chnaged" in typo["error"]
    assert typo["distribution"] == f"scheduler-hooks-broken{tag}"
    assert boom["status"] == "failed" and "libaudit.so" in boom["error"]
    assert fine["status"] == "ok" and fine["error"] is None
    human = sub("plugins", "list", env=env)
    assert human.returncode == 0 and "invalid" in human.stdout and "scheduler_run_state_chnaged" in human.stdout

    db = str(tmp_path / "s.db")
    open_store(db).close()  # doctor never creates a database (issue 30): it exists first
    healthy = sub("--db", db, "--json", "doctor", env={k: v for k, v in env.items() if k != "PYTHONPATH"})
    assert healthy.returncode == 0, healthy.stdout  # the same host without the broken hook modules
    res = sub("--db", db, "--json", "doctor", env=env)
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and doc["code"] == "UNHEALTHY"
    plugins = next(c for c in doc["details"] if c["check"] == "plugins")
    assert plugins["ok"] is False
    assert f"typo{tag}" in plugins["detail"] and "scheduler_run_state_chnaged" in plugins["detail"]
    assert f"boom{tag}" in plugins["detail"] and "libaudit.so" in plugins["detail"] and f"fine{tag}" not in plugins["detail"]
    human = sub("--db", db, "doctor", env=env)
    assert human.returncode == 1 and "FAIL" in human.stdout and f"typo{tag}" in human.stdout

    strict = sub("--json", "plugins", "list", env={**env, "SCHEDULER_STRICT_PLUGINS": "1"})
    doc = json.loads(strict.stdout)
    assert strict.returncode == 1 and doc["code"] == "PLUGIN_LOAD_FAILED"
    assert {d["name"] for d in doc["details"]} == {f"typo{tag}", f"boom{tag}"}


def test_make_plugin_manager_reports_the_hook_modules_it_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env, tag = sideload_hooks(tmp_path)
    for entry in reversed(env["PYTHONPATH"].split(os.pathsep)):
        monkeypatch.syspath_prepend(entry)
    monkeypatch.delenv("SCHEDULER_STRICT_PLUGINS", raising=False)
    failures: list[Any] = []
    pm = make_plugin_manager(failures=failures)
    assert {(f.name, f.status) for f in failures} == {(f"typo{tag}", "invalid"), (f"boom{tag}", "failed")}
    assert all(f.distribution == f"scheduler-hooks-broken{tag}" for f in failures)
    names = {pm.get_name(p) for p in pm.get_plugins()}
    assert f"entrypoint:fine{tag}" in names and f"entrypoint:typo{tag}" not in names and f"entrypoint:boom{tag}" not in names
    assert Hooks(pm).config_defaults()["fine.loaded"] is True  # the others keep working


# --- the loader uses stevedore's public API only (issue 8) ------------------------------------------------------------


def test_loader_touches_no_private_stevedore_attribute() -> None:
    """Regression: the loader popped ``DriverManager.ENTRY_POINT_CACHE`` to see drivers installed after start-up."""
    import ast

    from stevedore import ExtensionManager

    import scheduler.plugins.drivers as drivers
    import scheduler.plugins.loader as loader

    trees = [ast.parse(Path(module.__file__).read_text()) for module in (drivers, loader)]
    attributes = {n.attr for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    modules = {n.module for tree in trees for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "ENTRY_POINT_CACHE" not in attributes
    assert not any(m and m.startswith("stevedore.") and m.split(".")[1].startswith("_") for m in modules)
    load_driver("scheduler.executors", "testkit")
    inventory(load=True)
    assert "scheduler.executors" not in ExtensionManager.ENTRY_POINT_CACHE  # stevedore's own cache is never filled
