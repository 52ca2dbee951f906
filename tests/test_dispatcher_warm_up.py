"""Issue 34: a dispatcher loads the run pipeline and its jobs' executors when it starts, not inside the first runs.

Before, the first job due after ``scheduler run`` started paid for the entry-point scan and the
pipeline steps' imports (about 9 ms here) and for importing its executor plugin (testkit 16 ms,
shell 35 ms) inside its own run: it began up to 74 ms after its due time, or ran that much
longer. These tests look at what is loaded once ``start()`` returned, before any pass.
"""

from __future__ import annotations

from scheduler.core import steps
from scheduler.core.dispatcher import Dispatcher, DispatcherConfig
from scheduler.pipeline import installed_steps
from scheduler.runtime import dispatcher_parts, install
from scheduler.testing import add_job


def _started(store, tmp_path):
    """A started dispatcher with the process's pipeline as it is (``scheduler.runtime.dispatcher`` would install it)."""
    d = Dispatcher(store, dispatcher_parts(), DispatcherConfig(concurrency=1, artifacts_root=tmp_path / "artifacts"))
    d.start()
    return d


def test_start_loads_the_pipeline_and_the_executors_enabled_jobs_use(store, tmp_path):
    add_job(store, payload_message="ok")  # testkit
    calls = []

    def factory():
        calls.append(1)
        return installed_steps()

    with steps.installed_as(None):
        steps.install(factory)  # deferred, as the composition root installs it
        d = _started(store, tmp_path)
        try:
            assert calls == [1]  # the steps were made at start, before any run asked for them
            assert d._executors.peek("testkit") is not None
            steps.registered()
            assert calls == [1]  # and once
        finally:
            d._shutdown()


def test_start_leaves_the_executors_of_disabled_jobs_alone(store, tmp_path):
    add_job(store, executor="shell", payload_message="true", enabled=False)
    install()
    d = _started(store, tmp_path)
    try:
        assert d._executors.peek("shell") is None
        assert d._executors.failed() == []
    finally:
        d._shutdown()


def test_a_pipeline_that_cannot_be_made_does_not_stop_the_start_and_fails_the_run_as_before(store, tmp_path):
    add_job(store, payload_message="ok")

    def broken():
        raise RuntimeError("a step module that does not import")

    with steps.installed_as(None):
        steps.install(broken)
        d = _started(store, tmp_path)
        try:
            assert d.lease is not None  # started
            try:
                steps.registered()
            except RuntimeError as exc:  # still pending: whatever needs the steps meets the same failure
                assert "does not import" in str(exc)
            else:
                raise AssertionError("the broken pipeline was installed")
        finally:
            d._shutdown()
