"""Opt-in pytest adapter: one parametrised test per conformance case, for plugin authors' own test suites.

Usage in a plugin's ``tests/test_conformance.py``::

    from scheduler.conformance.pytest_plugin import ExecutorConformance

    class TestShellConformance(ExecutorConformance):
        provider_name = "shell"                 # loaded through its entry point, as production does

    class TestMyInProcessExecutor(ExecutorConformance):
        case_filter = "executor.exit-*"         # optional id glob(s)
        def make_provider(self):
            return MyExecutor()

Importing a base class is enough: the parametrisation lives in the class's own
``pytest_generate_tests``. Listing ``pytest_plugins = ["scheduler.conformance.pytest_plugin"]``
additionally gives the ``conformance_case_ids`` fixture and a header line. A case a
provider lacks the capabilities for is skipped; a failed case fails with the engine's message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from scheduler.conformance.engine import Case, load_cases, run_case, select_cases
from scheduler.errors import SchedulerError


class _ProviderConformance:
    """Base of the per-kind classes: generates ``test_case`` once per case of ``kind``."""

    #: Provider kind (a key of ``scheduler.plugins.protocols.PROVIDER_KINDS``); set by each base class.
    kind: ClassVar[str] = ""
    #: Entry-point name of the driver to load, unless ``make_provider`` is overridden.
    provider_name: ClassVar[str | None] = None
    #: Optional id glob (or list of globs) selecting a subset of the cases.
    case_filter: ClassVar[str | list[str] | None] = None
    #: Optional fixtures directory (defaults to the engine's resolution).
    fixtures_root: ClassVar[str | Path | None] = None

    def make_provider(self) -> Any:
        """Build the provider under test; by default load ``provider_name`` through its entry point."""
        from scheduler.plugins.loader import load_provider

        if not self.provider_name:
            raise SchedulerError(
                "CONFORMANCE_NO_PROVIDER", f"{type(self).__name__} sets neither provider_name nor make_provider()"
            )
        return load_provider(self.kind, self.provider_name)

    @classmethod
    def conformance_cases(cls) -> list[Case]:
        """The cases this class runs (its kind, filtered by ``case_filter``)."""
        return select_cases(load_cases(cls.kind, cls.fixtures_root), cls.case_filter)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrise ``conformance_case`` with every case of the kind, ids = case ids."""
        if "conformance_case" not in metafunc.fixturenames:
            return
        cases = type(self).conformance_cases()
        if not cases:
            metafunc.parametrize(
                "conformance_case",
                [pytest.param(None, marks=pytest.mark.skip(reason=f"no {self.kind} conformance cases selected"))],
                ids=["no-cases"],
            )
            return
        metafunc.parametrize("conformance_case", cases, ids=[c.id for c in cases])

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_provider(cls) -> Any:
        """The provider, built once per class; a build/load failure is returned, and fails each case."""
        try:
            return cls().make_provider()
        except SchedulerError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - reported by every case of the class
            return SchedulerError("PLUGIN_LOAD_FAILED", f"{type(exc).__name__}: {exc}")

    def test_case(self, conformance_case: Case, conformance_provider: Any, tmp_path: Path) -> None:
        """Run one conformance case; skip or fail with the engine's message."""
        if isinstance(conformance_provider, SchedulerError):
            pytest.fail(f"provider failed to load: {conformance_provider.code}: {conformance_provider.message}", pytrace=False)
        result = run_case(conformance_provider, conformance_case, tmp_path)
        if result.outcome == "skipped":
            pytest.skip(result.message)
        if result.outcome == "failed":
            pytest.fail(f"{conformance_case.id}: {result.message}", pytrace=False)


class ExecutorConformance(_ProviderConformance):
    """Conformance cases for ``scheduler.executors`` providers."""

    kind: ClassVar[str] = "executor"


class ChannelConformance(_ProviderConformance):
    """Conformance cases for ``scheduler.channels`` providers."""

    kind: ClassVar[str] = "channel"


class EvidenceProviderConformance(_ProviderConformance):
    """Conformance cases for ``scheduler.evidence_providers`` providers."""

    kind: ClassVar[str] = "evidence"


class CredentialProviderConformance(_ProviderConformance):
    """Conformance cases for ``scheduler.credential_providers`` providers."""

    kind: ClassVar[str] = "credential"


class AuthorizationProviderConformance(_ProviderConformance):
    """Conformance cases for ``scheduler.authorization_providers`` providers."""

    kind: ClassVar[str] = "authorization"


@pytest.fixture
def conformance_case_ids() -> dict[str, list[str]]:
    """Every case id per kind (handy for a plugin's own sanity tests)."""
    from scheduler.plugins.protocols import PROVIDER_KINDS

    return {kind: [c.id for c in load_cases(kind)] for kind in PROVIDER_KINDS}


def pytest_report_header(config: pytest.Config) -> str:
    """Show which fixtures directory the conformance cases come from."""
    from scheduler.conformance.engine import version_dir

    try:
        return f"scheduler conformance fixtures: {version_dir()}"
    except SchedulerError as exc:
        return f"scheduler conformance fixtures: unavailable ({exc.code})"
