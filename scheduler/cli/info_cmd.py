"""Commands that never open the database: version, schema, capabilities, plugins."""

from __future__ import annotations

import click

from scheduler import PLUGIN_API_VERSION, __version__
from scheduler.cli.output import emit, table


@click.command("version")
def version_cmd() -> None:
    """Print the scheduler version (imports no plugin, no croniter, no database layer)."""
    emit({"version": __version__, "plugin_api": PLUGIN_API_VERSION}, lambda: click.echo(f"scheduler {__version__}"))


@click.command("schema")
@click.argument("what", type=click.Choice(["jobs", "sql"]), default="jobs")
@click.option("--executor", "executor", default=None, help="Also list this executor's `executor_options`.")
@click.option("--channel", "channel", default=None, help="Also list this channel's `delivery_options`.")
def schema_cmd(what: str, executor: str | None, channel: str | None) -> None:
    """Print the job-spec field catalogue (``jobs``, plus a plugin's options) or the executable SQLite schema (``sql``)."""
    if what == "sql":
        from scheduler.core.store.migrations import SCHEMA_VERSION, schema_text

        emit({"schema_version": SCHEMA_VERSION, "sql": schema_text()}, lambda: click.echo(schema_text()))
        return
    from scheduler.core.spec import field_catalogue

    fields = field_catalogue()
    options: dict[str, list[dict[str, object]]] = {}
    for field, kind, name in (("executor_options", "executor", executor), ("delivery_options", "channel", channel)):
        if name is not None:
            options[field] = _plugin_options(kind, name)

    def rows_of(items: list[dict[str, object]], prefix: str = "") -> list[tuple[object, ...]]:
        rows = []
        for f in items:
            cons = f["constraints"]
            assert isinstance(cons, dict)
            c = "|".join(cons["choices"]) if "choices" in cons else ""
            if "minimum" in cons or "maximum" in cons:
                c = f"{cons.get('minimum', '')}..{cons.get('maximum', '')}"
            d = f["default"]
            default = "(required)" if f["required"] else ("-" if d is None else str(d).lower() if isinstance(d, bool) else d)
            rows.append((prefix + str(f["name"]), f["type"], default, c, f["description"]))
        return rows

    def human() -> None:
        rows = rows_of(fields)
        for field, items in options.items():
            rows += rows_of(items, prefix=f"{field}.")
        table(rows, ["field", "type", "default", "constraints", "description"])

    emit({"fields": fields, **({"options": options} if options else {})}, human)


def _plugin_options(kind: str, name: str) -> list[dict[str, object]]:
    """A plugin's per-job options catalogue; ``<KIND>_NOT_AVAILABLE`` when it cannot be loaded."""
    from scheduler.base.errors import SchedulerError
    from scheduler.base.options import catalogue
    from scheduler.core.members import options_class_of
    from scheduler.plugins.loader import load_provider

    try:
        provider = load_provider(kind, name)
    except SchedulerError as exc:
        raise SchedulerError(f"{kind.upper()}_NOT_AVAILABLE", f"{kind} {name!r} is not available: {exc.message}") from None
    cls = options_class_of(provider)
    return catalogue(cls) if cls is not None else []


CAPABILITIES = {
    "job_spec_fields": "see `scheduler schema jobs`",
    "schedule_kinds": ["cron", "every", "at", "manual", "chain"],
    "cron_fields": [5, 6],
    "cron_timezones": "IANA",
    "dst_policies": {"gap": ["shift", "skip"], "fold": ["once", "twice"]},
    "misfire_policies": ["coalesce", "skip"],
    "overlap_policies": ["skip", "allow", "queue"],
    "output_formats": ["text", "json", "ndjson"],
    "delivery_guarantees": ["at-most-once", "at-least-once"],
    "stores": ["sqlite", "postgres (plugin)"],
    "fencing_tokens": True,
    "durable_dispatch_queue": True,
    "immutable_runtime_events": True,
    "approval_scope_enforcement": True,
    "approvals": "runtime",
    "multipart_delivery_checkpoints": True,  # `deliveries checkpoint RUN` (scheduler.delivery.checkpoint)
    # The seed's evidence values (docs/evidence.md): every evidence job's run attested from its persisted run,
    # bound to its execution artifact, by the checksum, ssh (signed) or external (provider-verified) provider.
    "evidence_generation": True,
    "checksum_evidence_generation": True,
    "signed_or_provider_verified_evidence": True,
    "evidence_integrity": "artifact-bound-signed-or-provider-verified-v4",
    "execution_artifacts": {"canonicalization": "json-sort-v1", "digest": "sha256", "kinds": ["native", "handoff-v4"]},
    "handoff_v4_artifact": True,
    "handoff_version": "4",
    # The contract a handoff v4 artifact must declare exactly (docs/handoff-v4.md).
    "handoff_contract": {
        "artifact_schema": "openclaw.scheduler.handoff-artifact", "artifact_schema_version": 1, "scheduler_schema_min": 29,
        "canonicalization": "json-sort-v1", "canonicalization_version": 1, "digest": "sha256", "undefined": "null",
        "execution_binding_version": 2, "scheduler_job_binding_version": 1,
    },
    "completion_delivery_scope": "run",
}


@click.command("capabilities")
def capabilities_cmd() -> None:
    """Print the feature flags of this kernel (without loading plugins or the database); the plugin-dependent ones
    (``FEATURES`` of the plugin-kind registry) follow what the entry-point metadata says is installed and not switched off."""
    from scheduler.base.plugin_kinds import feature_values

    caps = {"version": __version__, "plugin_api": PLUGIN_API_VERSION, **CAPABILITIES, **feature_values()}
    emit({"capabilities": caps}, lambda: [click.echo(f"{k}: {v}") for k, v in caps.items()])


@click.group("plugins")
def plugins_group() -> None:
    """Inspect installed plugins."""


@plugins_group.command("list")
@click.option("--no-load", is_flag=True, help="Only list entry points; do not import them.")
def plugins_list(no_load: bool) -> None:
    """Every plugin found by entry point, with load status (failures are shown, never fatal)."""
    from scheduler.plugins.inventory import inventory

    rows = inventory(load=not no_load)
    emit(
        {"plugins": rows},
        lambda: table(
            [(r["group"].split(".", 1)[1], r["name"], r["distribution"], r["version"], r["status"], r["error"] or ", ".join(r["capabilities"]))
             for r in rows],
            ["group", "name", "distribution", "version", "status", "detail"],
        ),
    )
