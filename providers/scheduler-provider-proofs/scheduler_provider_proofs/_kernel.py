"""The kernel names these verifiers need that ``scheduler.api`` does not export yet, imported in this one module.

``ProofRequest`` and ``VerifiedProof`` are the ``proof_verifier`` contract, defined in
``scheduler.plugins.protocols`` (where ``scheduler.api`` gets every provider contract from).
Once ``scheduler.api`` re-exports them this module imports them from there: a one-line change.
"""

from __future__ import annotations

from scheduler.plugins.protocols import ProofRequest, VerifiedProof

__all__ = ["ProofRequest", "VerifiedProof"]
