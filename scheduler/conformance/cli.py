"""``scheduler conformance``: run the conformance fixtures against an installed provider, or list them.

The lead attaches ``conformance_group`` to the root CLI; it also runs on its own
as ``python -m scheduler.conformance.cli``. Human output is one line per case
(``PASS id``, ``FAIL id: message``, ``SKIP id: reason``; a failure is followed by
indented lines with what the provider reported: result, stderr, stdout, the payload
it was given; for a channel each attempt and what its service stand-in saw) with the summary line ``N passed, N failed, N skipped`` last; ``--json``
prints one JSON object. A run that cannot start (the provider does not load, no
payload adapter, invalid fixtures) is one error on stderr and one failure in the summary.
"""

from __future__ import annotations

import json
from typing import Any

import click

from scheduler.base.errors import SchedulerError
from scheduler.conformance.engine import CaseResult, Report, load_cases, load_corpus, run_kind
from scheduler.core import steps
from scheduler.pipeline import installed_steps
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
    """The human text of one case result: ``PASS id``, ``SKIP id: reason``, or ``FAIL id: message`` plus
    one indented line per observed item (result, stderr, stdout, payload), so a failure shows the executor's side."""
    label = _LABELS[result.outcome]
    head = f"{label} {result.id}: {result.message}" if result.message else f"{label} {result.id}"
    if result.outcome != "failed" or not result.observed:
        return head
    rest = result.explain().splitlines()[1 if result.message else 0 :]
    return "\n".join([head, *(f"     {line}" for line in rest)])


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


_FIXTURES_HELP = (
    "Extra directory of cases, added to the stock corpus (repeatable; also $SCHEDULER_CONFORMANCE_FIXTURES, "
    "os.pathsep-separated): a conformance-fixtures/ directory or one holding <kind>/*.json."
)


@conformance_group.command("run")
@click.argument("kind", type=_KINDS)
@click.argument("name")
@click.option("--json", "as_json_flag", is_flag=True, help="Print one JSON object instead of lines.")
@click.option("--case", "case_globs", multiple=True, metavar="ID_GLOB", help="Only cases whose id matches (repeatable).")
@click.option("--fixtures", "fixture_dirs", multiple=True, metavar="DIR", help=_FIXTURES_HELP)
@click.option(
    "--adapter",
    "adapter",
    metavar="MODULE:ATTR",
    help="Executor payload adapter, or channel service adapter, to use instead of the provider's own or its "
    "scheduler.conformance_adapters entry point.",
)
@click.pass_context
def run_command(
    ctx: click.Context,
    kind: str,
    name: str,
    as_json_flag: bool,
    case_globs: tuple[str, ...],
    fixture_dirs: tuple[str, ...],
    adapter: str | None,
) -> None:
    """Run KIND cases against the installed provider NAME (loaded by entry point); exit 1 on any failure."""
    as_json = _json_wanted(ctx, as_json_flag)

    def on_result(result: CaseResult) -> None:
        if not as_json:
            click.echo(result_line(result))

    report: Report = run_kind(
        kind, name, filter=list(case_globs) or None, extra=fixture_dirs, payload_adapter=adapter, on_result=on_result
    )
    if as_json:
        click.echo(_dump(report.to_json()))
    else:
        if report.error is not None:
            click.echo(f"error [{report.error['code']}]: {report.error['message']}", err=True)
        click.echo(report.summary_line())
    if not report.ok:
        ctx.exit(1)


@conformance_group.command("list")
@click.argument("kind", type=_KINDS, required=False)
@click.option("--json", "as_json_flag", is_flag=True, help="Print one JSON object instead of lines.")
@click.option("--fixtures", "fixture_dirs", multiple=True, metavar="DIR", help=_FIXTURES_HELP)
@click.pass_context
def list_command(ctx: click.Context, kind: str | None, as_json_flag: bool, fixture_dirs: tuple[str, ...]) -> None:
    """List the case ids (of one KIND, or all), after validating every fixture file."""
    as_json = _json_wanted(ctx, as_json_flag)
    try:
        cases = load_cases(kind, extra=fixture_dirs) if kind else load_corpus(extra=fixture_dirs)
    except SchedulerError as exc:
        _fail(ctx, as_json, exc)
        return
    if as_json:
        click.echo(_dump({"ok": True, "kind": kind, "count": len(cases), "cases": [c.to_json() for c in cases]}))
        return
    for case in cases:
        requires = f"  [requires {', '.join(case.requires)}]" if case.requires else ""
        unless = case.input.get("unless_declared") if case.kind == "channel" else None
        requires += f"  [unless it declares {', '.join(unless)}]" if unless else ""
        language = (case.input.get("payload") or {}).get("language")
        raw = f"  [{language} payload]" if language else ""
        click.echo(f"{case.id}  ({case.polarity}){requires}{raw}")


def main() -> None:
    """Entry point of ``python -m scheduler.conformance.cli``."""
    steps.install(installed_steps)  # the cases validate job specs: the run pipeline's steps own their fields
    conformance_group(prog_name="scheduler conformance")


if __name__ == "__main__":
    main()
