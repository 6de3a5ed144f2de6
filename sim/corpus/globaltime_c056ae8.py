"""``lockclient/globaltime.py`` as it was at c056ae8, before issue 22: the runaway guard that compared
a replica's clock with the last *global* value (which a fast replica may itself have published),
and the "majority agrees" adoption that a replica configured with ``TIMESVC_REPLICAS=1`` satisfies
alone. Kept only so the simulator can show that its random search finds what the review found
(``sim/findings.py``); nothing else imports it. The one change: its lock comes from the runtime
(a plain lock held across store calls would deadlock the simulator's tasks).

Original module docstring follows:

TryUpdateGlobalTime (thesis listing 8) with the two fixes DESIGN.md §4 asks for.

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

**When may a replica publish its own clock although it is "ahead"?** Global time can
be *stale* — every replica was down for a while, and the cell holds the value of the
last one that died — and then every healthy replica's clock is ahead of ``observed +
elapsed``. Recovering from that must not reopen the hole the guard closes: one
runaway clock that sees no healthy peer for a few ticks (they were paused, or
partitioned from the store for two seconds) must not be able to adopt itself and drag
global time ten minutes ahead, permanently — the thesis' failure the other way round.

So every replica also publishes *its clock reading* beside the value (``clock:<id>``
cells in the same row, one write per tick; TTL'd, only as garbage collection), and a
replica whose clock looks runaway adopts it only when a **majority of the configured
replicas** (``replicas``, e.g. 3 → 2) have fresh clock readings that agree with it
within ``max_skew``. A reading is fresh if it changed within ``stale_after`` on the
observer's monotonic clock, and it is extrapolated by the observer's monotonic clock
since it was first seen — no wall clock is compared with another machine's reading
time. A lone runaway can never be a majority; after a full outage the healthy majority
recovers as soon as two of three replicas run again. Until then a replica publishes
``observed + elapsed``: global time keeps advancing at real rate, just behind wall time,
which costs the locks nothing (tickets only need order). The very first value, on an
empty store, needs the same majority — a runaway replica that starts first cannot set
global time ten minutes ahead either. ``replicas=1`` (one replica, nothing to outvote
it) adopts its own clock.

``guard=False`` (the store-backed clock on one machine) skips all of this: it
publishes ``max(local, observed + elapsed)``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from lockclient.errors import ClockError, StoreError
from lockclient.logs import get_logger
from lockclient.runtime import THREADS, Runtime
from lockclient.store import CellStore, Table

__all__ = [
    "CLOCK_PREFIX",
    "GLOBAL_TIME_COLUMN",
    "GLOBAL_TIME_ROW",
    "ClockReading",
    "GlobalTimeNotCurrent",
    "GlobalTimeNotEstablished",
    "GlobalTimeReading",
    "GlobalTimeUpdater",
    "UpdateResult",
    "read_global_time",
    "read_global_time_row",
    "wall_clock_us",
]

GLOBAL_TIME_ROW = "GlobalTime"
GLOBAL_TIME_COLUMN = "value"
SOURCE_COLUMN = "source"
CLOCK_PREFIX = "clock:"
"""Cells ``clock:<replica id>`` in the GlobalTime row: each replica's latest clock reading."""

log = get_logger("lockclient.globaltime")


def wall_clock_us() -> int:
    """This machine's wall clock in µs since the epoch."""
    return time.time_ns() // 1_000


@dataclass(frozen=True, slots=True)
class ClockReading:
    """One replica's published clock reading."""

    replica: str
    wall_us: int
    seq: int
    runaway: bool


@dataclass(frozen=True, slots=True)
class GlobalTimeReading:
    """The ``GlobalTime`` row as read: the value, who published it, and every replica's clock."""

    value_us: int | None
    publisher: str
    """Replica id of the publisher ("" if unknown)."""
    trusted: bool
    """Whether the publisher trusted its own clock (was not runaway)."""
    clocks: tuple[ClockReading, ...] = ()


def _parse_clock(column: str, raw: str) -> ClockReading | None:
    try:
        data = json.loads(raw)
        return ClockReading(column[len(CLOCK_PREFIX) :], int(data["w"]), int(data["s"]), bool(data.get("r", False)))
    except (ValueError, KeyError, TypeError):
        return None  # a malformed reading counts for nobody


