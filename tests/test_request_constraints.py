"""``request.constraints_of``: a job's ``constraints`` as the ``Constraints`` its executor is asked to enforce; a job
declaring none gets the empty (frozen) one, the same for every run."""

from __future__ import annotations

import attrs
import pytest

from scheduler.core.execution import Constraints
from scheduler.core.request import constraints_of
from scheduler.core.spec import validate_spec


def _spec(**fields: object):
    return validate_spec({"name": "job", "schedule_kind": "manual", "payload_message": "echo hi", **fields},
                         plugin_options=False)


def test_no_constraints_is_the_empty_frozen_constraints_every_time() -> None:
    first, second = constraints_of(_spec()), constraints_of(_spec(constraints={}))
    assert first == second == Constraints() and first.required_capabilities() == frozenset()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        first.sandbox = True  # type: ignore[misc]
    assert constraints_of(_spec()) == Constraints()


def test_declared_constraints_are_converted_field_by_field() -> None:
    got = constraints_of(_spec(constraints={"sandbox": True, "network": "none", "allowed_paths": ["/tmp", "/srv"],
                                            "max_tokens": 10}))
    assert got == Constraints(sandbox=True, network="none", allowed_paths=("/tmp", "/srv"), max_tokens=10)
    assert got.required_capabilities() == {"sandbox", "network-restriction", "path-restriction", "token-cap"}
