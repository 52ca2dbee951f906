"""The delivery outbox: messages split into parts, and the consumer that sends them through channel plugins.

Every external message (a run's result, a watchdog alert, an approval notice) is
enqueued in ``delivery_outbox`` inside the transaction that decided it, split by the
channel's ``limits`` into parts with deterministic ``<group>:part:i/N`` idempotency keys.
Nothing else sends.

The consumer runs in each dispatcher (``DeliveryWorker``, a thread beside the run loop):
it claims due parts with an expiry (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so several
dispatchers share the work), hands each to one of ``[delivery] concurrency`` sender threads
(at most ``channel_concurrency`` of a channel, never two parts of one run at once), which
sends it through its channel and records the outcome with a compare-and-swap on its claim token:

* ``delivered`` with the channel's receipt id (a delivered part is final: a guard refuses
  any later change, so it is never sent again by the scheduler);
* a transient failure is retried with exponential backoff and jitter, or after the
  channel's ``Retry-After`` when it gave one, until ``max_attempts``; then ``failed``;
* a permanent failure is ``failed`` at once.

Parts of one message go out in order: a part is claimed only when every earlier part of
its group is delivered, so a retry resumes at the first undelivered part. When a part
fails for good the parts after it fail with it (``deliveries retry`` re-arms them).

A claim that expires (its dispatcher died between sending and recording) is taken
over and the part sent again *with the same idempotency key*: a channel that honours
keys shows it once; a key-less channel may show it twice (at-least-once delivery).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.base.run_ids import short_run_id
from scheduler.base.timeutil import now_ms, to_iso
from scheduler.core import state
from scheduler.core.dispatcher.pool import WorkerPool
from scheduler.core.duty import DutyThread
from scheduler.core.events import append_event
from scheduler.core.id_refs import ids_with_end
from scheduler.core.outputs import read_artifact
from scheduler.core.store.base import Store, Tx
from scheduler.plugins.loaded import LoadedProviders
from scheduler.plugins.options import channel_options_for
from scheduler.plugins.protocols import (
    ChannelLimits,
    DeliveryPart,
    DeliveryReceipt,
    DeliveryRoute,
    PermanentDeliveryError,
    TransientDeliveryError,
)
from scheduler.settings import current_settings

log = logging.getLogger(__name__)

#: Outbox part states.
STATUSES = ("pending", "claimed", "delivered", "failed", "cancelled")
#: How long a channel that failed to load is remembered before it is tried again.
CHANNEL_RETRY_S = 5.0
#: The consumer never sleeps longer than this without looking (another process may have re-armed a part).
MAX_SLEEP_S = 1.0
#: Longest part body recorded in the message when the channel declares no limit.
TRUNCATION_NOTE = "\n[… {more} more characters not delivered; the whole output: scheduler runs output {run}]"

#: Set when this process enqueued parts: the dispatcher wakes its consumer after the pass that committed them.
parts_enqueued = threading.Event()

_channels = LoadedProviders("channel", unavailable_code="CHANNEL_NOT_AVAILABLE", noun="channel", retry_s=CHANNEL_RETRY_S,
                            per_settings=True)


def load_channel(name: str) -> Any:
    """The loaded (configured) channel plugin ``name``; ``CHANNEL_NOT_AVAILABLE`` (remembered for a few seconds) when it cannot load.

    Instances are kept for the current settings: reloaded settings load the channels afresh.
    """
    return _channels.get(name)


def channel_limits(name: str) -> ChannelLimits:
    """The channel's limits (read from the configured instance); the defaults when it cannot load."""
    try:
        limits = getattr(load_channel(name), "limits", None)
    except SchedulerError:
        limits = None
    return limits if isinstance(limits, ChannelLimits) else ChannelLimits()


