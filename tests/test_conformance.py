"""Tests for the conformance engine, its fixtures, payload and service adapters, CLI, CI runner and pytest adapter.

Real parts throughout: the fixtures on disk, entry-point loading of the test-only
``scheduler-executor-broken`` and ``scheduler-channel-broken`` distributions (side-loaded
from ``tests/support/``), real subprocesses and process groups in the honest reference
executor below, real loopback HTTP servers behind the honest reference channel, and real
``python -m`` / ``pytest`` child processes.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
from click.testing import CliRunner

from scheduler import PLUGIN_API_VERSION
from scheduler.base.errors import SchedulerError
from scheduler.conformance import ci
from scheduler.conformance.channel import fill_body
from scheduler.conformance.cli import conformance_group, result_line
from scheduler.conformance.engine import (
    FIXTURES_ENV,
    Case,
    extra_fixture_dirs,
    fixtures_root,
    load_cases,
    load_corpus,
    load_schema,
    run_case,
    run_kind,
)
from scheduler.conformance.payload import ACTIONS, Behaviour, PosixShellPayloads, Step
from scheduler.conformance.pytest_plugin import ChannelConformance
from scheduler.conformance.service import (
    ANSWERS,
    HttpRequest,
    HttpStandIn,
    ReceivedFile,
    ReceivedMessage,
    ServiceAnswer,
    ServiceRequest,
)
from scheduler.core.execution import ExecutionResult, StreamCapture
from scheduler.core.processes import group_alive, kill_group, process_identity
from scheduler.plugins.protocols import ChannelLimits, DeliveryReceipt, PermanentDeliveryError, TransientDeliveryError
from scheduler.settings import SecretRef

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "conformance-fixtures"
V2 = FIXTURES / "v2"
SUMMARY_RE = re.compile(r"^\d+ passed, \d+ failed, \d+ skipped$")
ALL_CAPS = frozenset({"structured-output", "verify", "env-policy", "cancel", "timeout", "process-group", "stdin"})


def _fixture_files() -> list[Path]:
    return sorted([*V2.glob("*/*.json"), *V2.glob("*/*/*.json")])


_SIDELOADED: list[str] = []


@pytest.fixture(scope="module")
def broken_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The broken test distributions (executors and channels), visible to entry-point discovery for this module only.

    They are side-loaded (a dist-info on sys.path), never installed, so a user's
    environment never carries deliberately broken plugins.
    """
    from kernel_testing import sideloaded

    dists = [REPO / "tests" / "support" / dist for dist in ("scheduler-executor-broken", "scheduler-channel-broken")]
    with sideloaded(*dists, into=tmp_path_factory.mktemp("sideload")) as paths:
        _SIDELOADED[:] = paths
        names = {ep.name for ep in entry_points(group="scheduler.executors")}
        assert {"broken", "broken-import", "broken-api"} <= names
        assert {"broken", "broken-unadapted"} <= {ep.name for ep in entry_points(group="scheduler.channels")}
        yield
        _SIDELOADED.clear()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*_SIDELOADED, str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.pop(FIXTURES_ENV, None)
    return env


# --------------------------------------------------------------------------- an honest reference executor


@attrs.frozen(kw_only=True)
class RefOptions:
    """The reference executor's per-job options (what its payload adapter maps stdin and env policy to)."""

    stdin_text: str | None = None
    env_policy: str = "minimal"


class ReferencePayloads(PosixShellPayloads):
    """The stock POSIX shell adapter, with the reference executor's two options."""

    stdin_option = "stdin_text"
    env_policy_option = "env_policy"


