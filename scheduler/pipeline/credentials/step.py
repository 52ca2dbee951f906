"""Credentials: the pipeline step presenting a job's credential bindings to its run, and cleaning them up.

``presented(store, started, spec, executor, outcomes)`` wraps building the request and
``executor.execute`` (its ``around`` hook in the run plan, ``scheduler.core.dispatcher.execute``):

1. every binding is resolved through its provider (group ``scheduler.credential_providers``),
   each call bounded in time; the answer must match the binding (name, medium, key, file
   name, cardinality ``one``, required), must not be expired and must be a usable value,
   else the run ends ``error`` with a ``CREDENTIAL_*`` code and the command never starts
   (an optional binding that fails is skipped and recorded instead);
2. one short write transaction records a ``credential_presentations`` row per presented
   binding (medium, key / file name, provider, SHA-256 of the value, the private run
   directory of file presentations, expiry) with status ``materialized``, so recovery
   after ``kill -9`` can find what a dead run left;
3. file presentations are written as 0600 files in a 0700 directory made for the run;
   the executor gets ``CredentialPresentation`` objects (values in memory only);
4. on every way out (success, failure, timeout, cancellation, exception) the files and
   the directory are removed, the values dropped, and the rows marked ``cleaned`` (or
   ``failed`` with ``last_error``); a binding with ``revoke: after_run`` is first revoked
   through its provider (``revoke``, bounded in time). Only an explicit answer (``revoked``,
   an explicit ``not_revoked``, ``unsupported``) releases it; a missing, malformed or
   indeterminate one (no ``revoke``, not a ``RevokeResult``, an exception or timeout, a
   ``not_revoked`` the provider calls unavailable or indeterminate) fails closed: the run
   ends ``error`` / ``CREDENTIAL_REVOKE_INDETERMINATE`` (``after``). Every answer is recorded
   (``credentials_json``, a ``credential.revoked`` / ``credential.revoke_failed`` event, the
   row's ``last_error``).

The run records a summary (names, media, digests, counts; never a value) in
``runs.credentials_json`` and ``credential.*`` events. A job without bindings costs one
attribute test: no query, no transaction, no import.

For output redaction, ``redactions_of(request.credentials)`` gives ``(name, value bytes)``
for every presented value (file presentations carry their value too, for this only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core import state
from scheduler.core.artifact import artifact_path, redact_secrets
from scheduler.core.bounded import call_bounded as bounded
from scheduler.core.claimed import ClaimedRun
from scheduler.core.events import append_event
from scheduler.core.execution import CredentialPresentation, ExecutionResult
from scheduler.core.lease import owner_host
from scheduler.core.outcomes import RunOutcomes
from scheduler.core.participants import Run as RunRecord
from scheduler.core.redaction import record_redactions
from scheduler.core.rows import JSONObject
from scheduler.core.spec import JobSpec
from scheduler.core.steps import Normaliser, Problem, Problems, Run, StepBase
from scheduler.core.store.base import Store, Tx
from scheduler.pipeline.credentials.bindings import (
    MEDIUM_CAPABILITY,
    Binding,
    binding_objects,
    check_bindings,
    credential_problems,
    file_variable,
)
from scheduler.pipeline.credentials.chain import bindings_for_run
from scheduler.pipeline.credentials.sessions import StoreProviderSessions
from scheduler.plugins.loaded import LoadedProviders
from scheduler.plugins.options import provider_for
from scheduler.plugins.protocols import (
    CredentialBinding,
    CredentialContext,
    CredentialProvider,
    RefreshResult,
    ResolvedCredential,
    RevokeResult,
)

log = logging.getLogger(__name__)

#: Longest a provider's ``resolve`` may take (also bounded by what is left of the run's timeout).
RESOLVE_TIMEOUT_S = 30.0
#: Where the private per-run directories of file presentations are made (default: the system temp directory).
DIR_ENV = "SCHEDULER_CREDENTIALS_DIR"
DIR_PREFIX = "scheduler-cred-"
#: A provider that failed to load is not retried for this long (seconds).
PROVIDER_RETRY_S = 5.0
#: Longest a provider's ``revoke`` may take at cleanup (later is an indeterminate answer).
REVOKE_TIMEOUT_S = 15.0
#: The run code of a revocation that was not answered explicitly (fail closed).
REVOKE_INDETERMINATE = "CREDENTIAL_REVOKE_INDETERMINATE"
#: ``not_revoked`` reasons that say the provider could not tell (its reason starts with one): indeterminate, not explicit.
INDETERMINATE_REASONS = ("CREDENTIAL_REVOKE_UNAVAILABLE", "CREDENTIAL_REVOKE_INDETERMINATE")

_T = TypeVar("_T")

_providers = LoadedProviders("credential", unavailable_code="CREDENTIAL_NOT_AVAILABLE", noun="credential provider",
                             retry_s=PROVIDER_RETRY_S)


def redactions_of(credentials: Iterable[CredentialPresentation] | None) -> tuple[tuple[str, bytes], ...]:
    """``(binding name, value bytes)`` of every presented credential: what output redaction must hide."""
    out = []
    for c in credentials or ():
        value = getattr(c, "value", None)
        if value:
            out.append((c.name, value if isinstance(value, bytes) else value.encode("utf-8")))
    return tuple(out)


def credentials_dir() -> str:
    """The directory under which run directories of file presentations are made."""
    return os.environ.get(DIR_ENV) or tempfile.gettempdir()


def run_directory(run_id: str) -> str:
    """The private directory of run ``run_id``'s file presentations (made only when it has one)."""
    return os.path.join(credentials_dir(), f"{DIR_PREFIX}{run_id}")


