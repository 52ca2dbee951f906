"""``Row.from_row``: a whole row (every column, as ``SELECT *`` gives it) is taken in one ``dict.update``, a row of some
of the columns over every field None, any other mapping column by column. Either way the typed row is the same: each
field the column's value, None for a column the read did not select, other keys ignored, on both stores."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from scheduler.core.rows import DispatchRow, JobRow, RunRow
from scheduler.testing import add_job


class _Mapping(Mapping[str, Any]):
    """A read-only mapping that is not a dict (as a store's row type could be)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def _fields(row: object) -> dict[str, Any]:
    return {name: getattr(row, name) for name in attrs.fields_dict(type(row))}


def test_whole_partial_and_wider_rows_build_the_same_typed_row(store) -> None:
    job = add_job(store, payload_message="ok")
    with store.read() as tx:
        whole = tx.one("SELECT * FROM jobs WHERE id = ?", (job["id"],))
        partial = tx.one("SELECT id, name, enabled FROM jobs WHERE id = ?", (job["id"],))
        wider = tx.one("SELECT *, 1 AS extra FROM jobs WHERE id = ?", (job["id"],))
    names = list(attrs.fields_dict(JobRow))
    assert list(whole) == names  # SELECT * is the class's fields in schema order
    built = JobRow.from_row(whole)
    assert _fields(built) == whole and built.to_dict() == whole and list(built.to_dict()) == names
    assert JobRow.from_row(_Mapping(whole)) == built == JobRow.from_row(wider)
    assert JobRow.from_row(dict(reversed(list(whole.items())))) == built  # the same columns in another order
    assert not hasattr(JobRow.from_row(wider), "extra")
    thin = JobRow.from_row(partial)
    assert (thin.id, thin.name, thin.enabled) == (job["id"], job["name"], 1)
    assert all(v is None for k, v in _fields(thin).items() if k not in partial)
    assert list(thin.to_dict()) == names and thin == JobRow.from_row({**partial, "extra": 1})  # the same either way
    # as many keys as fields but not the same ones: column by column (the missing ones None, the stranger ignored)
    swapped = {**{k: v for k, v in whole.items() if k != "paused_reason"}, "stranger": 1}
    other = JobRow.from_row(swapped)
    assert other.paused_reason is None and not hasattr(other, "stranger") and other.name == job["name"]


def test_run_and_dispatch_rows_too() -> None:
    run = dict.fromkeys(attrs.fields_dict(RunRow)) | {"id": "r", "job_id": "j", "status": "ok", "attempt": 1}
    assert RunRow.from_row(run).to_dict() == run
    dispatch = {"id": "d", "job_id": "j", "kind": "at", "due_at": 5}
    built = DispatchRow.from_row(dispatch)
    assert (built.id, built.kind, built.due_at, built.status) == ("d", "at", 5, None)
