"""Issue 32, section 2: three more stumbles of a new user in the CLI, each through the real CLI (SQLite and PostgreSQL).

2. ``runs output`` says what it does not print: the other stream's bytes, a run still running;
   ``--both`` prints both streams, ``--follow`` follows a running run's stored output until it ends.
4. ``scheduler --json run`` prints one JSON line per run event (NDJSON), then its summary.
7. The ID column of ``jobs list`` is a unique short id (``openclaw`` was every imported job's),
   and ``jobs get`` takes it back.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from kernel_testing import TERMINAL, run_job_once, run_rows, scheduler_cmd, wait_for

FIXTURES = Path(__file__).parent / "fixtures"


def table_column(text: str, header: str) -> dict[str, str]:
    """The cells of column ``header`` in a ``table`` rendering, keyed by the first column (cells are padded)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = lines[0]
    names = head.split()
    start = head.index(header.upper())
    following = [head.index(n) for n in names if head.index(n) > start]
    end = min(following) if following else None
    first_end = head.index(names[1])
    return {ln[:first_end].strip(): ln[start:end].strip() for ln in lines[1:]}


# --------------------------------------------------------------------------- 7. a unique short id in jobs list


def test_jobs_list_shows_a_unique_short_id_that_jobs_get_takes(cli: Any, store: Any) -> None:
    imported = cli("--json", "import", "openclaw", "--legacy-json", str(FIXTURES / "openclaw" / "jobs.json"))
    assert imported.json["details"]["summary"]["imported"] == 6, imported  # (some fixture jobs cannot be imported)
    plain = cli("--json", "jobs", "add", json.dumps({"name": "plain", "schedule_kind": "every", "schedule_every": "1h",
                                                      "payload_message": "true"})).json["job"]
    full = {j["name"]: j["id"] for j in cli("--json", "jobs", "list").json["jobs"]}
    assert len(full) == 7 and all(i.startswith("openclaw-cron:8f0c7a52-") for n, i in full.items() if n != "plain")
    listing = cli("jobs", "list")
    assert listing.code == 0, listing
    shown = table_column(listing.out, "id")
    assert set(shown) == set(full)
    assert len(set(shown.values())) == len(shown), shown  # was "openclaw" seven times over
    assert shown["plain"] == plain["id"][:8]  # a uuid shows its first 8 characters, as before
    for name, short in shown.items():
        assert 8 <= len(short) < len(full[name]), (name, short)
        assert full[name].startswith(short) or full[name].endswith(short), (name, short)
        got = cli("--json", "jobs", "get", short)
        assert got.code == 0 and got.json["job"]["id"] == full[name], got
    # A prefix several jobs share is ambiguous, not the first of them; a too short piece is not an id.
    ambiguous = cli("--json", "jobs", "get", "openclaw-cron:8f0c7a52")
    assert ambiguous.code != 0 and ambiguous.json["code"] == "INVALID_ARGUMENT" and "ambiguous" in ambiguous.json["error"]
    short = cli("--json", "jobs", "get", full["Reminder"][-4:])
    assert short.code != 0 and short.json["code"] == "NOT_FOUND", short
    # Every command that takes a job takes the short id (here: disable, then get by name).
    assert cli("--json", "jobs", "disable", shown["Reminder"]).code == 0
    assert cli("--json", "jobs", "get", "Reminder").json["job"]["enabled"] is False


