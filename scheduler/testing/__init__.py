"""Public test helpers for plugin authors and for the project's own tests.

* ``make_request(payload, artifacts_root=..., **spec_fields)``: a real ``ExecutionRequest``
  for a job spec, with the executor's options validated the way the dispatcher does;
* ``LocalRunControl``: an in-memory ``RunControl`` that records handles, terminations
  and events, and can be cancelled like the dispatcher does;
* ``MemoryProviderSessions``: an in-memory ``ProviderSessions`` (``CredentialContext.sessions``)
  that keeps what a caching credential provider reports, with the kernel's checks;
* ``RunningDispatcher``, ``add_job``, ``wait_for``, ``run_rows``: a real dispatcher in a
  background thread of the test process, on a real store;
* ``sqlite_store(path)``, ``postgres_url()``, ``postgres_unavailable_reason()`` and
  ``temporary_postgres_schema()``: real databases (PostgreSQL tests skip with the reason);
* ``hooks_with(module)``, ``load_provider(kind, name)`` and ``run_cli(*args)``: a hook module,
  a provider and the CLI exactly as the kernel uses them;
* ``isolate_settings``, ``write_settings(path, tables)``, ``toml_value(value)`` and
  ``provider_loader(monkeypatch, tmp_path, kind)``: a real settings file, and a provider
  loaded through its entry point with the ``[SECTION.NAME]`` table a test gives it;
* ``evidence_run_document(run_id, **result)``, ``evidence_payload_for(document)`` and
  ``make_evidence_payload(run_id, **result)``: evidence payloads shaped like the kernel's,
  canonicalised by an independent oracle (``scheduler.testing.evidence`` has them as the
  ``make_payload`` and ``load_evidence`` fixtures);
* the conformance adapter classes (``ExecutorConformance`` ...; pytest test classes, so
  present where pytest is installed): subclass one in your plugin's tests to run the stock
  conformance corpus against your provider (``run_conformance`` runs it without pytest); the
  executor payload-adapter types (``PosixShellPayloads``, ``Behaviour`` ...) and the
  channel service-adapter types (``HttpStandIn``, ``ServiceAnswer``,
  ``ReceivedMessage`` ...), the authorization setup-adapter helpers (``PolicySetup``,
  ``write_policy_setup``), the evidence setup (``EvidenceSetup``) and what each kind's adapter
  is asked (``PolicyRequest``, ``EvidenceSetupRequest``, ``SourceRequest``, ``ProofSetupRequest``)
  for your conformance adapter.

``scheduler.testing.fixtures`` turns these into pytest fixtures
(``pytest_plugins = ["scheduler.testing.fixtures"]`` in a ``conftest.py``).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from scheduler.artifacts.handoff_kind import HANDOFF_KIND
from scheduler.base.entry_points import entry_point_names
from scheduler.base.plugin_kinds import kind_named
from scheduler.base.timeutil import now_ms
from scheduler.cli.main import main as cli_main
from scheduler.conformance.authorization import PolicyRequest, PolicySetup, write_policy_setup
from scheduler.conformance.credential import SourceRequest
from scheduler.conformance.engine import run_kind as run_conformance
from scheduler.conformance.evidence import EvidenceSetup
from scheduler.conformance.evidence import SetupRequest as EvidenceSetupRequest
from scheduler.conformance.payload import Behaviour, PosixShellPayloads, RawPayload, Step
from scheduler.conformance.proof_verifier import ProofSetupRequest
from scheduler.conformance.service import (
    HttpReply,
    HttpRequest,
    HttpStandIn,
    ReceivedFile,
    ReceivedMessage,
    ServiceAnswer,
    ServiceRequest,
)
from scheduler.core import steps as _steps
from scheduler.core import submissions as _submissions
from scheduler.core.dispatcher import DispatcherConfig
from scheduler.core.execution import ExecutionRequest, LocalRunControl
from scheduler.core.jobs import create_jobs
from scheduler.core.rows import SQLValue
from scheduler.core.spec import validate_spec
from scheduler.pipeline import installed_steps
from scheduler.pipeline.credentials.sessions import MemoryProviderSessions
from scheduler.pipeline.governance import request_for
from scheduler.plugins.hooks import Hooks, make_plugin_manager
from scheduler.plugins.loader import load_provider as _load_provider
from scheduler.plugins.protocols import EvidencePayload
from scheduler.plugins.stores import open_store
from scheduler.runtime import dispatcher as runtime_dispatcher
from scheduler.settings import SETTINGS_SECTIONS, reload_settings

try:  # the PostgreSQL helpers need the driver, which only the PostgreSQL store plugin brings
    import psycopg

    _HAVE_PSYCOPG = True
except ImportError:
    _HAVE_PSYCOPG = False

try:  # the conformance base classes are pytest test classes: only a test run has pytest
    from scheduler.conformance.pytest_plugin import (
        AuthorizationProviderConformance,
        ChannelConformance,
        CredentialProviderConformance,
        EvidenceProviderConformance,
        ExecutorConformance,
        ProofVerifierConformance,
    )
except ModuleNotFoundError as _missing:
    if _missing.name not in ("pytest", "_pytest"):
        raise

# Tests validate and run jobs without a CLI or ``scheduler run``: the run pipeline's steps (and the handoff v4 kind)
# are installed on import.
_steps.install(installed_steps)
_submissions.install(HANDOFF_KIND)

#: The PostgreSQL server the tests use: ``SCHEDULER_TEST_POSTGRES_URL``, else the local one.
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"

_run_ids = itertools.count(1)


def make_request(
    payload: str,
    *,
    artifacts_root: Path,
    run_id: str | None = None,
    job_id: str = "job-1",
    attempt: int = 1,
    credentials: tuple[Any, ...] = (),
    **spec_fields: Any,
) -> ExecutionRequest:
    """An ``ExecutionRequest`` for ``payload`` and spec fields, as the dispatcher would build it.

    The spec is validated (plugin options included, when the executor is installed); the
    deadline follows ``run_timeout_ms``; the artifact directory is ``artifacts_root/runs/<run_id>``.
    """
    spec_fields.setdefault("name", "test job")
    spec_fields.setdefault("schedule_kind", "manual")
    spec = validate_spec({"payload_message": payload, **spec_fields})
    try:
        executor = load_provider("executor", spec.executor_name())
    except Exception:  # noqa: BLE001 - not installed: the caller runs its own executor object directly
        executor = None
    request = request_for(executor, spec, run_id=run_id or f"run-{next(_run_ids)}", job_id=job_id,
                          artifacts_root=artifacts_root, started_at_ms=now_ms(), attempt=attempt, credentials=credentials)
    request.artifacts_dir.mkdir(parents=True, exist_ok=True)
    return request


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.01, what: str = "condition") -> Any:
    """Poll until ``predicate()`` is truthy; return its value, or fail with ``AssertionError`` after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def add_job(store: Any, **spec: Any) -> dict[str, SQLValue]:
    """Create one job through the kernel, validated like the CLI does (``testkit`` executor by default).

    Returns the stored row as the mapping a read gives (``JobRow.to_dict``), as plugin tests index it.
    """
    spec.setdefault("executor", "testkit")
    spec.setdefault("schedule_kind", "manual")
    spec.setdefault("name", f"job-{uuid.uuid4().hex[:8]}")
    return create_jobs(store, [validate_spec(spec)])[0].to_dict()


