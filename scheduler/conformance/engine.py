"""The conformance engine: load versioned JSON cases and run them against one provider.

A provider is loaded through its entry point exactly as production loads it
(``scheduler.plugins.loader.load_provider``), each case runs in its own temporary
directory, and every outcome is one of ``passed``, ``failed`` or ``skipped``. The
engine never lets a case crash the run: a provider that raises, hangs past its
deadline or returns garbage fails that case and the run goes on. A run that cannot
start at all (the provider does not load, the fixtures are invalid, an executor has no
payload adapter) is **one** failure with a code, never one failure per case.

The corpus is the stock ``conformance-fixtures/v2/`` plus every extra directory named
by ``$SCHEDULER_CONFORMANCE_FIXTURES`` (``os.pathsep``-separated) or passed as
``extra``: extra directories add cases, they never replace the stock ones.

Executor cases describe a behaviour; the executor's payload adapter
(``scheduler.conformance.payload``) writes it in the executor's payload language.
Channel cases describe what the service answers; the channel's service adapter
(``scheduler.conformance.service``) starts a loopback stand-in of its service.

Running cases is kind-specific, so each kind has a ``KindAdapter`` registered in
``ADAPTERS``: ``executor`` (below) and ``channel`` (``scheduler.conformance.channel``,
registered when the package is imported). This module deliberately does not import
pytest (``pytest_plugin`` is the opt-in pytest adapter).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
from jsonschema import Draft202012Validator

import scheduler
from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.conformance.payload import ADAPTER_FIELDS, Behaviour, resolve_payload_adapter
from scheduler.core.execution import EXECUTION_STATUSES, ExecutionResult, LocalRunControl
from scheduler.core.members import Configurable, Named, settings_class_of
from scheduler.core.outputs import read_artifact, resolve_artifact
from scheduler.core.processes import group_alive, kill_group
from scheduler.core.spec import validate_spec
from scheduler.pipeline.governance import request_for
from scheduler.plugins.loader import check_api, load_provider
from scheduler.plugins.protocols import PROVIDER_KINDS
from scheduler.settings.load import resolve_table

#: The fixture format version this engine reads (a directory under the fixtures root).
FIXTURE_VERSION = "v2"
#: Environment variable naming extra fixture directories (``os.pathsep``-separated) added to the stock corpus.
FIXTURES_ENV = "SCHEDULER_CONFORMANCE_FIXTURES"
#: Schema file inside a version directory.
SCHEMA_FILE = "case.schema.json"
#: Possible case outcomes.
OUTCOMES = ("passed", "failed", "skipped")
#: How long past its own deadline (run timeout + verification timeout) a provider may take to return.
HARD_GRACE_MS = 15_000
#: Extra wait, past ``max_duration_ms``, before the engine gives up on a provider and cancels it.
MAX_DURATION_GRACE_MS = 2_000
#: ``run_timeout_ms`` of an executor case whose ``input.job`` sets none (the spec default is 5 minutes).
DEFAULT_RUN_TIMEOUT_MS = 20_000
#: Driver name written into the job of a case run against a provider object that came without a name.
ANONYMOUS_EXECUTOR = "conformance-executor"
#: What a job's ``executor`` field accepts (the case's job carries the driver name when it fits).
_DRIVER_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
#: How much of each output stream a failure message quotes.
QUOTE_CHARS = 400

#: Serialises cases that patch ``os.environ`` (the environment is process-global).
_ENV_LOCK = threading.Lock()

CaseFilter = str | Iterable[str] | Callable[["Case"], bool] | None
PathLike = str | Path


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
    #: Fixture file the case came from (``v2/executor/basic.json`` for stock cases, a full path for extra ones).
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
    """The outcome of one case: ``passed``, ``failed`` (with why) or ``skipped`` (with why).

    ``observed`` is set on a failed case that ran: what the provider reported (status,
    codes, the start of stdout and stderr) and the payload it was given, so the
    message shows the executor's side, not only the difference.
    """

    id: str
    outcome: str = attrs.field(validator=attrs.validators.in_(OUTCOMES))
    message: str = ""
    duration_ms: int = 0
    observed: dict[str, Any] | None = None

    def explain(self) -> str:
        """The message plus the observed result, one ``key: value`` line each (what a human reads on a failure)."""
        lines = [self.message] if self.message else []
        for key, value in (self.observed or {}).items():
            text = value if isinstance(value, str) and key == "result" else json.dumps(value, ensure_ascii=False, default=str)
            lines.append(f"{key}: {text}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON object."""
        out = {"id": self.id, "outcome": self.outcome, "message": self.message, "duration_ms": self.duration_ms}
        if self.observed is not None:
            out["observed"] = self.observed
        return out


