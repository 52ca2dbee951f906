"""Prometheus metrics of one ``scheduler run`` process (``--metrics-port``), through ``prometheus_client``.

Imported only when the flag is given, so a dispatcher without it pays nothing. Two kinds
of numbers:

- *observed* on each completion the dispatcher reports (``scheduler.core.dispatcher.passes.Pass.report`` calls
  ``observe``: counters and histograms in memory, no query per run): runs by status (and by
  job only when ``[dispatcher] metrics_job_label`` opts in: job names grow without bound),
  lateness (``started_at - scheduled_for``) and duration. A *catch-up* (a slot already more
  than ``[dispatcher] misfire_grace_ms`` past when its dispatch was queued: a one-shot created
  in the past with ``allow_past_at``, the slot a coalescing job runs after downtime) goes to its
  own histogram, so one year-old one-shot does not swamp the lateness of on-time work;
- *collected* on each scrape with a few cheap aggregate queries: queue depth and outbox
  parts by status, the lease holders, plus plugin load failures (the plugin inventory, taken
  once at start on a background thread, and executors the dispatcher currently fails to load).

Every series keeps its labels across a dispatcher restart: the lease holder is labelled by
lease name and host only (its pid and fencing token are values, not labels), and the
``_created`` series are switched off (``prometheus_client.disable_created_metrics``, process
wide: ``prometheus_client`` is imported only by this module when ``--metrics-port`` is given).

Each process has its own registry: nothing is registered globally, so tests and several
dispatchers in one process do not collide.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, start_http_server
from prometheus_client.core import GaugeMetricFamily

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core.lease import list_leases, owner_host
from scheduler.plugins.inventory import inventory
from scheduler.settings import current_settings

log = logging.getLogger(__name__)

#: Lateness buckets (seconds): a due job normally starts within milliseconds.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Duration buckets (seconds): shell one-liners to hour-long agent turns.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: Catch-up lateness buckets (seconds): a minute (the default misfire grace) to a year.
CATCH_UP_BUCKETS = (60.0, 300.0, 3600.0, 6 * 3600.0, 86_400.0, 7 * 86_400.0, 30 * 86_400.0, 365 * 86_400.0)


def lease_kind(name: str) -> str:
    """A lease's name without a per-process suffix: ``dispatcher:<host>:<pid>:<random>`` (one lease per dispatcher on
    a shared database) is ``dispatcher``, so the metric's label does not change with every restart."""
    return name.split(":", 1)[0]


