"""Settings (named endpoints, the plain variables, secret references), sessions in isolation, and ``recover``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from scheduler_executor_agent import AgentExecutor, sessions
from scheduler_executor_agent.loopback import LoopbackModel, Reply
from scheduler_executor_agent.settings import resolve_endpoint, resolve_settings
from scheduler_toolkit.process import process_identity

from scheduler.api import RecoveryRequest, SchedulerError
from scheduler.testing import run_cli


def test_named_endpoints_from_the_settings_file(run_turn, settings_file, monkeypatch) -> None:
    with LoopbackModel() as local, LoopbackModel() as hosted:
        monkeypatch.setenv("HOSTED_KEY", "hosted-key-123")
        settings_file(f"""[executors.agent]
default_endpoint = "local"
endpoint_urls = {{ local = "{local.base_url}", hosted = "{hosted.base_url}" }}
endpoint_models = {{ local = "llama-local", hosted = "big-hosted" }}
endpoint_keys = {{ hosted = "env:HOSTED_KEY" }}
""")
        assert run_turn().result.status == "ok"
        assert run_turn(executor_options={"endpoint": "hosted", "model": "other"}).result.status == "ok"
        (to_local,), (to_hosted,) = local.chat_requests(), hosted.chat_requests()
        assert to_local.body["model"] == "llama-local" and "authorization" not in to_local.headers
        assert to_hosted.body["model"] == "other" and to_hosted.headers["authorization"] == "Bearer hosted-key-123"
        unknown = run_turn(executor_options={"endpoint": "nope"}).result
        assert unknown.error_code == "AGENT_ENDPOINT_UNKNOWN" and "hosted, local" in unknown.error_message
        monkeypatch.delenv("HOSTED_KEY")
        missing = run_turn(executor_options={"endpoint": "hosted"}).result
        assert missing.error_code == "SECRET_UNRESOLVED" and "env:HOSTED_KEY" in missing.error_message
        assert len(hosted.chat_requests()) == 1


def test_a_key_file_reference(run_turn, settings_file, tmp_path, model) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("file-key-456\n")
    settings_file(f'[executors.agent]\nendpoint_urls = {{ f = "{model.base_url}" }}\nendpoint_models = {{ f = "m" }}\n'
                  f'endpoint_keys = {{ f = "file:{key_file}" }}\n')
    assert run_turn(executor_options={"endpoint": "f"}).result.status == "ok"
    assert model.chat_requests()[0].headers["authorization"] == "Bearer file-key-456"


def test_the_plain_variables_define_the_default_endpoint(monkeypatch) -> None:
    settings = resolve_settings()
    with pytest.raises(SchedulerError) as exc:
        resolve_endpoint(settings, None, {})
    assert exc.value.code == "AGENT_ENDPOINT_UNCONFIGURED"
    env = {"SCHEDULER_AGENT_BASE_URL": "http://127.0.0.1:1/v1", "SCHEDULER_AGENT_MODEL": "m", "SCHEDULER_AGENT_API_KEY": "sk-9f8e7d"}
    endpoint = resolve_endpoint(settings, None, env)
    assert (endpoint.name, endpoint.chat_url, endpoint.model) == ("default", "http://127.0.0.1:1/v1/chat/completions", "m")
    assert endpoint.resolve_key(env) == "sk-9f8e7d" and "sk-9f8e7d" not in repr(endpoint)
    with pytest.raises(SchedulerError) as exc:
        resolve_endpoint(settings, None, {**env, "SCHEDULER_AGENT_BASE_URL": "http://user:pw@host/v1"})
    assert exc.value.code == "CONFIG_INVALID" and "pw" not in exc.value.message


@pytest.mark.parametrize(("table", "fragment"), [
    ('endpoint_keys = { x = "sk-literal-secret-value" }', "never the secret itself"),
    ('endpoint_urls = { x = "ftp://host/v1" }', "http:// or https://"),
    ('endpoint_urls = { x = "https://user:sk-in-url@host/v1" }', "must not carry credentials"),
    ('prices = { m = "cheap" }', "PROMPT/COMPLETION"),
    ('workspace = "relative/dir"', "absolute path"),
    ("idle_timeout_s = 0", "between"),
])
def test_bad_settings_are_config_invalid_and_never_quote_a_secret(settings_file, table: str, fragment: str) -> None:
    settings_file(f"[executors.agent]\n{table}\n")
    with pytest.raises(SchedulerError) as exc:
        resolve_settings()
    assert exc.value.code == "CONFIG_INVALID" and fragment in json.dumps(exc.value.details) + exc.value.message
    assert "sk-literal-secret-value" not in exc.value.message and "sk-in-url" not in exc.value.message


def test_scheduler_config_shows_references_only(settings_file, monkeypatch) -> None:
    settings_file('[executors.agent]\nendpoint_keys = { hosted = "env:HOSTED_KEY" }\n')
    monkeypatch.setenv("HOSTED_KEY", "real-secret-789")
    code, out, err = run_cli("--json", "config")
    assert code == 0, out + err
    assert "env:HOSTED_KEY" in out and "real-secret-789" not in out


def test_a_bad_settings_table_fails_the_run_with_its_key(settings_file, run_turn, model, artifacts_root) -> None:
    from scheduler.testing import LocalRunControl, make_request

    # the request is built first: building it loads the executor, and the kernel remembers a failed load for a few
    # seconds (skipping constraint checks of jobs added meanwhile in this process)
    request = make_request("Say hello.", artifacts_root=artifacts_root, session_target="isolated")
    settings_file("[executors.agent]\nmax_attempts = 0\n")
    r = run_turn.executor.execute(request, LocalRunControl())
    assert r.error_code == "CONFIG_INVALID" and "max_attempts" in r.error_message and model.chat_requests() == []


# -- sessions ----------------------------------------------------------------------------------------


def test_trim_keeps_whole_newest_turns() -> None:
    turns = [m for i in range(5) for m in ({"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a" * 100})]
    kept = sessions.trim(turns, max_turns=3, max_bytes=10_000)
    assert [m["content"] for m in kept if m["role"] == "user"] == ["q2", "q3", "q4"]
    tight = sessions.trim(turns, max_turns=10, max_bytes=250)
    assert [m["content"] for m in tight if m["role"] == "user"] == ["q3", "q4"]
    assert sessions.trim(turns[-2:], max_turns=1, max_bytes=1) == turns[-2:]  # the newest turn always stays


def test_the_state_is_the_bounded_conversation_of_its_session_key() -> None:
    turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    state = sessions.to_state("agent:main:scheduler:j", turn * 3, max_turns=2, max_bytes=10_000)
    assert state == {"version": 1, "session_key": "agent:main:scheduler:j", "turns": 2, "messages": turn * 2}
    assert sessions.from_state(state, "agent:main:scheduler:j") == turn * 2
    assert sessions.from_state(state, "agent:ops:scheduler:j") == []  # another agent_id: another conversation
    assert sessions.from_state(None, "k") == []
    for unusable in ({"version": 2, "session_key": "k", "messages": turn}, {"session_key": "k", "messages": "x"},
                     {"version": 1, "session_key": "k", "messages": [{"role": "system", "content": "x"}, 3]}):
        assert sessions.from_state(unusable, "k") == []  # an unusable state starts afresh rather than failing every run


def test_the_state_always_fits_the_kernels_limit() -> None:
    limit = sessions.MAX_EXECUTOR_STATE_BYTES
    # 4-byte characters become 12 JSON bytes (escaped surrogate pairs): 300 KiB of them is ~900 KiB of JSON per turn
    heavy = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\U0001f600" * 75_000}]
    state = sessions.to_state("k", heavy * 3, max_turns=10, max_bytes=1024 * 1024)
    assert state["turns"] == 1 and len(json.dumps(state, sort_keys=True).encode()) <= limit
    # a single turn larger than the limit is shortened (marked), never refused by the kernel
    huge = [{"role": "user", "content": "\"" * 700_000}, {"role": "assistant", "content": "é" * 400_000}]
    state = sessions.to_state("k", huge, max_turns=10, max_bytes=1024 * 1024)
    size = len(json.dumps(state, sort_keys=True).encode())
    assert size <= limit and size > limit // 2
    assert all(m["content"].endswith("[shortened to fit the session state]") for m in state["messages"])


# -- recover -----------------------------------------------------------------------------------------


def _recovery(handle: dict | None) -> RecoveryRequest:
    return RecoveryRequest(run_id="r", job_id="j", handle=handle, owner="h:1:x", owner_host=socket.gethostname())


def test_recover_is_honest() -> None:
    ex = AgentExecutor()
    assert ex.recover(_recovery(None)).state == "gone"
    assert "recover" not in ex.capabilities  # it cannot stop a remote turn, so it does not promise to
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alive = {"kind": "agent-turn", "host": socket.gethostname(), "pid": child.pid,
                 "process_identity": process_identity(child.pid)}
        blocked = ex.recover(_recovery(alive))
        assert blocked.state == "blocked" and str(child.pid) in blocked.detail
    finally:
        child.kill()
        child.wait()
    gone = ex.recover(_recovery(alive))
    assert gone.state == "unknown" and "cannot be checked" in gone.detail
    reused = ex.recover(_recovery({**alive, "pid": os.getpid(), "process_identity": "ticks:1"}))
    assert reused.state == "unknown"
    elsewhere = ex.recover(_recovery({"kind": "agent-turn", "host": "other-host", "pid": 1}))
    assert elsewhere.state == "unknown" and "other-host" in elsewhere.detail


def test_the_model_fixture_never_leaves_the_loopback_interface(model) -> None:
    assert model.base_url.startswith("http://127.0.0.1:")
    model.enqueue(Reply())
