"""Output redaction (issue 11): presented credential values never reach a run's recorded output.

Unit tests of ``scheduler.core.redaction`` and the kernel's ``StreamRecorder`` (real files in the
artifact store, digests recomputed from what is on disk), the shell executor with a
``CredentialPresentation`` (real subprocesses), and a real dispatcher running a shell job
with a credential binding from the ``env`` provider on SQLite and PostgreSQL, whose stored
rows, artifact files, events and (SQLite) database file and WAL are scanned for the value.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, wait_for

from scheduler.core.execution import CredentialPresentation
from scheduler.core.outputs import StreamRecorder, read_artifact, read_stream, run_dir
from scheduler.core.redaction import MIN_ENCODED_BYTES, forms_of, marker, redactions_for

SECRET = "tok-9fQ/x+Zr_Secret"
OTHER = "pw=Hunter2!bb"


def presentation(name: str = "tok", value: str = SECRET) -> CredentialPresentation:
    return CredentialPresentation(name=name, medium="env", key=name.upper(), value=value)


def leaked(data: bytes, value: str = SECRET) -> list[bytes]:
    """Which realistic encodings of ``value`` occur in ``data`` (raw, hex both cases, base64 standard/URL-safe)."""
    raw = value.encode()
    probes = {raw, raw.hex().encode(), raw.hex().upper().encode(), base64.b64encode(raw).rstrip(b"="),
              base64.urlsafe_b64encode(raw).rstrip(b"=")}
    return [p for p in probes if p in data]


def stream_of(r: Any, chunks: list[bytes]) -> bytes:
    s = r.stream()
    return b"".join(s.feed(c) for c in chunks) + s.flush()


SAMPLE = (b"start " + SECRET.encode() + b" mid " + base64.b64encode(b"user:" + SECRET.encode()) + b" "
          + SECRET.encode().hex().upper().encode() + b" " + base64.urlsafe_b64encode(SECRET.encode() + b"\n")
          + b" json:" + json.dumps({"t": SECRET}).encode() + b" end" + SECRET.encode())


# -- the patterns ---------------------------------------------------------------------------------------------------


def test_every_realistic_form_is_replaced_and_counted() -> None:
    r = redactions_for([presentation()])
    out, counts = r.redact(SAMPLE)
    assert leaked(out) == []
    assert out.startswith(b"start [REDACTED:tok] mid ") and out.endswith(b" end[REDACTED:tok]")
    assert counts == {"tok": 6}
    # the Basic-auth text keeps only what the value does not determine: the user part and a boundary character
    assert base64.b64encode(b"user:")[:6] in out


@pytest.mark.parametrize("shift", [0, 1, 2, 3, 4])
def test_base64_of_the_value_inside_longer_encoded_text_at_every_alignment(shift: int) -> None:
    r = redactions_for([presentation()])
    for prefix in (b"a" * shift, b"\xff" * shift):
        for suffix in (b"", b"\n", b"xyz", b"\x00\x01"):
            encoded = base64.b64encode(prefix + SECRET.encode() + suffix)
            for text in (encoded, encoded.replace(b"+", b"-").replace(b"/", b"_")):
                out, counts = r.redact(b"<" + text + b">")
                assert counts == {"tok": 1}, (shift, prefix, suffix)
                assert base64.b64encode(SECRET.encode())[2:-2] not in out and b"[REDACTED:tok]" in out


def test_short_values_are_redacted_raw_but_not_as_common_encodings() -> None:
    short = "ab1"
    assert len(short) < MIN_ENCODED_BYTES
    assert forms_of(short) == {b"ab1"}
    r = redactions_for([presentation(value=short)])
    assert r.redact(b"x ab1 616231 YWIx")[0] == b"x [REDACTED:tok] 616231 YWIx"


def test_stripped_json_escaped_and_percent_encoded_forms() -> None:
    value = 'line "one"\\ \u00e9/+\n'
    r = redactions_for([CredentialPresentation(name="f", medium="file", key="K", value=value)])
    for text in (value, value.strip(), json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
        assert r.redact(b"[" + text.encode() + b"]") == (b"[[REDACTED:f]]", {"f": 1}), text
    from urllib.parse import quote

    assert r.redact(quote(value.strip(), safe="").encode())[0] == b"[REDACTED:f]"


def test_a_binary_file_value_is_redacted_raw_hex_and_base64() -> None:
    value = bytes(range(250, 256)) + b"\x00\x01\x02"
    r = redactions_for([CredentialPresentation(name="bin", medium="file", key="K", value=value)])  # type: ignore[arg-type]
    data = b"a" + value + b"b" + value.hex().encode() + b"c" + base64.b64encode(value)
    assert r.redact(data) == (b"a[REDACTED:bin]b[REDACTED:bin]c[REDACTED:bin]", {"bin": 3})


def test_no_values_means_no_redactions_and_the_plain_path(tmp_path: Path) -> None:
    assert redactions_for([]) is None
    assert redactions_for([CredentialPresentation(name="x", medium="file", key="K", path="/p", value=None)]) is None
    from scheduler.testing import make_request

    request = make_request("true", artifacts_root=tmp_path)
    assert request.credentials == () and request.redactions is None
    rec = request.stream_recorder("stdout")
    assert rec._redactor is None  # the exact current path: nothing scanned, nothing held back
    rec.write(SECRET.encode())
    assert rec.head == SECRET.encode() and rec.finish().redactions == {}


def test_the_repr_never_shows_a_value() -> None:
    r = redactions_for([presentation()])
    assert SECRET not in repr(r) and "tok" in repr(r)


# -- chunk boundaries and overlaps ----------------------------------------------------------------------------------


def test_a_value_split_across_writes_at_every_offset_is_caught() -> None:
    r = redactions_for([presentation(), presentation("pw", OTHER)])
    whole, counts = r.redact(SAMPLE + OTHER.encode())
    assert counts == {"tok": 6, "pw": 1} and leaked(whole) == [] and leaked(whole, OTHER) == []
    for i in range(len(SAMPLE) + 1):
        assert stream_of(r, [SAMPLE[:i], SAMPLE[i:]]) == r.redact(SAMPLE)[0], i
    for i in range(0, len(SAMPLE), 3):
        for j in range(i, len(SAMPLE), 7):
            assert stream_of(r, [SAMPLE[:i], SAMPLE[i:j], SAMPLE[j:]]) == r.redact(SAMPLE)[0], (i, j)


def test_byte_by_byte_and_random_chunkings_agree() -> None:
    r = redactions_for([presentation(), presentation("pw", OTHER)])
    data = (b"noise " * 50 + SAMPLE + OTHER.encode() + b"\x00\xff") * 3
    expected = r.redact(data)[0]
    assert stream_of(r, [data[i:i + 1] for i in range(len(data))]) == expected
    rng = random.Random(11)
    for _ in range(100):
        cuts = sorted(rng.sample(range(1, len(data)), 8))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        assert stream_of(r, chunks) == expected


def test_overlapping_values_are_merged_into_one_span() -> None:
    a, b = "abcdefgh12", "gh12XYZ789"
    r = redactions_for([presentation("a", a), presentation("b", b)])
    text = b"<abcdefgh12XYZ789>"
    expected = b"<" + marker("a") + marker("b") + b">"
    assert r.redact(text) == (expected, {"a": 1, "b": 1})
    for i in range(len(text) + 1):
        assert stream_of(r, [text[:i], text[i:]]) == expected, i
    # a value repeated with overlap leaves none of its bytes
    r2 = redactions_for([presentation("r", "aaaa")])
    assert r2.redact(b"xaaaaaaay") == (b"x[REDACTED:r]y", {"r": 1})
    assert stream_of(r2, [b"xaa", b"aaa", b"aay"]) == b"x[REDACTED:r]y"


def test_one_value_inside_another_is_covered_by_the_longer() -> None:
    r = redactions_for([presentation("inner", "Secret12"), presentation("outer", "xxSecret12yy")])
    assert r.redact(b"-xxSecret12yy-Secret12-") == (b"-[REDACTED:outer]-[REDACTED:inner]-", {"outer": 1, "inner": 1})


# -- the recorder ---------------------------------------------------------------------------------------------------


def _recorder(tmp_path: Path, r: Any, **limits: Any) -> tuple[Path, StreamRecorder]:
    root = tmp_path / "artifacts"
    return root, StreamRecorder(root=root, directory=run_dir(root, "run-1", create=False), name="stdout",
                                redactions=r, **limits)


def test_an_offloaded_stream_is_redacted_on_disk_and_its_digest_covers_the_redacted_bytes(tmp_path: Path) -> None:
    r = redactions_for([presentation()])
    data = b"".join(b"line %d " % i + SAMPLE + b"\n" for i in range(400))
    root, rec = _recorder(tmp_path, r, excerpt_bytes=100, offload_bytes=1000)
    step = len(SECRET) // 2 + 1  # every secret is split somewhere
    for i in range(0, len(data), step):
        rec.write(data[i:i + step])
    cap = rec.finish()
    expected, counts = r.redact(data)
    assert cap.artifact is not None and cap.redactions == counts == {"tok": 2400}
    on_disk = (root / cap.artifact).read_bytes()
    assert on_disk == expected and leaked(on_disk) == [] and leaked(cap.excerpt.encode()) == []
    assert cap.bytes == len(expected) and cap.sha256 == hashlib.sha256(expected).hexdigest()
    assert read_artifact(root, cap.artifact, cap.sha256, cap.bytes) == expected
    assert rec.head == b""  # offloaded: a parser reads the (redacted) artifact


def test_an_inline_stream_excerpt_and_head_are_redacted(tmp_path: Path) -> None:
    r = redactions_for([presentation()])
    data = json.dumps({"token": SECRET, "ok": True}).encode()
    root, rec = _recorder(tmp_path, r)
    rec.write(data[:10])
    rec.write(data[10:])
    cap = rec.finish()
    expected = r.redact(data)[0]
    assert cap.artifact is None and cap.excerpt.encode() == expected == rec.head
    assert json.loads(cap.excerpt) == {"token": "[REDACTED:tok]", "ok": True}
    run = {"id": "run-1", "stdout_excerpt": cap.excerpt, "stdout_sha256": cap.sha256, "stdout_bytes": cap.bytes}
    assert read_stream(root, run, "stdout") == expected


def test_the_output_cap_counts_redacted_bytes(tmp_path: Path) -> None:
    r = redactions_for([presentation()])
    _, rec = _recorder(tmp_path, r, cap_bytes=40)
    ok = rec.write(((SECRET + " ") * 10).encode())
    cap = rec.finish()
    assert ok is False and cap.limit_exceeded and cap.bytes == 40
    assert SECRET.encode()[:6] not in cap.excerpt.encode() and cap.excerpt.startswith("[REDACTED:tok] [REDACTED:tok]")


def test_a_secret_at_the_very_end_is_flushed_redacted(tmp_path: Path) -> None:
    r = redactions_for([presentation()])
    _, rec = _recorder(tmp_path, r)
    rec.write(b"last: " + SECRET.encode()[:-1])
    assert SECRET.encode()[:3] not in rec.head  # the possible start of a value is held back
    rec.write(SECRET.encode()[-1:])
    cap = rec.finish()
    assert cap.excerpt == "last: [REDACTED:tok]" and cap.redactions == {"tok": 1}


# -- the shell executor -----------------------------------------------------------------------------------------------


def test_the_shell_executor_redacts_stdout_stderr_structured_output_and_verification(tmp_path: Path) -> None:
    from scheduler.core.execution import LocalRunControl
    from scheduler.testing import load_provider, make_request

    executor = load_provider("executor", "shell")
    command = (
        'printf \'{"token": "%s", "b64": "%s"}\' "$TOK" "$(printf %s "$TOK" | base64 -w0)"; '
        'echo "err: $TOK" >&2; '
        'printf %s "$TOK" | od -An -tx1 | tr -d " \\n" >&2'
    )
    request = make_request(command, artifacts_root=tmp_path, output_format="json", verify_shell='echo "$TOK"',
                           credentials=(presentation(),))
    result = executor.execute(request, LocalRunControl())
    assert result.status == "ok", result
    assert result.structured is not None and result.structured["valid"], result.structured
    assert result.structured["parsed"] == {"token": "[REDACTED:tok]", "b64": "[REDACTED:tok]"}
    assert result.stdout is not None and result.stderr is not None
    assert result.stdout.redactions == {"tok": 2} and result.stderr.redactions == {"tok": 2}
    assert result.stderr.excerpt == "err: [REDACTED:tok]\n[REDACTED:tok]"
    assert leaked(json.dumps(attr_dict(result)).encode()) == []
    verification = result.verification or {}
    redacted_line = b"[REDACTED:tok]\n"
    assert verification["stdout_bytes"] == len(redacted_line)
    assert verification["stdout_sha256"] == hashlib.sha256(redacted_line).hexdigest()


def attr_dict(result: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(result)


# -- a real dispatcher ------------------------------------------------------------------------------------------------


TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")


def test_a_dispatcher_run_stores_only_redacted_output(store: Any, dispatcher: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler.core.queue import enqueue_manual
    from scheduler.pipeline.credentials import step as credentials

    credentials.forget_providers()
    monkeypatch.setenv("REDACT_SRC", SECRET)
    artifacts = tmp_path / "artifacts"
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(artifacts))
    command = ('echo "token=$API_TOKEN"; printf %s "user:$API_TOKEN" | base64; '
               'head -c 70000 /dev/zero | tr "\\0" x; echo; printf %s "$API_TOKEN" | xxd -p -c 256 | tr a-f A-F; '
               'echo "oops $API_TOKEN" >&2')
    job = add_job(store, name="redacted", executor="shell", payload_message=command, credentials=[
        {"name": "tok", "provider": "env", "ref": "REDACT_SRC", "present": {"medium": "env", "key": "API_TOKEN"}}])
    enqueue_manual(store, job["id"])
    d = dispatcher(artifacts_root=artifacts)
    try:
        (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] in TERMINAL], timeout=30,
                          what="the run to finish")
    finally:
        d.stop()
    credentials.forget_providers()
    assert run["status"] == "ok", run
    stdout = read_stream(artifacts, run, "stdout")  # digest-checked: the recorded sha256 covers the redacted bytes
    assert run["stdout_artifact"] and stdout.startswith(b"token=[REDACTED:tok]\n")
    assert stdout.rstrip().endswith(b"[REDACTED:tok]") and leaked(stdout) == []
    assert read_stream(artifacts, run, "stderr") == b"oops [REDACTED:tok]\n"
    with store.read() as tx:
        events = tx.all("SELECT kind, data FROM runtime_events WHERE run_id = ? ORDER BY id", (run["id"],))
        rows = tx.all("SELECT * FROM runs WHERE id = ?", (run["id"],))
    redacted = [json.loads(e["data"]) for e in events if e["kind"] == "output.redacted"]
    assert redacted == [{"stdout": {"tok": 3}, "stderr": {"tok": 1}, "total": {"tok": 4}}]
    everything = json.dumps([dict(r) for r in rows], default=str) + json.dumps([dict(e) for e in events], default=str)
    assert leaked(everything.encode()) == []
    for f in artifacts.rglob("*"):
        if f.is_file():
            assert leaked(f.read_bytes()) == [], f
    if store.local_path is not None:  # SQLite: the database file and its WAL hold no form of the value either
        for suffix in ("", "-wal"):
            path = Path(str(store.local_path) + suffix)
            if path.exists():
                assert leaked(path.read_bytes()) == [], path