@attrs.frozen(kw_only=True)
class Report:
    """All results of running one kind's cases against one provider.

    ``error`` is set (``{"code", "message"}``) when the run could not start at all:
    the provider failed to load, the fixtures are invalid, the kind has no adapter,
    an executor has no payload adapter, a channel no service adapter, or a filter
    selected nothing. That counts as
    exactly one failure (``failed == 1``) and no case results, so a broken provider
    never looks clean and never floods the output with one identical line per case.
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
        """Number of failed cases, plus one when the run could not start."""
        return sum(1 for r in self.results if r.outcome == "failed") + (1 if self.error is not None else 0)

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
class CaseCheck:
    """What a kind adapter found for one case: problems (none = passed), or why it was skipped."""

    problems: tuple[str, ...] = ()
    skipped: str | None = None
    observed: dict[str, Any] | None = None


def _no_context(name: str | None, provider: Any, payload_adapter: Any) -> Any:
    """Default ``KindAdapter.prepare``: kinds that need nothing beyond the provider."""
    return None


@attrs.frozen(kw_only=True)
class KindAdapter:
    """How cases of one provider kind are checked at load time and run.

    ``check_case`` validates kind-specific input beyond the JSON Schema (for
    executors: the kernel-level job fields) and raises ``SchedulerError`` or
    ``ValueError``. ``prepare(name, provider, payload_adapter)`` runs once per provider
    before its cases and returns a context (executors: the resolved payload adapter);
    a ``SchedulerError`` from it is the run's one failure. ``run(provider, case,
    workdir, context)`` executes one case and returns a ``CaseCheck``.
    """

    kind: str
    check_case: Callable[[Case], None]
    run: Callable[[Any, Case, Path, Any], CaseCheck]
    prepare: Callable[[str | None, Any, Any], Any] = _no_context


#: Provider kind -> adapter. Kinds without an entry report ``CONFORMANCE_KIND_UNSUPPORTED`` if they have cases.
ADAPTERS: dict[str, KindAdapter] = {}


def register_adapter(adapter: KindAdapter) -> None:
    """Register (or replace) the adapter for a kind; this is how channel/evidence/... support is added."""
    ADAPTERS[adapter.kind] = adapter


# --------------------------------------------------------------------------- fixtures


def fixtures_root(root: PathLike | None = None) -> Path:
    """The stock ``conformance-fixtures/`` directory (``root`` replaces it, for tests of the engine itself).

    Order: the explicit ``root``; the copy shipped as ``scheduler/conformance/fixtures/``
    (in a checkout a symlink to the repo's ``conformance-fixtures/``, in a wheel the
    packaged files); else the first ``conformance-fixtures/`` found walking up from the
    ``scheduler`` package. ``$SCHEDULER_CONFORMANCE_FIXTURES`` never replaces it: those
    directories are added (``extra_fixture_dirs``). Raises ``CONFORMANCE_FIXTURES_NOT_FOUND``.
    """
    if root is not None:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise SchedulerError("CONFORMANCE_FIXTURES_NOT_FOUND", f"conformance fixtures directory does not exist: {path}")
        return path
    packaged = Path(__file__).resolve().parent / "fixtures"
    if (packaged / FIXTURE_VERSION / SCHEMA_FILE).is_file():
        return packaged.resolve()
    start = Path(scheduler.__file__).resolve().parent
    for directory in (start, *start.parents):
        candidate = directory / "conformance-fixtures"
        if (candidate / FIXTURE_VERSION / SCHEMA_FILE).is_file():
            return candidate
    raise SchedulerError(
        "CONFORMANCE_FIXTURES_NOT_FOUND", f"no conformance fixtures packaged in {packaged} nor found above {start}"
    )


def version_dir(root: PathLike | None = None) -> Path:
    """The stock directory of the fixture version this engine reads (``<root>/v2``, or ``root`` itself if it is one)."""
    base = fixtures_root(root)
    if (base / SCHEMA_FILE).is_file():
        return base
    return base / FIXTURE_VERSION


def extra_fixture_dirs(extra: Iterable[PathLike] = ()) -> list[Path]:
    """The extra case directories: ``$SCHEDULER_CONFORMANCE_FIXTURES`` (``os.pathsep``-separated), then ``extra``.

    Each may be a ``conformance-fixtures/``-style directory (its ``v2/`` is read) or a
    directory holding ``<kind>/*.json`` directly. A missing one is
    ``CONFORMANCE_FIXTURES_NOT_FOUND``; one that only has cases of another format
    version is ``CONFORMANCE_FIXTURE_INVALID``.
    """
    raw = [p for p in os.environ.get(FIXTURES_ENV, "").split(os.pathsep) if p.strip()]
    out: list[Path] = []
    for item in [*raw, *extra]:
        path = Path(item).expanduser()
        if not path.is_dir():
            raise SchedulerError("CONFORMANCE_FIXTURES_NOT_FOUND", f"extra conformance fixtures directory does not exist: {path}")
        if (path / FIXTURE_VERSION).is_dir():
            path = path / FIXTURE_VERSION
        elif any(path.glob("v[0-9]*/*/*.json")):
            versions = sorted(p.name for p in path.glob("v[0-9]*") if p.is_dir())
            raise SchedulerError(
                "CONFORMANCE_FIXTURE_INVALID",
                f"{path} has cases only for format {', '.join(versions)}; this engine reads {FIXTURE_VERSION} "
                f"(see conformance-fixtures/{FIXTURE_VERSION}/README.md)",
            )
        resolved = path.resolve()
        if resolved not in out:
            out.append(resolved)
    return out


def load_schema(root: PathLike | None = None) -> dict[str, Any]:
    """The case-file JSON Schema of this fixture version (itself checked against draft 2020-12)."""
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
    validator = Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        details = [{"path": e.json_path, "error": e.message} for e in errors]
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise _invalid(source, first.json_path, first.message + more, details)


def _fixture_files(vdir: Path) -> list[Path]:
    """``<kind>/*.json``, then ``<kind>/<language>/*.json`` (the language-specific cases last), of one version directory."""
    portable = sorted(p for p in vdir.glob("*/*.json") if p.is_file())
    return portable + sorted(p for p in vdir.glob("*/*/*.json") if p.is_file())


