"""The kernel's own settings tables: ``[dispatcher]``, ``[storage]``, ``[delivery]``, ``[notifications]``, ``[jobs]`` ...

``scheduler run`` takes its defaults from ``[dispatcher]`` (its flags still win);
the queue reads ``misfire_grace_ms`` and the SQLite store ``sqlite_synchronous``; the
outbox consumer reads ``[delivery]``; completion reads ``[notifications]``; creating jobs reads ``[jobs]``.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import parse_duration_ms


@attrs.frozen(kw_only=True)
class DispatcherSettings:
    """``[dispatcher]``: defaults of ``scheduler run`` and the misfire threshold of the queue."""

    concurrency: int = attrs.field(default=4, metadata={"minimum": 1, "maximum": 256, "doc": "Runs executed at once (--concurrency)."})
    lease_ttl_ms: int = attrs.field(default=15_000, metadata={
        "minimum": 100, "maximum": 3_600_000, "doc": "Dispatcher lease lifetime in ms, renewed every third of it (--lease-ttl)."})
    grace_s: float = attrs.field(default=10.0, metadata={
        "minimum": 0, "maximum": 86_400, "doc": "On SIGTERM/SIGINT, seconds running work may finish before it is cancelled (--grace)."})
    kill_grace_s: float = attrs.field(default=2.0, metadata={
        "minimum": 0, "maximum": 3600, "doc": "Seconds between SIGTERM and SIGKILL when recovery stops an orphaned process group."})
    misfire_grace_ms: int = attrs.field(default=60_000, metadata={
        "minimum": 0, "doc": "How late (ms) a slot may start before it counts as a misfire (the job's misfire_policy applies)."})
    metrics_job_label: bool = attrs.field(default=False, metadata={
        "doc": "Label scheduler_runs_finished_total by job name too (--metrics-port): one series per job ever run, so off"
               " by default (docs/operations.md)."})


@attrs.frozen(kw_only=True)
class StorageSettings:
    """``[storage]``: how the stores open the database."""

    sqlite_synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = attrs.field(
        default="FULL", metadata={"doc": "SQLite `synchronous` pragma of every connection (WAL mode); FULL survives a power"
                                         " loss with every commit, NORMAL may lose the last ones (docs/operations.md)."})
    sqlite_cache_mb: int = attrs.field(default=32, metadata={
        "minimum": 1, "maximum": 65_536, "doc": "SQLite page cache per connection in MiB (`cache_size`), filled only as pages"
                                                " are read; SQLite's own 2 MiB made the dispatcher re-read index pages."})
    sqlite_busy_timeout_ms: int = attrs.field(default=10_000, metadata={
        "minimum": 1, "maximum": 3_600_000, "doc": "How long a SQLite connection waits for another one's lock before DB_BUSY."})
    file_mode: Literal["private", "group"] = attrs.field(default="private", metadata={
        "doc": "Permissions of files and directories the scheduler creates: private 0600/0700, group 0660/2770 (setgid)."})


@attrs.frozen(kw_only=True)
class DeliverySettings:
    """``[delivery]``: how the dispatcher's outbox consumer sends parts through channel plugins."""

    claim_ttl_ms: int = attrs.field(default=60_000, metadata={
        "minimum": 100, "maximum": 3_600_000,
        "doc": "How long a claimed part belongs to one dispatcher; an expired claim (a dead dispatcher) is taken over."})
    retry_base_ms: int = attrs.field(default=2_000, metadata={
        "minimum": 1, "maximum": 86_400_000, "doc": "Backoff before the first retry of a transient failure; doubles per attempt (with jitter)."})
    retry_max_ms: int = attrs.field(default=900_000, metadata={
        "minimum": 1, "maximum": 86_400_000, "doc": "Longest backoff between two attempts (a channel's Retry-After is honoured above it)."})
    max_attempts: int = attrs.field(default=5, metadata={
        "minimum": 1, "maximum": 1000, "doc": "Attempts per part before it is `failed` (set on each new part)."})
    batch: int = attrs.field(default=20, metadata={
        "minimum": 1, "maximum": 1000, "doc": "Parts a consumer pass looks at; it claims at most as many as it has free senders."})
    concurrency: int = attrs.field(default=8, metadata={
        "minimum": 1, "maximum": 256,
        "doc": "Parts one dispatcher sends at once, each on its own sender thread; parts of one run never at once."})
    channel_concurrency: dict[str, int] = attrs.field(factory=dict, metadata={
        "minimum": 1, "maximum": 256,
        "doc": "Channel name -> most parts of that channel one dispatcher sends at once (e.g. `{ telegram = 1 }`);"
               " a channel not named may use every sender."})


