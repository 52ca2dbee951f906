"""``scheduler proofs ...``: revoke an authorization proof or a signing key (append-only), list revocations and claims."""

from __future__ import annotations

import re
from typing import Any

import click

from scheduler.base.run_ids import short_run_id
from scheduler.cli.input import AsciiIntRange
from scheduler.cli.main import open_ctx_store
from scheduler.cli.output import emit, table

#: What a proof id or key id may look like (the verifier's proof-id alphabet, plus what key ids use).
_ID_RE = re.compile(r"[A-Za-z0-9._:@/+=-]{1,256}")


@click.group("proofs")
def proofs_group() -> None:
    """Authorization proofs (docs/proofs.md): revoke a proof id or a key id; list revocations and recent claims."""


@proofs_group.command("revoke")
@click.option("--proof-id", default=None, help="The proof id to revoke (a JWT's jti, a proof document's proof_id).")
@click.option("--key-id", default=None, help="The key id to revoke: a JWT kid or sha256:<SPKI hex>, an SSH/Ed25519"
                                             " SHA256:<base64> fingerprint, a certificate's sha256:<hex> fingerprint.")
@click.option("--reason", default=None, help="Why (recorded with your OS identity).")
def proofs_revoke(proof_id: str | None, key_id: str | None, reason: str | None) -> None:
    """Revoke a proof or a key for every later use (revocations cannot be changed or removed)."""
    from scheduler.base.errors import SchedulerError
    from scheduler.core.events import os_identity
    from scheduler.pipeline.proofs.step import revoke

    if (proof_id is None) == (key_id is None):
        raise SchedulerError("INVALID_ARGUMENT", "give exactly one of --proof-id ID or --key-id ID")
    for name, value in (("--proof-id", proof_id), ("--key-id", key_id)):
        if value is not None and not _ID_RE.fullmatch(value):
            raise SchedulerError("INVALID_ARGUMENT", f"{name} must be 1-256 characters of [A-Za-z0-9._:@/+=-]")
    if reason is not None and (len(reason) > 1000 or any(ord(c) < 32 for c in reason)):
        raise SchedulerError("INVALID_ARGUMENT", "--reason must be at most 1000 characters without control characters")
    row = revoke(open_ctx_store(), proof_id=proof_id, key_id=key_id, reason=reason, revoked_by=os_identity())
    view = _revocation_view(row)
    emit({"revocation": view}, lambda: click.echo(
        f"revoked {'proof ' + proof_id if proof_id else 'key ' + str(key_id)} (revocation {view['id']})"))


@proofs_group.command("list")
@click.option("--limit", type=AsciiIntRange(1, 100000), default=50, show_default=True, help="At most N recent claims.")
def proofs_list(limit: int) -> None:
    """Every revocation and the most recent claims of the replay ledger (which dispatch used which proof id)."""
    from scheduler.base.timeutil import to_iso
    from scheduler.pipeline.proofs.step import listing

    found = listing(open_ctx_store(), limit=limit)
    revocations = [_revocation_view(r) for r in found["revocations"]]
    claims = [{**c, "claimed_at": to_iso(c["claimed_at"]), "expires_at": to_iso(c["expires_at"])} for c in found["claims"]]

    def human() -> None:
        click.echo("revocations:")
        table([(r["id"][:8], r["proof_id"] or "-", r["key_id"] or "-", r["revoked_by"] or "-", r["revoked_at"], r["reason"] or "")
               for r in revocations], ["id", "proof", "key", "by", "at", "reason"])
        click.echo("claims:")
        table([(c["proof_id"], c["method"] or "-", c["job_name"] or c["job_id"] or "-", short_run_id(c["run_id"]) if c["run_id"] else "-", c["claimed_at"],
                c["expires_at"] or "-") for c in claims], ["proof", "method", "job", "run", "claimed", "expires"])

    emit({"revocations": revocations, "claims": claims}, human)


def _revocation_view(row: dict[str, Any]) -> dict[str, Any]:
    from scheduler.base.timeutil import to_iso

    return {**row, "revoked_at": to_iso(row["revoked_at"])}