def sha256_of(data: bytes) -> str:
    """``sha256:<hex>`` of a value (what the database keeps instead of it)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def credential_provider(name: str) -> Any:
    """The loaded provider ``name``, kept for the life of the process (a provider may cache tokens across runs).

    ``CREDENTIAL_NOT_AVAILABLE`` when it is not installed or fails to load (remembered briefly).
    """
    return _providers.get(name)


def forget_providers() -> None:
    """Drop the loaded providers (tests; a settings reload)."""
    _providers.forget()


def call_bounded(fn: Callable[[], _T], timeout_s: float, *, code: str, what: str, details: Mapping[str, object]) -> _T:
    """``fn()`` waited for at most ``timeout_s`` (``code`` when it takes longer): ``scheduler.core.bounded.call_bounded``.

    A late answer is dropped, so a hung provider cannot hold the run, and a value that arrives
    too late is never presented.
    """
    return bounded(fn, timeout_s, code=code, what=what, details=details, name="credential-resolve")


@attrs.define
class _Held:
    """One presented binding while the run holds it: its value (dropped at cleanup) and its row's facts."""

    binding: CredentialBinding
    data: bytes | None
    text: str | None
    sha256: str
    expires_at: int | None
    #: The binding's ``credential_presentations`` row id.
    id: str
    #: The provider's answer while the run holds it: what ``revoke`` is handed at cleanup (dropped then).
    credential: ResolvedCredential | None = None
    #: The binding says ``revoke: after_run``.
    revoke: bool = False


