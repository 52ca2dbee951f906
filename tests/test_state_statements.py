"""Every state change of a run, dispatch, approval, job, outbox part and completion debt is one named statement (issue 26, item 1).

The statements live in ``scheduler.core.state``; no other module writes an UPDATE or INSERT on those
five tables (the tree is parsed, and the check is shown to catch one). Exempt: the state package
itself, and the migrations (``scheduler/core/store/migrations.py`` and ``data_moves.py``: a migration
records a fact of its time, so it keeps its own SQL), and the PostgreSQL store's tests (they test the
store with raw SQL). Every statement is used, each table has one INSERT, and both stores compile or
plan each at start-up: a statement a store cannot run is ``DB_INIT_FAILED`` naming it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from scheduler.base.errors import SchedulerError
from scheduler.core import state
from scheduler.core.spec import SPEC_FIELD_NAMES
from scheduler.core.state.named import StatementError, parse
from scheduler.plugins.stores import open_store

ROOT = Path(__file__).resolve().parents[1]
#: The tables whose every change is a named statement.
TABLES = ("runs", "job_dispatch_queue", "approvals", "jobs", "delivery_outbox", "completion_debts")
#: Where an UPDATE or INSERT on those tables may be written: the state module, the migrations, the PostgreSQL store's tests.
EXEMPT = ("scheduler/core/state/", "scheduler/core/store/migrations.py", "scheduler/core/store/data_moves.py",
          "plugins/scheduler-store-postgres/tests/")
#: The trees searched: the kernel and every distribution beside it.
TREES = ("scheduler", "plugins", "providers", "examples")

_TABLE = "|".join(TABLES)
WRITE = re.compile(
    rf"""\b(?:UPDATE\s+["`]?(?:{_TABLE})["`]?\s+SET\b|INSERT\s+(?:OR\s+\w+\s+)?INTO\s+["`]?(?:{_TABLE})["`]?(?:\s|\())""",
    re.IGNORECASE,
)


def _docstrings(tree: ast.AST) -> set[int]:
    """``id()`` of every docstring constant (module, class, function): prose may name a statement."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal but docstrings, with its line; an f-string's parts joined (``{}`` for each value)."""
    skip = _docstrings(tree)
    inside_fstring = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}" for v in node.values)
            out.append((node.lineno, text))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
              and id(node) not in inside_fstring):
            out.append((node.lineno, node.value))
    return out


def writes_in(source: str, name: str) -> list[str]:
    """``name:line: text`` of every UPDATE or INSERT on the five tables a module's code (not its docstrings) holds."""
    tree = ast.parse(source, filename=name)
    return [f"{name}:{line}: {' '.join(text.split())[:100]}" for line, text in _strings(tree) if WRITE.search(text)]


def _modules() -> list[tuple[str, Path]]:
    out = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/.venv/" in f"/{rel}" or "/build/" in rel or ".egg-info/" in rel:
                continue
            out.append((rel, path))
    return out


def test_no_module_outside_the_state_module_writes_runs_dispatches_approvals_jobs_or_the_outbox() -> None:
    offenders = []
    for rel, path in _modules():
        if rel.startswith(EXEMPT):
            continue
        offenders += writes_in(path.read_text(encoding="utf-8"), rel)
    assert offenders == []


