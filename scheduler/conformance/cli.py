"""``scheduler conformance``: run the conformance fixtures against an installed provider, or list them.

The lead attaches ``conformance_group`` to the root CLI; it also runs on its own
as ``python -m scheduler.conformance.cli``. Human output is one line per case
(``PASS id``, ``FAIL id: message``, ``SKIP id: reason``) with the summary line
``N passed, N failed, N skipped`` last; ``--json`` prints one JSON object.
"""

from __future__ import annotations

import json
from typing import Any

import click

from scheduler.conformance.engine import CaseResult, Report, load_cases, load_corpus, run_kind
from scheduler.errors import SchedulerError
from scheduler.plugins.protocols import PROVIDER_KINDS

_KINDS = click.Choice(list(PROVIDER_KINDS))
_LABELS = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}


def _json_wanted(ctx: click.Context, local_flag: bool) -> bool:
    """``--json`` given locally, or set by the root command in ``ctx.obj["json"]`` (any parent context)."""
    if local_flag:
        return True
    current: click.Context | None = ctx
    while current is not None:
        if isinstance(current.obj, dict) and "json" in current.obj:
            return bool(current.obj["json"])
        current = current.parent
    return False


def result_line(result: CaseResult) -> str:
    """The human line of one case result: ``PASS id``, ``FAIL id: message`` or ``SKIP id: reason``."""
    label = _LABELS[result.outcome]
    return f"{label} {result.id}: {result.message}" if result.message else f"{label} {result.id}"


def _dump(obj: dict[str, Any]) -> str:
    return json.dumps(obj, default=str, ensure_ascii=False)


def _fail(ctx: click.Context, as_json: bool, exc: SchedulerError) -> None:
    """Print a coded error in the CLI convention (JSON object on stdout, or a line on stderr) and exit non-zero."""
    if as_json:
        click.echo(_dump(exc.to_json()))
    else:
        click.echo(f"error [{exc.code}]: {exc.message}", err=True)
    ctx.exit(exc.exit_code or 1)


@click.group("conformance")
def conformance_group() -> None:
    """Run the versioned conformance fixtures against a provider (executor, channel, evidence, ...)."""


@conformance_group.command("run")
@click.argument("kind", type=_KINDS)
@click.argument("name")
@click.option("--json", "as_json_flag", is_flag=True, help="Print one JSON object instead of lines.")
@click.option("--case", "case_globs", multiple=True, metavar="ID_GLOB", help="Only cases whose id matches (repeatable).")
@click.pass_context
def run_command(ctx: click.Context, kind: str, name: str, as_json_flag: bool, case_globs: tuple[str, ...]) -> None:
    """Run KIND cases against the installed provider NAME (loaded by entry point); exit 1 on any failure."""
    as_json = _json_wanted(ctx, as_json_flag)

    def on_result(result: CaseResult) -> None:
        if not as_json:
            click.echo(result_line(result))

    report: Report = run_kind(kind, name, filter=list(case_globs) or None, on_result=on_result)
    if as_json:
        click.echo(_dump(report.to_json()))
    else:
        if report.error is not None:
            click.echo(f"error [{report.error['code']}]: {report.error['message']}", err=True)
            for result in report.results:  # cases that could not run were not streamed
                click.echo(result_line(result))
        click.echo(report.summary_line())
    if not report.ok:
        ctx.exit(1)


@conformance_group.command("list")
@click.argument("kind", type=_KINDS, required=False)
@click.option("--json", "as_json_flag", is_flag=True, help="Print one JSON object instead of lines.")
@click.pass_context
def list_command(ctx: click.Context, kind: str | None, as_json_flag: bool) -> None:
    """List the case ids (of one KIND, or all), after validating every fixture file."""
    as_json = _json_wanted(ctx, as_json_flag)
    try:
        cases = load_cases(kind) if kind else load_corpus()
    except SchedulerError as exc:
        _fail(ctx, as_json, exc)
        return
    if as_json:
        click.echo(_dump({"ok": True, "kind": kind, "count": len(cases), "cases": [c.to_json() for c in cases]}))
        return
    for case in cases:
        requires = f"  [requires {', '.join(case.requires)}]" if case.requires else ""
        click.echo(f"{case.id}  ({case.polarity}){requires}")


def main() -> None:
    """Entry point of ``python -m scheduler.conformance.cli``."""
    conformance_group(prog_name="scheduler conformance")


if __name__ == "__main__":
    main()
