"""Entry-point discovery: what is installed in a group right now, and what the environment switches off.

The one listing every loader path reads (plugin drivers, secret schemes, conformance
adapters), below the settings so that settings can find secret schemes without the
plugin layer. It imports no plugin: it reads the package metadata only.

* ``SCHEDULER_DISABLE_PLUGINS``: ``all``/``1``, or a comma list of ``group:name`` / ``name``
  entries (``executors:shell``, ``hooks:*``) that are treated as not installed.
* ``SCHEDULER_STRICT_PLUGINS=1``: any load failure while listing is an error too.
"""

from __future__ import annotations

import os
from typing import Any

#: Values of the two switches that mean "every plugin" / "on".
_ALL = {"1", "all", "*", "true", "yes"}


def short_group(group: str) -> str:
    """A group's name without the ``scheduler.`` prefix (``executors`` for ``scheduler.executors``), for messages."""
    return group.split(".", 1)[1] if group.startswith("scheduler.") else group


def is_disabled(group: str, name: str) -> bool:
    """Whether ``SCHEDULER_DISABLE_PLUGINS`` switches this driver off."""
    raw = os.environ.get("SCHEDULER_DISABLE_PLUGINS", "").strip()
    if not raw:
        return False
    if raw.lower() in _ALL:
        return True
    short = short_group(group)
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            continue
        if ":" in item:
            g, n = item.split(":", 1)
            if g in (short, group) and n in ("*", name):
                return True
        elif item == name:
            return True
    return False


def strict_loading() -> bool:
    """Whether ``SCHEDULER_STRICT_PLUGINS`` makes every load failure fatal."""
    return os.environ.get("SCHEDULER_STRICT_PLUGINS", "").strip().lower() in _ALL


def entry_points_of(group: str) -> list[Any]:
    """The entry points of ``group`` as installed right now: the one listing every loader path reads.

    Read from the package metadata on every call (milliseconds, no import), because a
    dispatcher is long-running and a plugin may be installed while it runs.

    Why the plugin loader's stevedore managers are handed this listing instead of reading
    their own: stevedore keeps a process-wide cache of each group
    (``ExtensionManager.ENTRY_POINT_CACHE``) with no public way to refresh it, so a driver
    installed after the group was first read stayed invisible to it while
    ``importlib.metadata`` listed it. Overriding the documented ``list_entry_points()`` in a
    subclass is the public seam for choosing the listing; the kernel touches no private
    stevedore attribute, and presence, distribution name and loading all come from one
    reading of the metadata.

    ``importlib.metadata`` is imported here, on the first listing, and nowhere at module
    level: it costs about 15 ms (it pulls in email, zipfile and csv), and every command that
    opens a store imports the settings and so this module, while only a plugin or secret-scheme
    lookup reads the metadata (``scheduler jobs list`` on SQLite never does). A standard-library
    module, not a kernel one: no layer is crossed.
    """
    import importlib.metadata  # start-up cost, see above

    return list(importlib.metadata.entry_points(group=group))


def entry_point_names(group: str) -> set[str]:
    """Names registered in ``group`` (disabled ones included; see ``is_disabled``). Imports no plugin."""
    return {ep.name for ep in entry_points_of(group)}


def is_available(group: str, name: str) -> bool:
    """Whether a driver counts as installed: an entry point of that name exists and is not disabled."""
    return not is_disabled(group, name) and name in entry_point_names(group)


def dist_name(ep: Any) -> str:
    """The distribution an entry point comes from (named in every load error)."""
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None) or "unknown distribution"