def _load_file(path: Path, source: str, schema: dict[str, Any], seen: dict[str, str]) -> list[Case]:
    """Parse, validate and check one case file (kind = its directory, language = its subdirectory)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise _invalid(source, "$", f"not valid JSON: {exc}") from None
    except OSError as exc:
        raise _invalid(source, "$", f"cannot read: {exc}") from None
    validate_case_file(data, schema, source=source)
    file_kind = data["kind"]
    nested = path.parent.parent.name == file_kind
    kind_dir = path.parent.parent.name if nested else path.parent.name
    language = path.parent.name if nested else None
    if kind_dir != file_kind:
        raise _invalid(source, "$.kind", f"file kind {file_kind!r} does not match its directory {kind_dir!r}")
    cases: list[Case] = []
    for index, raw in enumerate(data["cases"]):
        where = f"$.cases[{index}]"
        if raw["kind"] != file_kind:
            raise _invalid(source, f"{where}.kind", f"case kind {raw['kind']!r} does not match the file kind {file_kind!r}")
        if raw["id"] in seen:
            raise _invalid(source, f"{where}.id", f"duplicate case id {raw['id']!r} (first defined in {seen[raw['id']]})")
        raw_language = (raw["input"].get("payload") or {}).get("language") if isinstance(raw["input"], dict) else None
        if raw_language != language:
            if language is None:
                message = f"a raw {raw_language} payload belongs in {file_kind}/{raw_language}/, not here"
            else:
                message = f"cases under {file_kind}/{language}/ must be raw {language} payloads (input.payload.language)"
            raise _invalid(source, f"{where}.input", message)
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


def load_corpus(root: PathLike | None = None, *, extra: Iterable[PathLike] = ()) -> list[Case]:
    """Load and validate every case file of every kind: the stock corpus, then each extra directory.

    Beyond the schema it checks that each case's kind matches its file and
    directory, that raw payload cases sit in their language's subdirectory, that ids
    are unique across everything loaded, and the kind adapter's own checks. The first
    invalid file raises ``CONFORMANCE_FIXTURE_INVALID`` naming it.
    """
    vdir = version_dir(root)
    schema = load_schema(root)
    seen: dict[str, str] = {}
    cases: list[Case] = []
    for path in _fixture_files(vdir):
        cases += _load_file(path, str(path.relative_to(vdir.parent)), schema, seen)
    for directory in extra_fixture_dirs(extra):
        if directory == vdir.resolve():
            continue  # naming the stock corpus again adds nothing
        for path in _fixture_files(directory):
            cases += _load_file(path, str(path), schema, seen)
    return cases


def load_cases(kind: str, root: PathLike | None = None, *, extra: Iterable[PathLike] = ()) -> list[Case]:
    """The validated cases of one provider kind (everything loaded is validated first)."""
    if kind not in PROVIDER_KINDS:
        raise SchedulerError("CONFORMANCE_KIND_UNKNOWN", f"unknown provider kind {kind!r} (known: {', '.join(PROVIDER_KINDS)})")
    return [c for c in load_corpus(root, extra=extra) if c.kind == kind]


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


def prepare(kind: str, name: str | None, provider: Any, payload_adapter: Any = None) -> Any:
    """The per-provider context of a kind's adapter (executors: the payload adapter; channels: the service adapter).

    ``payload_adapter`` is the kind's adapter given explicitly (an executor's payload
    adapter or a channel's service adapter; None: found as the kind finds it). Raises
    ``SchedulerError``.

    A ``Named`` provider is told ``name`` (``registered_as``), as the loader tells it. It
    first holds a provider object built in process (``make_provider``, ``provider=``) to
    what loading checks (``plugin_api`` major, ``capabilities`` a set of strings), so an
    object the kernel would refuse (``PLUGIN_API_MISMATCH``, ``PLUGIN_INVALID``) cannot pass.
    """
    adapter = ADAPTERS.get(kind)
    if adapter is None:
        raise SchedulerError("CONFORMANCE_KIND_UNSUPPORTED", f"no adapter for kind {kind}")
    check_api(provider, group=PROVIDER_KINDS[kind][0], name=name or type(provider).__name__, dist="the provider under test")
    if name and isinstance(provider, Named):  # as the loader does: a provider built in process learns its name too
        provider.registered_as(name)
    return adapter.prepare(name, provider, payload_adapter)


_UNSET: Any = object()


def run_case(
    provider: Any,
    case: Case,
    workdir: PathLike,
    *,
    name: str | None = None,
    payload_adapter: Any = None,
    service_adapter: Any = None,
    context: Any = _UNSET,
) -> CaseResult:
    """Run one case against an already loaded provider in ``workdir`` (an empty directory the case may use).

    Skips when the provider does not declare every capability the case requires, or
    when its payload (service) adapter cannot express the case. ``context`` is what
    ``prepare`` returned (computed here from ``name`` and ``payload_adapter`` /
    ``service_adapter`` when not given).
    Never raises: any exception, from the provider or the engine, is a failed case
    whose message names it.
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
        if context is _UNSET:
            try:
                context = adapter.prepare(name, provider, payload_adapter if payload_adapter is not None else service_adapter)
            except SchedulerError as exc:
                return CaseResult(
                    id=case.id, outcome="failed", message=f"{exc.code}: {exc.message}", duration_ms=_elapsed_ms(start)
                )
        check = adapter.run(provider, case, Path(workdir), context)
    except Exception as exc:  # noqa: BLE001 - the engine itself must never crash a run
        return CaseResult(
            id=case.id,
            outcome="failed",
            message=f"conformance engine error: {type(exc).__name__}: {exc}",
            duration_ms=_elapsed_ms(start),
        )
    if check.skipped is not None:
        return CaseResult(id=case.id, outcome="skipped", message=check.skipped, duration_ms=_elapsed_ms(start))
    if check.problems:
        return CaseResult(
            id=case.id,
            outcome="failed",
            message="; ".join(check.problems),
            duration_ms=_elapsed_ms(start),
            observed=check.observed,
        )
    return CaseResult(id=case.id, outcome="passed", duration_ms=_elapsed_ms(start))