def test_the_check_catches_a_write_and_leaves_prose_and_other_tables_alone() -> None:
    source = '''
"""A module whose docstring says UPDATE runs SET status and INSERT INTO jobs (prose: not a write)."""

def sneak(tx, run_id, sets):
    """UPDATE approvals SET status = 'x' is only mentioned here."""
    tx.execute("UPDATE runs SET status = 'ok' WHERE id = ?", (run_id,))
    tx.execute(f"update job_dispatch_queue set {sets} WHERE id = ?", (run_id,))
    tx.execute("INSERT INTO delivery_outbox(id) VALUES (?)", (run_id,))
    tx.execute('INSERT INTO "jobs" (id) VALUES (?)', (run_id,))
    tx.execute("INSERT INTO runtime_events(kind) VALUES (?)", ("x",))  # another table: allowed
    tx.execute("UPDATE dispatcher_leases SET owner = NULL")  # another table: allowed
    raise ValueError("jobs update refused")  # a message, not SQL
'''
    found = writes_in(source, "sneak.py")
    assert [f.split(":")[1] for f in found] == ["6", "7", "8", "9"], found
    # ... and the real tree's one legitimate home is exempt, not invisible: the state module itself is caught.
    assert writes_in((ROOT / "scheduler/core/state/runs.py").read_text(encoding="utf-8"), "runs.py")


def test_each_table_has_exactly_one_insert() -> None:
    inserts: dict[str, list[str]] = {table: [] for table in TABLES}
    for name, stmt in state.STATEMENTS.items():
        match = re.match(r"\s*INSERT\s+INTO\s+(\w+)", stmt.text, re.IGNORECASE)
        if match:
            inserts.setdefault(match.group(1), []).append(name)
    assert {table: len(names) for table, names in inserts.items()} == dict.fromkeys(TABLES, 1), inserts


