"""Issue 34: a hot caller prepares a named statement once per shape of its calls (``Statement.prepare``) and binds
later calls of that shape with just the names the prepared text uses; ``finish_run`` does, per set of result columns."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core import state
from scheduler.core.state import StatementError, parse
from scheduler.core.transitions import runs as run_transitions


def _call(flags: dict[str, int]) -> dict[str, Any]:
    stmt = state.STATEMENTS["finish_run"]
    call: dict[str, Any] = {name: f"v:{name}" for name in stmt.params}
    call.update(flags)
    return call


@pytest.mark.parametrize("on", [(), ("set_stdout",), ("set_stdout", "set_usage", "set_principal")])
def test_a_prepared_shape_binds_what_bind_binds(on: tuple[str, ...]) -> None:
    stmt = state.STATEMENTS["finish_run"]
    call = _call({flag: int(flag in on) for flag in stmt.flags})
    prepared = stmt.prepare(call)
    assert (prepared.sql, prepared.values(call)) == stmt.bind(call)
    # only the names its text uses: a call without the sections it leaves out binds the same values
    used = {name for _i, name in prepared.slots}
    assert prepared.values({k: v for k, v in call.items() if k in used}) == stmt.bind(call)[1]


def test_prepare_refuses_what_bind_refuses_and_a_repeated_statement() -> None:
    stmt = parse("-- name: s\nUPDATE t SET a = :a WHERE id = :id")["s"]
    assert stmt.prepare({"a": 1, "id": 2}).values({"a": 1, "id": 2}) == [1, 2]
    for bad in ({"a": 1}, {"a": 1, "id": 2, "x": 3}):
        with pytest.raises(StatementError):
            stmt.prepare(bad)
    repeated = parse("-- name: r\nUPDATE t SET at = :now WHERE id IN ([[, :id]])")["r"]
    with pytest.raises(StatementError, match="writes rows"):
        repeated.prepare({"now": 1, "rows": [{"id": 1}]})
    with pytest.raises(StatementError, match="no named statement"):
        state.prepare("no_such_statement", a=1)


def test_finish_run_keeps_one_checked_shape_per_set_of_columns() -> None:
    base = frozenset(run_transitions.RESULT_COLUMNS)
    with_stdout = base | frozenset(run_transitions.RESULT_GROUPS["stdout"])
    plain, stdout = run_transitions._finish_shape(base), run_transitions._finish_shape(with_stdout)
    assert "stdout_excerpt = ?" not in plain.sql and "stdout_excerpt = ?" in stdout.sql
    assert run_transitions._SHAPES[base] is plain and run_transitions._SHAPES[with_stdout] is stdout
    with pytest.raises(ValueError, match="written together"):
        run_transitions._finish_shape(base | {"stdout_excerpt"})
    with pytest.raises(ValueError, match="not a result or outcome column"):
        run_transitions._finish_shape(base | {"status"})


@pytest.mark.parametrize("count", [1, 2, 5])
def test_every_repeated_statement_binds_each_placeholder_its_value(count: int) -> None:
    """A repeated statement's call is bound by one pick from its values (``Statement._plan``): each placeholder gets
    what its slot names, the statement's parameter or that row's, for every statement of the catalogue."""
    repeated = [stmt for stmt in state.STATEMENTS.values() if stmt.repeated]
    assert {"insert_runs", "claim_dispatches", "count_job_runs", "finish_dispatches_clean"} <= {s.name for s in repeated}
    for stmt in repeated:
        outer = {name: f"{name}!" for name in stmt.params}
        rows = [{name: f"{name}@{i}" for name in stmt.row_params} for i in range(count)]
        sql, values = stmt.bind({**outer, "rows": rows})
        rendered = stmt.render(count)
        assert sql == rendered.sql
        assert values == [outer[name] if i < 0 else rows[i][name] for i, name in rendered.slots], stmt.name
    # a statement whose values are already in placeholder order, and one whose rows' values interleave with its own
    plain = parse("-- name: p\nUPDATE t SET at = :now WHERE id IN ([[, :id]])")["p"]
    assert plain.bind({"now": 1, "rows": [{"id": "a"}, {"id": "b"}]})[1] == [1, "a", "b"]
    mixed = parse("-- name: m\nUPDATE t SET a = CASE id [[WHEN :id THEN :a]] END, b = :b WHERE id IN ([[, :id]])")["m"]
    assert mixed.bind({"b": 9, "rows": [{"id": "x", "a": 1}, {"id": "y", "a": 2}]})[1] == ["x", 1, "y", 2, 9, "x", "y"]
