"""The scheduler's health as ``scheduler status`` and ``scheduler doctor`` report it, for the CLI and ``scheduler.api.ops``.

``collect_status(store)`` is ``status --json``'s ``status`` (leases, queue, runs, outbox,
approvals, recent skips, evidence counts, disk-full episodes), ``check_reasons(status)`` what
makes ``status --check`` fail, and ``store_checks(store)`` / ``plugin_check()`` the checks
``doctor`` prints: one code path for the CLI and for a plugin such as the web view.
"""

from __future__ import annotations

import json
import os
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.base.run_ids import short_run_id
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core.artifact import verify_stored
from scheduler.core.debts import debt_summary
from scheduler.core.events import DISK_FULL_EVENT
from scheduler.core.jobs import JOB_STATE_SQL
from scheduler.core.lease import list_leases, owner_host, owner_is_dead_local_process, owner_pid
from scheduler.core.spec import spec_from_row
from scheduler.evidence.verify import evidence_counts, evidence_diagnostics
from scheduler.ops import service_unit
from scheduler.pipeline.authorization import authorization_provider, provider_problems, split_ref
from scheduler.plugins.inventory import inventory

__all__ = ["CANCEL_OVERDUE_MS", "check_reasons", "collect_status", "free_bytes", "last_disk_full", "plugin_check",
           "store_checks"]


def collect_status(store: Any) -> dict[str, Any]:
    """Leases, queue, runs, outbox, approvals and recent skips, as one JSON-able dict."""

    now = now_ms()
    with store.read() as tx:
        leases = [
            # the holder's PID and host come from the lease owner id (host:pid:random), which the
            # lease itself vouches for; the pid file beside a SQLite database is only a convenience
            {**lease, "live": bool(lease["owner"]) and (lease["expires_at"] or 0) > now, "pid": owner_pid(lease["owner"]),
             "host": owner_host(lease["owner"]),
             **{k: to_iso(lease[k]) for k in ("acquired_at", "renewed_at", "expires_at")}}
            for lease in list_leases(tx)
        ]
        queue = {r["status"]: r["n"] for r in tx.all("SELECT status, COUNT(*) AS n FROM job_dispatch_queue GROUP BY status")}
        expired = tx.scalar("SELECT COUNT(*) FROM job_dispatch_queue WHERE status = 'claimed' AND claim_expires_at <= ?", (now,))
        runs = {r["status"]: r["n"] for r in tx.all("SELECT status, COUNT(*) AS n FROM runs GROUP BY status")}
        blocked = tx.all("SELECT id, job_id, error_message FROM runs WHERE status = 'recovery_blocked'")
        # credential cleanup that could not be proven (partial index on status = 'failed'): files may be left on disk
        cleanup_failed = tx.scalar("SELECT COUNT(*) FROM credential_presentations WHERE status = 'failed'")
        outbox = {r["status"]: r["n"] for r in tx.all("SELECT status, COUNT(*) AS n FROM delivery_outbox GROUP BY status")}
        approvals = {r["status"]: r["n"] for r in tx.all("SELECT status, COUNT(*) AS n FROM approvals GROUP BY status")}
        # pending past their timeout: decided by the next dispatcher pass; many, or old ones, mean no dispatcher runs
        overdue = tx.scalar("SELECT COUNT(*) FROM approvals WHERE status = 'pending' AND expires_at <= ?", (now,))

        jobs = {r["state"]: r["n"] for r in tx.all(f"SELECT {JOB_STATE_SQL} AS state, COUNT(*) AS n FROM jobs GROUP BY 1")}
        skipped = tx.all("SELECT id, job_id, skip_reason, created_at FROM runs WHERE status = 'skipped' ORDER BY created_at DESC LIMIT 5")
        cancels = tx.scalar("SELECT COUNT(*) FROM runs WHERE cancel_requested_at IS NOT NULL AND status = 'running'")
        nxt = tx.scalar("SELECT MIN(next_run_at) FROM jobs WHERE enabled = 1 AND next_run_at IS NOT NULL")

        evidence = evidence_counts(tx)  # counts only; `doctor` re-verifies
        disk_full = last_disk_full(tx)
        debts = debt_summary(tx, now=now)  # completion debts not yet reconciled: open, overdue, failed
    return {
        "database": store.location,
        "schema_version": store.schema_version(),
        "leases": leases,
        "jobs": jobs,
        "queue": {**queue, "expired_claims": expired},
        "runs": runs,
        "recovery_blocked": blocked,
        "credentials": {"cleanup_failed": cleanup_failed,
                        "runs_blocked": [r["id"] for r in blocked if (r["error_message"] or "").startswith("CREDENTIAL_")]},
        "cancel_requests_pending": cancels,
        "outbox": outbox,
        "completion_debts": debts,
        "approvals": {**approvals, "expired_pending": overdue},
        "recent_skips": [{**s, "created_at": to_iso(s["created_at"])} for s in skipped],
        "next_run_at": to_iso(nxt),
        "evidence": evidence,
        "db_disk_full": disk_full,
        "free_bytes": free_bytes(store.local_path),
    }


