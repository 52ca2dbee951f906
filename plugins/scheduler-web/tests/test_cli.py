"""``scheduler web`` as a real process: the bind rule, the token rules, the port, the database, then serving pages.

Each refusal exits non-zero with its code (``--json``: one object) before anything listens or is
created; the served case reads the URL the command prints and fetches pages over loopback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from scheduler.api import ops
from scheduler.testing import add_job

SCHEDULER = [sys.executable, "-m", "scheduler"]


def web(db: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``scheduler --json --db DB web ARGS`` that is expected to refuse (it must end by itself)."""
    return subprocess.run([*SCHEDULER, "--json", "--db", str(db), "web", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, check=False)


def code_of(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done
    return json.loads(done.stdout.strip().splitlines()[-1])["code"]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "scheduler.db"
    store = ops.open_store(str(path))
    add_job(store, name="served-job", payload_message="ok")
    store.close()
    return path


def test_refusals_have_codes_and_listen_on_nothing(db: Path, tmp_path: Path) -> None:
    assert code_of(web(db, "--host", "0.0.0.0", "--port", "0")) == "WEB_TOKEN_REQUIRED"
    assert code_of(web(db, "--host", "192.0.2.1", "--port", "0")) == "WEB_TOKEN_REQUIRED"
    assert code_of(web(db, "--port", "0", env={"SCHEDULER_WEB_TOKEN": "short"})) == "WEB_TOKEN_INVALID"
    token_file = tmp_path / "token"
    token_file.write_text("x" * 40)
    token_file.chmod(0o644)
    assert code_of(web(db, "--host", "0.0.0.0", "--port", "0", "--token-file", str(token_file))) == "WEB_TOKEN_INVALID"
    assert code_of(web(db, "--token-file", str(tmp_path / "absent"))) == "WEB_TOKEN_INVALID"
    missing = tmp_path / "missing.db"
    assert code_of(web(missing, "--port", "0")) == "DB_NOT_FOUND" and not missing.exists()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        assert code_of(web(db, "--port", str(busy.getsockname()[1]))) == "WEB_PORT_UNAVAILABLE"


def serve(db: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Start ``scheduler web --port 0 ARGS``; the process and the JSON line it printed (``url``, ...)."""
    proc = subprocess.Popen([*SCHEDULER, "--json", "--db", str(db), "web", "--port", "0", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    return proc, json.loads(line)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_it_serves_the_pages_read_only_and_with_a_token(db: Path, tmp_path: Path) -> None:
    proc, started = serve(db, "--read-only")
    try:
        assert started["ok"] is True and started["read_only"] is True and started["url"].startswith("http://127.0.0.1:")
        status, body = get(started["url"])
        assert status == 200 and 'data-job="served-job"' in body and "Run now" not in body
    finally:
        proc.terminate()
        proc.wait(10)
    token_file = tmp_path / "token"
    token_file.write_text("k" * 40 + "\n")
    token_file.chmod(0o600)
    proc, started = serve(db, "--host", "127.0.0.1", "--token-file", str(token_file))
    try:
        assert started["token_required"] is True and "k" * 40 not in json.dumps(started)
        assert get(started["url"])[0] == 401
        status, body = get(started["url"] + "runs", {"Authorization": "Bearer " + "k" * 40})
        assert status == 200 and "k" * 40 not in body
    finally:
        proc.terminate()
        proc.wait(10)