def _start_failure(kind: str, name: str, code: str, message: str) -> Report:
    return Report(kind=kind, name=name, error={"code": code, "message": message})


def run_kind(
    kind: str,
    name: str,
    provider: Any = None,
    *,
    filter: CaseFilter = None,
    root: PathLike | None = None,
    extra: Iterable[PathLike] = (),
    payload_adapter: Any = None,
    service_adapter: Any = None,
    on_result: Callable[[CaseResult], None] | None = None,
    stop_at_first_failure: bool = False,
    adapter: Any = None,
) -> Report:
    """Run every (selected) case of ``kind`` against the provider ``name`` and return the report.

    The provider is loaded through its entry point (``load_provider``) unless one is
    given; ``extra`` adds fixture directories to the stock corpus (as
    ``$SCHEDULER_CONFORMANCE_FIXTURES`` does); ``payload_adapter`` (an object, a class
    or ``MODULE:ATTR``) overrides how an executor's adapter is found, ``service_adapter``
    how a channel's is (either name is accepted for either kind); ``adapter`` is the same for
    any kind (an evidence or authorization setup adapter, a credential source adapter, a
    proof verifier's setup adapter) and wins over both. A load failure,
    invalid fixtures, an unsupported kind, a missing payload or service adapter or a ``filter``
    that selects nothing (``CONFORMANCE_NO_CASES``) produce a report with ``error``
    set, counted as one failure, never a traceback. ``on_result`` is called after each
    case (the CLI streams its lines through it). ``stop_at_first_failure`` ends the run at
    the first failed case (the report holds the cases run up to it: what a mutation test needs).
    """
    try:
        cases = select_cases(load_cases(kind, root, extra=extra), filter)
    except SchedulerError as exc:
        return _start_failure(kind, name, exc.code, exc.message)
    if filter is not None and not cases:  # a mistyped --case glob must not look like a clean run
        return _start_failure(kind, name, "CONFORMANCE_NO_CASES", f"no {kind} case matches the filter")
    if not cases:
        return Report(kind=kind, name=name)
    if kind not in ADAPTERS:
        return _start_failure(
            kind, name, "CONFORMANCE_KIND_UNSUPPORTED", f"no adapter for kind {kind} ({len(cases)} case(s) not run)"
        )
    if provider is None:
        try:
            provider = load_provider(kind, name)
        except SchedulerError as exc:
            return _start_failure(kind, name, exc.code, exc.message)
        except Exception as exc:  # noqa: BLE001 - a loader bug must still be a report, not a traceback
            return _start_failure(
                kind, name, "PLUGIN_LOAD_FAILED", f"{kind} driver {name!r} failed to load: {type(exc).__name__}: {exc}"
            )
    given = next((a for a in (adapter, payload_adapter, service_adapter) if a is not None), None)
    try:
        context = prepare(kind, name, provider, given)
    except SchedulerError as exc:
        return _start_failure(kind, name, exc.code, exc.message)
    results: list[CaseResult] = []
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="scheduler-conformance-") as tmp:
            result = run_case(provider, case, Path(tmp), name=name, context=context)
        results.append(result)
        if on_result is not None:
            on_result(result)
        if stop_at_first_failure and result.outcome == "failed":
            break
    return Report(kind=kind, name=name, results=tuple(results))


