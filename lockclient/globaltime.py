"""TryUpdateGlobalTime (thesis listing 8) with the two fixes DESIGN.md §4 asks for.

The ``GlobalTime`` cell holds a time in µs and is always written with
``USING TIMESTAMP <that same value>``. Last-write-wins then *is* max(): a
write of a smaller value has a smaller timestamp and loses, whichever replica
sends it and in whatever order writes arrive (thesis theorem 5). Global time
therefore never decreases, with no coordination between replicas.

The thesis left two failures open (its section 7); both are fixed here:

1. **Runaway clock.** A replica whose wall clock is far ahead would publish
   its clock and drag global time into the future for everyone, forever
   (it cannot come back down). So each replica remembers the last global
   value it observed and *when*, on its monotonic clock — taken when the read
   *completed*, because taking it when the read was sent would let every tick
   push global time ahead by one round trip. If the local clock is more than
   ``max_skew`` ahead of ``observed + elapsed``, the replica does not publish
   it: it publishes ``observed + elapsed`` and reports itself runaway.

2. **Freeze.** If a replica whose clock was ten minutes ahead published and
   then died, the thesis' healthy replicas (clocks behind the cell) never
   wrote again, and global time stood still for ten minutes. Here every
   candidate is at least ``observed + elapsed``, so global time advances at
   real rate, measured by monotonic clocks, whatever the wall clocks say.

One more case the guard alone would get wrong: global time left *stale*
because every replica was down for a while. Then every healthy replica's
clock is "ahead" of ``observed + elapsed`` and all would call themselves
runaway forever. A replica tells the two situations apart by watching who
publishes. Beside the value, each publish writes a ``source`` cell with the
same timestamp: the publisher's id and whether it trusted its own clock
(``ok``) or was guarded (``runaway``). A replica whose clock looks runaway
but which, for ``stale_after`` seconds of its own observation, has seen no
*other* replica publish as ``ok``, has nobody alive to contradict it: it
adopts its local clock (logged as ``global_time_stale``). A replica that is
merely fast among live ones sees them publish as ``ok`` and stays guarded.
(Counting any foreign write as evidence would fail: after a cold restart all
replicas publish guarded estimates, and each would keep the others guarded.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from lockclient.errors import StoreError
from lockclient.logs import get_logger
from lockclient.store import CellStore, Table

__all__ = [
    "GLOBAL_TIME_COLUMN",
    "GLOBAL_TIME_ROW",
    "GlobalTimeReading",
    "GlobalTimeUpdater",
    "UpdateResult",
    "read_global_time",
    "wall_clock_us",
]

GLOBAL_TIME_ROW = "GlobalTime"
GLOBAL_TIME_COLUMN = "value"
SOURCE_COLUMN = "source"

log = get_logger("lockclient.globaltime")


def wall_clock_us() -> int:
    """This machine's wall clock in µs since the epoch."""
    return time.time_ns() // 1_000


@dataclass(frozen=True, slots=True)
class GlobalTimeReading:
    """The ``GlobalTime`` row as read: the value and who published it."""

    value_us: int
    publisher: str
    """Replica id of the publisher ("" if unknown)."""
    trusted: bool
    """Whether the publisher trusted its own clock (was not runaway)."""


def read_global_time(store: CellStore) -> GlobalTimeReading | None:
    """The ``GlobalTime`` row, or ``None`` if nobody has written it yet. One row read."""
    cells = {c.column: c for c in store.read_row(Table.GLOBAL_TIME, GLOBAL_TIME_ROW)}
    cell = cells.get(GLOBAL_TIME_COLUMN)
    if cell is None:
        return None
    try:
        value = int(cell.value)
    except ValueError as exc:
        raise StoreError(f"GlobalTime cell holds {cell.value!r}, not an integer") from exc
    if value != cell.timestamp:
        # Only this module writes the cell, always with value == timestamp.
        raise StoreError(f"GlobalTime cell value {value} differs from its write timestamp {cell.timestamp}")
    source = cells.get(SOURCE_COLUMN)
    publisher, trusted = "", False
    if source is not None and source.timestamp == cell.timestamp:
        state, _, publisher = source.value.partition(":")
        trusted = state == "ok"
    return GlobalTimeReading(value_us=value, publisher=publisher, trusted=trusted)


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """What one TryUpdateGlobalTime run saw and did."""

    now_us: int
    """A global time that is persisted (>= the cell), safe to hand out."""
    read_us: int | None
    """The cell's value as read."""
    local_us: int
    """This machine's wall clock when the run started."""
    published: bool
    """Whether this run wrote the cell."""
    runaway: bool
    """Whether the local clock was rejected as runaway."""


