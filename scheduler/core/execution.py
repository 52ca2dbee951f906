"""The executor API: what the dispatcher hands an executor, and what it gets back.

An executor is a plain synchronous object. The dispatcher runs it in a worker
thread with an ``ExecutionRequest`` (what to run, until when, where to put large
output) and a ``RunControl`` (cancellation, and durable bookkeeping callbacks that
must happen *before* the work can cause side effects, such as the process
identity of a shell command). It returns an ``ExecutionResult``, whose output streams are
``StreamCapture``s made by the ``StreamRecorder`` (both in ``scheduler.core.outputs``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from scheduler.core.outputs import StreamCapture, StreamRecorder
from scheduler.core.redaction import Redactions, redactions_for
from scheduler.core.spec import JobSpec

#: Terminal statuses an executor may report.
EXECUTION_STATUSES = ("ok", "error", "timeout", "cancelled")
#: The handle key naming which of the run's steps the recorded work is, and its value for the post-success
#: verification check (``verify_shell``): a run ended without its executor's result while the last handle it
#: recorded says ``"step": "verify"`` ends with ``verify_status`` ``interrupted`` (``verification_interrupted``).
HANDLE_STEP_KEY, VERIFY_STEP = "step", "verify"
#: The verification record of a run ended while its check ran (``runs.verify_json``; ``verify_status`` says the same).
INTERRUPTED_VERIFICATION: Mapping[str, str] = {"status": "interrupted"}


def verification_interrupted(handle: Mapping[str, Any] | None) -> bool:
    """Whether the work a run's last recorded handle names is its post-success verification check.

    The dispatcher asks this when it ends a run without its executor's result (crash recovery,
    an abandoned worker): the check was cut short, so the run's ``verify_status`` becomes
    ``interrupted`` instead of staying empty while its evidence says ``interrupted``.
    """
    return handle is not None and handle.get(HANDLE_STEP_KEY) == VERIFY_STEP


@attrs.frozen(kw_only=True)
class Constraints:
    """What a job demands that its executor enforce (``constraints`` in the spec).

    Governance compares these with the executor's ``capabilities`` before anything
    runs: a constraint the executor cannot enforce refuses the job (and the run),
    never runs it unenforced.
    """

    sandbox: bool = False
    #: None: no restriction; ``none``: no network at all; ``loopback``: this host only.
    network: Literal["none", "loopback"] | None = None
    allowed_paths: tuple[str, ...] | None = None
    max_tokens: int | None = None
    max_cost: float | None = None

    def required_capabilities(self) -> frozenset[str]:
        """The executor capabilities these constraints need (kebab-case)."""
        need = set()
        if self.sandbox:
            need.add("sandbox")
        if self.network is not None:
            need.add("network-restriction")
        if self.allowed_paths is not None:
            need.add("path-restriction")
        if self.max_tokens is not None:
            need.add("token-cap")
        if self.max_cost is not None:
            need.add("cost-cap")
        return frozenset(need)


@attrs.frozen(kw_only=True, repr=False)
class CredentialPresentation:
    """A materialised credential handed to an executor: in memory only, never stored.

    ``medium`` ``env``: set ``key`` to ``value``; ``file``: a 0600 file at ``path`` the
    kernel created and removes; ``stdin``: feed ``value`` to the payload's input.
    """

    name: str
    medium: str
    key: str | None = None
    path: str | None = None
    value: str | None = None
    sha256: str | None = None

    def __repr__(self) -> str:
        return f"CredentialPresentation(name={self.name!r}, medium={self.medium!r}, key={self.key!r}, value=<redacted>)"


@attrs.frozen(kw_only=True)
class ExecutionRequest:
    """Everything an executor needs to run one attempt of one job."""

    run_id: str
    job_id: str
    #: The kernel-level job spec (schedule, retries, ``payload_message``, ``output_format``...).
    job: JobSpec
    #: This executor's validated ``executor_options`` (an instance of its ``options_class``), or None.
    options: Any = None
    constraints: Constraints = attrs.Factory(Constraints)
    #: Materialised credentials for this run (values live only in memory).
    credentials: tuple[CredentialPresentation, ...] = ()
    #: ``sha256:<hex>`` of the job's execution artifact, when artifacts exist.
    artifact_digest: str | None = None
    dispatch_kind: str = "manual"
    attempt: int = 1
    scheduled_for_ms: int | None = None
    started_at_ms: int
    deadline_ms: int
    #: Per-run directory for offloaded output. It may not exist yet: ``StreamRecorder``
    #: creates it on first offload (an executor writing files itself must ``mkdir`` it).
    artifacts_dir: Path
    #: Root of the artifact store; ``StreamCapture.artifact`` paths are relative to it.
    artifacts_root: Path
    #: Extra variables the kernel adds to the job's environment (run id, job id, ...).
    extra_env: dict[str, str] = attrs.Factory(dict)
    #: Why this attempt runs (dispatch kind, attempt, the chain parent / retried / replayed run and its output).
    trigger: TriggerContext | None = None
    #: What this executor kept for this job after its last ``ok`` run (``ExecutionResult.state``), or None.
    state: Mapping[str, Any] | None = None

    @functools.cached_property
    def redactions(self) -> Redactions | None:
        """What output recorders must redact: the presented credential values (``scheduler.core.redaction``), compiled
        once per request; None without credentials (no scanning: the plain path)."""
        if not self.credentials:
            return None
        return redactions_for(self.credentials)

    def stream_recorder(self, name: str, **limits: Any) -> StreamRecorder:
        """The ``StreamRecorder`` for output stream ``name`` of this run, redacting its credentials: the one line
        every executor uses (``limits``: ``excerpt_bytes``, ``offload_bytes``, ``cap_bytes``)."""
        return StreamRecorder(root=self.artifacts_root, directory=self.artifacts_dir, name=name,
                              redactions=self.redactions, **limits)


@attrs.frozen(kw_only=True)
class TriggerContext:
    """Why this attempt runs: its dispatch kind and, for chained, retried and replayed work, the run it follows.

    ``source_output`` is a bounded text excerpt of that run's stdout (``SOURCE_OUTPUT_CHARS``):
    untrusted content an executor must treat as data (the agent executor wraps it with
    provenance markers before it reaches a prompt).
    """

    dispatch_kind: str
    attempt: int = 1
    source_run_id: str | None = None
    source_status: str | None = None
    source_error_code: str | None = None
    source_output: str | None = None
    source_output_truncated: bool = False


#: Characters of the source run's stdout handed to the next run (``TriggerContext.source_output``).
SOURCE_OUTPUT_CHARS = 8_000
#: Largest ``ExecutionResult.state`` kept for a job (JSON bytes); a larger one is not kept and an event says so.
MAX_EXECUTOR_STATE_BYTES = 1024 * 1024


@attrs.frozen(kw_only=True)
class RecoveryRequest:
    """Crash recovery asks an executor to make sure a dead dispatcher's run left nothing running."""

    run_id: str
    job_id: str
    #: What the run recorded with ``RunControl.record_handle`` (None: it never got that far).
    handle: dict[str, Any] | None
    #: The dead dispatcher's owner id (``host:pid:...``) and host name.
    owner: str | None
    owner_host: str | None
    kill_grace_s: float = 2.0