def configure_provider(provider: Any, name: str, settings: Any, *, role: str, which: str = "settings") -> str | None:
    """Validate a ``[providers.NAME]`` table from the ``role`` adapter like the loader does (every kind's cases use it) and hand it to ``configure``.

    Returns the problem (the case's failure) or None. ``which`` names the table in messages
    (``settings``, ``verify_settings``). A table given to a provider without ``settings_class``
    is a problem: the provider would silently ignore what the case set up.
    """
    table = dict(settings or {})
    cls = settings_class_of(provider)
    if cls is None:
        return (f"the {role} adapter gives {which} ({', '.join(sorted(table))}) but the provider has no settings_class"
                if table else None)
    resolved, problems = resolve_table(f"providers.{name}", cls, table, f"the conformance {role} adapter", {})
    if problems or resolved is None:
        listed = "; ".join(f"{p.get('key') or p.get('field')}: {p['error']}" for p in problems)
        return f"the {role} adapter's {which} do not validate against {cls.__name__}: {listed}"
    if isinstance(provider, Configurable):
        try:
            provider.configure(resolved.value)
        except Exception as exc:  # noqa: BLE001 - the case's failure
            return f"configure() refused the {role} adapter's {which}: {type(exc).__name__}: {exc}"
    return None


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


def _job_fields(case: Case) -> dict[str, Any]:
    """The kernel-level job fields of an executor case, with the engine's defaults filled in."""
    job = dict(case.input.get("job") or {})
    job.setdefault("name", f"conformance {case.id}"[:128])
    job.setdefault("schedule_kind", "manual")
    job.setdefault("run_timeout_ms", DEFAULT_RUN_TIMEOUT_MS)
    return job


def _check_executor_case(case: Case) -> None:
    """Load-time check: the case's kernel-level job fields must form a valid job spec (with a stand-in payload).

    A ``settings: empty`` case is negative and expects status ``error`` (an unconfigured executor runs nothing).
    """
    if case.input.get("settings", "configured") == "empty" and (case.polarity != "negative" or case.expect.get("status") != "error"):
        raise ValueError("a case with empty settings is negative and expects status error")
    validate_spec({**_job_fields(case), "payload_message": "conformance"}, check_past=False, plugin_options=False)


@attrs.frozen(kw_only=True)
class _ExecutorContext:
    """What every case of one executor run shares: the driver name its jobs carry and its payload adapter."""

    name: str
    adapter: Any


