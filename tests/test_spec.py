"""Job specs: the field catalogue, validation, cross-field rules, and agreement with the jobs table.

The catalogue is read from ``JobSpec``; these tests hold the SQL schema, the
validator and ``scheduler schema jobs`` to it so none of them can drift.
"""

from __future__ import annotations

import io
import json
import sqlite3
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import attrs
import pytest

from scheduler.base.errors import SchedulerError
from scheduler.base.timeutil import parse_iso, to_iso
from scheduler.core.rows import JobRow
from scheduler.core.spec import SPEC_FIELDS, JobSpec, field_catalogue, spec_from_row, spec_to_input, spec_to_row, validate_spec
from scheduler.plugins.stores import open_store

NOW = parse_iso("2025-06-01T12:00:00Z")
FUTURE = "2025-06-02T09:00:00Z"
BASE = {"name": "job", "schedule_kind": "manual", "payload_message": "echo hi"}
CHAIN = {"name": "child", "schedule_kind": "chain", "parent_id": "parent", "payload_message": "echo child"}


def spec(**overrides: Any) -> dict[str, Any]:
    out = {**BASE, **overrides}
    return {k: v for k, v in out.items() if v is not ...}


def errors_of(obj: Any, **kw: Any) -> list[dict[str, str]]:
    """The ``details`` of the VALIDATION_FAILED that validating ``obj`` must raise."""
    with pytest.raises(SchedulerError) as info:
        validate_spec(obj, now=NOW, **kw)
    assert info.value.code == "VALIDATION_FAILED", info.value
    assert isinstance(info.value.details, list) and info.value.details
    for d in info.value.details:
        assert set(d) == {"field", "code", "error"} and d["error"]
        assert d["field"] in info.value.message or d["field"] == ""
    return info.value.details


def codes(obj: Any, **kw: Any) -> dict[str, str]:
    """``{field: code}`` of every error."""
    return {d["field"]: d["code"] for d in errors_of(obj, **kw)}


def run_cli(*args: str) -> tuple[int, str, str]:
    from scheduler.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


# --- the catalogue and the jobs table ------------------------------------------------------------


@pytest.fixture
def jobs_table(db_path: Path) -> dict[str, tuple]:
    """``{column: (type, notnull, default, pk)}`` of a freshly created jobs table."""
    open_store(db_path).close()
    conn = sqlite3.connect(db_path)
    cols = {r[1]: tuple(r[2:]) for r in conn.execute("PRAGMA table_info(jobs)")}
    conn.close()
    return cols


def test_every_catalogue_field_is_a_jobs_column(jobs_table: dict[str, tuple]) -> None:
    missing = [f.name for f in SPEC_FIELDS if f.name not in jobs_table]
    assert missing == []


def _spec_default(value: Any) -> Any:
    """A field's default as the database stores it: factories called, JSON objects as canonical text."""
    if isinstance(value, attrs.Factory):  # type: ignore[arg-type]
        value = value.factory()
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def _sql_default(value: Any) -> str | None:
    value = _spec_default(value)
    if value is None:
        return None
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return f"'{value}'"


def test_column_defaults_and_nullability_match_the_catalogue(jobs_table: dict[str, tuple]) -> None:
    """A spec default is the column default; only fields that may be null are nullable.

    Checked against the jobs table a fresh SQLite database gets and against the one schema
    definition every dialect is rendered from (``scheduler.core.store.schema``).
    """
    from scheduler.core.store import schema

    jobs = schema.table("jobs")
    wrong = []
    for f in SPEC_FIELDS:
        decl, notnull, default, _pk = jobs_table[f.name]
        expected = (1, None) if f.metadata["required"] else (0 if f.default is None else 1, _sql_default(f.default))
        if (notnull, default) != expected:
            wrong.append((f.name, (notnull, default), expected))
        want_type = "INTEGER" if f.metadata["kind"] in ("int", "bool", "instant") else "TEXT"
        if decl.upper() != want_type:
            wrong.append((f.name, decl, want_type))
        col = jobs.column(f.name)
        spec_default = None if f.metadata["required"] else _spec_default(f.default)
        if isinstance(spec_default, bool):
            spec_default = int(spec_default)
        if (col.not_null, col.default) != (bool(expected[0]), spec_default):
            wrong.append((f.name, "definition", (col.not_null, col.default), (bool(expected[0]), spec_default)))
        if f.metadata["kind"] == "choice" and set(col.choices) != set(f.metadata["choices"]):
            wrong.append((f.name, "choices", col.choices, f.metadata["choices"]))
    assert wrong == []