def split_body(body: str, limits: ChannelLimits, *, run_id: str | None = None) -> list[str]:
    """``body`` cut into at most ``limits.max_parts`` parts of at most ``limits.max_chars`` characters (UTF-16 units).

    Cuts fall on line ends where a line end is in the second half of a part, so lines stay
    whole; the cut is deterministic (a retry of the enqueue makes the same parts). What does
    not fit in ``max_parts`` is dropped with a note naming the run whose output it was.
    """
    size = max(2, limits.max_chars)
    parts: list[str] = []
    rest = body
    while rest:
        fit = _fitting(rest, size)
        if fit == len(rest):
            parts.append(rest)
            break
        cut = rest.rfind("\n", fit // 2, fit)
        cut = cut + 1 if cut != -1 else fit
        parts.append(rest[:cut])
        rest = rest[cut:]
    if not parts:
        parts = [""]
    most = max(1, limits.max_parts)
    if len(parts) > most:
        kept = parts[:most]
        room = max(0, size - len(TRUNCATION_NOTE.format(more=len(body), run=run_id or "-")))
        kept[-1] = kept[-1][:room]
        note = TRUNCATION_NOTE.format(more=len(body) - sum(len(p) for p in kept), run=run_id or "-")
        last = kept[-1] + note
        kept[-1] = last[:_fitting(last, size)]  # a limit shorter than the note keeps what of it fits
        parts = kept
    return parts


def _fitting(text: str, units: int) -> int:
    """How many characters of ``text`` fit in ``units`` UTF-16 code units (what services such as Telegram count).

    A character outside the Basic Multilingual Plane (most emoji) takes two units, so a part
    is never longer than its channel's limit in either measure.
    """
    if len(text) <= units and text.isascii():
        return len(text)
    used = 0
    for i, ch in enumerate(text):
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > units:
            return i
    return len(text)


def enqueue(tx: Tx, run: dict[str, Any], channel: str, target: str | None, body: str, group: str, now: int,
            *, attachments: tuple[dict[str, Any], ...] = ()) -> int:
    """Enqueue one message about ``run`` for ``channel`` as parts ``<group>:part:i/N``; idempotent on ``group``.

    Returns how many parts were new (0 when the message was already enqueued).
    Attachments ride on the last part.
    """
    max_attempts = current_settings().delivery.max_attempts
    bodies = split_body(body, channel_limits(channel), run_id=run.get("id"))
    count = len(bodies)
    created = 0
    for index, text in enumerate(bodies, start=1):
        key = f"{group}:part:{index}/{count}"
        created += state.execute(tx, "insert_outbox_part", idempotency_key=key, run_id=run.get("id"), job_id=run.get("job_id"),
                                 channel=channel, target=target, group_key=group, part_index=index, part_count=count, body=text,
                                 max_attempts=max_attempts, now=now)
        if index == count and created:
            for ordinal, att in enumerate(attachments):
                tx.execute(
                    "INSERT INTO delivery_attachments(id, outbox_id, ordinal, name, mime_type, size_bytes, sha256, content, path,"
                    " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (str(uuid.uuid4()), key, ordinal, att["name"], att["mime_type"], att["size_bytes"], att["sha256"],
                     att.get("content"), att.get("path"), now),
                )
    if created:
        parts_enqueued.set()
    return created


def output_attachments(run: dict[str, Any], channel: str, body: str) -> tuple[dict[str, Any], ...]:
    """The run's complete stdout as an attachment, staged when the message cannot carry it and the channel takes files.

    Staged by reference to the artifact store (offloaded output) or with its bytes (short
    output), with its size and SHA-256; the consumer re-reads and re-checks it before
    sending. Output larger than the channel's ``max_attachment_bytes`` is not attached.
    """
    limits = channel_limits(channel)
    size = run.get("stdout_bytes") or 0
    if not limits.supports_attachments or not size or not run.get("stdout_sha256") or size > limits.max_attachment_bytes:
        return ()
    fits = len(body) <= limits.max_chars * limits.max_parts and not run.get("stdout_artifact")
    if fits:
        return ()
    staged = {"name": f"output-{short_run_id(str(run['id']))}.txt", "mime_type": "text/plain", "size_bytes": size,
              "sha256": run["stdout_sha256"]}
    if run.get("stdout_artifact"):
        return ({**staged, "path": run["stdout_artifact"]},)
    content = (run.get("stdout_excerpt") or "").encode("utf-8")
    if len(content) != size:
        return ()
    return ({**staged, "content": content},)


