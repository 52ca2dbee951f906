"""Identity, trust and delegation through real dispatchers (SQLite and PostgreSQL) and the spec validator.

Every run records who it acted as (``runs.principal``, ``trust_level``, ``identity_json``) and so
does every event of the run written once its identity is known; chain children that delegate
derive their identity from the run that triggered them, and a refused delegation ends the run
``error`` with a ``DELEGATION_*`` code before its command starts (its marker file never appears).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kernel_testing import add_job, run_rows, wait_for

from scheduler.base.errors import SchedulerError
from scheduler.core.artifact import native_digest
from scheduler.core.queue import enqueue_manual
from scheduler.core.spec import validate_spec

TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")


def ident(kind: str | None = None, name: str | None = None, level: str | None = None, **delegation: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if kind:
        out["subject"] = {"kind": kind, "principal": name}
    if level:
        out["trust"] = {"level": level}
    if delegation:
        out["delegation"] = delegation
    return out


def finished(store: Any, job_id: str, count: int = 1, timeout: float = 15) -> list[dict[str, Any]]:
    return wait_for(lambda: (rows := [r for r in run_rows(store, job_id) if r["status"] in TERMINAL])
                    and len(rows) >= count and rows, timeout=timeout, what=f"{count} finished run(s)")


def events(store: Any, run_id: str) -> list[dict[str, Any]]:
    with store.read() as tx:
        return tx.all("SELECT kind, principal, trust_level, data FROM runtime_events WHERE run_id = ? ORDER BY id", (run_id,))


def shell_job(store: Any, marker: Path, **spec: Any) -> dict[str, Any]:
    return add_job(store, executor="shell", payload_message=f"touch {marker}", **spec)


# --------------------------------------------------------------------------- validation


def spec_with(identity: Any) -> dict[str, Any]:
    return {"name": "j", "schedule_kind": "manual", "payload_message": "true", "identity": identity}


def problems(identity: Any) -> list[tuple[str, str]]:
    with pytest.raises(SchedulerError) as err:
        validate_spec(spec_with(identity), plugin_options=False)
    assert err.value.code == "VALIDATION_FAILED"
    return [(d["field"], d["code"]) for d in err.value.details]


def test_a_declaration_is_normalised_with_its_defaults() -> None:
    spec = validate_spec(spec_with({"subject": {"kind": "service", "principal": "backup-bot"},
                                    "delegation": {"mode": "on-behalf-of", "allowed_delegators": ["job:*", "job:*", "service:a"]}}),
                         plugin_options=False)
    assert spec.identity == {"subject": {"kind": "service", "principal": "backup-bot"}, "trust": {"level": "user"},
                             "delegation": {"mode": "on-behalf-of", "max_depth": 1, "allowed_delegators": ["job:*", "service:a"]}}
    assert validate_spec(spec_with({}), plugin_options=False).identity == {
        "subject": None, "trust": {"level": "user"}, "delegation": {"mode": "none"}}
    assert validate_spec(spec_with(None), plugin_options=False).identity is None


@pytest.mark.parametrize(("identity", "expected"), [
    ("operator", [("identity", "IDENTITY_INVALID")]),
    ({"trust_level": "system"}, [("identity.trust_level", "IDENTITY_INVALID")]),
    ({"subject": {"kind": "service", "principal": "a", "name": "b"}}, [("identity.subject.name", "IDENTITY_INVALID")]),
    ({"subject": {"kind": "job", "principal": "other-job"}}, [("identity.subject.kind", "IDENTITY_INVALID")]),
    ({"subject": {"kind": "robot", "principal": "a"}}, [("identity.subject.kind", "IDENTITY_INVALID")]),
    ({"subject": {"kind": "user", "principal": "two words"}}, [("identity.subject.principal", "IDENTITY_INVALID")]),
    ({"subject": {"kind": "user"}}, [("identity.subject.principal", "IDENTITY_INVALID")]),
    ({"trust": {"level": "root"}}, [("identity.trust.level", "IDENTITY_INVALID")]),
    ({"trust": {"level": "user", "effective_level": "system"}}, [("identity.trust.effective_level", "IDENTITY_INVALID")]),
    ({"delegation": {"mode": "impersonation"}}, [("identity.delegation.mode", "DELEGATION_POLICY_INVALID")]),
    ({"delegation": {"mode": "inherit"}}, [("identity.delegation.allowed_delegators", "DELEGATION_POLICY_INVALID")]),
    ({"delegation": {"mode": "inherit", "allowed_delegators": []}},
     [("identity.delegation.allowed_delegators", "DELEGATION_POLICY_INVALID")]),
    ({"delegation": {"mode": "inherit", "allowed_delegators": ["bot"]}},
     [("identity.delegation.allowed_delegators[0]", "DELEGATION_POLICY_INVALID")]),
    ({"delegation": {"mode": "inherit", "allowed_delegators": ["*"], "max_depth": 0}},
     [("identity.delegation.max_depth", "DELEGATION_POLICY_INVALID")]),
    ({"delegation": {"mode": "inherit", "allowed_delegators": ["*"], "max_depth": 11}},
     [("identity.delegation.max_depth", "DELEGATION_POLICY_INVALID")]),
    ({"delegation": {"mode": "none", "max_depth": 2}}, [("identity.delegation.max_depth", "DELEGATION_POLICY_INVALID")]),
    ({"delegation": {"mode": "inherit", "allowed_delegators": ["*"], "require_grant_per_hop": True}},
     [("identity.delegation.require_grant_per_hop", "DELEGATION_POLICY_INVALID")]),
    ({"subject": {"kind": "service", "principal": "x" * 40000}}, [("identity", "IDENTITY_INVALID")]),
])
def test_a_bad_declaration_is_refused_with_a_stable_code(identity: Any, expected: list[tuple[str, str]]) -> None:
    assert problems(identity) == expected


def test_every_problem_is_reported_at_once() -> None:
    found = problems({"x": 1, "subject": {"kind": "robot", "principal": ""}, "delegation": {"mode": "inherit"}})
    assert found == [("identity.x", "IDENTITY_INVALID"), ("identity.subject.kind", "IDENTITY_INVALID"),
                     ("identity.subject.principal", "IDENTITY_INVALID"),
                     ("identity.delegation.allowed_delegators", "DELEGATION_POLICY_INVALID")]


def test_the_declaration_is_part_of_the_execution_artifact() -> None:
    plain = validate_spec({"name": "j", "schedule_kind": "manual", "payload_message": "true"}, plugin_options=False)
    declared = validate_spec(spec_with({"trust": {"level": "operator"}}), plugin_options=False)
    higher = validate_spec(spec_with({"trust": {"level": "system"}}), plugin_options=False)
    digests = {native_digest(s, "job-1") for s in (plain, declared, higher)}
    assert len(digests) == 3


def test_a_bad_declaration_stores_nothing(store: Any) -> None:
    with pytest.raises(SchedulerError):
        add_job(store, name="bad", payload_message="ok", identity={"trust": {"level": "root"}})
    with store.read() as tx:
        assert tx.scalar("SELECT COUNT(*) FROM jobs") == 0


# --------------------------------------------------------------------------- resolution on every run


def test_a_job_without_identity_acts_as_itself_at_user(store: Any, dispatcher: Any) -> None:
    job = add_job(store, name="plain", payload_message="echo:hi")
    dispatcher()
    enqueue_manual(store, job["id"])
    (run,) = finished(store, job["id"])
    assert run["status"] == "ok"
    assert run["principal"] == "job:plain" and run["trust_level"] == "user" and run["delegation_json"] is None
    assert json.loads(run["identity_json"]) == {"status": "resolved", "principal": "job:plain", "source": "default",
                                                "subject": {"kind": "job", "principal": "plain"}, "trust_level": "user",
                                                "declared_level": "user", "depth": 0}
    evs = {e["kind"]: e for e in events(store, run["id"])}
    # the start is written when the run is claimed, before its identity is resolved; every event after carries it
    assert evs["run.started"]["principal"] is None
    assert (evs["run.finished"]["principal"], evs["run.finished"]["trust_level"]) == ("job:plain", "user")
    assert "identity.resolved" not in evs  # a job without a declaration adds no event


def test_a_declared_identity_is_recorded_on_the_run_and_its_events(store: Any, dispatcher: Any) -> None:
    job = add_job(store, name="svc", payload_message="fail:BOOM",
                  identity=ident("service", "backup-bot", "operator"))
    dispatcher()
    enqueue_manual(store, job["id"])
    (run,) = finished(store, job["id"])
    assert run["status"] == "error" and run["error_code"] == "BOOM"  # identity does not change what the payload does
    assert (run["principal"], run["trust_level"]) == ("service:backup-bot", "operator")
    assert json.loads(run["identity_json"])["source"] == "declared"
    evs = [e for e in events(store, run["id"]) if e["kind"] != "run.started"]
    assert {e["kind"] for e in evs} >= {"identity.resolved", "run.finished"}
    assert all((e["principal"], e["trust_level"]) == ("service:backup-bot", "operator") for e in evs)


def chain(store: Any, parent: dict[str, Any], name: str, payload: str, identity: dict[str, Any], **spec: Any) -> dict[str, Any]:
    spec.setdefault("executor", "testkit")
    return add_job(store, name=name, schedule_kind="chain", parent_id=parent["id"], payload_message=payload,
                   identity=identity, **spec)


def test_an_on_behalf_of_child_acts_as_itself_never_above_its_delegator(store: Any, dispatcher: Any) -> None:
    parent = add_job(store, name="parent", payload_message="echo:go", identity=ident("service", "front", "operator"))
    child = chain(store, parent, "child", "echo:child", ident("service", "worker", "system", mode="on-behalf-of",
                                                              allowed_delegators=["service:front"]))
    dispatcher()
    enqueue_manual(store, parent["id"])
    (first,) = finished(store, parent["id"])
    (run,) = finished(store, child["id"])
    assert run["status"] == "ok"
    assert (run["principal"], run["trust_level"]) == ("service:worker", "operator")  # system declared, operator delegated
    delegation = json.loads(run["delegation_json"])
    assert delegation == {"mode": "on-behalf-of", "depth": 1, "max_depth": 1, "chain": ["service:front", "service:worker"],
                          "delegator": {"principal": "service:front", "trust_level": "operator", "run_id": first["id"],
                                        "job_id": parent["id"]}}
    assert json.loads(run["identity_json"])["source"] == "delegated"
    delegated = [e for e in events(store, run["id"]) if e["kind"] == "identity.delegated"]
    assert len(delegated) == 1 and delegated[0]["principal"] == "service:worker"


def test_an_inheriting_child_acts_as_its_delegator(store: Any, dispatcher: Any) -> None:
    parent = add_job(store, name="parent", payload_message="echo:go", identity=ident("agent", "planner", "untrusted"))
    child = chain(store, parent, "child", "echo:child", ident(level="operator", mode="inherit", allowed_delegators=["agent:*"]))
    dispatcher()
    enqueue_manual(store, parent["id"])
    (run,) = finished(store, child["id"])
    assert run["status"] == "ok"
    assert (run["principal"], run["trust_level"]) == ("agent:planner", "untrusted")
    assert json.loads(run["delegation_json"])["chain"] == ["agent:planner"]


def test_a_child_without_delegation_is_triggered_but_not_delegated(store: Any, dispatcher: Any) -> None:
    parent = add_job(store, name="parent", payload_message="echo:go", identity=ident("service", "front", "untrusted"))
    child = chain(store, parent, "child", "echo:child", ident("service", "worker", "operator"))
    dispatcher()
    enqueue_manual(store, parent["id"])
    (run,) = finished(store, child["id"])
    assert (run["principal"], run["trust_level"], run["delegation_json"]) == ("service:worker", "operator", None)


def assert_denied(store: Any, job: dict[str, Any], marker: Path, code: str) -> dict[str, Any]:
    (run,) = finished(store, job["id"])
    assert (run["status"], run["error_code"]) == ("error", code), run["error_message"]
    assert not marker.exists()  # the command never started
    assert run["principal"] is None and run["trust_level"] is None
    assert json.loads(run["identity_json"])["status"] == "denied"
    assert json.loads(run["delegation_json"])["error_code"] == code
    denied = [e for e in events(store, run["id"]) if e["kind"] == "identity.denied"]
    assert len(denied) == 1 and json.loads(denied[0]["data"])["error_code"] == code
    return run


def test_a_delegator_not_allowed_is_refused_before_the_command(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    parent = add_job(store, name="parent", payload_message="echo:go", identity=ident("service", "front", "operator"))
    child = shell_job(store, marker, name="child", schedule_kind="chain", parent_id=parent["id"],
                      identity=ident("service", "worker", mode="on-behalf-of", allowed_delegators=["service:other", "user:*"]))
    dispatcher()
    enqueue_manual(store, parent["id"])
    run = assert_denied(store, child, marker, "DELEGATION_NOT_ALLOWED")
    assert json.loads(run["delegation_json"])["delegator"] == "service:front"


def test_a_chain_deeper_than_max_depth_is_refused(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    root = add_job(store, name="root", payload_message="echo:go", identity=ident("service", "a"))
    middle = chain(store, root, "middle", "echo:mid", ident("service", "b", mode="on-behalf-of", allowed_delegators=["*"]))
    leaf = shell_job(store, marker, name="leaf", schedule_kind="chain", parent_id=middle["id"],
                     identity=ident("service", "c", mode="on-behalf-of", max_depth=1, allowed_delegators=["*"]))
    dispatcher()
    enqueue_manual(store, root["id"])
    (mid,) = finished(store, middle["id"])
    assert mid["status"] == "ok" and json.loads(mid["delegation_json"])["depth"] == 1
    run = assert_denied(store, leaf, marker, "DELEGATION_DEPTH_EXCEEDED")
    assert json.loads(run["delegation_json"])["depth"] == 2


def test_the_same_chain_passes_with_a_deeper_policy(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    root = add_job(store, name="root", payload_message="echo:go", identity=ident("service", "a", "operator"))
    middle = chain(store, root, "middle", "echo:mid", ident("service", "b", "operator", mode="on-behalf-of",
                                                            allowed_delegators=["*"]))
    leaf = shell_job(store, marker, name="leaf", schedule_kind="chain", parent_id=middle["id"],
                     identity=ident("service", "c", "system", mode="on-behalf-of", max_depth=2, allowed_delegators=["service:b"]))
    dispatcher()
    enqueue_manual(store, root["id"])
    (run,) = finished(store, leaf["id"])
    assert run["status"] == "ok" and marker.exists()
    assert json.loads(run["delegation_json"])["chain"] == ["service:a", "service:b", "service:c"]
    assert run["trust_level"] == "operator"


def test_a_principal_twice_in_the_chain_is_a_cycle(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    root = add_job(store, name="root", payload_message="echo:go", identity=ident("service", "x"))
    middle = chain(store, root, "middle", "echo:mid", ident("service", "y", mode="on-behalf-of", allowed_delegators=["*"]))
    back = shell_job(store, marker, name="back", schedule_kind="chain", parent_id=middle["id"],
                     identity=ident("service", "x", mode="on-behalf-of", max_depth=5, allowed_delegators=["*"]))
    dispatcher()
    enqueue_manual(store, root["id"])
    run = assert_denied(store, back, marker, "DELEGATION_CYCLE")
    assert json.loads(run["delegation_json"])["chain"] == ["service:x", "service:y", "service:x"]


def test_a_child_of_a_refused_run_cannot_delegate(store: Any, dispatcher: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    root = add_job(store, name="root", payload_message="echo:go", identity=ident("service", "x"))
    refused = chain(store, root, "refused", "echo:never", ident("service", "y", mode="on-behalf-of",
                                                                 allowed_delegators=["service:nobody"]))
    after = shell_job(store, marker, name="after", schedule_kind="chain", parent_id=refused["id"], trigger_on="failure",
                      identity=ident("service", "z", mode="inherit", max_depth=3, allowed_delegators=["*"]))
    dispatcher()
    enqueue_manual(store, root["id"])
    (first,) = finished(store, refused["id"])
    assert first["error_code"] == "DELEGATION_NOT_ALLOWED"
    run = assert_denied(store, after, marker, "DELEGATION_SOURCE_UNRESOLVED")
    assert json.loads(run["delegation_json"])["delegator_run_id"] == first["id"]


def test_a_retry_of_a_delegated_run_keeps_its_delegation(store: Any, dispatcher: Any) -> None:
    parent = add_job(store, name="parent", payload_message="echo:go", identity=ident("service", "front", "untrusted"))
    child = chain(store, parent, "child", "flaky:2", ident("service", "worker", "operator", mode="on-behalf-of",
                                                            allowed_delegators=["service:front"]),
                  max_retries=1, retry_backoff_ms=0)
    dispatcher()
    enqueue_manual(store, parent["id"])
    (first_parent,) = finished(store, parent["id"])
    runs = finished(store, child["id"], count=2)
    assert [r["status"] for r in runs] == ["error", "ok"]
    for run in runs:  # the retry is not a new hop: same delegator, same depth, same (lowered) trust
        assert (run["principal"], run["trust_level"]) == ("service:worker", "untrusted")
        delegation = json.loads(run["delegation_json"])
        assert delegation["depth"] == 1 and delegation["delegator"]["run_id"] == first_parent["id"]


def test_a_manual_run_of_a_delegating_job_acts_as_itself(store: Any, dispatcher: Any) -> None:
    parent = add_job(store, name="parent", payload_message="echo:go")
    child = chain(store, parent, "child", "echo:child", ident("service", "worker", "operator", mode="inherit",
                                                              allowed_delegators=["job:parent"]))
    dispatcher()
    enqueue_manual(store, child["id"])
    (run,) = finished(store, child["id"])
    assert (run["principal"], run["trust_level"], run["delegation_json"]) == ("service:worker", "operator", None)
    enqueue_manual(store, parent["id"])
    runs = finished(store, child["id"], count=2)
    assert (runs[1]["principal"], runs[1]["trust_level"]) == ("job:parent", "user")  # inherited from the parent job


def test_resolving_without_a_delegating_declaration_never_touches_the_store() -> None:
    """The hot path: no declaration, or mode none, resolves from the job row alone (the store here cannot be used)."""
    from types import SimpleNamespace

    from scheduler.core.outcomes import RunOutcomes
    from scheduler.core.rows import JobRow
    from scheduler.pipeline import identity

    for declared in (None, {"subject": {"kind": "agent", "principal": "a"}, "trust": {"level": "untrusted"}}):
        spec = validate_spec({**spec_with(declared), "schedule_kind": "chain", "parent_id": "p"}, plugin_options=False)
        started = SimpleNamespace(job=JobRow.from_row({"id": "j1", "name": "j"}), source_run_id="some-parent-run")
        outcomes = RunOutcomes()
        identity.resolve(None, started, spec, outcomes)
        assert outcomes.identity.principal == ("job:j" if declared is None else "agent:a")
        assert outcomes.columns["trust_level"] == ("user" if declared is None else "untrusted")
        assert outcomes.identity.as_mapping()["delegation"] is None


def test_runs_get_shows_who_the_run_acted_as(store: Any, dispatcher: Any, cli: Any) -> None:
    parent = add_job(store, name="parent", payload_message="echo:go", identity=ident("service", "front", "operator"))
    child = chain(store, parent, "child", "echo:child", ident("service", "worker", mode="on-behalf-of", allowed_delegators=["*"]))
    dispatcher()
    enqueue_manual(store, parent["id"])
    (run,) = finished(store, child["id"])
    shown = cli("--json", "runs", "get", run["id"])
    assert shown.code == 0, shown
    view = shown.json["run"]
    assert (view["principal"], view["trust_level"]) == ("service:worker", "user")
    assert view["identity"]["source"] == "delegated" and view["delegation"]["chain"] == ["service:front", "service:worker"]


@pytest.mark.parametrize("name", ["a", "job-1", "h\u00e9llo \U0001f600 \u2028", 'q"\\x', "\x00", "x\ud800", "job:x"])
def test_the_default_identity_json_is_composed_exactly(name: str) -> None:
    """Every run of a job declaring no identity records ``default_identity_json``: the text ``json.dumps`` gives."""
    from scheduler.core.rows import JobRow
    from scheduler.pipeline.identity import default_identity, default_identity_json

    job = JobRow.from_row({"name": name})
    assert default_identity_json(name) == json.dumps(default_identity(job).to_json(), sort_keys=True)
