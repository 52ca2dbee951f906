"""Tests for the conformance engine, its fixtures, CLI, CI runner and pytest adapter.

Real parts throughout: the fixtures on disk, entry-point loading of the test-only
``scheduler-executor-broken`` distribution (side-loaded from
``tests/support/``), real subprocesses and process groups in the honest reference
executor below, and real ``python -m`` / ``pytest`` child processes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from scheduler.conformance import ci
from scheduler.conformance.cli import conformance_group
from scheduler.conformance.engine import (
    FIXTURES_ENV,
    Case,
    fixtures_root,
    load_cases,
    load_corpus,
    load_schema,
    run_case,
    run_kind,
)
from scheduler.errors import SchedulerError
from scheduler.execution import ExecutionResult, StreamCapture

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "conformance-fixtures"
SUMMARY_RE = re.compile(r"^\d+ passed, \d+ failed, \d+ skipped$")
ALL_CAPS = frozenset({"structured-output", "verify", "env-policy", "cancel", "timeout", "process-group"})


def _fixture_files() -> list[Path]:
    return sorted((FIXTURES / "v1").glob("*/*.json"))


_SIDELOADED: list[str] = []


@pytest.fixture(scope="module")
def broken_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The broken test distribution, visible to entry-point discovery for this module only.

    It is side-loaded (a dist-info on sys.path), never installed, so a user's
    environment never carries deliberately broken plugins.
    """
    from kernel_testing import sideload_distribution

    paths = sideload_distribution(REPO / "tests" / "support" / "scheduler-executor-broken", tmp_path_factory.mktemp("sideload"))
    with pytest.MonkeyPatch.context() as mp:
        for entry in reversed(paths):
            mp.syspath_prepend(entry)
        _SIDELOADED[:] = paths
        names = {ep.name for ep in entry_points(group="scheduler.executors")}
        assert {"broken", "broken-import", "broken-api"} <= names
        yield
        _SIDELOADED.clear()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*_SIDELOADED, str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.pop(FIXTURES_ENV, None)
    return env


# --------------------------------------------------------------------------- an honest reference executor


