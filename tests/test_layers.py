"""The kernel's layers import only downward, its packages form no cycle, and no import hides in a function.

``LAYERS`` is the architecture (docs/architecture.md draws it): a package may import its own
modules and those of the layers below it, never one above. Packages of one layer may import each
other as long as no cycle forms. Every import counts: module level, inside ``if TYPE_CHECKING:``
and inside functions. Imports inside functions are allowed only in the CLI, where they keep
start-up fast (``STARTUP_LAZY``); anywhere else they are how an import circle used to be hidden.
``importlib.import_module`` with a kernel module's name counts as an import too.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "scheduler"

#: Bottom first. ``scheduler`` itself is the root package (version constants only).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("scheduler",),
    ("scheduler.base",),
    ("scheduler.settings",),
    ("scheduler.core",),
    ("scheduler.plugins",),
    ("scheduler.artifacts", "scheduler.evidence", "scheduler.delivery", "scheduler.approvals", "scheduler.toolkit"),
    ("scheduler.pipeline",),
    ("scheduler.ops",),
    ("scheduler.api", "scheduler.conformance", "scheduler.runtime"),
    ("scheduler.cli",),
    ("scheduler.testing", "scheduler.__main__"),
)

#: Modules whose imports inside functions are there for CLI start-up (each command group imports its work lazily).
STARTUP_LAZY: tuple[str, ...] = ("scheduler.cli",)


@attrs.frozen
class Import:
    """One import of a kernel module by a kernel module."""

    importer: str
    imported: str
    line: int
    in_function: bool


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def kernel_modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _absolute(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The kernel module ``name`` refers to (a module, or the module defining the attribute ``name``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(root: Path) -> list[Import]:
    """Every import of a kernel module by a kernel module under ``root``, wherever it is written."""
    top = root.name
    modules = kernel_modules(root)
    found: list[Import] = []
    for importer, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        in_function: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                in_function.update(id(inner) for inner in ast.walk(node) if inner is not node)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(importer, path.name == "__init__.py", node)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in
                  ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)):
                targets = [node.args[0].value]
            for target in targets:
                if target != top and not target.startswith(top + "."):
                    continue
                owner = _owner(target, modules)
                if owner and owner != importer:
                    found.append(Import(importer, owner, node.lineno, id(node) in in_function))
    return found


def package_of(module: str, top: str = "scheduler") -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else top


def layer_index(layers: tuple[tuple[str, ...], ...]) -> dict[str, int]:
    return {package: i for i, group in enumerate(layers) for package in group}


def upward_imports(found: list[Import], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Each import that goes up a layer (or into a package no layer names), as a readable line."""
    index = layer_index(layers)
    bad = []
    for imp in found:
        a, b = package_of(imp.importer), package_of(imp.imported)
        if a == b:
            continue
        if a not in index or b not in index:
            bad.append(f"{imp.importer}:{imp.line} imports {imp.imported}: package not in LAYERS")
        elif index[b] > index[a]:
            bad.append(f"{imp.importer}:{imp.line} imports {imp.imported} (up from {a} to {b})")
    return sorted(bad)


def package_cycles(found: list[Import]) -> list[list[str]]:
    """The cycles of the package graph (each as a list of packages), found by Tarjan's algorithm."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in found:
        a, b = package_of(imp.importer), package_of(imp.imported)
        if a != b:
            graph[a].add(b)
            graph.setdefault(b, set())
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return cycles


def hidden_imports(found: list[Import], lazy: tuple[str, ...] = STARTUP_LAZY) -> list[str]:
    """Imports written inside functions outside the CLI start-up list."""
    return sorted(f"{imp.importer}:{imp.line} imports {imp.imported} inside a function" for imp in found
                  if imp.in_function and not any(imp.importer == m or imp.importer.startswith(m + ".") for m in lazy))


# --------------------------------------------------------------------------- the kernel


def test_every_kernel_package_is_in_a_layer() -> None:
    index = layer_index(LAYERS)
    packages = {package_of(m) for m in kernel_modules(KERNEL)}
    assert packages - set(index) == set(), "add new packages to LAYERS (and docs/architecture.md)"
    assert set(index) - packages == set(), "LAYERS names a package that no longer exists"


def test_kernel_imports_only_downward() -> None:
    bad = upward_imports(imports_of(KERNEL), LAYERS)
    assert bad == [], "\n".join(bad)


def test_kernel_packages_form_no_cycle() -> None:
    assert package_cycles(imports_of(KERNEL)) == []


def test_no_kernel_import_hides_in_a_function() -> None:
    bad = hidden_imports(imports_of(KERNEL))
    assert bad == [], f"{len(bad)} imports inside functions:\n" + "\n".join(bad)


# --------------------------------------------------------------------------- the check itself


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "scheduler"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for directory in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (directory / "__init__.py").touch()
    return root


SAMPLE_LAYERS = (("scheduler",), ("scheduler.core",), ("scheduler.pipeline", "scheduler.evidence"), ("scheduler.cli",))


def test_the_check_sees_an_upward_import_a_hidden_one_and_a_dynamic_one(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "core/queue.py": "from scheduler.core import lease\nfrom scheduler.pipeline.step import Step\n",
        "core/lease.py": "def f():\n    from scheduler.core import queue\n    return queue\n",
        "core/plan.py": "import importlib\nSTEP = importlib.import_module('scheduler.pipeline.step')\n",
        "pipeline/step.py": "from scheduler.core.lease import f\n",
        "cli/main.py": "def run():\n    from scheduler.pipeline import step\n",
    })
    found = imports_of(root)
    assert upward_imports(found, SAMPLE_LAYERS) == [
        "scheduler.core.plan:2 imports scheduler.pipeline.step (up from scheduler.core to scheduler.pipeline)",
        "scheduler.core.queue:2 imports scheduler.pipeline.step (up from scheduler.core to scheduler.pipeline)",
    ]
    assert hidden_imports(found) == ["scheduler.core.lease:2 imports scheduler.core.queue inside a function"]
    assert package_cycles(found) == [["scheduler.core", "scheduler.pipeline"]]


def test_the_check_sees_a_cycle_within_one_layer(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "pipeline/gate.py": "from scheduler.evidence.store import put\n",
        "evidence/store.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scheduler.pipeline.gate import G\n",
    })
    found = imports_of(root)
    assert upward_imports(found, SAMPLE_LAYERS) == []
    assert package_cycles(found) == [["scheduler.evidence", "scheduler.pipeline"]]


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"core/lease.py": "X = 1\n", "pipeline/step.py": "from scheduler.core.lease import X\n"})
    found = imports_of(root)
    assert found == [Import("scheduler.pipeline.step", "scheduler.core.lease", 1, False)]
    assert upward_imports(found, SAMPLE_LAYERS) == [] and package_cycles(found) == [] and hidden_imports(found) == []