def last_disk_full(tx: Any) -> dict[str, Any] | None:
    """The last episode a dispatcher met its database full (``DB_DISK_FULL``, waited out), or None: when it began
    and ended, how long it lasted and how many passes met it (the event a dispatcher records once it can write again)."""

    row = tx.one("SELECT at, actor, data FROM runtime_events WHERE job_id IS NULL AND kind = ? ORDER BY at DESC, id DESC"
                 " LIMIT 1", (DISK_FULL_EVENT,))
    if row is None:
        return None
    data = json.loads(row["data"] or "{}")
    since, until = data.get("since"), data.get("until", row["at"])
    return {"since": to_iso(since), "until": to_iso(until), "seconds": round((until - since) / 1000, 1) if since else None,
            "attempts": data.get("attempts"), "dispatcher": row["actor"]}


def free_bytes(local_path: Any) -> int | None:
    """Bytes free to this user on the file system of a local database (None for a server database): 0 means full."""
    if local_path is None:
        return None
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(local_path)))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def check_reasons(status: dict[str, Any]) -> list[dict[str, Any]]:
    """Why ``status --check`` fails (empty: healthy): each ``{"check", "reason", ...}`` from one ``collect_status``.

    No live dispatcher lease (or one whose holder is a dead process on this host), runs in
    ``recovery_blocked``, credential cleanup failures (presentations ``failed``, runs blocked on a
    ``CREDENTIAL_*`` cleanup), failed outbox parts, overdue completion debts, approvals pending past their timeout. Meant
    for cron, systemd and monitors: it only reads.
    """

    reasons: list[dict[str, Any]] = []
    live = [lease for lease in status["leases"] if lease["live"] and lease["name"] != "maintenance"]
    alive = [lease for lease in live if not owner_is_dead_local_process(lease["owner"])]
    if not alive:
        dead = ", ".join(f"pid {lease['pid']}" for lease in live)
        reasons.append({"check": "dispatcher", "reason": f"dispatcher gone ({dead} no longer runs; its lease has not expired yet)"
                        if live else "no live dispatcher holds the lease"})
    if status["recovery_blocked"]:
        reasons.append({"check": "recovery_blocked", "count": len(status["recovery_blocked"]),
                        "runs": [r["id"] for r in status["recovery_blocked"]],
                        "reason": f"{len(status['recovery_blocked'])} run(s) recovery_blocked"})
    credentials = status["credentials"]
    if credentials["cleanup_failed"] or credentials["runs_blocked"]:
        reasons.append({"check": "credentials", "count": credentials["cleanup_failed"], "runs": credentials["runs_blocked"],
                        "reason": f"{credentials['cleanup_failed']} credential presentation(s) not cleaned up,"
                                  f" {len(credentials['runs_blocked'])} run(s) blocked on credential cleanup"})
    failed = status["outbox"].get("failed", 0)
    if failed:
        reasons.append({"check": "outbox", "count": failed, "reason": f"{failed} delivery part(s) failed"})
    late = status["completion_debts"]["overdue"]
    if late:
        reasons.append({"check": "completion_debts", "count": late, "runs": [d["run_id"] for d in status["completion_debts"]["overdue_debts"]],
                        "reason": f"{late} completion debt(s) open past their delivery's whole retry budget"})
    overdue = status["approvals"].get("expired_pending", 0)
    if overdue:
        reasons.append({"check": "approvals", "count": overdue, "reason": f"{overdue} approval(s) pending past their timeout"})
    return reasons


