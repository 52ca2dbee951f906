"""``python -m scheduler.conformance.ci``: run the fixtures against every first-party provider, as CI does.

Each provider in ``FIRST_PARTY`` must be installed (``make test`` installs every
distribution under ``plugins/``, ``providers/`` and ``examples/``); one that is not is
reported as one failure, unless ``SCHEDULER_CONFORMANCE_ALLOW_MISSING=1`` turns it into
one skip. ``SCHEDULER_CONFORMANCE_PROVIDERS="executor:shell,channel:webhook"`` replaces
the list (to run a subset locally); ``SCHEDULER_CONFORMANCE_FIXTURES`` adds case
directories to the stock corpus for every provider. Prints each report (a failed case
with what the provider reported) and a final combined line
``N passed, N failed, N skipped``; exits 1 on any failure. A provider that cannot be
loaded, an executor without a payload adapter or a channel without a service adapter, is
one failure, never one per case.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from scheduler.conformance.cli import result_line
from scheduler.conformance.engine import Report, run_kind
from scheduler.core import steps
from scheduler.pipeline import installed_steps

#: (kind, driver name) of every first-party provider the fixtures apply to (each channel sends
#: to the loopback stand-in its distribution's service adapter starts), and of the example
#: executors of examples/plugin-walkthrough/ (which promise to pass the corpus too). Add a pair
#: when a distribution under plugins/, providers/ or examples/ gains fixtures for its kind.
FIRST_PARTY: tuple[tuple[str, str], ...] = (
    ("executor", "shell"),
    ("executor", "hello"),
    ("executor", "python"),
    ("executor", "agent"),
    ("executor", "main-session"),
    ("channel", "webhook"),
    ("channel", "slack"),
    ("channel", "telegram"),
    ("channel", "email"),
    ("channel", "openclaw"),
    ("credential", "env"),
    ("credential", "file"),
    ("credential", "command"),
    ("credential", "oauth2"),
    ("evidence", "checksum"),
    ("evidence", "ssh"),
    ("evidence", "external"),
    ("authorization", "cedar"),
    ("authorization", "policyfile"),
    ("authorization", "teams"),
    ("proof_verifier", "jwt"),
    ("proof_verifier", "detached-signature"),
    ("proof_verifier", "certificate"),
    ("proof_verifier", "detached-signature-ssh"),
)

ALLOW_MISSING_ENV = "SCHEDULER_CONFORMANCE_ALLOW_MISSING"
PROVIDERS_ENV = "SCHEDULER_CONFORMANCE_PROVIDERS"
_TRUE = {"1", "true", "yes", "on"}


def providers_to_run() -> list[tuple[str, str]]:
    """``FIRST_PARTY``, or the ``kind:name`` list in ``$SCHEDULER_CONFORMANCE_PROVIDERS``."""
    raw = os.environ.get(PROVIDERS_ENV, "").strip()
    if not raw:
        return list(FIRST_PARTY)
    out: list[tuple[str, str]] = []
    for item in (p.strip() for p in raw.split(",")):
        if item:
            kind, _, name = item.partition(":")
            out.append((kind.strip(), name.strip()))
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line: no arguments (the environment variables above choose what runs); ``--help`` prints this module's
    description and exits 0, anything else is a usage error (exit 2), so a mistyped flag never starts the whole suite."""
    parser = argparse.ArgumentParser(prog="python -m scheduler.conformance.ci", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"first-party providers: {', '.join(f'{k}:{n}' for k, n in FIRST_PARTY)}")
    return parser.parse_args(argv)


def main(out: TextIO | None = None, argv: list[str] | None = None) -> int:
    """Run every listed provider, print the reports and the combined summary; return the exit code.

    ``argv`` (the command line, when run as a module) is parsed first: ``--help`` prints help instead of running.
    """
    if argv is not None:
        parse_args(argv)
    steps.install(installed_steps)  # the cases validate job specs: the run pipeline's steps own their fields
    stream = out or sys.stdout
    allow_missing = os.environ.get(ALLOW_MISSING_ENV, "").strip().lower() in _TRUE
    passed = failed = skipped = 0
    for kind, name in providers_to_run():
        print(f"== conformance {kind} {name}", file=stream, flush=True)
        report: Report = run_kind(kind, name, on_result=lambda r: print(result_line(r), file=stream, flush=True))
        if report.error is not None:
            missing = report.error["code"] == "PLUGIN_NOT_FOUND"
            if missing and allow_missing:
                print(f"SKIP {kind} {name}: not installed ({ALLOW_MISSING_ENV}=1)", file=stream)
                skipped += 1
                continue
            print(f"FAIL {kind} {name}: {report.error['code']}: {report.error['message']}", file=stream)
            if missing:
                print(f"     CI must install the distribution providing the {kind} driver {name!r}", file=stream)
        passed, failed, skipped = passed + report.passed, failed + report.failed, skipped + report.skipped
        print(report.summary_line(), file=stream, flush=True)
    print(f"{passed} passed, {failed} failed, {skipped} skipped", file=stream, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(argv=sys.argv[1:]))