class DispatcherMetrics:
    """The registry of one dispatcher: observed run metrics plus a collector that reads the database on scrape."""

    def __init__(self, dispatcher: Any) -> None:
        disable_created_metrics()  # a _created series per label set is one more series per restart and label value
        self.dispatcher = dispatcher
        self.registry = CollectorRegistry(auto_describe=True)
        settings = current_settings().dispatcher
        #: ``[dispatcher] metrics_job_label``: the runs counter carries the job name (unbounded: opt-in).
        self.job_label = settings.metrics_job_label
        self.misfire_grace_ms = settings.misfire_grace_ms
        self.runs = Counter("scheduler_runs_finished", "Runs this dispatcher completed, by terminal status"
                            + (" and job." if self.job_label else "."),
                            ["job", "status"] if self.job_label else ["status"], registry=self.registry)
        self.lateness = Histogram("scheduler_run_lateness_seconds",
                                  "started_at - scheduled_for of completed runs, catch-ups excepted.",
                                  buckets=LATENESS_BUCKETS, registry=self.registry)
        self.catch_up = Histogram("scheduler_run_catch_up_lateness_seconds",
                                  "started_at - scheduled_for of completed catch-ups: slots already past the misfire grace"
                                  " when queued (past one-shots, slots run after downtime).",
                                  buckets=CATCH_UP_BUCKETS, registry=self.registry)
        self.duration = Histogram("scheduler_run_duration_seconds", "Run duration (started to finished), by terminal status.",
                                  ["status"], buckets=DURATION_BUCKETS, registry=self.registry)
        self._plugin_failures: list[dict[str, Any]] = []
        self._inventory_done = threading.Event()
        self.registry.register(_StoreCollector(self))
        self.server: Any = None
        self._thread: threading.Thread | None = None

    def observe(self, started: Any, run: dict[str, Any]) -> None:
        """Count one committed completion (called by the dispatcher's loop; memory only, never a query)."""
        status = str(run.get("status") or "unknown")
        if self.job_label:
            self.runs.labels(job=str(started.job.name or started.job.id), status=status).inc()
        else:
            self.runs.labels(status=status).inc()
        if started.scheduled_for is not None and started.started_at is not None:
            late = max(0, started.started_at - started.scheduled_for) / 1000
            (self.catch_up if self.is_catch_up(started) else self.lateness).observe(late)
        if run.get("duration_ms") is not None:
            self.duration.labels(status=status).observe(run["duration_ms"] / 1000)

    def is_catch_up(self, started: Any) -> bool:
        """Whether the run's slot was already more than the misfire grace past when its dispatch was queued.

        Such a run starts late because it was missed before it existed as work (a one-shot
        created in the past, a slot materialised after downtime), not because the dispatcher
        was slow; a slot queued on time and then started late (a busy queue) is lateness.
        """
        queued_at = getattr(started, "queued_at", None)
        return queued_at is not None and started.scheduled_for is not None and \
            queued_at - started.scheduled_for > self.misfire_grace_ms

    def _take_inventory(self) -> None:
        try:
            self._plugin_failures = [p for p in inventory(load=True) if p["status"] in ("failed", "invalid")]
        except Exception as exc:  # noqa: BLE001 - a metric must never take the dispatcher down
            log.warning("plugin inventory for metrics failed: %s", exc)
        finally:
            self._inventory_done.set()

    def start(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: any free port) on a daemon thread; returns the bound port.

        ``METRICS_PORT_UNAVAILABLE`` when the address cannot be bound.
        """
        try:
            self.server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise SchedulerError("METRICS_PORT_UNAVAILABLE", f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
        threading.Thread(target=self._take_inventory, name="metrics-inventory", daemon=True).start()
        return int(self.server.server_port)

    def stop(self) -> None:
        """Stop serving (after the dispatcher stopped)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class _StoreCollector:
    """Numbers read on scrape: queue, outbox, leases, plugin failures (a few GROUP BY queries, no per-run work)."""

    def __init__(self, metrics: DispatcherMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Any]:
        return []  # families vary with the data; nothing to pre-declare

    def collect(self) -> Iterator[Any]:
        d = self.m.dispatcher
        queue = GaugeMetricFamily("scheduler_queue_depth", "Dispatch rows by status (pending: waiting to run).", labels=["status"])
        outbox = GaugeMetricFamily("scheduler_outbox_parts", "Delivery outbox parts by status.", labels=["status"])
        # Labels that survive a restart: the lease's kind (``dispatcher:<owner>`` leases of shared-database dispatchers
        # count as ``dispatcher``) and the holder's host; the owner's pid and the fencing token are never labels.
        lease = GaugeMetricFamily("scheduler_lease_holder", "Live leases of each kind held from each host (1 for the"
                                  " exclusive dispatcher lease).", labels=["name", "host"])
        token = GaugeMetricFamily("scheduler_lease_token", "Highest fencing token among the live leases of each kind.",
                                  labels=["name"])
        expires = GaugeMetricFamily("scheduler_lease_expires_in_seconds", "Seconds until the last lease of each kind expires"
                                    " (negative: all expired).", labels=["name"])
        up = GaugeMetricFamily("scheduler_database_up", "1 when the scrape could read the database.")
        try:
            now = now_ms()
            with d.store.read() as tx:
                queue_rows = tx.all("SELECT status, COUNT(*) AS n FROM job_dispatch_queue GROUP BY status")
                outbox_rows = tx.all("SELECT status, COUNT(*) AS n FROM delivery_outbox GROUP BY status")
                leases = list_leases(tx)
            depth = {"pending": 0, "claimed": 0}  # always present, so alerts see 0 rather than nothing
            depth.update({r["status"]: r["n"] for r in queue_rows})
            for status, n in depth.items():
                queue.add_metric([status], n)
            for r in outbox_rows:
                outbox.add_metric([r["status"]], r["n"])
            holders: dict[tuple[str, str], int] = {}
            tokens: dict[str, int] = {}
            remaining: dict[str, int] = {}
            for held in leases:
                kind = lease_kind(held["name"])
                left = (held["expires_at"] or 0) - now
                remaining[kind] = max(remaining.get(kind, left), left)
                if bool(held["owner"]) and left > 0:
                    key = (kind, owner_host(held["owner"]) or "")
                    holders[key] = holders.get(key, 0) + 1
                    tokens[kind] = max(tokens.get(kind, 0), int(held["token"] or 0))
            for (kind, host), n in sorted(holders.items()):
                lease.add_metric([kind, host], n)
            for kind, value in sorted(tokens.items()):
                token.add_metric([kind], value)
            for kind, left in sorted(remaining.items()):
                expires.add_metric([kind], left / 1000)
            up.add_metric([], 1)
        except Exception as exc:  # noqa: BLE001 - report the database as down rather than fail the scrape
            log.warning("metrics scrape could not read the database: %s", getattr(exc, "message", exc))
            up.add_metric([], 0)
        yield from (queue, outbox, lease, token, expires, up)
        failures = GaugeMetricFamily("scheduler_plugin_load_failures", "Installed plugins that failed to load (1 each).",
                                     labels=["group", "name", "distribution"])
        for p in self.m._plugin_failures:
            failures.add_metric([str(p.get("group")), str(p.get("name")), str(p.get("distribution"))], 1)
        yield failures
        unavailable = GaugeMetricFamily("scheduler_executor_unavailable",
                                        "Executors the dispatcher currently fails to load (retried every 30 s).", labels=["executor"])
        bad = d._executors.failed()
        for name in bad:
            unavailable.add_metric([name], 1)
        yield unavailable
