"""The published distributions' metadata, as a PyPI user meets it (issue 32, section 1), checked statically.

Every published distribution (the kernel, each directory under plugins/ and providers/) declares the MIT licence
and ships the LICENSE file, names its authors, has trove classifiers and Project-URLs into the one repository,
pins ``scheduler-kernel`` and ``scheduler-toolkit`` to the kernel's minor series (while the kernel is 0.x, the
releases that carry its plugin API major), and has a README without relative links (PyPI renders a README on its
own page, where ``docs/cli.md`` leads nowhere). ``scheduler-suite`` is the one install the README names.
``.ci/release_check.py`` builds, checks and installs the real archives; this is the fast half that runs with the tests.
"""

from __future__ import annotations

import re
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import attrs
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
#: What pins to the kernel's minor series: the kernel and the toolkit released with it.
PINNED = ("scheduler-kernel", "scheduler-toolkit")
SUITE_DIR = ROOT / "plugins" / "scheduler-suite"
#: The plugins the README's demo jobs need (issue 32): shell executor, checksum evidence, local credentials, webhook.
SUITE_PLUGINS = {"scheduler-kernel", "scheduler-toolkit", "scheduler-executor-shell", "scheduler-provider-checksum",
                 "scheduler-provider-local", "scheduler-channel-webhook"}
#: A Markdown link or image whose target is neither absolute (scheme:) nor an anchor in the page.
RELATIVE_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s]+)[^)]*\)|^\s*\[[^\]]+\]:\s*(?![a-z][a-z0-9+.-]*:|#)(\S+)",
                           re.MULTILINE | re.IGNORECASE)


def published() -> list[Path]:
    """The directory of every published distribution, the kernel first (the release check builds the same list)."""
    return [ROOT, *sorted(p.parent for tree in ("plugins", "providers") for p in (ROOT / tree).glob("*/pyproject.toml"))]


def _project(directory: Path) -> dict[str, Any]:
    """The [project] table of ``directory``'s pyproject.toml, as TOML gives it."""
    return dict(tomllib.loads((directory / "pyproject.toml").read_text(encoding="utf-8"))["project"])


def minor_series(version: str) -> SpecifierSet:
    """The kernel releases that carry the plugin API of kernel ``version``: its minor series while it is 0.x
    (``0.1.0`` gives ``>=0.1,<0.2``), its major series from 1.0 on."""
    v = Version(version)
    if v.major == 0:
        return SpecifierSet(f">=0.{v.minor},<0.{v.minor + 1}")
    return SpecifierSet(f">={v.major},<{v.major + 1}")


def relative_links(markdown: str) -> list[str]:
    """Targets of the Markdown links in ``markdown`` that are relative paths (fenced code blocks ignored)."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return [a or b for a, b in RELATIVE_LINK.findall(text)]


@attrs.frozen
class Rules:
    """What every published distribution must agree with: the kernel's version, the repository URL, the LICENSE."""

    kernel_version: str
    repository: str
    license_text: bytes


def metadata_problems(directory: Path, rules: Rules) -> list[str]:
    """What is wrong with the metadata of the distribution in ``directory``, one line per problem (none: [])."""
    kernel_version, repository, license_text = rules.kernel_version, rules.repository, rules.license_text
    project = _project(directory)
    name = project.get("name", directory.name)
    found: list[str] = []
    if project.get("license") != "MIT":
        found.append(f"{name}: license is {project.get('license')!r}, not 'MIT'")
    if project.get("license-files") != ["LICENSE"]:
        found.append(f"{name}: license-files is {project.get('license-files')!r}, not ['LICENSE']")
    lic = directory / "LICENSE"
    if not lic.is_file() or lic.read_bytes() != license_text:
        found.append(f"{name}: {lic.relative_to(directory.parent)} is missing or not the repository's LICENSE")
    authors = project.get("authors") or []
    if not authors or not all(isinstance(a, dict) and (a.get("name") or a.get("email")) for a in authors):
        found.append(f"{name}: no authors")
    classifiers = project.get("classifiers") or []
    if not classifiers:
        found.append(f"{name}: no classifiers")
    found += [f"{name}: licence classifier {c!r} (License-Expression says it)" for c in classifiers if c.startswith("License ::")]
    urls = project.get("urls") or {}
    for key in ("Homepage", "Documentation", "Repository", "Issues"):
        if not str(urls.get(key, "")).startswith(repository):
            found.append(f"{name}: Project-URL {key} is {urls.get(key)!r}, not under {repository}")
    series = minor_series(kernel_version)
    requirements = [Requirement(r) for r in project.get("dependencies", [])]
    for req in requirements:
        if req.name in PINNED and req.specifier != series:
            found.append(f"{name}: depends on {req}, not {req.name}{series} (the kernel's series)")
    if name != "scheduler-kernel" and "scheduler-kernel" not in {r.name for r in requirements}:
        found.append(f"{name}: does not depend on scheduler-kernel")
    readme = project.get("readme")
    if not isinstance(readme, str) or not (directory / readme).is_file():
        found.append(f"{name}: readme {readme!r} is not a file")
    else:
        found += [f"{name}: {readme} links {t!r}, a relative link PyPI cannot follow (link to {repository}/blob/main/...)"
                  for t in relative_links((directory / readme).read_text(encoding="utf-8"))]
    return found


