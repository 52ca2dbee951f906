"""The conformance engine: load versioned JSON cases and run them against one provider.

A provider is loaded through its entry point exactly as production loads it
(``scheduler.plugins.loader.load_provider``), each case runs in its own temporary
directory, and every outcome is one of ``passed``, ``failed`` or ``skipped``. The
engine never lets a case crash the run: a provider that raises, hangs past its
deadline or returns garbage fails that case and the run goes on.

Running cases is kind-specific, so each kind has a ``KindAdapter`` registered in
``ADAPTERS``; only ``executor`` has one today. This module deliberately does not
import pytest (``pytest_plugin`` is the opt-in pytest adapter).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from scheduler.errors import SchedulerError

#: The fixture format version this engine reads (a directory under the fixtures root).
FIXTURE_VERSION = "v1"
#: Environment variable naming a ``conformance-fixtures/`` directory (or one version directory in it).
FIXTURES_ENV = "SCHEDULER_CONFORMANCE_FIXTURES"
#: Schema file inside a version directory.
SCHEMA_FILE = "case.schema.json"
#: Possible case outcomes.
OUTCOMES = ("passed", "failed", "skipped")
#: How long past its own deadline (run timeout + verification timeout) a provider may take to return.
HARD_GRACE_MS = 15_000
#: Extra wait, past ``max_duration_ms``, before the engine gives up on a provider and cancels it.
MAX_DURATION_GRACE_MS = 2_000

#: Serialises cases that patch ``os.environ`` (the environment is process-global).
_ENV_LOCK = threading.Lock()

CaseFilter = str | Iterable[str] | Callable[["Case"], bool] | None


# --------------------------------------------------------------------------- models


@attrs.frozen(kw_only=True)
class Case:
    """One validated conformance case, as read from a fixture file."""

    id: str
    description: str
    kind: str
    polarity: str
    requires: tuple[str, ...] = ()
    input: dict[str, Any] = attrs.Factory(dict)
    expect: dict[str, Any] = attrs.Factory(dict)
    #: Fixture file the case came from, relative to the fixtures root.
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        """The case as a JSON object (for ``conformance list --json``)."""
        return {
            "id": self.id,
            "description": self.description,
            "kind": self.kind,
            "polarity": self.polarity,
            "requires": list(self.requires),
            "source": self.source,
        }


@attrs.frozen(kw_only=True)
class CaseResult:
    """The outcome of one case: ``passed``, ``failed`` (with why) or ``skipped`` (with why)."""

    id: str
    outcome: str = attrs.field(validator=attrs.validators.in_(OUTCOMES))
    message: str = ""
    duration_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON object."""
        return {"id": self.id, "outcome": self.outcome, "message": self.message, "duration_ms": self.duration_ms}


