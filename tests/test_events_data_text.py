"""Issue 34: an event's ``data`` text is ``json.dumps(data, sort_keys=True, default=str)`` byte for byte, whether the
row is inserted at once, gathered in a ``batched`` block, or needs lookups (the encoder is made once, not per event)."""

from __future__ import annotations

import datetime
import enum
import json
from decimal import Decimal
from pathlib import Path

import pytest

from scheduler.core.events import _data_text, append_event, batched
from scheduler.plugins.stores import open_store
from scheduler.testing import add_job


class _Code(enum.IntEnum):
    A = 3


class _Name(str):
    def __str__(self) -> str:
        return "named:" + super().__str__()


DATA = [
    {"status": "ok", "error_code": None, "token": 7},
    {"kind": "manual", "attempt": 2, "token": 3, "nested": {"b": [1, 2.5, None, True], "a": "é€😀"}},
    {"when": datetime.date(2026, 1, 2), "path": Path("/tmp/x"), "amount": Decimal("1.10"), "z": float("nan")},
    {"z": 1, "a": {"y": 2, "b": 3}},
    # flat objects (one C call): control characters, quotes, non-ASCII keys, big and negative ints
    {"status": "error", "error_code": "E\n\t\"q\"\\", "token": -(2 ** 70), "ключ": "значение", "": None},
    # not flat after all: a bool, a float, an int or str subclass, non-string keys
    {"ok": True, "n": 1}, {"x": 1.5}, {"code": _Code.A, "s": _Name("n")}, {2: "b", 1: "a"},
]


@pytest.mark.parametrize("how", ["plain", "batched", "lookup"])
def test_event_data_is_the_json_dumps_text(tmp_path: Path, how: str) -> None:
    store = open_store(str(tmp_path / "s.db"))
    try:
        job = add_job(store, payload_message="ok")
        with store.transaction() as tx:
            for i, data in enumerate(DATA):
                kind = f"t.data{i}"
                if how == "lookup":
                    append_event(tx, kind, job_id=job["id"], data=data)
                elif how == "plain":
                    append_event(tx, kind, job_id=job["id"], data=data, artifact_digest=job["artifact_digest"],
                                 principal=None, trust_level=None)
                else:
                    with batched(tx):
                        append_event(tx, kind, job_id=job["id"], data=data, artifact_digest=job["artifact_digest"],
                                     principal=None, trust_level=None)
        with store.read() as tx:
            rows = tx.all("SELECT kind, data FROM runtime_events WHERE kind LIKE 't.data%' ORDER BY id")
    finally:
        store.close()
    assert [r["data"] for r in rows] == [json.dumps(d, sort_keys=True, default=str) for d in DATA]
    assert rows[1]["data"].startswith('{"attempt": 2, "kind": "manual", "nested": {"a": "\\u00e9')


def test_the_data_text_is_json_dumps_for_every_shape() -> None:
    for data in DATA:
        assert _data_text(data) == json.dumps(data, sort_keys=True, default=str)
    circular: dict[str, object] = {"a": 1}
    circular["self"] = circular
    with pytest.raises(ValueError, match="Circular reference"):  # as json.dumps says: never the flat path's
        _data_text(circular)