# -- the consumer ------------------------------------------------------------------------------------


def next_due(tx: Tx) -> int | None:
    """When the consumer has something to do: the earliest due pending part or expiring claim."""
    a = tx.scalar("SELECT MIN(due_at) FROM delivery_outbox WHERE status = 'pending'")
    b = tx.scalar("SELECT MIN(claim_expires_at) FROM delivery_outbox WHERE status = 'claimed'")
    values = [v for v in (a, b) if v is not None]
    return min(values) if values else None


def claim_due(store: Store, owner: str, *, now: int, limit: int, ttl_ms: int, look: int | None = None,
              room: Mapping[str, int] | None = None, sending: Collection[str] = ()) -> list[dict[str, Any]]:
    """Claim up to ``limit`` sendable parts, reading at most ``look`` (default ``limit``) candidates in due order.

    Sendable: due, or with an expired claim; every earlier part of its message delivered;
    and no other part of its run under a live claim (parts of one run never go out at
    once; on PostgreSQL two claims in the same instant may still each take one). In one batch a run gets at most one part.
    ``room`` is what is left of a channel's limit (``[delivery] channel_concurrency``): a
    channel with none left is not read, one with some gets at most that many. ``sending``
    are ids this consumer is sending now (their claims may have expired: never claimed twice here).
    """
    claimed: list[dict[str, Any]] = []
    room = dict(room or {})
    full = sorted(channel for channel, left in room.items() if left <= 0)
    with store.transaction() as tx:
        rows = tx.all(
            "SELECT o.* FROM delivery_outbox o WHERE ((o.status = 'pending' AND o.due_at <= ?)"
            " OR (o.status = 'claimed' AND o.claim_expires_at <= ?))"
            " AND NOT EXISTS (SELECT 1 FROM delivery_outbox p WHERE p.group_key = o.group_key AND p.part_index < o.part_index"
            " AND p.status <> 'delivered')"
            " AND (o.run_id IS NULL OR NOT EXISTS (SELECT 1 FROM delivery_outbox c WHERE c.run_id = o.run_id AND c.id <> o.id"
            " AND c.status = 'claimed' AND c.claim_expires_at > ?))"
            + (f" AND o.channel NOT IN ({', '.join('?' * len(full))})" if full else "")
            + " ORDER BY o.due_at, o.id LIMIT ?" + tx.skip_locked,
            (now, now, now, *full, look or limit),
        )
        runs: set[str] = set()
        for row in rows:
            if len(claimed) >= limit:
                break
            if row["id"] in sending or (row["run_id"] is not None and row["run_id"] in runs):
                continue
            if row["channel"] in room:
                if room[row["channel"]] <= 0:
                    continue
                room[row["channel"]] -= 1
            if row["run_id"] is not None:
                runs.add(row["run_id"])
            token = secrets.token_hex(8)
            changed = state.execute(tx, "claim_outbox_part", part_id=row["id"], owner=owner, claim_token=token,
                                    expires_at=now + ttl_ms, now=now)
            if changed == 1:
                if row["status"] == "claimed":
                    append_event(tx, "delivery.claim_taken_over", job_id=row["job_id"], run_id=row["run_id"], actor=owner, at=now,
                                 data={"part": row["id"], "previous_owner": row["claim_owner"]})
                claimed.append({**row, "claim_token": token, "claim_expires_at": now + ttl_ms, "attempts": row["attempts"] + 1,
                                "attachments": tx.all("SELECT * FROM delivery_attachments WHERE outbox_id = ? ORDER BY ordinal",
                                                      (row["id"],)),
                                "delivery_options": _job_delivery_options(tx, row)})
    return claimed