#: What ``[notifications]`` can announce: a run that ended ok, one that failed (error or timeout), a job auto-paused.
NOTIFICATION_EVENTS = ("completed", "failed", "paused")


def _check_routes(_instance: Any, _attribute: Any, routes: tuple[str, ...]) -> None:
    for route in routes:
        channel = route.split(":", 1)[0]
        if not channel or not channel.replace("-", "").replace("_", "").replace(".", "").isalnum() or channel != channel.lower():
            raise ValueError(f"route {route!r} must be CHANNEL or CHANNEL:DESTINATION (a channel driver name first)")


def _check_events(_instance: Any, _attribute: Any, events: tuple[str, ...]) -> None:
    unknown = [e for e in events if e not in NOTIFICATION_EVENTS]
    if unknown:
        raise ValueError(f"unknown event(s) {', '.join(unknown)}; known: {', '.join(NOTIFICATION_EVENTS)}")


@attrs.frozen(kw_only=True)
class NotificationSettings:
    """``[notifications]``: messages about every job's runs, sent through the delivery outbox to these routes."""

    routes: tuple[str, ...] = attrs.field(default=(), validator=_check_routes, metadata={
        "doc": "Where to send them: `CHANNEL` or `CHANNEL:DESTINATION` (e.g. `webhook:https://ops.example/hook`); none: off."})
    events: tuple[str, ...] = attrs.field(default=("failed", "paused"), validator=_check_events, metadata={
        "doc": "Which to send: `completed` (a run ended ok), `failed` (error or timeout), `paused` (auto-paused after failures)."})


@attrs.frozen(kw_only=True)
class JobsSettings:
    """``[jobs]``: limits on the stored jobs of this host."""

    max_jobs: int | None = attrs.field(default=None, metadata={
        "minimum": 0, "maximum": 10_000_000,
        "doc": "Most jobs the database may hold: `jobs add`, `apply`, `import` and `schedule add` past it are refused"
               " (JOB_LIMIT_REACHED), storing nothing; unset or 0: no cap."})


@attrs.frozen(kw_only=True)
class EvidenceSettings:
    """``[evidence]``: host-side evidence settings (the in-toto export's signing key)."""

    export_key: str | None = attrs.field(default=None, metadata={
        "doc": "PEM file of the Ed25519 private key that signs `runs evidence --export in-toto` (unencrypted PKCS#8); "
               "unset: export is refused (EVIDENCE_EXPORT_KEY_MISSING)."})


def _check_accounts(_instance: Any, _attribute: Any, entries: tuple[str, ...]) -> None:
    for entry in entries:
        if not entry or entry != entry.strip() or (entry.startswith("uid:") and not entry[4:].isdigit()):
            raise ValueError(f"{entry!r} must be a local account name or uid:N")


@attrs.frozen(kw_only=True)
class IdentitySettings:
    """``[identity]``: the trust level an invoking OS account may give the jobs it adds (see docs/identity.md).

    The lists grant a level only when read from a settings file owned by root or by the
    database's owner that nobody else can write; a ``SCHEDULER_IDENTITY_*`` variable or the
    invoker's own file grants nothing. Root is always ``system``, the database file's owner ``operator``.
    """

    operators: tuple[str, ...] = attrs.field(default=(), validator=_check_accounts, metadata={
        "doc": "Accounts (name or uid:N) that may add `operator` jobs, besides the database file's owner."})
    system_users: tuple[str, ...] = attrs.field(default=(), validator=_check_accounts, metadata={
        "doc": "Accounts (name or uid:N) that may add `system` jobs, besides root."})
    default_level: Literal["untrusted", "user"] = attrs.field(default="user", metadata={
        "doc": "Level of every other account: `user`, or `untrusted` (it can only lower)."})
    run_as_users: tuple[str, ...] = attrs.field(default=(), validator=_check_accounts, metadata={
        "doc": "Accounts (name or uid:N) that may add jobs running as another account (`executor_options.user`),"
               " besides root; honoured only from a root-owned settings file nobody else can write."})
    refuse_external_prompts: bool = attrs.field(default=False, metadata={
        "doc": "Refuse to run a prompt (an agent or main-session job) whose `provenance` is `external`: the run ends"
               " PROVENANCE_PROMPT_REFUSED before anything executes; only `static` and `user_added` jobs run prompts."})


