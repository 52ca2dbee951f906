"""The README's documentation index links every page in docs/ exactly once, and nothing that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_links_every_docs_page_once() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Documentation"):]
    linked = re.findall(r"\]\((docs/[^)#]+\.md)\)", section)
    pages = sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
    assert sorted(linked) == pages, {"missing": sorted(set(pages) - set(linked)),
                                     "not a page": sorted(set(linked) - set(pages)),
                                     "twice": sorted({p for p in linked if linked.count(p) > 1})}


def test_every_kernel_module_the_architecture_cites_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    cited = set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*(?:\.py|/))`", text))
    bases = (ROOT, ROOT / "scheduler", ROOT / "scheduler" / "plugins", ROOT / "scheduler" / "store")
    missing = sorted(name for name in cited if not any((base / name).exists() for base in bases))
    assert not missing, missing
