"""Fixtures of the in-process watcher tests: a real SQLite store and an injected monotonic clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lockclient import CellStore, open_store


class FakeMonotonic:
    """A monotonic clock the test moves by hand (``clock.now += ...``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


@pytest.fixture
def clock() -> FakeMonotonic:
    return FakeMonotonic()