def _raw_job(conn: sqlite3.Connection, name: str, **values: Any) -> None:
    row = {"id": name, "name": name, "schedule_kind": "manual", "payload_message": "x", "created_at": 1, "updated_at": 1, **values}
    if row["schedule_kind"] == "cron":
        row.setdefault("schedule_cron", "* * * * *")
    if row["schedule_kind"] == "every":
        row.setdefault("schedule_every", "1m")
    if row["schedule_kind"] == "at":
        row.setdefault("schedule_at", 1)
    if row["schedule_kind"] == "chain":
        row.setdefault("parent_id", "root")
    cols = list(row)
    conn.execute(f"INSERT INTO jobs({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})", [row[c] for c in cols])


def test_database_checks_agree_with_choices_ranges_and_booleans(db_path: Path) -> None:
    """Every value the validator accepts is storable; the database CHECKs refuse what it rejects."""
    open_store(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA foreign_keys = ON")
    _raw_job(conn, "root")
    accepted, refused_wrongly, stored_wrongly = 0, [], []

    def attempt(name: str, ok: bool, **values: Any) -> None:
        nonlocal accepted
        try:
            _raw_job(conn, name, **values)
        except sqlite3.IntegrityError as exc:
            if ok:
                refused_wrongly.append((values, str(exc)))
            return
        accepted += 1
        if not ok:
            stored_wrongly.append(values)

    n = 0
    for f in SPEC_FIELDS:
        m = f.metadata
        if m["kind"] == "choice":
            for choice in m["choices"]:
                attempt(f"c{(n := n + 1)}", True, **{f.name: choice})
            attempt(f"c{(n := n + 1)}", False, **{f.name: "not-a-choice"})
        elif m["kind"] == "int":
            attempt(f"c{(n := n + 1)}", True, **{f.name: m["minimum"]})
            attempt(f"c{(n := n + 1)}", False, **{f.name: m["minimum"] - 1})
        elif m["kind"] == "bool":
            attempt(f"c{(n := n + 1)}", True, **{f.name: 1})
            attempt(f"c{(n := n + 1)}", False, **{f.name: 2})
    conn.close()
    assert refused_wrongly == [] and stored_wrongly == []
    assert accepted > 40


def test_spec_round_trips_through_a_row() -> None:
    s = validate_spec(spec(schedule_kind="cron", schedule_cron="0 9 * * 1-5", schedule_tz="Europe/Berlin", max_retries=2,
                           approval_required=True), now=NOW)
    row = spec_to_row(s)
    assert row["approval_required"] == 1 and row["enabled"] == 1
    assert spec_from_row(row) == s
    assert validate_spec(spec_to_input(s), now=NOW) == s


def test_a_stored_row_rebuilds_the_same_spec_from_its_shape_and_never_shares_a_value() -> None:
    """``spec_from_row`` converts a ``JobRow``'s contract columns once per exact stored values and the others per call:
    the spec is the one a mapping of the same row gives, two specs of one shape share no dict or list, and a row whose
    stored values were edited (as by SQL) gets its own values, never the remembered ones."""
    s = validate_spec(spec(executor_options={"a": [1]}, constraints={"network": "none"}, retention={"keep_runs": 3}), now=NOW,
                      plugin_options=False)
    base = {**spec_to_row(s), "id": "job-1"}
    for other in ({"name": "other", "schedule_at": None}, {"name": "third", "enabled": 0, "executor_options": "{}"},
                  {"credentials": None, "executor_options": None, "constraints": "{}"}):
        stored = {**base, **other}
        row = JobRow.from_row({name: stored.get(name) for name in attrs.fields_dict(JobRow)})
        first, second = spec_from_row(row), spec_from_row(row)
        assert first == second == spec_from_row(stored)
        for f in SPEC_FIELDS:
            value = getattr(first, f.name)
            if isinstance(value, (dict, list)):
                assert value is not getattr(second, f.name), f.name
    warm = JobRow.from_row({name: base.get(name) for name in attrs.fields_dict(JobRow)})
    assert spec_from_row(warm) == s
    for column, value, field, expected in (("payload_message", "echo:x", "payload_message", "echo:x"),
                                           ("executor_options", '{"a": [2]}', "executor_options", {"a": [2]}),
                                           ("approval_required", 0, "approval_required", False),
                                           ("name", "renamed", "name", "renamed")):
        edited = JobRow.from_row({name: {**base, column: value}.get(name) for name in attrs.fields_dict(JobRow)})
        assert getattr(spec_from_row(edited), field) == expected, column


# --- validation: unknown fields and each kind of bad value -------------------------------------------


def test_minimal_spec_gets_every_default() -> None:
    s = validate_spec(BASE, now=NOW)
    for f in SPEC_FIELDS:
        if not f.metadata["required"]:
            default = f.default.factory() if isinstance(f.default, attrs.Factory) else f.default
            assert getattr(s, f.name) == default, f.name
    assert s.executor_name() == "shell"


def test_unknown_fields_are_rejected_by_name() -> None:
    details = errors_of(spec(nmae="typo", shedule="x"))
    assert {d["field"]: d["code"] for d in details} == {"nmae": "UNKNOWN_FIELD", "shedule": "UNKNOWN_FIELD"}
    assert all(d["field"] in d["error"] for d in details)


def test_runtime_columns_are_not_spec_fields() -> None:
    assert codes(spec(next_run_at=1, run_count=3, id="x")) == {
        "next_run_at": "UNKNOWN_FIELD", "run_count": "UNKNOWN_FIELD", "id": "UNKNOWN_FIELD"}


def test_not_an_object() -> None:
    for bad in ([], "job", 3, None):
        assert codes(bad) == {"": "INVALID_TYPE"}


def test_required_fields() -> None:
    assert codes({}) == {"name": "REQUIRED", "schedule_kind": "REQUIRED", "payload_message": "REQUIRED"}
    assert codes(spec(name=None, payload_message="   ")) == {"name": "REQUIRED", "payload_message": "REQUIRED"}


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("max_retries", "3", "INVALID_TYPE"),
        ("max_retries", 2.0, "INVALID_TYPE"),
        ("max_retries", True, "INVALID_TYPE"),
        ("enabled", "yes", "INVALID_TYPE"),
        ("enabled", 1, "INVALID_TYPE"),
        ("payload_message", ["echo"], "INVALID_TYPE"),
        ("description", {"a": 1}, "INVALID_TYPE"),
        ("overlap_policy", "sometimes", "INVALID_CHOICE"),
        ("session_target", "SHELL", "INVALID_CHOICE"),
        ("output_format", "yaml", "INVALID_CHOICE"),
        ("run_timeout_ms", 0, "OUT_OF_RANGE"),
        ("run_timeout_ms", 7 * 86_400_000 + 1, "OUT_OF_RANGE"),
        ("max_retries", -1, "OUT_OF_RANGE"),
        ("max_retries", 101, "OUT_OF_RANGE"),
        ("queue_limit", 0, "OUT_OF_RANGE"),
        ("executor", "Shell Runner!", "INVALID_VALUE"),
        ("name", "x" * 129, "INVALID_VALUE"),
        ("name", "", "INVALID_VALUE"),
        ("name", "tab\there", "INVALID_VALUE"),
        ("payload_message", "x" * (64 * 1024 + 1), "TOO_LARGE"),
        ("schedule_tz", "Mars/Olympus", "INVALID_TIMEZONE"),
        ("schedule_tz", "../../etc/passwd", "INVALID_TIMEZONE"),
        ("schedule_tz", "localtime", "INVALID_TIMEZONE"),
        ("approval_approver_scope", "CORP\\alice", "INVALID_SCOPE"),
        ("approval_approver_scope", "alice@corp.example", "INVALID_SCOPE"),
        ("approval_approver_scope", "alice smith", "INVALID_SCOPE"),
    ],
)
def test_bad_value_is_reported_for_its_field(field: str, value: Any, code: str) -> None:
    assert codes(spec(**{field: value})) == {field: code}