def read_global_time_row(store: CellStore) -> GlobalTimeReading:
    """The ``GlobalTime`` row (value may be None: nobody published yet). One row read."""
    cells = {c.column: c for c in store.read_row(Table.GLOBAL_TIME, GLOBAL_TIME_ROW)}
    clocks = tuple(
        reading
        for column, cell in sorted(cells.items())
        if column.startswith(CLOCK_PREFIX) and (reading := _parse_clock(column, cell.value)) is not None
    )
    cell = cells.get(GLOBAL_TIME_COLUMN)
    if cell is None:
        return GlobalTimeReading(None, "", False, clocks)
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
    return GlobalTimeReading(value, publisher, trusted, clocks)


def read_global_time(store: CellStore) -> GlobalTimeReading | None:
    """The ``GlobalTime`` row, or ``None`` if nobody has published a value yet."""
    reading = read_global_time_row(store)
    return None if reading.value_us is None else reading


class GlobalTimeNotEstablished(ClockError):
    """No global time yet: the store is empty and no majority of replicas agrees on a clock."""


class GlobalTimeNotCurrent(GlobalTimeNotEstablished):
    """This replica cannot vouch that global time is current (see :attr:`UpdateResult.current`)."""


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
    agreeing: int = 0
    """How many replicas' fresh clocks agreed with ours within max_skew (ourselves included)."""
    current: bool = True
    """Whether ``now_us`` is known to track real time: this replica's clock agreed with global
    time (or a majority adopted a clock) at least once since it started. False for a replica
    that has only ever seen global time far behind its own clock: either global time is stale
    (the replicas that kept it were down or could not write, and the value is as old as the
    outage) or this clock runs ahead, and it cannot tell which. Such a value is still safe
    (persisted, never decreasing), but it may lag real time by the length of the outage, and
    tickets taken from it would jump ahead of waiters that arrived earlier with a current
    view — so ``timesvc`` does not hand it out (503) until the replica is in sync."""


