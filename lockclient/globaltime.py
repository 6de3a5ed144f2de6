"""TryUpdateGlobalTime (thesis listing 8), guarded by a majority of clocks (DESIGN.md §4).

The ``GlobalTime`` cell holds a time in µs and is always written with
``USING TIMESTAMP <that same value>``. Last-write-wins then *is* max(): a
write of a smaller value has a smaller timestamp and loses, whichever replica
sends it and in whatever order writes arrive (thesis theorem 5). Global time
therefore never decreases, with no coordination between replicas.

What a replica may publish is the whole question. The thesis published the local clock, so one
clock running ahead dragged global time ahead for everyone, for good (it never comes back down).
The first fix here compared the local clock with "the last global value + elapsed" — but that
value is what a fast replica itself had published, so a clock running 1.6× fast passed every
check and moved global time 20 s ahead in 40 s (issue 22). The bound has to come from *other
clocks*, and from enough of them that faulty ones cannot outvote the correct ones.

**The rule.** ``n`` = configured replicas (``TIMESVC_REPLICAS``), at most ``f = n - (n//2 + 1)``
of them faulty (any wall clock: fast at any rate, slow, stepping, stopped, lying). Every tick each
replica publishes its clock reading beside the value (``clock:<id>`` cells: wall clock, a sequence
number, its configured ``n``). At each run a replica collects the *fresh* readings — its own
clock, exactly, and each peer whose sequence number it saw change within ``stale_after`` on its
own monotonic clock (a reading it has only seen once, e.g. a dead replica's, is not fresh) — each
extrapolated by its own monotonic clock since it first saw it, conservatively: slowed by the rate
bound ``ρ`` (:data:`RATE_BOUND`) on both clocks, so a correct peer's extrapolated reading is never
above that peer's clock. With ``k`` fresh readings, ``n' = max(n, k, the largest n any reading in
the row says)``, ``m = n'//2 + 1`` and ``f' = n' - m``:

* **support** ``S`` = the ``(f'+1)``-th largest fresh reading, defined when ``k >= m``. At most
  ``f'`` readings are faulty, so the largest ``f'+1`` hold a correct one: ``S`` is at most some
  correct clock, and so at most real time + ``max_skew/2`` when correct clocks are within
  ``max_skew/2`` of real time.
* **candidate** = ``min(trusted clock, S + slack)`` (``slack`` = ``max_skew/2``), then at least the
  **carry** ``observed + elapsed · (1 - ρ)``: the last value known to be persisted, advanced by
  this replica's monotonic clock since the read that returned it *completed*, slowed by ``ρ`` so
  that a monotonic clock running fast by up to ``ρ`` cannot drag global time either. The carry
  is why global time never freezes while one replica runs (the thesis' 10-minute freeze) —
  even with no majority fresh, when the candidate is the carry alone.
* **trusted clock**: the local clock enters the candidate as far as it is trusted — down at once,
  up at most ρ faster than this replica's monotonic clock, never below ``min(local, S)``. So a clock
  that jumps ahead or runs fast *while its replica runs* moves the candidate no faster than 1 + ρ:
  clients extrapolate global time at real rate between answers, and a step would put the tickets of
  samples taken before it behind values read after it. (Slewing global time itself does not work:
  the value read from the store is a sample already up to a tick old, and replicas anchored on it
  were held behind their own clocks.)

So every value is at most ``max(S + slack, carry)``: **at most real time + max_skew**, whatever a
minority of clocks does; a faulty clock can lift global time above the correct clocks by at most
``slack``, and only at rate ρ. Why a slack at all: the peers' readings are seen through the
store, up to one tick late, so without it the replica with the highest correct clock would always
be held to a lagging peer and global time would trail real time by the observation delay and jump
when /now traffic shortens it (docs/design-global-time.md).

**Refusal.** A replica whose clock differs from the support by more than ``max_skew``
(``"clock"``; ahead: beyond how late it may have seen the support's reading, too; it stays refused
until it has agreed for ``stale_after``), or whose configuration is contradicted by a running peer
configured for more replicas (``"replicas"``: it may be running with ``TIMESVC_REPLICAS`` too low),
*refuses*: it publishes only the carry, never its clock, and says so (:attr:`UpdateResult.refusing`).
The counts are used in the rule itself (``n'``), so a replica configured for too few cannot be its
own majority — not even alone, while its peers' readings are in the row (:data:`READING_EXPIRY`).

**Current.** A replica's answers are *current* when its last run with a support found global time
at most ``max_skew`` below it — or, while it has never seen a majority, when its own clock agrees
with global time within ``max_skew``. Otherwise it may hold a value left behind by an outage, and
``timesvc`` answers 503 instead.

``guard=False`` (the store-backed clock on one machine) skips all of this: it publishes
``max(local, observed + elapsed)``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from lockclient.errors import ClockError, StoreError
from lockclient.logs import get_logger
from lockclient.runtime import THREADS, Runtime
from lockclient.store import CellStore, Table

__all__ = [
    "CLOCK_PREFIX",
    "GLOBAL_TIME_COLUMN",
    "GLOBAL_TIME_ROW",
    "RATE_BOUND",
    "ClockReading",
    "GlobalTimeNotCurrent",
    "GlobalTimeNotEstablished",
    "GlobalTimeReading",
    "GlobalTimeUpdater",
    "UpdateResult",
    "check_answerable",
    "read_global_time",
    "read_global_time_row",
    "wall_clock_us",
]

GLOBAL_TIME_ROW = "GlobalTime"
GLOBAL_TIME_COLUMN = "value"
SOURCE_COLUMN = "source"
CLOCK_PREFIX = "clock:"
"""Cells ``clock:<replica id>`` in the GlobalTime row: each replica's latest clock reading."""

