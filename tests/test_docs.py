"""The documentation: the configuration reference lists every setting each component reads, the site's
pages are all in its nav, and the README stays short, with the two-command quick start.

The site itself is built with warnings as errors by `make docs` (part of `make test`): a broken link or
anchor, a page missing from the nav, or an included file that moved fails the build.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from pydantic_settings import BaseSettings

from leasewatch.settings import LeasewatchSettings
from lockclient.settings import ClientSettings, env_names
from timesvc.settings import TimesvcSettings

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
MKDOCS = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
README_MAX_LINES = 300


def _hook(name: str) -> ModuleType:
    """A build hook of mkdocs.yml, loaded by path as MkDocs loads it."""
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", DOCS / "hooks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> str:
    return str(_hook("settings_reference").reference())


@pytest.mark.parametrize("settings", [ClientSettings, TimesvcSettings, LeasewatchSettings])
def test_the_generated_reference_lists_every_setting(settings: type[BaseSettings], reference: str) -> None:
    rows = {m[1] for m in re.finditer(r"^\| `([A-Z0-9_]+)` \|", reference, flags=re.MULTILINE)}
    missing = sorted(env_names(settings) - rows)
    assert not missing, f"the configuration reference does not list {missing}"


def test_every_setting_has_a_description(reference: str) -> None:
    for settings in (ClientSettings, TimesvcSettings, LeasewatchSettings):
        undescribed = sorted(name for name, field in settings.model_fields.items() if not field.description)
        assert not undescribed, f"{settings.__name__} fields without description=: {undescribed}"


def test_the_configuration_page_takes_the_reference_from_the_hook() -> None:
    hook = _hook("settings_reference")
    assert hook.MARKER in (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert "docs/hooks/settings_reference.py" in MKDOCS
    page = hook.on_page_markdown(f"# Configuration\n\n{hook.MARKER}\n", None, None, None)
    assert "`CHRONOLOCK_STORE_URL`" in page and hook.MARKER not in page


def test_the_site_builds_offline() -> None:
    """No web fonts and no plugin that fetches from the internet: the build must work with PyPI as its
    only network (material's privacy and social plugins download at build time)."""
    config = yaml.safe_load(MKDOCS)
    assert config["strict"] is True
    assert config["theme"]["font"] is False
    assert config["plugins"] == ["search"], "a plugin that fetches (material's privacy, social) must stay off"


def test_every_page_is_in_the_nav() -> None:
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    listed = set(re.findall(r":\s*([\w./-]+\.md)\s*$", MKDOCS, flags=re.MULTILINE))
    assert pages - listed == set(), f"pages not in mkdocs.yml's nav: {sorted(pages - listed)}"
    assert listed - pages == set(), f"nav entries without a page: {sorted(listed - pages)}"


def test_the_readme_is_short_and_points_into_the_docs() -> None:
    lines = README.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the details belong in docs/"
    for page in ("guarantees.md", "api.md", "lockctl.md", "configuration.md", "operations.md"):
        assert f"(docs/{page}" in README, f"the README does not link docs/{page}"


def test_quick_start_is_make_up_and_make_test() -> None:
    quick_start = README.split("## Quick start", 1)[1].split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in quick_start.strip().splitlines()]
    assert commands == ["make up", "make test"]


def test_the_readme_export_line_names_the_store_by_absolute_path() -> None:
    """Issue 25: ``export CHRONOLOCK_STORE_URL=sqlite:///$PWD/...`` named a different database from
    every directory it was pasted in. The line must not depend on where the shell is."""
    lines = [line for line in README.splitlines() if line.startswith("export CHRONOLOCK_STORE_URL=")]
    assert lines, "the quick start shows the store export"
    for line in lines:
        url = line.split("=", 1)[1]
        assert "$" not in url and "`" not in url, line
        if url.startswith("sqlite:"):
            assert url.startswith("sqlite:////"), f"not an absolute path: {line}"