class _Presentation:
    """One run's credentials, from resolution to cleanup."""

    def __init__(self, store: Store, started: ClaimedRun, spec: JobSpec, executor: object, outcomes: RunOutcomes) -> None:
        self.store, self.started, self.spec, self.executor, self.outcomes = store, started, spec, executor, outcomes
        self.held: list[_Held] = []
        self.summary: list[JSONObject] = []
        self.directory: str | None = None
        self.rows_written = False
        self.policy: str | None = None
        self.providers: dict[str, CredentialProvider] = {}
        #: Names of the bindings to revoke when the run ends (``revoke: after_run``).
        self.revoking: set[str] = set()
        self.context: CredentialContext | None = None

    # -- resolution ------------------------------------------------------------------------------

    def _bindings(self) -> list[Any]:
        """The run's bindings (its chain parent's policy applied) as ``CredentialBinding`` objects, providers loaded."""
        raw, self.policy = bindings_for_run(self.store, self.started, self.spec, list(self.spec.credentials or []), self.outcomes)
        self.revoking = {b["name"] for b in raw if b.get("revoke") == "after_run"}
        providers: dict[str, CredentialProvider] = {}
        for b in raw:
            try:
                providers[b["provider"]] = credential_provider(b["provider"])
            except SchedulerError:
                pass  # reported per binding below
        self.providers = providers
        try:
            return binding_objects(raw, providers)
        except SchedulerError as exc:
            raise SchedulerError("CREDENTIAL_BINDING_INVALID", f"a credential binding's options no longer fit its provider: "
                                 f"{exc.message}", details={"cause": exc.code}) from None

    def _check_media(self, bindings: list[Any]) -> None:

        if self.spec.session_target == "main":
            raise SchedulerError("CREDENTIAL_MEDIUM_UNSUPPORTED", "the main session refuses credentials; nothing was resolved")
        capabilities = set(getattr(self.executor, "capabilities", ()))
        for b in bindings:
            need = MEDIUM_CAPABILITY[b.present.medium]
            if need not in capabilities:
                raise SchedulerError("CREDENTIAL_MEDIUM_UNSUPPORTED",
                                     f"credential {b.name!r}: executor {self.spec.executor_name()!r} lacks the capability {need}",
                                     details={"binding": b.name, "medium": b.present.medium})

    def _context(self) -> CredentialContext:
        """What every provider is told of the run (its identity, its lineage per the chain policy)."""
        identity = self.outcomes.identity
        if identity is not None and not isinstance(identity, Mapping):
            identity = getattr(identity, "to_json", lambda: None)()
        job = self.started.job
        return CredentialContext(run_id=self.started.run_id, job_id=job.id, attempt=self.started.attempt,
                                 artifact_digest=job.artifact_digest,
                                 identity=identity if isinstance(identity, Mapping) else None,
                                 source_run_id=self.started.parent_run_id if self.policy != "independent" else None,
                                 source_job_id=job.parent_id if self.policy not in (None, "independent") else None,
                                 sessions=StoreProviderSessions(self.store))  # provider_sessions bookkeeping (OAuth2 tokens)

    def _resolve_one(self, binding: CredentialBinding, context: CredentialContext) -> tuple[ResolvedCredential, bytes]:
        """The provider's checked answer and the value's bytes, or ``SchedulerError`` (``CREDENTIAL_*``)."""
        where = {"binding": binding.name, "provider": binding.provider}
        provider = self.providers.get(binding.provider)
        if provider is None:
            provider = credential_provider(binding.provider)  # raises CREDENTIAL_NOT_AVAILABLE (the failure is remembered)
        deadline_s = (self.started.started_at + int(self.spec.run_timeout_ms) - _now_ms()) / 1000.0
        timeout_s = min(RESOLVE_TIMEOUT_S, deadline_s)
        if timeout_s <= 0:
            raise SchedulerError("CREDENTIAL_RESOLVE_TIMEOUT", f"credential {binding.name!r}: the run's time was up before it "
                                 "could be resolved", details=where)
        try:
            answer = call_bounded(lambda: provider.resolve(binding, context), timeout_s, code="CREDENTIAL_RESOLVE_TIMEOUT",
                                  what=f"credential {binding.name!r}: provider {binding.provider!r}", details=where)
        except SchedulerError as exc:
            if exc.code.startswith("CREDENTIAL_"):
                raise
            raise SchedulerError("CREDENTIAL_RESOLVE_FAILED", f"credential {binding.name!r}: provider {binding.provider!r} "
                                 f"failed: {exc.code}", details={**where, "cause": exc.code}) from None
        except Exception as exc:  # noqa: BLE001 - a provider bug is a refusal, never a permit
            raise SchedulerError("CREDENTIAL_RESOLVE_FAILED", f"credential {binding.name!r}: provider {binding.provider!r} "
                                 f"raised {type(exc).__name__}", details={**where, "cause": type(exc).__name__}) from None
        if not isinstance(answer, ResolvedCredential):
            raise SchedulerError("CREDENTIAL_RESOLVE_FAILED", f"credential {binding.name!r}: provider {binding.provider!r} "
                                 f"returned {type(answer).__name__}, not a ResolvedCredential", details=where)
        answer = self._refresh_if_due(provider, answer, binding, context, where)
        _check_answer(binding, answer, where)
        return answer, _value_bytes(binding, answer.value, where)

    def _refresh_if_due(self, provider: CredentialProvider, answer: ResolvedCredential, binding: CredentialBinding,
                        context: CredentialContext, where: Mapping[str, object]) -> ResolvedCredential:
        """An answer already expired is refreshed once when the provider can (``refresh``); else it stays expired."""
        if answer.expires_at_ms is None or answer.expires_at_ms > _now_ms():
            return answer
        refresh = getattr(provider, "refresh", None)
        if refresh is None or "refresh" not in getattr(provider, "capabilities", ()):
            return answer
        try:
            result = call_bounded(lambda: refresh(answer, binding, context), RESOLVE_TIMEOUT_S,
                                  code="CREDENTIAL_RESOLVE_TIMEOUT", what=f"refresh of credential {binding.name!r}", details=where)
        except Exception:  # noqa: BLE001 - the expired answer is refused below
            return answer
        if isinstance(result, RefreshResult) and result.refreshed and result.credential is not None:
            return result.credential
        return answer

    def resolve_all(self) -> None:
        """Resolve and check every binding; a required failure raises before anything is written or presented."""
        bindings = self._bindings()
        self._check_media(bindings)
        context = self.context = self._context()
        for binding in bindings:
            entry: JSONObject = {"name": binding.name, "provider": binding.provider, "medium": binding.present.medium,
                                     "required": binding.required}
            if binding.present.key:
                entry["key"] = binding.present.key
            try:
                answer, data = self._resolve_one(binding, context)
            except SchedulerError as exc:
                entry.update(status="failed" if binding.required else "skipped", error_code=exc.code)
                self.summary.append(entry)
                if binding.required:
                    self.outcomes.record("credential.failed", {"binding": binding.name, "provider": binding.provider,
                                                               "code": exc.code})
                    raise
                self.outcomes.record("credential.skipped", {"binding": binding.name, "provider": binding.provider,
                                                            "code": exc.code})
                continue
            sha = sha256_of(data)
            entry.update(status="presented", sha256=sha, expires_at=answer.expires_at_ms)
            self.summary.append(entry)
            revoke = binding.name in self.revoking
            self.held.append(_Held(binding=binding, data=data, sha256=sha, expires_at=answer.expires_at_ms, id=uuid.uuid4().hex,
                                   text=answer.value if isinstance(answer.value, str) else None,
                                   credential=answer if revoke else None, revoke=revoke))

    # -- materialisation -------------------------------------------------------------------------

    def _file_name(self, binding: CredentialBinding) -> str:
        """The name of a file presentation's file (its ``file_name``, else the binding's name)."""
        return binding.present.file_name or binding.name

    def write_rows(self) -> None:
        """One short transaction: a ``materialized`` row per presented binding, before any file exists."""
        if not self.held:
            return
        now = _now_ms()
        directory = run_directory(self.started.run_id) if any(h.binding.present.medium == "file" for h in self.held) else None
        self.directory = directory
        with self.store.transaction() as tx:
            for h in self.held:
                b = h.binding
                medium = b.present.medium
                tx.execute(
                    "INSERT INTO credential_presentations (id, run_id, binding_name, provider, medium, env_key, file_name,"
                    " cardinality, required, status, artifact_digest, materialized_at, presented_sha256, temp_path, expires_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, 'one', ?, 'materialized', ?, ?, ?, ?, ?)",
                    (h.id, self.started.run_id, b.name, b.provider, medium,
                     b.present.key if medium == "env" else file_variable(b.name) if medium == "file" else None,
                     self._file_name(b) if medium == "file" else None, int(b.required), self.started.job.artifact_digest,
                     now, h.sha256, directory if medium == "file" else None, h.expires_at),
                )
        self.rows_written = True

    def materialise(self) -> tuple[Any, ...]:
        """The presentations handed to the executor (files written now, in the run's private directory)."""
        out = []
        if self.directory is not None:
            try:
                os.mkdir(self.directory, 0o700)
            except OSError as exc:
                raise SchedulerError("CREDENTIAL_MATERIALIZE_FAILED", f"cannot make the private credential directory: "
                                     f"{exc.strerror or type(exc).__name__}", details={"path": self.directory}) from None
        for h in self.held:
            b = h.binding
            medium = b.present.medium
            if medium == "file":
                path = os.path.join(self.directory or "", self._file_name(b))
                try:
                    _write_private(path, h.data or b"")  # materialised before cleanup, which is what drops the value
                except OSError as exc:
                    raise SchedulerError("CREDENTIAL_MATERIALIZE_FAILED", f"credential {b.name!r}: cannot write its file: "
                                         f"{exc.strerror or type(exc).__name__}", details={"binding": b.name}) from None
                value: Any = h.text if h.text is not None else h.data
                out.append(CredentialPresentation(name=b.name, medium="file", key=file_variable(b.name), path=path,
                                                  value=value, sha256=h.sha256))
            else:
                out.append(CredentialPresentation(name=b.name, medium=medium, key=b.present.key if medium == "env" else None,
                                                  value=h.text, sha256=h.sha256))
        if self.held:
            self.outcomes.record("credential.materialized", {
                "bindings": [{"name": h.binding.name, "medium": h.binding.present.medium, "sha256": h.sha256}
                             for h in self.held]})
        return tuple(out)

    # -- cleanup ---------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Remove the files and the directory, drop the values, mark the rows; never raises."""
        if not self.summary and not self.held and self.directory is None:
            return  # nothing was bound (a chain child its parent grants nothing)
        failed: dict[str, str] = {}
        if self.directory is not None:
            for h in self.held:
                if h.binding.present.medium != "file":
                    continue
                problem = remove_file(os.path.join(self.directory, self._file_name(h.binding)))
                if problem:
                    failed[h.id] = problem
            problem = remove_directory(self.directory)
            if problem:
                for h in self.held:
                    if h.binding.present.medium == "file":
                        failed.setdefault(h.id, problem)
        revoked = self._revoke_all()
        for h in self.held:
            h.data = h.text = None  # the values go with the last reference the kernel holds
            h.credential = None
        if self.rows_written:
            self._mark_rows(failed, {k: v for k, v in revoked.items() if v is not None})
        counts = {"presented": sum(1 for e in self.summary if e["status"] == "presented"),
                  "skipped": sum(1 for e in self.summary if e["status"] == "skipped"),
                  "failed": sum(1 for e in self.summary if e["status"] == "failed")}
        self.outcomes.columns["credentials_json"] = _json({"bindings": self.summary, **counts,
                                                           "cleanup": "failed" if failed else "cleaned"})
        if self.held:
            kind = "credential.cleanup_failed" if failed else "credential.cleaned"
            self.outcomes.record(kind, {"bindings": [h.binding.name for h in self.held], "failed": len(failed)})

    def _revoke_all(self) -> dict[str, str | None]:
        """Revoke every held binding that asks for it (``revoke: after_run``), recording each answer; returns, per row id,
        what its row's ``last_error`` records (None: revoked)."""
        out: dict[str, str | None] = {}
        for h in self.held:
            if not h.revoke:
                continue
            outcome, explicit, reason = self._revoke_one(h)
            entry = next((e for e in self.summary if e["name"] == h.binding.name and e["status"] == "presented"), None)
            if entry is not None:
                entry["revocation"] = {"outcome": outcome, "explicit": explicit, **({"reason": reason} if reason else {})}
            data: JSONObject = {"binding": h.binding.name, "provider": h.binding.provider, "outcome": outcome}
            if outcome == "revoked":
                self.outcomes.record("credential.revoked", data)
                out[h.id] = None
                continue
            data.update(explicit=explicit, reason=reason)
            self.outcomes.record("credential.revoke_failed", data)
            # an explicit answer's reason starts with the provider's own code; an unanswered one is ours
            out[h.id] = (f"{reason or outcome}" if explicit else f"{REVOKE_INDETERMINATE}: {outcome}: {reason}")[:1000]
        return out

    def _revoke_one(self, h: _Held) -> tuple[str, bool, str | None]:
        """``(outcome, explicit, reason)`` of revoking one binding: ``revoked``, ``not_revoked`` or ``unsupported`` as the
        provider answered (explicit unless it says it could not tell), else ``missing``, ``malformed`` or ``indeterminate``."""
        provider = self.providers.get(h.binding.provider)
        revoke = getattr(provider, "revoke", None)
        if provider is None or h.credential is None or not callable(revoke) or "revoke" not in getattr(provider, "capabilities", ()):
            return "missing", False, f"credential provider {h.binding.provider!r} does not revoke"
        credential, context = h.credential, self.context
        try:
            answer = call_bounded(lambda: revoke(credential, h.binding, context), REVOKE_TIMEOUT_S,
                                  code=REVOKE_INDETERMINATE, what=f"revocation of credential {h.binding.name!r}",
                                  details={"binding": h.binding.name, "provider": h.binding.provider})
        except SchedulerError as exc:
            return "indeterminate", False, f"{exc.code}: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - a provider bug is no answer, never a yes
            return "indeterminate", False, f"the provider raised {type(exc).__name__}"
        if not isinstance(answer, RevokeResult):
            return "malformed", False, f"the provider returned {type(answer).__name__}, not a RevokeResult"
        outcome = answer.outcome
        reason = answer.reason if isinstance(answer.reason, str) else None
        if outcome == "not_revoked" and (not reason or reason.startswith(INDETERMINATE_REASONS)):
            return "indeterminate", False, reason or "not_revoked without a reason"
        return outcome, True, reason

    def _mark_rows(self, failed: dict[str, str], revocations: Mapping[str, str] | None = None) -> None:
        now = _now_ms()
        revocations = revocations or {}
        for attempt in range(5):
            try:
                with self.store.transaction() as tx:
                    for h in self.held:
                        if h.id in failed:
                            tx.execute("UPDATE credential_presentations SET status = 'failed', cleaned_at = ?, last_error = ?"
                                       " WHERE id = ? AND status = 'materialized'", (now, failed[h.id], h.id))
                        else:  # cleaned; a revocation that was not confirmed stays on the row
                            tx.execute("UPDATE credential_presentations SET status = 'cleaned', cleaned_at = ?, last_error = ?"
                                       " WHERE id = ? AND status = 'materialized'", (now, revocations.get(h.id), h.id))
                return
            except Exception:  # a busy database: try again; recovery covers a dead process
                log.warning("marking credential presentations of run %s cleaned failed (attempt %d)", self.started.run_id,
                            attempt + 1, exc_info=True)
                time.sleep(0.05 * (attempt + 1))


