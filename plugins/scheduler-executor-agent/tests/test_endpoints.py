"""Agent endpoints that are not OpenClaw (issue 31 item 2): no capability probe on a plain turn, ``/health`` read
only for a declared gateway, failed probes cached for the TTL, and the ``thinking_mapping`` of an endpoint.

Against the plugin's loopback stand-in (every request it gets is recorded), and against a real OpenAI-compatible
server, LiteLLM's proxy with a ``mock_response`` model on loopback (no network), installed by ``.ci/run`` into
``.venv-litellm``; those tests skip, saying so, where that venv is absent. What reached LiteLLM is read from its
access log (uvicorn's, one line per request with method and path).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from scheduler_executor_agent import AgentExecutor
from scheduler_executor_agent.gateway import CapabilityCache
from scheduler_toolkit.types import CredentialPresentation

from scheduler.api import SchedulerError

SECRET = CredentialPresentation(name="deploy", medium="env", key="DEPLOY_TOKEN", value="tok-123")
REPO = Path(__file__).resolve().parents[3]
LITELLM = Path(os.environ.get("SCHEDULER_TEST_LITELLM_VENV", REPO / ".venv-litellm")) / "bin" / "litellm"
MASTER_KEY = "sk-litellm-test-master"


def _gets(model) -> list[str]:
    return [r.path for r in model.requests if r.method == "GET"]


# -- capability discovery (loopback stand-in) ----------------------------------------------------------------------


def test_a_plain_turn_sends_no_capability_probe(model, run_turn) -> None:
    ran = run_turn()
    assert ran.result.status == "ok"
    assert [r.path for r in model.requests] == ["/v1/chat/completions"]  # no /v1/info, no /health
    assert "gateway" not in ran.result.details and run_turn.executor.gateways.fetches == 0


def test_health_is_never_read_on_an_endpoint_not_declared_a_gateway(model, run_turn) -> None:
    model.info = None  # 404: a plain OpenAI-compatible server
    model.health = {"capabilities": ["chat-completions-env-inject-v1"]}
    ran = run_turn(credentials=(SECRET,))
    assert ran.result.error_code == "GATEWAY_ENV_INJECT_UNSUPPORTED" and model.chat_requests() == []
    assert _gets(model) == ["/v1/info"]


def test_capability_discovery_off_never_probes(model, run_turn, settings_file) -> None:
    settings_file('[executors.agent]\ncapability_discovery = { default = "off" }\ngateway_endpoints = ["default"]\n')
    model.info = {"capabilities": ["chat-completions-env-inject-v1"]}
    ran = run_turn(credentials=(SECRET,))
    assert ran.result.error_code == "GATEWAY_ENV_INJECT_UNSUPPORTED" and "capability discovery is off" in ran.result.error_message
    assert model.requests == []  # nothing at all reached the endpoint
    assert run_turn(executor_options={"thinking": "low"}).result.status == "ok"
    assert _gets(model) == []


def test_a_failed_probe_is_cached_as_long_as_a_declaration() -> None:
    with socket.socket() as s:  # a port nobody listens on: every probe fails to connect
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    now = [1000.0]
    cache = CapabilityCache(clock=lambda: now[0])
    url = f"http://127.0.0.1:{port}/v1"
    for at in (1000.0, 1031.0, 1299.0):  # 30 s used to be the failure's TTL
        now[0] = at
        assert cache.get(url, headers={}, ttl_s=300, timeout_s=0.5, need="x").source == "none"
    assert cache.fetches == 1
    now[0] = 1301.0
    cache.get(url, headers={}, ttl_s=300, timeout_s=0.5, need="x")
    assert cache.fetches == 2


def test_bad_discovery_and_thinking_settings_are_config_invalid(settings_file) -> None:
    from scheduler_executor_agent.settings import resolve_settings

    for text, key in (('capability_discovery = { default = "sometimes" }', "capability_discovery"),
                      ('thinking_mapping = { default = "maybe" }', "thinking_mapping"),
                      ('gateway_endpoints = ["Not A Name"]', "gateway_endpoints")):
        settings_file(f"[executors.agent]\n{text}\n")
        with pytest.raises(SchedulerError) as caught:
            resolve_settings()
        assert caught.value.code == "CONFIG_INVALID" and key in caught.value.message


# -- thinking_mapping (loopback stand-in) --------------------------------------------------------------------------


def test_thinking_send_is_the_default(model, run_turn, settings_file) -> None:
    settings_file('[executors.agent]\nthinking_mapping = { default = "send" }\n')
    assert run_turn(executor_options={"thinking": "medium"}).result.status == "ok"
    assert model.chat_requests()[0].body["reasoning_effort"] == "medium"


def test_thinking_drop_sends_nothing_and_warns(model, run_turn, settings_file) -> None:
    settings_file('[executors.agent]\nthinking_mapping = { default = "drop" }\n')
    ran = run_turn(executor_options={"thinking": "high"})
    assert ran.result.status == "ok"
    (seen,) = model.chat_requests()
    assert "reasoning_effort" not in seen.body and "thinking" not in seen.body
    assert "thinking 'high' was not sent" in ran.result.details["warnings"][0]
    warnings = [data for kind, data in ran.control.events if kind == "agent.warning"]
    assert [w["code"] for w in warnings] == ["AGENT_THINKING_DROPPED"]


def _refused_at_add_then_at_run(settings_file, artifacts_root: Path) -> tuple[str, object]:
    """With ``refuse``: the job is refused when it is validated (add); one added before the setting fails at run."""
    from scheduler.testing import LocalRunControl, make_request

    settings_file('[executors.agent]\nthinking_mapping = { default = "refuse" }\n')
    with pytest.raises(SchedulerError) as caught:
        make_request("Say hello.", artifacts_root=artifacts_root, session_target="isolated",
                     executor_options={"thinking": "low"})
    assert caught.value.code == "VALIDATION_FAILED"
    assert [d["code"] for d in caught.value.details] == ["AGENT_THINKING_UNSUPPORTED"]
    settings_file("")  # the job was added before the operator set refuse
    request = make_request("Say hello.", artifacts_root=artifacts_root, session_target="isolated",
                           executor_options={"thinking": "low"})
    settings_file('[executors.agent]\nthinking_mapping = { default = "refuse" }\n')
    result = AgentExecutor().execute(request, LocalRunControl())
    return result.error_code or "", result


def test_thinking_refuse_is_refused_at_add_and_at_run(model, run_turn, settings_file, artifacts_root) -> None:
    from scheduler_executor_agent.options import AgentOptions

    settings_file('[executors.agent]\nthinking_mapping = { default = "refuse" }\n')
    problems = AgentExecutor().check_job(AgentOptions(thinking="low"), None)
    assert [p["code"] for p in problems] == ["AGENT_THINKING_UNSUPPORTED"]
    assert AgentExecutor().check_job(AgentOptions(), None) == []
    code, result = _refused_at_add_then_at_run(settings_file, artifacts_root)
    assert (result.status, code) == ("error", "AGENT_THINKING_UNSUPPORTED")
    assert model.requests == []
    assert run_turn().result.status == "ok"  # a job without thinking is fine there


# -- a real OpenAI-compatible server: LiteLLM's proxy ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiteLLM:
    """A running LiteLLM proxy on loopback and its access log."""

    def __init__(self, base_url: str, log: Path) -> None:
        self.base_url, self.log = base_url, log

    def paths(self) -> list[str]:
        """``METHOD /path`` of each request the proxy logged."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if '" ' in line and ' - "' in line:
                request = line.split(' - "', 1)[1].split('"', 1)[0]  # GET /health HTTP/1.1
                method, path, _ = (request.split(" ") + ["", ""])[:3]
                out.append(f"{method} {path.split('?')[0]}")
        return out