@pytest.mark.parametrize(
    ("extra", "field", "code"),
    [
        ({"schedule_kind": "cron", "schedule_cron": "61 * * * *"}, "schedule_cron", "INVALID_CRON"),
        ({"schedule_kind": "cron", "schedule_cron": "* * * *"}, "schedule_cron", "INVALID_CRON"),
        ({"schedule_kind": "cron", "schedule_cron": "0 0 31 2 *"}, "schedule_cron", "INVALID_CRON"),
        ({"schedule_kind": "cron", "schedule_cron": "0 0 1 1 * 2030"}, "schedule_cron", "INVALID_CRON"),
        ({"schedule_kind": "cron", "schedule_cron": 5}, "schedule_cron", "INVALID_TYPE"),
        ({"schedule_kind": "every", "schedule_every": "5 minutes"}, "schedule_every", "INVALID_DURATION"),
        ({"schedule_kind": "every", "schedule_every": "0s"}, "schedule_every", "INVALID_DURATION"),
        ({"schedule_kind": "every", "schedule_every": "500ms"}, "schedule_every", "OUT_OF_RANGE"),
        ({"schedule_kind": "every", "schedule_every": "-5m"}, "schedule_every", "INVALID_DURATION"),
        ({"schedule_kind": "at", "schedule_at": "2025-06-02T09:00:00"}, "schedule_at", "INVALID_TIME"),
        ({"schedule_kind": "at", "schedule_at": "tomorrow"}, "schedule_at", "INVALID_TIME"),
        ({"schedule_kind": "at", "schedule_at": True}, "schedule_at", "INVALID_TYPE"),
        ({"schedule_kind": "at", "schedule_at": "2025-06-01T11:59:59Z"}, "schedule_at", "AT_IN_PAST"),
    ],
)
def test_bad_schedule_values(extra: dict[str, Any], field: str, code: str) -> None:
    assert codes(spec(**extra)) == {field: code}


