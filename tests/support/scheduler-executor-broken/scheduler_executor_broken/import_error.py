"""A driver module that cannot be imported (stands in for a missing dependency)."""

from __future__ import annotations

raise ImportError(
    "scheduler_executor_broken.import_error: this module is broken on purpose (missing dependency 'no_such_module')"
)


class ImportErrorExecutor:  # pragma: no cover - never reached
    """Unreachable: the module fails to import."""

    plugin_api = 1
    capabilities = frozenset()