def _prepare_executor(name: str | None, provider: Any, payload_adapter: Any) -> _ExecutorContext:
    """Find the executor's payload adapter once per run (``CONFORMANCE_NO_PAYLOAD_ADAPTER`` when there is none)."""
    adapter = resolve_payload_adapter(name, provider, payload_adapter)
    return _ExecutorContext(name=name if name and _DRIVER_NAME.match(name) else ANONYMOUS_EXECUTOR, adapter=adapter)


def _adapter_label(adapter: Any) -> str:
    return type(adapter).__name__ if not isinstance(adapter, type) else adapter.__name__


def _payload_fields(adapter: Any, case: Case) -> tuple[dict[str, Any] | None, CaseCheck | None]:
    """Ask the payload adapter for the case's payload; a decline is a skip, a bad answer a failure."""
    behaviour = Behaviour.from_case_input(case.id, case.input)
    label = _adapter_label(adapter)
    if behaviour.raw is not None:
        languages = set(getattr(adapter, "languages", ()) or ())
        if behaviour.raw.language not in languages:
            spoken = ", ".join(sorted(languages)) or "behaviours only"
            return None, CaseCheck(
                skipped=f"written in {behaviour.raw.language}; payload adapter {label} does not accept it (it takes: {spoken})"
            )
    try:
        fields = adapter.conformance_payload(behaviour)
    except NotImplementedError as exc:
        reason = str(exc) or "no reason given"
        return None, CaseCheck(skipped=f"payload adapter {label} cannot express this case: {reason}")
    except Exception as exc:  # noqa: BLE001 - an adapter bug fails the case, never the run
        return None, CaseCheck(problems=(f"payload adapter {label} raised {type(exc).__name__}: {exc}",))
    if fields is None:
        return None, CaseCheck(skipped=f"payload adapter {label} cannot express this case")
    if not isinstance(fields, dict) or not isinstance(fields.get("payload_message"), str):
        return None, CaseCheck(
            problems=(f"payload adapter {label} returned {fields!r}, not a dict with a payload_message string",)
        )
    unknown = sorted(set(fields) - ADAPTER_FIELDS)
    if unknown:
        return None, CaseCheck(
            problems=(f"payload adapter {label} returned fields a case owns or that do not exist: {', '.join(unknown)}",)
        )
    return fields, None


def _executor_request(provider: Any, name: str, case: Case, fields: dict[str, Any], workdir: Path) -> Any:
    """The ``ExecutionRequest`` the dispatcher would build for this case's job (options validated by the provider)."""
    spec = validate_spec({**_job_fields(case), **fields, "executor": name}, check_past=False, plugin_options=False)
    root = workdir / "artifacts"
    root.mkdir(parents=True, exist_ok=True)
    started = now_ms()
    return request_for(provider, spec, run_id=str(uuid.uuid4()), job_id=str(uuid.uuid4()), artifacts_root=root,
                       started_at_ms=started, scheduled_for_ms=started)


def _unconfigured_executor(provider: Any, case: Case, context: Any) -> tuple[Any, CaseCheck | None]:
    """The executor a ``settings: empty`` case runs: a fresh instance configured with an empty ``[executors.NAME]`` table.

    Any other case runs ``provider`` itself. Skipped (with the reason) when the payload adapter gives
    no ``settings`` (the executor needs none on the host) or the class takes arguments; an executor
    that refuses to be configured so fails closed and passes. The instance under test is left as the
    host configured it, for the other cases.
    """
    if case.input.get("settings", "configured") != "empty":
        return provider, None
    if not dict(getattr(context.adapter, "settings", None) or {}):
        return provider, CaseCheck(skipped=("the payload adapter gives no settings: the executor needs none on the host"
                                            " (its defaults run every case)"))
    try:
        fresh = type(provider)()
    except Exception as exc:  # noqa: BLE001 - a class that needs arguments is not made here
        return provider, CaseCheck(skipped=f"a fresh {type(provider).__name__} cannot be made without arguments: {exc}")
    if isinstance(fresh, Named):
        fresh.registered_as(context.name)
    if configure_provider(fresh, context.name, {}, role="payload", which="empty settings") is not None:
        return provider, CaseCheck()  # the host refuses to configure (load) the executor without its table: fail closed
    return fresh, None


