"""``scheduler service install|status|uninstall``: the systemd unit that runs ``scheduler run``."""

from __future__ import annotations

import click

from scheduler.cli.output import emit, json_mode, kv

_scope = click.option("--user/--system", "user", default=True,
                      help="A user unit in $XDG_CONFIG_HOME/systemd/user (default) or a system unit in /etc/systemd/system.")
_name = click.option("--name", default="scheduler.service", show_default=True,
                     help="Unit name (one per database when several run on a host).")


@click.group("service")
def service_group() -> None:
    """Install, inspect or remove the systemd unit for `scheduler run`."""


@service_group.command("install")
@_scope
@_name
@click.option("--config", "config", default=None, metavar="PATH", help="Settings file the service reads (default: the one in effect now).")
@click.option("--dry-run", is_flag=True, help="Print the unit and where it would go; write nothing.")
@click.option("--verify/--no-verify", default=True, help="Run `systemd-analyze verify` on the written unit when available.")
@click.pass_context
def install_cmd(ctx: click.Context, user: bool, name: str, config: str | None, dry_run: bool, verify: bool) -> None:
    """Write the unit for `scheduler run` on this database (restart on failure, SIGTERM drain, reload on SIGHUP).

    A system unit is sandboxed (ProtectSystem=strict ...): jobs that look like they write outside its writable paths
    are named in a warning (``sandbox_warnings``), the unit is written all the same.
    """
    from scheduler.cli.main import open_ctx_store
    from scheduler.core.store import default_db_path, local_path_of
    from scheduler.ops import service_unit

    db = ctx.find_root().obj.get("db") or str(default_db_path())
    spec = service_unit.build_spec(db, name=name, system=not user, config=config)
    result = service_unit.install(spec, dry_run=dry_run)
    local = local_path_of(db)
    conflicts = (service_unit.sandbox_conflicts(open_ctx_store(ctx), spec.read_write_paths)
                 if spec.system and (local is None or local.expanduser().exists()) else [])
    result["sandbox_warnings"] = [c.to_json() for c in conflicts]
    if result["written"] and verify:
        result["verify"] = service_unit.verify(service_unit.unit_path(spec.name, system=spec.system))

    def human() -> None:
        if conflicts:
            click.echo(f"warning: {service_unit.sandbox_summary(conflicts)}", err=True)
        if dry_run:
            click.echo(f"# would write {result['path']}")
            click.echo(result["text"], nl=False)
            return
        click.echo(f"wrote {result['path']}" + (" (replaced the previous unit)" if result["replaced"] else ""))
        check = result.get("verify")
        if check is not None and not check["ok"]:
            click.echo(f"warning: systemd-analyze verify: {check['output']}", err=True)
        click.echo("then: " + " && ".join(result["next"]))

    emit({"service": result}, human)


@service_group.command("status")
@_scope
@_name
def status_cmd(user: bool, name: str) -> None:
    """Is the unit file installed, and is the unit active (asks `systemctl`); SERVICE_MANAGER_UNREACHABLE without one."""
    from scheduler.ops import service_unit

    result = service_unit.status(name, system=not user)

    def human() -> None:
        kv([
            ("unit", f"{result['unit']} ({result['scope']})"),
            ("file", result["path"] + ("" if result["installed"] else " (not installed)")),
            ("database", result["database"] or "-"),
            ("active", result["active"] or f"unknown: {result['systemctl']}"),
            ("enabled", result["enabled"] or "unknown"),
        ])

    if result["active"] is None and not json_mode():
        human()  # what could be read, then the error
    service_unit.require_manager(result)
    emit({"service": result}, human)


@service_group.command("uninstall")
@_scope
@_name
def uninstall_cmd(user: bool, name: str) -> None:
    """Remove the unit file written by `service install` (refused while systemd still runs the unit)."""
    from scheduler.ops import service_unit

    result = service_unit.uninstall(name, system=not user)
    emit({"service": result}, lambda: click.echo(f"removed {result['path']}; then: {' && '.join(result['next'])}"))
