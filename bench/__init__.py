"""Scheduler benchmarks: ``python -m bench`` (see ``bench/__main__.py`` and ``docs/benchmarks.md``)."""

from scheduler.runtime import install as _install

# The benchmarks validate, store and run jobs in this process: the composition root installs the run pipeline's steps.
_install()