def _check_answer(binding: CredentialBinding, answer: ResolvedCredential, where: Mapping[str, object]) -> None:
    """The answer must be for exactly this binding, and still valid."""
    present = binding.present
    expected = {"name": binding.name, "medium": present.medium, "key": present.key, "file_name": present.file_name,
                "cardinality": "one", "required": binding.required}
    got = {"name": answer.name, "medium": answer.medium, "key": answer.key, "file_name": answer.file_name,
           "cardinality": answer.cardinality, "required": answer.required}
    wrong = sorted(k for k in expected if expected[k] != got[k])
    if wrong:
        raise SchedulerError("CREDENTIAL_BINDING_MISMATCH", f"credential {binding.name!r}: provider {binding.provider!r} "
                             f"answered for a different binding ({', '.join(wrong)} differ); nothing was presented",
                             details={**where, "fields": wrong})
    if answer.expires_at_ms is not None and answer.expires_at_ms <= _now_ms():
        raise SchedulerError("CREDENTIAL_EXPIRED", f"credential {binding.name!r}: provider {binding.provider!r} answered "
                             "with a value that has already expired; it was not presented",
                             details={**where, "expires_at_ms": answer.expires_at_ms})


def _value_bytes(binding: CredentialBinding, value: object, where: Mapping[str, object]) -> bytes:
    """The value as bytes, checked for its medium (text without NUL for env and stdin; anything non-empty for a file)."""
    medium = binding.present.medium
    if not isinstance(value, (str, bytes)) or len(value) == 0:
        raise SchedulerError("CREDENTIAL_VALUE_INVALID", f"credential {binding.name!r}: the provider's value is empty or "
                             "not text/bytes", details=where)
    if isinstance(value, bytes):
        if medium != "file":
            raise SchedulerError("CREDENTIAL_VALUE_INVALID", f"credential {binding.name!r}: a binary value can only be "
                                 f"presented as a file, not by {medium}", details=where)
        return value
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError:
        raise SchedulerError("CREDENTIAL_VALUE_INVALID", f"credential {binding.name!r}: the value is not valid Unicode",
                             details=where) from None
    if medium == "env" and "\x00" in value:
        raise SchedulerError("CREDENTIAL_VALUE_INVALID", f"credential {binding.name!r}: an environment value cannot hold "
                             "NUL", details=where)
    return data


