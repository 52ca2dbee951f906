"""Output capture: big concurrent streams, artifacts and tampering, the cap, binary data, structured formats."""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

import pytest
from scheduler_toolkit.output import read_artifact

from scheduler.api import SchedulerError

GENERATOR = """
import random, sys
out = random.Random(1).randbytes(20_000_000)
err = random.Random(2).randbytes(5_000_000)
o, e = sys.stdout.buffer, sys.stderr.buffer
oc, ec = 1 << 18, 1 << 16  # interleaved: a reader that drains only one pipe would deadlock
for i in range(0, len(out) // oc + 1):
    o.write(out[i * oc:(i + 1) * oc]); o.flush()
    e.write(err[i * ec:(i + 1) * ec]); e.flush()
"""


def test_huge_concurrent_output_and_artifacts(run_job, tmp_path: Path, artifacts_root: Path) -> None:
    script = tmp_path / "gen.py"
    script.write_text(GENERATOR)
    ran = run_job(f'"{sys.executable}" gen.py', executor_options={"working_dir": str(tmp_path)}, run_timeout_ms=60_000)
    out = random.Random(1).randbytes(20_000_000)
    err = random.Random(2).randbytes(5_000_000)
    r = ran.result
    assert r.status == "ok", r.error_message
    assert (r.stdout.bytes, r.stdout.sha256) == (len(out), hashlib.sha256(out).hexdigest())
    assert (r.stderr.bytes, r.stderr.sha256) == (len(err), hashlib.sha256(err).hexdigest())
    assert r.stdout.truncated and r.stdout.artifact == f"runs/{ran.request.run_id}/stdout"
    assert r.stderr.artifact == f"runs/{ran.request.run_id}/stderr"
    assert read_artifact(artifacts_root, r.stdout.artifact, r.stdout.sha256, r.stdout.bytes) == out
    assert read_artifact(artifacts_root, r.stderr.artifact, r.stderr.sha256, r.stderr.bytes) == err
    # text output too big to keep inline: the structured record refers to the artifact
    assert r.structured["parsed"] is None and r.structured["artifact"] == r.stdout.artifact
    assert r.structured["bytes"] == len(out)

    path = artifacts_root / r.stdout.artifact
    data = bytearray(path.read_bytes())
    data[12345] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SchedulerError) as exc:
        read_artifact(artifacts_root, r.stdout.artifact, r.stdout.sha256, r.stdout.bytes)
    assert exc.value.code == "ARTIFACT_TAMPERED"


def test_output_limit_exceeded_kills_the_command(run_job, monkeypatch, group_gone) -> None:
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_MAX_OUTPUT_BYTES", "100000")
    ran = run_job("yes", run_timeout_ms=20_000)
    r = ran.result
    assert (r.status, r.error_code) == ("error", "OUTPUT_LIMIT_EXCEEDED")
    assert r.stdout.limit_exceeded and r.stdout.bytes == 100000
    assert r.stdout.sha256 == hashlib.sha256(b"y\n" * 50000).hexdigest()
    assert ran.control.terminations == ["SIGTERM"]
    assert r.structured["valid"] is False and "output limit" in r.structured["warning"]
    assert ran.elapsed < 5
    group_gone(ran.control.handles[0]["pgid"])


def test_stderr_limit_exceeded(run_job, monkeypatch) -> None:
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_MAX_OUTPUT_BYTES", "5000")
    r = run_job("echo fine; yes >&2", run_timeout_ms=20_000).result
    assert r.error_code == "OUTPUT_LIMIT_EXCEEDED" and "stderr" in r.error_message
    assert r.stderr.bytes == 5000 and r.stdout.excerpt == "fine\n"
    assert r.structured["parsed"] == "fine"


def test_binary_output_hashes_exactly(run_job) -> None:
    data = bytes(range(256)) * 4
    r = run_job(f"\"{sys.executable}\" -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 4)'").result
    assert r.status == "ok"
    assert (r.stdout.bytes, r.stdout.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert r.structured["valid"] is True and "not valid UTF-8" in r.structured["warning"]


def test_json_valid(run_job) -> None:
    r = run_job("""printf '{"ok": true, "n": [1, 2]}\\n'""", output_format="json").result
    assert r.status == "ok"
    assert r.structured["valid"] is True and r.structured["parsed"] == {"ok": True, "n": [1, 2]}
    assert r.structured["sha256"] == r.stdout.sha256 and r.structured["bytes"] == r.stdout.bytes


def test_json_invalid_is_nonfatal(run_job) -> None:
    r = run_job("""printf '{"ok": }'""", output_format="json").result
    assert r.status == "ok"
    assert r.structured["valid"] is False and r.structured["parsed"] is None
    assert "line 1, column 8" in r.structured["warning"]


def test_ndjson_valid(run_job) -> None:
    r = run_job("""printf '{"a": 1}\\n\\n{"b": 2}\\n'""", output_format="ndjson").result
    assert r.structured["valid"] is True and r.structured["parsed"] == [{"a": 1}, {"b": 2}]


def test_ndjson_invalid_line(run_job) -> None:
    r = run_job("""printf '{"a": 1}\\nnot json\\n{"c": 3}\\n'""", output_format="ndjson").result
    assert r.status == "ok"
    assert r.structured["valid"] is False
    assert r.structured["warning"].startswith("invalid NDJSON at line 2")


def test_large_json_is_parsed_from_the_artifact(run_job) -> None:
    # 100 KB of NDJSON: offloaded (> 64 KiB) but small enough to keep parsed inline (< 256 KiB)
    payload = f'"{sys.executable}" -c \'import json\nfor i in range(2000): print(json.dumps({{"i": i, "pad": "x" * 30}}))\''
    r = run_job(payload, output_format="ndjson").result
    assert r.stdout.artifact is not None
    assert r.structured["valid"] is True
    assert len(r.structured["parsed"]) == 2000 and r.structured["parsed"][1999]["i"] == 1999
    assert r.structured["artifact"] is None


def test_capture_failure_is_an_error_not_a_silent_truncation(make_request, group_gone) -> None:
    import shutil

    from scheduler_executor_shell import ShellExecutor

    from scheduler.testing import LocalRunControl

    request = make_request("head -c 300000 /dev/zero; sleep 30", run_timeout_ms=20_000)
    shutil.rmtree(request.artifacts_dir)
    request.artifacts_dir.write_text("a file where the run directory should be")  # offloading the stream will fail
    control = LocalRunControl()
    r = ShellExecutor().execute(request, control)
    assert (r.status, r.error_code) == ("error", "OUTPUT_CAPTURE_FAILED")
    assert "FileExistsError" in r.error_message or "NotADirectoryError" in r.error_message
    assert control.terminations == ["SIGTERM"]
    group_gone(control.handles[0]["pgid"])
