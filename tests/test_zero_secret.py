"""Zero secret at rest: a secret presented by every medium, through successes, failures, timeouts, a cancellation
and a ``kill -9`` of the dispatcher mid-run, is afterwards nowhere on disk.

Real ``scheduler run`` processes (the second one recovers the first's run), real shell
commands, the real ``env`` provider. Afterwards the database file with its WAL and SHM,
the artifacts directory, both dispatchers' logs, every runtime event and every other
file under the test's directory are scanned for the secret's bytes, raw, base64 and hex:
0 occurrences; and no credential file or directory is left behind.

The commands check the value by its SHA-256 (the secret is in no job); when output
redaction is in the kernel (``scheduler.core.redaction``), one job also prints it, by every medium.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import secrets
import signal
from pathlib import Path
from typing import Any

from kernel_testing import add_job, run_rows, wait_for
from test_dispatcher_process import Proc

from scheduler.core.cancel import cancel_run
from scheduler.core.queue import enqueue_manual
from scheduler.plugins.stores import open_store

TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")


def forms(secret: str) -> dict[str, bytes]:
    """The byte forms a leaked secret would take."""
    raw = secret.encode()
    return {"raw": raw, "base64": base64.b64encode(raw).rstrip(b"="), "base64url": base64.urlsafe_b64encode(raw).rstrip(b"="),
            "hex": raw.hex().encode(), "HEX": raw.hex().upper().encode()}


def scan(paths: list[Path], extra: dict[str, bytes], needles: dict[str, bytes]) -> tuple[int, int, list[str]]:
    """(bytes scanned, files scanned, hits) over every regular file under ``paths`` and the ``extra`` blobs."""
    total, files, hits = 0, 0, []
    blobs: list[tuple[str, bytes]] = list(extra.items())
    seen: set[Path] = set()
    for root in paths:
        for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            if path.resolve() not in seen:
                seen.add(path.resolve())
                blobs.append((str(path), path.read_bytes()))
    for name, data in blobs:
        total += len(data)
        files += 1
        hits += [f"{form} in {name}" for form, needle in needles.items() if needle in data]
    return total, files, hits


def test_no_secret_at_rest_after_every_medium_failures_cancellation_and_kill_9(tmp_path: Path) -> None:
    secret = "zs-" + secrets.token_hex(16)
    sha = hashlib.sha256(secret.encode()).hexdigest()
    cred_dir, artifacts = tmp_path / "cred", tmp_path / "artifacts"
    cred_dir.mkdir()
    db = tmp_path / "scheduler.db"
    env = {"CRED_SRC": secret, "SCHEDULER_CREDENTIALS_DIR": str(cred_dir), "SCHEDULER_ARTIFACTS_DIR": str(artifacts)}
    store = open_store(db)

    def bind(name: str, medium: str, ref: str = "CRED_SRC", **extra: Any) -> dict[str, Any]:
        present: dict[str, Any] = {"medium": medium}
        if medium == "env":
            present["key"] = extra.pop("key", "API_TOKEN")
        return {"name": name, "provider": "env", "ref": ref, "present": present, **extra}

    check = f"| sha256sum | grep -q {sha}"
    jobs = {
        "env": (f'printf %s "$API_TOKEN" {check}', [bind("tok", "env")], {}),
        "file": (f'cat "$CREDENTIAL_KEYFILE_FILE" {check}', [bind("keyfile", "file")], {}),
        "stdin": (f"cat {check}", [bind("pipe", "stdin")], {}),
        "all-fail-exit": (f'printf %s "$API_TOKEN" {check} && cat "$CREDENTIAL_K_FILE" {check} && exit 3',
                          [bind("tok", "env"), bind("k", "file"), bind("p", "stdin")], {}),
        "missing-required": ("true", [bind("tok", "env", ref="ZS_NOT_SET")], {}),
        "missing-optional": (f'printf %s "$API_TOKEN" {check}', [bind("tok", "env"), bind("opt", "file", ref="ZS_NOT_SET",
                                                                                             required=False)], {}),
        "run-timeout": ("sleep 30", [bind("tok", "env"), bind("keyfile", "file")], {"run_timeout_ms": 1500}),
    }
    redaction = importlib.util.find_spec("scheduler.core.redaction") is not None
    if redaction:  # output redaction has landed: the run's output may carry the secret, by every medium
        jobs["echo"] = (('printf "%s\\n" "$API_TOKEN"; cat "$CREDENTIAL_KEYFILE_FILE"; echo; cat; echo; '
                         'printf %s "$API_TOKEN" | base64; printf %s "$API_TOKEN" | od -An -tx1 | tr -d " \\n"; echo; '
                         'yes "$API_TOKEN" | head -c 400000'),  # offloaded to the artifacts directory, across chunk boundaries
                        [bind("tok", "env"), bind("keyfile", "file"), bind("pipe", "stdin")], {})
    ids = {name: add_job(store, name=f"zs-{name}", executor="shell", payload_message=cmd, credentials=b, **spec)["id"]
           for name, (cmd, b, spec) in jobs.items()}
    cancelled = add_job(store, name="zs-cancel", executor="shell", payload_message="sleep 30",
                        credentials=[bind("keyfile", "file"), bind("tok", "env")])["id"]
    killed = add_job(store, name="zs-kill", executor="shell", payload_message="sleep 60",
                     credentials=[bind("keyfile", "file"), bind("tok", "env"), bind("pipe", "stdin")])["id"]

    first = Proc(db, log=tmp_path / "dispatcher1.log", env=env)
    second = None
    try:
        first.wait_ready()
        for job_id in ids.values():
            enqueue_manual(store, job_id)
        finished = wait_for(lambda: all(any(r["status"] in TERMINAL for r in run_rows(store, j)) for j in ids.values()),
                            timeout=60, what=f"the runs ({first.output()[-400:]})")
        assert finished
        enqueue_manual(store, cancelled)
        run = wait_for(lambda: [r for r in run_rows(store, cancelled) if r["status"] == "running"] and any(cred_dir.iterdir())
                       and run_rows(store, cancelled)[0], timeout=20, what="the run to cancel")
        cancel_run(store, run["id"], reason="zero-secret test")
        wait_for(lambda: run_rows(store, cancelled)[0]["status"] == "cancelled", timeout=20, what="the cancellation")
        wait_for(lambda: not any(cred_dir.iterdir()), timeout=10, what="the cancelled run's file to go")
        enqueue_manual(store, killed)
        victim = wait_for(lambda: [r for r in run_rows(store, killed) if r["status"] == "running"] and any(cred_dir.iterdir())
                          and run_rows(store, killed)[0], timeout=20, what="the run to kill the dispatcher under")
        left = list(cred_dir.iterdir())
        assert len(left) == 1 and (left[0] / "keyfile").exists()
        first.kill(signal.SIGKILL)
        first.p.wait(10)
        assert (left[0] / "keyfile").exists()  # kill -9 left it: only recovery can remove it
        second = Proc(db, log=tmp_path / "dispatcher2.log", env=env)
        second.wait_ready()
        wait_for(lambda: run_rows(store, killed)[0]["status"] == "crashed", timeout=30, what="recovery of the killed run")
        live = {f"live {p.name}": p.read_bytes() for p in (Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists()}
    finally:
        for p in (first, second):
            if p is not None:
                p.kill(signal.SIGTERM)
                p.p.wait(20)
                p.close()

    runs = {name: run_rows(store, job_id)[0] for name, job_id in ids.items()}
    expect = {"env": "ok", "file": "ok", "stdin": "ok", "all-fail-exit": "error", "missing-required": "error",
              "missing-optional": "ok", "run-timeout": "timeout", **({"echo": "ok"} if redaction else {})}
    assert {n: r["status"] for n, r in runs.items()} == expect, {n: (r["status"], r["error_code"]) for n, r in runs.items()}
    assert runs["missing-required"]["error_code"] == "CREDENTIAL_NOT_FOUND"
    with store.read() as tx:
        rows = tx.all("SELECT p.status, p.run_id, p.temp_path FROM credential_presentations p")
        recovered = tx.all("SELECT status FROM credential_presentations WHERE run_id = ?", (victim["id"],))
        events = tx.all("SELECT kind, data FROM runtime_events ORDER BY id")
        tables = {name: tx.all(f"SELECT * FROM {name}") for name in ("runs", "jobs", "credential_presentations", "runtime_events")}
    store.close()
    assert sorted(r["status"] for r in recovered) == ["recovery_cleaned"] * 3
    assert {r["status"] for r in rows} <= {"cleaned", "recovery_cleaned"}
    assert list(cred_dir.iterdir()) == [], "a credential file or directory was left behind"
    assert not any(Path(r["temp_path"]).exists() for r in rows if r["temp_path"])
    if redaction:
        assert "[REDACTED:tok]" in (runs["echo"]["stdout_excerpt"] or "")

    dumps = {f"table {name}": json.dumps(rows, default=str).encode() for name, rows in tables.items()}
    dumps["events"] = json.dumps(events, default=str).encode()
    dumps.update(live)  # the WAL and SHM while the second dispatcher still ran (a clean stop checkpoints them away)
    paths = [db, Path(f"{db}-wal"), Path(f"{db}-shm"), artifacts, tmp_path / "dispatcher1.log", tmp_path / "dispatcher2.log",
             tmp_path]
    total, files, hits = scan([p for p in paths if p.exists()], dumps, forms(secret))
    on_disk = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    print(f"zero-secret scan: {total} bytes in {files} files and table/event dumps ({len(on_disk)} files on disk: "
          f"{', '.join(on_disk)}), {len(events)} events, {len(hits)} occurrences")
    assert hits == [], hits
    assert files > 5 and total > 10_000
    # the scanner finds each form (the test can fail)
    probe = {f"probe {k}": b"..." + v + b"..." for k, v in forms(secret).items()}
    assert len(scan([], probe, forms(secret))[2]) >= len(probe)