@attrs.frozen(kw_only=True)
class AuthorizationSettings:
    """``[authorization]``: how the kernel asks ``authorization_ref`` providers (docs/authorization.md)."""

    timeout_s: float = attrs.field(default=10.0, metadata={
        "minimum": 0.05, "maximum": 600,
        "doc": "Longest an authorization provider may take to decide (also bounded by the run's timeout); later is a deny."})


def _check_duration(minimum_ms: int) -> Any:
    """An attrs validator: unset, or a duration (``30d``, ``12h``) of at least ``minimum_ms``."""
    def check(_instance: Any, attribute: Any, value: str | None) -> None:
        if value is None:
            return
        try:
            ms = parse_duration_ms(value, field=attribute.name)
        except SchedulerError as exc:
            raise ValueError(exc.message) from None
        if ms < minimum_ms:
            raise ValueError(f"{attribute.name} must be at least {minimum_ms // 1000}s")
    return check


@attrs.frozen(kw_only=True)
class RetentionSettings:
    """``[retention]``: what the dispatcher's retention duty and ``runs prune`` delete (docs/operations.md).

    Unset rules delete nothing: a run is kept while any set rule keeps it (among its job's
    newest ``keep_runs``, or younger than ``max_run_age``); a job's ``retention`` field
    overrides either rule for its runs.
    """

    keep_runs: int | None = attrs.field(default=None, metadata={
        "minimum": 1, "maximum": 10_000_000, "doc": "Keep each job's newest N terminal runs (older ones may be pruned); unset: no count rule."})
    max_run_age: str | None = attrs.field(default=None, validator=_check_duration(60_000), metadata={
        "doc": "Terminal runs that ended longer ago than this may be pruned (e.g. `90d`); unset: no age rule."})
    delivered_outbox_age: str | None = attrs.field(default=None, validator=_check_duration(60_000), metadata={
        "doc": "Delete delivered and cancelled outbox messages (all parts settled) older than this; unset: kept."})
    event_age: str | None = attrs.field(default=None, validator=_check_duration(3_600_000), metadata={
        "doc": "Delete runtime events older than this (at least 1h; a prune cutoff is recorded first); unset: kept."})
    interval: str = attrs.field(default="1h", validator=_check_duration(1_000), metadata={
        "doc": "How often the dispatcher applies retention (one dispatcher per interval: the `maintenance` lease on PostgreSQL)."})
    batch: int = attrs.field(default=500, metadata={
        "minimum": 1, "maximum": 10_000, "doc": "Rows deleted per transaction, so a pass never holds a long write transaction."})
    orphan_grace: str = attrs.field(default="1h", validator=_check_duration(1_000), metadata={
        "doc": "An output directory with no run row is removed once it is older than this (a starting run's files come first)."})


#: The kernel tables of the settings file, in display order.
KERNEL_TABLES: dict[str, type] = {"dispatcher": DispatcherSettings, "storage": StorageSettings, "delivery": DeliverySettings,
                                  "notifications": NotificationSettings, "jobs": JobsSettings, "evidence": EvidenceSettings,
                                  "identity": IdentitySettings, "authorization": AuthorizationSettings,
                                  "retention": RetentionSettings}

#: Environment variables read before the settings file existed, and the key that replaced each.
#: Setting one is ``CONFIG_INVALID`` naming the new variable, so an old value is never silently ignored.
RETIRED_ENV: dict[str, str] = {
    "SCHEDULER_MISFIRE_GRACE_MS": "dispatcher.misfire_grace_ms",
    "SCHEDULER_SQLITE_SYNCHRONOUS": "storage.sqlite_synchronous",
    "SCHEDULER_SHELL": "executors.shell.shell",
    "SCHEDULER_SHELL_MAX_OUTPUT_BYTES": "executors.shell.max_output_bytes",
    "SCHEDULER_SHELL_KILL_GRACE_S": "executors.shell.kill_grace_s",
}