def _write_private(path: str, data: bytes) -> None:
    """Create ``path`` 0600 (never following or replacing anything) and write ``data`` to it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def remove_file(path: str) -> str | None:
    """Remove one presentation file; None when it is gone (or never existed), else why not."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"CREDENTIAL_CLEANUP_FAILED: cannot remove {path}: {exc.strerror or type(exc).__name__}"
    return None


def remove_directory(path: str) -> str | None:
    """Remove a run's private directory with whatever is in it; None when it is gone, else why not."""
    if not os.path.lexists(path):
        return None
    if os.path.islink(path) or not os.path.isdir(path):
        try:
            os.unlink(path)
        except OSError as exc:
            return f"CREDENTIAL_CLEANUP_FAILED: cannot remove {path}: {exc.strerror or type(exc).__name__}"
        return None
    errors: list[str] = []
    shutil.rmtree(path, onerror=lambda _fn, p, info: errors.append(f"{p}: {getattr(info[1], 'strerror', None) or info[1]}"))
    if errors or os.path.lexists(path):
        return f"CREDENTIAL_CLEANUP_FAILED: cannot remove {path}: {errors[0] if errors else 'still there'}"
    return None


def _now_ms() -> int:
    return now_ms()


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def presents_nothing(spec: JobSpec, started: ClaimedRun) -> bool:
    """Whether a run has nothing to present: no bindings of its own, and not a chain child (whose parent's policy may
    hand some on). One attribute test for most jobs."""
    return not spec.credentials and not (spec.schedule_kind == "chain" and started.parent_run_id)