def _job_delivery_options(tx: Tx, row: dict[str, Any]) -> dict[str, Any] | None:
    """The job's ``delivery_options`` when the part goes to the job's own delivery channel (not a watchdog route)."""
    if not row.get("job_id"):
        return None
    job = tx.one("SELECT delivery_channel, delivery_options FROM jobs WHERE id = ?", (row["job_id"],))
    if job is None or job["delivery_channel"] != row["channel"]:
        return None
    return json.loads(job["delivery_options"] or "{}")


def send_part(part: dict[str, Any], artifacts_root: Any = None) -> dict[str, Any]:
    """Send one claimed part; return its outcome ``{"outcome": delivered|retry|failed, ...}`` (never raises).

    Attachments reach the channel as bytes the kernel read and checked against their size and SHA-256.
    """
    try:
        channel = load_channel(part["channel"])
        options = channel_options_for(channel, part["delivery_options"]) if part["delivery_options"] is not None else None
        receipt = channel.send(
            DeliveryPart(idempotency_key=part["idempotency_key"], index=part["part_index"], count=part["part_count"],
                         body=part["body"], run_id=part["run_id"] or "", job_id=part["job_id"] or "",
                         attachments=tuple(_attachment(a, artifacts_root) for a in part["attachments"])),
            DeliveryRoute(channel=part["channel"], target=part["target"], options=options),
        )
    except TransientDeliveryError as exc:
        return {"outcome": "retry", "code": exc.code, "error": exc.message, "retry_after_s": exc.retry_after_s}
    except PermanentDeliveryError as exc:
        return {"outcome": "failed", "code": exc.code, "error": exc.message}
    except SchedulerError as exc:  # a channel that cannot load or resolve its secrets: nothing a retry fixes by itself
        return {"outcome": "failed", "code": exc.code, "error": exc.message}
    except Exception as exc:  # a bug in a channel plugin: retried, and visible
        log.exception("channel %s crashed sending %s", part["channel"], part["idempotency_key"])
        return {"outcome": "retry", "code": "CHANNEL_CRASHED", "error": f"{type(exc).__name__}: {exc}", "retry_after_s": None}
    if not isinstance(receipt, DeliveryReceipt):
        return {"outcome": "retry", "code": "CHANNEL_INVALID_RECEIPT",
                "error": f"channel {part['channel']!r} returned {type(receipt).__name__}, not a DeliveryReceipt", "retry_after_s": None}
    return {"outcome": "delivered", "receipt_id": receipt.receipt_id, "details": dict(receipt.details or {})}


def _attachment(row: dict[str, Any], artifacts_root: Any) -> dict[str, Any]:
    """A staged attachment as the channel receives it: ``name``, ``mime_type``, ``size_bytes``, ``sha256``, ``content``."""
    out = {k: row[k] for k in ("name", "mime_type", "size_bytes", "sha256")}
    if row.get("content") is not None:
        content = bytes(row["content"])
        if len(content) != row["size_bytes"] or hashlib.sha256(content).hexdigest() != row["sha256"]:
            raise SchedulerError("ARTIFACT_TAMPERED", f"staged attachment {row['name']!r} no longer matches its SHA-256")
    else:
        if artifacts_root is None:
            raise SchedulerError("ARTIFACT_MISSING", f"attachment {row['name']!r} is in the artifact store, which is not known here")
        content = read_artifact(artifacts_root, row["path"], row["sha256"], row["size_bytes"])
    out["content"] = content
    return out


def backoff_ms(attempts: int, *, base_ms: int, max_ms: int, retry_after_s: float | None, rng: random.Random | None = None) -> int:
    """Delay before the next attempt: the channel's ``Retry-After`` when given, else ``base * 2^(n-1)`` capped, ±20% jitter."""
    if retry_after_s is not None and retry_after_s >= 0:
        return int(retry_after_s * 1000)
    delay = min(max_ms, base_ms * (2 ** max(0, attempts - 1)))
    return max(1, int(delay * (rng or random).uniform(0.8, 1.2)))