def test_at_in_the_past_is_accepted_when_allowed_or_not_checked() -> None:
    past = {"schedule_kind": "at", "schedule_at": "2025-06-01T11:00:00+02:00"}
    assert validate_spec(spec(**past, allow_past_at=True), now=NOW).schedule_at == parse_iso("2025-06-01T09:00:00Z")
    assert validate_spec(spec(**past), now=NOW, check_past=False).schedule_at == parse_iso("2025-06-01T09:00:00Z")


def test_at_normalises_offsets_to_utc_milliseconds() -> None:
    s = validate_spec(spec(schedule_kind="at", schedule_at="2025-06-02T11:00:00.250+02:00"), now=NOW)
    assert s.schedule_at == parse_iso("2025-06-02T09:00:00.250Z")
    assert s.to_json()["schedule_at"] == "2025-06-02T09:00:00.250Z"


@pytest.mark.parametrize("value", [10**20, -(10**20), 2**63, "9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+01:00"])
def test_instant_outside_the_representable_range_is_a_validation_error(value: Any) -> None:
    """Regression: a huge epoch or a year-10000 instant passed validation and crashed later (OverflowError)."""
    assert codes(spec(schedule_kind="at", schedule_at=value, allow_past_at=True)) == {"schedule_at": "INVALID_TIME"}


@pytest.mark.parametrize("value", ["99999999999999999999d", "1" * 5000 + "s", "5m" * 100])
def test_absurd_duration_is_a_validation_error(value: str) -> None:
    """Regression: huge durations overflowed date arithmetic; 5000 digits hit int()'s digit limit."""
    assert codes(spec(schedule_kind="every", schedule_every=value)) == {"schedule_every": "INVALID_DURATION"}