class GlobalTimeUpdater:
    """One replica's TryUpdateGlobalTime. Thread-safe; runs are serialized.

    ``wall_us`` and ``monotonic_ns`` are injectable so tests can move time.
    ``guard=False`` turns the runaway-clock guard off: only for updaters that run
    on demand on one machine (:class:`~lockclient.clock.StoreClock`), where every
    process shares one wall clock and global time is *expected* to be stale
    between calls.
    """

    def __init__(
        self,
        store: CellStore,
        *,
        replica_id: str,
        max_skew: float = 1.0,
        stale_after: float = 2.0,
        guard: bool = True,
        wall_us: Callable[[], int] = wall_clock_us,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if max_skew <= 0:
            raise ValueError(f"max_skew must be positive, got {max_skew}")
        if stale_after <= 0:
            raise ValueError(f"stale_after must be positive, got {stale_after}")
        if not replica_id or ":" in replica_id:
            raise ValueError(f"replica_id must be non-empty and contain no ':', got {replica_id!r}")
        self._store = store
        self._guard = guard
        self._replica_id = replica_id
        self._max_skew_us = int(max_skew * 1_000_000)
        self._stale_after_ns = int(stale_after * 1_000_000_000)
        self._wall_us = wall_us
        self._monotonic_ns = monotonic_ns
        self._lock = threading.Lock()
        # The last global value known to be persisted, and when (monotonic ns).
        self._observed_us: int | None = None
        self._observed_at_ns = 0
        # Liveness of other replicas: when we first looked, and when we last
        # saw another replica publish a value it trusted.
        self._watching_since_ns: int | None = None
        self._trusted_foreign_at_ns: int | None = None
        self._last_read_us: int | None = None
        self._runaway = False
        self.last_publisher = ""

    @property
    def runaway(self) -> bool:
        """True when the last run rejected the local clock."""
        return self._runaway

    def update(self) -> UpdateResult:
        """Run TryUpdateGlobalTime once: read the cell, maybe publish, return a persisted time."""
        with self._lock:
            local = self._wall_us()
            reading = read_global_time(self._store)
            read_done = self._monotonic_ns()
            read = None if reading is None else reading.value_us
            candidate, runaway = self._choose(local, reading, read_done)
            published = read is None or candidate > read
            if published:
                # USING TIMESTAMP == value: last-write-wins makes the cell a max-register.
                # The source cell goes in the same single-partition write with the same
                # timestamp, so a reader sees a value together with its publisher.
                state = "runaway" if runaway else "ok"
                self._store.put_cells(
                    Table.GLOBAL_TIME,
                    GLOBAL_TIME_ROW,
                    {GLOBAL_TIME_COLUMN: str(candidate), SOURCE_COLUMN: f"{state}:{self._replica_id}"},
                    timestamp=candidate,
                )
                self.last_publisher = self._replica_id
            elif reading is not None:
                self.last_publisher = reading.publisher
            now = candidate if read is None else max(read, candidate)
            # `now` is persisted; anchor the estimate at read completion (conservative:
            # `now` was true no later than then, so observed + elapsed never runs ahead).
            if self._observed_us is None or now > self._observed_us + (read_done - self._observed_at_ns) // 1_000:
                self._observed_us, self._observed_at_ns = now, read_done
            if runaway != self._runaway:
                log.warning(
                    "runaway_clock" if runaway else "runaway_clock_recovered",
                    local_us=local,
                    global_us=now,
                    ahead_s=round((local - now) / 1e6, 6),
                )
            self._runaway = runaway
            return UpdateResult(now_us=now, read_us=read, local_us=local, published=published, runaway=runaway)

    def _choose(self, local: int, reading: GlobalTimeReading | None, read_done: int) -> tuple[int, bool]:
        """The candidate to publish and whether the local clock is runaway (caller holds the lock)."""
        if self._watching_since_ns is None:
            self._watching_since_ns = read_done
        read = None if reading is None else reading.value_us
        if reading is not None:
            moved = self._last_read_us is None or reading.value_us > self._last_read_us
            if moved and reading.trusted and reading.publisher != self._replica_id:
                self._trusted_foreign_at_ns = read_done
            self._last_read_us = (
                reading.value_us if self._last_read_us is None else max(reading.value_us, self._last_read_us)
            )

        estimate: int | None = None
        if self._observed_us is not None:
            estimate = self._observed_us + (read_done - self._observed_at_ns) // 1_000
        if read is not None:
            estimate = read if estimate is None else max(estimate, read)
        if estimate is None:
            return local, False  # the very first value anyone publishes
        if not self._guard or local <= estimate + self._max_skew_us:
            return max(local, estimate), False
        if self._global_time_is_stale(read_done):
            log.warning(
                "global_time_stale",
                local_us=local,
                global_us=estimate,
                behind_s=round((local - estimate) / 1e6, 6),
                detail="no other replica advanced GlobalTime while watching; adopting the local clock",
            )
            return local, False
        return estimate, True

    def _global_time_is_stale(self, now_ns: int) -> bool:
        assert self._watching_since_ns is not None
        if now_ns - self._watching_since_ns < self._stale_after_ns:
            return False
        last_foreign = self._trusted_foreign_at_ns
        return last_foreign is None or now_ns - last_foreign >= self._stale_after_ns
