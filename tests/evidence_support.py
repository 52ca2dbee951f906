"""Helpers of the kernel's evidence tests: real ssh-keygen keys, settings files, runs through a real dispatcher."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, wait_for

from scheduler.core.queue import enqueue_manual
from scheduler.testing import write_settings

TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed")


@pytest.fixture(autouse=True)
def artifacts_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One artifacts root for the dispatcher and re-verification, on SQLite and PostgreSQL alike.

    Autouse in every evidence test module that imports it (``from evidence_support import artifacts_dir``).
    """
    root = tmp_path / "artifacts"
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(root))
    return root


class SshKeys:
    """A real ed25519 key made by ssh-keygen, and an allowed-signers file trusting it for one principal."""

    def __init__(self, root: Path, principal: str = "ops@example.org") -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.principal = root, principal
        self.key = root / "evidence_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "evidence", "-f", str(self.key)],
                       check=True, capture_output=True, timeout=30)
        self.allowed_signers = root / "allowed_signers"
        public = (root / "evidence_ed25519.pub").read_text().strip()
        self.allowed_signers.write_text(f'{principal} namespaces="scheduler,agentcli" {public}\n')

    def settings(self, *, trust: bool = True, key: Path | None = None) -> dict[str, Any]:
        """``[providers.ssh]``: this key and principal, and (with ``trust``) the allowed-signers file."""
        table: dict[str, Any] = {"key": str(key or self.key), "principal": self.principal}
        if trust:
            table["allowed_signers"] = str(self.allowed_signers)
        return table


def use_settings(monkeypatch: Any, tmp_path: Path, tables: dict[str, dict[str, Any]]) -> Path:
    """Write ``tables`` to a settings file, point SCHEDULER_CONFIG at it and reload (this process and its children)."""
    from scheduler.settings import reload_settings

    path = write_settings(tmp_path / "scheduler.toml", tables)
    monkeypatch.setenv("SCHEDULER_CONFIG", str(path))
    reload_settings()
    return path


def run_job(store: Any, **spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Add a shell job, run it once through the dispatcher that is running, and return (job, its terminal run)."""
    spec.setdefault("executor", "shell")
    job = add_job(store, **spec)
    enqueue_manual(store, job["id"])
    run = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] in TERMINAL], timeout=30, what="terminal run")[0]
    return job, run


def evidence_row(store: Any, run_id: str) -> dict[str, Any] | None:
    with store.read() as tx:
        return tx.one("SELECT * FROM evidence_records WHERE run_id = ?", (run_id,))


def run_row(store: Any, run_id: str) -> dict[str, Any]:
    with store.read() as tx:
        return tx.one("SELECT * FROM runs WHERE id = ?", (run_id,))


def events_of(store: Any, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    with store.read() as tx:
        rows = tx.all("SELECT kind, data FROM runtime_events WHERE run_id = ? ORDER BY id", (run_id,))
    return [(r["kind"], json.loads(r["data"]) if r["data"] else {}) for r in rows]


def is_postgres(store_url: str) -> bool:
    return not store_url.endswith(".db")


def unguarded(tx: Any, store_url: str, *triggers: tuple[str, str]) -> None:
    """Drop database guards (``(trigger, table)``) as an attacker with database access would, inside ``tx``."""
    for name, table in triggers:
        tx.execute(f"DROP TRIGGER IF EXISTS {name}" + (f" ON {table}" if is_postgres(store_url) else ""))


EVIDENCE_GUARDS = (("evidence_records_no_update", "evidence_records"), ("evidence_records_retained", "evidence_records"))