@contextmanager
def presented(store: Store, started: ClaimedRun, spec: JobSpec, executor: object,
              outcomes: RunOutcomes) -> Iterator[tuple[CredentialPresentation, ...]]:
    """Materialise the job's credentials for the run, and clean them up on every path (see the module docstring).

    A job with no bindings that is not a chain child costs one attribute test; a chain child
    without bindings reads its parent's ``child_credential_policy`` (one primary-key read).
    """
    if presents_nothing(spec, started):
        yield ()
        return
    presentation = _Presentation(store, started, spec, executor, outcomes)
    try:
        try:
            presentation.resolve_all()
            try:
                presentation.write_rows()
            except Exception as exc:  # noqa: BLE001 - a busy or lost database: nothing may be presented unrecorded
                raise SchedulerError("CREDENTIAL_MATERIALIZE_FAILED", "the credential presentations could not be recorded: "
                                     f"{getattr(exc, 'code', None) or type(exc).__name__}") from None
            credentials = presentation.materialise()
        except SchedulerError:
            raise
        except Exception as exc:
            log.exception("credential presentation of run %s failed", started.run_id)
            raise SchedulerError("CREDENTIAL_MATERIALIZE_FAILED",
                                 f"credentials could not be presented: {type(exc).__name__}") from None
        yield credentials
    finally:
        try:
            presentation.cleanup()
        except Exception:  # cleanup must not turn the run's own result into a crash
            log.exception("credential cleanup of run %s failed; recovery removes what is left", started.run_id)


# -- recovery after kill -9 --------------------------------------------------------------------------------------


def _safe_run_directory(path: str) -> bool:
    """Whether ``path`` is a directory this module makes (a tampered row must never make recovery remove anything else)."""
    return os.path.isabs(path) and os.path.basename(path.rstrip(os.sep)).startswith(DIR_PREFIX) and ".." not in path.split(os.sep)


