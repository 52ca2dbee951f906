"""Issue 9, defect 4: ``runs output`` returns the exact bytes of a stream, or refuses.

The adversarial run saw 1,000 random bytes come back as 1,842 bytes with exit 0 (the
lossy UTF-8 excerpt, returned without checking the digest), and a forged excerpt
returned with exit 0. Now the recorder keeps any stream its excerpt cannot reproduce
byte for byte in the artifact store, and ``runs output`` verifies excerpt or artifact
against the recorded SHA-256 and size: ``ARTIFACT_TAMPERED`` (exit 1) otherwise.

End to end: a real ``scheduler run`` process runs shell jobs, the CLI reads them back in
subprocesses, on SQLite and on PostgreSQL (skipped with the reason when it is absent).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.base.errors import SchedulerError
from scheduler.core.outputs import StreamRecorder, read_stream, run_dir

SCHEDULER = [sys.executable, "-m", "scheduler"]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "SCHEDULER_ARTIFACTS_DIR": str(tmp_path / "artifacts")}


def cli(db: str, tmp_path: Path, *args: str, check: bool = True) -> dict[str, Any]:
    out = subprocess.run([*SCHEDULER, "--db", db, "--json", *args], capture_output=True, text=True, timeout=120,
                         env=_env(tmp_path))
    assert "Traceback" not in out.stdout + out.stderr, out
    # split on "\n" only: str.splitlines also breaks at U+0085 and U+2028, which random output bytes can decode to
    data = json.loads(out.stdout.rstrip("\n").split("\n")[-1])
    if check:
        assert out.returncode == 0 and data.get("ok", True), out
    return data


def raw_output(db: str, tmp_path: Path, run_id: str, stream: str = "stdout") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*SCHEDULER, "--db", db, "runs", "output", run_id, stream], capture_output=True, timeout=120,
                          env=_env(tmp_path))


def run_jobs(db: str, tmp_path: Path, jobs: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Add manual shell jobs, queue each once, run a real dispatcher until they finish; their run rows by name."""
    cli(db, tmp_path, "jobs", "add", json.dumps(
        [{"name": name, "schedule_kind": "manual", "payload_message": command} for name, command in jobs.items()]))
    for name in jobs:
        cli(db, tmp_path, "jobs", "run", name)
    out = subprocess.run([*SCHEDULER, "--db", db, "run", "--duration", "4s", "--lease-ttl", "2s"], capture_output=True,
                         text=True, timeout=120, env=_env(tmp_path))
    assert out.returncode == 0 and "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    runs = {}
    for name in jobs:
        listed = cli(db, tmp_path, "runs", "list", name)["runs"]
        assert listed, f"no run of {name}"
        runs[name] = cli(db, tmp_path, "runs", "get", listed[0]["id"])["run"]
        assert runs[name]["status"] == "ok", runs[name]
    return runs


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "scheduler.db")
    return str(request.getfixturevalue("pg_url"))


def test_small_binary_output_comes_back_byte_for_byte(db: str, tmp_path: Path) -> None:
    """Before the fix: 1,000 random bytes came back as ~1,800 (U+FFFD for every invalid byte), exit 0."""
    random_bytes = os.urandom(1000)
    nul_text = b"valid utf-8 \xc3\xa9 but with a NUL \x00 inside\n"
    text = "plain text, caf\u00e9 \u2713\n".encode()
    for name, data in (("random.bin", random_bytes), ("nul.txt", nul_text), ("text.txt", text)):
        (tmp_path / name).write_bytes(data)
    runs = run_jobs(db, tmp_path, {
        "random": f"cat '{tmp_path / 'random.bin'}'",
        "nul": f"cat '{tmp_path / 'nul.txt'}'",
        "text": f"cat '{tmp_path / 'text.txt'}'",
    })
    for name, data in (("random", random_bytes), ("nul", nul_text), ("text", text)):
        run = runs[name]
        assert run["stdout_bytes"] == len(data) and run["stdout_sha256"] == hashlib.sha256(data).hexdigest()
        out = raw_output(db, tmp_path, run["id"])
        assert out.returncode == 0, out.stderr
        assert out.stdout == data, f"{name}: got {len(out.stdout)} bytes, expected {len(data)}"
        as_json = cli(db, tmp_path, "runs", "output", run["id"])
        decoded = base64.b64decode(as_json["content"]) if as_json["encoding"] == "base64" else as_json["content"].encode()
        assert decoded == data and as_json["bytes"] == len(data)
    # Only the text stream stays inline; the other two are kept whole in the artifact store.
    assert runs["text"]["stdout_artifact"] is None
    assert runs["random"]["stdout_artifact"] and runs["nul"]["stdout_artifact"]
    assert "\x00" not in (runs["nul"]["stdout_excerpt"] or "")