def run_rows(store: Any, job_id: str) -> list[dict[str, Any]]:
    """All runs of a job, oldest first."""
    with store.read() as tx:
        return tx.all("SELECT * FROM runs WHERE job_id = ? ORDER BY created_at, id", (job_id,))


class RunningDispatcher:
    """A real dispatcher running in a background thread of the test process.

    Its lease lasts 10 s (renewed every 3.3 s): a lease lost to a stalled renewal stops the dispatcher, and a test
    waiting for its next run then only times out, so the lease must outlast a loaded CI machine's stalls.
    """

    def __init__(self, store: Any, *, hooks: Any = None, **config: Any) -> None:
        """Start it (``hooks``: the kernel's hook facade to use, e.g. ``hooks_with(module)``)."""
        config.setdefault("lease_ttl_ms", 10_000)
        config.setdefault("kill_grace_s", 0.5)
        config.setdefault("grace_s", 2.0)
        self.messages: list[str] = []
        self.dispatcher = runtime_dispatcher(store, DispatcherConfig(**config), hooks=hooks, say=self.messages.append)
        self.error: BaseException | None = None
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        wait_for(lambda: self.dispatcher.lease is not None or self.error is not None, what="dispatcher start")
        if self.error is not None:
            raise self.error

    def _main(self) -> None:
        try:
            self.exit_code = self.dispatcher.run()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc

    def stop(self, timeout: float = 20.0) -> None:
        """Ask for a graceful stop and wait for the dispatcher thread to end."""
        self.dispatcher.request_stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "dispatcher did not stop"