def recover_presentations(store: Store, run: RunRecord) -> tuple[bool, str | None]:
    """Clean what a dead run presented: remove its files, mark its ``materialized`` rows ``recovery_cleaned``.

    Returns ``(True, None)`` when cleanup is proven (nothing left, or every file removed) and
    ``(False, reason)`` when it is not: a file directory on another host, a path this module
    did not make, or one that exists and cannot be removed (those rows become ``failed`` with
    the reason). Env and stdin presentations died with the dead process's memory.
    """


    with store.read() as tx:
        rows = tx.all("SELECT id, temp_path, binding_name, provider FROM credential_presentations WHERE run_id = ?"
                      " AND status = 'materialized'", (run["id"],))
        revoking = _revoking_bindings(tx, run.get("job_id")) if rows else set()
    if not rows:
        return True, None
    host = owner_host(run.get("dispatcher_owner"))
    failed: dict[str, str] = {}
    for path in sorted({r["temp_path"] for r in rows if r["temp_path"]}):
        problem: str | None
        if host is not None and host != socket.gethostname():
            problem = f"CREDENTIAL_CLEANUP_FAILED: {path} is on host {host}; it cannot be removed from here"
        elif not _safe_run_directory(path):
            problem = f"CREDENTIAL_CLEANUP_FAILED: {path} is not a credential run directory; it was left alone"
        else:
            problem = remove_directory(path)
        if problem:
            for r in rows:
                if r["temp_path"] == path:
                    failed[r["id"]] = problem
    now = _now_ms()
    unrevoked = [r for r in rows if r["binding_name"] in revoking and r["id"] not in failed]
    unrevoked_ids = {r["id"] for r in unrevoked}
    with store.transaction() as tx:
        for r in rows:
            if r["id"] in failed:
                tx.execute("UPDATE credential_presentations SET status = 'failed', last_error = ? WHERE id = ?"
                           " AND status = 'materialized'", (failed[r["id"]], r["id"]))
            else:  # a value the job wanted revoked died with the dispatcher unrevoked: recorded, never called revoked
                tx.execute("UPDATE credential_presentations SET status = 'recovery_cleaned', cleaned_at = ?, last_error = ?"
                           " WHERE id = ? AND status = 'materialized'",
                           (now, RECOVERY_UNREVOKED if r["id"] in unrevoked_ids else None, r["id"]))
        for r in unrevoked:
            append_event(tx, "credential.revoke_failed", job_id=run.get("job_id"), run_id=run["id"], at=now, data={
                "binding": r["binding_name"], "provider": r["provider"], "outcome": "indeterminate", "explicit": False,
                "reason": RECOVERY_UNREVOKED})
    if failed:
        return False, min(failed.values())
    return True, None


#: What recovery records for a ``revoke: after_run`` value its dead dispatcher held: no revocation can be asked for it.
RECOVERY_UNREVOKED = (f"{REVOKE_INDETERMINATE}: the dispatcher holding the value died before revoking it; it may be valid"
                      " until it expires")


def _revoking_bindings(tx: Tx, job_id: object) -> set[str]:
    """Names of the job's bindings that ask for revocation after the run (none for a job that is gone)."""
    raw = tx.scalar("SELECT credentials FROM jobs WHERE id = ?", (job_id,)) if isinstance(job_id, str) else None
    try:
        bindings = json.loads(raw) if isinstance(raw, str) else []
    except ValueError:
        return set()
    return {b["name"] for b in bindings if isinstance(b, dict) and b.get("revoke") == "after_run" and isinstance(b.get("name"), str)}


def retry_failed_cleanup(store: Store, run: RunRecord) -> tuple[bool, str | None]:
    """A blocked run's second chance: its ``failed`` rows are tried again (the operator may have fixed the cause)."""
    with store.transaction() as tx:
        tx.execute("UPDATE credential_presentations SET status = 'materialized' WHERE run_id = ? AND status = 'failed'"
                   " AND last_error LIKE 'CREDENTIAL_CLEANUP_FAILED%'", (run["id"],))
    return recover_presentations(store, run)


def block_job_for_credentials(tx: Tx, run: RunRecord, reason: str, *, actor: str, now: int) -> None:
    """Pause the job of a run whose credential cleanup cannot be proven, with the reason (``jobs enable`` re-arms it)."""
    paused = f"recovery blocked: {reason}"
    changed = state.execute(tx, "block_job", job_id=run["job_id"], now=now, reason=paused[:1000])
    if changed:
        append_event(tx, "job.paused", job_id=run["job_id"], run_id=run["id"], actor=actor, at=now,
                     data={"reason": "credential cleanup not proven", "detail": reason})


def sweep_presentations(store: Store, *, now: int | None = None) -> list[str]:
    """Clean presentations left ``materialized`` by finished runs whose dispatcher is gone (a worker abandoned at
    shutdown that never got to its cleanup); returns the run ids swept."""
    now = _now_ms() if now is None else now
    with store.read() as tx:
        runs = tx.all(
            "SELECT DISTINCT r.id, r.dispatcher_owner FROM credential_presentations p JOIN runs r ON r.id = p.run_id"
            " WHERE p.status = 'materialized' AND r.status IN ('ok', 'error', 'timeout', 'cancelled', 'crashed', 'skipped')"
            " AND NOT EXISTS (SELECT 1 FROM dispatcher_leases l WHERE l.owner = r.dispatcher_owner"
            " AND l.token = r.dispatcher_token AND l.expires_at > ?)", (now,))
    for run in runs:
        recover_presentations(store, run)
    # Finished runs whose cleanup failed (a file that could not be removed): tried again each pass, so once the
    # operator removed the directory (or fixed its permissions) the rows become ``recovery_cleaned`` and ``status
    # --check`` is healthy again. Both reads use a partial index (``status = 'materialized'`` / ``'failed'``).
    with store.read() as tx:
        failed = tx.all(
            "SELECT DISTINCT r.id, r.dispatcher_owner FROM credential_presentations p JOIN runs r ON r.id = p.run_id"
            " WHERE p.status = 'failed' AND p.last_error LIKE 'CREDENTIAL_CLEANUP_FAILED%'"
            " AND r.status IN ('ok', 'error', 'timeout', 'cancelled', 'crashed', 'skipped')")
    for run in failed:
        retry_failed_cleanup(store, run)
    return [r["id"] for r in runs] + [r["id"] for r in failed]


