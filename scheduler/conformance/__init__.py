"""The conformance engine: versioned JSON cases every provider kind must pass.

``engine`` loads and runs the cases (no pytest), ``cli`` is the ``scheduler
conformance`` command group, ``ci`` runs every first-party provider, and
``pytest_plugin`` is the opt-in pytest adapter for plugin authors.
"""

from __future__ import annotations

from scheduler.conformance.engine import (
    ADAPTERS,
    FIXTURE_VERSION,
    Case,
    CaseResult,
    KindAdapter,
    Report,
    fixtures_root,
    load_cases,
    load_corpus,
    register_adapter,
    run_case,
    run_kind,
    select_cases,
)

__all__ = [
    "ADAPTERS",
    "FIXTURE_VERSION",
    "Case",
    "CaseResult",
    "KindAdapter",
    "Report",
    "fixtures_root",
    "load_cases",
    "load_corpus",
    "register_adapter",
    "run_case",
    "run_kind",
    "select_cases",
]