def _forge(db: str, run_id: str, excerpt: str) -> None:
    if "://" in db:
        import psycopg

        base, _, query = db.partition("?")
        schema = query.split("schema=", 1)[1]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'UPDATE "{schema}".runs SET stdout_excerpt = %s WHERE id = %s', (excerpt, run_id))
    else:
        import sqlite3

        conn = sqlite3.connect(db)
        with conn:
            conn.execute("UPDATE runs SET stdout_excerpt = ? WHERE id = ?", (excerpt, run_id))
        conn.close()


def test_forged_inline_excerpt_is_refused(db: str, tmp_path: Path) -> None:
    """Before the fix: the forged excerpt was printed with exit 0."""
    run = run_jobs(db, tmp_path, {"hello": "echo hello"})["hello"]
    assert run["stdout_artifact"] is None and raw_output(db, tmp_path, run["id"]).stdout == b"hello\n"
    _forge(db, run["id"], "rm -rf / # trust me\n")
    human = raw_output(db, tmp_path, run["id"])
    assert human.returncode == 1 and human.stdout == b""
    assert b"ARTIFACT_TAMPERED" in human.stderr
    refused = cli(db, tmp_path, "runs", "output", run["id"], check=False)
    assert refused["ok"] is False and refused["code"] == "ARTIFACT_TAMPERED"


# -- the recorder and the reader, in this process --------------------------------------------------


def _record(tmp_path: Path, data: bytes, *, excerpt: int = 16, offload: int = 32) -> tuple[Path, Any]:
    root = tmp_path / "artifacts"
    rec = StreamRecorder(root=root, directory=run_dir(root, "run-1", create=False), name="stdout",
                         excerpt_bytes=excerpt, offload_bytes=offload)
    for i in range(0, len(data), 5):
        rec.write(data[i : i + 5])
    return root, rec.finish()


def _row(capture: Any) -> dict[str, Any]:
    return {"id": "run-1", "stdout_excerpt": capture.excerpt, "stdout_bytes": capture.bytes, "stdout_sha256": capture.sha256,
            "stdout_artifact": capture.artifact, "stdout_truncated": int(capture.truncated)}


@pytest.mark.parametrize(
    ("data", "offloaded"),
    [
        (b"short text\n", False),
        (b"", False),
        (b"\x00\x01\xff", True),  # binary, however small
        (b"\xe2\x9c", True),  # a cut UTF-8 sequence
        (b"a NUL \x00 b", True),  # valid UTF-8, but PostgreSQL text cannot hold NUL
        (("\u00e9" * 12).encode(), True),  # 24 bytes: over the 16-byte excerpt, under the 32-byte offload
        (b"y" * 100, True),  # over the offload threshold
    ],
)
def test_recorder_keeps_what_the_excerpt_cannot_reproduce(tmp_path: Path, data: bytes, offloaded: bool) -> None:
    root, capture = _record(tmp_path, data)
    assert bool(capture.artifact) is offloaded
    assert capture.bytes == len(data) and capture.sha256 == hashlib.sha256(data).hexdigest()
    assert "\x00" not in capture.excerpt
    if not offloaded:
        assert capture.excerpt.encode() == data and not capture.truncated
    assert read_stream(root, _row(capture), "stdout") == data


def test_reader_refuses_what_does_not_match(tmp_path: Path) -> None:
    root, capture = _record(tmp_path, b"hello\n")
    row = _row(capture)
    for forged in ({"stdout_excerpt": "hellO\n"}, {"stdout_bytes": 7}, {"stdout_sha256": "0" * 64}):
        with pytest.raises(SchedulerError) as err:
            read_stream(root, {**row, **forged}, "stdout")
        assert err.value.code == "ARTIFACT_TAMPERED"
    with pytest.raises(SchedulerError) as err:  # an excerpt without its digest is not trusted either
        read_stream(root, {**row, "stdout_sha256": None}, "stdout")
    assert err.value.code == "ARTIFACT_TAMPERED"
    # A cut-off excerpt without the stream (a recorder that never offloaded): missing, not tampered.
    whole = b"x" * 40
    cut = {"id": "r", "stdout_excerpt": "x" * 16, "stdout_bytes": 40, "stdout_sha256": hashlib.sha256(whole).hexdigest(),
           "stdout_artifact": None, "stdout_truncated": 1}
    with pytest.raises(SchedulerError) as err:
        read_stream(root, cut, "stdout")
    assert err.value.code == "ARTIFACT_MISSING"
    assert read_stream(root, {"id": "r"}, "stderr") == b""  # nothing recorded: empty
    # An offloaded binary stream whose file changed.
    root, capture = _record(tmp_path / "b", b"\x00\xff\x01")
    (root / capture.artifact).write_bytes(b"\x00\xff\x02")
    with pytest.raises(SchedulerError) as err:
        read_stream(root, _row(capture), "stdout")
    assert err.value.code == "ARTIFACT_TAMPERED"