RATE_BOUND = 500e-6
"""ρ: the largest rate error assumed of a correct wall clock and of every replica's monotonic
clock (500 ppm: the most the Linux kernel slews a clock for NTP)."""

READING_EXPIRY = 600.0
"""Seconds (on the observer's monotonic clock) after which a reading that has not changed is deleted
from the row: garbage collection of replicas that are gone — and how long a replica restarted with
``TIMESVC_REPLICAS`` too low still sees that its peers were configured for more. Not a TTL: a TTL is
judged by a wall clock (SQLite's, the reader's), and a replica whose clock is ten minutes ahead would
see every peer's reading expired and believe itself alone."""

TRUST_MARGIN_US = 50_000
"""How far beyond the support's lateness a starting replica's clock is still trusted at once: a
peer's write delay (the support counts from when its reading became visible, not when it was taken)."""

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
    replicas: int | None = None
    """The publisher's configured replica count (None: an older replica that does not say)."""
    timestamp: int = 0
    """The cell's write timestamp."""


@dataclass(frozen=True, slots=True)
class GlobalTimeReading:
    """The ``GlobalTime`` row as read: the value, who published it, and every replica's clock."""

    value_us: int | None
    publisher: str
    """Replica id of the publisher ("" if unknown)."""
    trusted: bool
    """Whether the value came from the clocks (not only from a carry)."""
    clocks: tuple[ClockReading, ...] = ()