def _artifact_check(store: Any) -> dict[str, Any]:
    """Every stored execution artifact still hashes to its digest, and every job still matches its artifact."""

    with store.read() as tx:
        problems = verify_stored(tx)
        count = tx.scalar("SELECT COUNT(*) FROM execution_artifacts")
    detail = "; ".join(f"{p.get('job') or p['digest']}: {p['code']}" for p in problems[:5]) or f"{count} verified"
    return {"check": "execution_artifacts", "ok": not problems, "detail": detail, "problems": problems}


def _evidence_check(store: Any) -> dict[str, Any]:
    """The newest evidence rows re-verified from history, and runs whose evidence row is missing (docs/evidence.md)."""

    diag = evidence_diagnostics(store)
    bad = diag["invalid"] + diag["missing"]
    samples = "; ".join(f"{short_run_id(s['run_id'])}: {s['code']}" for s in diag["invalid_samples"][:5])
    detail = (f"{diag['checked']} checked, {diag['invalid']} invalid, {diag['missing']} missing"
              + (f" ({diag['unchecked']} older not checked)" if diag["unchecked"] else "") + (f": {samples}" if samples else ""))
    return {"check": "evidence", "ok": not bad, "detail": detail, "evidence": diag}


def _authorization_check(store: Any) -> dict[str, Any] | None:
    """Every enabled job's ``authorization_ref`` policy as its provider sees it now (``check_policy``: a Cedar syntax
    error, a missing rules file), its ``provider_config`` against the provider's options, and the provider itself:
    each problem names the job, since every run of that job would be denied. None when no job names one (no import)."""
    with store.read() as tx:
        rows = tx.all("SELECT * FROM jobs WHERE enabled = 1 AND authorization_ref IS NOT NULL ORDER BY name")
    if not rows:
        return None

    problems: list[dict[str, Any]] = []

    def load(kind: str, name: str) -> Any:
        return authorization_provider(name)

    for row in rows:
        spec = spec_from_row(row)
        try:
            _, found = provider_problems(spec, load)
        except SchedulerError as exc:
            found = [{"code": exc.code, "error": exc.message}]
        except Exception as exc:  # noqa: BLE001 - a provider that breaks the check is a problem, never a pass
            found = [{"code": "AUTHORIZATION_POLICY_INVALID", "error": f"{split_ref(spec.authorization_ref or '')[0]}: "
                                                                     f"{type(exc).__name__}: {exc}"}]
        problems += [{"job": row["name"], "authorization_ref": spec.authorization_ref, "code": p["code"], "error": p["error"]}
                     for p in found]
    detail = ("; ".join(f"job {p['job']}: {p['code']}: {p['error']}" for p in problems[:5])
              + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")) or f"{len(rows)} job(s) checked"
    return {"check": "authorization_policies", "ok": not problems, "detail": detail, "problems": problems}


#: A cancel request on a running run older than this, still not honoured, fails ``doctor`` (a dispatcher honours one
#: within its grace, 10 s by default; a request this old means no dispatcher is handling the run).
CANCEL_OVERDUE_MS = 60_000


def _lease_check(status: dict[str, Any]) -> dict[str, Any]:
    """The dispatcher lease: a warning when none is live (nothing runs) or its holder is a dead local process."""

    live = [lease for lease in status["leases"] if lease["live"] and lease["name"] != "maintenance"]
    dead = [lease for lease in live if owner_is_dead_local_process(lease["owner"])]
    if dead:  # a warning: the lease expires by itself and the next dispatcher recovers its runs (status --check fails)
        return {"check": "dispatcher_lease", "ok": True, "warning": True,
                "detail": "warning: " + "; ".join(f"lease {lease['name']!r} held by pid {lease['pid']}, which no longer runs (the lease"
                                    f" expires at {lease['expires_at']}; its runs are recovered then)" for lease in dead)}
    if not live:
        return {"check": "dispatcher_lease", "ok": True, "warning": True,
                "detail": "warning: no live dispatcher lease: nothing runs until `scheduler run` (or its service) starts"}
    return {"check": "dispatcher_lease", "ok": True,
            "detail": "; ".join(f"{lease['name']} held by pid {lease['pid']} on {lease['host']} (token {lease['token']},"
                                f" until {lease['expires_at']})" for lease in live)}


def _cancellation_check(store: Any) -> dict[str, Any]:
    """Cancel requests on running runs: pending ones are fine; one not honoured for ``CANCEL_OVERDUE_MS`` fails."""
    now = now_ms()
    with store.read() as tx:
        rows = tx.all("SELECT id, cancel_requested_at FROM runs WHERE cancel_requested_at IS NOT NULL AND status = 'running'"
                      " ORDER BY cancel_requested_at")
    overdue = [r for r in rows if now - int(r["cancel_requested_at"]) > CANCEL_OVERDUE_MS]
    detail = f"{len(rows)} pending cancel request(s), {len(overdue)} not honoured after {CANCEL_OVERDUE_MS // 1000} s"
    if overdue:
        detail += (": " + ", ".join(f"run {short_run_id(r['id'])} (requested {to_iso(r['cancel_requested_at'])})" for r in overdue[:5])
                   + " (is a dispatcher running?)")
    return {"check": "cancellations", "ok": not overdue, "detail": detail, "runs": [r["id"] for r in overdue]}


def store_checks(store: Any) -> list[dict[str, Any]]:
    """``doctor``'s checks of an open store, in the order it prints them: open, the store's own health, the lease,
    cancellations, expired claims, recovery, credentials, artifacts, the sandbox, evidence, authorization policies,
    deliveries and approvals. Each is ``{"check", "ok", "detail", ...}`` (``warning`` when it only warns)."""
    checks: list[dict[str, Any]] = [{"check": "open", "ok": True, "detail": f"{store.location} (schema {store.schema_version()})"}]
    checks.extend(store.health())
    status = collect_status(store)
    checks.append(_lease_check(status))
    checks.append(_cancellation_check(store))
    checks.append({"check": "expired_claims", "ok": status["queue"]["expired_claims"] == 0,
                   "detail": f"{status['queue']['expired_claims']} expired claim(s)"})
    checks.append({"check": "recovery_blocked", "ok": not status["recovery_blocked"],
                   "detail": f"{len(status['recovery_blocked'])} run(s) blocked"})
    credentials = status["credentials"]
    checks.append({"check": "credentials", "ok": not (credentials["cleanup_failed"] or credentials["runs_blocked"]),
                   "detail": f"{credentials['cleanup_failed']} presentation(s) failed cleanup,"
                             f" {len(credentials['runs_blocked'])} run(s) blocked on it"
                             + (" (remove what is left in the run's scheduler-cred-<run id> directory; recovery"
                                " retries each pass)" if credentials["cleanup_failed"] or credentials["runs_blocked"] else "")})
    checks.append(_artifact_check(store))
    checks.append(service_unit.sandbox_check(store))  # jobs a sandboxed system unit would likely break
    checks.append(_evidence_check(store))
    authorization = _authorization_check(store)
    if authorization is not None:
        checks.append(authorization)
    failed = status["outbox"].get("failed", 0)
    checks.append({"check": "deliveries", "ok": True, "warning": bool(failed),
                   "detail": f"warning: {failed} failed part(s): `scheduler deliveries list --status failed`"
                             if failed else f"{status['outbox'].get('pending', 0)} pending, none failed"})
    debts = status["completion_debts"]
    checks.append({"check": "completion_debts", "ok": debts["overdue"] == 0, "warning": bool(debts["failed"]),
                   "detail": f"{debts['open']} open, {debts['overdue']} overdue, {debts['failed']} failed"
                             + (" (is a dispatcher running? `scheduler deliveries checkpoint RUN`)" if debts["overdue"] else "")})
    overdue = status["approvals"]["expired_pending"]
    checks.append({"check": "approvals", "ok": overdue == 0,
                   "detail": f"{status['approvals'].get('pending', 0)} pending, {overdue} past their timeout"
                             + (" (is a dispatcher running?)" if overdue else "")})
    return checks


def plugin_check() -> dict[str, Any]:
    """``doctor``'s plugins check: every installed plugin loaded; one that failed or is invalid fails it."""
    try:
        plugins = inventory(load=True)
    except SchedulerError as exc:
        return {"check": "plugins", "ok": False, "detail": exc.message}
    # Every group counts, hook modules included: a hook module pluggy refused (a misspelled hook
    # name) is as unhealthy as a provider that does not import, though other commands keep working.
    bad = [p for p in plugins if p["status"] in ("failed", "invalid")]
    loaded = sum(p["status"] == "ok" for p in plugins)
    return {"check": "plugins", "ok": not bad,
            "detail": "; ".join(f"{p['group'].split('.', 1)[-1]} {p['name']} from {p['distribution']} {p['status']}: {p['error']}"
                                for p in bad) or f"{loaded} loaded"}