def test_durations_are_normalised() -> None:
    assert validate_spec(spec(schedule_kind="every", schedule_every="90m"), now=NOW).schedule_every == "1h30m"
    assert validate_spec(spec(schedule_kind="every", schedule_every=" 1H30M "), now=NOW).schedule_every == "1h30m"
    assert validate_spec(spec(schedule_kind="every", schedule_every="1m30s500ms"), now=NOW).schedule_every == "1m30s500ms"


def test_cron_is_normalised() -> None:
    assert validate_spec(spec(schedule_kind="cron", schedule_cron="  @daily "), now=NOW).schedule_cron == "0 0 * * *"
    assert validate_spec(spec(schedule_kind="cron", schedule_cron="30 0 9 * * *"), now=NOW).schedule_cron == "30 0 9 * * *"


@pytest.mark.parametrize(
    ("condition", "code"),
    [
        ("regex:(unclosed", "INVALID_CONDITION"),
        ("regex:(?<=lookbehind)x", "INVALID_CONDITION"),  # not linear-time: RE2 refuses it
        ("regex:", "INVALID_CONDITION"),
        ("contains:", "INVALID_CONDITION"),
        ("startswith:x", "INVALID_CONDITION"),
        ("regex:" + "a" * 1100, "TOO_LARGE"),
        ("contains:" + "a" * 1100, "TOO_LARGE"),
    ],
)
def test_bad_trigger_condition(condition: str, code: str) -> None:
    assert codes({**CHAIN, "trigger_condition": condition}) == {"trigger_condition": code}


def test_good_trigger_conditions() -> None:
    for cond in ("contains:DONE", "regex:^ok \\d+$", "regex:(?i)success"):
        assert validate_spec({**CHAIN, "trigger_condition": cond}, now=NOW).trigger_condition == cond


@pytest.mark.parametrize("field", ["name", "payload_message", "description"])
def test_lone_surrogates_are_rejected(field: str) -> None:
    """Regression: "\\ud800" passed validation, then crashed on output or in SQLite (UnicodeEncodeError)."""
    assert codes(spec(**{field: "bad \ud800 text"})) == {field: "INVALID_VALUE"}


@pytest.mark.parametrize("field", ["payload_message", "verify_shell"])
def test_nul_characters_are_rejected_where_they_can_never_run(field: str) -> None:
    """A NUL byte cannot be passed to exec(); refuse it at creation rather than fail every run."""
    assert codes(spec(**{field: "echo a\x00b"})) == {field: "INVALID_VALUE"}


def test_shell_options_refuse_nul_in_paths_but_not_in_data() -> None:
    assert codes(spec(executor_options={"working_dir": "/tmp\x00x"})) == {"executor_options": "INVALID_VALUE"}
    data = validate_spec(spec(executor_options={"stdin_text": "a\x00b"}), now=NOW)
    assert data.executor_options == {"stdin_text": "a\x00b"}  # data may hold NULs


@pytest.mark.parametrize("old, new", [
    ("shell_env_policy", "executor_options.env_policy"), ("working_dir", "executor_options.working_dir"),
    ("stdin_text", "executor_options.stdin_text"), ("context_mode", "executor_options.context_mode"),
    ("heartbeat_file", "executor_options.heartbeat_file"),
])
def test_flat_executor_fields_are_refused_naming_their_new_place(old: str, new: str) -> None:
    details = errors_of(spec(**{old: "x"}))
    assert [(d["field"], d["code"]) for d in details] == [(old, "FIELD_MOVED")]
    assert new in details[0]["error"]


def test_executor_options_are_validated_by_the_executor_plugin() -> None:
    ok = validate_spec(spec(executor_options={"env_policy": "inherit", "env_allow": ["MY_KEY"]}), now=NOW)
    assert ok.executor_options == {"env_policy": "inherit", "env_allow": ["MY_KEY"]}
    assert validate_spec(spec(executor_options={"env_policy": "minimal"}), now=NOW).executor_options == {}  # defaults dropped
    assert codes(spec(executor_options={"env_polcy": "inherit"})) == {"executor_options.env_polcy": "UNKNOWN_FIELD"}
    assert codes(spec(executor_options={"env_policy": "all"})) == {"executor_options.env_policy": "INVALID_CHOICE"}
    assert codes(spec(executor_options=["x"])) == {"executor_options": "INVALID_TYPE"}