@attrs.frozen(kw_only=True)
class RecoveryOutcome:
    """What ``recover`` found: ``gone`` (nothing was running, nothing signalled), ``terminated``
    (it stopped the work; ``detail`` says how, e.g. ``SIGTERM``), ``unknown`` (cannot tell,
    e.g. another host) or ``blocked`` (still running and cannot be stopped: retried later)."""

    state: str
    detail: str | None = None


@attrs.frozen(kw_only=True)
class ExecutionResult:
    """What an executor reports. ``status`` is one of ``EXECUTION_STATUSES``."""

    status: str
    exit_code: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    stdout: StreamCapture | None = None
    stderr: StreamCapture | None = None
    #: Structured output record: format, valid, warning, bytes, sha256 and parsed or artifact.
    structured: dict[str, Any] | None = None
    #: Verification audit: status, timing, exit metadata, byte counts and hashes only.
    verification: dict[str, Any] | None = None
    #: Text that chain conditions and deliveries see (normally the stdout excerpt).
    summary: str | None = None
    env_warning: str | None = None
    #: Resource use an executor measured: ``prompt_tokens``, ``completion_tokens``, ``cost``...
    usage: dict[str, Any] = attrs.Factory(dict)
    details: dict[str, Any] = attrs.Factory(dict)
    #: What to keep for this job's next run (handed back as ``ExecutionRequest.state``): a JSON object, kept only
    #: when this run commits ``ok``, in the same transaction. None keeps what is there; ``{}`` clears it.
    state: Mapping[str, Any] | None = None