@attrs.frozen(kw_only=True)
class Report:
    """All results of running one kind's cases against one provider.

    ``error`` is set (``{"code", "message"}``) when the run could not start at all:
    the provider failed to load, the fixtures are invalid, or the kind has no
    adapter. Every selected case is then reported as failed, so the counts never
    make a broken provider look clean.
    """

    kind: str
    name: str
    results: tuple[CaseResult, ...] = ()
    error: dict[str, str] | None = None

    @property
    def passed(self) -> int:
        """Number of passed cases."""
        return sum(1 for r in self.results if r.outcome == "passed")

    @property
    def failed(self) -> int:
        """Number of failed cases."""
        return sum(1 for r in self.results if r.outcome == "failed")

    @property
    def skipped(self) -> int:
        """Number of skipped cases."""
        return sum(1 for r in self.results if r.outcome == "skipped")

    @property
    def ok(self) -> bool:
        """True when nothing failed and the run could start."""
        return self.error is None and self.failed == 0

    def summary_line(self) -> str:
        """``N passed, N failed, N skipped`` (the last line of the human output; CI greps it)."""
        return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped"

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON object; on a start failure it also carries ``error`` and ``code``."""
        out: dict[str, Any] = {
            "ok": self.ok,
            "kind": self.kind,
            "name": self.name,
            "passed": self.passed,
            "failed": self.failed,
            "skipped": self.skipped,
            "results": [r.to_json() for r in self.results],
        }
        if self.error is not None:
            out["error"] = self.error["message"]
            out["code"] = self.error["code"]
        elif self.failed:
            out["error"] = f"{self.failed} conformance case(s) failed"
            out["code"] = "CONFORMANCE_FAILED"
        return out


@attrs.frozen(kw_only=True)
class KindAdapter:
    """How cases of one provider kind are checked at load time and run.

    ``check_case`` validates kind-specific input beyond the JSON Schema (for
    executors: the job spec) and raises ``SchedulerError`` or ``ValueError``.
    ``run`` executes the case against the provider and returns the list of
    problems found (empty = passed).
    """

    kind: str
    check_case: Callable[[Case], None]
    run: Callable[[Any, Case, Path], list[str]]


#: Provider kind -> adapter. Kinds without an entry report ``CONFORMANCE_KIND_UNSUPPORTED`` if they have cases.
ADAPTERS: dict[str, KindAdapter] = {}


def register_adapter(adapter: KindAdapter) -> None:
    """Register (or replace) the adapter for a kind; this is how channel/evidence/... support is added."""
    ADAPTERS[adapter.kind] = adapter


# --------------------------------------------------------------------------- fixtures


def fixtures_root(root: str | Path | None = None) -> Path:
    """The ``conformance-fixtures/`` directory to read.

    Order: the explicit ``root``; ``$SCHEDULER_CONFORMANCE_FIXTURES``; the copy
    shipped as ``scheduler/conformance/fixtures/`` (in a checkout that is a
    symlink to the repo's ``conformance-fixtures/``, in a wheel the packaged
    files); else the first ``conformance-fixtures/`` found walking up from the
    ``scheduler`` package (a checkout where the symlink is missing). The shipped
    copy comes before the walk so an unrelated directory above a virtualenv is
    never picked up. Raises ``CONFORMANCE_FIXTURES_NOT_FOUND`` when none exists.
    """
    explicit = root if root is not None else os.environ.get(FIXTURES_ENV) or None
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.is_dir():
            raise SchedulerError("CONFORMANCE_FIXTURES_NOT_FOUND", f"conformance fixtures directory does not exist: {path}")
        return path
    packaged = Path(__file__).resolve().parent / "fixtures"
    if (packaged / FIXTURE_VERSION / SCHEMA_FILE).is_file():
        return packaged.resolve()
    import scheduler

    start = Path(scheduler.__file__).resolve().parent
    for directory in (start, *start.parents):
        candidate = directory / "conformance-fixtures"
        if (candidate / FIXTURE_VERSION / SCHEMA_FILE).is_file():
            return candidate
    raise SchedulerError(
        "CONFORMANCE_FIXTURES_NOT_FOUND",
        f"no conformance fixtures packaged in {packaged} nor found above {start}; set {FIXTURES_ENV}",
    )


def version_dir(root: str | Path | None = None) -> Path:
    """The directory of the fixture version this engine reads (``<root>/v1``, or ``root`` itself if it is one)."""
    base = fixtures_root(root)
    if (base / SCHEMA_FILE).is_file():
        return base
    return base / FIXTURE_VERSION


def load_schema(root: str | Path | None = None) -> dict[str, Any]:
    """The case-file JSON Schema of this fixture version (itself checked against draft 2020-12)."""
    from jsonschema import Draft202012Validator

    path = version_dir(root) / SCHEMA_FILE
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SchedulerError("CONFORMANCE_FIXTURE_INVALID", f"{path}: cannot read the case schema: {exc}") from None
    Draft202012Validator.check_schema(schema)
    return schema


def _invalid(path: str, where: str, message: str, details: Any = None) -> SchedulerError:
    return SchedulerError("CONFORMANCE_FIXTURE_INVALID", f"{path}: {where}: {message}", details=details)


def validate_case_file(data: Any, schema: dict[str, Any], *, source: str) -> None:
    """Validate one parsed case file against the schema; raise ``CONFORMANCE_FIXTURE_INVALID`` naming file and path.

    Every schema error is listed in ``details`` so a fixture author sees them all at once.
    """
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        details = [{"path": e.json_path, "error": e.message} for e in errors]
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise _invalid(source, first.json_path, first.message + more, details)


def _fixture_files(vdir: Path) -> list[Path]:
    return sorted(p for p in vdir.glob("*/*.json") if p.is_file())


def load_corpus(root: str | Path | None = None) -> list[Case]:
    """Load and validate every case file of every kind; the first invalid file raises ``CONFORMANCE_FIXTURE_INVALID``.

    Beyond the schema it checks that each case's kind matches its file and
    directory, that ids are unique across the whole corpus, and the kind
    adapter's own checks (an executor case's job must be a valid job spec).
    """
    vdir = version_dir(root)
    schema = load_schema(root)
    base = vdir.parent
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for path in _fixture_files(vdir):
        source = str(path.relative_to(base))
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise _invalid(source, "$", f"not valid JSON: {exc}") from None
        except OSError as exc:
            raise _invalid(source, "$", f"cannot read: {exc}") from None
        validate_case_file(data, schema, source=source)
        file_kind = data["kind"]
        if path.parent.name != file_kind:
            raise _invalid(source, "$.kind", f"file kind {file_kind!r} does not match its directory {path.parent.name!r}")
        for index, raw in enumerate(data["cases"]):
            where = f"$.cases[{index}]"
            if raw["kind"] != file_kind:
                raise _invalid(source, f"{where}.kind", f"case kind {raw['kind']!r} does not match the file kind {file_kind!r}")
            if raw["id"] in seen:
                raise _invalid(source, f"{where}.id", f"duplicate case id {raw['id']!r} (first defined in {seen[raw['id']]})")
            seen[raw["id"]] = source
            case = Case(
                id=raw["id"],
                description=raw["description"],
                kind=raw["kind"],
                polarity=raw["polarity"],
                requires=tuple(raw.get("requires", ())),
                input=raw["input"],
                expect=raw["expect"],
                source=source,
            )
            adapter = ADAPTERS.get(case.kind)
            if adapter is not None:
                try:
                    adapter.check_case(case)
                except SchedulerError as exc:
                    raise _invalid(source, f"{where}.input", f"{exc.code}: {exc.message}", exc.details) from None
                except (ValueError, TypeError) as exc:
                    raise _invalid(source, f"{where}.input", str(exc)) from None
            cases.append(case)
    return cases


def load_cases(kind: str, root: str | Path | None = None) -> list[Case]:
    """The validated cases of one provider kind (the whole corpus is validated first)."""
    from scheduler.plugins.protocols import PROVIDER_KINDS

    if kind not in PROVIDER_KINDS:
        raise SchedulerError("CONFORMANCE_KIND_UNKNOWN", f"unknown provider kind {kind!r} (known: {', '.join(PROVIDER_KINDS)})")
    return [c for c in load_corpus(root) if c.kind == kind]


def select_cases(cases: Iterable[Case], filter: CaseFilter = None) -> list[Case]:
    """Cases matching ``filter``: an id glob, a list of globs (any matches), or a predicate."""
    if filter is None:
        return list(cases)
    if callable(filter):
        return [c for c in cases if filter(c)]
    globs = [filter] if isinstance(filter, str) else list(filter)
    return [c for c in cases if any(fnmatch.fnmatchcase(c.id, g) for g in globs)]


# --------------------------------------------------------------------------- running


def _elapsed_ms(start: float) -> int:
    return int((time.monotonic() - start) * 1000)


def run_case(provider: Any, case: Case, workdir: str | Path) -> CaseResult:
    """Run one case against an already loaded provider in ``workdir`` (an empty directory the case may use).

    Skips when the provider does not declare every capability the case
    requires. Never raises: any exception, from the provider or the engine, is a
    failed case whose message names it.
    """
    start = time.monotonic()
    try:
        declared = set(getattr(provider, "capabilities", ()) or ())
        missing = [c for c in case.requires if c not in declared]
        if missing:
            return CaseResult(
                id=case.id,
                outcome="skipped",
                message=f"provider does not declare capability {', '.join(missing)}",
                duration_ms=_elapsed_ms(start),
            )
        adapter = ADAPTERS.get(case.kind)
        if adapter is None:
            return CaseResult(
                id=case.id,
                outcome="failed",
                message=f"CONFORMANCE_KIND_UNSUPPORTED: no adapter for kind {case.kind}",
                duration_ms=_elapsed_ms(start),
            )
        problems = adapter.run(provider, case, Path(workdir))
    except Exception as exc:  # noqa: BLE001 - the engine itself must never crash a run
        return CaseResult(
            id=case.id,
            outcome="failed",
            message=f"conformance engine error: {type(exc).__name__}: {exc}",
            duration_ms=_elapsed_ms(start),
        )
    if problems:
        return CaseResult(id=case.id, outcome="failed", message="; ".join(problems), duration_ms=_elapsed_ms(start))
    return CaseResult(id=case.id, outcome="passed", duration_ms=_elapsed_ms(start))


def _not_run(cases: list[Case], code: str, message: str) -> tuple[CaseResult, ...]:
    return tuple(CaseResult(id=c.id, outcome="failed", message=f"not run: {code}: {message}") for c in cases)


def run_kind(
    kind: str,
    name: str,
    provider: Any = None,
    *,
    filter: CaseFilter = None,
    root: str | Path | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
) -> Report:
    """Run every (selected) case of ``kind`` against the provider ``name`` and return the report.

    The provider is loaded through its entry point (``load_provider``) unless one
    is given. A load failure, invalid fixtures or an unsupported kind produce a
    report with ``error`` set (and every selected case failed), never a traceback;
    so does a ``filter`` that selects nothing (``CONFORMANCE_NO_CASES``).
    ``on_result`` is called after each case (the CLI streams its lines through it).
    """
    try:
        cases = select_cases(load_cases(kind, root), filter)
    except SchedulerError as exc:
        return Report(kind=kind, name=name, error={"code": exc.code, "message": exc.message})
    if filter is not None and not cases:  # a mistyped --case glob must not look like a clean run
        return Report(
            kind=kind, name=name, error={"code": "CONFORMANCE_NO_CASES", "message": f"no {kind} case matches the filter"}
        )
    if cases and kind not in ADAPTERS:
        message = f"no adapter for kind {kind}"
        return Report(
            kind=kind,
            name=name,
            results=_not_run(cases, "CONFORMANCE_KIND_UNSUPPORTED", message),
            error={"code": "CONFORMANCE_KIND_UNSUPPORTED", "message": message},
        )
    if provider is None:
        from scheduler.plugins.loader import load_provider

        try:
            provider = load_provider(kind, name)
        except SchedulerError as exc:
            return Report(
                kind=kind,
                name=name,
                results=_not_run(cases, exc.code, exc.message),
                error={"code": exc.code, "message": exc.message},
            )
        except Exception as exc:  # noqa: BLE001 - a loader bug must still be a report, not a traceback
            message = f"{kind} driver {name!r} failed to load: {type(exc).__name__}: {exc}"
            return Report(
                kind=kind,
                name=name,
                results=_not_run(cases, "PLUGIN_LOAD_FAILED", message),
                error={"code": "PLUGIN_LOAD_FAILED", "message": message},
            )
    results: list[CaseResult] = []
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="scheduler-conformance-") as tmp:
            result = run_case(provider, case, Path(tmp))
        results.append(result)
        if on_result is not None:
            on_result(result)
    return Report(kind=kind, name=name, results=tuple(results))


# --------------------------------------------------------------------------- executor adapter


@contextlib.contextmanager
def _patched_environ(extra: dict[str, str]) -> Iterator[None]:
    """Set ``extra`` in ``os.environ`` for the duration, restoring every previous value after."""
    if not extra:
        yield
        return
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            yield
        finally:
            for key, old in saved.items():
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _check_executor_case(case: Case) -> None:
    """Load-time check: the case's job must be a valid job spec."""
    from scheduler.spec import validate_spec

    validate_spec(case.input["job"], check_past=False)


