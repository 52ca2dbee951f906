"""scheduler: a plugin-oriented job scheduler for shell and AI-agent work.

This module stays import-light on purpose: ``scheduler version`` must start fast,
so nothing here pulls in the database layer, croniter or any plugin.
"""

from __future__ import annotations

__version__ = "0.1.0"

#: Major version of the provider/executor API. A provider declares the major it
#: was written against as ``plugin_api``; the kernel refuses a different major.
PLUGIN_API_VERSION = 3

__all__ = ["PLUGIN_API_VERSION", "__version__"]