class GlobalTimeUpdater:
    """One replica's TryUpdateGlobalTime. Thread-safe; runs are serialized.

    ``wall_us`` and ``monotonic_ns`` are injectable so tests can move time.
    ``replicas`` is how many timesvc replicas the deployment runs (the majority rule
    above). ``guard=False`` turns the runaway-clock guard off: only for updaters that run
    on demand on one machine (:class:`~lockclient.clock.StoreClock`), where every process
    shares one wall clock and global time is *expected* to be stale between calls.
    """

    def __init__(
        self,
        store: CellStore,
        *,
        replica_id: str,
        max_skew: float = 1.0,
        replicas: int = 1,
        stale_after: float = 2.0,
        guard: bool = True,
        wall_us: Callable[[], int] = wall_clock_us,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        runtime: Runtime = THREADS,
    ) -> None:
        if not max_skew > 0:
            raise ValueError(f"max_skew must be positive, got {max_skew}")
        if not stale_after > 0:
            raise ValueError(f"stale_after must be positive, got {stale_after}")
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        if not replica_id or ":" in replica_id:
            raise ValueError(f"replica_id must be non-empty and contain no ':', got {replica_id!r}")
        self._store = store
        self._guard = guard
        self._replica_id = replica_id
        self._majority = replicas // 2 + 1
        self._max_skew_us = int(max_skew * 1_000_000)
        self._stale_after_ns = int(stale_after * 1_000_000_000)
        self._clock_ttl = max(60.0, 20 * stale_after)
        self._wall_us = wall_us
        self._monotonic_ns = monotonic_ns
        self._lock = runtime.lock()
        # The last global value known to be persisted, and when (monotonic ns).
        self._observed_us: int | None = None
        self._observed_at_ns = 0
        # Other replicas' clock readings: (seq, wall_us) and when we first saw that seq.
        self._peers: dict[str, tuple[int, int, int]] = {}
        self._seq = 0
        self._clock_ts = 0
        self._runaway = False
        self._in_sync = not guard
        self.last_publisher = ""
        self.peer_offsets_us: dict[str, int] = {}
        """Each fresh peer's clock minus ours at the last run (for /status)."""

    @property
    def runaway(self) -> bool:
        """True when the last run rejected the local clock."""
        return self._runaway

    def update(self, *, report_clock: bool = False) -> UpdateResult:
        """Run TryUpdateGlobalTime once: read the row, maybe publish, return a persisted time.

        ``report_clock`` also publishes this replica's clock reading (the scheduled ticks do;
        ``/now`` requests do not, so a flood of requests writes no more than the ticks)."""
        with self._lock:
            local = self._wall_us()
            reading = read_global_time_row(self._store)
            read_done = self._monotonic_ns()
            read = reading.value_us
            candidate, runaway, agreeing = self._choose(local, reading, read_done)
            published = candidate is not None and (read is None or candidate > read)
            writes: list[Callable[[], None]] = []
            if published:
                assert candidate is not None
                value = candidate
                # USING TIMESTAMP == value: last-write-wins makes the cell a max-register.
                # The source cell goes in the same single-partition write with the same
                # timestamp, so a reader sees a value together with its publisher.
                source = f"{'runaway' if runaway else 'ok'}:{self._replica_id}"
                writes.append(
                    lambda: self._store.put_cells(
                        Table.GLOBAL_TIME,
                        GLOBAL_TIME_ROW,
                        {GLOBAL_TIME_COLUMN: str(value), SOURCE_COLUMN: source},
                        timestamp=value,
                    )
                )
            if report_clock and self._guard:
                # Our reading replaces our previous one: a timestamp above it (global time
                # never decreases, so this also beats readings from before a restart).
                self._seq += 1
                stamp = max(candidate or 0, read or 0, self._clock_ts + 1)
                self._clock_ts = stamp
                reading_json = json.dumps({"w": local, "s": self._seq, "r": runaway}, separators=(",", ":"))
                writes.append(
                    lambda: self._store.put(
                        Table.GLOBAL_TIME,
                        GLOBAL_TIME_ROW,
                        CLOCK_PREFIX + self._replica_id,
                        reading_json,
                        timestamp=stamp,
                        ttl=self._clock_ttl,  # only garbage collection of replicas that are gone
                    )
                )
            if writes:
                self._store.run_concurrently(writes)
            if published:
                self.last_publisher = self._replica_id
            elif reading.publisher:
                self.last_publisher = reading.publisher
            if candidate is None and read is None:
                raise GlobalTimeNotEstablished(
                    f"no global time yet: the store holds none, and the first value needs a majority of the "
                    f"configured replicas ({self._majority}) to agree on a clock; {agreeing} do"
                )
            now = max(x for x in (read, candidate) if x is not None)
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
            # Once in sync, observed + elapsed tracks real time on the monotonic clock, so a later
            # runaway verdict (this clock jumped ahead) still leaves now_us current.
            self._in_sync = self._in_sync or not runaway
            return UpdateResult(
                now_us=now,
                read_us=read,
                local_us=local,
                published=published,
                runaway=runaway,
                agreeing=agreeing,
                current=self._in_sync,
            )

    def _agreeing(self, local: int, reading: GlobalTimeReading, now_ns: int) -> list[int]:
        """Fresh clocks (ours included) within max_skew of ours, extrapolated to now."""
        clocks = [local]
        offsets: dict[str, int] = {}
        for peer in reading.clocks:
            if peer.replica == self._replica_id:
                continue
            known = self._peers.get(peer.replica)
            if known is None or known[0] != peer.seq:
                self._peers[peer.replica] = known = (peer.seq, peer.wall_us, now_ns)
            _, wall, first_seen = known
            if now_ns - first_seen > self._stale_after_ns:
                continue  # not changed for a while: that replica is not running
            estimate = wall + (now_ns - first_seen) // 1_000
            offsets[peer.replica] = estimate - local
            # Whether the peer called itself runaway does not matter: after a full outage every
            # healthy replica is "runaway" against the stale value. Agreement is what counts.
            if abs(estimate - local) <= self._max_skew_us:
                clocks.append(estimate)
        self.peer_offsets_us = offsets
        return clocks

    def _choose(self, local: int, reading: GlobalTimeReading, read_done: int) -> tuple[int | None, bool, int]:
        """The candidate to publish (None: nothing may be published yet), whether the local
        clock is runaway, and how many fresh clocks agree with it (caller holds the lock)."""
        read = reading.value_us
        estimate: int | None = None
        if self._observed_us is not None:
            estimate = self._observed_us + (read_done - self._observed_at_ns) // 1_000
        if read is not None:
            estimate = read if estimate is None else max(estimate, read)
        if not self._guard:
            return (local if estimate is None else max(local, estimate)), False, 1
        agreeing = self._agreeing(local, reading, read_done)
        if estimate is not None and local <= estimate + self._max_skew_us:
            return max(local, estimate), False, len(agreeing)
        if len(agreeing) >= self._majority:
            adopted = min(agreeing)  # the most conservative clock of the agreeing majority
            if estimate is not None:
                log.warning(
                    "global_time_stale",
                    local_us=local,
                    global_us=estimate,
                    behind_s=round((local - estimate) / 1e6, 6),
                    agreeing=len(agreeing),
                    detail="a majority of replicas agree on a clock ahead of GlobalTime; adopting it",
                )
                return max(adopted, estimate), False, len(agreeing)
            return adopted, False, len(agreeing)
        return estimate, estimate is not None, len(agreeing)
