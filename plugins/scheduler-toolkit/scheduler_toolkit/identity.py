"""Who a run acts as: the resolved identity a run carries (``RunOutcomes.identity``) and its delegation chain.

``ResolvedIdentity`` (``as_mapping()`` is what providers receive as ``identity``),
``Delegation`` (one hop of a chain) and ``TRUST_LEVELS`` (lowest first). The kernel's own
code (``scheduler.pipeline.identity``), re-exported.
"""

from __future__ import annotations

from scheduler.pipeline.identity import TRUST_LEVELS, Delegation, ResolvedIdentity

__all__ = ["TRUST_LEVELS", "Delegation", "ResolvedIdentity"]
