"""``scheduler import openclaw``: OpenClaw Gateway cron jobs as scheduler jobs (the seed's import contract).

Source: ``openclaw cron list --json`` then ``openclaw cron get <id> --json`` for each job
(``--binary`` chooses the program, default ``$OPENCLAW_BIN`` or ``openclaw``), or the legacy
jobs file (``--legacy-json [PATH]``, default ``$OPENCLAW_JOBS_JSON`` or
``~/.openclaw/cron/jobs.json``, ``{"version": 1, "jobs": [...]}``).

Mapping (one OpenClaw job -> one job with id ``openclaw-cron:<id>``, so a second import skips it):

* ``schedule.kind: cron`` -> ``cron`` with the expression verbatim and ``tz`` (UTC when absent,
  with a warning: OpenClaw used the Gateway host's zone);
* ``at`` (``at`` ISO-8601, UTC when it has no zone, or ``atMs``) -> ``at``; an instant already
  past is skipped (``AT_IN_PAST``): it ran, or would run at once;
* ``every`` (``everyMs``, ``anchorMs``) -> five-field cron when cadence and phase are exactly
  representable (whole minutes, a period dividing an hour, or whole hours dividing a day,
  phase from the anchor), else this scheduler's anchored ``every`` on the same phase, which is
  exact too. Only an interval under one second is inexact: ``INEXACT_EVERY`` unless
  ``--allow-inexact-every`` (rounded up to 1s, with a warning);
* ``sessionTarget: isolated`` (``agentTurn``) -> ``session_target: isolated`` (agent executor;
  ``model``, ``thinking``, ``agentId``); ``main`` (``systemEvent``) -> ``session_target: main``
  (main-session executor, ``mode: event``, ``wakeMode`` now/next-heartbeat -> ``event_mode``
  now/queue); ``session:agent:<id>:main`` -> main for that agent; ``current`` -> main with a
  warning; any other session is ``UNSUPPORTED_SESSION``;
* command payloads (``command`` or ``argv``, ``env``, ``cwd``, ``stdin``) -> one shell command
  (``export K='v'; cmd``), ``working_dir``, ``stdin_text``, ``env_policy: inherit``;
* ``delivery.mode: announce`` with a target -> ``delivery_mode: always`` on the ``openclaw``
  channel to ``<channel>:<to>``; announce without a target -> none, with a warning;
  ``webhook`` -> ``UNSUPPORTED_DELIVERY``;
* timeout: ``runTimeoutMs``, else ``payload.timeoutSeconds`` * 1000, else 120 s.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

from scheduler.base.errors import SchedulerError
from scheduler.base.json_document import parse_json_document
from scheduler.base.timeutil import format_duration_ms, parse_iso, to_iso
from scheduler.ops.importers import ImportItem, export_prefix

#: Largest answer read from ``openclaw`` (the reference importer's buffer).
MAX_OUTPUT_BYTES = 16 * 1024 * 1024
DEFAULT_TIMEOUT_MS = 120_000
_THINKING = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


def default_binary() -> str:
    """``$OPENCLAW_BIN`` or ``openclaw``."""
    return os.environ.get("OPENCLAW_BIN") or "openclaw"


def default_legacy_path() -> str:
    """``$OPENCLAW_JOBS_JSON`` or ``~/.openclaw/cron/jobs.json``."""
    return os.environ.get("OPENCLAW_JOBS_JSON") or str(Path.home() / ".openclaw" / "cron" / "jobs.json")


def _run(binary: str, *args: str) -> Any:
    """Run ``binary args...`` and parse its JSON answer (``OPENCLAW_COMMAND_FAILED`` / ``IMPORT_SOURCE_*``)."""
    try:
        done = subprocess.run([binary, *args], capture_output=True, timeout=60)
    except FileNotFoundError:
        raise SchedulerError("IMPORT_SOURCE_NOT_FOUND", f"{binary}: not found (set --binary or OPENCLAW_BIN)") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError("OPENCLAW_COMMAND_FAILED", f"{binary} {' '.join(args)} did not answer within 60 s") from None
    except OSError as exc:
        raise SchedulerError("OPENCLAW_COMMAND_FAILED", f"{binary} could not run: {exc}") from None
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip()[:500]
        raise SchedulerError("OPENCLAW_COMMAND_FAILED", f"{binary} {' '.join(args)} exited {done.returncode}: {err}")
    if len(done.stdout) > MAX_OUTPUT_BYTES:
        raise SchedulerError("IMPORT_SOURCE_INVALID", f"{binary} {' '.join(args)} answered more than 16 MiB")
    try:
        text = done.stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise SchedulerError("IMPORT_SOURCE_INVALID", f"{binary} {' '.join(args)} did not answer JSON") from None
    return _strict_json(text, f"{binary} {' '.join(args)}", "did not answer JSON")


def _strict_json(text: str, where: str, not_json: str) -> Any:
    """A source document parsed as ``jobs add`` parses a spec: a key named twice in one object is ``DUPLICATE_KEY``
    (plain ``json`` keeps the last one silently, issue 30 defect 9); what is not JSON is ``IMPORT_SOURCE_INVALID``."""
    try:
        return parse_json_document(text, what=where)
    except SchedulerError as exc:
        if exc.code == "INVALID_JSON":
            raise SchedulerError("IMPORT_SOURCE_INVALID", f"{where} {not_json}: {exc.message}") from None
        raise


def _jobs_of(doc: Any, where: str) -> list[dict[str, Any]]:
    """The job objects of a list answer or a jobs file (``{"jobs": [...]}`` or an array)."""
    jobs = doc.get("jobs") if isinstance(doc, dict) else doc
    if not isinstance(jobs, list) or not all(isinstance(j, dict) for j in jobs):
        raise SchedulerError("IMPORT_SOURCE_INVALID", f"{where}: expected {{\"jobs\": [...]}} of job objects")
    return jobs


def read_cli(binary: str) -> tuple[str, list[dict[str, Any]]]:
    """``openclaw cron list --json``, then ``openclaw cron get <id> --json`` for the full record of each job."""
    listed = _jobs_of(_run(binary, "cron", "list", "--json"), f"{binary} cron list --json")
    jobs = []
    for job in listed:
        job_id = job.get("id") or job.get("jobId")
        if not isinstance(job_id, str) or not job_id:
            jobs.append(job)  # reported as failed by convert()
            continue
        full = _run(binary, "cron", "get", job_id, "--json")
        if isinstance(full, dict) and isinstance(full.get("job"), dict):
            full = full["job"]
        if not isinstance(full, dict):
            raise SchedulerError("IMPORT_SOURCE_INVALID", f"{binary} cron get {job_id} --json: expected a job object")
        jobs.append(full)
    return f"{binary} cron list --json", jobs


def read_legacy(path: str) -> tuple[str, list[dict[str, Any]]]:
    """The legacy jobs file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SchedulerError("IMPORT_SOURCE_NOT_FOUND", f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SchedulerError("IMPORT_SOURCE_INVALID", f"cannot read {path}: {exc}") from None
    return path, _jobs_of(_strict_json(text, path, "is not JSON"), path)


# --------------------------------------------------------------------------- conversion


def every_as_cron(every_ms: int, anchor_ms: int) -> str | None:
    """The five-field UTC cron whose slots are exactly ``anchor + k * every``, or None when there is none."""
    if every_ms % 60_000 or anchor_ms % 60_000:
        return None
    minutes = every_ms // 60_000
    anchor_min = (anchor_ms // 60_000) % 60
    anchor_hour = (anchor_ms // 3_600_000) % 24
    if minutes < 60 and 60 % minutes == 0:
        marks = sorted({(anchor_min + i * minutes) % 60 for i in range(60 // minutes)})
        return f"{','.join(map(str, marks))} * * * *" if minutes > 1 else "* * * * *"
    if minutes % 60 == 0 and 24 % (minutes // 60) == 0:
        hours = minutes // 60
        marks = sorted({(anchor_hour + i * hours) % 24 for i in range(24 // hours)})
        return f"{anchor_min} {','.join(map(str, marks)) if hours > 1 else '*'} * * *"
    return None


def _schedule(item: ImportItem, schedule: Any, created_ms: Any, allow_inexact: bool, now: int) -> dict[str, Any] | None:
    """The spec's schedule fields, or None after failing the item."""
    if not isinstance(schedule, dict):
        item.fail("UNSUPPORTED_SCHEDULE", "the job has no schedule object")
        return None
    kind = schedule.get("kind")
    if kind == "cron":
        expr = schedule.get("expr") or schedule.get("cron")
        if not isinstance(expr, str):
            item.fail("INVALID_SCHEDULE", "schedule.expr must be a cron expression")
            return None
        tz = schedule.get("tz")
        if not tz:
            item.warnings.append("schedule.tz is absent: UTC assumed (OpenClaw used the Gateway host's zone)")
        item.exact_schedule = True
        return {"schedule_kind": "cron", "schedule_cron": expr, "schedule_tz": tz or "UTC"}
    if kind == "at":
        at: Any = schedule.get("at", schedule.get("atMs"))
        try:
            if isinstance(at, str):
                text = at if at.endswith("Z") or "+" in at[10:] or "-" in at[10:] else at + "Z"  # no zone: UTC
                at_ms = parse_iso(text, field="schedule.at")
            elif isinstance(at, int) and not isinstance(at, bool):
                at_ms = at
            else:
                raise SchedulerError("INVALID_SCHEDULE", "schedule.at must be an ISO-8601 instant or atMs epoch milliseconds")
        except SchedulerError as exc:
            item.fail("INVALID_SCHEDULE", exc.message)
            return None
        item.exact_schedule = True
        if at_ms <= now:
            item.status, item.code, item.error = "skipped", "AT_IN_PAST", "the one-shot time has passed (it ran, or would run at once)"
            return None
        return {"schedule_kind": "at", "schedule_at": to_iso(at_ms)}
    if kind == "every":
        every = schedule.get("everyMs")
        if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
            item.fail("INVALID_SCHEDULE", "schedule.everyMs must be a positive integer")
            return None
        anchor = schedule.get("anchorMs", created_ms)
        anchor = anchor if isinstance(anchor, int) and not isinstance(anchor, bool) else None
        if every < 1000:
            if not allow_inexact:
                item.fail("INEXACT_EVERY", f"everyMs {every} is under one second: no schedule here repeats that often"
                          " (--allow-inexact-every imports it as every 1s)")
                return None
            item.warnings.append(f"INEXACT_EVERY: everyMs {every} imported as every 1s")
            item.exact_schedule = False
            return {"schedule_kind": "every", "schedule_every": "1s"}
        item.exact_schedule = True
        if anchor is not None:
            cron = every_as_cron(every, anchor)
            if cron is not None:
                return {"schedule_kind": "cron", "schedule_cron": cron, "schedule_tz": "UTC"}
            item.phase = (anchor, every)
        else:
            item.warnings.append("no anchorMs: the interval's phase starts at the import")
        return {"schedule_kind": "every", "schedule_every": format_duration_ms(every)}
    item.fail("UNSUPPORTED_SCHEDULE", f"schedule.kind {kind!r} is not cron, at or every")
    return None


def _session(item: ImportItem, job: dict[str, Any]) -> tuple[str, str | None] | None:
    """``(session_target, agent id from the session key or None)``, or None after failing the item."""
    target = job.get("sessionTarget") or ("isolated" if (job.get("payload") or {}).get("kind") == "agentTurn" else "main")
    if target in ("isolated", "main"):
        return target, None
    if target == "current":
        item.warnings.append("sessionTarget current: imported as the main session")
        return "main", None
    if isinstance(target, str) and target.startswith("session:"):
        key = target[len("session:"):]
        parts = key.split(":")
        if len(parts) == 3 and parts[0] == "agent" and parts[2] == "main" and parts[1]:
            return "main", parts[1]
        item.fail("UNSUPPORTED_SESSION", f"session key {key!r}: only an agent's main session (agent:<id>:main) is reachable here")
        return None
    item.fail("UNSUPPORTED_SESSION", f"sessionTarget {target!r} is not main, isolated, current or session:<key>")
    return None


def convert(job: dict[str, Any], *, allow_inexact: bool, now: int) -> ImportItem:
    """One OpenClaw job as an import item (a spec, or failed/skipped with a code)."""
    source_id = job.get("id") or job.get("jobId")
    item = ImportItem(source_id=str(source_id) if source_id else "(no id)", name=job.get("name"))
    if not isinstance(source_id, str) or not source_id:
        return item.fail("IMPORT_SOURCE_INVALID", "the job has no id")
    item.job_id = f"openclaw-cron:{source_id}"
    spec: dict[str, Any] = {"name": job.get("name") or f"openclaw-{source_id}"}
    item.name = spec["name"]
    if job.get("description"):
        spec["description"] = job["description"]
    if job.get("enabled") is False:
        spec["enabled"] = False
    schedule = _schedule(item, job.get("schedule"), job.get("createdAtMs"), allow_inexact, now)
    if schedule is None:
        return item
    spec.update(schedule)
    payload = job.get("payload") if isinstance(job.get("payload"), dict) else {}
    kind = payload.get("kind")
    timeout = job.get("runTimeoutMs")
    if not isinstance(timeout, int) and isinstance(payload.get("timeoutSeconds"), int):
        timeout = payload["timeoutSeconds"] * 1000
    spec["run_timeout_ms"] = timeout if isinstance(timeout, int) and timeout > 0 else DEFAULT_TIMEOUT_MS
    if kind in ("command", "shellCommand", "exec"):
        if not _command(item, payload, spec):
            return item
    elif kind in ("agentTurn", "systemEvent"):
        text = payload.get("message") if kind == "agentTurn" else payload.get("text")
        text = text if isinstance(text, str) and text.strip() else payload.get("text") or payload.get("message")
        if not isinstance(text, str) or not text.strip():
            return item.fail("UNSUPPORTED_PAYLOAD", f"a {kind} payload without text")
        session = _session(item, job)
        if session is None:
            return item
        target, agent = session
        agent = agent or job.get("agentId")
        options: dict[str, Any] = {}
        if agent and agent != "main":
            options["agent_id"] = agent
        spec["payload_message"] = text
        if target == "isolated":
            if kind == "systemEvent":
                item.warnings.append("an isolated systemEvent: its text is the agent turn's prompt")
            spec["session_target"] = "isolated"
            if isinstance(payload.get("model"), str):
                options["model"] = payload["model"]
            thinking = payload.get("thinking")
            if isinstance(thinking, str) and thinking != "off":
                if thinking not in _THINKING:
                    item.warnings.append(f"thinking {thinking!r} has no equivalent: left to the endpoint")
                else:
                    if _THINKING[thinking] != thinking:
                        item.warnings.append(f"thinking {thinking} imported as {_THINKING[thinking]}")
                    options["thinking"] = _THINKING[thinking]
        else:
            spec["session_target"] = "main"
            if kind == "agentTurn":
                options["mode"] = "reply"
                item.warnings.append("an agentTurn in the main session: imported as a chat turn (mode reply)")
            else:
                options["mode"] = "event"
                if job.get("wakeMode") == "next-heartbeat":
                    options["event_mode"] = "queue"
        if options:
            spec["executor_options"] = options
    else:
        return item.fail("UNSUPPORTED_PAYLOAD", f"payload kind {kind!r} has no executor here")
    if not _delivery(item, job, spec):
        return item
    item.spec = spec
    return item


def _command(item: ImportItem, payload: dict[str, Any], spec: dict[str, Any]) -> bool:
    """A command payload as one shell command with its options; False after failing the item."""
    argv, command = payload.get("argv"), payload.get("command")
    if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
        text = shlex.join(argv)
    elif isinstance(command, str) and command.strip():
        text = command
    elif isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        text = shlex.join(command)
    else:
        item.fail("UNSUPPORTED_PAYLOAD", "a command payload needs `command` or `argv`")
        return False
    env = payload.get("env") if isinstance(payload.get("env"), dict) else {}
    spec["payload_message"] = export_prefix({str(k): str(v) for k, v in env.items()}) + text
    options: dict[str, Any] = {"env_policy": "inherit"}
    if isinstance(payload.get("cwd"), str):
        options["working_dir"] = payload["cwd"]
    if isinstance(payload.get("stdin"), str):
        options["stdin_text"] = payload["stdin"]
    spec["session_target"] = "shell"
    spec["executor_options"] = options
    return True


def _delivery(item: ImportItem, job: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Delivery fields; False after failing the item."""
    delivery = job.get("delivery") if isinstance(job.get("delivery"), dict) else None
    mode = delivery.get("mode") if delivery else None
    if mode is None and spec.get("session_target") == "isolated":
        mode = "announce"  # OpenClaw's default for isolated jobs
        delivery = delivery or {}
    if mode in (None, "none"):
        return True
    if mode == "webhook":
        item.fail("UNSUPPORTED_DELIVERY", "delivery.mode webhook (OpenClaw's finished-event POST) is not imported")
        return False
    if mode != "announce":
        item.fail("UNSUPPORTED_DELIVERY", f"delivery.mode {mode!r} is not announce, webhook or none")
        return False
    assert delivery is not None
    channel, to = delivery.get("channel"), delivery.get("to")
    if not isinstance(to, str) or not to:
        item.warnings.append("announce without a target (the Gateway's last route): delivery set to none")
        return True
    spec["delivery_mode"] = "always"
    spec["delivery_channel"] = "openclaw"
    if isinstance(channel, str) and channel and channel != "last":
        spec["delivery_to"] = to if to.startswith(channel + ":") else f"{channel}:{to}"
    else:
        spec["delivery_to"] = to
        item.warnings.append("announce to channel `last`: the Gateway resolves the target's channel")
    return True
