"""executor_options.env_policy / env_allow: what a job sees of the dispatcher's environment (real processes print their env)."""

from __future__ import annotations

import pytest
from scheduler_executor_shell.envpolicy import INHERIT_WARNING, build_environment, is_secret_name


def _env_names(stdout: str) -> dict[str, str]:
    """Parse ``env`` output (one ``NAME=value`` per line; continuation lines of multi-line values are skipped).

    Plain ``env`` rather than ``env -0``: output with NUL bytes is not text, so it is offloaded
    whole and its excerpt has the NULs replaced (see StreamRecorder).
    """
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


@pytest.fixture
def dispatcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Variables of the dispatcher's environment (monkeypatch restores os.environ afterwards)."""
    monkeypatch.setenv("MY_API_TOKEN", "s3cret")
    monkeypatch.setenv("SCHEDULER_X", "1")
    monkeypatch.setenv("HARMLESS", "1")
    monkeypatch.setenv("LC_TIME", "C")


def test_minimal_policy(run_job, dispatcher_env) -> None:
    r = run_job("env").result
    env = _env_names(r.stdout.excerpt)
    assert "MY_API_TOKEN" not in env and "SCHEDULER_X" not in env and "HARMLESS" not in env
    assert "s3cret" not in r.stdout.excerpt
    assert env["LC_TIME"] == "C" and "PATH" in env
    assert env["SCHEDULER_RUN_ID"] == "run-1" and env["SCHEDULER_JOB_ID"] == "job-1"  # kernel-provided
    assert r.env_warning is None


def test_inherit_policy(run_job, dispatcher_env) -> None:
    r = run_job("env", executor_options={"env_policy": "inherit"}).result
    env = _env_names(r.stdout.excerpt)
    assert env["HARMLESS"] == "1"
    assert "MY_API_TOKEN" not in env and "SCHEDULER_X" not in env
    assert "s3cret" not in r.stdout.excerpt
    assert env["SCHEDULER_RUN_ID"] == "run-1"
    assert r.env_warning == INHERIT_WARNING == "env_policy=inherit exposes the dispatcher's full environment"


@pytest.mark.parametrize(
    "name",
    [
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "DATABASE_URL",
        "PGPASSWORD",
        "my_api_token",
        "DB_PASSWORD",
        "SMTP_PASSWD",
        "STRIPE_APIKEY",
        "DEPLOY_PRIVATE_KEY",
        "APP_SECRET",
        "TOKEN",
    ],
)
def test_secret_names_are_stripped(name: str) -> None:
    assert is_secret_name(name)
    env, _ = build_environment("inherit", {name: "x", "KEEP": "1"})
    assert env == {"KEEP": "1"}


@pytest.mark.parametrize("name", ["PATH", "HOME", "PWD", "TOKENIZERS_PARALLELISM", "SECRETS_DIR_HINT", "KEYBOARD"])
def test_ordinary_names_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)


def test_minimal_allowlist() -> None:
    base = {"HOME": "/h", "PATH": "/bin", "LC_ALL": "C", "LANG": "C.UTF-8", "EDITOR": "vi", "SCHEDULER_DB": "x", "TERM": "xterm"}
    env, warning = build_environment("minimal", base)
    assert env == {"HOME": "/h", "PATH": "/bin", "LC_ALL": "C", "LANG": "C.UTF-8", "TERM": "xterm"}
    assert warning is None
    with pytest.raises(ValueError):
        build_environment("everything", base)


# Issue 9, defect 8: these passed through `inherit` before the pattern rules.
MISSED_BEFORE = {"MY_SERVICE_KEY": "k", "DB_PASS": "p", "STRIPE_SK": "sk_live", "SLACK_WEBHOOK": "https://hooks/x",
                 "GITHUB_PAT": "ghp_x", "DB_PASSPHRASE_FILE": "/x", "CI_JOB_TOKEN_V2": "t", "MYSQL_ROOT_PWD": "p"}


@pytest.mark.parametrize("name", sorted(MISSED_BEFORE))
def test_secret_name_patterns(name: str) -> None:
    assert is_secret_name(name)


def test_inherit_drops_pattern_secrets_and_url_passwords_in_a_real_process(run_job, monkeypatch) -> None:
    for name, value in MISSED_BEFORE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HTTP_PROXY", "http://alice:hunter2@proxy.local:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    monkeypatch.setenv("PLAIN_PROXY", "http://proxy.local:3128")
    r = run_job("env", executor_options={"env_policy": "inherit"}).result
    env = _env_names(r.stdout.excerpt)
    assert not set(MISSED_BEFORE) & set(env)
    assert "HTTP_PROXY" not in env and "hunter2" not in r.stdout.excerpt
    assert env["NO_PROXY"] == "localhost" and env["PLAIN_PROXY"] == "http://proxy.local:3128"


def test_env_allow_lets_named_variables_through(run_job, monkeypatch) -> None:
    monkeypatch.setenv("DEPLOY_KEY", "needed")
    monkeypatch.setenv("OTHER_KEY", "not needed")
    monkeypatch.setenv("EDITOR", "vi")
    r = run_job("env", executor_options={"env_allow": ["DEPLOY_KEY", "EDITOR"]}).result  # minimal + allow-list
    env = _env_names(r.stdout.excerpt)
    assert env["DEPLOY_KEY"] == "needed" and env["EDITOR"] == "vi" and "OTHER_KEY" not in env