def _rules() -> Rules:
    kernel = _project(ROOT)
    return Rules(kernel["version"], kernel["urls"]["Repository"], (ROOT / "LICENSE").read_bytes())


def test_the_repository_has_the_mit_license() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n") and "Permission is hereby granted, free of charge" in text


@pytest.mark.parametrize("directory", published(), ids=lambda d: d.name if d != ROOT else "scheduler-kernel")
def test_every_published_distribution_follows_the_metadata_rules(directory: Path) -> None:
    assert metadata_problems(directory, _rules()) == []


def test_every_published_distribution_uses_one_repository_url() -> None:
    repository = _rules().repository
    assert repository == "https://github.com/example/scheduler"  # the placeholder: change it here and in every pyproject
    assert {_project(d)["urls"]["Repository"] for d in published()} == {repository}


def test_every_classifier_is_a_trove_classifier() -> None:
    """PyPI refuses an upload with an unknown classifier (the kernel's test extra installs the list)."""
    trove = pytest.importorskip("trove_classifiers")
    unknown = {(_project(d)["name"], c) for d in published() for c in _project(d).get("classifiers", [])
               if c not in trove.classifiers}
    assert unknown == set()


def test_the_suite_is_one_install_of_the_kernel_and_the_default_plugins() -> None:
    """``pip install scheduler-suite`` brings what the README's demo jobs need; it has no package of its own, so
    nothing of it can shadow the kernel's import package ``scheduler``."""
    project = _project(SUITE_DIR)
    assert project["name"] == "scheduler-suite" and project["version"] == _project(ROOT)["version"]
    assert {Requirement(r).name for r in project["dependencies"]} == SUITE_PLUGINS
    names = {_project(d)["name"] for d in published()}
    assert names >= SUITE_PLUGINS
    setuptools = tomllib.loads((SUITE_DIR / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert setuptools["packages"] == [] and not list(SUITE_DIR.glob("*/__init__.py"))
    # The plugin each demo job needs is among them (shell runs every job; load-json asks for checksum evidence).
    demo = (ROOT / "examples" / "demo-jobs.json").read_text(encoding="utf-8")
    assert '"provider": "checksum"' in demo and '"executor"' not in demo


def test_the_rules_catch_a_bad_distribution(tmp_path: Path) -> None:
    """A distribution breaking each rule is reported once per rule: the checks above can fail."""
    bad = tmp_path / "scheduler-channel-bad"
    bad.mkdir()
    (bad / "pyproject.toml").write_text(textwrap.dedent("""
        [project]
        name = "scheduler-channel-bad"
        version = "0.1.0"
        readme = "README.md"
        license = "Apache-2.0"
        classifiers = ["License :: OSI Approved :: MIT License"]
        dependencies = ["scheduler-kernel", "scheduler-toolkit>=0.1", "attrs>=23.1"]

        [project.urls]
        Homepage = "https://elsewhere.example/bad"
    """), encoding="utf-8")
    (bad / "README.md").write_text("See [the CLI](docs/cli.md), [up](../../docs/x.md#a) and [ok](https://x.example/y)"
                                   " and [here](#here).\n\n[ref]: ../README.md\n\n```md\n[code](docs/not-a-link.md)\n```\n",
                                   encoding="utf-8")
    found = metadata_problems(bad, Rules("0.1.0", "https://github.com/example/scheduler", (ROOT / "LICENSE").read_bytes()))
    expected = ["license is 'Apache-2.0'", "license-files is None", "LICENSE is missing", "no authors",
                "licence classifier", "Project-URL Homepage", "Project-URL Documentation", "Project-URL Repository",
                "Project-URL Issues", "depends on scheduler-kernel, not", "depends on scheduler-toolkit>=0.1, not",
                "links 'docs/cli.md'", "links '../../docs/x.md#a'", "links '../README.md'"]
    for fragment in expected:
        assert sum(fragment in line for line in found) == 1, (fragment, found)
    assert len(found) == len(expected), found
    # The next kernel minor moves the pin: a good distribution not following it is caught.
    shell = ROOT / "plugins" / "scheduler-executor-shell"
    assert metadata_problems(shell, _rules()) == []
    assert metadata_problems(shell, attrs.evolve(_rules(), kernel_version="0.2.0")) == [
        "scheduler-executor-shell: depends on scheduler-kernel<0.2,>=0.1, not scheduler-kernel<0.3,>=0.2 (the kernel's series)",
        "scheduler-executor-shell: depends on scheduler-toolkit<0.2,>=0.1, not scheduler-toolkit<0.3,>=0.2 (the kernel's series)"]


def test_minor_series() -> None:
    assert minor_series("0.1.0") == SpecifierSet(">=0.1,<0.2")
    assert minor_series("0.2.3") == SpecifierSet(">=0.2,<0.3")
    assert minor_series("1.4.0") == SpecifierSet(">=1,<2")
    assert "0.1.7" in minor_series("0.1.0") and "0.2.0" not in minor_series("0.1.0")