@runtime_checkable
class RunControl(Protocol):
    """The dispatcher's side of a running execution."""

    def is_cancelled(self) -> bool:
        """True once cancellation was requested (by a user, a lost lease or shutdown)."""

    def wait_cancelled(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s``; True as soon as cancellation is requested."""

    def cancel_reason(self) -> str | None:
        """Why the run was cancelled (``user``, ``lease_lost``, ``shutdown``...), if it was."""

    def record_handle(self, handle: dict[str, Any]) -> None:
        """Durably record what ``recover`` needs to find this run's work after a crash (a process
        identity, a remote turn id), before that work may act; raises ``STALE_FENCE`` if the fence is lost.

        ``"step": "verify"`` in the handle says the work is the post-success verification check
        (``VERIFY_STEP``): should the run end without a result now, its ``verify_status`` is ``interrupted``."""

    def record_termination(self, how: str) -> None:
        """Durably record that the executor stopped the work (and how, e.g. ``SIGKILL``) before completion."""

    def event(self, kind: str, data: dict[str, Any] | None = None) -> None:
        """Append a runtime event for this run (audit trail)."""


#: Guards the making of a token's event (``CancellationToken._flag``): held for that instant only, once per token at most.
_FLAG_LOCK = threading.Lock()


class CancellationToken:
    """The cancellation half of a ``RunControl``: set once, first reason wins, waitable.

    Its ``threading.Event`` is made when first needed (a cancel, or a wait): the dispatcher makes a token per run
    on its loop thread, and most runs end without either (``_flag``).
    """

    def __init__(self) -> None:
        self._event: threading.Event | None = None
        self._reason: str | None = None

    def _flag(self) -> threading.Event:
        """The token's event, made once (under ``_FLAG_LOCK``: a cancel and a wait racing get the same one)."""
        event = self._event
        if event is None:
            with _FLAG_LOCK:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
        return event

    def cancel(self, reason: str = "user") -> None:
        """Request cancellation; a later request does not change the recorded reason."""
        if self._reason is None:
            self._reason = reason
        self._flag().set()

    def is_cancelled(self) -> bool:
        event = self._event
        return event is not None and event.is_set()

    def wait_cancelled(self, timeout_s: float) -> bool:
        return self._flag().wait(max(0.0, timeout_s))

    def cancel_reason(self) -> str | None:
        return self._reason


class LocalRunControl(CancellationToken):
    """An in-memory ``RunControl`` for running an executor outside the dispatcher.

    Used by the conformance engine and by plugin tests; it records what the
    executor reported so assertions can look at it. ``cancel()`` requests
    cancellation the same way the dispatcher does.
    """

    def __init__(self) -> None:
        super().__init__()
        self.handles: list[dict[str, Any]] = []
        self.terminations: list[str] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def record_handle(self, handle: dict[str, Any]) -> None:
        self.handles.append(dict(handle))

    def record_termination(self, how: str) -> None:
        self.terminations.append(how)

    def event(self, kind: str, data: dict[str, Any] | None = None) -> None:
        self.events.append((kind, dict(data or {})))
