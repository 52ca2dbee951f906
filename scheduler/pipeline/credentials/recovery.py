"""The credentials step as a participant in crash recovery: a dead run's credential files removed, or its job paused."""

from __future__ import annotations

from scheduler.core.participants import Run
from scheduler.core.store.base import Store, Tx
from scheduler.pipeline.credentials.step import block_job_for_credentials, retry_failed_cleanup, sweep_presentations


class CredentialRecovery:
    """Recovery's ``CredentialCleanup`` (``scheduler.pipeline.credentials.step`` does the work)."""

    def clean(self, store: Store, run: Run) -> tuple[bool, str | None]:
        """Remove what the dead run presented (its failed cleanups tried again); ``(False, reason)`` when not proven."""
        return retry_failed_cleanup(store, run)

    def block_job(self, tx: Tx, run: Run, reason: str, *, actor: str, now: int) -> None:
        """Pause the run's job with the reason its cleanup is not proven (``jobs enable`` re-arms it)."""
        block_job_for_credentials(tx, run, reason, actor=actor, now=now)

    def sweep(self, store: Store) -> None:
        """Clean what finished runs of dead dispatchers left presented."""
        sweep_presentations(store)