@pytest.fixture(scope="module")
def litellm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiteLLM]:
    """LiteLLM's proxy with model ``mock-small`` (``mock_response``: no upstream, no network) on a loopback port."""
    if not LITELLM.exists():
        pytest.skip(f"LiteLLM's proxy is not installed ({LITELLM} absent; .ci/run installs it into .venv-litellm)")
    work = tmp_path_factory.mktemp("litellm")
    config = work / "config.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: mock-small\n"
        "    litellm_params:\n"
        "      model: openai/mock-small\n"
        "      api_key: sk-not-used\n"
        "      mock_response: \"Hello from LiteLLM's mock model.\"\n"
        f"general_settings:\n  master_key: {MASTER_KEY}\n")
    port = _free_port()
    log = work / "proxy.log"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_PROXY": "*", "HOME": str(work)}
    with log.open("wb") as out:
        proc = subprocess.Popen([str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=work)
    try:
        import httpx

        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"LiteLLM's proxy exited {proc.returncode} at start-up:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"LiteLLM's proxy did not start in 90 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield LiteLLM(f"http://127.0.0.1:{port}/v1", log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def on_litellm(litellm: LiteLLM, monkeypatch: pytest.MonkeyPatch) -> LiteLLM:
    monkeypatch.setenv("SCHEDULER_AGENT_BASE_URL", litellm.base_url)
    monkeypatch.setenv("SCHEDULER_AGENT_MODEL", "mock-small")
    monkeypatch.setenv("SCHEDULER_AGENT_API_KEY", MASTER_KEY)
    return litellm


def _wait_logged(litellm: LiteLLM, count: int) -> list[str]:
    deadline = time.monotonic() + 5
    while len(paths := [p for p in litellm.paths() if not p.endswith("/health/liveliness")]) < count:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return paths


@pytest.mark.parametrize("stream", [True, False])
def test_a_litellm_turn_sends_no_probe(on_litellm, run_turn, stream) -> None:
    before = len(_wait_logged(on_litellm, 0))
    ran = run_turn(executor_options={"stream": stream})
    r = ran.result
    assert (r.status, r.error_code) == ("ok", None), r.error_message
    assert r.stdout.excerpt == "Hello from LiteLLM's mock model." and r.details["streamed"] is stream
    assert r.usage["prompt_tokens"] and r.usage["estimated"] is False
    assert _wait_logged(on_litellm, before + 1)[before:] == ["POST /v1/chat/completions"]
    assert ran.elapsed < 3.0  # what issue 31 saw was 3.4-8.0 s: the /health probe's timeout


@pytest.mark.parametrize("mapping", ["send", "drop", "refuse"])
def test_thinking_under_each_mapping_on_litellm(on_litellm, run_turn, settings_file, artifacts_root, mapping) -> None:
    before = len(_wait_logged(on_litellm, 0))
    if mapping == "refuse":
        code, _ = _refused_at_add_then_at_run(settings_file, artifacts_root)
        assert code == "AGENT_THINKING_UNSUPPORTED"
        time.sleep(0.2)
        assert _wait_logged(on_litellm, before)[before:] == []  # refused before anything was sent
        return
    settings_file(f'[executors.agent]\nthinking_mapping = {{ default = "{mapping}" }}\n')
    ran = run_turn(executor_options={"thinking": "high"})
    r = ran.result
    assert (r.status, r.error_code) == ("ok", None), r.error_message
    assert r.stdout.excerpt == "Hello from LiteLLM's mock model."
    assert ("warnings" in r.details) is (mapping == "drop")
    assert _wait_logged(on_litellm, before + 1)[before:] == ["POST /v1/chat/completions"]


def test_env_credentials_on_litellm_probe_v1_info_only_and_send_nothing(on_litellm, run_turn) -> None:
    before = len(_wait_logged(on_litellm, 0))
    r = run_turn(credentials=(SECRET,)).result
    assert r.error_code == "GATEWAY_ENV_INJECT_UNSUPPORTED" and r.details["gateway"]["source"] == "none"
    assert _wait_logged(on_litellm, before + 1)[before:] == ["GET /v1/info"]  # never /health, never the chat
