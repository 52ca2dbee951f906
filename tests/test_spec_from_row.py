"""``spec_from_row`` on a ``JobRow`` (the worker's hot path) builds the very spec ``JobSpec(**values)`` builds.

It fills a new spec's ``__dict__`` from a remembered contract shape instead of running the
generated ``__init__``: these tests hold the two ways together field by field (values, types,
declaration order), for the defaults a None column takes, the 0/1 flags, the JSON columns
(fresh per spec), a column read as a mapping, and the frozen spec that results.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from scheduler.base.timeutil import parse_iso
from scheduler.core.rows import JobRow
from scheduler.core.spec import SPEC_COLUMN_ORDER, SPEC_FIELDS, JobSpec, spec_from_row, spec_to_row, validate_spec

NOW = parse_iso("2025-06-01T12:00:00Z")


def _row(**columns: Any) -> JobRow:
    """A full jobs row of a valid spec, with ``columns`` stored in place of the spec's (as SQL could)."""
    spec = validate_spec({"name": "job", "schedule_kind": "cron", "schedule_cron": "0 9 * * *", "payload_message": "echo hi",
                          "executor_options": {"a": [1]}, "constraints": {"network": "none"}, "retention": {"keep_runs": 3},
                          "approval_required": True, "max_retries": 2}, now=NOW, plugin_options=False)
    stored = {**spec_to_row(spec), "id": "job-1", **columns}
    return JobRow.from_row({name: stored.get(name) for name in attrs.fields_dict(JobRow)})


def _initialised(row: JobRow) -> JobSpec:
    """The spec of ``row`` as the generated ``__init__`` builds it (the mapping path of ``spec_from_row``)."""
    return spec_from_row(row.to_dict())


@pytest.mark.parametrize("columns", [
    {},
    {"name": "other", "enabled": 0, "notify": 0, "allow_past_at": 1, "retention": None},
    # None in columns whose field has a default: the default, as ``JobSpec.__init__`` is given it
    {"schedule_tz": None, "misfire_policy": None, "max_retries": None, "queue_limit": None, "enabled": None,
     "notify": None, "executor_options": None, "credentials": None, "constraints": "{}"},
    {"retention": '{"max_age": "forever"}', "description": "d", "trigger_delay_s": 0},
])
def test_a_job_row_builds_the_spec_the_generated_init_builds(columns: dict[str, Any]) -> None:
    row = _row(**columns)
    for _ in range(2):  # the first call remembers the contract shape, the second is served from it
        built, expected = spec_from_row(row), _initialised(row)
        assert built == expected
        assert list(vars(built)) == list(vars(expected)) == list(SPEC_COLUMN_ORDER)
        for f in SPEC_FIELDS:
            assert type(getattr(built, f.name)) is type(getattr(expected, f.name)), f.name
            assert getattr(built, f.name) == getattr(expected, f.name), f.name


def test_specs_of_one_shape_share_no_json_value_and_stay_frozen() -> None:
    row = _row(retention='{"keep_runs": 5}')
    first, second = spec_from_row(row), spec_from_row(row)
    for name in ("executor_options", "constraints", "credentials", "delivery_options", "retention"):
        assert getattr(first, name) == getattr(second, name) and getattr(first, name) is not getattr(second, name), name
    first.executor_options["a"].append(2)
    assert spec_from_row(row).executor_options == {"a": [1]}
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        first.name = "changed"  # type: ignore[misc]


def test_a_json_column_read_as_a_mapping_is_converted_and_never_remembered() -> None:
    row = _row()
    as_mapping = JobRow.from_row({**row.to_dict(), "executor_options": {"b": 1}, "retention": {"keep_runs": 1}})
    built = spec_from_row(as_mapping)
    assert built.executor_options == {"b": 1} and built.retention == {"keep_runs": 1}
    assert built == _initialised(as_mapping)
    assert spec_from_row(row).executor_options == {"a": [1]}