def test_unique_id_pieces_are_taken_back_by_the_resolver_only_to_their_own_id() -> None:
    """The rule behind the column: a piece matches no other id at either end and is no job's name."""
    from scheduler.core.jobs import unique_id_pieces

    ids = ["abcdefgh", "abcdefghij", "x-0001-tail-same", "y-0002-tail-same", "zzzzzzzz-end-abcdefgh", "name-is-taken-1"]
    pieces = unique_id_pieces(ids, minimum=8, reserved={"name-is-", "-taken-1"})
    assert pieces["abcdefgh"] == "abcdefgh"  # another id's prefix: only the whole id is its own (exact ids win)
    assert pieces["abcdefghij"] == "cdefghij"  # its end is shorter than its first unique start (abcdefghi)
    assert pieces["x-0001-tail-same"] == "x-0001-t" and pieces["y-0002-tail-same"] == "y-0002-t"
    assert pieces["zzzzzzzz-end-abcdefgh"] == "zzzzzzzz"
    assert pieces["name-is-taken-1"] == "name-is-t"  # both 8-piece ends are names: the resolver gives a name first
    for own, piece in pieces.items():
        others = [i for i in ids if i != own and (i.startswith(piece) or i.endswith(piece))]
        assert piece == own or not others, (own, piece, others)
    tails = unique_id_pieces(["openclaw-cron:0001-aaaa-1111", "openclaw-cron:0001-aaaa-2222"], minimum=8)
    assert tails == {"openclaw-cron:0001-aaaa-1111": "aaa-1111", "openclaw-cron:0001-aaaa-2222": "aaa-2222"}


# --------------------------------------------------------------------------- 4. scheduler --json run: NDJSON events


def add_manual(cli: Any, name: str, command: str) -> dict[str, Any]:
    """Add a manual shell job through the CLI and return its JSON view."""
    out = cli("--json", "jobs", "add", json.dumps({"name": name, "schedule_kind": "manual", "payload_message": command}))
    assert out.code == 0, out
    return out.json["job"]


def test_json_run_prints_one_line_per_run_event_then_the_summary(cli: Any, store: Any, store_url: str) -> None:
    fine = add_manual(cli, "fine", "echo fine")
    bad = add_manual(cli, "bad", "echo oops >&2; exit 3")
    for job in (fine, bad):
        assert cli("--json", "jobs", "run", job["id"]).code == 0
    out = subprocess.run([*scheduler_cmd(), "--db", store_url, "--json", "run", "--duration", "4s"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out
    lines = [json.loads(ln) for ln in out.stdout.splitlines()]  # every line is one JSON object (NDJSON)
    *events, summary = lines
    assert summary["ok"] is True and summary["stats"]["started"] == 2 and summary["stats"]["finished"] == 2, summary
    assert "event" not in summary and all("ok" not in e for e in events)
    runs = {r["job_id"]: r for r in run_rows(store, fine["id"]) + run_rows(store, bad["id"])}
    for job, status, code in ((fine, "ok", None), (bad, "error", runs[bad["id"]]["error_code"])):
        run = runs[job["id"]]
        mine = [e for e in events if e["run_id"] == run["id"]]
        assert [e["event"] for e in mine] == ["run.started", "run.finished"], mine
        started, finished = mine
        assert (started["job"], started["job_id"], started["status"]) == (job["name"], job["id"], "running")
        assert (finished["job"], finished["status"], finished["error_code"]) == (job["name"], status, code)
        assert finished["exit_code"] == (0 if status == "ok" else 3) and finished["duration_ms"] == run["duration_ms"]
        assert started["at"].endswith("Z") and finished["at"].endswith("Z")
    assert code is not None  # the failed run's code is there to see
    # Human mode is unchanged: lines of text, no JSON.
    human = subprocess.run([*scheduler_cmd(), "--db", store_url, "run", "--duration", "300ms"], capture_output=True,
                           text=True, timeout=120)
    assert human.returncode == 0 and "dispatcher stopped" in human.stdout and "{" not in human.stdout, human


# --------------------------------------------------------------------------- 2. runs output: stderr, running runs, --follow


def test_runs_output_of_a_failed_run_says_its_error_is_on_stderr(cli: Any, store: Any, dispatcher: Any) -> None:
    job = add_manual(cli, "fails", "echo oops >&2; exit 3")
    run = run_job_once(store, dispatcher, job)
    assert run["status"] == "error"
    out = cli("runs", "output", run["id"])
    assert out.code == 0 and out.out == "", out  # stdout stays the run's exact (empty) stdout
    assert "stdout is empty" in out.err and "stderr has 5 bytes" in out.err and "error" in out.err, out.err
    assert f"runs output {run['id'][-8:]} stderr" in out.err and "--both" in out.err
    both = cli("runs", "output", run["id"], "--both")
    assert (both.code, both.out, both.err) == (0, "", "oops\n"), both  # each stream to its own
    view = cli("--json", "runs", "output", run["id"]).json
    assert (view["bytes"], view["content"], view["run_status"], view["complete"]) == (0, "", "error", True), view
    assert view["other"] == {"stream": "stderr", "bytes": 5}
    streams = cli("--json", "runs", "output", run["id"], "--both").json
    assert streams["streams"]["stderr"]["content"] == "oops\n" and streams["streams"]["stdout"]["bytes"] == 0, streams
    assert streams["run_status"] == "error" and "content" not in streams
    refused = cli("--json", "runs", "output", run["id"], "stderr", "--both")
    assert refused.code != 0 and refused.json["code"] == "INVALID_ARGUMENT", refused
    ok = run_job_once(store, dispatcher, add_manual(cli, "speaks", "echo hello; echo warn >&2"))
    printed = cli("runs", "output", ok["id"])
    assert printed.out == "hello\n" and "stderr has 5 bytes too" in printed.err, printed


def test_runs_output_of_a_running_run_says_so(cli: Any, store: Any, dispatcher: Any) -> None:
    job = add_manual(cli, "slow", "echo started; sleep 30")
    assert cli("--json", "jobs", "run", job["id"]).code == 0
    d = dispatcher()
    try:
        (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "running"], what="the run to start")
        out = cli("runs", "output", run["id"])
        assert out.code == 0 and out.out == "", out
        assert "is running" in out.err and "--follow" in out.err, out.err
        view = cli("--json", "runs", "output", run["id"]).json
        assert (view["run_status"], view["complete"], view["bytes"]) == ("running", False, 0), view
        assert cli("--json", "runs", "cancel", run["id"]).code == 0
        wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] in TERMINAL], what="the cancelled run to end")
    finally:
        d.stop()


