"""``scheduler.base.deprecation``: a moved name still imports from its old module, warns naming the new import, and is the same object."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator

import pytest

from scheduler.base.deprecation import moved_names


@pytest.fixture
def old_module() -> Iterator[types.ModuleType]:
    """A real module ``oldplace`` in ``sys.modules`` whose ``dumps`` moved to ``json`` and ``loads`` to a re-export of ``json``."""
    module = types.ModuleType("oldplace")
    module.kept = 1  # type: ignore[attr-defined]
    module.__getattr__ = moved_names("oldplace", {  # type: ignore[method-assign]
        "dumps": "json",
        "loads": ("newplace.codec", "json"),
        "gone": "no_such_distribution.helpers",
    })
    sys.modules["oldplace"] = module
    yield module
    del sys.modules["oldplace"]


def test_a_moved_name_warns_naming_the_new_import_and_is_the_same_object(old_module: types.ModuleType) -> None:
    with pytest.warns(DeprecationWarning) as caught:
        from oldplace import dumps  # type: ignore[import-not-found]
    assert dumps is json.dumps
    assert len(caught) == 1 and caught[0].filename == __file__
    assert str(caught[0].message) == ("oldplace.dumps moved: import it with `from json import dumps`"
                                      " (the old name goes away in the next release)")


def test_a_re_exported_name_is_read_from_the_kernel_module_and_names_the_new_home(old_module: types.ModuleType) -> None:
    """``(new, source)``: the warning names ``new``; the object comes from ``source`` (``newplace`` need not exist)."""
    with pytest.warns(DeprecationWarning, match=r"from newplace\.codec import loads"):
        value = old_module.loads
    assert value is json.loads


def test_every_use_warns_and_the_name_stays_out_of_the_module(old_module: types.ModuleType) -> None:
    for _ in range(2):
        with pytest.warns(DeprecationWarning):
            _ = old_module.dumps
    assert "dumps" not in vars(old_module) and old_module.kept == 1


def test_an_unknown_name_is_an_attribute_error(old_module: types.ModuleType) -> None:
    with pytest.raises(AttributeError, match="module 'oldplace' has no attribute 'nothing'"):
        _ = old_module.nothing
    with pytest.raises(ImportError):
        from oldplace import nothing  # type: ignore[import-not-found] # noqa: F401


def test_a_new_home_that_is_not_installed_says_where_the_name_went(old_module: types.ModuleType) -> None:
    with pytest.raises(ModuleNotFoundError, match=r"oldplace\.gone moved to no_such_distribution\.helpers") as raised:
        _ = old_module.gone
    assert raised.value.name == "no_such_distribution"


def test_the_new_import_itself_is_quiet(recwarn: pytest.WarningsRecorder) -> None:
    from scheduler_toolkit.canonical import canonical_json

    import scheduler.api

    assert callable(canonical_json) and scheduler.api.SchedulerError
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