def _calls_by_name() -> dict[str, set[str]]:
    """Statement name -> the modules that run it (``state.execute/one/rows(tx, "name", ...)``, ``state.prepare("name", ...)``)."""
    used: dict[str, set[str]] = {}
    for rel, path in _modules():
        if rel.startswith("scheduler/core/state/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "state"):
                continue
            at = {"execute": 1, "one": 1, "rows": 1, "prepare": 0}.get(node.func.attr)
            if at is not None and len(node.args) > at and isinstance(node.args[at], ast.Constant) \
                    and isinstance(node.args[at].value, str):
                used.setdefault(node.args[at].value, set()).add(rel)
    return used


def test_every_named_statement_is_used_and_every_call_names_one() -> None:
    used = _calls_by_name()
    assert sorted(set(state.STATEMENTS) - set(used)) == [], "dead statements"
    assert sorted(set(used) - set(state.STATEMENTS)) == [], "calls of statements that do not exist"
    # the check sees a dead statement: one more name in the catalogue would be reported
    assert set({**state.STATEMENTS, **parse("-- name: never_called\nUPDATE jobs SET name = :n")}) - set(used) == {"never_called"}


def test_status_changes_are_run_only_by_the_transitions() -> None:
    """The rule before named statements stays: run, dispatch and approval statuses change in ``core/transitions``."""
    status = re.compile(r"UPDATE (runs|job_dispatch_queue|approvals) SET[^;]*\bstatus\s*=|INSERT INTO runs\b", re.IGNORECASE)
    changing = {name for name, stmt in state.STATEMENTS.items() if status.search(stmt.text)}
    assert {"finish_run", "insert_runs", "claim_dispatches", "decide_approval"} <= changing
    outside = {name: sorted(m for m in mods if not m.startswith("scheduler/core/transitions/"))
               for name, mods in _calls_by_name().items() if name in changing}
    assert {name: mods for name, mods in outside.items() if mods} == {}


def test_the_jobs_statements_name_every_spec_column() -> None:
    insert = state.STATEMENTS["insert_job"].params
    assert insert == set(SPEC_FIELD_NAMES) | {"id", "artifact_digest", "handoff_version", "effective_task_hash", "created_at",
                                              "updated_at", "next_run_at", "schedule_anchor_at"}
    assert set(SPEC_FIELD_NAMES) <= state.STATEMENTS["update_job"].params


def test_finish_and_crash_return_the_same_columns() -> None:
    def returning(name: str) -> list[str]:
        text = state.STATEMENTS[name].render().sql
        return [c.strip() for c in text.split(" RETURNING ", 1)[1].split(",")]

    assert returning("finish_run") == returning("crash_run")
    assert {"id", "job_id", "status", "dispatch_id", "error_code", "artifact_digest"} <= set(returning("finish_run"))


# -- the format --------------------------------------------------------------------------------------


def test_a_source_parses_to_named_statements_with_keyword_parameters() -> None:
    stmts = parse("""
-- name: one_row
-- says what it does
UPDATE t SET a = 'it''s :not_a_param', "odd:name" = :a -- :nor_this
WHERE id = :id AND b = :a
-- name: many
UPDATE t SET x = CASE id [[WHEN :id THEN :x]] ELSE x END, at = :now WHERE id IN ([[, :id]])
""")
    one = stmts["one_row"]
    assert one.doc == "says what it does" and one.params == {"a", "id"} and not one.repeated
    assert one.bind({"a": 1, "id": "r"}) == (
        "UPDATE t SET a = 'it''s :not_a_param', \"odd:name\" = ? WHERE id = ? AND b = ?", [1, "r", 1])
    many = stmts["many"]
    assert many.params == {"now"} and many.row_params == {"id", "x"}
    sql, values = many.bind({"now": 5, "rows": [{"id": "a", "x": 1}, {"id": "b", "x": 2}]})
    assert sql == "UPDATE t SET x = CASE id WHEN ? THEN ? WHEN ? THEN ? ELSE x END, at = ? WHERE id IN (?, ?)"
    assert values == ["a", 1, "b", 2, 5, "a", "b"]


def test_a_section_is_in_the_text_only_when_its_flag_is_set() -> None:
    stmt = parse("""
-- name: s
UPDATE t SET a = :a, {{set_b: b = :b, c = :c,}} {{set_d: d = :d,}} at = :now WHERE id = :id
""")["s"]
    assert stmt.params == {"a", "set_b", "b", "c", "set_d", "d", "now", "id"} and stmt.flags == ("set_b", "set_d")
    call = {"a": 1, "b": 2, "c": 3, "d": 4, "now": 5, "id": "r"}
    assert stmt.bind({**call, "set_b": 0, "set_d": 0}) == ("UPDATE t SET a = ?, at = ? WHERE id = ?", [1, 5, "r"])
    assert stmt.bind({**call, "set_b": 1, "set_d": 0}) == (
        "UPDATE t SET a = ?, b = ?, c = ?, at = ? WHERE id = ?", [1, 2, 3, 5, "r"])
    assert stmt.bind({**call, "set_b": 0, "set_d": True}) == ("UPDATE t SET a = ?, d = ?, at = ? WHERE id = ?", [1, 4, 5, "r"])
    assert stmt.render().sql == "UPDATE t SET a = ?, b = ?, c = ?, d = ?, at = ? WHERE id = ?"  # what a store compiles
    for bad in ({**call, "set_b": 1}, {**call, "set_b": 1, "set_d": 0, "x": 1}):  # a flag missing; an unknown keyword
        with pytest.raises(StatementError):
            stmt.bind(bad)
    unset = dict(call)
    del unset["c"]  # a section's parameter is the statement's, set or not
    with pytest.raises(StatementError):
        stmt.bind({**unset, "set_b": 0, "set_d": 0})


def test_finish_run_writes_only_the_groups_it_sets() -> None:
    stmt = state.STATEMENTS["finish_run"]
    call = {name: (1 if name.startswith("set_") else None) for name in stmt.params}
    everything = stmt.bind(call)[0]
    nothing = stmt.bind({**call, **dict.fromkeys(stmt.flags, 0)})[0]
    assert "stdout_excerpt" in everything and "evidence_status" in everything
    assert "stdout_excerpt" not in nothing.split(" RETURNING ")[0] and "evidence_status" not in nothing
    assert "CASE WHEN ? = 1" not in everything  # no column is bound and evaluated only to be left as it was


@pytest.mark.parametrize("params", [
    {"a": 1},  # missing
    {"a": 1, "id": "r", "extra": 2},  # unknown
    {"a": 1, "idd": "r"},  # misspelt
])
def test_a_call_with_a_missing_or_unknown_keyword_is_refused(params: dict[str, Any]) -> None:
    stmt = parse("-- name: s\nUPDATE t SET a = :a WHERE id = :id")["s"]
    with pytest.raises(StatementError):
        stmt.bind(params)


def test_a_repeated_statement_wants_rows_each_with_exactly_its_parameters() -> None:
    stmt = parse("-- name: s\nUPDATE t SET at = :now WHERE id IN ([[, :id]])")["s"]
    for bad in ({"now": 1}, {"now": 1, "rows": []}, {"now": 1, "rows": {"id": 1}}, {"now": 1, "rows": [{"id": 1, "x": 2}]},
                {"rows": [{"id": 1}]}):
        with pytest.raises(StatementError):
            stmt.bind(bad)


@pytest.mark.parametrize("source", [
    "UPDATE t SET a = 1",  # SQL before any name
    "-- name: s\n",  # no SQL
    "-- name: s\nUPDATE t SET a = :a\n-- name: s\nUPDATE t SET b = :b",  # named twice
    "-- name: s\nUPDATE t SET a = CASE id [[WHEN :id THEN :a END",  # unclosed repeat
    "-- name: s\nUPDATE t SET a = :a WHERE id IN ([[, :a]])",  # one name per row and for the statement
    "-- name: s\nUPDATE t SET {{set_a: a = :a, b = 1 WHERE id = :id",  # unclosed section
    "-- name: s\nUPDATE t SET a = 1 }} WHERE id = :id",  # a section closed that was never opened
    "-- name: s\nUPDATE t SET {{set_a: a = CASE [[WHEN :id THEN 1]] END,}} b = 1",  # a repeat inside a section
    "-- name: s\nUPDATE t SET {{set_a: a = :a,}} b = 1 WHERE id IN ([[, :id]])",  # sections and repeats
])
def test_a_malformed_source_is_refused(source: str) -> None:
    with pytest.raises(StatementError):
        for stmt in parse(source).values():
            stmt.render(1)


def test_an_unknown_statement_is_refused_before_the_database(store: Any) -> None:
    with store.transaction() as tx:
        with pytest.raises(StatementError):
            state.execute(tx, "no_such_statement", x=1)
        with pytest.raises(StatementError):
            state.execute(tx, "disable_job", job_id="x")  # now= missing


# -- both stores ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(state.STATEMENTS))
def test_each_named_statement_compiles_on_both_stores(store: Any, name: str) -> None:
    """What ``initialize`` does for all of them, one by one (``EXPLAIN``: nothing runs)."""
    [probe] = state.probes({name: state.STATEMENTS[name]})
    with store.transaction() as tx:
        assert tx.all(probe.sql, list(probe.params))


def test_a_statement_a_store_cannot_run_fails_its_start_up_naming_it(store_url: str) -> None:
    bad = parse("-- name: bad_statement\n-- refers to a column that does not exist\n"
                "UPDATE runs SET no_such_column = :value WHERE id = :run_id")
    first = open_store(store_url)  # the database exists and is up to date: only the statements fail
    first.close()
    store: Any = open_store(store_url, initialize=False)
    store.statements = {**state.STATEMENTS, **bad}  # both stores' test hook
    try:
        with pytest.raises(SchedulerError) as caught:
            store.initialize()
        err = caught.value
        assert err.code == "DB_INIT_FAILED"
        assert err.details["phase"] == "statements" and err.details["statement"] == "bad_statement"
        assert "bad_statement" in err.message and "no_such_column" in err.message
        # a read-only open runs no named statement (they all write), so it does not check them
        store.initialize(readonly=True)
    finally:
        store.close()
    # the kernel's own statements pass on the same database
    good = open_store(store_url, initialize=False)
    try:
        good.initialize()
    finally:
        good.close()
