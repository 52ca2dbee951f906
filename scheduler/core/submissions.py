"""Submitted execution artifacts (handoff v4): the contract core's job storage calls, installed by the composition root.

Core binds a job to its native execution artifact itself. A job spec object may instead carry
an artifact compiled elsewhere (a handoff v4 one, ``scheduler.artifacts.handoff``); core takes
it out of the object, has it verified against the job, stores it, and keeps a bound job from
drifting away from it, all through the installed ``SubmittedKind``. ``scheduler.runtime``
installs the handoff kind (``scheduler.artifacts.handoff_kind``). With none installed, a spec
object's submission keys are unknown fields (validation refuses them) and a job already bound to
a submitted artifact is not changed: ``SUBMITTED_KIND_NOT_INSTALLED`` (fail closed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

from scheduler.base.errors import SchedulerError
from scheduler.core.rows import JSONObject

if TYPE_CHECKING:
    from scheduler.core.rows import JobRow
    from scheduler.core.spec import JobSpec

__all__ = ["NOT_INSTALLED", "Submission", "SubmittedKind", "bound_kind", "install", "installed", "installed_as"]

#: The error code when a job is bound to a submitted artifact kind that is not installed.
NOT_INSTALLED = "SUBMITTED_KIND_NOT_INSTALLED"


class Submission(Protocol):
    """A submitted artifact taken out of a job spec object (shape-checked; ``verify`` proves it against the job)."""

    @property
    def version(self) -> int:
        """The kind's version, recorded in ``jobs.handoff_version`` (4)."""

    @property
    def digest(self) -> str:
        """The artifact's digest as submitted."""

    @property
    def effective_task_hash(self) -> str:
        """The submitted ``effective_task_hash`` (recorded on the job)."""

    @property
    def payload(self) -> JSONObject:
        """The artifact itself, stored as it was submitted once verified."""

    def verify(self, spec: JobSpec, *, job_id: str | None = None) -> str:
        """Prove the payload against its digest and ``spec`` (compiled for ``job_id``); return the digest, else raise."""


class SubmittedKind(Protocol):
    """A kind of submitted execution artifact: how a spec object carries it, and what a bound job must keep."""

    @property
    def version(self) -> int:
        """``jobs.handoff_version`` of the jobs bound to this kind."""

    @property
    def fields(self) -> tuple[str, ...]:
        """The job-spec keys that carry a submission (they are not job fields)."""

    def split(self, obj: JSONObject) -> tuple[JSONObject, Submission | None]:
        """``(obj without the submission keys, the Submission or None)``; ``obj`` is not modified."""

    def binding_digest(self, spec: JobSpec) -> str:
        """The digest of what an artifact of this kind binds of ``spec``: a change of it needs a new artifact."""


_installed: SubmittedKind | None = None
#: A deferred installation (``install(factory)``): made on first use, so a command that binds no job imports none.
_pending: Callable[[], SubmittedKind] | None = None


def install(kind: SubmittedKind | None) -> None:
    """Install the submitted artifact kind (the composition root calls this). None uninstalls it.

    Replaces whatever was installed before, deferred or not.
    """
    global _installed, _pending
    _installed, _pending = kind, None


def install_deferred(factory: Callable[[], SubmittedKind]) -> None:
    """Install the kind ``factory`` gives, made on first use (CLI start-up imports no artifact kind it does not bind)."""
    global _installed, _pending
    _installed, _pending = None, factory


def installed() -> SubmittedKind | None:
    """The installed submitted artifact kind, or None."""
    global _installed, _pending
    if _installed is None and _pending is not None:
        _installed, _pending = _pending(), None
    return _installed


def bound_kind(row: JobRow | Mapping[str, object]) -> SubmittedKind:
    """The installed kind of a job row bound to a submitted artifact; ``SUBMITTED_KIND_NOT_INSTALLED`` when it is not."""
    kind = installed()
    version, name = row.get("handoff_version"), row.get("name")
    if kind is None or kind.version != version:
        raise SchedulerError(NOT_INSTALLED, f"job {name!r} is bound to a handoff v{version}"
                             " artifact and that artifact kind is not installed (the composition root, scheduler.runtime,"
                             " installs it)")
    return kind


@contextlib.contextmanager
def installed_as(kind: SubmittedKind | None) -> Iterator[None]:
    """Install ``kind`` (None: nothing) for the body, then restore what was installed before (tests)."""
    global _installed, _pending
    before = _installed, _pending
    try:
        _installed, _pending = kind, None
        yield
    finally:
        _installed, _pending = before