class ReferenceExecutor:
    """A small but honest POSIX shell executor used to show the runner can report success.

    It runs ``/bin/sh -c`` in its own process group, records the process handle (right
    after the spawn: it has no gate, unlike the shell plugin), streams output through
    the kernel's ``StreamRecorder``, honours the deadline and cancellation (stopping the
    group with ``kill_group`` and recording it), stops leftover children, parses
    json/ndjson and runs the verification check.
    """

    plugin_api = PLUGIN_API_VERSION
    options_class = RefOptions

    def __init__(self, capabilities: frozenset[str] = ALL_CAPS) -> None:
        self.capabilities = capabilities

    def _env(self, request: Any) -> dict[str, str]:
        if request.options.env_policy == "inherit":
            env = dict(os.environ)
        else:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
        env.update(request.extra_env)
        return env

    def _run(self, command: str, request: Any, control: Any, *, deadline_ms: int, prefix: str, stdin: str | None):
        from scheduler.core.outputs import StreamRecorder

        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env(request),
            start_new_session=True,
        )
        control.record_handle(
            {"pid": proc.pid, "pgid": proc.pid, "start_time": process_identity(proc.pid) or "", "host": socket.gethostname()}
        )
        recorders = {
            name: StreamRecorder(root=request.artifacts_root, directory=request.artifacts_dir, name=f"{prefix}{name}")
            for name in ("stdout", "stderr")
        }

        def pump(stream: Any, recorder: Any) -> None:
            for chunk in iter(lambda: stream.read(65536), b""):
                recorder.write(chunk)

        threads = [
            threading.Thread(target=pump, args=(proc.stdout, recorders["stdout"]), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, recorders["stderr"]), daemon=True),
        ]
        for t in threads:
            t.start()
        if stdin is not None:
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        stopped = None
        while proc.poll() is None:
            if control.is_cancelled():
                stopped = "cancelled"
            elif time.time() * 1000 >= deadline_ms:
                stopped = "timeout"
            if stopped:
                control.record_termination(kill_group(proc.pid, 0.5, reap=proc.poll))
                break
            control.wait_cancelled(0.01)
        proc.wait()
        if group_alive(proc.pid):
            kill_group(proc.pid, 0)
        for t in threads:
            t.join()
        return stopped, proc.returncode, recorders["stdout"].finish(), recorders["stderr"].finish()

    @staticmethod
    def _structured(fmt: str, data: bytes) -> dict[str, Any] | None:
        if fmt == "text":
            return None
        record: dict[str, Any] = {"format": fmt, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        try:
            text = data.decode("utf-8")
            if fmt == "json":
                parsed: Any = json.loads(text)
            else:
                parsed = [json.loads(line) for line in text.splitlines() if line.strip()]
            record.update(valid=True, parsed=parsed, warning=None)
        except ValueError as exc:
            record.update(valid=False, warning=str(exc))
        return record

    def execute(self, request: Any, control: Any) -> ExecutionResult:
        from scheduler.core.outputs import read_artifact

        job = request.job
        stopped, code, out, err = self._run(
            job.payload_message, request, control, deadline_ms=request.deadline_ms, prefix="", stdin=request.options.stdin_text
        )
        common = {"exit_code": code, "stdout": out, "stderr": err, "summary": out.excerpt}
        if stopped == "cancelled":
            return ExecutionResult(status="cancelled", **common)
        if stopped == "timeout":
            return ExecutionResult(status="timeout", error_code="RUN_TIMEOUT", error_message="run timed out", **common)
        if code != 0:
            return ExecutionResult(status="error", error_code="EXIT_NONZERO", error_message=f"exit {code}", **common)
        data = read_artifact(request.artifacts_root, out.artifact, out.sha256) if out.artifact else out.excerpt.encode()
        structured = self._structured(job.output_format, data)
        if not job.verify_shell:
            return ExecutionResult(status="ok", structured=structured, **common)
        vstopped, vcode, vout, _verr = self._run(
            job.verify_shell,
            request,
            control,
            deadline_ms=int(time.time() * 1000) + job.verify_timeout_s * 1000,
            prefix="verify-",
            stdin=None,
        )
        vstatus = {"timeout": "timeout", "cancelled": "cancelled"}.get(vstopped or "", "passed" if vcode == 0 else "failed")
        verification = {"status": vstatus, "exit_code": vcode, "stdout_bytes": vout.bytes, "stdout_sha256": vout.sha256}
        if vstatus == "passed" or job.verify_on_failure == "warn":
            return ExecutionResult(status="ok", structured=structured, verification=verification, **common)
        error_code = "VERIFY_TIMEOUT" if vstatus == "timeout" else "VERIFY_FAILED"
        return ExecutionResult(status="error", error_code=error_code, structured=structured, verification=verification, **common)


def _reference_report(**kwargs: Any) -> Any:
    kwargs.setdefault("payload_adapter", ReferencePayloads())
    return run_kind("executor", "reference", kwargs.pop("provider", None) or ReferenceExecutor(), **kwargs)


# --------------------------------------------------------------------------- fixtures and schema


def test_schema_is_valid_draft_2020_12() -> None:
    from jsonschema import Draft202012Validator

    schema = load_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert "v2" in schema["$id"]


@pytest.mark.parametrize("path", _fixture_files(), ids=lambda p: str(p.relative_to(V2)))
def test_every_fixture_file_validates_against_the_schema(path: Path) -> None:
    from jsonschema import Draft202012Validator

    data = json.loads(path.read_text())
    errors = list(Draft202012Validator(load_schema()).iter_errors(data))
    assert errors == [], [e.message for e in errors]
    assert data["kind"] in (path.parent.name, path.parent.parent.name)
    assert all(case["kind"] == data["kind"] for case in data["cases"])
    assert (path.parent / data["$schema"]).resolve() == V2 / "case.schema.json"  # editors find the schema


def test_only_the_v2_format_is_shipped() -> None:
    """v1 executor cases (shell payloads with flat executor fields) are retired: their jobs no longer validate under plugin
    API 2. What remains under v1 is the handoff v4 conformance fixture (format version 1), which is not a case corpus.
    Every kind's cases are v2 (channel cases too, though issue 16 named ``v1/channel/``)."""
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == ["v1", "v2"]
    assert sorted(p.name for p in (FIXTURES / "v1").iterdir()) == ["handoff"]
    assert sorted(p.name for p in V2.iterdir() if p.is_dir()) == ["authorization", "channel", "credential", "evidence", "executor", "proof_verifier"]


def test_case_ids_are_unique_across_the_corpus() -> None:
    ids = [case["id"] for path in _fixture_files() for case in json.loads(path.read_text())["cases"]]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert len(load_corpus()) == len(ids)
    assert all(c.id.startswith(f"{c.kind}.") for c in load_corpus())  # kind names are singular, ids start with the kind


def test_the_schema_steps_are_the_engine_actions() -> None:
    """Every behaviour step the schema allows is one the payload adapters know, and the other way round."""
    assert set(load_schema()["$defs"]["step"]["properties"]) == set(ACTIONS)


def test_portable_cases_describe_behaviours_and_shell_cases_live_apart() -> None:
    cases = load_cases("executor")
    portable = [c for c in cases if "behaviour" in c.input]
    raw = [c for c in cases if "payload" in c.input]
    assert len(portable) + len(raw) == len(cases) and len(portable) >= 20
    assert all(c.source.startswith("v2/executor/posix-shell/") and c.id.startswith("executor.posix-shell.") for c in raw)
    assert all(c.source.count("/") == 2 for c in portable)
    for case in portable:  # no shell hides in a portable case's job either
        assert not {"payload_message", "executor", "executor_options"} & set(case.input.get("job", {}))
    assert [c.id for c in cases][-len(raw):] == [c.id for c in raw]  # the shell-only cases come last


def test_executor_corpus_covers_the_required_cases() -> None:
    cases = {c.id: c for c in load_cases("executor")}
    negatives = {c.id: c.expect.get("error_code") for c in cases.values() if c.polarity == "negative"}
    assert negatives == {
        "executor.unconfigured-refused": None,  # an unconfigured executor's code is its own (any, but one)
        "executor.exit-nonzero": "EXIT_NONZERO",
        "executor.run-timeout": "RUN_TIMEOUT",
        "executor.timeout-sigterm-ignored": "RUN_TIMEOUT",
        "executor.timeout-stops-child-processes": "RUN_TIMEOUT",
        "executor.verify-fail-error": "VERIFY_FAILED",
        "executor.verify-timeout": "VERIFY_TIMEOUT",
        "executor.posix-shell.subshell-exit-status": "EXIT_NONZERO",
        "executor.posix-shell.killed-by-signal": "EXIT_NONZERO",
    }
    assert cases["executor.cancel-running"].input["cancel_after_ms"] == 200
    assert cases["executor.run-timeout"].input["job"]["run_timeout_ms"] == 300
    assert cases["executor.timeout-sigterm-ignored"].input["behaviour"][0] == {"ignore_sigterm": True}
    huge = cases["executor.huge-output-offloaded"].expect
    assert huge["stdout_bytes"] == 5_000_000 and huge["artifact_offloaded"] is True
    assert huge["stdout_sha256"] == hashlib.sha256(bytes(5_000_000)).hexdigest()
    assert cases["executor.binary-output"].expect["stdout_sha256"] == hashlib.sha256(b"\x00\x01\xff").hexdigest()
    assert cases["executor.exit-zero-stdout"].expect["stdout_sha256"] == hashlib.sha256(b"conformance-hello\n").hexdigest()
    requires = {c.id: set(c.requires) for c in cases.values()}
    assert requires["executor.structured-json-valid"] == {"structured-output"}
    assert requires["executor.verify-timeout"] == {"verify"}
    assert requires["executor.env-minimal-hides-secret"] == {"env-policy"}
    assert requires["executor.stdin-text"] == {"stdin"}
    assert requires["executor.cancel-running"] == {"cancel"}
    assert requires["executor.run-timeout"] == {"timeout"}
    assert requires["executor.process-handle-recorded"] == {"process-group"}
    assert requires["executor.cancel-stops-child-processes"] == {"cancel", "process-group"}
    no_capability = sorted(i for i, r in requires.items() if not r and not i.startswith("executor.posix-shell."))
    assert len(no_capability) >= 6, no_capability  # what every executor, even a capability-less one, is held to


def _copy_corpus(tmp_path: Path) -> Path:
    root = tmp_path / "conformance-fixtures"
    shutil.copytree(FIXTURES, root)
    return root


def _mutate(root: Path, filename: str, change: Any) -> None:
    path = root / "v2" / "executor" / filename
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _case(data: dict[str, Any], case_id: str) -> dict[str, Any]:
    return next(c for c in data["cases"] if c["id"] == case_id)


def _move_raw_case_into_portable(d: dict[str, Any]) -> None:
    d["cases"][0]["input"] = {"payload": {"language": "posix-shell", "text": "echo hi"}}


MUTATIONS = {
    "unknown-expect-key": (
        "basic.json",
        lambda d: _case(d, "executor.exit-zero-stdout")["expect"].update(stdout_contain="x"),
        "stdout_contain",
    ),
    "unknown-case-key": ("basic.json", lambda d: _case(d, "executor.exit-zero-stdout").update(notes="x"), "notes"),
    "unknown-input-key": (
        "basic.json",
        lambda d: _case(d, "executor.exit-zero-stdout")["input"].update(cancel_after=1),
        "cancel_after",
    ),
    "negative-without-error-code": (
        "basic.json",
        lambda d: _case(d, "executor.exit-nonzero")["expect"].pop("error_code"),
        "error_code",
    ),
    "bad-id": ("basic.json", lambda d: _case(d, "executor.exit-zero-stdout").update(id="Executor Exit"), "$.cases[0].id"),
    "bad-polarity": ("basic.json", lambda d: _case(d, "executor.exit-zero-stdout").update(polarity="maybe"), "polarity"),
    "bad-status": ("basic.json", lambda d: _case(d, "executor.exit-zero-stdout")["expect"].update(status="fine"), "status"),
    "bad-capability-name": ("env.json", lambda d: d["cases"][0].update(requires=["Env_Policy"]), "Env_Policy"),
    "unknown-step": (
        "basic.json",
        lambda d: _case(d, "executor.exit-zero-stdout")["input"].update(behaviour=[{"print": "x"}]),
        "print",
    ),
    "two-actions-in-one-step": (
        "basic.json",
        lambda d: _case(d, "executor.exit-zero-stdout")["input"].update(behaviour=[{"stdout": "x", "exit": 1}]),
        "behaviour",
    ),
    "bad-hex": (
        "basic.json",
        lambda d: _case(d, "executor.binary-output")["input"].update(behaviour=[{"stdout_hex": "0g"}]),
        "0g",
    ),
    "behaviour-and-payload": (
        "basic.json",
        lambda d: _case(d, "executor.exit-zero-stdout")["input"].update(payload={"language": "posix-shell", "text": "true"}),
        "input",
    ),
    "shell-payload-in-job": (
        "env.json",
        lambda d: d["cases"][0]["input"].update(job={"payload_message": "env"}),
        "payload_message",
    ),
    "executor-options-in-job": (
        "env.json",
        lambda d: d["cases"][0]["input"].update(job={"executor_options": {"env_policy": "minimal"}}),
        "executor_options",
    ),
    "raw-payload-outside-its-language-directory": ("env.json", _move_raw_case_into_portable, "belongs in executor/posix-shell/"),
    "duplicate-id": ("env.json", lambda d: d["cases"][0].update(id="executor.exit-zero-stdout"), "duplicate case id"),
    "kind-mismatch": ("env.json", lambda d: d["cases"].__setitem__(0, {
        "id": "executor.kind-mismatch", "description": "d", "kind": "authorization", "polarity": "positive",
        "input": {"policy": "permit"}, "expect": {"decision": "permit"}}), "does not match the file kind"),
    "invalid-job-spec": ("env.json", lambda d: d["cases"][0]["input"].update(job={"run_timeout": 5}), "run_timeout"),
    "not-json": ("env.json", None, "not valid JSON"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_mutated_fixture_is_rejected(tmp_path: Path, name: str) -> None:
    filename, change, needle = MUTATIONS[name]
    root = _copy_corpus(tmp_path)
    if change is None:
        (root / "v2" / "executor" / filename).write_text('{"kind": "executor", "cases": [')
    else:
        _mutate(root, filename, change)
    with pytest.raises(SchedulerError) as info:
        load_cases("executor", root)
    assert info.value.code == "CONFORMANCE_FIXTURE_INVALID"
    assert f"v2/executor/{filename}" in info.value.message  # names the file ...
    assert needle in info.value.message + json.dumps(info.value.details)  # ... and what is wrong, where


def test_a_portable_case_in_a_language_directory_is_rejected(tmp_path: Path) -> None:
    root = _copy_corpus(tmp_path)
    shutil.copy(root / "v2" / "executor" / "env.json", root / "v2" / "executor" / "posix-shell" / "env.json")
    (root / "v2" / "executor" / "env.json").unlink()
    with pytest.raises(SchedulerError) as info:
        load_cases("executor", root)
    assert "must be raw posix-shell payloads" in info.value.message


def _extra_dir(tmp_path: Path, cases: list[dict[str, Any]], name: str = "extra") -> Path:
    """An extra fixtures directory (``<dir>/executor/mine.json``) holding ``cases``."""
    directory = tmp_path / name
    (directory / "executor").mkdir(parents=True)
    (directory / "executor" / "mine.json").write_text(json.dumps({"kind": "executor", "cases": cases}))
    return directory


def _extra_case(case_id: str, **expect: Any) -> dict[str, Any]:
    return {
        "id": case_id,
        "description": "an author's own case",
        "kind": "executor",
        "polarity": "positive",
        "input": {"behaviour": [{"stdout": "mine\n"}]},
        "expect": expect or {"status": "ok", "stdout_contains": "mine", "stdout_bytes": 5},
    }


def test_extra_fixture_directories_add_to_the_stock_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stock = [c.id for c in load_cases("executor")]
    one = _extra_dir(tmp_path, [_extra_case("executor.mine-one")], "one")
    two_root = tmp_path / "two-root"  # a conformance-fixtures/-style directory: its v2/ is read
    shutil.copytree(_extra_dir(tmp_path, [_extra_case("executor.mine-two")], "two"), two_root / "v2")
    three = _extra_dir(tmp_path, [_extra_case("executor.mine-three")], "three")
    monkeypatch.setenv(FIXTURES_ENV, os.pathsep.join([str(one), str(two_root)]))
    assert extra_fixture_dirs([three]) == [one.resolve(), (two_root / "v2").resolve(), three.resolve()]
    ids = [c.id for c in load_cases("executor", extra=[three])]
    assert ids == [*stock, "executor.mine-one", "executor.mine-two", "executor.mine-three"]
    mine = next(c for c in load_cases("executor") if c.id == "executor.mine-one")
    assert mine.source == str((one / "executor" / "mine.json").resolve())
    report = _reference_report(filter="executor.mine-*", extra=[three])
    assert report.ok and report.passed == 3, report.to_json()
    monkeypatch.setenv(FIXTURES_ENV, str(FIXTURES))  # naming the stock corpus again adds nothing
    assert [c.id for c in load_cases("executor")] == stock


def test_extra_fixture_directory_problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SchedulerError) as info:
        load_cases("executor", extra=[tmp_path / "nope"])
    assert info.value.code == "CONFORMANCE_FIXTURES_NOT_FOUND" and "nope" in info.value.message
    monkeypatch.setenv(FIXTURES_ENV, str(tmp_path / "nope-env"))
    with pytest.raises(SchedulerError) as info:
        load_cases("executor")
    assert info.value.code == "CONFORMANCE_FIXTURES_NOT_FOUND"
    monkeypatch.delenv(FIXTURES_ENV)
    clash = _extra_dir(tmp_path, [_extra_case("executor.exit-zero-stdout")], "clash")
    with pytest.raises(SchedulerError) as info:
        load_cases("executor", extra=[clash])
    assert info.value.code == "CONFORMANCE_FIXTURE_INVALID" and "duplicate case id" in info.value.message
    assert "first defined in v2/executor/basic.json" in info.value.message
    old = tmp_path / "old-format"
    (old / "v1" / "executor").mkdir(parents=True)
    (old / "v1" / "executor" / "basic.json").write_text("{}")
    with pytest.raises(SchedulerError) as info:
        load_cases("executor", extra=[old])
    assert info.value.code == "CONFORMANCE_FIXTURE_INVALID" and "only for format v1" in info.value.message
    invalid = _extra_dir(tmp_path, [{**_extra_case("executor.mine"), "polarity": "maybe"}], "invalid")
    with pytest.raises(SchedulerError) as info:
        load_cases("executor", extra=[invalid])
    assert str(invalid / "executor" / "mine.json") in info.value.message.replace(str(invalid.resolve()), str(invalid))


def test_a_mutated_fixture_fails_the_run_and_the_cli_cleanly(tmp_path: Path) -> None:
    bad = _extra_dir(tmp_path, [{**_extra_case("executor.mine"), "expect": {}}])
    report = _reference_report(extra=[bad])
    assert not report.ok and report.error["code"] == "CONFORMANCE_FIXTURE_INVALID" and report.failed == 1
    assert report.results == ()
    result = CliRunner().invoke(conformance_group, ["list", "executor", "--json", "--fixtures", str(bad)])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["code"] == "CONFORMANCE_FIXTURE_INVALID"


def test_packaged_fixtures_are_the_repo_fixtures() -> None:
    """``scheduler/conformance/fixtures`` is a symlink to the one corpus (what a wheel ships), never a copy."""
    packaged = REPO / "scheduler" / "conformance" / "fixtures"
    assert packaged.is_symlink() and packaged.resolve() == FIXTURES


def test_fixture_root_and_unknown_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert fixtures_root() == FIXTURES
    monkeypatch.setenv(FIXTURES_ENV, str(tmp_path))  # adds cases, never replaces the stock root
    assert fixtures_root() == FIXTURES
    with pytest.raises(SchedulerError) as info:
        fixtures_root(tmp_path / "nope")
    assert info.value.code == "CONFORMANCE_FIXTURES_NOT_FOUND"
    with pytest.raises(SchedulerError) as info:
        load_cases("gizmo", FIXTURES)
    assert info.value.code == "CONFORMANCE_KIND_UNKNOWN"
    with pytest.raises(SchedulerError) as info:
        load_cases("executors", FIXTURES)  # kind names are singular
    assert info.value.code == "CONFORMANCE_KIND_UNKNOWN"


# --------------------------------------------------------------------------- payload adapters


def test_behaviour_reaches_the_adapter_as_written() -> None:
    case = next(c for c in load_cases("executor") if c.id == "executor.timeout-sigterm-ignored")
    behaviour = Behaviour.from_case_input(case.id, case.input)
    assert behaviour.steps == (Step("ignore_sigterm", True), Step("sleep_ms", 30000))
    assert behaviour.raw is None and behaviour.stdin is None and behaviour.actions() == ["ignore_sigterm", "sleep_ms"]
    stdin = next(c for c in load_cases("executor") if c.id == "executor.stdin-text")
    assert Behaviour.from_case_input(stdin.id, stdin.input).stdin == "conformance-stdin-line\n"


def test_posix_shell_payloads_produce_exact_bytes(tmp_path: Path) -> None:
    """Each step's shell form really does what the step says (run with /bin/sh, byte for byte)."""
    steps = (
        Step("stdout", "it's \"quoted\" $HOME `x`\n"),
        Step("stdout_hex", "00017f80ff"),
        Step("stdout_env", "CONFORMANCE_PROBE"),
        Step("stdout_env", "CONFORMANCE_UNSET"),
        Step("stderr", "to stderr"),
        Step("stdin_to_stdout", True),
        Step("stdout_zeros", 3),
        Step("exit", 5),
        Step("stdout", "never"),
    )
    fields = PosixShellPayloads().conformance_payload(Behaviour(case_id="probe", steps=steps))
    assert set(fields) == {"payload_message"}
    env = {"PATH": os.environ["PATH"], "CONFORMANCE_PROBE": "probe value"}
    done = subprocess.run(["/bin/sh", "-c", fields["payload_message"]], input=b"in\n", capture_output=True, env=env, check=False)
    assert done.returncode == 5
    assert done.stdout == b"it's \"quoted\" $HOME `x`\n" + bytes.fromhex("00017f80ff") + b"probe value\n\nin\n" + bytes(3)
    assert done.stderr == b"to stderr"


def test_posix_shell_payloads_decline_what_needs_an_option() -> None:
    adapter = PosixShellPayloads()
    with pytest.raises(NotImplementedError, match="standard input"):
        adapter.conformance_payload(Behaviour(case_id="x", steps=(Step("stdin_to_stdout", True),), stdin="x"))
    with pytest.raises(NotImplementedError, match="environment-policy"):
        adapter.conformance_payload(Behaviour(case_id="x", steps=(Step("stdout", "x"),), env_policy="minimal"))
    both = Behaviour(case_id="x", steps=(Step("stdout", "x"),), stdin="in", env_policy="inherit")
    fields = ReferencePayloads().conformance_payload(both)
    assert fields["executor_options"] == {"stdin_text": "in", "env_policy": "inherit"}


class _DeclinesSigterm(ReferencePayloads):
    """An adapter whose payload language has no way to ignore SIGTERM (it declines that step)."""

    languages = frozenset()

    def command(self, step: Step) -> str:
        if step.action == "ignore_sigterm":
            raise NotImplementedError("cannot ignore SIGTERM in this language")
        return super().command(step)


def test_cases_an_adapter_cannot_express_are_skipped_never_passed() -> None:
    report = _reference_report(payload_adapter=_DeclinesSigterm)
    assert report.ok, [r.to_json() for r in report.results if r.outcome == "failed"]
    skipped = {r.id: r.message for r in report.results if r.outcome == "skipped" and r.id != UNCONFIGURED}
    declined = {c.id for c in load_cases("executor") if {"ignore_sigterm": True} in c.input.get("behaviour", [])}
    raw = {c.id for c in load_cases("executor") if "payload" in c.input}
    assert set(skipped) == declined | raw and declined and raw
    for case_id in declined:
        assert skipped[case_id] == (
            "payload adapter _DeclinesSigterm cannot express this case: cannot ignore SIGTERM in this language"
        )
    for case_id in raw:
        assert skipped[case_id].startswith("written in posix-shell; payload adapter _DeclinesSigterm does not accept it")


def test_an_executor_without_a_payload_adapter_is_one_failure() -> None:
    report = run_kind("executor", "reference", ReferenceExecutor())
    assert report.error["code"] == "CONFORMANCE_NO_PAYLOAD_ADAPTER" and report.results == ()
    assert report.failed == 1 and report.summary_line() == "0 passed, 1 failed, 0 skipped"
    assert "scheduler.conformance_adapters" in report.error["message"] and "conformance_payload" in report.error["message"]
    for spec, needle in (("no_such_module_xyz:Adapter", "ModuleNotFoundError"), ("json:dumps", "no conformance_payload"),
                         ("missing-colon", "not MODULE:ATTR")):
        bad = run_kind("executor", "reference", ReferenceExecutor(), payload_adapter=spec)
        assert bad.error["code"] == "CONFORMANCE_ADAPTER_INVALID" and needle in bad.error["message"], bad.error
        assert bad.failed == 1


def test_a_provider_object_is_held_to_the_loaders_api_check() -> None:
    class Old(ReferenceExecutor):
        plugin_api = 1

    report = run_kind("executor", "old", Old(), payload_adapter=ReferencePayloads())
    assert report.error["code"] == "PLUGIN_API_MISMATCH" and report.failed == 1 and report.results == ()
    listy = ReferenceExecutor(capabilities=["cancel"])  # type: ignore[arg-type]
    assert run_kind("executor", "listy", listy, payload_adapter=ReferencePayloads()).error["code"] == "PLUGIN_INVALID"


def test_an_adapter_given_as_module_attr_is_imported() -> None:
    report = run_kind(
        "executor", "reference", ReferenceExecutor(), filter="executor.exit-*",
        payload_adapter="scheduler.conformance.payload:PosixShellPayloads",
    )
    assert report.ok and report.passed == 2


def test_an_adapter_that_misbehaves_fails_the_case(tmp_path: Path) -> None:
    case = next(c for c in load_cases("executor") if c.id == "executor.exit-zero-stdout")

    class Returns:
        def __init__(self, value: Any) -> None:
            self.value = value

        def conformance_payload(self, behaviour: Any) -> Any:
            if isinstance(self.value, Exception):
                raise self.value
            return self.value

    for value, needle in (
        ({"payload": "x"}, "not a dict with a payload_message"),
        ({"payload_message": "true", "run_timeout_ms": 5}, "fields a case owns"),
        (RuntimeError("adapter bug"), "raised RuntimeError: adapter bug"),
        ({"payload_message": "true", "executor_options": {"no_such_option": 1}}, "EXECUTOR_OPTIONS_INVALID"),
    ):
        result = run_case(ReferenceExecutor(), case, tmp_path, payload_adapter=Returns(value))
        assert result.outcome == "failed" and needle in result.message, (value, result.message)
    assert run_case(ReferenceExecutor(), case, tmp_path, payload_adapter=Returns(None)).outcome == "skipped"


# --------------------------------------------------------------------------- the broken provider


def test_broken_executor_is_reported_as_failing(broken_installed: None) -> None:
    report = run_kind("executor", "broken")  # its own conformance_payload method is its adapter
    assert report.error is None
    assert report.failed > 3 and not report.ok
    assert report.passed + report.failed + report.skipped == len(load_cases("executor"))
    assert report.summary_line() == f"{report.passed} passed, {report.failed} failed, {report.skipped} skipped"
    assert SUMMARY_RE.match(report.summary_line())
    by_id = {r.id: r for r in report.results}
    for case_id in (
        "executor.exit-nonzero",
        "executor.run-timeout",
        "executor.timeout-sigterm-ignored",
        "executor.cancel-running",
        "executor.binary-output",
        "executor.huge-output-offloaded",
        "executor.process-handle-recorded",
        "executor.cancel-stops-child-processes",
        "executor.structured-json-invalid",
        "executor.verify-fail-error",
        "executor.posix-shell.subshell-exit-status",
    ):
        assert by_id[case_id].outcome == "failed", case_id
    assert "expected 'EXIT_NONZERO', got None" in by_id["executor.exit-nonzero"].message
    assert "stdout_bytes: expected 3" in by_id["executor.binary-output"].message
    assert "record_handle" in by_id["executor.process-handle-recorded"].message
    assert "not offloaded" in by_id["executor.huge-output-offloaded"].message
    observed = by_id["executor.exit-nonzero"].observed  # the executor's side of a failure
    assert observed["result"].startswith("status='ok' exit_code=0 error_code=None")
    assert observed["stderr"] == "" and '["exit", 3]' in observed["payload"]["payload_message"]
    as_json = report.to_json()
    assert as_json["ok"] is False and as_json["failed"] == report.failed and len(as_json["results"]) == len(report.results)
    assert as_json["code"] == "CONFORMANCE_FAILED"
    json.dumps(as_json)


def test_broken_import_is_one_load_failure_naming_the_distribution(broken_installed: None) -> None:
    report = run_kind("executor", "broken-import")
    assert report.error is not None and report.error["code"] == "PLUGIN_LOAD_FAILED"
    assert "scheduler-executor-broken" in report.error["message"]
    assert "ImportError" in report.error["message"]
    assert report.results == () and report.failed == 1 and report.passed == 0 and not report.ok
    assert report.to_json()["code"] == "PLUGIN_LOAD_FAILED"


def test_broken_api_is_one_api_mismatch(broken_installed: None) -> None:
    report = run_kind("executor", "broken-api", filter="executor.exit-*")
    assert report.error is not None and report.error["code"] == "PLUGIN_API_MISMATCH"
    assert "99" in report.error["message"]
    assert report.results == () and report.summary_line() == "0 passed, 1 failed, 0 skipped"


def test_a_provider_built_for_plugin_api_2_is_refused_naming_what_changed(broken_installed: None) -> None:
    """The kernel's major is 3: a provider declaring 2 gets PLUGIN_API_MISMATCH saying what moved, through the loader and the CLI."""
    from scheduler.plugins.loader import load_provider

    with pytest.raises(SchedulerError) as exc:
        load_provider("executor", "broken-api-two")
    assert exc.value.code == "PLUGIN_API_MISMATCH"
    assert "targets plugin API 2, kernel provides 3" in exc.value.message
    for change in ("scheduler_toolkit", "configure", "proof_verifier", "literal 3", "From plugin API 2 to 3"):
        assert change in exc.value.message, change
    assert exc.value.details["changed"] and exc.value.details["plugin_api"] == 2
    report = run_kind("executor", "broken-api-two", filter="executor.exit-*")
    assert report.error is not None and report.error["code"] == "PLUGIN_API_MISMATCH" and "scheduler_toolkit" in report.error["message"]
    # A major the kernel knows nothing about says only the numbers.
    with pytest.raises(SchedulerError) as exc:
        load_provider("executor", "broken-api")
    assert exc.value.code == "PLUGIN_API_MISMATCH" and "changed" not in exc.value.details


def test_no_first_party_provider_declares_plugin_api_through_the_kernels_constant() -> None:
    """``plugin_api`` is a literal int in every first-party distribution: a copied constant would claim every future major."""
    offenders, literals = [], 0
    for root in ("plugins", "providers", "examples", "tests/support"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(isinstance(t, ast.Name) and t.id == "plugin_api" for t in targets):
                        if isinstance(node.value, ast.Constant) and type(node.value.value) is int:
                            literals += 1
                        else:
                            offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders
    assert literals >= 25  # every first-party provider was seen (a scan that finds none proves nothing)


def test_missing_provider_is_one_failure() -> None:
    report = run_kind("executor", f"missing-{uuid.uuid4().hex[:8]}")
    assert report.error["code"] == "PLUGIN_NOT_FOUND" and report.failed == 1 and report.results == () and not report.ok


# --------------------------------------------------------------------------- the runner reports success too


def test_honest_reference_executor_passes_every_case() -> None:
    lines: list[str] = []
    report = _reference_report(on_result=lambda r: lines.append(r.id))
    failures = {r.id: r.message for r in report.results if r.outcome != "passed"}
    assert failures == {UNCONFIGURED: NO_SETTINGS}  # the reference needs no host settings: nothing to take away
    assert report.ok and report.passed == len(load_cases("executor")) - 1 and report.skipped == 1
    assert lines == [r.id for r in report.results]
    assert "CONFORMANCE_API_TOKEN" not in os.environ  # input.env was restored


def test_missing_capabilities_skip_cases_instead_of_passing_them() -> None:
    report = _reference_report(provider=ReferenceExecutor(capabilities=frozenset()))
    requiring = [c.id for c in load_cases("executor") if c.requires]
    assert sorted(r.id for r in report.results if r.outcome == "skipped") == sorted([*requiring, UNCONFIGURED])
    assert report.failed == 0 and report.passed == len(load_cases("executor")) - len(requiring) - 1
    skip = next(r for r in report.results if r.id == "executor.verify-pass")
    assert skip.message == "provider does not declare capability verify"


UNCONFIGURED = "executor.unconfigured-refused"
NO_SETTINGS = "the payload adapter gives no settings: the executor needs none on the host (its defaults run every case)"


@attrs.frozen(kw_only=True)
class _EndpointSettings:
    """``[executors.NAME]`` of an executor that needs an endpoint on the host (a stand-in for an agent's gateway)."""

    endpoint: str | None = None


@attrs.frozen(kw_only=True)
class _RequiredEndpoint:
    """Settings whose endpoint has no default: an empty table does not validate (the host refuses to load it)."""

    endpoint: str


class _NeedsEndpoint(ReferenceExecutor):
    """Honest: without its endpoint it runs nothing and says why."""

    settings_class: Any = _EndpointSettings

    def configure(self, settings: Any) -> None:
        self.endpoint = settings.endpoint

    def execute(self, request: Any, control: Any) -> ExecutionResult:
        if getattr(self, "endpoint", None) is None:
            return ExecutionResult(status="error", error_code="REFERENCE_NOT_CONFIGURED", error_message="no endpoint")
        return super().execute(request, control)


class _RunsWithoutEndpoint(_NeedsEndpoint):
    """Broken: an unconfigured instance runs the payload anyway (and reports it ok)."""

    def execute(self, request: Any, control: Any) -> ExecutionResult:
        return ReferenceExecutor.execute(self, request, control)


class _RefusesEmptyTable(_NeedsEndpoint):
    settings_class = _RequiredEndpoint


class _EndpointPayloads(ReferencePayloads):
    settings: ClassVar[dict[str, str]] = {"endpoint": "http://127.0.0.1:9/"}


def test_an_executor_without_its_settings_must_not_run_the_payload() -> None:
    """Issue 27: the empty-settings case fails an executor that runs unconfigured, passes one that refuses the run or the table."""
    def run(cls: type) -> Any:
        provider = cls()
        provider.configure(_EndpointSettings(endpoint="http://127.0.0.1:9/"))
        return _reference_report(provider=provider, payload_adapter=_EndpointPayloads(), filter=UNCONFIGURED)

    honest, refusing, broken = run(_NeedsEndpoint), run(_RefusesEmptyTable), run(_RunsWithoutEndpoint)
    assert honest.ok and honest.passed == 1, [r.to_json() for r in honest.results]
    assert refusing.ok and refusing.passed == 1, [r.to_json() for r in refusing.results]
    assert not broken.ok and broken.failed == 1
    assert "status: expected 'error', got 'ok'" in broken.results[0].message, broken.results[0].message
    assert "conformance-unconfigured-ran" in broken.results[0].message


def test_case_filter_by_glob_list_and_predicate() -> None:
    assert [r.id for r in _reference_report(filter="executor.exit-*").results] == [
        "executor.exit-zero-stdout",
        "executor.exit-nonzero",
    ]
    assert len(_reference_report(filter=["executor.stdin-*", "executor.binary-*"]).results) == 3
    assert _reference_report(filter=lambda c: c.polarity == "negative" and not c.requires).passed == 3
    nothing = _reference_report(filter="executor.no-such-case*")
    assert not nothing.ok and nothing.error["code"] == "CONFORMANCE_NO_CASES" and nothing.failed == 1
    result = CliRunner().invoke(conformance_group, ["run", "executor", "ref", "--case", "executor.no-such-case*"])
    assert result.exit_code == 1 and "CONFORMANCE_NO_CASES" in result.stderr


def _one_case(**expect: Any) -> Case:
    return Case(
        id="probe.case",
        description="probe",
        kind="executor",
        polarity="positive",
        input={"job": {"run_timeout_ms": 60_000}, "behaviour": [{"stdout": "probe\n"}]},
        expect=expect,
    )


class _Spy:
    """An executor whose ``execute`` is a given function; its own ``conformance_payload`` makes a fixed payload."""

    plugin_api = PLUGIN_API_VERSION
    capabilities: frozenset[str] = frozenset()

    def __init__(self, behaviour: Any) -> None:
        self.behaviour = behaviour
        self.requests: list[Any] = []

    def conformance_payload(self, behaviour: Any) -> dict[str, Any]:
        return {"payload_message": f"spy payload for {behaviour.case_id}"}

    def execute(self, request: Any, control: Any) -> Any:
        self.requests.append(request)
        return self.behaviour(request, control)


def test_execution_request_is_built_like_the_dispatcher_does(tmp_path: Path) -> None:
    spy = _Spy(lambda request, control: ExecutionResult(status="ok", exit_code=0))
    result = run_case(spy, _one_case(status="ok"), tmp_path, name="spy")
    assert result.outcome == "passed", result.message
    (request,) = spy.requests
    assert uuid.UUID(request.run_id) and uuid.UUID(request.job_id) and request.attempt == 1
    assert request.deadline_ms == request.started_at_ms + 60_000
    assert request.artifacts_dir == request.artifacts_root / "runs" / request.run_id
    assert not request.artifacts_dir.exists()  # the dispatcher leaves it to the first offload
    assert request.job.executor == "spy" and request.job.payload_message == "spy payload for probe.case"
    assert request.job.name == "conformance probe.case" and request.job.schedule_kind == "manual"
    assert request.options is None and request.dispatch_kind == "manual" and request.credentials == ()
    assert request.extra_env == {
        "SCHEDULER_RUN_ID": request.run_id,
        "SCHEDULER_JOB_ID": request.job_id,
        "SCHEDULER_JOB_NAME": request.job.name,
        "SCHEDULER_ATTEMPT": "1",
    }
    run_case(spy, _one_case(status="ok"), tmp_path)
    assert spy.requests[-1].job.executor == "conformance-executor"  # an object given without a name


def test_options_reach_the_executor_as_its_options_class(tmp_path: Path) -> None:
    seen: list[Any] = []

    class Capturing(ReferenceExecutor):
        def execute(self, request: Any, control: Any) -> ExecutionResult:
            seen.append(request.options)
            return super().execute(request, control)

    case = next(c for c in load_cases("executor") if c.id == "executor.stdin-text")
    assert run_case(Capturing(), case, tmp_path, payload_adapter=ReferencePayloads()).outcome == "passed"
    assert seen == [RefOptions(stdin_text="conformance-stdin-line\n")]


def test_a_provider_that_raises_fails_the_case_with_the_exception(tmp_path: Path) -> None:
    def boom(request: Any, control: Any) -> Any:
        raise RuntimeError("kaboom in execute")

    result = run_case(_Spy(boom), _one_case(status="ok"), tmp_path)
    assert result.outcome == "failed" and "RuntimeError" in result.message and "kaboom in execute" in result.message
    assert result.observed["payload"] == {"payload_message": "spy payload for probe.case"}

    def coded(request: Any, control: Any) -> Any:
        raise SchedulerError("EXIT_NONZERO", "raised, not reported")

    negative = Case(
        id="probe.negative",
        description="probe",
        kind="executor",
        polarity="negative",
        input=_one_case().input,
        expect={"error_code": "EXIT_NONZERO"},
    )
    result = run_case(_Spy(coded), negative, tmp_path)
    assert result.outcome == "failed" and "[EXIT_NONZERO]" in result.message and "raised instead of returning" in result.message


def test_a_negative_case_needs_exactly_the_expected_code(tmp_path: Path) -> None:
    negative = Case(
        id="probe.negative",
        description="probe",
        kind="executor",
        polarity="negative",
        input=_one_case().input,
        expect={"status": "error", "error_code": "EXIT_NONZERO"},
    )
    wrong = _Spy(lambda r, c: ExecutionResult(status="error", exit_code=1, error_code="EXIT_NON_ZERO"))
    right = _Spy(lambda r, c: ExecutionResult(status="error", exit_code=1, error_code="EXIT_NONZERO"))
    assert run_case(wrong, negative, tmp_path).outcome == "failed"
    assert run_case(right, negative, tmp_path).outcome == "passed"


def test_a_failure_shows_the_executors_stderr_and_result(tmp_path: Path) -> None:
    stderr = StreamCapture(bytes=40, sha256="0" * 64, excerpt="Traceback (most recent call last): boom\n")
    spy = _Spy(
        lambda r, c: ExecutionResult(status="error", exit_code=1, error_code="PY_ERR", error_message="it broke", stderr=stderr)
    )
    result = run_case(spy, _one_case(status="ok", stdout_contains="probe"), tmp_path)
    assert result.outcome == "failed"
    assert "status: expected 'ok', got 'error'" in result.message and "stdout does not contain 'probe'" in result.message
    assert result.observed["stderr"] == "Traceback (most recent call last): boom\n"
    assert result.observed["result"] == "status='error' exit_code=1 error_code='PY_ERR' error_message='it broke'"
    line = result_line(result)
    assert line.startswith("FAIL probe.case: ")
    assert "\n     stderr: \"Traceback (most recent call last): boom\\n\"" in line
    assert "\n     result: status='error' exit_code=1" in line and "\n     payload: " in line
    assert result.to_json()["observed"]["stderr"].startswith("Traceback")


def test_garbage_results_and_hung_providers_fail_without_crashing(tmp_path: Path) -> None:
    assert "not an ExecutionResult" in run_case(_Spy(lambda r, c: {"status": "ok"}), _one_case(status="ok"), tmp_path).message
    bad_status = run_case(_Spy(lambda r, c: ExecutionResult(status="great")), _one_case(), tmp_path)
    assert bad_status.outcome == "failed" and "not one of" in bad_status.message
    lying = StreamCapture(bytes=1, sha256="0" * 64, excerpt="x", artifact="../../etc/passwd")
    tampered = run_case(
        _Spy(lambda r, c: ExecutionResult(status="ok", stdout=lying)), _one_case(artifact_offloaded=True), tmp_path
    )
    assert tampered.outcome == "failed" and "ARTIFACT_PATH_INVALID" in tampered.message
    stray = run_case(_Spy(lambda r, c: ExecutionResult(status="ok", stderr=lying)), _one_case(status="ok"), tmp_path)
    assert stray.outcome == "failed" and "offloaded stderr does not verify" in stray.message  # checked whatever the case

    def hang(request: Any, control: Any) -> Any:
        control.wait_cancelled(30)  # ignores its deadline until the engine cancels it
        return ExecutionResult(status="cancelled")

    started = time.monotonic()
    result = run_case(_Spy(hang), _one_case(max_duration_ms=100), tmp_path)
    assert result.outcome == "failed" and "did not return within" in result.message
    assert time.monotonic() - started < 20


def test_process_handles_are_checked(tmp_path: Path) -> None:
    def records(handle: Any) -> Any:
        def run(request: Any, control: Any) -> ExecutionResult:
            control.record_handle(handle)
            return ExecutionResult(status="ok", exit_code=0)

        return _Spy(run)

    case = _one_case(status="ok", process_handle_recorded=True)
    good = {"pid": os.getpid(), "pgid": os.getpgrp(), "start_time": "ticks:1", "host": socket.gethostname()}
    assert run_case(records(good), case, tmp_path).outcome == "passed"
    partial = run_case(records({"pid": 12, "pgid": 0, "start_time": "", "host": "elsewhere"}), case, tmp_path)
    assert partial.outcome == "failed" and "pgid=0" in partial.message and "start_time=''" in partial.message
    assert "host='elsewhere'" in partial.message and "pid=12" not in partial.message  # pid 12 is a fine pid
    none = run_case(_Spy(lambda r, c: ExecutionResult(status="ok", exit_code=0)), case, tmp_path)
    assert none.outcome == "failed" and "record_handle was never called" in none.message
    unexpected = run_case(records(good), _one_case(process_handle_recorded=False), tmp_path)
    assert unexpected.outcome == "failed" and "none was expected" in unexpected.message


def test_group_gone_catches_and_cleans_up_a_leaked_process_group(tmp_path: Path) -> None:
    leaked: list[int] = []

    def leaks(request: Any, control: Any) -> ExecutionResult:
        proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
        leaked.append(proc.pid)
        identity = process_identity(proc.pid) or ""
        control.record_handle({"pid": proc.pid, "pgid": proc.pid, "start_time": identity, "host": socket.gethostname()})
        threading.Thread(target=proc.wait, daemon=True).start()  # reap it whenever it dies
        return ExecutionResult(status="ok", exit_code=0)

    result = run_case(_Spy(leaks), _one_case(status="ok", group_gone=True), tmp_path)
    assert result.outcome == "failed" and f"process group {leaked[0]} still has live members" in result.message
    assert not group_alive(leaked[0])  # the engine stopped what the executor leaked, so no case leaks into the next
    mine = run_case(
        _Spy(lambda r, c: (c.record_handle({"pid": os.getpid(), "pgid": os.getpgrp(), "host": socket.gethostname()}),
                           ExecutionResult(status="ok", exit_code=0))[1]),
        _one_case(status="ok", group_gone=True),
        tmp_path,
    )
    assert mine.outcome == "failed" and "no process group to check" in mine.message  # never its own group (we are still here)


def test_kind_without_adapter_is_unsupported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler.conformance.engine import ADAPTERS

    monkeypatch.delitem(ADAPTERS, "authorization")  # every shipped kind has an adapter now: take one away
    root = _copy_corpus(tmp_path)
    shutil.rmtree(root / "v2" / "authorization")
    (root / "v2" / "authorization").mkdir()
    (root / "v2" / "authorization" / "basic.json").write_text(
        json.dumps(
            {
                "kind": "authorization",
                "cases": [
                    {
                        "id": "authorization.decide-once",
                        "description": "d",
                        "kind": "authorization",
                        "polarity": "positive",
                        "input": {"policy": "permit"},
                        "expect": {"decision": "permit"},
                    }
                ],
            }
        )
    )
    report = run_kind("authorization", "opa", provider=object(), root=root)
    assert report.error["code"] == "CONFORMANCE_KIND_UNSUPPORTED" and "no adapter for kind authorization" in report.error["message"]
    assert report.failed == 1 and report.results == () and not report.ok
    stock = _copy_corpus(tmp_path / "stock")
    shutil.rmtree(stock / "v2" / "authorization")
    empty = run_kind("authorization", "opa", provider=object(), root=stock)
    assert empty.ok and empty.summary_line() == "0 passed, 0 failed, 0 skipped"


# --------------------------------------------------------------------------- CLI and CI


def _last_line(text: str) -> str:
    return text.rstrip("\n").splitlines()[-1]


def test_cli_run_broken_exits_1_with_summary_last(broken_installed: None) -> None:
    result = CliRunner().invoke(conformance_group, ["run", "executor", "broken"])
    assert result.exit_code == 1, result.output
    lines = result.stdout.rstrip("\n").splitlines()
    assert SUMMARY_RE.match(lines[-1])
    assert any(line.startswith("FAIL executor.exit-nonzero: ") for line in lines)
    assert all(re.match(r"^((PASS|FAIL|SKIP) executor\.|     (result|stderr|stdout|payload|handles|terminations): )", line)
               for line in lines[:-1]), lines
    at = lines.index(next(line for line in lines if line.startswith("FAIL executor.exit-nonzero: ")))
    assert lines[at + 1].startswith("     result: status='ok'") and lines[at + 2].startswith("     stderr: ")


def test_cli_json_local_flag_and_root_obj(broken_installed: None) -> None:
    for args, obj in (
        (["run", "executor", "broken", "--json", "--case", "executor.exit-*"], None),
        (["run", "executor", "broken", "--case", "executor.exit-*"], {"json": True}),
    ):
        result = CliRunner().invoke(conformance_group, args, obj=obj)
        assert result.exit_code == 1
        payload = json.loads(result.stdout)
        assert payload["ok"] is False and payload["kind"] == "executor" and payload["name"] == "broken"
        assert payload["failed"] == 2 and payload["passed"] == 0 and payload["skipped"] == 0
        assert [r["id"] for r in payload["results"]] == ["executor.exit-zero-stdout", "executor.exit-nonzero"]
        assert all("observed" in r for r in payload["results"])


def test_cli_reports_load_failures_once(broken_installed: None) -> None:
    result = CliRunner().invoke(conformance_group, ["run", "executor", "broken-api", "--json"])
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["ok"] is False and payload["code"] == "PLUGIN_API_MISMATCH"
    assert payload["failed"] == 1 and payload["results"] == []
    human = CliRunner().invoke(conformance_group, ["run", "executor", "broken-import"])
    assert human.exit_code == 1 and human.stdout == "0 passed, 1 failed, 0 skipped\n"
    assert human.stderr.count("PLUGIN_LOAD_FAILED") == 1 and "scheduler-executor-broken" in human.stderr


def test_cli_adapter_and_fixtures_options(broken_installed: None, tmp_path: Path) -> None:
    bad = CliRunner().invoke(conformance_group, ["run", "executor", "broken", "--adapter", "no_such_module_xyz:A"])
    assert bad.exit_code == 1 and "CONFORMANCE_ADAPTER_INVALID" in bad.stderr and bad.stdout == "0 passed, 1 failed, 0 skipped\n"
    extra = _extra_dir(tmp_path, [_extra_case("executor.mine-cli")])
    listed = CliRunner().invoke(conformance_group, ["list", "executor", "--fixtures", str(extra)])
    assert listed.exit_code == 0 and listed.stdout.splitlines()[-1].startswith("executor.mine-cli  (positive)")
    ran = CliRunner().invoke(
        conformance_group,
        ["run", "executor", "broken", "--fixtures", str(extra), "--case", "executor.mine-*",
         "--adapter", "scheduler.conformance.payload:PosixShellPayloads"],
    )
    assert ran.exit_code == 1 and ran.stdout.startswith("FAIL executor.mine-cli: ")  # broken's lies caught by my case


def test_cli_list() -> None:
    result = CliRunner().invoke(conformance_group, ["list", "executor"])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [c.id for c in load_cases("executor")]
    assert "executor.posix-shell.pipeline-and-expansion  (positive)  [posix-shell payload]" in lines
    payload = json.loads(CliRunner().invoke(conformance_group, ["list", "--json"]).stdout)
    assert payload["ok"] is True and payload["count"] == len(load_corpus())


def test_cli_as_a_real_subprocess(broken_installed: None) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.conformance.cli", "run", "executor", "broken", "--case", "executor.*output*"],
        cwd=REPO,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert SUMMARY_RE.match(_last_line(proc.stdout)), proc.stdout
    assert "FAIL executor.binary-output: " in proc.stdout


def test_ci_help_prints_help_and_runs_nothing() -> None:
    """Issue 27: ``python -m scheduler.conformance.ci --help`` prints help (exit 0) instead of starting the suite; a flag it
    does not know is a usage error (exit 2), never a run."""
    begin = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "scheduler.conformance.ci", "--help"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m scheduler.conformance.ci"), proc.stdout
    assert ci.PROVIDERS_ENV in proc.stdout and "executor:shell" in proc.stdout
    assert "== conformance" not in proc.stdout and not SUMMARY_RE.search(proc.stdout)
    assert time.monotonic() - begin < 30
    bad = subprocess.run([sys.executable, "-m", "scheduler.conformance.ci", "--no-such-flag"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr and "== conformance" not in bad.stdout


def test_ci_runner(broken_installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ci.PROVIDERS_ENV, "executor:broken")
    out = io.StringIO()
    assert ci.main(out=out) == 1
    assert SUMMARY_RE.match(_last_line(out.getvalue()))

    monkeypatch.setenv(ci.PROVIDERS_ENV, "executor:broken-import,executor:not-installed-anywhere")
    monkeypatch.delenv(ci.ALLOW_MISSING_ENV, raising=False)
    out = io.StringIO()
    assert ci.main(out=out) == 1
    text = out.getvalue()
    assert "CI must install" in text and "PLUGIN_NOT_FOUND" in text
    assert text.count("FAIL executor broken-import: PLUGIN_LOAD_FAILED") == 1
    assert _last_line(text) == "0 passed, 2 failed, 0 skipped"  # one failure per provider, not one per case

    monkeypatch.setenv(ci.PROVIDERS_ENV, "executor:not-installed-anywhere")
    monkeypatch.setenv(ci.ALLOW_MISSING_ENV, "1")
    out = io.StringIO()
    assert ci.main(out=out) == 0
    assert _last_line(out.getvalue()) == "0 passed, 0 failed, 1 skipped"
    monkeypatch.delenv(ci.PROVIDERS_ENV)
    assert ci.providers_to_run() == [("executor", "shell"), ("executor", "hello"), ("executor", "python"), ("executor", "agent"),
                                     ("executor", "main-session"),
                                     ("channel", "webhook"), ("channel", "slack"), ("channel", "telegram"), ("channel", "email"),
                                     ("channel", "openclaw"), ("credential", "env"), ("credential", "file"),
                                     ("credential", "command"), ("credential", "oauth2"), ("evidence", "checksum"),
                                     ("evidence", "ssh"), ("evidence", "external"), ("authorization", "cedar"),
                                     ("authorization", "policyfile"), ("authorization", "teams"),
                                     ("proof_verifier", "jwt"), ("proof_verifier", "detached-signature"),
                                     ("proof_verifier", "certificate"), ("proof_verifier", "detached-signature-ssh")]


# --------------------------------------------------------------------------- pytest adapter


def test_pytest_adapter_reports_failures_skips_and_passes(tmp_path: Path, broken_installed: None) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["scheduler.conformance.pytest_plugin"]\n')
    (tmp_path / "test_plugin_conformance.py").write_text(
        textwrap.dedent(
            """
            import hashlib
            import subprocess

            from scheduler.api import PLUGIN_API_VERSION, ExecutionResult
            from scheduler_toolkit.output import StreamCapture
            from scheduler.testing import ChannelConformance, ExecutorConformance, PosixShellPayloads


            class Honest:
                plugin_api = PLUGIN_API_VERSION
                capabilities = frozenset()

                def execute(self, request, control):
                    proc = subprocess.run(["/bin/sh", "-c", request.job.payload_message], capture_output=True)
                    out = StreamCapture(bytes=len(proc.stdout), sha256=hashlib.sha256(proc.stdout).hexdigest(),
                                        excerpt=proc.stdout.decode(errors="replace"))
                    err = StreamCapture(bytes=len(proc.stderr), sha256=hashlib.sha256(proc.stderr).hexdigest(),
                                        excerpt=proc.stderr.decode(errors="replace"))
                    if proc.returncode:
                        return ExecutionResult(status="error", exit_code=proc.returncode, error_code="EXIT_NONZERO",
                                               stdout=out, stderr=err)
                    return ExecutionResult(status="ok", exit_code=0, stdout=out, stderr=err)


            class TestBroken(ExecutorConformance):
                provider_name = "broken"
                case_filter = ["executor.exit-*", "executor.binary-output"]


            class TestBrokenApi(ExecutorConformance):
                provider_name = "broken-api"


            class TestUnadaptedChannel(ChannelConformance):
                provider_name = "broken-unadapted"


            class TestHonestWithoutAdapter(ExecutorConformance):
                def make_provider(self):
                    return Honest()


            class TestHonest(ExecutorConformance):
                payload_adapter = PosixShellPayloads
                case_filter = ["executor.exit-*", "executor.binary-output", "executor.process-handle-recorded"]

                def make_provider(self):
                    return Honest()


            def test_ids_fixture(conformance_case_ids):
                assert "executor.exit-nonzero" in conformance_case_ids["executor"]
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "-p", "no:xdist", "test_plugin_conformance.py"],
        cwd=tmp_path,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "FAILED test_plugin_conformance.py::TestBroken::test_case[executor.exit-nonzero]" in out
    assert "FAILED test_plugin_conformance.py::TestBroken::test_case[executor.binary-output]" in out
    assert "expected 'EXIT_NONZERO', got None" in out
    # A provider that cannot be used is ONE failing test, whatever the number of cases.
    assert "FAILED test_plugin_conformance.py::TestBrokenApi::test_case[provider-load]" in out
    assert out.count("TestBrokenApi::test_case[") == 1 and "PLUGIN_API_MISMATCH" in out
    assert "FAILED test_plugin_conformance.py::TestHonestWithoutAdapter::test_case[provider-load]" in out
    assert "CONFORMANCE_NO_PAYLOAD_ADAPTER" in out
    assert "FAILED test_plugin_conformance.py::TestUnadaptedChannel::test_case[provider-load]" in out
    assert out.count("TestUnadaptedChannel::test_case[") == 1 and "CONFORMANCE_NO_SERVICE_ADAPTER" in out
    assert "provider does not declare capability process-group" in out
    summary = _last_line(out)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped)", summary)}
    # Broken: 3 failed; BrokenApi: 1; unadapted channel: 1; without adapter: 1; Honest: 3 passed + 1 skipped; the ids
    # fixture test passes.
    assert counts == {"failed": 6, "passed": 4, "skipped": 1}, summary


def test_engine_cli_and_ci_do_not_import_pytest() -> None:
    code = (
        "import sys, scheduler.conformance, scheduler.conformance.cli, scheduler.conformance.ci; "
        "sys.exit('pytest' in sys.modules or '_pytest' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_child_env(), check=False, timeout=60)
    assert proc.returncode == 0


# --------------------------------------------------------------------------- channels: an honest reference channel

CHANNEL_CAPS = frozenset({"attachments", "idempotency-keys"})


@attrs.frozen(kw_only=True)
class RefChannelSettings:
    """``[channels.reference]``: the service root, the bearer token, the answer timeout."""

    url: str | None = None
    token: SecretRef | None = attrs.field(default=None, metadata={"secret": True})
    timeout_s: float = attrs.field(default=2.0, metadata={"minimum": 0.01})


class ReferenceChannel:
    """A small but honest channel: one JSON POST per part to ``<url>/messages``, every failure classified.

    429 and 5xx are transient (``Retry-After`` honoured), other refusals permanent, anything
    on the wire (a timeout, a reset, half an answer) transient; files only when it declares
    ``attachments``, the part's key as ``Idempotency-Key`` when it declares ``idempotency-keys``.
    """

    plugin_api = PLUGIN_API_VERSION
    settings_class = RefChannelSettings

    def __init__(self, capabilities: frozenset[str] = CHANNEL_CAPS) -> None:
        self.capabilities = frozenset(capabilities)
        files = "attachments" in self.capabilities
        self.limits = ChannelLimits(max_chars=1000, max_parts=5, supports_attachments=files,
                                    max_attachment_bytes=4096 if files else 0)
        self._settings = RefChannelSettings()

    def configure(self, settings: RefChannelSettings) -> None:
        self._settings = settings

    def post(self, part: Any, token: str) -> Any:
        import base64
        import urllib.request

        files = [{"name": a["name"], "content_base64": base64.b64encode(a["content"]).decode()} for a in part.attachments]
        headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        if "idempotency-keys" in self.capabilities:
            headers["idempotency-key"] = part.idempotency_key
        request = urllib.request.Request(f"{self._settings.url}/messages", headers=headers,
                                         data=json.dumps({"text": part.body, "files": files}).encode())
        with urllib.request.urlopen(request, timeout=self._settings.timeout_s) as response:
            return json.loads(response.read())

    def send(self, part: Any, route: Any) -> Any:
        import http.client
        import urllib.error

        if part.attachments and not self.limits.supports_attachments:
            raise PermanentDeliveryError("this channel sends no files", code="REF_ATTACHMENTS_UNSUPPORTED")
        token = self._settings.token.resolve() if self._settings.token else ""
        try:
            answer = self.post(part, token)
        except urllib.error.HTTPError as exc:
            said = f"the service answered HTTP {exc.code}"
            if exc.code == 429 or exc.code >= 500:
                retry = exc.headers.get("retry-after")
                raise TransientDeliveryError(said, code="REF_RETRY", retry_after_s=float(retry) if retry else None) from None
            raise PermanentDeliveryError(said, code="REF_AUTH" if exc.code in (401, 403) else "REF_REJECTED") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise TransientDeliveryError(f"no answer from the service ({type(exc).__name__})", code="REF_CONNECTION") from None
        return DeliveryReceipt(receipt_id=part.idempotency_key, details={"answer": answer})


class _RefStandIn(HttpStandIn):
    """The reference channel's service: checks the token, reads the JSON message."""

    def __init__(self, request: ServiceRequest, timeout_s: float | None = None) -> None:
        super().__init__()
        self.token = f"ref-token-{uuid.uuid4().hex}"
        variable = f"SCHEDULER_CONFORMANCE_REF_TOKEN_{uuid.uuid4().hex[:8].upper()}"
        self.secrets = {variable: self.token}
        self.settings = {"url": self.url, "token": {"credential": f"env:{variable}"},
                         "timeout_s": timeout_s or request.timeout_s}

    def message_of(self, request: HttpRequest) -> ReceivedMessage:
        import base64

        if request.headers.get("authorization") != f"Bearer {self.token}":
            raise ValueError("no bearer token")
        data = request.json()
        files = tuple(ReceivedFile(name=f["name"], content=base64.b64decode(f["content_base64"])) for f in data["files"])
        return ReceivedMessage(text=data["text"], idempotency_key=request.headers.get("idempotency-key"), files=files)


class ReferenceService:
    """The reference channel's service adapter."""

    def conformance_service(self, request: ServiceRequest) -> _RefStandIn:
        return _RefStandIn(request)


def _channel_report(channel: Any = None, **kwargs: Any) -> Any:
    kwargs.setdefault("service_adapter", ReferenceService())
    return run_kind("channel", "reference", channel or ReferenceChannel(), **kwargs)


def _channel_case(case_id: str) -> Case:
    return next(c for c in load_cases("channel") if c.id == case_id)


class TestReferenceChannelConformance(ChannelConformance):
    """The pytest base class for channels, as a channel distribution uses it, on the honest reference channel."""

    service_adapter = ReferenceService

    def make_provider(self) -> Any:
        return ReferenceChannel()


# --------------------------------------------------------------------------- channels: the corpus


def test_channel_corpus_covers_the_required_cases() -> None:
    cases = {c.id: c for c in load_cases("channel")}
    assert all(c.source.startswith("v2/channel/") and c.source.count("/") == 2 for c in cases.values())
    answers = {i: [a["answer"] for a in c.input.get("answers", [{"answer": "accept"}])] for i, c in cases.items()}
    outcomes = {i: c.expect["outcome"] for i, c in cases.items()}
    assert {i: (answers[i], outcomes[i]) for i in cases if cases[i].polarity == "negative"} == {
        "channel.rate-limited-retry-after": (["rate_limit"], "transient"),
        "channel.rate-limited-transient": (["rate_limit"], "transient"),
        "channel.server-error-transient": (["server_error"], "transient"),
        "channel.timeout-transient": (["timeout"], "transient"),
        "channel.connection-reset-transient": (["reset"], "transient"),
        "channel.rejected-permanent": (["reject"], "permanent"),
        "channel.auth-rejected-permanent": (["auth_reject"], "permanent"),
        "channel.attachments-refused-without-support": (["accept"], "permanent"),
    }
    assert all(outcomes[i] == "delivered" for i in cases if cases[i].polarity == "positive")
    assert not any("error_code" in c.expect for c in cases.values())  # a channel's codes are its own
    limited = cases["channel.rate-limited-retry-after"]
    assert limited.input["answers"] == [{"answer": "rate_limit", "retry_after_s": 7}] and limited.expect["retry_after_s"] == 7
    assert "retry_after_s" not in cases["channel.rate-limited-transient"].input["answers"][0]
    plain = cases["channel.deliver-plain"].expect
    assert plain["delivered_messages"] == 1 and plain["body_whole"] is True
    assert cases["channel.body-at-max-chars-whole"].input["part"]["body"] == {"fill": "max_chars"}
    assert cases["channel.body-at-max-chars-whole"].expect["body_whole"] is True
    requires = {i: set(c.requires) for i, c in cases.items()}
    assert requires["channel.idempotency-key-carried"] == {"idempotency-keys"}
    assert cases["channel.idempotency-key-carried"].expect["idempotency_key_carried"] is True
    retried = cases["channel.idempotency-key-stable-across-retries"]
    assert answers[retried.id] == ["server_error", "accept"] and retried.expect["idempotency_key_carried"] is True
    assert requires["channel.attachments-delivered"] == {"attachments"}
    assert cases["channel.attachments-delivered"].expect["attachments_delivered"] is True
    files = cases["channel.attachments-delivered"].input["part"]["attachments"]
    assert bytes.fromhex(files[1]["hex"]) == bytes(range(256))
    assert cases["channel.attachments-refused-without-support"].input["unless_declared"] == ["attachments"]
    assert cases["channel.timeout-transient"].expect["max_duration_ms"] == 20000
    no_capability = sorted(i for i, r in requires.items() if not r)
    assert len(no_capability) >= 11, no_capability  # what every channel, even a capability-less one, is held to


def test_the_schema_answers_are_the_engine_answers() -> None:
    schema = load_schema()
    assert set(schema["$defs"]["service_answer"]["properties"]["answer"]["enum"]) == set(ANSWERS)


@pytest.mark.parametrize("chars", [1, 5, 6, 57, 100, 4000, 4096, 100_000])
def test_fill_body_is_exactly_max_chars(chars: int) -> None:
    body = fill_body(chars)
    assert len(body) == chars and body.endswith("<end>"[:chars] if chars <= 5 else "<end>")
    assert all(ord(c) < 0x10000 for c in body)  # UTF-16 length = character count (Telegram counts UTF-16 units)
    assert max(len(line) for line in body.splitlines()) < 100  # fits an SMTP line
    assert body == fill_body(chars)  # deterministic


def _mutate_channel(root: Path, filename: str, change: Any) -> None:
    path = root / "v2" / "channel" / filename
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


CHANNEL_MUTATIONS = {
    "unknown-expect-key": ("basic.json", lambda d: _case(d, "channel.deliver-plain")["expect"].update(body_whol=True),
                           "body_whol"),
    "unknown-input-key": ("basic.json", lambda d: _case(d, "channel.deliver-plain")["input"].update(answer="accept"),
                          "answer"),
    "positive-not-delivered": ("basic.json", lambda d: _case(d, "channel.deliver-plain")["expect"].update(outcome="transient"),
                               "delivered"),
    "negative-delivered": ("failures.json",
                           lambda d: _case(d, "channel.rejected-permanent")["expect"].update(outcome="delivered"),
                           "outcome"),
    "unknown-answer": ("failures.json",
                       lambda d: _case(d, "channel.rejected-permanent")["input"].update(answers=[{"answer": "explode"}]),
                       "explode"),
    "retry-after-on-a-500": ("failures.json", lambda d: _case(d, "channel.server-error-transient")["input"].update(
        answers=[{"answer": "server_error", "retry_after_s": 3}]), "retry_after_s"),
    "accept-before-the-last-answer": ("basic.json", lambda d: _case(d, "channel.deliver-plain")["input"].update(
        answers=[{"answer": "accept"}, {"answer": "accept"}]), "only the last answer"),
    "reject-before-the-last-answer": ("basic.json", lambda d: _case(d, "channel.deliver-plain")["input"].update(
        answers=[{"answer": "reject"}, {"answer": "accept"}]), "only the last answer"),
    "index-past-count": ("basic.json", lambda d: _case(d, "channel.part-of-several")["input"]["part"].update(index=4),
                         "past its count"),
    "retry-after-expected-without-one": ("failures.json", lambda d: _case(d, "channel.rate-limited-transient")["expect"].update(
        retry_after_s=3), "retry_after_s needs"),
    "delivered-after-a-refusal": ("failures.json", lambda d: _case(d, "channel.rejected-permanent").update(
        polarity="positive", expect={"outcome": "delivered"}), "the last answer is 'reject'"),
    "attachment-text-and-hex": ("files.json", lambda d: _case(d, "channel.attachments-refused-without-support")["input"][
        "part"]["attachments"][0].update(hex="00"), "attachments"),
    "channel-case-with-an-executor-field": ("basic.json", lambda d: _case(d, "channel.deliver-plain")["input"].update(
        behaviour=[{"stdout": "x"}]), "behaviour"),
}


@pytest.mark.parametrize("name", sorted(CHANNEL_MUTATIONS))
def test_a_mutated_channel_fixture_is_rejected(tmp_path: Path, name: str) -> None:
    filename, change, needle = CHANNEL_MUTATIONS[name]
    root = _copy_corpus(tmp_path)
    _mutate_channel(root, filename, change)
    with pytest.raises(SchedulerError) as info:
        load_cases("channel", root)
    assert info.value.code == "CONFORMANCE_FIXTURE_INVALID"
    assert f"v2/channel/{filename}" in info.value.message
    assert needle in info.value.message + json.dumps(info.value.details)


# --------------------------------------------------------------------------- channels: the engine


def test_the_reference_channel_passes_every_case_it_can_run() -> None:
    report = _channel_report()
    assert report.ok, [r.to_json() for r in report.results if r.outcome == "failed"]
    skipped = {r.id: r.message for r in report.results if r.outcome == "skipped"}
    assert skipped == {"channel.attachments-refused-without-support":
                       "the channel declares attachments; this case is for channels that do not"}
    assert report.passed == len(load_cases("channel")) - 1
    bare = _channel_report(ReferenceChannel(frozenset()))
    assert bare.ok, [r.to_json() for r in bare.results if r.outcome == "failed"]
    assert {r.id for r in bare.results if r.outcome == "skipped"} == {
        "channel.attachments-delivered", "channel.idempotency-key-carried", "channel.idempotency-key-stable-across-retries"}
    assert next(r for r in bare.results if r.id == "channel.attachments-refused-without-support").outcome == "passed"


def test_broken_channel_is_reported_as_failing(broken_installed: None) -> None:
    report = run_kind("channel", "broken")  # its service adapter: entry point scheduler.conformance_adapters:broken
    assert report.error is None and not report.ok
    assert report.passed + report.failed + report.skipped == len(load_cases("channel"))
    by_id = {r.id: r for r in report.results}
    assert {i for i, r in by_id.items() if r.outcome == "passed"} == {
        "channel.deliver-plain", "channel.unicode-body-intact", "channel.part-of-several"}
    assert report.failed == len(load_cases("channel")) - 4 and report.skipped == 1
    messages = {i: r.message for i, r in by_id.items()}
    swallowed = "got a receipt although the service accepted no message: a failure swallowed"
    for case_id in ("channel.rate-limited-retry-after", "channel.server-error-transient", "channel.rejected-permanent"):
        assert swallowed in messages[case_id], messages[case_id]
        assert "a secret of the channel's settings appears in a log record emitted while sending" in messages[case_id]
    assert "send() raised TimeoutError" in messages["channel.timeout-transient"]
    assert "must be a TransientDeliveryError or a PermanentDeliveryError" in messages["channel.timeout-transient"]
    assert "send() raised ConnectionResetError" in messages["channel.connection-reset-transient"]
    assert "a secret of the channel's settings appears in the error" in messages["channel.auth-rejected-permanent"]
    assert "did not arrive whole in one message (the longest text the service accepted has 480 characters)" in messages[
        "channel.body-at-max-chars-whole"]
    assert "attachment 'conformance-bytes.bin' did not reach the service" in messages["channel.attachments-delivered"]
    assert "carried the idempotency key None" in messages["channel.idempotency-key-carried"]
    assert "attempt 1 (server_error): expected a TransientDeliveryError" in messages[
        "channel.idempotency-key-stable-across-retries"]
    auth = by_id["channel.auth-rejected-permanent"]
    assert "<secret>" in auth.observed["result"] and auth.observed["leaking_log_records"]  # shown redacted
    assert auth.observed["secrets"][0].startswith("SCHEDULER_CONFORMANCE_BROKEN_TOKEN_")  # named, never its value
    seen = by_id["channel.attachments-delivered"].observed["attempts"][0]["service_saw"]
    assert seen == [{"text": "conformance attachments", "idempotency_key": None, "files": [], "accepted": True}]
    as_json = report.to_json()
    assert as_json["code"] == "CONFORMANCE_FAILED"
    json.dumps(as_json)


def test_a_channel_without_a_service_adapter_is_one_failure(broken_installed: None) -> None:
    report = run_kind("channel", "broken-unadapted")
    assert report.error["code"] == "CONFORMANCE_NO_SERVICE_ADAPTER" and report.results == () and report.failed == 1
    assert "conformance_service(request)" in report.error["message"]
    assert "scheduler.conformance_adapters" in report.error["message"]
    bare = run_kind("channel", "reference", ReferenceChannel())
    assert bare.error["code"] == "CONFORMANCE_NO_SERVICE_ADAPTER" and "channel 'reference'" in bare.error["message"]
    for spec, needle in (("no_such_module_xyz:Service", "ModuleNotFoundError"), ("json:dumps", "no conformance_service"),
                         ("missing-colon", "not MODULE:ATTR")):
        bad = run_kind("channel", "reference", ReferenceChannel(), service_adapter=spec)
        assert bad.error["code"] == "CONFORMANCE_ADAPTER_INVALID" and needle in bad.error["message"], bad.error
        assert bad.error["message"].startswith("service adapter")


def test_service_adapters_are_found_by_kind(broken_installed: None) -> None:
    """Executors and channels share scheduler.conformance_adapters: a name's adapter is picked by the kind's method."""
    from scheduler.conformance.payload import adapter_from_entry_points, resolve_payload_adapter
    from scheduler.conformance.service import resolve_service_adapter

    found = adapter_from_entry_points("broken", "conformance_service", "service")
    assert type(found).__name__ == "BrokenService"
    with pytest.raises(SchedulerError) as info:
        adapter_from_entry_points("broken", "conformance_payload", "payload")
    assert info.value.code == "CONFORMANCE_ADAPTER_INVALID" and "has no conformance_payload() method" in info.value.message
    assert adapter_from_entry_points("no-such-adapter", "conformance_service", "service") is None
    assert type(resolve_service_adapter("broken", object())).__name__ == "BrokenService"
    from scheduler.plugins.loader import load_provider

    broken_executor = load_provider("executor", "broken")
    assert resolve_payload_adapter("broken", broken_executor) is broken_executor  # its own method comes first

    class SelfServing(ReferenceChannel):
        def conformance_service(self, request: ServiceRequest) -> Any:
            return _RefStandIn(request)

    own = run_kind("channel", "self-serving", SelfServing(), filter="channel.deliver-plain")
    assert own.ok and own.passed == 1


class _Adapter:
    """A service adapter built from a function of the request (and of the reference stand-in)."""

    def __init__(self, make: Any) -> None:
        self.make = make

    def conformance_service(self, request: ServiceRequest) -> Any:
        return self.make(request)


def _one(case_id: str, *, tmp_path: Path, channel: Any = None, make: Any = None) -> Any:
    """Run one stock channel case against ``channel`` (the reference one by default) and a stand-in made by ``make``."""
    adapter = _Adapter(make) if make is not None else ReferenceService()
    return run_case(channel or ReferenceChannel(), _channel_case(case_id), tmp_path, name="reference", service_adapter=adapter)


def test_service_adapters_that_decline_or_misbehave(tmp_path: Path) -> None:
    def declines_timeouts(request: ServiceRequest) -> Any:
        if any(a.kind == "timeout" for a in request.answers):
            raise NotImplementedError("this service never hangs")
        return _RefStandIn(request)

    report = _channel_report(service_adapter=_Adapter(declines_timeouts))
    assert report.ok
    assert next(r for r in report.results if r.id == "channel.timeout-transient").message == (
        "service adapter _Adapter cannot give this case's answers: this service never hangs")

    class NoResets(_RefStandIn):
        def respond_with(self, answer: ServiceAnswer) -> None:
            if answer.kind == "reset":
                raise NotImplementedError("resets cannot be staged")
            super().respond_with(answer)

    skipped = _one("channel.connection-reset-transient", make=NoResets, tmp_path=tmp_path)
    assert skipped.outcome == "skipped" and skipped.message.endswith("cannot give the answer reset: resets cannot be staged")

    def crashes(request: ServiceRequest) -> Any:
        raise RuntimeError("adapter bug")

    for make, needle in (
        (crashes, "service adapter _Adapter raised RuntimeError: adapter bug"),
        (lambda r: object(), "a stand-in without settings, secrets, target, options, respond_with, received, close"),
    ):
        result = _one("channel.deliver-plain", make=make, tmp_path=tmp_path)
        assert result.outcome == "failed" and needle in result.message, result.message

    def with_settings(**changes: Any) -> Any:
        def make(request: ServiceRequest) -> Any:
            stand_in = _RefStandIn(request)
            for key, value in changes.items():
                setattr(stand_in, key, {**getattr(stand_in, key), **value} if isinstance(value, dict) else value)
            return stand_in

        return make

    unknown = _one("channel.deliver-plain", make=with_settings(settings={"nope": 1}), tmp_path=tmp_path)
    assert unknown.outcome == "failed" and "do not validate against RefChannelSettings" in unknown.message
    assert "channels.reference.nope" in unknown.message
    literal = _one("channel.deliver-plain", make=with_settings(settings={"token": "literal-secret-text"}), tmp_path=tmp_path)
    assert literal.outcome == "failed" and "channels.reference.token" in literal.message
    options = _one("channel.deliver-plain", make=with_settings(options={"x": 1}), tmp_path=tmp_path)
    assert options.outcome == "failed" and "delivery_options do not validate: DELIVERY_OPTIONS_INVALID" in options.message

    class NoSettings(ReferenceChannel):
        settings_class = None  # type: ignore[assignment]

    refused = _one("channel.deliver-plain", channel=NoSettings(), tmp_path=tmp_path)
    assert refused.outcome == "failed" and "declares no settings_class" in refused.message

    class Confused(_RefStandIn):
        def message_of(self, request: HttpRequest) -> ReceivedMessage:
            raise ValueError("cannot read that")

    confused = _one("channel.deliver-plain", make=Confused, tmp_path=tmp_path)
    assert confused.outcome == "failed" and "the stand-in: POST /messages: ValueError: cannot read that" in confused.message


def test_secrets_never_reach_errors_receipts_or_logs(tmp_path: Path) -> None:
    import logging

    class LogsToken(ReferenceChannel):
        def send(self, part: Any, route: Any) -> Any:
            logging.getLogger("reference.channel").info("sending with %s", self._settings.token.resolve())
            return super().send(part, route)

    class TokenInError(ReferenceChannel):
        def send(self, part: Any, route: Any) -> Any:
            try:
                return super().send(part, route)
            except PermanentDeliveryError as exc:
                raise PermanentDeliveryError(f"{exc.message} for {self._settings.token.resolve()}", code=exc.code) from None

    class TokenInReceipt(ReferenceChannel):
        def send(self, part: Any, route: Any) -> Any:
            receipt = super().send(part, route)
            return DeliveryReceipt(receipt_id=receipt.receipt_id, details={"auth": self._settings.token.resolve()})

    for channel, case_id, where in (
        (LogsToken(), "channel.deliver-plain", "a log record emitted while sending"),
        (TokenInError(), "channel.auth-rejected-permanent", "the error (message, code or args)"),
        (TokenInReceipt(), "channel.deliver-plain", "the receipt"),
    ):
        tokens: list[str] = []

        def make(request: ServiceRequest, tokens: list[str] = tokens) -> Any:
            stand_in = _RefStandIn(request)
            tokens.append(stand_in.token)
            return stand_in

        result = _one(case_id, channel=channel, make=make, tmp_path=tmp_path)
        assert result.outcome == "failed" and f"a secret of the channel's settings appears in {where}" in result.message
        assert tokens and tokens[0] not in json.dumps(result.to_json())  # the report itself shows it redacted
    quiet = logging.getLogger()
    assert not any(isinstance(h, logging.Handler) and type(h).__name__ == "_Capture" for h in quiet.handlers)


def test_a_send_that_does_not_return_fails_within_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler.conformance import channel as channel_adapter

    monkeypatch.setattr(channel_adapter, "SEND_LIMIT_MS", 1000)
    started = time.monotonic()
    result = _one("channel.timeout-transient", make=lambda r: _RefStandIn(r, timeout_s=60), tmp_path=tmp_path)
    assert result.outcome == "failed" and "send() did not return within" in result.message
    assert "the channel must give up on its own" in result.message
    assert time.monotonic() - started < 10


def test_what_every_channel_case_checks(tmp_path: Path) -> None:
    class NarrowedByConfigure(ReferenceChannel):
        def configure(self, settings: RefChannelSettings) -> None:
            super().configure(settings)
            self.capabilities = frozenset()

    narrowed = _one("channel.attachments-delivered", channel=NarrowedByConfigure(), tmp_path=tmp_path)
    assert narrowed.outcome == "skipped" and "configured for its stand-in, the channel does not declare" in narrowed.message

    class BadLimits(ReferenceChannel):
        limits = "many"  # type: ignore[assignment]

        def __init__(self) -> None:
            super().__init__()
            self.limits = "many"  # type: ignore[assignment]

    bad = _one("channel.deliver-plain", channel=BadLimits(), tmp_path=tmp_path)
    assert bad.outcome == "failed" and bad.message == "limits is str, not a ChannelLimits"

    claims = ReferenceChannel()
    claims.limits = attrs.evolve(claims.limits, supports_attachments=False, max_attachment_bytes=0)
    inconsistent = _one("channel.attachments-delivered", channel=claims, tmp_path=tmp_path)
    assert inconsistent.outcome == "failed"
    assert "declares the attachments capability but limits.supports_attachments is False" in inconsistent.message

    class RaisesSchedulerError(ReferenceChannel):
        def send(self, part: Any, route: Any) -> Any:
            raise SchedulerError("SECRET_UNRESOLVED", "secret env:X does not exist")

    wrong_type = _one("channel.rejected-permanent", channel=RaisesSchedulerError(), tmp_path=tmp_path)
    assert wrong_type.outcome == "failed" and "send() raised SchedulerError [SECRET_UNRESOLVED]" in wrong_type.message

    class LowerCaseCode(ReferenceChannel):
        def send(self, part: Any, route: Any) -> Any:
            raise PermanentDeliveryError("refused", code="refused")

    lower = _one("channel.rejected-permanent", channel=LowerCaseCode(), tmp_path=tmp_path)
    assert lower.outcome == "failed" and "error code 'refused' is not UPPER_SNAKE" in lower.message

    class NoRetryAfter(ReferenceChannel):
        def send(self, part: Any, route: Any) -> Any:
            try:
                return super().send(part, route)
            except TransientDeliveryError as exc:
                raise TransientDeliveryError(exc.message, code=exc.code) from None

    forgets = _one("channel.rate-limited-retry-after", channel=NoRetryAfter(), tmp_path=tmp_path)
    assert forgets.outcome == "failed"
    assert "retry_after_s: expected 7 (the service said Retry-After: 7), got None" in forgets.message

    class Permanent500(ReferenceChannel):
        def send(self, part: Any, route: Any) -> Any:
            try:
                return super().send(part, route)
            except TransientDeliveryError as exc:
                raise PermanentDeliveryError(exc.message, code=exc.code) from None

    too_final = _one("channel.server-error-transient", channel=Permanent500(), tmp_path=tmp_path)
    assert too_final.outcome == "failed" and too_final.message.startswith(
        "expected a TransientDeliveryError (the service answered server_error), got PermanentDeliveryError [REF_RETRY]")
    assert too_final.observed["attempts"][0]["service_saw"][0]["accepted"] is False


def test_http_stand_in_reads_forms(tmp_path: Path) -> None:
    boundary = "xYz"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n42\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"document\"; filename=\"a.bin\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + bytes(range(256)) + f"\r\n--{boundary}--\r\n".encode()
    request = HttpRequest(method="POST", path="/x", query={}, headers={"content-type": f"multipart/form-data; boundary={boundary}"},
                          body=body)
    fields, files = request.form()
    assert fields == {"chat_id": "42"} and files == {"document": ("a.bin", "application/octet-stream", bytes(range(256)))}
    plain = HttpRequest(method="POST", path="/x", query={}, headers={"content-type": "application/x-www-form-urlencoded"},
                        body=b"a=1&b=%C3%BC&c=")
    assert plain.form() == ({"a": "1", "b": "ü", "c": ""}, {})


def test_cli_channel_run_and_list(broken_installed: None) -> None:
    result = CliRunner().invoke(conformance_group, ["run", "channel", "broken"])
    assert result.exit_code == 1, result.output
    lines = result.stdout.rstrip("\n").splitlines()
    assert SUMMARY_RE.match(lines[-1]) and lines[-1].endswith("1 skipped")
    assert all(re.match(r"^((PASS|FAIL|SKIP) channel\.|     (result|attempts|part|limits|secrets|leaking_log_records): )", line)
               for line in lines[:-1]), lines
    listed = CliRunner().invoke(conformance_group, ["list", "channel"])
    assert listed.exit_code == 0
    assert "channel.attachments-refused-without-support  (negative)  [unless it declares attachments]" in listed.stdout
    assert "channel.idempotency-key-carried  (positive)  [requires idempotency-keys]" in listed.stdout
    unadapted = CliRunner().invoke(conformance_group, ["run", "channel", "broken-unadapted"])
    assert unadapted.exit_code == 1 and unadapted.stdout == "0 passed, 1 failed, 0 skipped\n"
    assert "CONFORMANCE_NO_SERVICE_ADAPTER" in unadapted.stderr


def test_ci_runs_a_channel(broken_installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ci.PROVIDERS_ENV, "channel:broken,channel:broken-unadapted")
    out = io.StringIO()
    assert ci.main(out=out) == 1
    text = out.getvalue()
    assert "== conformance channel broken" in text and "FAIL channel.rate-limited-retry-after: " in text
    assert text.count("FAIL channel broken-unadapted: CONFORMANCE_NO_SERVICE_ADAPTER") == 1