def _run_executor_case(provider: Any, case: Case, workdir: Path, context: Any) -> CaseCheck:
    """Run one executor case: payload from the adapter, the request and a ``LocalRunControl``, execute, compare."""
    adapter = context.adapter
    fields, early = _payload_fields(adapter, case)
    if early is not None:
        return early
    assert fields is not None
    provider, early = _unconfigured_executor(provider, case, context)
    if early is not None:
        return early
    try:
        request = _executor_request(provider, context.name, case, fields, workdir)
    except SchedulerError as exc:
        details = f" {json.dumps(exc.details, default=str)}" if exc.details else ""
        return CaseCheck(
            problems=(
                (f"the job built from payload adapter {_adapter_label(adapter)}'s fields is refused: "
                 f"{exc.code}: {exc.message}{details}"),
            ),
            observed={"payload": fields},
        )
    control = LocalRunControl()
    expect = case.expect
    job = request.job

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
            timer = threading.Timer(case.input["cancel_after_ms"] / 1000, control.cancel, args=("user",))
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

    try:
        if hung:
            still = " and ignored cancellation" if worker.is_alive() else ""
            return CaseCheck(
                problems=(f"execute() did not return within {limit_ms} ms (the engine requested cancellation{still})",),
                observed=_observed(None, fields, control),
            )
        if "exc" in outcome:
            raised = outcome["exc"]
            code = f" [{raised.code}]" if isinstance(raised, SchedulerError) else ""
            return CaseCheck(
                problems=(f"provider raised instead of returning a result: {type(raised).__name__}{code}: {raised}",),
                observed=_observed(None, fields, control),
            )
        result = outcome.get("result")
        problems = _compare_executor_result(case, result, control, request, duration_ms)
        if case.input.get("settings") == "empty" and isinstance(result, ExecutionResult) and not result.error_code:
            problems.append("the run of an executor without its settings ended without an error_code saying why")
        return CaseCheck(problems=tuple(problems), observed=_observed(result, fields, control) if problems else None)
    finally:
        _reap_leftover_groups(control)


def _quote(capture: Any) -> str | None:
    """The start of a stream's excerpt (None when there is no stream)."""
    if capture is None:
        return None
    text = capture.excerpt or ""
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + f"... ({capture.bytes} bytes in all)"


def _observed(result: Any, fields: dict[str, Any], control: Any) -> dict[str, Any]:
    """What a failure message shows besides the differences: the result, its streams and the payload given."""
    observed: dict[str, Any] = {}
    if isinstance(result, ExecutionResult):
        observed["result"] = (
            f"status={result.status!r} exit_code={result.exit_code!r} error_code={result.error_code!r} "
            f"error_message={result.error_message!r}"
        )
        observed["stderr"] = _quote(result.stderr)
        observed["stdout"] = _quote(result.stdout)
    if control.handles:
        observed["handles"] = control.handles
    if control.terminations:
        observed["terminations"] = control.terminations
    observed["payload"] = fields
    return observed


def _process_handle_problem(handle: Any) -> str | None:
    """Why a recorded handle is not a complete process handle of this host (None when it is)."""
    if not isinstance(handle, dict):
        return f"the recorded handle is {type(handle).__name__}, not a dict"
    pid, pgid, start_time, host = (handle.get(k) for k in ("pid", "pgid", "start_time", "host"))
    wrong = []
    if not (isinstance(pid, int) and not isinstance(pid, bool) and pid > 0):
        wrong.append(f"pid={pid!r}")
    if not (isinstance(pgid, int) and not isinstance(pgid, bool) and pgid > 0):
        wrong.append(f"pgid={pgid!r}")
    if not (isinstance(start_time, str) and start_time):
        wrong.append(f"start_time={start_time!r} (process_identity(pid), read before the child is reaped)")
    if host != socket.gethostname():
        wrong.append(f"host={host!r} (expected {socket.gethostname()!r})")
    if wrong:
        return "the recorded process handle is incomplete: " + ", ".join(wrong)
    return None


def _recorded_groups(control: Any) -> list[int]:
    """Process groups named by recorded handles of this host, never the engine's own group."""
    own = os.getpgrp()
    groups = []
    for handle in control.handles:
        pgid = handle.get("pgid") if isinstance(handle, dict) else None
        if (isinstance(pgid, int) and not isinstance(pgid, bool) and pgid > 1 and pgid != own
                and handle.get("host", socket.gethostname()) == socket.gethostname() and pgid not in groups):
            groups.append(pgid)
    return groups


def _reap_leftover_groups(control: Any) -> None:
    """Stop what a failing executor left running (after the checks), so one case never leaks into the next."""
    for pgid in _recorded_groups(control):
        with contextlib.suppress(Exception):
            if group_alive(pgid):
                kill_group(pgid, 0.2)


def _stream_text(capture: Any) -> str:
    return "" if capture is None else (capture.excerpt or "")


