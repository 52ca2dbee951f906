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
def schema_cmd(what: str) -> None:
    """Print the job-spec field catalogue (``jobs``) or the executable SQLite schema (``sql``)."""
    if what == "sql":
        from scheduler.store.migrations import SCHEMA_VERSION, schema_text

        emit({"schema_version": SCHEMA_VERSION, "sql": schema_text()}, lambda: click.echo(schema_text()))
        return
    from scheduler.spec import field_catalogue

    fields = field_catalogue()

    def human() -> None:
        rows = []
        for f in fields:
            cons = f["constraints"]
            c = "|".join(cons["choices"]) if "choices" in cons else ""
            if "minimum" in cons or "maximum" in cons:
                c = f"{cons.get('minimum', '')}..{cons.get('maximum', '')}"
            default = "(required)" if f["required"] else ("-" if f["default"] is None else str(f["default"]).lower() if isinstance(f["default"], bool) else f["default"])
            rows.append((f["name"], f["type"], default, c, f["description"]))
        table(rows, ["field", "type", "default", "constraints", "description"])

    emit({"fields": fields}, human)


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
    "approval_scope_enforcement": False,
    "multipart_delivery_checkpoints": False,
    "evidence_generation": False,
    "handoff_v4_artifact": False,
    "completion_delivery_scope": "run",
}


@click.command("capabilities")
def capabilities_cmd() -> None:
    """Print the feature flags of this kernel (without loading plugins or the database)."""
    caps = {"version": __version__, "plugin_api": PLUGIN_API_VERSION, **CAPABILITIES}
    emit({"capabilities": caps}, lambda: [click.echo(f"{k}: {v}") for k, v in caps.items()])


@click.group("plugins")
def plugins_group() -> None:
    """Inspect installed plugins."""


@plugins_group.command("list")
@click.option("--no-load", is_flag=True, help="Only list entry points; do not import them.")
def plugins_list(no_load: bool) -> None:
    """Every plugin found by entry point, with load status (failures are shown, never fatal)."""
    from scheduler.plugins.loader import inventory

    rows = inventory(load=not no_load)
    emit(
        {"plugins": rows},
        lambda: table(
            [(r["group"].split(".", 1)[1], r["name"], r["distribution"], r["version"], r["status"], r["error"] or ", ".join(r["capabilities"]))
             for r in rows],
            ["group", "name", "distribution", "version", "status", "detail"],
        ),
    )
