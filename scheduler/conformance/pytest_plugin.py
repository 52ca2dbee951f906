"""Opt-in pytest adapter: one parametrised test per conformance case, for plugin authors' own test suites.

Usage in a plugin's ``tests/test_conformance.py`` (import the classes from ``scheduler.testing``)::

    from scheduler.testing import ChannelConformance, ExecutorConformance

    class TestShellConformance(ExecutorConformance):
        provider_name = "shell"                 # loaded through its entry point, as production does
                                                # (its payload adapter: entry point scheduler.conformance_adapters:shell)

    class TestMyInProcessExecutor(ExecutorConformance):
        payload_adapter = MyPayloads            # an adapter object, class, or "module:attr"
        case_filter = "executor.exit-*"         # optional id glob(s)
        extra_fixtures = ["tests/cases"]        # optional: my own cases, added to the stock corpus

        def make_provider(self):
            return MyExecutor()

    class TestWebhookConformance(ChannelConformance):
        provider_name = "webhook"               # its service adapter: entry point scheduler.conformance_adapters:webhook

Importing a base class is enough: the parametrisation lives in the class's own
``pytest_generate_tests``. Listing ``pytest_plugins = ["scheduler.conformance.pytest_plugin"]``
additionally gives the ``conformance_case_ids`` fixture and a header line. A case a
provider lacks the capabilities for, or that its payload (service) adapter cannot
express, is skipped with the reason; a failed case fails with the engine's message and
what the provider reported. A provider that cannot be built or loaded (or an executor
without a payload adapter, a channel without a service adapter) is **one** failing test,
``test_case[provider-load]``, not one per case.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest

from scheduler.base.errors import SchedulerError
from scheduler.conformance.engine import Case, extra_fixture_dirs, load_cases, prepare, run_case, select_cases, version_dir
from scheduler.plugins.loader import load_provider
from scheduler.plugins.protocols import PROVIDER_KINDS

#: Parameter id of the single test that stands for a provider that could not be loaded.
LOAD_FAILURE_ID = "provider-load"


@attrs.frozen(kw_only=True)
class _Loaded:
    """A class's provider and per-provider context, or the error that kept it from loading."""

    provider: Any = None
    context: Any = None
    error: SchedulerError | None = None


#: Per test class: its loaded provider (built once, at collection, shared by all its cases).
_LOADED: dict[type, _Loaded] = {}


class _ProviderConformance:
    """Base of the per-kind classes: generates ``test_case`` once per case of ``kind``."""

    #: Provider kind (a key of ``scheduler.plugins.protocols.PROVIDER_KINDS``); set by each base class.
    kind: ClassVar[str] = ""
    #: Entry-point name of the driver to load, unless ``make_provider`` is overridden.
    provider_name: ClassVar[str | None] = None
    #: Optional id glob (or list of globs) selecting a subset of the cases.
    case_filter: ClassVar[str | list[str] | None] = None
    #: Optional replacement of the stock fixtures directory (tests of the engine itself).
    fixtures_root: ClassVar[str | Path | None] = None
    #: Extra case directories, added to the stock corpus (like ``$SCHEDULER_CONFORMANCE_FIXTURES``).
    extra_fixtures: ClassVar[Sequence[str | Path]] = ()

    def make_provider(self) -> Any:
        """Build the provider under test; by default load ``provider_name`` through its entry point."""
        if not self.provider_name:
            raise SchedulerError(
                "CONFORMANCE_NO_PROVIDER", f"{type(self).__name__} sets neither provider_name nor make_provider()"
            )
        return load_provider(self.kind, self.provider_name)

    def make_payload_adapter(self) -> Any:
        """The payload adapter to use, or None to let the engine find it (the provider's own, then its entry point)."""
        return None

    @classmethod
    def conformance_cases(cls) -> list[Case]:
        """The cases this class runs (its kind, filtered by ``case_filter``)."""
        return select_cases(load_cases(cls.kind, cls.fixtures_root, extra=cls.extra_fixtures), cls.case_filter)

    @classmethod
    def conformance_loaded(cls) -> _Loaded:
        """The provider and its context, built once per class; a failure is kept (and reported by one test)."""
        if cls not in _LOADED:
            try:
                instance = cls()
                provider = instance.make_provider()
                context = prepare(cls.kind, cls.provider_name, provider, instance.make_payload_adapter())
                _LOADED[cls] = _Loaded(provider=provider, context=context)
            except SchedulerError as exc:
                _LOADED[cls] = _Loaded(error=exc)
            except Exception as exc:  # noqa: BLE001 - reported by the one load-failure test
                _LOADED[cls] = _Loaded(error=SchedulerError("PLUGIN_LOAD_FAILED", f"{type(exc).__name__}: {exc}"))
        return _LOADED[cls]

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrise ``conformance_case`` with every case of the kind (ids = case ids), or with one load failure."""
        if "conformance_case" not in metafunc.fixturenames:
            return
        cls = type(self)
        cases = cls.conformance_cases()
        if not cases:
            metafunc.parametrize(
                "conformance_case",
                [pytest.param(None, marks=pytest.mark.skip(reason=f"no {self.kind} conformance cases selected"))],
                ids=["no-cases"],
            )
            return
        if cls.conformance_loaded().error is not None:
            metafunc.parametrize("conformance_case", [None], ids=[LOAD_FAILURE_ID])
            return
        metafunc.parametrize("conformance_case", cases, ids=[c.id for c in cases])

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_provider(cls) -> _Loaded:
        """The class's loaded provider (or its load failure), shared by all its cases."""
        return cls.conformance_loaded()

    def test_case(self, conformance_case: Case | None, conformance_provider: _Loaded, tmp_path: Path) -> None:
        """Run one conformance case; skip or fail with the engine's message (and what the provider reported)."""
        if conformance_provider.error is not None:
            error = conformance_provider.error
            pytest.fail(f"{self.kind} provider could not be used: {error.code}: {error.message}", pytrace=False)
        assert conformance_case is not None
        result = run_case(
            conformance_provider.provider,
            conformance_case,
            tmp_path,
            name=self.provider_name,
            context=conformance_provider.context,
        )
        if result.outcome == "skipped":
            pytest.skip(result.message)
        if result.outcome == "failed":
            pytest.fail(f"{conformance_case.id}: {result.explain()}", pytrace=False)


