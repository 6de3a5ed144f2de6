"""A fenced resource: refuses writes carrying a fencing token older than one it already accepted.

The fencing-token answer to the Redlock critique: a holder paused past its lease
(GC, SIGSTOP, a slow disk) wakes up still believing it holds the lock. Its
token is smaller than the next holder's, so a resource that remembers the
highest token it accepted can refuse it. The check and the write must be one
atomic step at the resource — checking first and writing later would let the
paused holder slip in between — so :meth:`FencedResource.write` performs both
in one compare-and-set on the store's versioned table.

Example::

    guard = FencedResource(store, "ledger:42")
    with locker.get_lock("account:42") as lock:
        guard.write(lock.fencing_token, "balance", "100")   # raises StaleFencingToken if superseded
"""

from __future__ import annotations

from lockclient.errors import ChronolockError
from lockclient.store import CellStore

__all__ = ["FencedResource", "StaleFencingToken"]

_MAX = "~max-token"
_ROW_PREFIX = "fenced-resource:"


class StaleFencingToken(ChronolockError):
    """A write carried a fencing token smaller than one the resource already accepted."""

    def __init__(self, token: int, highest: int, resource: str) -> None:
        super().__init__(f"fencing token {token} is stale: {resource!r} already accepted {highest}")
        self.token = token
        self.highest = highest


class FencedResource:
    """A small fenced key-value register over a :class:`CellStore` (needs compare-and-set)."""

    def __init__(self, store: CellStore, name: str) -> None:
        if not name:
            raise ValueError("a fenced resource needs a name")
        self.store = store
        self.name = name
        self._row = _ROW_PREFIX + name

    def highest_token(self) -> int:
        raw = self.store.read_versioned(self._row).get(_MAX)
        return int(raw) if raw is not None else 0

    def admit(self, token: int) -> None:
        """Record ``token`` as seen; raise :class:`StaleFencingToken` if a larger one was."""
        self._apply(token, {})

    def write(self, token: int, key: str, value: str | None) -> None:
        """Set (``None``: delete) ``key`` iff no larger token was accepted — atomically."""
        if key == _MAX:
            raise ValueError(f"{_MAX!r} is reserved")
        self._apply(token, {key: value})

    def read(self, key: str) -> str | None:
        return self.store.read_versioned(self._row).get(key)

    def _apply(self, token: int, writes: dict[str, str | None]) -> None:
        if isinstance(token, bool) or not isinstance(token, int) or token <= 0:
            raise ValueError(f"a fencing token is a positive integer, got {token!r}")
        while True:
            row = self.store.read_versioned(self._row)
            raw = row.get(_MAX)
            highest = int(raw) if raw is not None else 0
            if token < highest:
                raise StaleFencingToken(token, highest, self.name)
            expected: dict[str, str | None] = {_MAX: raw}
            expected.update({key: row.get(key) for key in writes})
            updates: dict[str, str | None] = {_MAX: str(token), **writes}
            if self.store.compare_and_set(self._row, expected, updates).applied:
                return
            # Someone else wrote in between; re-read and re-check (never a blind retry).