def _artifact_bytes(root: Path, capture: Any) -> bytes | None:
    """The raw bytes of an offloaded stream, if it has one that can be read (no digest check)."""
    if capture is None or not capture.artifact:
        return None
    try:
        return resolve_artifact(root, capture.artifact).read_bytes()
    except (SchedulerError, OSError):
        return None


def _compare_executor_result(case: Case, result: Any, control: Any, request: Any, duration_ms: int) -> list[str]:
    """Every difference between the executor's result (and what it recorded) and the case's ``expect``."""
    if not isinstance(result, ExecutionResult):
        return [f"execute() returned {type(result).__name__}, not an ExecutionResult"]
    root = request.artifacts_root
    expect = case.expect
    problems: list[str] = []

    if result.status not in EXECUTION_STATUSES:
        problems.append(f"status {result.status!r} is not one of {', '.join(EXECUTION_STATUSES)}")
    if "error_code" in expect:
        if result.error_code != expect["error_code"]:
            problems.append(f"error_code: expected {expect['error_code']!r}, got {result.error_code!r}")
    elif case.polarity == "positive" and expect.get("status") == "ok" and result.error_code:
        problems.append(f"error_code: expected none on a successful run, got {result.error_code!r}")
    if "status" in expect and result.status != expect["status"]:
        problems.append(f"status: expected {expect['status']!r}, got {result.status!r}")
    if "exit_code" in expect and result.exit_code != expect["exit_code"]:
        problems.append(f"exit_code: expected {expect['exit_code']!r}, got {result.exit_code!r}")

    stdout, stderr = result.stdout, result.stderr
    out_text, err_text = _stream_text(stdout), _stream_text(stderr)
    for needle in _as_list(expect.get("stdout_contains", [])):
        if needle not in out_text:
            problems.append(f"stdout does not contain {needle!r}")
    for var in expect.get("stdout_contains_extra_env", []):
        value = request.extra_env.get(var, "")
        if not value or value not in out_text:
            problems.append(f"stdout does not contain the value of {var} the kernel set for the run ({value!r})")
    if "stdout_not_contains" in expect:
        full = _artifact_bytes(root, stdout)
        for needle in _as_list(expect["stdout_not_contains"]):
            if needle in out_text or (full is not None and needle.encode() in full):
                problems.append(f"stdout contains {needle!r}, which it must not")
    for needle in _as_list(expect.get("stderr_contains", [])):
        if needle not in err_text:
            problems.append(f"stderr does not contain {needle!r}")
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
            if not artifact or stdout is None:
                problems.append("stdout was not offloaded to the artifact store")
            else:
                try:
                    read_artifact(root, artifact, stdout.sha256, stdout.bytes)
                except SchedulerError as exc:
                    problems.append(f"offloaded stdout does not verify: {exc.code}: {exc.message}")
        elif artifact:
            problems.append(f"stdout was offloaded ({artifact}) but should have stayed inline")
    for label, capture in (("stdout", stdout), ("stderr", stderr)):
        # Whatever the case expects: an offloaded stream must be the stream the result describes.
        if capture is not None and capture.artifact and not (label == "stdout" and expect.get("artifact_offloaded")):
            try:
                read_artifact(root, capture.artifact, capture.sha256, capture.bytes)
            except SchedulerError as exc:
                problems.append(f"offloaded {label} does not verify: {exc.code}: {exc.message}")

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
    handles = list(control.handles)
    if "process_handle_recorded" in expect:
        if expect["process_handle_recorded"]:
            if not handles:
                problems.append("no process handle recorded (RunControl.record_handle was never called)")
            else:
                problem = _process_handle_problem(handles[0])
                if problem:
                    problems.append(problem)
        elif handles:
            problems.append(f"a handle was recorded but none was expected: {handles[0]!r}")
    if expect.get("group_gone"):
        groups = _recorded_groups(control)
        if not groups:
            problems.append("no process group to check: no handle with a pgid was recorded (RunControl.record_handle)")
        for pgid in groups:
            if group_alive(pgid):
                problems.append(f"process group {pgid} still has live members after execute() returned")
    if "termination_recorded" in expect:
        terminated = bool(control.terminations)
        if terminated != expect["termination_recorded"]:
            problems.append(
                "no termination recorded (RunControl.record_termination was never called)"
                if expect["termination_recorded"]
                else f"a termination was recorded but none was expected: {control.terminations!r}"
            )
    return problems


register_adapter(
    KindAdapter(kind="executor", check_case=_check_executor_case, run=_run_executor_case, prepare=_prepare_executor)
)
