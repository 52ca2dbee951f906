"""The toolkit re-exports kernel code as the very same objects, is pinned to the kernel's minor series, and stays light."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import scheduler_toolkit
import scheduler_toolkit.store as store

import scheduler
from scheduler.core.store import migrations, schema

DIST = Path(__file__).resolve().parents[1]
MODULES = sorted(f"scheduler_toolkit.{m.name}" for m in pkgutil.iter_modules(scheduler_toolkit.__path__))
#: Where the code of each module lives: its own (moved here) or the kernel's (re-exported).
OWN_CODE = {"scheduler_toolkit.http", "scheduler_toolkit.prompt_safety", "scheduler_toolkit.structured", "scheduler_toolkit.helper_programs"}


@pytest.mark.parametrize("module_name", MODULES)
def test_each_module_says_what_it_holds_and_re_exports_the_kernels_objects(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__doc__ and module.__all__
    for name in module.__all__:
        value = getattr(module, name)
        home = getattr(value, "__module__", None)
        if module_name in OWN_CODE and callable(value) and home is not None:
            assert home == module_name, f"{module_name}.{name} is defined in {home}"
        elif isinstance(home, str) and home.startswith("scheduler.") and hasattr(importlib.import_module(home), name):
            assert getattr(importlib.import_module(home), name) is value, f"{module_name}.{name}"


def test_the_toolkit_is_pinned_to_the_kernels_minor_series() -> None:
    project = tomllib.loads((DIST / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    major_minor = ".".join(scheduler.__version__.split(".")[:2])
    major, minor = (int(part) for part in major_minor.split("."))
    # the kernel's minor series, written as every distribution pins it (tests/test_packaging.py)
    assert f"scheduler-kernel>={major_minor},<{major}.{minor + 1}" in project["dependencies"]
    assert project["version"] == scheduler_toolkit.__version__
    assert scheduler_toolkit.__version__.split(".")[:2] == scheduler.__version__.split(".")[:2]
    assert any(d.startswith("httpx") for d in project["dependencies"])


def test_the_store_helpers_read_the_kernels_schema() -> None:
    assert store.schema_statements("postgresql") == schema.statements("postgresql")
    assert store.schema_fingerprint("sqlite") == schema.fingerprint("sqlite")
    assert store.schema_sql("sqlite") == schema.render("sqlite")
    assert store.MIGRATIONS is migrations.MIGRATIONS and store.DIALECTS == schema.DIALECTS
    assert "jobs" in store.schema_tables() and store.schema_indexes()
    assert all(table in store.schema_tables() for _trigger, table in store.schema_triggers("postgresql"))


def test_importing_the_package_imports_no_module_of_it() -> None:
    code = "import json, sys, scheduler_toolkit; print(json.dumps(sorted(m for m in sys.modules if m.startswith('scheduler'))))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert loaded == ["scheduler_toolkit"]


def test_the_http_helpers_do_not_import_httpx_until_used() -> None:
    code = "import sys, scheduler_toolkit.http; print('httpx' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
