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
        guard.write(lock.fencing_token, "balance", "100", holder=lock.owner)  # StaleFencingToken if superseded
"""

from __future__ import annotations

from collections.abc import Callable

from lockclient.errors import ChronolockError, StoreOutcomeUnknown, StoreUnavailable
from lockclient.runtime import THREADS, Runtime
from lockclient.store import CellStore, VersionedTable
from lockclient.store.base import new_attempt_id

__all__ = ["FencedResource", "StaleFencingToken"]

_MAX = "~max-token"
"""The highest token accepted, by whom, and the attempt that wrote it: ``"<token>|<holder>|<attempt>"``
(holder may be empty; records written before attempt ids are ``"<token>|<holder>"``). The attempt id
makes every write's value its own, so an outcome the store could not tell is settled exactly by
reading it back (DESIGN.md §7.7)."""


class StaleFencingToken(ChronolockError):
    """A write carried a fencing token the resource must refuse: smaller than one it already
    accepted, or equal to one accepted from a different holder."""

    def __init__(
        self, token: int, highest: int, resource: str, *, holder: str | None = None, maybe_applied: bool = False
    ) -> None:
        if token == highest:
            detail = f"fencing token {token} was already used by another holder ({holder or 'unnamed'}) on {resource!r}"
        else:
            detail = f"fencing token {token} is stale: {resource!r} already accepted {highest}"
        if maybe_applied:
            detail += (
                " (an earlier attempt of this write had an unknown outcome: it may have been accepted "
                "before the newer token's write)"
            )
        super().__init__(detail)
        self.token = token
        self.highest = highest
        self.maybe_applied = maybe_applied
        """The write's outcome was unknown and a newer token wrote since: it may have been
        accepted first (in token order, as fencing allows) — the refusal cannot tell."""


def _parse_max(raw: str | None) -> tuple[int, str]:
    if raw is None:
        return 0, ""
    number, _, rest = raw.partition("|")
    return int(number), rest.partition("|")[0]


class FencedResource:
    """A small fenced key-value register over a :class:`CellStore` (needs compare-and-set).

    Rows live in their own versioned table (``fenced_resource``), so a resource's name can
    never collide with a lock id. Pass ``holder=lock.owner`` with the token: the resource
    then also refuses an *equal* token from a different holder — which two holders can
    only have if two datacenters each granted the lock (``lock_scope=datacenter``) or the
    store lost acknowledged writes; with ``holder`` omitted, equal tokens are accepted
    from anyone who also omits it (the single-writer case).
    """

    def __init__(self, store: CellStore, name: str, *, runtime: Runtime = THREADS) -> None:
        if not name:
            raise ValueError("a fenced resource needs a name")
        self.store = store
        self.name = name
        self._runtime = runtime

    def _row(self) -> dict[str, str]:
        return self.store.read_versioned(self.name, table=VersionedTable.FENCED)

    def highest_token(self) -> int:
        return _parse_max(self._row().get(_MAX))[0]

    def admit(self, token: int, *, holder: str | None = None, timeout: float | None = 10.0) -> None:
        """Record ``token`` as seen; raise :class:`StaleFencingToken` if it must be refused."""
        self._retrying(lambda unsettled: self._apply(token, holder, {}, unsettled), timeout)

    def write(
        self, token: int, key: str, value: str | None, *, holder: str | None = None, timeout: float | None = 10.0
    ) -> None:
        """Set (``None``: delete) ``key`` iff ``token`` is acceptable — checked and written in
        one compare-and-set. While the store is unavailable the write is retried for up to
        ``timeout`` seconds (it is idempotent: the same token, holder and value again change
        nothing), then :class:`~lockclient.errors.StoreUnavailable` is raised."""
        if key == _MAX:
            raise ValueError(f"{_MAX!r} is reserved")
        self._retrying(lambda unsettled: self._apply(token, holder, {key: value}, unsettled), timeout)

    def _retrying(self, step: Callable[[bool], None], timeout: float | None) -> None:
        """Run ``step`` until it succeeds or ``timeout`` runs out. ``step`` is told whether an
        earlier attempt's outcome stayed unknown (it may have applied: a refusal that follows
        cannot say it did not)."""
        monotonic = self._runtime.monotonic
        deadline = None if timeout is None else monotonic() + timeout
        pause = 0.05
        unsettled = False
        while True:
            try:
                step(unsettled)
                return
            except StoreUnavailable as exc:
                unsettled = unsettled or isinstance(exc, StoreOutcomeUnknown)
                if deadline is not None and monotonic() + pause >= deadline:
                    raise
                self._runtime.sleep(pause)
                pause = min(pause * 2, 1.0)

    def read(self, key: str) -> str | None:
        return self._row().get(key)

    def _apply(self, token: int, holder: str | None, writes: dict[str, str | None], unsettled: bool = False) -> None:
        if isinstance(token, bool) or not isinstance(token, int) or token <= 0:
            raise ValueError(f"a fencing token is a positive integer, got {token!r}")
        if holder is not None and ("|" in holder or not holder):
            raise ValueError(f"holder must be a non-empty owner id without '|', got {holder!r}")
        mine = holder or ""
        uncertain = unsettled
        while True:
            row = self._row()
            raw = row.get(_MAX)
            highest, by = _parse_max(raw)
            if token < highest or (token == highest and by != mine):
                raise StaleFencingToken(token, highest, self.name, holder=by, maybe_applied=uncertain)
            expected: dict[str, str | None] = {_MAX: raw}
            expected.update({key: row.get(key) for key in writes})
            # A fresh attempt id per compare-and-set: "my value is there" proves this call applied.
            updates: dict[str, str | None] = {_MAX: f"{token}|{mine}|{new_attempt_id(self._runtime)}", **writes}
            result = self.store.compare_and_set(self.name, expected, updates, table=VersionedTable.FENCED)
            if result.applied:
                return
            uncertain = uncertain or result.uncertain
            # Someone else wrote in between; re-read and re-check (never a blind retry).
