"""The conformance corpus of kind ``proof_verifier`` against the three verifiers, loaded through their entry points.

Each with its setup adapter (``scheduler_provider_proofs.conformance``, registered in
``scheduler.conformance_adapters``), through the kernel's own verification path, as
``python -m scheduler.conformance.ci`` runs them.
"""

from __future__ import annotations

import pytest

from scheduler.testing import run_conformance


@pytest.mark.parametrize("name", ["jwt", "detached-signature", "certificate"])
def test_the_corpus_passes(name: str) -> None:
    report = run_conformance("proof_verifier", name)
    failed = [r.explain() for r in report.results if r.outcome not in ("passed", "skipped")]
    assert report.ok and report.error is None and not failed, (report.error, failed)
    # The one case skipped: the empty-settings case, for a verifier whose trust is the declaration's own (no host table).
    skipped = [r.id for r in report.results if r.outcome == "skipped"]
    assert skipped == ["proof_verifier.unconfigured-refuses"], skipped
    assert report.passed == len(report.results) - 1 >= 14
