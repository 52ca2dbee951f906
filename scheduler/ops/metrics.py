"""Prometheus metrics of one ``scheduler run`` process (``--metrics-port``), through ``prometheus_client``.

Imported only when the flag is given, so a dispatcher without it pays nothing. Two kinds
of numbers:

- *observed* on each completion the dispatcher reports (``scheduler.core.dispatcher.passes.Pass.report`` calls
  ``observe``: counters and histograms in memory, no query per run): runs by job and
  status, lateness (``started_at - scheduled_for``) and duration;
- *collected* on each scrape with a few cheap aggregate queries: queue depth and outbox
  parts by status, the lease holders (owner, token, expiry), plus plugin load failures
  (the plugin inventory, taken once at start on a background thread, and executors the
  dispatcher currently fails to load).

Each process has its own registry: nothing is registered globally, so tests and several
dispatchers in one process do not collide.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import now_ms
from scheduler.core.lease import list_leases
from scheduler.plugins.inventory import inventory

log = logging.getLogger(__name__)

#: Lateness buckets (seconds): a due job normally starts within milliseconds.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Duration buckets (seconds): shell one-liners to hour-long agent turns.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


class DispatcherMetrics:
    """The registry of one dispatcher: observed run metrics plus a collector that reads the database on scrape."""

    def __init__(self, dispatcher: Any) -> None:
        self.dispatcher = dispatcher
        self.registry = CollectorRegistry(auto_describe=True)
        self.runs = Counter("scheduler_runs_finished", "Runs this dispatcher completed, by job and terminal status.",
                            ["job", "status"], registry=self.registry)
        self.lateness = Histogram("scheduler_run_lateness_seconds", "started_at - scheduled_for of completed runs.",
                                  buckets=LATENESS_BUCKETS, registry=self.registry)
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
        self.runs.labels(job=str(started.job.get("name") or started.job.get("id")), status=status).inc()
        if started.scheduled_for is not None and started.started_at is not None:
            self.lateness.observe(max(0, started.started_at - started.scheduled_for) / 1000)
        if run.get("duration_ms") is not None:
            self.duration.labels(status=status).observe(run["duration_ms"] / 1000)

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
        lease = GaugeMetricFamily("scheduler_lease_holder", "1 per live lease: its name, owner and fencing token.",
                                  labels=["name", "owner", "token"])
        expires = GaugeMetricFamily("scheduler_lease_expires_in_seconds", "Seconds until each lease expires (negative: expired).",
                                    labels=["name"])
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
            for held in leases:
                live = bool(held["owner"]) and (held["expires_at"] or 0) > now
                if live:
                    lease.add_metric([held["name"], held["owner"], str(held["token"])], 1)
                expires.add_metric([held["name"]], ((held["expires_at"] or 0) - now) / 1000)
            up.add_metric([], 1)
        except Exception as exc:  # noqa: BLE001 - report the database as down rather than fail the scrape
            log.warning("metrics scrape could not read the database: %s", getattr(exc, "message", exc))
            up.add_metric([], 0)
        yield from (queue, outbox, lease, expires, up)
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