def test_constraints_the_executor_cannot_enforce_are_refused() -> None:
    """Nothing accepted that is not enforced: the shell executor has no sandbox, network or token cap."""
    found = errors_of(spec(constraints={"sandbox": True, "network": "none"}))
    assert [(d["field"], d["code"]) for d in found] == [("constraints.sandbox", "SCHEDULER_GOVERNANCE_DENIED"),
                                                        ("constraints.network", "SCHEDULER_GOVERNANCE_DENIED")]
    assert "sandbox" in found[0]["error"] and "network-restriction" in found[1]["error"]
    assert codes(spec(constraints={"network": "anywhere"})) == {"constraints.network": "INVALID_CHOICE"}
    assert codes(spec(constraints={"allowed_paths": ["relative"]}, executor="nosuch")) == {
        "constraints.allowed_paths": "PATH_TRAVERSAL"}
    assert codes(spec(constraints={"max_tokens": 0}, executor="nosuch")) == {"constraints.max_tokens": "OUT_OF_RANGE"}
    # an executor that is not installed cannot be asked: the missing-plugin rule refuses it elsewhere
    kept = validate_spec(spec(constraints={"max_tokens": 100}, executor="nosuch"), now=NOW)
    assert kept.constraints == {"max_tokens": 100}


def test_every_error_is_reported_at_once() -> None:
    found = codes({"name": "", "schedule_kind": "cron", "schedule_cron": "bad", "payload_message": "x", "max_retries": -3,
                   "overlap_policy": "never", "heartbeat_file": "../x", "bogus": 1})
    assert found == {"name": "INVALID_VALUE", "schedule_cron": "INVALID_CRON", "max_retries": "OUT_OF_RANGE",
                     "overlap_policy": "INVALID_CHOICE", "heartbeat_file": "FIELD_MOVED", "bogus": "UNKNOWN_FIELD"}


def test_null_means_default_for_optional_fields() -> None:
    s = validate_spec(spec(max_retries=None, overlap_policy=None, description=None), now=NOW)
    assert (s.max_retries, s.overlap_policy, s.description) == (0, "skip", None)


# --- cross-field rules -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (spec(schedule_kind="cron"), {"schedule_cron": "REQUIRED"}),
        (spec(schedule_kind="every"), {"schedule_every": "REQUIRED"}),
        (spec(schedule_kind="at"), {"schedule_at": "REQUIRED"}),
        (spec(schedule_kind="chain"), {"parent_id": "REQUIRED"}),
        (spec(schedule_kind="cron", schedule_cron="* * * * *", schedule_every="5m"), {"schedule_every": "CONFLICT"}),
        (spec(schedule_kind="every", schedule_every="5m", schedule_at=FUTURE), {"schedule_at": "CONFLICT"}),
        (spec(schedule_cron="* * * * *"), {"schedule_cron": "CONFLICT"}),
        (spec(parent_id="p"), {"parent_id": "CONFLICT"}),
        (spec(trigger_on="failure"), {"trigger_on": "CONFLICT"}),
        (spec(trigger_condition="contains:x"), {"trigger_condition": "CONFLICT"}),
        (spec(trigger_delay_s=5), {"trigger_delay_s": "CONFLICT"}),
        (spec(delivery_mode="always"), {"delivery_channel": "REQUIRED"}),
        (spec(job_type="watchdog", session_target="isolated"), {"job_type": "CONFLICT"}),
        (spec(approval_approver_scope="alice", approval_timeout_action="approve"), {"approval_timeout_action": "CONFLICT"}),
    ],
)
def test_cross_field_rules(obj: dict[str, Any], expected: dict[str, str]) -> None:
    assert codes(obj) == expected