def settled_outcome(part: dict[str, Any], result: dict[str, Any]) -> str:
    """What a send's result makes of the part: ``delivered``, ``retry_scheduled`` (attempts left) or ``failed``.

    A retryable error on the last attempt is ``failed``: the log and the stats say what the
    part became, not what the channel asked for.
    """
    if result["outcome"] == "delivered":
        return "delivered"
    if result["outcome"] == "retry" and part["attempts"] < part["max_attempts"]:
        return "retry_scheduled"
    return "failed"


def record(store: Store, part: dict[str, Any], result: dict[str, Any], *, owner: str, now: int | None = None) -> bool:
    """Record a send's outcome under the part's claim token; False when the claim was lost (taken over)."""
    now = now_ms() if now is None else now
    cfg = current_settings().delivery
    outcome = result["outcome"]
    with store.transaction() as tx:
        key = {"part_id": part["id"], "claim_token": part["claim_token"]}
        outcome = settled_outcome(part, result)
        if outcome == "delivered":
            changed = state.execute(tx, "deliver_outbox_part", receipt_id=result.get("receipt_id"),
                                    receipt_json=json.dumps(result.get("details") or {}, sort_keys=True, default=str), now=now,
                                    **key)
        elif outcome == "retry_scheduled":
            delay = backoff_ms(part["attempts"], base_ms=cfg.retry_base_ms, max_ms=cfg.retry_max_ms,
                               retry_after_s=result.get("retry_after_s"))
            changed = state.execute(tx, "retry_outbox_part", due_at=now + delay, error=result["error"], code=result["code"],
                                    now=now, **key)
            result = {**result, "next_attempt_at": to_iso(now + delay)}
        else:
            changed = state.execute(tx, "fail_outbox_part", error=result["error"], code=result["code"], now=now, **key)
            if changed:  # the parts after it cannot go out in order any more
                state.execute(tx, "fail_later_outbox_parts", group_key=part["group_key"], part_index=part["part_index"],
                              error=f"part {part['part_index']}/{part['part_count']} failed", now=now)
        if changed:
            data = {"part": part["id"], "channel": part["channel"], "attempt": part["attempts"],
                    **{k: v for k, v in result.items() if k in ("receipt_id", "code", "error", "next_attempt_at")}}
            append_event(tx, f"delivery.{outcome}", job_id=part["job_id"], run_id=part["run_id"], actor=owner, at=now, data=data)
    return changed == 1


def release(store: Store, parts: list[dict[str, Any]]) -> int:
    """Hand claimed parts back unsent (``pending`` again, the attempt not counted); returns how many were still ours."""
    released = 0
    with store.transaction() as tx:
        for part in parts:
            released += state.execute(tx, "release_outbox_part", part_id=part["id"], claim_token=part["claim_token"])
    return released


def retry_failed(store: Store, ref: str, *, actor: str, now: int | None = None) -> dict[str, Any]:
    """``deliveries retry``: re-arm a failed part with fresh attempts, with every failed part of its message.

    The message's parts go out in order, so re-arming one part re-arms the failed parts
    before it (the one that failed first) and after it (those that failed with it).
    """
    now = now_ms() if now is None else now
    with store.transaction() as tx:
        part = get_part(tx, ref)
        if part["status"] != "failed":
            raise SchedulerError("DELIVERY_NOT_FAILED", f"part {part['id']} is {part['status']}; only failed parts are retried")
        state.execute(tx, "rearm_outbox_parts", group_key=part["group_key"], now=now)
        append_event(tx, "delivery.rearmed", job_id=part["job_id"], run_id=part["run_id"], actor=actor, at=now, data={"part": part["id"]})
        out = get_part(tx, part["id"])
    store.notify_change()
    return out


