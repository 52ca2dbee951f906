"""Figure 9: per-turn overhead of an agent run over the bare HTTP round trip to the same model server.

The model is the agent plugin's loopback chat-completions server
(``scheduler_executor_agent.loopback.LoopbackModel``) in a child process of its own
(``python -m bench.agent serve``), so no client shares its GIL with it. Every request gets
the same streamed reply: 40 content events (about 600 bytes of text), a finish event, a
usage event and ``[DONE]``, chunked, ``Connection: close``.

Measured, one turn at a time, the same prompt each time:

* **scheduler run**: a job ``session_target: "isolated"`` (driver ``agent``, endpoint from a
  settings file as an operator writes it) in a real ``scheduler run --concurrency 1``
  process on a SQLite file; the bench commits a manual dispatch (``enqueue_manual``, what
  ``jobs run`` does) and waits for the run to end. Per turn: the run as the kernel records
  it (``finished_at − started_at``: run row created at claim → completion committed,
  which includes prompt assembly, the handle commit, the HTTP turn, output capture and
  usage) and end to end (dispatch committed → completion committed, adding the idle
  dispatcher's pick-up). Millisecond stamps of the kernel.
* **executor alone**: the same ``AgentExecutor`` (loaded through its entry point, same
  settings file) called in the bench process with ``scheduler.testing.make_request`` and a
  ``LocalRunControl``: no database, no dispatcher. ``time.perf_counter``.
* **baseline**: a bare ``httpx`` streaming POST of the **exact request body** the
  dispatcher's agent sent (taken from the model server's log: same prompt bytes, model,
  ``stream_options``, ``max_tokens``), reading the event lines and ``json.loads``-ing each
  one until ``[DONE]``; a new connection per request, as the server closes each one.
  ``time.perf_counter``. Half of it runs before the others and half after, pooled.

The first turns of each loop are warm-up and not counted. A plain turn sends no capability
probe (issue 31): the model server gets the chat request only.

**On LiteLLM's proxy** (when ``.venv-litellm`` exists: ``.ci/run`` installs it), a
``mock_response`` model on a loopback port: the executor alone against it and a bare httpx
streaming POST of the same body (model renamed), interleaved in halves as above. Issue 31
measured 3.4-8.0 s per mock turn there against 0.05 s direct while the executor probed
``/health``; this row shows what the executor adds now.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO_ROOT,
    Context,
    bench_env,
    fmt,
    fresh_db,
    md_table,
    pyplot,
    ratio,
    save_plot,
    scheduler_cmd,
    summary,
)

NAME = "agent"
TITLE = "9. Agent turn: a run through `scheduler run` vs a bare httpx streaming request"
MODEL = "bench-model"
ENDPOINT = "bench"
#: The reply every request gets: 40 content events, about 600 bytes.
REPLY_CHUNKS = [f"Item {i:02d}: all green. " for i in range(40)]
USAGE = {"prompt_tokens": 520, "completion_tokens": 160}
#: About 2 KB of neutral task text (no injection pattern), the job's payload.
PAYLOAD = "Summarise these status notes in five bullet points.\n" + "".join(
    f"Note {i:03d}: nightly backups completed on every host; disk usage at {40 + i % 50} percent; "
    "two tickets are waiting for review.\n" for i in range(18))


def params(ctx: Context) -> dict[str, Any]:
    return {"turns": 60 if ctx.quick else 400, "warmup": 5, "concurrency": 1}


# -- the model server (a child process) ------------------------------------------------------------


def serve() -> None:
    """``python -m bench.agent serve``: a LoopbackModel answering every request with the bench reply.

    Prints the port on its first line; then, for each ``last`` line on stdin, one JSON line
    ``{"count": N, "body": <the last chat request's JSON body>}``; exits when stdin closes.
    """
    from scheduler_executor_agent.loopback import LoopbackModel, Reply

    model = LoopbackModel()
    model.default = Reply(chunks=list(REPLY_CHUNKS), usage=dict(USAGE))
    model.info = {"capabilities": []}
    model.start()
    print(model.port, flush=True)
    for line in sys.stdin:
        if line.strip() == "last":
            requests = model.chat_requests()
            print(json.dumps({"count": len(requests), "body": requests[-1].body if requests else None}), flush=True)
    model.stop()


class _Server:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.agent", "serve"], cwd=str(REPO_ROOT), env=bench_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def last(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("last\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the three loops --------------------------------------------------------------------------------


def _settings(directory: Path, base_url: str) -> Path:
    path = directory / "config.toml"
    path.write_text("[executors.agent]\n"
                    f'default_endpoint = "{ENDPOINT}"\n'
                    f'endpoint_urls = {{ {ENDPOINT} = "{base_url}" }}\n'
                    f'endpoint_models = {{ {ENDPOINT} = "{MODEL}" }}\n'
                    f'prices = {{ "{MODEL}" = "0.15/0.60" }}\n')
    return path


def _spec() -> dict[str, Any]:
    return {"name": "bench-agent-turn", "schedule_kind": "manual", "session_target": "isolated",
            "payload_message": PAYLOAD, "executor_options": {"endpoint": ENDPOINT, "model": MODEL},
            "run_timeout_ms": 30000}


def _agent_env(config: Path, directory: Path) -> dict[str, str]:
    env = bench_env(SCHEDULER_CONFIG=str(config), XDG_STATE_HOME=str(directory / "state"))
    return {k: v for k, v in env.items() if not k.startswith(("SCHEDULER_AGENT_", "SCHEDULER_EXECUTORS_AGENT_"))}


def run_dispatcher(ctx: Context, p: dict[str, Any], directory: Path, config: Path) -> dict[str, list[float]]:
    """Turns through a real ``scheduler run`` process, one at a time; kernel stamps per run."""
    from scheduler.core.jobs import create_jobs
    from scheduler.core.queue import enqueue_manual
    from scheduler.core.spec import validate_spec
    from scheduler.plugins.stores import open_store

    db = fresh_db(directory, "agent.db")
    store = open_store(str(db))
    (job,) = create_jobs(store, [validate_spec(_spec())])
    job_id = job.id
    env = _agent_env(config, directory)
    log = open(directory / "dispatcher.log", "w")  # noqa: SIM115 - the child's log, open for its life
    proc = subprocess.Popen(scheduler_cmd() + ["--db", str(db), "run", "--concurrency", str(p["concurrency"])], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    poll = sqlite3.connect(str(db))
    dispatch_ids: list[str] = []
    try:
        for i in range(p["warmup"] + p["turns"]):
            row = enqueue_manual(store, job_id)
            dispatch_ids.append(row["id"])
            deadline = time.monotonic() + 30
            while True:
                got = poll.execute("SELECT status FROM runs WHERE dispatch_id = ?", (row["id"],)).fetchone()
                if got and got[0] not in ("running", "pending"):
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"turn {i} did not finish (dispatcher exit {proc.poll()}); "
                                       f"see {directory / 'dispatcher.log'}")
                time.sleep(0.003)
            if i == 0:
                ctx.say("agent: first turn through scheduler run finished")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    rows = poll.execute(
        "SELECT r.dispatch_id, r.status, r.error_code, r.started_at, r.finished_at, d.created_at "
        "FROM runs r JOIN job_dispatch_queue d ON d.id = r.dispatch_id WHERE r.job_id = ?", (job_id,)).fetchall()
    poll.close()
    store.close()
    by_dispatch = {r[0]: r for r in rows}
    counted = [by_dispatch[d] for d in dispatch_ids[p["warmup"]:]]
    bad = [r for r in counted if r[1] != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} run(s) did not end ok, e.g. {bad[0][1]} {bad[0][2]}")
    return {"run": [float(r[4] - r[3]) for r in counted], "end_to_end": [float(r[4] - r[5]) for r in counted]}


def run_executor(p: dict[str, Any], directory: Path, config: Path, *, model: str = MODEL, turns: int | None = None,
                 extra_env: dict[str, str] | None = None) -> tuple[list[float], list[float]]:
    """The same executor called directly (no database, no dispatcher), perf_counter per turn; between turns (untimed
    for the turn) one ``httpx.Client()`` construction is timed too, so both see the same machine load."""
    from scheduler.plugins.loader import load_provider
    from scheduler.settings import reload_settings
    from scheduler.testing import LocalRunControl, make_request

    saved = {k: os.environ.get(k) for k in ("SCHEDULER_CONFIG", "XDG_STATE_HOME")}
    hidden = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(("SCHEDULER_AGENT_", "SCHEDULER_EXECUTORS_AGENT_"))}
    os.environ.update({"SCHEDULER_CONFIG": str(config), "XDG_STATE_HOME": str(directory / "state"), **(extra_env or {})})
    reload_settings()
    try:
        executor = load_provider("executor", "agent")
        spec = {k: v for k, v in _spec().items() if k != "payload_message"}
        spec["executor_options"] = {**spec["executor_options"], "model": model}
        out: list[float] = []
        setup: list[float] = []
        for i in range(p["warmup"] + (p["turns"] if turns is None else turns)):
            request = make_request(PAYLOAD, artifacts_root=directory / "artifacts-executor", run_id=f"bench-{i:05d}", **spec)
            control = LocalRunControl()
            t0 = time.perf_counter()
            result = executor.execute(request, control)
            elapsed = (time.perf_counter() - t0) * 1000
            if result.status != "ok":
                raise RuntimeError(f"executor turn {i}: {result.status} {result.error_code} {result.error_message}")
            if i >= p["warmup"]:
                out.append(elapsed)
                setup.append(run_client_setup(1)[0])
        return out, setup
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for k in extra_env or {}:
            os.environ.pop(k, None)
        os.environ.update(hidden)
        reload_settings()


def run_bare(base_url: str, body: dict[str, Any], count: int, warmup: int,
             headers: dict[str, str] | None = None) -> tuple[list[float], int]:
    """Bare httpx streaming POSTs of ``body``; returns the times (ms) and the reply's length."""
    import httpx

    url = base_url + "/chat/completions"
    out: list[float] = []
    length = 0
    with httpx.Client(timeout=30) as client:
        for i in range(warmup + count):
            t0 = time.perf_counter()
            text: list[str] = []
            with client.stream("POST", url, json=body, headers=headers) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    for choice in event.get("choices") or ():
                        text.append((choice.get("delta") or {}).get("content") or "")
            elapsed = (time.perf_counter() - t0) * 1000
            if i >= warmup:
                out.append(elapsed)
            length = len("".join(text))
    return out, length


def run_client_setup(count: int) -> list[float]:
    """Constructing and closing an ``httpx.Client()`` with default settings (its SSL context loads the CA bundle)."""
    import httpx

    out: list[float] = []
    for _ in range(count):
        t0 = time.perf_counter()
        httpx.Client(timeout=30).close()
        out.append((time.perf_counter() - t0) * 1000)
    return out


LITELLM_VENV = REPO_ROOT / ".venv-litellm"
LITELLM_MODEL = "mock-small"
LITELLM_KEY = "sk-bench-litellm-master"


def _litellm_proxy(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """LiteLLM's proxy with a ``mock_response`` model (the bench reply's text) on a free loopback port."""
    import socket

    import httpx

    config = directory / "litellm.yaml"
    config.write_text("model_list:\n"
                      f"  - model_name: {LITELLM_MODEL}\n"
                      "    litellm_params:\n"
                      f"      model: openai/{LITELLM_MODEL}\n"
                      "      api_key: sk-not-used\n"
                      f"      mock_response: {json.dumps(''.join(REPLY_CHUNKS))}\n"
                      f"general_settings:\n  master_key: {LITELLM_KEY}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(directory / "litellm.log", "wb")  # noqa: SIM115 - the child's log, open for its life
    proc = subprocess.Popen([str(LITELLM_VENV / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=str(directory), env={**bench_env(), "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"LiteLLM's proxy exited {proc.returncode}; see {directory / 'litellm.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=1).status_code == 200:
                return proc, f"http://127.0.0.1:{port}/v1"
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("LiteLLM's proxy did not start in 120 s")
        time.sleep(0.25)


def run_litellm(ctx: Context, p: dict[str, Any], directory: Path, body: dict[str, Any]) -> dict[str, Any]:
    """The executor alone vs a bare streaming POST of the same body, both against LiteLLM's proxy (mock model)."""
    if not (LITELLM_VENV / "bin" / "litellm").exists():
        return {"skipped": f"{LITELLM_VENV.name} is absent (.ci/run installs LiteLLM's proxy there)"}
    turns = 20 if ctx.quick else 100
    proc, base_url = _litellm_proxy(directory)
    try:
        config = directory / "litellm.toml"
        config.write_text("[executors.agent]\n"
                          f'default_endpoint = "{ENDPOINT}"\n'
                          f'endpoint_urls = {{ {ENDPOINT} = "{base_url}" }}\n'
                          f'endpoint_models = {{ {ENDPOINT} = "{LITELLM_MODEL}" }}\n'
                          f'endpoint_keys = {{ {ENDPOINT} = "env:BENCH_LITELLM_KEY" }}\n')
        direct = {**body, "model": LITELLM_MODEL}
        auth = {"authorization": f"Bearer {LITELLM_KEY}"}
        ctx.say(f"agent: LiteLLM's proxy at {base_url}: {turns} executor turns and {turns} bare requests")
        half = turns // 2
        bare_a, _ = run_bare(base_url, direct, half, p["warmup"], headers=auth)
        executor, _ = run_executor(p, directory, config, model=LITELLM_MODEL, turns=turns,
                                   extra_env={"BENCH_LITELLM_KEY": LITELLM_KEY})
        bare_b, _ = run_bare(base_url, direct, turns - half, p["warmup"], headers=auth)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    probes = [line for line in (directory / "litellm.log").read_text(errors="replace").splitlines()
              if '"GET /health ' in line or '"GET /v1/info ' in line]
    res: dict[str, Any] = {"turns": turns, "executor": summary(executor), "bare": summary(bare_a + bare_b),
                           "probes_seen": len(probes)}
    res["over_p50_ms"] = res["executor"]["p50"] - res["bare"]["p50"]
    res["ratio_p50"] = ratio(res["executor"]["p50"], res["bare"]["p50"])
    return res


def run(ctx: Context) -> dict[str, Any]:
    try:
        import scheduler_executor_agent  # noqa: F401
    except ImportError:
        return {"skipped": "scheduler-executor-agent is not installed"}
    p = params(ctx)
    directory = ctx.scratch(NAME)
    server = _Server()
    try:
        config = _settings(directory, server.base_url)
        ctx.say(f"agent: loopback model on port {server.port}; {p['turns']} turns through scheduler run")
        kernel = run_dispatcher(ctx, p, directory, config)
        last = server.last()
        body = last["body"]
        if not isinstance(body, dict) or body.get("model") != MODEL:
            raise RuntimeError(f"unexpected request body recorded by the model: {str(body)[:200]}")
        half = p["turns"] // 2
        ctx.say(f"agent: bare httpx streaming requests ({half} before, {p['turns'] - half} after the executor loop)")
        bare_a, reply_len = run_bare(server.base_url, body, half, p["warmup"])
        ctx.say(f"agent: {p['turns']} turns of the executor alone")
        executor, client_setup = run_executor(p, directory, config)
        bare_b, _ = run_bare(server.base_url, body, p["turns"] - half, p["warmup"])
        bare = bare_a + bare_b
        requests_seen = server.last()["count"]
    finally:
        server.close()
    try:
        litellm = run_litellm(ctx, p, directory, body)
    except RuntimeError as exc:
        litellm = {"skipped": f"LiteLLM's proxy could not be used: {exc}"}
    prompt = "".join(m.get("content", "") for m in body.get("messages", []) if isinstance(m, dict))
    res: dict[str, Any] = {
        "params": p,
        "request": {"body_bytes": len(json.dumps(body).encode()), "prompt_bytes": len(prompt.encode()),
                    "payload_bytes": len(PAYLOAD.encode()), "reply_bytes": reply_len, "events": len(REPLY_CHUNKS),
                    "stream": body.get("stream"), "max_tokens": body.get("max_tokens")},
        "run": summary(kernel["run"]),
        "end_to_end": summary(kernel["end_to_end"]),
        "executor": summary(executor),
        "bare": summary(bare),
        "requests_seen": requests_seen,
        "client_setup": summary(client_setup),
        "litellm": litellm,
    }
    for key in ("run", "end_to_end", "executor"):
        res[f"{key}_ratio_p50"] = ratio(res[key]["p50"], res["bare"]["p50"])
        res[f"{key}_ratio_p99"] = ratio(res[key]["p99"], res["bare"]["p99"])
        res[f"{key}_over_p50_ms"] = res[key]["p50"] - res["bare"]["p50"]
    ctx.say(f"agent: run p50 {res['run']['p50']:.1f} / p99 {res['run']['p99']:.1f} ms; bare p50 {res['bare']['p50']:.2f} / "
            f"p99 {res['bare']['p99']:.2f} ms; executor alone p50 {res['executor']['p50']:.2f} ms")
    res["plot"] = _plot(ctx, res, {"bare": bare, "executor": executor, "run": kernel["run"], "end_to_end": kernel["end_to_end"]})
    return res


# -- report ------------------------------------------------------------------------------------------

_ROWS = (
    ("bare", "baseline: bare httpx streaming POST, same body (perf_counter)"),
    ("executor", "agent executor alone, no database (perf_counter)"),
    ("run", "run in `scheduler run`: started → completion committed (kernel ms stamps)"),
    ("end_to_end", "`jobs run` commit → completion committed, idle dispatcher (kernel ms stamps)"),
)
_COLOURS = {"bare": "#7f7f7f", "executor": "#2ca02c", "run": "#1f77b4", "end_to_end": "#ff7f0e"}


def _plot(ctx: Context, res: dict[str, Any], series: dict[str, list[float]]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for key, label in _ROWS:
        xs = sorted(series[key])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        short = label.split(":")[0].split(",")[0].split(" (")[0]
        ax.step(xs, ys, where="post", color=_COLOURS[key],
                label=f"{short}: p50 {res[key]['p50']:.1f} / p99 {res[key]['p99']:.1f} ms")
    ax.set_xscale("log")
    ax.set_xlabel("time per turn (ms, log scale)")
    ax.set_ylabel("fraction of turns")
    ax.set_title(f"One agent turn vs the bare HTTP round trip ({res['params']['turns']} turns each)")
    ax.legend(loc="lower right", fontsize=7)
    return save_plot(ctx, fig, "agent")


def headline(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    r, b = res["run"], res["bare"]
    return [(
        "9. agent turn vs bare HTTP round trip",
        (f"run p50 {r['p50']:.0f} / p99 {r['p99']:.0f} ms vs bare httpx p50 {b['p50']:.1f} / p99 {b['p99']:.1f} ms "
         f"= {res['run_ratio_p50']:.1f}x / {res['run_ratio_p99']:.1f}x (+{res['run_over_p50_ms']:.1f} ms at p50)"),
        "no numeric goal (tracked)",
        None,
    )]


def render(res: dict[str, Any]) -> str:
    p, q = res["params"], res["request"]
    rows = []
    for key, label in _ROWS:
        s = res[key]
        over = "—" if key == "bare" else fmt(res[f"{key}_over_p50_ms"], 1)
        r50 = "1.00x" if key == "bare" else f"{res[f'{key}_ratio_p50']:.2f}x"
        r99 = "1.00x" if key == "bare" else f"{res[f'{key}_ratio_p99']:.2f}x"
        rows.append((label, fmt(s["n"]), fmt(s["p50"], 2), fmt(s["p90"], 2), fmt(s["p99"], 2), fmt(s["max"], 2), over, r50, r99))
    out = [
        (f"{p['turns']:,} turns per loop after {p['warmup']} warm-up turns, one at a time, against the agent plugin's loopback "
         "chat-completions server in a child process. Every turn sends the same prompt "
         f"({q['prompt_bytes']:,} bytes of prompt, {q['payload_bytes']:,} of them the job's payload; request body "
         f"{q['body_bytes']:,} bytes, `stream: {str(q['stream']).lower()}`) and gets the same streamed reply "
         f"({q['events']} content events, {q['reply_bytes']:,} bytes of text, then usage and `[DONE]`). The baseline "
         "POSTs the exact body the dispatcher's agent sent (taken from the server's log), half before and half after "
         "the executor loop. The job: `session_target: \"isolated\"`, endpoint and model from a settings file, "
         f"`scheduler run --concurrency {p['concurrency']}` on SQLite (see `bench/agent.py`)."),
        "",
        md_table(["measured", "turns", "p50 ms", "p90 ms", "p99 ms", "max ms", "over bare p50 ms", "x bare p50",
                  "x bare p99"], rows),
        "",
        (f"A run through `scheduler run` takes **{res['run_ratio_p50']:.1f}x** the bare round trip at p50 "
         f"(+{res['run_over_p50_ms']:.1f} ms) and **{res['run_ratio_p99']:.1f}x** at p99. The executor alone accounts for "
         f"+{res['executor_over_p50_ms']:.1f} ms at p50 (prompt assembly and checks, settings, the request through its own "
         "httpx client, output capture and digests, usage); the rest of the run is the kernel's bookkeeping around it "
         "(run row and handle commits, events, the completion transaction) in another process. End to end adds the "
         "idle dispatcher's pick-up of the manual dispatch. The kernel stamps have millisecond resolution, the other "
         f"rows microsecond. The model server answered {res['requests_seen']:,} chat requests in all."),
        "",
        (f"For scale: constructing and closing one `httpx.Client()` with default settings (its SSL context loads the CA "
         f"bundle, even for an `http://` URL) takes p50 {res['client_setup']['p50']:.1f} ms here "
         f"(timed between the executor-alone turns, {res['client_setup']['n']} times); an executor that builds a client per "
         "turn pays that on every turn."),
        "",
        ("No numeric goal is set for this figure: against a real model a turn takes hundreds of milliseconds to minutes, "
         "so the absolute overhead per turn is what matters; it is tracked here against the loopback round trip."),
    ]
    lite = res.get("litellm") or {"skipped": "not measured in this result"}
    if "skipped" in lite:
        out += ["", f"On LiteLLM's proxy: not measured ({lite['skipped']})."]
    else:
        e, b = lite["executor"], lite["bare"]
        out += ["", (f"**On LiteLLM's proxy** (1.108.7, a `mock_response` model on loopback, {lite['turns']} turns each): the "
                     f"executor alone p50 {e['p50']:.1f} / p99 {e['p99']:.1f} ms against a bare streaming POST of the same "
                     f"body p50 {b['p50']:.1f} / p99 {b['p99']:.1f} ms, **{lite['over_p50_ms']:+.1f} ms** "
                     f"({lite['ratio_p50']:.2f}x) at p50; the proxy logged {lite['probes_seen']} `/health` or `/v1/info` "
                     "requests. Issue 31 measured 3.4-8.0 s per mock turn there while the executor probed `/health` "
                     "before every turn.")]
    if res.get("plot"):
        out += ["", f"![agent]({res['plot']})"]
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        print("usage: python -m bench.agent serve   (the benchmark itself: python -m bench --only agent)", file=sys.stderr)
        sys.exit(2)