def sqlite_store(path: Path | str) -> Any:
    """An initialised SQLite store on a real file (close it when done)."""
    return open_store(str(path))


def postgres_url() -> str:
    """The PostgreSQL server URL tests use (``SCHEDULER_TEST_POSTGRES_URL``, else 127.0.0.1:5432/test)."""
    return os.environ.get("SCHEDULER_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL


_PG_REASON: list[str | None] = []


def postgres_unavailable_reason() -> str | None:
    """Why PostgreSQL tests must skip here (cached per process), or None when they can run."""
    if not _PG_REASON:
        _PG_REASON.append(_probe_postgres())
    return _PG_REASON[0]


def _probe_postgres() -> str | None:
    try:
        if "postgres" not in entry_point_names(kind_named("store").group):
            return "scheduler-store-postgres is not installed"
        if not _HAVE_PSYCOPG:
            raise ModuleNotFoundError("No module named 'psycopg'", name="psycopg")
        with psycopg.connect(postgres_url(), connect_timeout=2):
            pass
    except Exception as exc:  # noqa: BLE001 - any failure means "not available here"
        return f"PostgreSQL not reachable at {postgres_url()}: {type(exc).__name__}: {exc}"
    return None


def unreachable_by_others(*paths: str | Path) -> str | None:
    """Why another account (a test running a command as ``nobody``) could not reach ``paths``, or None when it can.

    Such a test must load the scheduler from this venv and checkout; under a directory others may not search (a clone
    under ``mktemp -d``, mode 0700) it would fail with an empty output instead, so it skips with this reason.
    """
    for path in paths:
        resolved = Path(path).resolve()
        for directory in (resolved, *resolved.parents):
            if not os.stat(directory).st_mode & 0o001:
                return f"{directory} is not searchable by other accounts, so they cannot load the scheduler from {path}"
    return None


@contextmanager
def temporary_postgres_schema() -> Iterator[str]:
    """A store URL in a fresh PostgreSQL schema of its own, dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    base = postgres_url()
    try:
        yield f"{base}{'&' if '?' in base else '?'}schema={schema}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def hooks_with(*modules: object) -> Any:
    """The kernel's typed hook facade with only ``modules`` registered (no entry points): test a hook module alone."""
    return Hooks(make_plugin_manager(list(modules), load_entry_points=False))


def load_provider(kind: str, name: str) -> Any:
    """Load an installed provider the way the kernel does (entry point, API major and Protocol checks)."""
    return _load_provider(kind, name)


def run_cli(*args: str, db: str | None = None) -> tuple[int, str, str]:
    """Run the ``scheduler`` CLI in this process: ``(exit code, stdout, stderr)``; ``db`` adds ``--db``."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli_main((["--db", db] if db else []) + list(args))
    return code, out.getvalue(), err.getvalue()


#: Environment prefixes of settings overrides (``SCHEDULER_<SECTION>_...``) and the settings file variable.
_SETTINGS_PREFIXES = ("SCHEDULER_DISPATCHER_", "SCHEDULER_STORAGE_", "SCHEDULER_DELIVERY_", "SCHEDULER_NOTIFICATIONS_", "SCHEDULER_JOBS_",
                      "SCHEDULER_EXECUTORS_",
                      "SCHEDULER_CHANNELS_", "SCHEDULER_PROVIDERS_")


def isolate_settings(monkeypatch: Any, config_home: Path) -> Path:
    """Keep a developer's settings out of a test: no ``SCHEDULER_CONFIG``, no override variables, an empty
    ``XDG_CONFIG_HOME``; the settings cache is reset. Returns the config home (subprocesses inherit it)."""
    for name in list(os.environ):
        if name == "SCHEDULER_CONFIG" or name.startswith(_SETTINGS_PREFIXES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))
    reload_settings()
    return config_home


def toml_value(value: Any) -> str:
    """A TOML literal for a str / bool / int / float / list / dict (inline table) value.

    Enough TOML for a test's settings tables, so no TOML writer is needed (the standard
    library only reads TOML); ``TypeError`` for anything else.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def write_settings(path: Path, tables: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write a settings file holding ``tables`` (``{"channels.webhook": {"url": ...}}`` → ``[channels.webhook]``).

    Tests load plugins from a real settings file rather than from objects they build, so the
    file's parsing, the settings class's validation and ``configure`` all run as in production.
    Returns ``path``.
    """
    lines: list[str] = []
    for table, values in tables.items():
        if lines:
            lines.append("")
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in values.items())
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def provider_loader(monkeypatch: Any, tmp_path: Path, kind: str) -> Iterator[Callable[..., Any]]:
    """Yield ``load(name, **settings)``: a ``kind`` provider loaded through its entry point with those settings.

    Each call writes ``[SECTION.NAME]`` (``[channels.NAME]``, ``[providers.NAME]`` ... as the
    kind's settings section is named) to ``tmp_path/scheduler.toml``, points
    ``SCHEDULER_CONFIG`` at it, reloads the settings and calls ``load_provider(kind, name)``:
    the API, Protocol and settings checks and ``configure`` run as the kernel runs them.
    Settings from outside the test are kept out (``isolate_settings``); on exit every loaded
    provider with a ``close`` method is closed and the settings cache is reset. Wrap it in a
    fixture: ``with provider_loader(monkeypatch, tmp_path, "channel") as load: yield load``.
    """
    section = SETTINGS_SECTIONS[kind]
    isolate_settings(monkeypatch, tmp_path / "xdg")
    loaded: list[Any] = []

    def load(name: str, **settings: Any) -> Any:
        path = write_settings(tmp_path / "scheduler.toml", {f"{section}.{name}": settings})
        monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
        reload_settings()
        provider = load_provider(kind, name)
        loaded.append(provider)
        return provider

    try:
        yield load
    finally:
        for provider in loaded:
            getattr(provider, "close", lambda: None)()
        reload_settings()


def evidence_run_document(run_id: str = "run-1", **result: Any) -> dict[str, Any]:
    """A payload document shaped like the kernel's: bindings, lineage, the result's digests.

    ``result`` overrides or adds fields of the ``result`` object (``status``, ``exit_code`` ...).
    """
    return {
        "schema": "scheduler.evidence.payload",
        "version": 1,
        "run_id": run_id,
        "job_id": "job-1",
        "dispatch_id": "job-1:schedule:1767225600000",
        "attempt": 1,
        "artifact_digest": "sha256:" + "a" * 64,
        "actor": {"dispatcher_owner": "host:123", "dispatcher_token": 7},
        "result": {"status": "ok", "exit_code": 0, "stdout_sha256": "sha256:" + "b" * 64, "stdout_bytes": 12,
                   "stderr_sha256": "sha256:" + "c" * 64, "stderr_bytes": 0, **result},
    }


def evidence_payload_for(document: dict[str, Any]) -> Any:
    """The ``EvidencePayload`` of ``document``: its canonical bytes and their ``sha256:`` digest.

    The bytes are sorted-key compact JSON, not the kernel's canonicaliser: for ASCII keys,
    integers and strings that *is* json-sort-v1, so it is an independent oracle for a
    provider's checks.
    """
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    digest = "sha256:" + hashlib.sha256(canonical).hexdigest()
    return EvidencePayload(document=document, canonical=canonical, digest=digest)


def make_evidence_payload(run_id: str = "run-1", **result: Any) -> Any:
    """``evidence_payload_for(evidence_run_document(run_id, **result))``: an ``EvidencePayload`` for a run."""
    return evidence_payload_for(evidence_run_document(run_id, **result))


__all__ = [
    "DEFAULT_POSTGRES_URL",
    "Behaviour",
    "EvidenceSetup",
    "EvidenceSetupRequest",
    "HttpReply",
    "HttpRequest",
    "HttpStandIn",
    "LocalRunControl",
    "MemoryProviderSessions",
    "PolicyRequest",
    "PolicySetup",
    "PosixShellPayloads",
    "ProofSetupRequest",
    "RawPayload",
    "ReceivedFile",
    "ReceivedMessage",
    "RunningDispatcher",
    "ServiceAnswer",
    "ServiceRequest",
    "SourceRequest",
    "Step",
    "add_job",
    "evidence_payload_for",
    "evidence_run_document",
    "hooks_with",
    "isolate_settings",
    "load_provider",
    "make_evidence_payload",
    "make_request",
    "postgres_unavailable_reason",
    "postgres_url",
    "provider_loader",
    "run_cli",
    "run_conformance",
    "run_rows",
    "sqlite_store",
    "temporary_postgres_schema",
    "toml_value",
    "wait_for",
    "write_policy_setup",
    "write_settings",
]
if "ExecutorConformance" in globals():  # the pytest base classes, when pytest is there (see the import above)
    __all__ += [
        "AuthorizationProviderConformance",
        "ChannelConformance",
        "CredentialProviderConformance",
        "EvidenceProviderConformance",
        "ExecutorConformance",
        "ProofVerifierConformance",
    ]