def _executor_job(case: Case, workdir: Path) -> Any:
    from scheduler.spec import validate_spec

    job = dict(case.input["job"])
    if "working_dir" not in job:
        work = workdir / "work"
        work.mkdir(parents=True, exist_ok=True)
        job["working_dir"] = str(work)
    return validate_spec(job, check_past=False)


def _run_executor_case(provider: Any, case: Case, workdir: Path) -> list[str]:
    """Run one executor case: build the request and a ``LocalRunControl``, execute, compare with ``expect``."""
    from scheduler.artifacts import run_dir
    from scheduler.execution import ExecutionRequest, LocalRunControl
    from scheduler.timeutil import now_ms

    job = _executor_job(case, workdir)
    root = workdir / "artifacts"
    root.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex
    job_id = uuid.uuid4().hex
    started = now_ms()
    request = ExecutionRequest(
        run_id=run_id,
        job_id=job_id,
        job=job,
        attempt=1,
        scheduled_for_ms=started,
        started_at_ms=started,
        deadline_ms=started + job.run_timeout_ms,
        artifacts_dir=run_dir(root, run_id),
        artifacts_root=root,
        extra_env={"SCHEDULER_RUN_ID": run_id, "SCHEDULER_JOB_ID": job_id},
    )
    control = LocalRunControl()
    expect = case.expect

    # How long to wait for execute(): its own deadline plus verification plus grace, and not
    # much longer than max_duration_ms when the case bounds it (the case fails past that anyway).
    limit_ms = job.run_timeout_ms + (job.verify_timeout_s * 1000 if job.verify_shell else 0) + HARD_GRACE_MS
    if "max_duration_ms" in expect:
        limit_ms = min(limit_ms, expect["max_duration_ms"] + MAX_DURATION_GRACE_MS)

    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = provider.execute(request, control)
        except BaseException as exc:  # noqa: BLE001 - reported as a failed case, never propagated
            outcome["exc"] = exc

    with _patched_environ(dict(case.input.get("env", {}))):
        worker = threading.Thread(target=target, name=f"conformance-{case.id}", daemon=True)
        timer: threading.Timer | None = None
        begin = time.monotonic()
        worker.start()
        if "cancel_after_ms" in case.input:
            timer = threading.Timer(case.input["cancel_after_ms"] / 1000, control.cancel)
            timer.daemon = True
            timer.start()
        worker.join(limit_ms / 1000)
        hung = worker.is_alive()
        if hung:
            control.cancel("conformance_limit")
            worker.join(HARD_GRACE_MS / 1000)
        duration_ms = _elapsed_ms(begin)
        if timer is not None:
            timer.cancel()

    if hung:
        still = " and ignored cancellation" if worker.is_alive() else ""
        return [f"execute() did not return within {limit_ms} ms (the engine requested cancellation{still})"]
    if "exc" in outcome:
        exc = outcome["exc"]
        code = f" [{exc.code}]" if isinstance(exc, SchedulerError) else ""
        return [f"provider raised instead of returning a result: {type(exc).__name__}{code}: {exc}"]
    return _compare_executor_result(case, outcome.get("result"), control, root, duration_ms)