def get_part(tx: Tx, ref: str) -> dict[str, Any]:
    """An outbox part by id (its idempotency key) or a unique prefix or suffix of it (8 characters or more: ``deliveries
    list`` shows each id's last 28), with its job's ``job_name``; ``INVALID_ARGUMENT`` for a piece two parts share
    (the parts of one message, or of runs made within a minute), ``NOT_FOUND`` for none."""
    select = "SELECT o.*, j.name AS job_name FROM delivery_outbox o LEFT JOIN jobs j ON j.id = o.job_id"
    row = tx.one(f"{select} WHERE o.id = ?", (ref,))
    if row is None and len(ref) >= 8:
        matches = ids_with_end(tx, "delivery_outbox", ref, limit=2)
        if len(matches) > 1:
            raise SchedulerError("INVALID_ARGUMENT", f"delivery id prefix or suffix {ref!r} is ambiguous: give more of the id")
        row = tx.one(f"{select} WHERE o.id = ?", (matches[0],)) if matches else None
    if row is None:
        raise SchedulerError("NOT_FOUND", f"Delivery not found: {ref}")
    return row


def list_parts(tx: Tx, *, status: str | None = None, job_id: str | None = None, run_id: str | None = None,
               limit: int = 100) -> list[dict[str, Any]]:
    """Outbox parts, newest first, optionally only those of one status, job or run."""
    sql = "SELECT o.*, j.name AS job_name FROM delivery_outbox o LEFT JOIN jobs j ON j.id = o.job_id WHERE 1 = 1"
    params: list[object] = []
    if status is not None:
        sql += " AND o.status = ?"
        params.append(status)
    if job_id is not None:
        sql += " AND o.job_id = ?"
        params.append(job_id)
    if run_id is not None:
        sql += " AND o.run_id = ?"
        params.append(run_id)
    sql += " ORDER BY o.created_at DESC, o.group_key, o.part_index LIMIT ?"
    params.append(limit)
    return tx.all(sql, params)


def part_to_json(row: dict[str, Any], *, full: bool = False) -> dict[str, Any]:
    """JSON view of an outbox part (the body only with ``full``)."""
    keys = ["id", "job_id", "job_name", "run_id", "channel", "target", "group_key", "part_index", "part_count", "status", "attempts",
            "max_attempts", "due_at", "last_attempt_at", "delivered_at", "receipt_id", "error_code", "last_error", "claim_owner",
            "claim_expires_at", "created_at"]
    out = {k: row.get(k) for k in keys}
    for k in ("due_at", "last_attempt_at", "delivered_at", "claim_expires_at", "created_at"):
        out[k] = to_iso(out[k])
    if full:
        out["body"] = row.get("body")
        out["receipt"] = json.loads(row["receipt_json"]) if row.get("receipt_json") else None
    return out


