"""Evidence retention: a declaration's ``retention`` policy and the deadline it gives an evidence row.

A job's ``evidence.retention`` says how long its runs' evidence rows must be kept:

* ``forever`` or ``indefinite``: never deletable (``retention_until`` is NULL, which the
  ``evidence_records_retained`` guard treats as "kept forever");
* ``<n>(m|h|d|w|y)``: ``n`` minutes, hours, days, weeks or years (a year is 365 days, as
  in the reference), at most 100 years; the row becomes deletable once ``now + n units``
  has passed.

No declared policy means the same as ``forever``: evidence is the product's trust core, so
the safe default is to keep it (pruning leaves such rows and a run tombstone behind).
The deadline is computed once, when the row is written, from the run's completion time,
and stored on the immutable row; the database guard enforces it.
"""

from __future__ import annotations

import re

from scheduler.base.errors import SchedulerError

#: Policies that keep the evidence for good.
FOREVER = frozenset({"forever", "indefinite"})

#: Milliseconds per unit; ``m`` is minutes (as in every other duration of the kernel), ``y`` 365 days.
_UNIT_MS = {"m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 7 * 86_400_000, "y": 365 * 86_400_000}

#: The longest finite retention: 100 years.
MAX_RETENTION_MS = 100 * _UNIT_MS["y"]

_POLICY_RE = re.compile(r"([1-9][0-9]{0,9})([mhdwy])")


def retention_ms(policy: str | None) -> int | None:
    """The retention period of ``policy`` in milliseconds, or None when it keeps evidence forever.

    Raises ``SchedulerError(EVIDENCE_RETENTION_INVALID)`` for anything but ``forever``,
    ``indefinite`` or ``<n>(m|h|d|w|y)`` of at most 100 years (no zero, no sign, no spaces,
    ASCII digits only), so a typo never silently shortens or drops retention.
    """
    if policy is None:
        return None
    if not isinstance(policy, str):
        raise SchedulerError("EVIDENCE_RETENTION_INVALID",
                             f"evidence.retention must be a string such as '90d' or 'forever', not {type(policy).__name__}")
    if policy in FOREVER:
        return None
    match = _POLICY_RE.fullmatch(policy)
    if match is None:
        raise SchedulerError("EVIDENCE_RETENTION_INVALID",
                             f"evidence.retention {policy[:40]!r} is not forever, indefinite or <n>(m|h|d|w|y) such as '90d'")
    period = int(match.group(1)) * _UNIT_MS[match.group(2)]
    if period > MAX_RETENTION_MS:
        raise SchedulerError("EVIDENCE_RETENTION_INVALID", f"evidence.retention {policy!r} is longer than 100 years")
    return period


def check_retention(policy: str | None) -> str | None:
    """Validate a declared ``retention`` (for spec validation) and return it unchanged."""
    retention_ms(policy)
    return policy


def retention_until(policy: str | None, now: int) -> int | None:
    """The ``retention_until`` of an evidence row written at ``now`` (epoch ms) under ``policy``.

    None means kept forever (``forever``, ``indefinite`` or no policy declared). Raises
    ``EVIDENCE_RETENTION_INVALID`` for a policy ``retention_ms`` refuses.
    """
    period = retention_ms(policy)
    return None if period is None else int(now) + period
