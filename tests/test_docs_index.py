"""The README's documentation index links every page in docs/ exactly once, and the architecture page cites only what exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_links_every_docs_page_once() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Documentation"):]
    # Absolute links to the repository (PyPI renders this README, where a relative link breaks): see tests/test_packaging.py.
    linked = re.findall(r"\]\((?:https://[^)]+/blob/main/)?(docs/[^)#]+\.md)\)", section)
    pages = sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
    assert sorted(linked) == pages, {"missing": sorted(set(pages) - set(linked)),
                                     "not a page": sorted(set(linked) - set(pages)),
                                     "twice": sorted({p for p in linked if linked.count(p) > 1})}


def test_every_kernel_module_the_architecture_cites_exists() -> None:
    """A path the page cites is one under the repository, under scheduler/ (`core/steps.py`, `pipeline/credentials/`)
    or in one of its packages (the package table names a package's modules bare: `lease.py` in `core/`)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    cited = set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*(?:\.py|/))`", text))
    bases = (ROOT, ROOT / "scheduler", *sorted(p.parent for p in (ROOT / "scheduler").rglob("__init__.py")))
    missing = sorted(name for name in cited if not any((base / name).exists() for base in bases))
    assert not missing, missing


def test_every_dotted_kernel_name_the_architecture_cites_exists() -> None:
    """A dotted name in a kernel package (`scheduler.core.parts.Parts`, `scheduler.runtime`) is a module, or an
    attribute of one. Names whose second part is no package (entry-point groups: `scheduler.steps`) are not modules."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = {p.name for p in (ROOT / "scheduler").iterdir() if (p / "__init__.py").exists()}
    missing = []
    for name in sorted(set(re.findall(r"`(scheduler(?:\.[A-Za-z_]+)+)[`(]", text))):
        if name.split(".")[1] not in packages:
            continue
        parts = name.split(".")
        depth = max(i for i in range(1, len(parts) + 1) if _is_module(parts[:i]))
        obj: object = importlib.import_module(".".join(parts[:depth]))
        for attr in parts[depth:]:
            obj = getattr(obj, attr, None)
        if obj is None:
            missing.append(name)
    assert not missing, missing


def _is_module(parts: list[str]) -> bool:
    path = ROOT.joinpath(*parts)
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()
