"""Fixtures of the ``lockctl`` tests: a fresh SQLite store, its environment, background processes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.support import Background


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cells.db'}"


@pytest.fixture
def env(store_url: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOCK_")}
    environment["CHRONOLOCK_STORE_URL"] = store_url
    environment["COLUMNS"] = "200"  # help text and tables on one line each
    return environment


@pytest.fixture
def background(env: dict[str, str], tmp_path: Path) -> Iterator[Background]:
    started = Background(env, tmp_path)
    try:
        yield started
    finally:
        started.stop_all()
