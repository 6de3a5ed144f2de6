"""The README documents every setting each component reads, and its quick start is the two commands."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from leasewatch.settings import LeasewatchSettings
from lockclient.settings import ClientSettings, env_names
from timesvc.settings import TimesvcSettings

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


@pytest.mark.parametrize("settings", [ClientSettings, TimesvcSettings, LeasewatchSettings])
def test_every_setting_is_documented_in_the_readme(settings: type[BaseSettings]) -> None:
    missing = sorted(name for name in env_names(settings) if f"`{name}`" not in README)
    assert not missing, f"README does not document {missing}"


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