class ReferenceExecutor:
    """A small but honest POSIX shell executor used to show the runner can report success.

    It runs ``/bin/sh -c`` in its own process group, records the process identity,
    streams output through the kernel's ``StreamRecorder``, honours the deadline and
    cancellation (terminating the group and recording it), parses json/ndjson and
    runs the verification check.
    """

    plugin_api = 1

    def __init__(self, capabilities: frozenset[str] = ALL_CAPS) -> None:
        self.capabilities = capabilities

    def _env(self, request: Any) -> dict[str, str]:
        if request.job.shell_env_policy == "inherit":
            env = dict(os.environ)
        else:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
        env.update(request.extra_env)
        return env

    def _run(self, command: str, request: Any, control: Any, *, deadline_ms: int, prefix: str, stdin: str | None):
        from scheduler.artifacts import StreamRecorder

        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=request.job.working_dir,
            env=self._env(request),
            start_new_session=True,
        )
        control.record_process(proc.pid, os.getpgid(proc.pid), f"{time.time():.6f}")
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
                os.killpg(proc.pid, signal.SIGTERM)
                control.record_termination("SIGTERM")
                try:
                    proc.wait(2)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    control.record_termination("SIGKILL")
                    proc.wait()
                break
            control.wait_cancelled(0.01)
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
        from scheduler.artifacts import read_artifact

        job = request.job
        stopped, code, out, err = self._run(
            job.payload_message, request, control, deadline_ms=request.deadline_ms, prefix="", stdin=job.stdin_text
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


# --------------------------------------------------------------------------- fixtures and schema


def test_schema_is_valid_draft_2020_12() -> None:
    from jsonschema import Draft202012Validator

    schema = load_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", _fixture_files(), ids=lambda p: p.name)
def test_every_fixture_file_validates_against_the_schema(path: Path) -> None:
    from jsonschema import Draft202012Validator

    data = json.loads(path.read_text())
    errors = list(Draft202012Validator(load_schema()).iter_errors(data))
    assert errors == [], [e.message for e in errors]
    assert data["kind"] == path.parent.name
    assert all(case["kind"] == data["kind"] for case in data["cases"])


def test_case_ids_are_unique_across_the_corpus() -> None:
    ids = [case["id"] for path in _fixture_files() for case in json.loads(path.read_text())["cases"]]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert len(load_corpus()) == len(ids)


def test_executor_corpus_covers_the_required_cases() -> None:
    cases = {c.id: c for c in load_cases("executor")}
    negatives = {c.id: c.expect["error_code"] for c in cases.values() if c.polarity == "negative"}
    assert negatives == {
        "executor.exit-nonzero": "EXIT_NONZERO",
        "executor.run-timeout": "RUN_TIMEOUT",
        "executor.verify-fail-error": "VERIFY_FAILED",
        "executor.verify-timeout": "VERIFY_TIMEOUT",
    }
    assert cases["executor.cancel-running"].input["cancel_after_ms"] == 200
    assert cases["executor.run-timeout"].input["job"]["run_timeout_ms"] == 300
    huge = cases["executor.huge-output-offloaded"].expect
    assert huge["stdout_bytes"] == 5_000_000 and huge["artifact_offloaded"] is True
    assert huge["stdout_sha256"] == hashlib.sha256(bytes(5_000_000)).hexdigest()
    assert cases["executor.binary-output"].expect["stdout_sha256"] == hashlib.sha256(b"\x00\x01\xff").hexdigest()
    requires = {c.id: set(c.requires) for c in cases.values()}
    assert requires["executor.structured-json-valid"] == {"structured-output"}
    assert requires["executor.verify-timeout"] == {"verify"}
    assert requires["executor.env-minimal-hides-secret"] == {"env-policy"}
    assert requires["executor.cancel-running"] == {"cancel"}
    assert requires["executor.run-timeout"] == {"timeout"}
    assert requires["executor.process-identity-recorded"] == {"process-group"}


def _copy_corpus(tmp_path: Path) -> Path:
    root = tmp_path / "conformance-fixtures"
    shutil.copytree(FIXTURES, root)
    return root


def _mutate(root: Path, filename: str, change: Any) -> None:
    path = root / "v1" / "executor" / filename
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _case(data: dict[str, Any], case_id: str) -> dict[str, Any]:
    return next(c for c in data["cases"] if c["id"] == case_id)


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
    "duplicate-id": ("env.json", lambda d: d["cases"][0].update(id="executor.exit-zero-stdout"), "duplicate case id"),
    "kind-mismatch": ("env.json", lambda d: d["cases"][0].update(kind="channel"), "does not match the file kind"),
    "invalid-job-spec": ("env.json", lambda d: d["cases"][0]["input"]["job"].update(run_timeout=5), "run_timeout"),
    "not-json": ("env.json", None, "not valid JSON"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_mutated_fixture_is_rejected(tmp_path: Path, name: str) -> None:
    filename, change, needle = MUTATIONS[name]
    root = _copy_corpus(tmp_path)
    if change is None:
        (root / "v1" / "executor" / filename).write_text('{"kind": "executor", "cases": [')
    else:
        _mutate(root, filename, change)
    with pytest.raises(SchedulerError) as info:
        load_cases("executor", root)
    assert info.value.code == "CONFORMANCE_FIXTURE_INVALID"
    assert f"v1/executor/{filename}" in info.value.message  # names the file ...
    assert needle in info.value.message + json.dumps(info.value.details)  # ... and what is wrong, where


def test_a_mutated_fixture_fails_the_run_and_the_cli_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _copy_corpus(tmp_path)
    _mutate(root, "basic.json", lambda d: _case(d, "executor.exit-nonzero")["expect"].pop("error_code"))
    monkeypatch.setenv(FIXTURES_ENV, str(root))
    assert fixtures_root() == root
    report = run_kind("executor", "anything", provider=ReferenceExecutor())
    assert not report.ok and report.error["code"] == "CONFORMANCE_FIXTURE_INVALID"
    result = CliRunner().invoke(conformance_group, ["list", "executor", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["code"] == "CONFORMANCE_FIXTURE_INVALID"


def test_packaged_fixtures_are_the_repo_fixtures() -> None:
    """``scheduler/conformance/fixtures`` is a symlink to the one corpus (what a wheel ships), never a copy."""
    packaged = REPO / "scheduler" / "conformance" / "fixtures"
    assert packaged.is_symlink() and packaged.resolve() == FIXTURES


def test_fixture_root_from_env_and_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FIXTURES_ENV, raising=False)
    assert fixtures_root() == FIXTURES
    monkeypatch.setenv(FIXTURES_ENV, str(tmp_path / "nope"))
    with pytest.raises(SchedulerError) as info:
        load_cases("executor")
    assert info.value.code == "CONFORMANCE_FIXTURES_NOT_FOUND"
    with pytest.raises(SchedulerError) as info:
        load_cases("gizmo", FIXTURES)
    assert info.value.code == "CONFORMANCE_KIND_UNKNOWN"


# --------------------------------------------------------------------------- the broken provider


def test_broken_executor_is_reported_as_failing(broken_installed: None) -> None:
    report = run_kind("executor", "broken")
    assert report.error is None
    assert report.failed > 3 and not report.ok
    assert report.passed + report.failed + report.skipped == len(load_cases("executor"))
    assert report.summary_line() == f"{report.passed} passed, {report.failed} failed, {report.skipped} skipped"
    assert SUMMARY_RE.match(report.summary_line())
    by_id = {r.id: r for r in report.results}
    for case_id in (
        "executor.exit-nonzero",
        "executor.run-timeout",
        "executor.cancel-running",
        "executor.binary-output",
        "executor.huge-output-offloaded",
        "executor.process-identity-recorded",
        "executor.structured-json-invalid",
        "executor.verify-fail-error",
    ):
        assert by_id[case_id].outcome == "failed", case_id
    assert "expected 'EXIT_NONZERO', got None" in by_id["executor.exit-nonzero"].message
    assert "stdout_bytes: expected 3" in by_id["executor.binary-output"].message
    assert "record_process" in by_id["executor.process-identity-recorded"].message
    assert "not offloaded" in by_id["executor.huge-output-offloaded"].message
    as_json = report.to_json()
    assert as_json["ok"] is False and as_json["failed"] == report.failed and len(as_json["results"]) == len(report.results)
    json.dumps(as_json)


def test_broken_import_is_a_load_failure_naming_the_distribution(broken_installed: None) -> None:
    report = run_kind("executor", "broken-import")
    assert report.error is not None and report.error["code"] == "PLUGIN_LOAD_FAILED"
    assert "scheduler-executor-broken" in report.error["message"]
    assert "ImportError" in report.error["message"]
    assert report.failed == len(load_cases("executor")) and report.passed == 0 and not report.ok
    assert all("PLUGIN_LOAD_FAILED" in r.message for r in report.results)
    assert report.to_json()["code"] == "PLUGIN_LOAD_FAILED"


def test_broken_api_is_an_api_mismatch(broken_installed: None) -> None:
    report = run_kind("executor", "broken-api", filter="executor.exit-*")
    assert report.error is not None and report.error["code"] == "PLUGIN_API_MISMATCH"
    assert "99" in report.error["message"]
    assert [r.outcome for r in report.results] == ["failed", "failed"]


def test_missing_provider_is_a_failed_report() -> None:
    report = run_kind("executor", f"missing-{uuid.uuid4().hex[:8]}", filter="executor.exit-zero-stdout")
    assert report.error["code"] == "PLUGIN_NOT_FOUND" and report.failed == 1 and not report.ok


# --------------------------------------------------------------------------- the runner reports success too


def test_honest_reference_executor_passes_every_case() -> None:
    lines: list[str] = []
    report = run_kind("executor", "reference", provider=ReferenceExecutor(), on_result=lambda r: lines.append(r.id))
    failures = {r.id: r.message for r in report.results if r.outcome != "passed"}
    assert failures == {}
    assert report.ok and report.passed == len(load_cases("executor")) and report.skipped == 0
    assert lines == [r.id for r in report.results]
    assert "CONFORMANCE_API_TOKEN" not in os.environ  # input.env was restored


def test_missing_capabilities_skip_cases_instead_of_passing_them() -> None:
    report = run_kind("executor", "reference", provider=ReferenceExecutor(capabilities=frozenset()))
    requiring = [c.id for c in load_cases("executor") if c.requires]
    assert sorted(r.id for r in report.results if r.outcome == "skipped") == sorted(requiring)
    assert report.failed == 0 and report.passed == len(load_cases("executor")) - len(requiring)
    skip = next(r for r in report.results if r.id == "executor.verify-pass")
    assert skip.message == "provider does not declare capability verify"


def test_case_filter_by_glob_list_and_predicate() -> None:
    provider = ReferenceExecutor()
    assert [r.id for r in run_kind("executor", "ref", provider, filter="executor.exit-*").results] == [
        "executor.exit-zero-stdout",
        "executor.exit-nonzero",
    ]
    assert len(run_kind("executor", "ref", provider, filter=["executor.stdin-*", "executor.binary-*"]).results) == 2
    assert run_kind("executor", "ref", provider, filter=lambda c: c.polarity == "negative" and not c.requires).passed == 1
    nothing = run_kind("executor", "ref", provider, filter="executor.no-such-case*")
    assert not nothing.ok and nothing.error["code"] == "CONFORMANCE_NO_CASES"
    result = CliRunner().invoke(conformance_group, ["run", "executor", "ref", "--case", "executor.no-such-case*"])
    assert result.exit_code == 1 and "CONFORMANCE_NO_CASES" in result.stderr


def _one_case(**expect: Any) -> Case:
    job = {"name": "engine probe", "schedule_kind": "manual", "payload_message": "true", "run_timeout_ms": 60_000}
    return Case(id="probe.case", description="probe", kind="executor", polarity="positive", input={"job": job}, expect=expect)


class _Spy:
    plugin_api = 1
    capabilities = frozenset()

    def __init__(self, behaviour: Any) -> None:
        self.behaviour = behaviour
        self.requests: list[Any] = []

    def execute(self, request: Any, control: Any) -> Any:
        self.requests.append(request)
        return self.behaviour(request, control)


def test_execution_request_is_built_like_the_dispatcher_does(tmp_path: Path) -> None:
    spy = _Spy(lambda request, control: ExecutionResult(status="ok", exit_code=0))
    result = run_case(spy, _one_case(status="ok"), tmp_path)
    assert result.outcome == "passed", result.message
    (request,) = spy.requests
    assert uuid.UUID(request.run_id) and request.attempt == 1
    assert request.deadline_ms == request.started_at_ms + 60_000
    assert request.artifacts_dir == request.artifacts_root / "runs" / request.run_id and request.artifacts_dir.is_dir()
    assert Path(request.job.working_dir).is_dir() and str(tmp_path) in request.job.working_dir


def test_a_provider_that_raises_fails_the_case_with_the_exception(tmp_path: Path) -> None:
    def boom(request: Any, control: Any) -> Any:
        raise RuntimeError("kaboom in execute")

    result = run_case(_Spy(boom), _one_case(status="ok"), tmp_path)
    assert result.outcome == "failed" and "RuntimeError" in result.message and "kaboom in execute" in result.message

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


def test_garbage_results_and_hung_providers_fail_without_crashing(tmp_path: Path) -> None:
    assert "not an ExecutionResult" in run_case(_Spy(lambda r, c: {"status": "ok"}), _one_case(status="ok"), tmp_path).message
    bad_status = run_case(_Spy(lambda r, c: ExecutionResult(status="great")), _one_case(), tmp_path)
    assert bad_status.outcome == "failed" and "not one of" in bad_status.message
    lying = StreamCapture(bytes=1, sha256="0" * 64, excerpt="x", artifact="../../etc/passwd")
    tampered = run_case(
        _Spy(lambda r, c: ExecutionResult(status="ok", stdout=lying)), _one_case(artifact_offloaded=True), tmp_path
    )
    assert tampered.outcome == "failed" and "ARTIFACT_PATH_INVALID" in tampered.message

    def hang(request: Any, control: Any) -> Any:
        control.wait_cancelled(30)  # ignores its deadline until the engine cancels it
        return ExecutionResult(status="cancelled")

    started = time.monotonic()
    result = run_case(_Spy(hang), _one_case(max_duration_ms=100), tmp_path)
    assert result.outcome == "failed" and "did not return within" in result.message
    assert time.monotonic() - started < 20


def test_kind_without_adapter_is_unsupported(tmp_path: Path) -> None:
    root = _copy_corpus(tmp_path)
    (root / "v1" / "channel").mkdir()
    (root / "v1" / "channel" / "basic.json").write_text(
        json.dumps(
            {
                "kind": "channel",
                "cases": [
                    {
                        "id": "channel.deliver-once",
                        "description": "d",
                        "kind": "channel",
                        "polarity": "positive",
                        "input": {},
                        "expect": {},
                    }
                ],
            }
        )
    )
    report = run_kind("channel", "webhook", provider=object(), root=root)
    assert report.error["code"] == "CONFORMANCE_KIND_UNSUPPORTED" and "no adapter for kind channel" in report.error["message"]
    assert report.failed == 1 and not report.ok
    empty = run_kind("authorization", "opa", provider=object(), root=root)
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
    assert all(re.match(r"^(PASS|FAIL|SKIP) executor\.", line) for line in lines[:-1])


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


def test_cli_reports_load_failures(broken_installed: None) -> None:
    result = CliRunner().invoke(conformance_group, ["run", "executor", "broken-api", "--json"])
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["ok"] is False and payload["code"] == "PLUGIN_API_MISMATCH"
    human = CliRunner().invoke(conformance_group, ["run", "executor", "broken-import"])
    assert human.exit_code == 1 and SUMMARY_RE.match(_last_line(human.stdout))
    assert "PLUGIN_LOAD_FAILED" in human.stderr and "scheduler-executor-broken" in human.stderr


def test_cli_list() -> None:
    result = CliRunner().invoke(conformance_group, ["list", "executor"])
    assert result.exit_code == 0
    ids = [line.split()[0] for line in result.stdout.splitlines()]
    assert ids == [c.id for c in load_cases("executor")]
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


def test_ci_runner(broken_installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ci.PROVIDERS_ENV, "executor:broken")
    out = io.StringIO()
    assert ci.main(out=out) == 1
    assert SUMMARY_RE.match(_last_line(out.getvalue()))

    monkeypatch.setenv(ci.PROVIDERS_ENV, "executor:not-installed-anywhere")
    monkeypatch.delenv(ci.ALLOW_MISSING_ENV, raising=False)
    out = io.StringIO()
    assert ci.main(out=out) == 1
    assert "CI must install" in out.getvalue() and "PLUGIN_NOT_FOUND" in out.getvalue()

    monkeypatch.setenv(ci.ALLOW_MISSING_ENV, "1")
    out = io.StringIO()
    assert ci.main(out=out) == 0
    assert _last_line(out.getvalue()) == f"0 passed, 0 failed, {len(load_cases('executor'))} skipped"
    monkeypatch.delenv(ci.PROVIDERS_ENV)
    assert ci.providers_to_run() == [("executor", "shell")]


# --------------------------------------------------------------------------- pytest adapter


def test_pytest_adapter_reports_failures_skips_and_passes(tmp_path: Path, broken_installed: None) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["scheduler.conformance.pytest_plugin"]\n')
    (tmp_path / "test_plugin_conformance.py").write_text(
        textwrap.dedent(
            """
            import hashlib
            import subprocess

            from scheduler.conformance.pytest_plugin import ExecutorConformance
            from scheduler.execution import ExecutionResult, StreamCapture


            class Honest:
                plugin_api = 1
                capabilities = frozenset()

                def execute(self, request, control):
                    proc = subprocess.run(["/bin/sh", "-c", request.job.payload_message], capture_output=True)
                    out = StreamCapture(bytes=len(proc.stdout), sha256=hashlib.sha256(proc.stdout).hexdigest(),
                                        excerpt=proc.stdout.decode(errors="replace"))
                    if proc.returncode:
                        return ExecutionResult(status="error", exit_code=proc.returncode, error_code="EXIT_NONZERO", stdout=out)
                    return ExecutionResult(status="ok", exit_code=0, stdout=out)


            class TestBroken(ExecutorConformance):
                provider_name = "broken"
                case_filter = ["executor.exit-*", "executor.binary-output"]


            class TestBrokenApi(ExecutorConformance):
                provider_name = "broken-api"
                case_filter = "executor.exit-zero-stdout"


            class TestHonest(ExecutorConformance):
                case_filter = ["executor.exit-*", "executor.binary-output", "executor.process-identity-recorded"]

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
    assert "FAILED test_plugin_conformance.py::TestBrokenApi::test_case[executor.exit-zero-stdout]" in out
    assert "PLUGIN_API_MISMATCH" in out
    assert "provider does not declare capability process-group" in out
    summary = _last_line(out)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped)", summary)}
    # Broken: 3 failed; BrokenApi: 1 failed; Honest: 3 passed + 1 skipped; the ids fixture test passes.
    assert counts == {"failed": 4, "passed": 4, "skipped": 1}, summary


def test_engine_cli_and_ci_do_not_import_pytest() -> None:
    code = (
        "import sys, scheduler.conformance, scheduler.conformance.cli, scheduler.conformance.ci; "
        "sys.exit('pytest' in sys.modules or '_pytest' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_child_env(), check=False, timeout=60)
    assert proc.returncode == 0