class DeliveryWorker(DutyThread):
    """The outbox consumer of one dispatcher: a thread that claims due parts and hands each to a sender thread.

    Up to ``[delivery] concurrency`` parts are sent at once, each by its own sender, which
    records the outcome; at most ``channel_concurrency[CHANNEL]`` of one channel; never two
    parts of one run (``claim_due``), and a message's parts in order (the next is claimed only
    once the one before is delivered). The claiming thread sleeps until the earliest due part or
    expiring claim (at most ``MAX_SLEEP_S``), until ``wake()`` (the dispatcher calls it after
    committing new parts), or until a sender finishes. ``stop`` ends it after the parts being
    sent (claims left behind expire and are taken over later).
    """

    thread_name = "scheduler-delivery"

    def __init__(self, store: Store, owner: str, *, artifacts_root: Any = None, say: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.owner = owner
        self.artifacts_root = artifacts_root
        self.say = say or (lambda _msg: None)
        super().__init__()
        self.stats = {"delivered": 0, "retried": 0, "failed": 0}
        self._senders = WorkerPool(current_settings().delivery.concurrency, "scheduler-delivery-send")
        self._lock = threading.Condition()
        #: The parts being sent now, by id: their channels.
        self._sending: dict[str, str] = {}

    def pass_failed(self, exc: Exception) -> float:
        """A pass that raised is logged (with its traceback unless it is a SchedulerError); the next in ``MAX_SLEEP_S``."""
        if isinstance(exc, SchedulerError):
            log.warning("delivery pass failed: %s: %s", exc.code, exc.message)
        else:
            log.error("delivery pass crashed", exc_info=exc)
        return MAX_SLEEP_S

    def run_once(self) -> float:
        """One pass: claim as many due parts as there are free senders and hand them over; return how long to sleep."""
        cfg = current_settings().delivery
        with self._lock:
            sending = dict(self._sending)
        free = cfg.concurrency - len(sending)
        if free <= 0:
            return MAX_SLEEP_S  # every sender is busy: the first to finish wakes us
        now = now_ms()
        with self.store.read() as tx:  # an idle outbox costs two index lookups, never a write transaction
            due = next_due(tx)
        if due is None or due > now:
            return MAX_SLEEP_S if due is None else min(max(0.0, (due - now) / 1000), MAX_SLEEP_S)
        busy = list(sending.values())
        room = {channel: most - busy.count(channel) for channel, most in cfg.channel_concurrency.items()}
        parts = claim_due(self.store, self.owner, now=now, limit=min(free, cfg.batch), look=cfg.batch, ttl_ms=cfg.claim_ttl_ms,
                          room=room, sending=sending)
        if parts and self._stop.is_set():  # stopping (the senders may be closed): hand them back unsent
            release(self.store, parts)
            return 0.0
        for part in parts:
            with self._lock:
                self._sending[part["id"]] = part["channel"]
            self._senders.submit(functools.partial(self._send, part, cfg.claim_ttl_ms))
        # more may be claimable (free senders, parts made sendable); nothing claimable: wait (a finished send wakes us)
        return 0.0 if parts else MAX_SLEEP_S / 4

    def _send(self, part: dict[str, Any], ttl_ms: int) -> None:
        """On a sender thread: send one claimed part and record the outcome under its claim."""
        try:
            if self._stop.is_set() or now_ms() > part["claim_expires_at"] - ttl_ms // 2:
                # Sending under a claim about to expire could race the dispatcher that takes it over (a part shown
                # twice): hand it back unsent, to be claimed afresh.
                release(self.store, [part])
                return
            result = send_part(part, self.artifacts_root)
            if record(self.store, part, result, owner=self.owner):
                settled = settled_outcome(part, result)  # the last attempt's retryable error is "failed", not "retry"
                key = {"delivered": "delivered", "retry_scheduled": "retried", "failed": "failed"}[settled]
                with self._lock:
                    self.stats[key] += 1
                word = {"retry_scheduled": "retry"}.get(settled, settled)
                attempt = f", attempt {part['attempts']}/{part['max_attempts']}" if settled != "delivered" else ""
                self.say(f"deliver {part['channel']} {part['idempotency_key']}: {word}"
                         + (f" ({result.get('code')}{attempt})" if settled != "delivered" else ""))
        except SchedulerError as exc:  # a busy database: the claim expires and the part is taken over
            log.warning("delivery of %s not recorded: %s: %s", part["idempotency_key"], exc.code, exc.message)
        except Exception:
            log.exception("delivery of %s crashed", part["idempotency_key"])
        finally:
            with self._lock:
                self._sending.pop(part["id"], None)
                self._lock.notify_all()
            self.wake()  # a free sender, and perhaps the next part of its message sendable

    def stop(self, timeout: float = 10.0) -> None:
        """Stop claiming, then wait (at most ``timeout`` seconds in all) for the parts being sent to be recorded."""
        end = time.monotonic() + timeout
        super().stop(timeout)
        with self._lock:
            while self._sending and (left := end - time.monotonic()) > 0:
                self._lock.wait(left)
        self._senders.close()