def _stream_text(capture: Any) -> str:
    return "" if capture is None else (capture.excerpt or "")


def _artifact_bytes(root: Path, capture: Any) -> bytes | None:
    """The raw bytes of an offloaded stream, if it has one that can be read (no digest check)."""
    from scheduler.artifacts import resolve_artifact

    if capture is None or not capture.artifact:
        return None
    try:
        return resolve_artifact(root, capture.artifact).read_bytes()
    except (SchedulerError, OSError):
        return None


def _compare_executor_result(case: Case, result: Any, control: Any, root: Path, duration_ms: int) -> list[str]:
    """Every difference between the executor's result (and what it recorded) and the case's ``expect``."""
    from scheduler.artifacts import read_artifact
    from scheduler.execution import EXECUTION_STATUSES, ExecutionResult

    if not isinstance(result, ExecutionResult):
        return [f"execute() returned {type(result).__name__}, not an ExecutionResult"]
    expect = case.expect
    problems: list[str] = []
    said = (
        f" (provider reported status={result.status!r}, error_code={result.error_code!r}, error_message={result.error_message!r})"
    )

    if result.status not in EXECUTION_STATUSES:
        problems.append(f"status {result.status!r} is not one of {', '.join(EXECUTION_STATUSES)}")
    if "error_code" in expect:
        if result.error_code != expect["error_code"]:
            problems.append(f"error_code: expected {expect['error_code']!r}, got {result.error_code!r}" + said)
    elif case.polarity == "positive" and expect.get("status") == "ok" and result.error_code:
        problems.append(f"error_code: expected none on a successful run, got {result.error_code!r}")
    if "status" in expect and result.status != expect["status"]:
        problems.append(
            f"status: expected {expect['status']!r}, got {result.status!r}" + ("" if "error_code" in expect else said)
        )
    if "exit_code" in expect and result.exit_code != expect["exit_code"]:
        problems.append(f"exit_code: expected {expect['exit_code']!r}, got {result.exit_code!r}")

    stdout, stderr = result.stdout, result.stderr
    out_text, err_text = _stream_text(stdout), _stream_text(stderr)
    for needle in _as_list(expect.get("stdout_contains", [])):
        if needle not in out_text:
            problems.append(f"stdout does not contain {needle!r} (excerpt starts {out_text[:120]!r})")
    if "stdout_not_contains" in expect:
        full = _artifact_bytes(root, stdout)
        for needle in _as_list(expect["stdout_not_contains"]):
            if needle in out_text or (full is not None and needle.encode() in full):
                problems.append(f"stdout contains {needle!r}, which it must not")
    for needle in _as_list(expect.get("stderr_contains", [])):
        if needle not in err_text:
            problems.append(f"stderr does not contain {needle!r} (excerpt starts {err_text[:120]!r})")
    if "stdout_bytes" in expect:
        got = 0 if stdout is None else stdout.bytes
        if got != expect["stdout_bytes"]:
            problems.append(f"stdout_bytes: expected {expect['stdout_bytes']}, got {got}")
    if "stdout_sha256" in expect:
        got_sha = None if stdout is None else stdout.sha256
        if got_sha != expect["stdout_sha256"]:
            problems.append(f"stdout_sha256: expected {expect['stdout_sha256']}, got {got_sha}")
    if "artifact_offloaded" in expect:
        artifact = None if stdout is None else stdout.artifact
        if expect["artifact_offloaded"]:
            if not artifact:
                problems.append("stdout was not offloaded to the artifact store")
            else:
                try:
                    read_artifact(root, artifact, stdout.sha256, stdout.bytes)
                except SchedulerError as exc:
                    problems.append(f"offloaded stdout does not verify: {exc.code}: {exc.message}")
        elif artifact:
            problems.append(f"stdout was offloaded ({artifact}) but should have stayed inline")

    structured = result.structured if isinstance(result.structured, dict) else None
    if "structured_valid" in expect:
        if structured is None:
            problems.append("no structured output record")
        elif structured.get("valid") is not expect["structured_valid"]:
            problems.append(f"structured valid: expected {expect['structured_valid']}, got {structured.get('valid')!r}")
    if "structured_parsed" in expect:
        if structured is None:
            if "structured_valid" not in expect:
                problems.append("no structured output record")
        elif "parsed" not in structured or structured["parsed"] != expect["structured_parsed"]:
            problems.append(f"structured parsed: expected {expect['structured_parsed']!r}, got {structured.get('parsed')!r}")
    if "verification_status" in expect:
        verification = result.verification if isinstance(result.verification, dict) else None
        got_status = None if verification is None else verification.get("status")
        if got_status != expect["verification_status"]:
            problems.append(f"verification status: expected {expect['verification_status']!r}, got {got_status!r}")

    if "max_duration_ms" in expect and duration_ms > expect["max_duration_ms"]:
        problems.append(f"execute() took {duration_ms} ms, more than {expect['max_duration_ms']} ms")
    if "process_recorded" in expect:
        processes = list(control.processes)
        if expect["process_recorded"]:
            if not processes:
                problems.append("no process identity recorded (RunControl.record_process was never called)")
            else:
                pid, pgid, start_time = processes[0]
                if not (isinstance(pid, int) and pid > 0 and isinstance(pgid, int) and pgid > 0 and start_time):
                    problems.append(
                        f"recorded process identity is incomplete: pid={pid!r} pgid={pgid!r} start_time={start_time!r}"
                    )
        elif processes:
            problems.append(f"a process identity was recorded but none was expected: {processes[0]!r}")
    if "termination_recorded" in expect:
        terminated = bool(control.terminations)
        if terminated != expect["termination_recorded"]:
            problems.append(
                "no termination recorded (RunControl.record_termination was never called)"
                if expect["termination_recorded"]
                else f"a termination was recorded but none was expected: {control.terminations!r}"
            )
    return problems


register_adapter(KindAdapter(kind="executor", check_case=_check_executor_case, run=_run_executor_case))