# -- the pipeline step -----------------------------------------------------------------------------------------


def normalise_bindings(value: object, field: str = "credentials") -> tuple[list[Binding] | None, list[Problem]]:
    """Validate and normalise a ``credentials`` value (``bindings.check_bindings``), every problem reported."""
    problems: list[Problem] = []
    bindings = check_bindings(value, lambda where, message, code: problems.append({"field": where, "code": code, "error": message}))
    return bindings, problems


class CredentialStep(StepBase):
    """The pipeline step: credentials materialised around execution and cleaned up on every path, before evidence."""

    name = "credentials"
    fields: Mapping[str, Normaliser | None] = {"credentials": normalise_bindings, "child_credential_policy": None}
    sections = ("credential_presentation",)

    def project(self, spec: JobSpec) -> JSONObject:
        """The normalised bindings (references, never values); the child policy only when not "none", so a job
        without credentials keeps its digest."""
        return {"credential_presentation": {
            "bindings": redact_secrets(list(spec.credentials or [])),
            **({"child_policy": spec.child_credential_policy} if spec.child_credential_policy != "none" else {}),
        }}

    def check(self, values: Mapping[str, Any], problems: Problems) -> None:
        """The main session refuses credentials."""
        if values.get("credentials") and values.get("session_target") == "main":
            problems.add("credentials", "the main session refuses credentials (it is shared and outlives the run)",
                         "CREDENTIAL_MEDIUM_UNSUPPORTED")

    def check_installed(self, spec: JobSpec) -> tuple[JSONObject, list[Problem]]:
        """The bindings against the target, the installed executor's media and the providers' options."""
        if not spec.credentials:
            return {}, []
        return {}, credential_problems(spec, provider_for("executor", spec.executor_name()))

    def check_section(self, name: str, value: Any, sections: Mapping[str, Any]) -> list[Problem]:
        """Compiled bindings must be what ``jobs add`` accepts; a child policy needs bindings to hand on."""
        found: list[Problem] = []
        bindings = value["bindings"]
        if bindings:
            check_bindings(bindings, lambda where, message, code: found.append(
                {"field": artifact_path(where, "credentials", "credential_presentation.bindings"), "code": code, "error": message}))
        if "child_policy" in value and not bindings:
            found.append({"field": "credential_presentation.child_policy", "code": "CONFLICT",
                          "error": "a child credential policy without credential bindings hands nothing on"})
        return found

    def applies(self, sections: Mapping[str, Any]) -> bool:
        """Every job: a chain child may present what its parent's policy hands on, which its own artifact does not
        show (``presented`` costs one attribute test for a job that presents nothing)."""
        return True

    def around(self, run: Run) -> AbstractContextManager[None]:
        """Resolve and present the credentials for the execution; clean them up however it ends (a run with nothing
        to present gets no context: ``run.credentials`` stays empty)."""
        if presents_nothing(run.spec, run.started):
            return nullcontext()
        return self._presenting(run)

    @contextmanager
    def _presenting(self, run: Run) -> Iterator[None]:
        with presented(run.store, run.started, run.spec, run.executor, run.outcomes) as credentials:
            run.credentials = credentials
            yield

    def after(self, run: Run, result: ExecutionResult) -> ExecutionResult:
        """What output redaction replaced, recorded on the run: counts per binding, never a value. A revocation at
        cleanup that was not answered explicitly fails the run closed (``CREDENTIAL_REVOKE_INDETERMINATE``)."""
        if run.credentials and run.executed:
            result = record_redactions(result, run.outcomes)
        unanswered = [data for kind, data in run.outcomes.events
                      if kind == "credential.revoke_failed" and not data.get("explicit")]
        if unanswered and result.status == "ok":
            names = ", ".join(str(d["binding"]) for d in unanswered)
            result = attrs.evolve(result, status="error", error_code=REVOKE_INDETERMINATE,
                                  error_message=f"credential {names}: the revocation after the run was not answered explicitly"
                                                f" ({unanswered[0]['outcome']}: {unanswered[0]['reason']}); it may still be valid",
                                  details={**(result.details or {}), "revocation": [dict(d) for d in unanswered]})
        return result
