"""Credentials on a job: bindings refused at add, and presented to real shell commands through a real dispatcher.

Every run here goes through ``Dispatcher._execute`` with the shell executor (real
subprocesses), on SQLite and PostgreSQL. Values come from the real ``env`` provider
(``scheduler-provider-local``) or from the side-loaded ``testcred`` provider
(``tests/support/scheduler-credential-testkit``), whose ref says how it answers. The
commands compare the value they were given instead of printing it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import TERMINAL, add_job, run_job_once, run_rows, wait_for

from scheduler.base.errors import SchedulerError
from scheduler.core.queue import enqueue_manual

REPO = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-Cred-7Q"


@pytest.fixture(scope="module")
def _sideloaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    from kernel_testing import sideloaded

    with sideloaded(REPO / "tests" / "support" / "scheduler-credential-testkit", into=tmp_path_factory.mktemp("site")) as paths:
        yield paths


@pytest.fixture(autouse=True)
def testcred(_sideloaded: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """``testcred`` is visible; provider caches are fresh; file presentations go to a directory of this test."""
    from scheduler.pipeline.credentials import step as credentials
    from scheduler.plugins import options as plugin_options

    credentials.forget_providers()
    plugin_options._misses.clear()
    plugin_options._validators.clear()
    cred_dir = tmp_path / "cred-dir"
    cred_dir.mkdir()
    monkeypatch.setenv(credentials.DIR_ENV, str(cred_dir))
    monkeypatch.setenv("CRED_SRC", SECRET)
    yield cred_dir
    credentials.forget_providers()
    assert list(cred_dir.iterdir()) == [], "a credential file or directory was left behind"


def binding(name: str = "tok", provider: str = "env", ref: str = "CRED_SRC", medium: str = "env", **extra: Any) -> dict[str, Any]:
    present: dict[str, Any] = {"medium": medium}
    if medium == "env":
        present["key"] = extra.pop("key", "API_TOKEN")
    if "file_name" in extra:
        present["file_name"] = extra.pop("file_name")
    return {"name": name, "provider": provider, "ref": ref, "present": present, **extra}


def run_once(store: Any, dispatcher: Any, command: str, bindings: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """Add a shell job with ``bindings``, run it once through a real dispatcher, return its finished run."""
    job = add_job(store, executor="shell", payload_message=command, credentials=bindings, **spec)
    return run_job_once(store, dispatcher, job)


def presentations(store: Any, run_id: str) -> list[dict[str, Any]]:
    with store.read() as tx:
        return tx.all("SELECT * FROM credential_presentations WHERE run_id = ? ORDER BY binding_name", (run_id,))


def events(store: Any, run_id: str) -> list[dict[str, Any]]:
    with store.read() as tx:
        return tx.all("SELECT kind, data FROM runtime_events WHERE run_id = ? ORDER BY id", (run_id,))


def digest(value: str) -> str:
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()


# -- refused at add -----------------------------------------------------------------------------------------------


def _refused(spec_bindings: list[dict[str, Any]], **spec: Any) -> list[dict[str, Any]]:
    from scheduler.core.spec import validate_spec

    with pytest.raises(SchedulerError) as info:
        validate_spec({"name": "j", "schedule_kind": "manual", "payload_message": "true", "executor": "shell",
                       "credentials": spec_bindings, **spec})
    assert info.value.code == "VALIDATION_FAILED"
    return info.value.details


@pytest.mark.parametrize("key", ["PATH", "path", "LD_PRELOAD", "DYLD_INSERT_LIBRARIES", "PYTHONPATH", "BASH_ENV", "ENV", "IFS",
                                 "HOME", "SHELL", "SCHEDULER_RUN_ID", "CREDENTIAL_TOK_FILE", "LC_ALL", "BASH_FUNC_x%%"])
def test_a_reserved_environment_key_is_refused(key: str) -> None:
    details = _refused([binding(key=key)])
    codes = {d["code"] for d in details}
    assert codes <= {"CREDENTIAL_ENV_KEY_RESERVED", "CREDENTIAL_BINDING_INVALID"} and codes, details
    if key.replace("_", "").isalnum():
        assert codes == {"CREDENTIAL_ENV_KEY_RESERVED"}


def test_duplicates_and_media_that_cannot_mix_are_refused() -> None:
    details = _refused([binding("a"), binding("A", key="OTHER"), binding("b", key="API_TOKEN"),
                        binding("c", medium="stdin"), binding("d", medium="stdin"),
                        binding("e", medium="file", file_name="x"), binding("f", medium="file", file_name="x")])
    got = {(d["field"], d["code"]) for d in details}
    assert ("credentials[1].name", "CREDENTIAL_DUPLICATE") in got
    assert ("credentials[2].present", "CREDENTIAL_DUPLICATE") in got  # API_TOKEN twice
    assert ("credentials[4].present.medium", "CREDENTIAL_MEDIA_CONFLICT") in got
    assert ("credentials[6].present.file_name", "CREDENTIAL_DUPLICATE") in got
    # a file binding's CREDENTIAL_<NAME>_FILE cannot be taken by an env binding either (it is reserved)
    assert {d["code"] for d in _refused([binding("tok", medium="file"), binding("x", key="CREDENTIAL_TOK_FILE")])} == {
        "CREDENTIAL_ENV_KEY_RESERVED"}


@pytest.mark.parametrize("bad,field", [
    ({"name": "t", "provider": "env", "ref": "X", "present": {"medium": "env", "key": "K"}, "value": "s"}, "credentials[0].value"),
    ({"name": "1t", "provider": "env", "ref": "X", "present": {"medium": "env", "key": "K"}}, "credentials[0].name"),
    ({"name": "t", "provider": "env", "ref": "X", "present": {"medium": "pipe"}}, "credentials[0].present.medium"),
    ({"name": "t", "provider": "env", "ref": "X", "present": {"medium": "env"}}, "credentials[0].present.key"),
    ({"name": "t", "provider": "env", "ref": "X", "present": {"medium": "stdin", "key": "K"}}, "credentials[0].present.key"),
    ({"name": "t", "provider": "env", "ref": "X", "present": {"medium": "file", "file_name": "../x"}}, "credentials[0].present.file_name"),
    ({"name": "t", "provider": "env", "ref": "", "present": {"medium": "stdin"}}, "credentials[0].ref"),
    ("tok", "credentials[0]"),
])
def test_a_malformed_binding_is_refused_naming_its_field(bad: Any, field: str) -> None:
    assert field in {d["field"] for d in _refused([bad])}


def test_stdin_credential_and_stdin_text_conflict() -> None:
    details = _refused([binding(medium="stdin")], executor_options={"stdin_text": "hello"})
    assert ("credentials", "CREDENTIAL_MEDIA_CONFLICT") in {(d["field"], d["code"]) for d in details}


def test_an_executor_without_the_medium_capability_and_the_main_session_are_refused() -> None:
    details = _refused([binding()], executor="testkit")  # testkit declares no credentials-* capability
    assert ("credentials[0].present.medium", "CREDENTIAL_MEDIUM_UNSUPPORTED") in {(d["field"], d["code"]) for d in details}
    details = _refused([binding()], session_target="main", executor=None)
    assert "CREDENTIAL_MEDIUM_UNSUPPORTED" in {d["code"] for d in details}


def test_the_cli_refuses_and_stores_nothing(cli: Any) -> None:
    job = {"name": "cred", "schedule_kind": "manual", "payload_message": "true", "credentials": [binding(key="LD_PRELOAD")]}
    out = cli("--json", "jobs", "add", json.dumps(job))
    assert out.code != 0 and out.json["code"] == "VALIDATION_FAILED"
    assert out.json["details"][0]["code"] == "CREDENTIAL_ENV_KEY_RESERVED"
    missing = {**job, "credentials": [binding(provider="nosuchprovider")]}
    out = cli("--json", "jobs", "add", json.dumps(missing))
    assert out.json["code"] == "CREDENTIAL_NOT_AVAILABLE" and out.json["details"][0]["field"] == "credentials[0].provider"
    assert cli("--json", "jobs", "validate", json.dumps(missing)).json["code"] == "CREDENTIAL_NOT_AVAILABLE"
    assert cli("--json", "jobs", "list").json["jobs"] == []
    ok = cli("--json", "jobs", "add", json.dumps({**job, "credentials": [binding()]}))
    assert ok.code == 0, ok
    stored = ok.json["job"]["credentials"]  # JSON columns print as JSON values, like executor_options
    assert stored == [{"name": "tok", "provider": "env", "ref": "CRED_SRC", "present": {"medium": "env", "key": "API_TOKEN"},
                       "required": True}]


def test_bindings_enter_the_artifact_and_a_job_without_them_keeps_its_digest() -> None:
    from scheduler.core.artifact import execution_sections
    from scheduler.core.spec import validate_spec

    base = {"name": "j", "schedule_kind": "manual", "payload_message": "true", "executor": "shell"}
    plain = execution_sections(validate_spec(base))["credential_presentation"]
    assert plain == {"bindings": []}
    bound = execution_sections(validate_spec({**base, "credentials": [binding()], "child_credential_policy": "inherit"}))
    assert bound["credential_presentation"]["bindings"][0]["ref"] == "CRED_SRC"
    assert bound["credential_presentation"]["child_policy"] == "inherit"


# -- presented to real commands ------------------------------------------------------------------------------------


def test_env_file_and_stdin_reach_the_command_and_are_cleaned(store: Any, dispatcher: Any, testcred: Path) -> None:
    command = (
        'test "$API_TOKEN" = "$EXPECT" || exit 11; '
        'test "$(cat "$CREDENTIAL_KEYFILE_FILE")" = "$EXPECT" || exit 12; '
        'echo "$CREDENTIAL_KEYFILE_FILE"; stat -c %a "$CREDENTIAL_KEYFILE_FILE" "$(dirname "$CREDENTIAL_KEYFILE_FILE")"; '
        'read -r line; test "$line" = "$EXPECT" || exit 13; echo all-good'
    )
    run = run_once(store, dispatcher, command.replace("$EXPECT", SECRET), [
        binding("tok"), binding("keyfile", provider="testcred", ref=f"value:{SECRET}", medium="file", file_name="key.pem"),
        binding("pipe", provider="testcred", ref=f"value:{SECRET}", medium="stdin")])
    assert run["status"] == "ok", run
    path, modes, done = run["stdout_excerpt"].strip().split("\n", 1)[0], run["stdout_excerpt"].split("\n")[1:3], "all-good"
    assert modes == ["600", "700"] and done in run["stdout_excerpt"]
    assert Path(path).name == "key.pem" and Path(path).parent.parent == testcred
    assert not Path(path).exists() and not Path(path).parent.exists()
    rows = presentations(store, run["id"])
    assert [(r["binding_name"], r["medium"], r["status"]) for r in rows] == [
        ("keyfile", "file", "cleaned"), ("pipe", "stdin", "cleaned"), ("tok", "env", "cleaned")]
    assert {r["presented_sha256"] for r in rows} == {digest(SECRET)}
    assert rows[0]["temp_path"] == str(Path(path).parent) and rows[0]["env_key"] == "CREDENTIAL_KEYFILE_FILE"
    assert rows[2]["env_key"] == "API_TOKEN" and all(r["cleaned_at"] for r in rows)
    summary = json.loads(run["credentials_json"])
    assert (summary["presented"], summary["skipped"], summary["cleanup"]) == (3, 0, "cleaned")
    kinds = [e["kind"] for e in events(store, run["id"])]
    assert "credential.materialized" in kinds and "credential.cleaned" in kinds
    assert SECRET not in json.dumps([dict(r) for r in rows]) + run["credentials_json"] + json.dumps(events(store, run["id"]))


@pytest.mark.parametrize("ref,code", [
    ("fail", "CREDENTIAL_NOT_FOUND"),
    ("crash", "CREDENTIAL_RESOLVE_FAILED"),
    ("other-error", "CREDENTIAL_RESOLVE_FAILED"),
    ("not-a-credential", "CREDENTIAL_RESOLVE_FAILED"),
    (f"mismatch:{SECRET}", "CREDENTIAL_BINDING_MISMATCH"),
    (f"unbound:{SECRET}", "CREDENTIAL_BINDING_MISMATCH"),
    (f"wrong-medium:{SECRET}", "CREDENTIAL_BINDING_MISMATCH"),
    (f"expired:{SECRET}", "CREDENTIAL_EXPIRED"),
    ("bytes:00ff10", "CREDENTIAL_VALUE_INVALID"),  # binary is for files only
])
def test_a_failing_required_credential_ends_the_run_before_the_command(
    store: Any, dispatcher: Any, tmp_path: Path, ref: str, code: str
) -> None:
    marker = tmp_path / "started"
    run = run_once(store, dispatcher, f"touch {marker}",
                   [binding("good", provider="testcred", ref=f"value:{SECRET}", medium="file"),
                    binding("bad", provider="testcred", ref=ref, key="BAD_TOKEN")])
    assert (run["status"], run["error_code"]) == ("error", code), run
    assert not marker.exists()
    assert presentations(store, run["id"]) == []  # nothing was materialised: the good one was not written either
    summary = json.loads(run["credentials_json"])
    assert [(b["name"], b["status"]) for b in summary["bindings"]] == [("good", "presented"), ("bad", "failed")]
    assert ("credential.failed" in [e["kind"] for e in events(store, run["id"])])


def test_an_optional_credential_that_fails_is_skipped_and_recorded(store: Any, dispatcher: Any) -> None:
    run = run_once(store, dispatcher, 'test -z "${MAYBE:-}" && test "$API_TOKEN" = "$(printf %s s3cr3t-Cred-7Q)"',
                   [binding(), binding("maybe", provider="testcred", ref="fail", key="MAYBE", required=False)])
    assert run["status"] == "ok", run
    summary = json.loads(run["credentials_json"])
    assert [(b["name"], b["status"], b.get("error_code")) for b in summary["bindings"]] == [
        ("tok", "presented", None), ("maybe", "skipped", "CREDENTIAL_NOT_FOUND")]
    assert [r["binding_name"] for r in presentations(store, run["id"])] == ["tok"]
    assert "credential.skipped" in [e["kind"] for e in events(store, run["id"])]


def test_a_provider_that_hangs_is_bounded_by_the_run_timeout(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    import time

    marker = tmp_path / "started"
    began = time.monotonic()
    run = run_once(store, dispatcher, f"touch {marker}", [binding(provider="testcred", ref=f"sleep:20:{SECRET}")],
                   run_timeout_ms=1500)
    assert (run["status"], run["error_code"]) == ("error", "CREDENTIAL_RESOLVE_TIMEOUT"), run
    assert time.monotonic() - began < 15 and not marker.exists()


def test_a_provider_not_installed_at_run_time_fails_closed(store: Any, dispatcher: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_DISABLE_PLUGINS", "credential_providers:testcred")
    from scheduler.core.jobs import create_jobs
    from scheduler.core.spec import validate_spec

    spec = validate_spec({"name": "late", "schedule_kind": "manual", "executor": "shell", "payload_message": "true",
                          "credentials": [binding(provider="testcred", ref=f"value:{SECRET}")]})
    job = create_jobs(store, [spec])[0]
    enqueue_manual(store, job.id)
    d = dispatcher()
    try:
        (run,) = wait_for(lambda: [r for r in run_rows(store, job.id) if r["status"] in TERMINAL], timeout=30)
    finally:
        d.stop()
    assert (run["status"], run["error_code"]) == ("error", "CREDENTIAL_NOT_AVAILABLE")


def _running_with_file(store: Any, job_id: str, cred_dir: Path) -> dict[str, Any]:
    def ready() -> Any:
        runs = [r for r in run_rows(store, job_id) if r["status"] == "running"]
        return runs and any(cred_dir.iterdir()) and presentations(store, runs[0]["id"]) and runs[0]

    return wait_for(ready, timeout=20, what="a running run with its credential file")


def test_cancellation_and_run_timeout_remove_the_files(store: Any, dispatcher: Any, testcred: Path) -> None:
    from scheduler.core.cancel import cancel_run

    bindings = [binding("keyfile", provider="testcred", ref=f"value:{SECRET}", medium="file"), binding()]
    job = add_job(store, executor="shell", payload_message="sleep 30", credentials=bindings)
    timed = add_job(store, executor="shell", payload_message="sleep 30", credentials=bindings, run_timeout_ms=1500)
    d = dispatcher()
    try:
        enqueue_manual(store, job["id"])
        run = _running_with_file(store, job["id"], testcred)
        assert presentations(store, run["id"])[0]["status"] == "materialized"
        cancel_run(store, run["id"], reason="test")
        (done,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] in TERMINAL], timeout=20)
        assert done["status"] == "cancelled"
        wait_for(lambda: not any(testcred.iterdir()), timeout=10, what="the file to be removed")
        enqueue_manual(store, timed["id"])
        (late,) = wait_for(lambda: [r for r in run_rows(store, timed["id"]) if r["status"] in TERMINAL], timeout=20)
        assert late["status"] == "timeout"
    finally:
        d.stop()
    for r in (done, late):
        assert {p["status"] for p in presentations(store, r["id"])} == {"cleaned"}
    assert not any(testcred.iterdir())


def test_a_job_without_credentials_writes_no_presentation_and_no_summary(store: Any, dispatcher: Any) -> None:
    run = run_once(store, dispatcher, "true", [])
    assert run["status"] == "ok" and run["credentials_json"] is None
    assert presentations(store, run["id"]) == []


def test_redactions_of_gives_every_presented_value() -> None:
    from scheduler.core.execution import CredentialPresentation
    from scheduler.pipeline.credentials.step import redactions_of

    got = redactions_of((CredentialPresentation(name="a", medium="env", key="A", value="x1"),
                         CredentialPresentation(name="b", medium="file", key="CREDENTIAL_B_FILE", path="/p", value=b"\x00\xff")))
    assert got == (("a", b"x1"), ("b", b"\x00\xff"))


# -- settings references through credential providers ------------------------------------------------------------


def test_a_settings_reference_scheme_is_loaded_from_its_entry_point_only_when_used(tmp_path: Path) -> None:
    """``{credential = "command:NAME"}`` resolves through scheduler-provider-local's ``command`` scheme, which the
    kernel loads by entry point the first time a reference names it (a fresh process: nothing registered before)."""
    import subprocess
    import sys
    import textwrap

    config = tmp_path / "config.toml"
    config.write_text(f'[providers.command.commands]\nmytoken = "/bin/echo {SECRET}"\n')
    script = textwrap.dedent("""
        import sys
        from scheduler.settings import secret
        assert "command" not in secret.secret_schemes() and "scheduler_provider_local" not in sys.modules
        ref = secret.SecretRef.parse("env:HOME")  # a built-in scheme loads nothing
        assert "scheduler_provider_local" not in sys.modules
        ref = secret.SecretRef.parse("command:mytoken")
        value = ref.resolve()
        try:
            secret.SecretRef.parse("nosuchscheme:x")
        except ValueError:
            pass
        else:
            raise SystemExit("an unknown scheme was accepted")
        print("ok", value == sys.argv[1], "command" in secret.secret_schemes())
    """)
    env = {**os.environ, "SCHEDULER_CONFIG": str(config)}
    out = subprocess.run([sys.executable, "-c", script, SECRET], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "True", "True"]
    disabled = subprocess.run([sys.executable, "-c", script, SECRET], capture_output=True, text=True, timeout=60,
                              env={**env, "SCHEDULER_DISABLE_PLUGINS": "secret_schemes:command"})
    assert disabled.returncode != 0 and "known schemes" in disabled.stderr  # switched off: the reference is refused


# -- chain children -------------------------------------------------------------------------------------------------


def _chain(store: Any, dispatcher: Any, policy: str, child_bindings: list[dict[str, Any]], child_command: str) -> dict[str, Any]:
    parent = add_job(store, executor="shell", payload_message="true", credentials=[binding()], child_credential_policy=policy)
    child = add_job(store, executor="shell", schedule_kind="chain", parent_id=parent["id"], payload_message=child_command,
                    credentials=child_bindings)
    enqueue_manual(store, parent["id"])
    d = dispatcher()
    try:
        (run,) = wait_for(lambda: [r for r in run_rows(store, child["id"]) if r["status"] in TERMINAL], timeout=30,
                          what="the chained child")
    finally:
        d.stop()
    return run


SHA_CHECK = f'printf %s "$API_TOKEN" | sha256sum | grep -q {hashlib.sha256(SECRET.encode()).hexdigest()}'


def test_inherit_gives_the_child_its_parents_credentials(store: Any, dispatcher: Any) -> None:
    run = _chain(store, dispatcher, "inherit", [], SHA_CHECK)
    assert run["status"] == "ok", run
    assert [r["binding_name"] for r in presentations(store, run["id"])] == ["tok"]
    assert "credential.inherited" in [e["kind"] for e in events(store, run["id"])]


def test_none_and_independent_give_the_child_nothing_of_its_parent(store: Any, dispatcher: Any) -> None:
    for policy in ("none", "independent"):
        run = _chain(store, dispatcher, policy, [], 'test -z "${API_TOKEN:-}"')
        assert run["status"] == "ok", (policy, run)
        assert presentations(store, run["id"]) == [] and run["credentials_json"] is None


def test_downscope_lets_the_child_use_only_what_the_parent_holds(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    run = _chain(store, dispatcher, "downscope", [binding(key="CHILD_TOKEN")], 'test -n "$CHILD_TOKEN"')
    assert run["status"] == "ok", run
    run = _chain(store, dispatcher, "downscope", [binding("other", provider="testcred", ref=f"value:{SECRET}", key="X_TOKEN")],
                 f"touch {marker}")
    assert (run["status"], run["error_code"]) == ("error", "CREDENTIAL_DOWNSCOPE_DENIED") and not marker.exists()


def test_inherit_refuses_a_name_bound_twice(store: Any, dispatcher: Any) -> None:
    run = _chain(store, dispatcher, "inherit", [binding(key="CHILD_TOKEN")], "true")
    assert (run["status"], run["error_code"]) == ("error", "CREDENTIAL_DUPLICATE")


def test_providers_see_the_identity_and_the_lineage_except_for_independent(store: Any, dispatcher: Any) -> None:
    import scheduler_credential_testkit as kit

    seen: dict[str, Any] = {}
    for policy in ("none", "independent"):
        kit.SEEN.clear()
        run = _chain(store, dispatcher, policy, [binding("own", provider="testcred", ref=f"value:{SECRET}", key="OWN")], "true")
        assert run["status"] == "ok", run
        (context,) = [c for c in kit.SEEN if c.run_id == run["id"]]
        seen[policy] = context
        assert context.identity is not None and context.job_id == run["job_id"]
    assert seen["none"].source_run_id is not None and seen["none"].source_job_id is not None
    assert seen["independent"].source_run_id is None and seen["independent"].source_job_id is None