class ExecutorConformance(_ProviderConformance):
    """Conformance cases for ``scheduler.executors`` providers.

    ``payload_adapter`` (an object, a class or ``"module:attr"``) names the adapter that
    writes each case's behaviour in the executor's payload language; left ``None``, the
    executor's own ``conformance_payload`` method or its ``scheduler.conformance_adapters``
    entry point is used.
    """

    kind: ClassVar[str] = "executor"
    payload_adapter: ClassVar[Any] = None

    def make_payload_adapter(self) -> Any:
        """``payload_adapter`` (None: let the engine find it)."""
        return type(self).payload_adapter


class ChannelConformance(_ProviderConformance):
    """Conformance cases for ``scheduler.channels`` providers.

    ``service_adapter`` (an object, a class or ``"module:attr"``) names the adapter that
    starts a loopback stand-in of the channel's service for each case; left ``None``, the
    channel's own ``conformance_service`` method or its ``scheduler.conformance_adapters``
    entry point is used.
    """

    kind: ClassVar[str] = "channel"
    service_adapter: ClassVar[Any] = None

    def make_service_adapter(self) -> Any:
        """``service_adapter`` (None: let the engine find it)."""
        return type(self).service_adapter

    def make_payload_adapter(self) -> Any:
        """The kind's adapter handed to the engine: for a channel, its service adapter."""
        return self.make_service_adapter()


class EvidenceProviderConformance(_ProviderConformance):
    """Conformance cases for ``scheduler.evidence_providers`` providers.

    ``setup_adapter`` (an object, a class or ``"module:attr"``) names the adapter that sets up
    each case's keys, trust or attestor; left ``None``, the provider's own ``conformance_setup``
    method or its ``scheduler.conformance_adapters`` entry point is used.
    """

    kind: ClassVar[str] = "evidence"
    setup_adapter: ClassVar[Any] = None

    def make_payload_adapter(self) -> Any:
        """The kind's adapter handed to the engine: for an evidence provider, its setup adapter."""
        return type(self).setup_adapter


class CredentialProviderConformance(_ProviderConformance):
    """Conformance cases for ``scheduler.credential_providers`` providers.

    ``source_adapter`` (an object, a class or ``"module:attr"``) names the adapter that starts
    each case's stand-in source; left ``None``, the provider's own ``conformance_source`` method
    or its ``scheduler.conformance_adapters`` entry point is used.
    """

    kind: ClassVar[str] = "credential"
    source_adapter: ClassVar[Any] = None

    def make_payload_adapter(self) -> Any:
        """The kind's adapter handed to the engine: for a credential provider, its source adapter."""
        return type(self).source_adapter


class AuthorizationProviderConformance(_ProviderConformance):
    """Conformance cases for ``scheduler.authorization_providers`` providers.

    ``setup_adapter`` (an object, a class or ``"module:attr"``) names the adapter that writes
    each case's policy in the provider's language; left ``None``, the provider's own
    ``conformance_policy`` method or its ``scheduler.conformance_adapters`` entry point is used.
    """

    kind: ClassVar[str] = "authorization"
    setup_adapter: ClassVar[Any] = None

    def make_payload_adapter(self) -> Any:
        """The kind's adapter handed to the engine: for an authorization provider, its setup adapter."""
        return type(self).setup_adapter


class ProofVerifierConformance(_ProviderConformance):
    """Conformance cases for ``scheduler.proof_verifiers`` verifiers.

    ``setup_adapter`` (an object, a class or ``"module:attr"``) names the adapter that mints
    each case's trust and proof in the verifier's format; left ``None``, the verifier's own
    ``conformance_proof`` method or its ``scheduler.conformance_adapters`` entry point is used.
    """

    kind: ClassVar[str] = "proof_verifier"
    setup_adapter: ClassVar[Any] = None

    def make_payload_adapter(self) -> Any:
        """The kind's adapter handed to the engine: for a proof verifier, its setup adapter."""
        return type(self).setup_adapter


@pytest.fixture
def conformance_case_ids() -> dict[str, list[str]]:
    """Every case id per kind (handy for a plugin's own sanity tests)."""
    return {kind: [c.id for c in load_cases(kind)] for kind in PROVIDER_KINDS}


def pytest_report_header(config: pytest.Config) -> str:
    """Show which fixtures directories the conformance cases come from."""
    try:
        dirs = [str(version_dir()), *(str(d) for d in extra_fixture_dirs())]
        return f"scheduler conformance fixtures: {', '.join(dirs)}"
    except SchedulerError as exc:
        return f"scheduler conformance fixtures: unavailable ({exc.code})"
