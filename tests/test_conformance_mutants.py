"""The mutation suite (issue 27): the stock corpus catches every deliberately broken provider.

Each variant of the side-loaded ``tests/support/scheduler-mutants`` is an honest first-party
provider with one method overridden (``scheduler_mutants.variants.VARIANTS``). Per variant the
stock corpus of its kind runs until its first failing case; the test fails unless a corpus case
(not a load error) failed it, prints ``MUTANT kind variant caught-by case``, and holds the catching
case to the table of docs/plugins.md ("What the corpus is proven to catch"), which
``test_the_docs_table_lists_every_variant`` holds to the variant list.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from scheduler.conformance.engine import run_kind
from scheduler.core import steps
from scheduler.pipeline import installed_steps
from scheduler.plugins.loader import load_provider

REPO = Path(__file__).resolve().parents[1]
DIST = REPO / "tests" / "support" / "scheduler-mutants"
DOC = REPO / "docs" / "plugins.md"
TABLE_HEADING = "### What the corpus is proven to catch"
sys.path.insert(0, str(DIST))
from scheduler_mutants import REFERENCES  # noqa: E402  (side-loaded test support, not installed)
from scheduler_mutants.variants import VARIANTS, Variant  # noqa: E402

ROW = re.compile(r"^\| (?P<kind>[a-z_]+) \| `(?P<variant>[a-z0-9-]+)` \| (?P<promise>.+?) \| `(?P<case>[a-z0-9_.-]+)` \|$")

#: The user-property key tests/conftest.py collects into the run's summary (a literal: `from conftest import` finds
#: another distribution's conftest when the whole tree runs in one pytest).
MUTANT_REPORT_KEY = "mutant_report"


@pytest.fixture(scope="module")
def mutants_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The mutants' entry points visible for this module only (side-loaded, never installed)."""
    from kernel_testing import sideloaded

    steps.install(installed_steps)
    with sideloaded(DIST, into=tmp_path_factory.mktemp("mutants")):
        assert {v.driver for v in VARIANTS} <= {ep.name for ep in entry_points(group="scheduler.conformance_adapters")}
        yield


def documented() -> dict[tuple[str, str], tuple[str, str]]:
    """``(kind, variant) -> (promise, catching case)`` from the table of docs/plugins.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(TABLE_HEADING):]
    section = section[: section.index("\n#", 1)]
    rows = [ROW.match(line) for line in section.splitlines() if line.startswith("| ") and "`" in line]
    return {(m["kind"], m["variant"]): (m["promise"], m["case"]) for m in rows if m}


def run_as(variant: Variant) -> str:
    """The name a variant's cases run under: its own, but a proof verifier's is the method its declarations name."""
    return REFERENCES[variant.kind][0] if variant.kind == "proof_verifier" else variant.driver


def table_row(variant: Variant, case: str) -> str:
    """One row of the docs table (what the test prints, so the table is generated from its output)."""
    return f"| {variant.kind} | `{variant.name}` | {variant.promise} | `{case}` |"


@pytest.mark.parametrize("variant", VARIANTS, ids=[f"{v.kind}-{v.name}" for v in VARIANTS])
def test_the_corpus_catches_the_variant(mutants_installed: None, variant: Variant,
                                        record_property: Callable[[str, object], None]) -> None:
    provider = load_provider(variant.kind, variant.driver)  # it loads, through its entry point, as production loads it
    report = run_kind(variant.kind, run_as(variant), provider, stop_at_first_failure=True)
    assert report.error is None, f"{variant.driver} did not run (a load error proves nothing): {report.error}"
    failed = [r for r in report.results if r.outcome == "failed"]
    assert failed, f"no case of the {variant.kind} corpus caught {variant.driver} ({report.summary_line()})"
    caught = failed[0]
    record_property(MUTANT_REPORT_KEY, f"MUTANT {variant.kind} {variant.name} caught-by {caught.id}")  # the run's summary prints it
    print(f"MUTANT {variant.kind} {variant.name} caught-by {caught.id}: {caught.message[:200]}\n{table_row(variant, caught.id)}")
    want = documented().get((variant.kind, variant.name))
    assert want is not None and want[1] == caught.id, (
        f"docs/plugins.md says {want[1] if want else 'nothing'} catches {variant.name}, the corpus caught it with "
        f"{caught.id}: {caught.message[:300]}\nthe row: {table_row(variant, caught.id)}")


def test_the_docs_table_lists_every_variant() -> None:
    """Every variant, with its promise, has a row; no row names a variant that does not exist; eight per kind at least."""
    rows = documented()
    assert {(v.kind, v.name): v.promise for v in VARIANTS} == {key: promise for key, (promise, _case) in rows.items()}
    for kind in REFERENCES:
        assert sum(1 for v in VARIANTS if v.kind == kind) >= 8, kind


def test_each_variant_keeps_its_references_contract() -> None:
    """A variant overrides one method of its honest reference, and declares its plugin_api and capabilities."""
    import importlib

    for variant in VARIANTS:
        module, _, name = variant.target.partition(":")
        cls = getattr(importlib.import_module(module), name)
        honest = next(base for base in cls.__mro__[1:] if base.__module__.split(".")[0] != "scheduler_mutants")
        own = {k for k, v in vars(cls).items() if callable(v) and not k.startswith("__")}
        parents = [base for base in cls.__mro__[1:] if base is not honest and base.__module__.startswith("scheduler_mutants")]
        own |= {k for base in parents for k, v in vars(base).items() if callable(v) and not k.startswith("__")}
        assert len(own) == 1 and hasattr(honest, next(iter(own))), (variant.name, own)
        assert cls.plugin_api == honest.plugin_api and cls.capabilities == honest.capabilities, variant.name


def test_the_loader_tells_a_provider_its_name(mutants_installed: None) -> None:
    """Issue 27 item 4: one class (the ssh provider) serves several names; each envelope names the entry point it was loaded as."""
    for driver in ("mutant-verify-raises", "mutant-key-in-reason"):
        report = run_kind("evidence", driver, filter="evidence.attest-verify")
        assert report.ok and report.passed == 1, [r.to_json() for r in report.results]


def test_the_report_is_printed_in_a_plain_run_under_xdist() -> None:
    """The report (kind, variant, catching case) is in the terminal summary of a run without -rA, under xdist too."""
    variant = next(v for v in VARIANTS if v.name == "exit-status-hidden")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "no:cacheprovider", str(Path(__file__)),
                           "-k", f"test_the_corpus_catches_the_variant and {variant.kind}-{variant.name}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout[done.stdout.index("conformance mutation suite"):]
    want = documented()[(variant.kind, variant.name)][1]
    assert f"MUTANT {variant.kind} {variant.name} caught-by {want}" in summary.splitlines(), done.stdout[-3000:]