def test_cross_field_rules_accept_consistent_specs() -> None:
    chain = validate_spec({**CHAIN, "trigger_delay_s": 30}, now=NOW)
    assert chain.trigger_on == "success"  # documented default for chains
    assert validate_spec({**CHAIN, "trigger_on": "complete"}, now=NOW).trigger_on == "complete"
    assert validate_spec(spec(delivery_mode="on_failure", delivery_channel="webhook", delivery_to="https://x"), now=NOW)
    assert validate_spec(spec(job_type="watchdog", watchdog_alert_channel="slack"), now=NOW)
    assert validate_spec(spec(approval_approver_scope="uid:1000", approval_required=True), now=NOW)
    assert validate_spec(spec(approval_timeout_action="approve", approval_required=True), now=NOW)
    assert validate_spec(spec(session_target="isolated", executor_options={"context_mode": "session"}),
                         now=NOW).executor_name() == "agent"


# --- `scheduler schema jobs` -------------------------------------------------------------------------


def test_schema_jobs_json_lists_exactly_the_spec_fields(tmp_path: Path) -> None:
    code, out, err = run_cli("--db", str(tmp_path / "never" / "x.db"), "--json", "schema", "jobs")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ok"] is True
    fields = doc["fields"]
    assert [f["name"] for f in fields] == [f.name for f in attrs.fields(JobSpec)]
    assert fields == json.loads(json.dumps(field_catalogue()))
    by_name = {f["name"]: f for f in fields}
    for f in attrs.fields(JobSpec):
        row, m = by_name[f.name], f.metadata
        assert row["type"] == m["kind"] and row["required"] == m["required"] and row["description"]
        default = f.default.factory() if isinstance(f.default, attrs.Factory) else f.default
        assert row["default"] == (None if default is attrs.NOTHING else default)
    assert by_name["run_timeout_ms"] == {**by_name["run_timeout_ms"], "type": "int", "default": 300000,
                                         "constraints": {"minimum": 1, "maximum": 7 * 86_400_000}}
    assert by_name["overlap_policy"]["constraints"] == {"choices": ["skip", "allow", "queue"]}
    assert by_name["name"]["required"] is True and by_name["name"]["default"] is None
    assert by_name["schedule_every"]["type"] == "duration" and by_name["schedule_at"]["type"] == "instant"
    assert not (tmp_path / "never").exists()


def test_schema_jobs_human_table_names_every_field() -> None:
    code, out, _ = run_cli("schema", "jobs")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["FIELD", "TYPE", "DEFAULT", "CONSTRAINTS"]
    assert [ln.split()[0] for ln in lines[1:]] == [f.name for f in SPEC_FIELDS]
    assert any(ln.split()[:3] == ["name", "str", "(required)"] for ln in lines)


def test_catalogue_choices_and_ranges_are_what_the_validator_enforces() -> None:
    """Each catalogue constraint is live: its edges pass, one step beyond fails."""
    for row in field_catalogue():
        cons, name = row["constraints"], row["name"]
        if name in ("schedule_kind", "trigger_on") or not cons:
            continue
        base = dict(CHAIN) if name.startswith("trigger_") else dict(BASE)
        if "choices" in cons:
            for choice in cons["choices"]:
                extra = {"delivery_channel": "webhook"} if name == "delivery_mode" else {}
                assert getattr(validate_spec({**base, **extra, name: choice}, now=NOW), name) == choice
            assert codes({**base, name: "zzz"}) == {name: "INVALID_CHOICE"}
        else:
            for edge in (cons["minimum"], cons["maximum"]):
                assert getattr(validate_spec({**base, name: edge}, now=NOW), name) == edge
            assert codes({**base, name: cons["minimum"] - 1}) == {name: "OUT_OF_RANGE"}
            assert codes({**base, name: cons["maximum"] + 1}) == {name: "OUT_OF_RANGE"}


def test_to_json_renders_instants_as_iso_z() -> None:
    s = validate_spec(spec(schedule_kind="at", schedule_at=FUTURE), now=NOW)
    assert s.to_json()["schedule_at"] == FUTURE.replace(":00Z", ":00.000Z")
    assert to_iso(s.schedule_at).endswith("Z")