def test_runs_output_follow_streams_a_running_run_until_it_ends(cli: Any, store: Any, store_url: str, dispatcher: Any,
                                                              tmp_path: Path, monkeypatch: Any) -> None:
    """A real short shell job: 70 kB (offloaded to its artifact file at once), four seconds' pause (a follower starting slowly still sees it run), a last line."""
    monkeypatch.setenv("SCHEDULER_ARTIFACTS_DIR", str(tmp_path / "artifacts"))  # the dispatcher's and the follower's
    job = add_manual(cli, "talks", "head -c 70000 /dev/zero | tr '\\0' a; echo; sleep 4; echo last line; echo bye >&2")
    assert cli("--json", "jobs", "run", job["id"]).code == 0
    d = dispatcher()
    try:
        (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "running"], what="the run to start")
        follower = subprocess.Popen([*scheduler_cmd(), "--db", store_url, "runs", "output", run["id"][-8:], "--follow"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        chunks: list[tuple[int, bytes]] = []
        reader = threading.Thread(target=lambda: [chunks.append((int(time.time() * 1000), c))
                                                  for c in iter(lambda: follower.stdout.read1(65536), b"")])  # type: ignore[union-attr]
        reader.start()
        assert follower.wait(60) == 0, follower.stderr.read()  # type: ignore[union-attr]
        reader.join(10)
        err = follower.stderr.read().decode()  # type: ignore[union-attr]
    finally:
        d.stop()
    (done,) = run_rows(store, job["id"])
    assert done["status"] == "ok", done
    data = b"".join(c for _t, c in chunks)
    assert data == b"a" * 70000 + b"\nlast line\n"  # exactly the stream, nothing twice
    early = sum(len(c) for t, c in chunks if t < done["finished_at"] - 1000)
    assert early >= 65536, (early, [(t, len(c)) for t, c in chunks], done["finished_at"])  # shown while it ran
    assert "stderr has 4 bytes too" in err, err
    both = cli("runs", "output", done["id"], "--both", "--follow")  # a finished run: at once, both streams
    assert both.code == 0 and both.out.endswith("last line\n") and both.err == "bye\n", both.err
