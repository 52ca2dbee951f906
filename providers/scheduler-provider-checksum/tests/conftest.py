"""Fixtures: evidence payloads built the way the kernel builds them, and the provider loaded through its entry
point with a real settings file (API, Protocol and settings checks, ``configure``), as the kernel loads it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.api import EvidencePayload
from scheduler.testing import provider_loader


def _canonical(document: dict[str, Any]) -> bytes:
    # For ASCII keys, integers and strings, sorted-key compact JSON *is* json-sort-v1: an independent oracle.
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def payload_for(document: dict[str, Any]) -> EvidencePayload:
    canonical = _canonical(document)
    return EvidencePayload(document=document, canonical=canonical, digest="sha256:" + hashlib.sha256(canonical).hexdigest())


def run_document(run_id: str = "run-1", **result: Any) -> dict[str, Any]:
    """A payload document shaped like the kernel's: bindings, lineage, the result's digests."""
    return {
        "schema": "scheduler.evidence.payload",
        "version": 1,
        "run_id": run_id,
        "job_id": "job-1",
        "dispatch_id": "job-1:schedule:1767225600000",
        "attempt": 1,
        "artifact_digest": "sha256:" + "a" * 64,
        "actor": {"dispatcher_owner": "host:123", "dispatcher_token": 7},
        "result": {"status": "ok", "exit_code": 0, "stdout_sha256": "sha256:" + "b" * 64, "stdout_bytes": 12,
                   "stderr_sha256": "sha256:" + "c" * 64, "stderr_bytes": 0, **result},
    }


@pytest.fixture
def make_payload() -> Callable[..., EvidencePayload]:
    """``make_payload(run_id=..., **result)``: an ``EvidencePayload`` for a run document."""
    return lambda run_id="run-1", **result: payload_for(run_document(run_id, **result))


@pytest.fixture
def load_evidence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``load_evidence(name, **settings)``: write ``[providers.NAME]`` and load the driver through its entry point."""
    with provider_loader(monkeypatch, tmp_path, "evidence") as load:
        yield load