def _parse_clock(column: str, raw: str, timestamp: int) -> ClockReading | None:
    try:
        data = json.loads(raw)
        replicas = data.get("n")
        return ClockReading(
            column[len(CLOCK_PREFIX) :],
            int(data["w"]),
            int(data["s"]),
            int(replicas) if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas > 0 else None,
            timestamp,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # a malformed reading counts for nobody


def read_global_time_row(store: CellStore) -> GlobalTimeReading:
    """The ``GlobalTime`` row (value may be None: nobody published yet). One row read."""
    cells = {c.column: c for c in store.read_row(Table.GLOBAL_TIME, GLOBAL_TIME_ROW)}
    clocks = tuple(
        reading
        for column, cell in sorted(cells.items())
        if column.startswith(CLOCK_PREFIX) and (reading := _parse_clock(column, cell.value, cell.timestamp)) is not None
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
    """No global time yet: the store is empty and no majority of fresh clock readings supports one."""


class GlobalTimeNotCurrent(GlobalTimeNotEstablished):
    """This replica cannot vouch that global time is current (see :attr:`UpdateResult.current`)."""


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """What one TryUpdateGlobalTime run saw and did."""

    now_us: int
    """A global time that is persisted (>= the cell), safe to hand out."""
    local_us: int
    """This machine's wall clock when the run's read completed."""
    published: bool
    """Whether this run wrote the cell."""
    runaway: bool
    """Whether the local clock was refused (``"clock"`` in :attr:`refusing`)."""
    fresh: int = 1
    """Fresh clock readings seen, this replica's own included."""
    needed: int = 1
    """How many fresh readings a support needs (a majority of ``max(replicas, fresh)``)."""
    support_us: int | None = None
    """The majority's support (None: fewer than ``needed`` fresh readings)."""
    refusing: dict[str, str] = field(default_factory=dict)
    """Why this replica published only the carry, by kind (``"clock"``, ``"replicas"``); empty
    when it did not refuse."""
    current: bool = True
    """Whether ``now_us`` is known to track real time: the last run with a support found global
    time at most ``max_skew`` below it (before any such run: the local clock agreed with it within
    ``max_skew``). False when global time may have been left behind by an outage: such a value is still safe
    (persisted, never decreasing), but tickets taken from it would sort ahead of waiters that
    arrived earlier with a current view — so ``timesvc`` does not hand it out (503)."""


@dataclass(slots=True)
class _Peer:
    seq: int
    wall_us: int
    first_seen_ns: int
    """Our monotonic clock when a read first returned this sequence number (after it completed)."""
    confirmed: bool
    """We saw the sequence number change: the peer is running (not a dead replica's last reading)."""
    unseen_ns: int = 0
    """How long before ``first_seen_ns`` our previous read started (which did not return this
    reading yet): how late we may have seen it, beyond what the extrapolation counts."""


class GlobalTimeUpdater:
    """One replica's TryUpdateGlobalTime. Thread-safe; runs are serialized.

    ``wall_us`` and ``monotonic_ns`` are injectable so tests can move time.
    ``replicas`` is how many timesvc replicas the deployment runs (the majority rule above);
    ``slack`` (default ``max_skew / 2``) how far above the majority's support a clock may lead;
    ``rate_bound`` is ρ. ``guard=False`` turns the rule off: only for updaters that run on demand
    on one machine (:class:`~lockclient.clock.StoreClock`), where every process shares one wall
    clock and global time is *expected* to be stale between calls.
    """

    def __init__(
        self,
        store: CellStore,
        *,
        replica_id: str,
        max_skew: float = 1.0,
        replicas: int = 1,
        stale_after: float = 2.0,
        slack: float | None = None,
        rate_bound: float = RATE_BOUND,
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
        if slack is not None and not 0 <= slack <= max_skew / 2:
            raise ValueError(f"slack must be within [0, max_skew/2], got {slack}")
        if not 0 <= rate_bound < 0.1:
            raise ValueError(f"rate_bound must be within [0, 0.1), got {rate_bound}")
        if not replica_id or ":" in replica_id:
            raise ValueError(f"replica_id must be non-empty and contain no ':', got {replica_id!r}")
        self._store = store
        self._guard = guard
        self._replica_id = replica_id
        self._replicas = replicas
        self._max_skew_us = int(max_skew * 1_000_000)
        self._slack_us = int((max_skew / 2 if slack is None else slack) * 1_000_000)
        self._rho = rate_bound
        # A correct peer's clock advanced at least (1 - ρ) real seconds per real second, and our
        # monotonic clock at most (1 + ρ): per second of ours, at least this much of theirs.
        self._peer_rate = (1 - rate_bound) / (1 + rate_bound)
        self._stale_after_ns = int(stale_after * 1_000_000_000)
        self._expiry_ns = int(max(READING_EXPIRY, 20 * stale_after) * 1_000_000_000)
        self._expired: dict[str, int] = {}
        """Peers' readings unchanged for the expiry: replica -> the cell's write timestamp."""
        self._wall_us = wall_us
        self._monotonic_ns = monotonic_ns
        self._lock = runtime.lock()  # held across the store calls of one run
        # The last global value known to be persisted, and when (monotonic ns, read completion).
        self._observed_us: int | None = None
        self._observed_at_ns = 0
        self._peers: dict[str, _Peer] = {}
        self._last_read_started_ns: int | None = None
        self._seq = 0
        self._clock_ts = 0
        self._refusing: dict[str, str] = {}
        self._clock_refusal: str | None = None
        self._clock_agreed_since_ns: int | None = None
        self._trusted: tuple[int, int] | None = None
        """Our clock as far as we trust it, and when (monotonic ns): see :meth:`_trusted_clock`."""
        self._current = not guard
        self.last_publisher = ""
        self.peer_offsets_us: dict[str, int] = {}
        """Each fresh peer's extrapolated clock minus ours at the last run (for /status)."""
        self.replicas_seen = 1
        """Fresh readings at the last run, ours included (more than ``replicas``: more are running
        than configured — a rolling update's surge, or a configuration to fix)."""

    @property
    def runaway(self) -> bool:
        """True when the last run refused the local clock."""
        return "clock" in self._refusing

    @property
    def refusing(self) -> dict[str, str]:
        """Why the last run published only the carry (empty: it did not refuse)."""
        return dict(self._refusing)

    def update(self, *, report_clock: bool = False) -> UpdateResult:
        """Run TryUpdateGlobalTime once: read the row, maybe publish, return a persisted time.

        ``report_clock`` also publishes this replica's clock reading (the scheduled ticks do;
        ``/now`` requests do not, so a flood of requests writes no more than the ticks)."""
        with self._lock:
            read_started = self._monotonic_ns()
            reading = read_global_time_row(self._store)
            read_done = self._monotonic_ns()
            # The clock is read when the row read completed, where the peers' readings are
            # extrapolated to and the carry is anchored: a clock read before the round trip would
            # be late by it, and the slew below would then hold it back by the slowest recent trip.
            local = self._wall_us()
            read = reading.value_us
            if not self._guard:
                return self._update_unguarded(local, reading, read_done)
            unseen = read_done - (read_started if self._last_read_started_ns is None else self._last_read_started_ns)
            self._last_read_started_ns = read_started
            choice = self._choose(local, reading, read_done, unseen)
            candidate = choice.candidate
            published = candidate is not None and (read is None or candidate > read)
            writes: list[Callable[[], None]] = []
            if published:
                assert candidate is not None
                value = candidate
                # USING TIMESTAMP == value: last-write-wins makes the cell a max-register.
                # The source cell goes in the same single-partition write with the same
                # timestamp, so a reader sees a value together with its publisher.
                source = f"{'ok' if choice.from_clocks else 'carry'}:{self._replica_id}"
                writes.append(
                    lambda: self._store.put_cells(
                        Table.GLOBAL_TIME,
                        GLOBAL_TIME_ROW,
                        {GLOBAL_TIME_COLUMN: str(value), SOURCE_COLUMN: source},
                        timestamp=value,
                    )
                )
            if report_clock:
                # Our reading replaces our previous one: a timestamp above it (global time
                # never decreases, so this also beats readings from before a restart).
                self._seq += 1
                stamp = max(candidate or 0, read or 0, self._clock_ts + 1)
                self._clock_ts = stamp
                # "r" (we refuse our own clock) is for whoever inspects the row, and for replicas
                # from before issue 24 that parse it; no reader here decides anything by it.
                reading_json = json.dumps(
                    {"w": local, "s": self._seq, "r": "clock" in choice.refusing, "n": self._replicas},
                    separators=(",", ":"),
                )
                writes.append(
                    lambda: self._store.put(
                        Table.GLOBAL_TIME,
                        GLOBAL_TIME_ROW,
                        CLOCK_PREFIX + self._replica_id,
                        reading_json,
                        timestamp=stamp,
                    )
                )
                # Garbage collection of replicas that are gone, by observation (READING_EXPIRY). The
                # tombstone is just above the reading it hides: the replica, if it ever comes back,
                # writes its next reading above global time, far above that.
                for replica, written in self._expired.items():
                    writes.append(partial(self._forget, CLOCK_PREFIX + replica, written + 1))
                self._expired = {}
            if writes:
                self._store.run_concurrently(writes)
            if published:
                self.last_publisher = self._replica_id
            elif reading.publisher:
                self.last_publisher = reading.publisher
            if candidate is None and read is None:
                raise GlobalTimeNotEstablished(
                    f"no global time yet: the store holds none, and the first value needs a majority of "
                    f"fresh clock readings ({choice.needed}); {choice.fresh} seen"
                )
            now = max(x for x in (read, candidate) if x is not None)
            # `now` is persisted (or about to be, by this run's write, before anyone is told);
            # anchor the carry at read completion: `now` was true no later than then.
            self._observed_us, self._observed_at_ns = now, read_done
            if choice.support is not None:
                self._current = now >= choice.support - self._max_skew_us
            elif not self._current:
                # No majority to ask (the others are down or paused): global time is as current as
                # before, and it becomes current if our own clock agrees with it. Publishing is not
                # at stake here (without a support only the carry is published), only whether to
                # hand out a value that an outage may have left behind.
                self._current = abs(local - now) <= self._max_skew_us
            if choice.refusing.keys() != self._refusing.keys():
                if choice.refusing:
                    log.warning(
                        "clock_refused",
                        local_us=local,
                        support_us=choice.support,
                        reasons=choice.refusing,
                        detail="publishing only the carry (observed + elapsed), never this clock",
                    )
                else:
                    log.info("clock_refusal_ended", local_us=local, support_us=choice.support)
            self._refusing = choice.refusing
            return UpdateResult(
                now_us=now,
                local_us=local,
                published=published,
                runaway="clock" in choice.refusing,
                fresh=choice.fresh,
                needed=choice.needed,
                support_us=choice.support,
                refusing=dict(choice.refusing),
                current=self._current,
            )

    def _forget(self, column: str, timestamp: int) -> None:
        self._store.delete(Table.GLOBAL_TIME, GLOBAL_TIME_ROW, column, timestamp=timestamp)

    def _update_unguarded(self, local: int, reading: GlobalTimeReading, read_done: int) -> UpdateResult:
        """``guard=False``: publish ``max(local, observed + elapsed)`` (caller holds the lock)."""
        read = reading.value_us
        candidate = local
        if self._observed_us is not None:
            candidate = max(candidate, self._observed_us + (read_done - self._observed_at_ns) // 1_000)
        published = read is None or candidate > read
        if published:
            self._store.put_cells(
                Table.GLOBAL_TIME,
                GLOBAL_TIME_ROW,
                {GLOBAL_TIME_COLUMN: str(candidate), SOURCE_COLUMN: f"ok:{self._replica_id}"},
                timestamp=candidate,
            )
            self.last_publisher = self._replica_id
        elif reading.publisher:
            self.last_publisher = reading.publisher
        now = candidate if read is None else max(read, candidate)
        if self._observed_us is None or now > self._observed_us + (read_done - self._observed_at_ns) // 1_000:
            self._observed_us, self._observed_at_ns = now, read_done
        return UpdateResult(now_us=now, local_us=local, published=published, runaway=False)

    def _fresh(
        self, local: int, reading: GlobalTimeReading, now_ns: int, unseen_ns: int
    ) -> tuple[list[tuple[int, int]], int, int]:
        """The fresh readings, each with how late we may have seen it — ours first, exact; each
        running peer's extrapolated to now — and the largest replica count the fresh readings, and
        any reading in the row, were configured with (caller holds the lock)."""
        values = [(local, 0)]
        offsets: dict[str, int] = {}
        claimed_fresh = claimed_any = 0
        for peer in reading.clocks:
            if peer.replica == self._replica_id:
                continue
            if peer.replicas is not None:
                claimed_any = max(claimed_any, peer.replicas)
            known = self._peers.get(peer.replica)
            if known is None:
                # First sight: it may be the last reading of a replica that is gone. Fresh only
                # once we see its sequence number change.
                self._peers[peer.replica] = _Peer(peer.seq, peer.wall_us, now_ns, confirmed=False)
                continue
            if known.seq != peer.seq:
                known = self._peers[peer.replica] = _Peer(peer.seq, peer.wall_us, now_ns, True, unseen_ns)
            if now_ns - known.first_seen_ns > self._expiry_ns:
                self._expired[peer.replica] = peer.timestamp
            if not known.confirmed or now_ns - known.first_seen_ns > self._stale_after_ns:
                continue  # not seen running lately
            # The reading was taken before the read that returned it completed (first_seen), so
            # extrapolating from then, at the slowest rate a correct clock can have against ours,
            # never goes above a correct peer's clock.
            estimate = known.wall_us + int((now_ns - known.first_seen_ns) * self._peer_rate) // 1_000
            values.append((estimate, known.unseen_ns // 1_000))
            offsets[peer.replica] = estimate - local
            if peer.replicas is not None:
                claimed_fresh = max(claimed_fresh, peer.replicas)
        present = {peer.replica for peer in reading.clocks}
        for gone in [name for name in self._peers if name not in present]:
            del self._peers[gone]  # its reading was deleted
        self.peer_offsets_us = offsets
        self.replicas_seen = len(values)
        return values, claimed_fresh, claimed_any

    def _choose(self, local: int, reading: GlobalTimeReading, read_done: int, unseen_ns: int) -> _Choice:
        """The candidate to publish (None: nothing may be published yet) and why (caller holds the lock)."""
        read = reading.value_us
        values, claimed_fresh, claimed_any = self._fresh(local, reading, read_done, unseen_ns)
        fresh = len(values)
        # A peer configured for more replicas, even one that stopped a while ago, means we may be
        # running with TIMESVC_REPLICAS too low: count with the largest (a majority of that many).
        deployed = max(self._replicas, fresh, claimed_any)
        needed = deployed // 2 + 1
        faulty = deployed - needed
        support: int | None = None
        late_us = 0
        if fresh >= needed:
            support, late_us = sorted(values, reverse=True)[faulty]
        refusing: dict[str, str] = {}
        if claimed_fresh > self._replicas:
            refusing["replicas"] = (
                f"configured for {self._replicas} replicas (TIMESVC_REPLICAS), but a running peer is configured "
                f"for {claimed_fresh}; {fresh} fresh clock readings seen"
            )
        # The support is a lower bound, late by up to when we first saw its reading: a clock ahead
        # of it is refused only beyond that too (a clock behind it is wrong at max_skew already).
        if support is not None:
            offset = local - support
            if not -self._max_skew_us <= offset <= self._max_skew_us + late_us:
                self._clock_agreed_since_ns = None
                self._clock_refusal = (
                    f"local clock {offset / 1e6:+.3f}s from the support of a majority of fresh clock "
                    f"readings ({fresh} seen), beyond max_skew {self._max_skew_us / 1e6:g}s"
                )
            elif self._clock_refusal is not None:
                # Refused until it has agreed for stale_after: a replica that sees its peers late
                # (a slow process) must not flap between refusing and publishing.
                if self._clock_agreed_since_ns is None:
                    self._clock_agreed_since_ns = read_done
                elif read_done - self._clock_agreed_since_ns >= self._stale_after_ns:
                    self._clock_refusal = None
        if self._clock_refusal is not None:
            refusing["clock"] = self._clock_refusal
        trusted = self._trusted_clock(local, read_done, support, late_us)
        if self._observed_us is None and read is not None:
            self._observed_us, self._observed_at_ns = read, read_done
        carry = None
        if self._observed_us is not None:
            carry = self._observed_us + int((read_done - self._observed_at_ns) * (1 - self._rho)) // 1_000
        clocks = None
        if support is not None and trusted is not None and not refusing:
            clocks = min(trusted, support + self._slack_us)
        if clocks is None:
            return _Choice(carry, False, fresh, needed, support, refusing)
        if carry is None or clocks >= carry:
            return _Choice(clocks, True, fresh, needed, support, refusing)
        return _Choice(carry, False, fresh, needed, support, refusing)

    def _trusted_clock(self, local: int, now_ns: int, support: int | None, late_us: int) -> int | None:
        """Our clock as far as we trust it: it follows the wall clock down at once, but up at most
        ρ faster than our monotonic clock — so a clock that jumps ahead or runs fast while we run
        moves what we publish no faster than rate 1 + ρ (clients extrapolate global time at real
        rate: a step would put tickets taken before it behind values read after it). Trust starts
        at the first support: our clock if it is within the support's lateness of it (a correct
        clock, seen through the store's delay), else the support plus that lateness."""
        if support is None and self._trusted is None:
            return None
        if self._trusted is None:
            start = min(local, support + late_us + TRUST_MARGIN_US) if support is not None else local
            self._trusted = (start, now_ns)
            return start
        value, at = self._trusted
        trusted = min(local, value + int((now_ns - at) * (1 + self._rho)) // 1_000)
        if support is not None:
            # Never held below the support (after our clock was back from a jump down): up to the
            # support is no step — it is at most a correct clock, which global time follows anyway.
            trusted = max(trusted, min(local, support))
        self._trusted = (trusted, now_ns)
        return trusted


@dataclass(frozen=True, slots=True)
class _Choice:
    candidate: int | None
    from_clocks: bool
    fresh: int
    needed: int
    support: int | None
    refusing: dict[str, str]


def check_answerable(result: UpdateResult, replica: str) -> None:
    """Whether a replica may hand out ``result.now_us`` (``/now``): raises
    :class:`GlobalTimeNotCurrent` while global time is not current for it
    (:attr:`UpdateResult.current`: it has not seen a majority of fresh clock readings confirm it,
    and its own clock disagrees with it) — clients then use another replica, or retry, instead of
    taking tickets that may lag real time by as long as the store or the other replicas were out —
    and while it refuses its own clock: it could only hand out the stored value and its carry
    (never its clock), which advance in steps of the other replicas' writes; clients extrapolate
    between answers at real rate, so they are better served by a replica that follows a clock. (A
    replica refusing only because a peer is configured for more replicas still answers: that is a
    rolling update's transient as often as a mistake.)"""
    if "clock" in result.refusing:
        raise GlobalTimeNotCurrent(
            f"replica {replica} refuses its own clock ({result.refusing['clock']}): ask another replica"
        )
    if not result.current:
        seen = (
            f"{result.fresh} fresh clock readings of the {result.needed} a majority needs"
            if result.support_us is None
            else f"global time is {(result.support_us - result.now_us) / 1e6:.3f}s behind their support"
        )
        raise GlobalTimeNotCurrent(
            f"replica {replica} cannot vouch that global time is current: {seen}, and its own clock is "
            f"{(result.local_us - result.now_us) / 1e6:+.3f}s from it — global time may be stale (its publishers "
            "were down or could not write) or this clock is wrong"
        )
