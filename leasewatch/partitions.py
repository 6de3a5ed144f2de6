"""Replicas share the work: the lock-id space in partitions, one lease per partition (DESIGN.md §6).

The partitions are the lock index's 64 shards (``crc32(lock id) % 64``): a replica that
watches a partition reads that shard's index row and looks at its locks; the others do
not. Who watches what lives in the versioned table ``leasewatch_partition`` (written only
by compare-and-set, like a holder's lease):

* row ``members``: one cell per running replica (column ``<replica id>#<random>``, fresh at
  every start), a heartbeat renewed every ``lease/3`` — how the replicas learn of each
  other, including a new one that watches nothing yet;
* rows ``"0"`` … ``"63"``: cell ``~owner``, the replica watching that partition, renewed
  with the heartbeat.

Every ``refresh`` a replica reads those 65 rows at once, judges each cell it does not
own **by observation, exactly like a lock lease**: unchanged on its own monotonic clock,
stamped when the read completed, for longer than that cell's lease + grace means its
writer stopped. From the members it sees alive (itself included) every replica computes
the same assignment — rendezvous hashing with a cap of ``ceil(64 / members)`` per replica
— and then, each by compare-and-set on the value it read:

* claims an unowned partition assigned to it;
* takes over a partition assigned to it whose owner's cell went stale — so a dead
  replica's partitions are taken over within ``lease + grace`` (+ one refresh) of its
  last renewal;
* hands back a partition it owns that is now assigned to a live other replica (a
  replica joined), which claims it at its next refresh;
* deletes member cells gone stale (dead replicas).

**Safety never depends on this.** Every revocation is a compare-and-set on a lease value
the revoking watcher itself saw unchanged for lease + grace; two replicas watching one
partition (views differ for a moment, or a paused owner wakes up) revoke nothing early
and each lease at most once. Partitions only decide who does the work. A replica that
takes a partition over has no observations of its locks, so it revokes nothing there
before it has watched each lease for a full lease + grace itself (the watcher's first-
sighting rule) — never early, only later: a dead holder in a dead replica's partition
is revoked within ``partition lease + grace + refresh`` (the take-over) plus the usual
bound. A replica that hands a partition over (or loses it) keeps *watching* it for a
while (``linger``: the longest lock lease it watched there, plus grace and a few scans),
so a hand-over to a new replica delays no revocation.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lockclient.errors import StoreError
from lockclient.lockid import INDEX_SHARDS
from lockclient.logs import get_logger
from lockclient.runtime import THREADS, Runtime
from lockclient.store import CellStore, VersionedTable
from lockclient.store.base import CompareAndSet

__all__ = ["MEMBERS_ROW", "OWNER_COLUMN", "PartitionLeases", "PartitionStatus", "assign"]

log = get_logger("leasewatch.partitions")

MEMBERS_ROW = "members"
OWNER_COLUMN = "~owner"
_TABLE = VersionedTable.PARTITION


@dataclass(frozen=True)
class PartitionStatus:
    """One replica's view after a refresh."""

    member: str
    owned: frozenset[int]
    """Partitions this replica holds the lease of."""
    watching: frozenset[int]
    """What it scans: its own partitions and those it recently handed over (lingering)."""
    members: tuple[str, ...]
    """Replicas it believes alive, itself included, sorted."""
    takeovers: int
    """Partitions taken over from a stale owner since start."""


@dataclass
class _Seen:
    value: str
    changed_at: float


def _score(partition: int, member: str) -> int:
    digest = hashlib.blake2b(f"{partition}/{member}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign(members: Sequence[str], partitions: int = INDEX_SHARDS) -> dict[int, str]:
    """Partition -> member: rendezvous hashing (each partition prefers the member with the
    highest hash of the pair) with a cap of ``ceil(partitions / members)`` each. The same on
    every replica given the same members; a member that leaves moves mostly its own
    partitions, and no member gets more than its share. Computed once per set of members
    (every refresh asks; the members rarely change)."""
    return dict(_assign(tuple(sorted(set(members))), partitions))


@functools.lru_cache(maxsize=64)
def _assign(ordered: tuple[str, ...], partitions: int) -> tuple[tuple[int, str], ...]:
    if not ordered:
        return ()
    cap = math.ceil(partitions / len(ordered))
    load = dict.fromkeys(ordered, 0)
    out: dict[int, str] = {}
    for partition in range(partitions):
        for member in sorted(ordered, key=lambda m: _score(partition, m), reverse=True):
            if load[member] < cap:
                out[partition] = member
                load[member] += 1
                break
    return tuple(out.items())


def _encode(member: str, version: int, lease: float) -> str:
    return json.dumps({"m": member, "v": version, "l": lease}, separators=(",", ":"), sort_keys=True)


@functools.lru_cache(maxsize=1024)
def _decode(raw: str) -> tuple[str, float] | None:
    """(member, lease) of a cell's value; None if malformed. Cached: every refresh decodes all 64
    partition cells and the members' heartbeats, and most are unchanged since the last one."""
    try:
        data = json.loads(raw)
        return str(data["m"]), float(data["l"])
    except (ValueError, TypeError, KeyError):
        return None


class PartitionLeases:
    """One replica's side of the partition protocol. Thread-safe; ``refresh`` is one round."""

    def __init__(
        self,
        store: CellStore,
        replica_id: str,
        *,
        lease: float = 10.0,
        grace: float = 2.0,
        partitions: int = INDEX_SHARDS,
        linger: Callable[[], float] | None = None,
        monotonic: Callable[[], float] | None = None,
        runtime: Runtime = THREADS,
    ) -> None:
        if lease <= 0 or grace < 0:
            raise ValueError("lease must be > 0 and grace >= 0")
        self.store = store
        self.member = f"{replica_id}#{runtime.token_hex(4)}"
        self.lease = lease
        self.grace = grace
        self.partitions = partitions
        self._linger = linger or (lambda: lease + grace)
        self._monotonic = monotonic or runtime.monotonic
        self._lock = runtime.lock()  # held across the store calls of one refresh
        self._seen: dict[str, _Seen] = {}  # "m:<member>" / "p:<n>" -> what we saw, and since when
        self._version = 0
        self._renewed_at: float | None = None
        self._mine: dict[str, str] = {}  # row ("members" or a partition) -> the value we hold there
        self._lingering: dict[int, float] = {}  # partition -> until (monotonic)
        self._members: tuple[str, ...] = (self.member,)
        self.takeovers = 0

    # -- observation ------------------------------------------------------------------------------

    def _stale(self, key: str, value: str, lease: float, now: float) -> bool:
        """Unchanged on our clock for longer than lease + grace (a first sighting is not stale)."""
        seen = self._seen.get(key)
        if seen is None or seen.value != value:
            self._seen[key] = _Seen(value, now)
            return False
        return now - seen.changed_at > lease + self.grace

    # -- one round ---------------------------------------------------------------------------------

    def refresh(self) -> PartitionStatus:
        """Read every partition cell and the members, renew what is ours when due, claim,
        take over and hand back as the assignment says. Raises StoreError if the read fails."""
        with self._lock:
            rows = [MEMBERS_ROW, *(str(p) for p in range(self.partitions))]
            found = self.store.read_versioned_many(rows, table=_TABLE)
            now = self._monotonic()  # after the read completed
            members_row = found.get(MEMBERS_ROW, {})
            alive = {self.member}
            stale_members: list[tuple[str, str]] = []
            for member, beat in members_row.items():
                if member == self.member:
                    continue
                decoded = _decode(beat)
                lease = decoded[1] if decoded is not None else self.lease
                if self._stale(f"m:{member}", beat, lease, now):
                    stale_members.append((member, beat))
                else:
                    alive.add(member)
            self._members = tuple(sorted(alive))
            plan = assign(self._members, self.partitions)

            renew = self._renewed_at is None or now - self._renewed_at >= self.lease / 3
            ops: list[CompareAndSet] = []
            intents: list[tuple[str, str, str | None]] = []  # (kind, row, new value)
            # Our heartbeat: renewed (or written anew, if someone deleted it as stale).
            mine = self._mine.get(MEMBERS_ROW)
            current = members_row.get(self.member)
            if renew or current is None:
                new = self._next_value()
                ops.append(CompareAndSet(MEMBERS_ROW, {self.member: current}, {self.member: new}, _TABLE))
                intents.append(("member", MEMBERS_ROW, new))
            elif current != mine:
                self._mine[MEMBERS_ROW] = current  # an answer we missed landed: adopt it
            for member, heartbeat in stale_members:
                ops.append(CompareAndSet(MEMBERS_ROW, {member: heartbeat}, {member: None}, _TABLE))
                intents.append(("forget", MEMBERS_ROW, None))

            for partition in range(self.partitions):
                row = str(partition)
                raw = found.get(row, {}).get(OWNER_COLUMN)
                decoded = _decode(raw) if raw is not None else None
                ours = decoded is not None and decoded[0] == self.member
                wanted = plan.get(partition) == self.member
                if ours and raw is not None:
                    self._mine[row] = raw
                    if not wanted:
                        ops.append(CompareAndSet(row, {OWNER_COLUMN: raw}, {OWNER_COLUMN: None}, _TABLE))
                        intents.append(("release", row, None))
                    elif renew:
                        new = self._next_value()
                        ops.append(CompareAndSet(row, {OWNER_COLUMN: raw}, {OWNER_COLUMN: new}, _TABLE))
                        intents.append(("renew", row, new))
                    continue
                if self._mine.pop(row, None) is not None:
                    self._hand_over(partition, now, "lost")  # someone took it over (we were away)
                if raw is None:
                    if wanted:
                        new = self._next_value()
                        ops.append(CompareAndSet(row, {OWNER_COLUMN: None}, {OWNER_COLUMN: new}, _TABLE))
                        intents.append(("claim", row, new))
                    continue
                lease = decoded[1] if decoded is not None else self.lease
                if self._stale(f"p:{row}", raw, lease, now) and wanted:
                    new = self._next_value()
                    ops.append(CompareAndSet(row, {OWNER_COLUMN: raw}, {OWNER_COLUMN: new}, _TABLE))
                    intents.append(("takeover", row, new))

            for i, result in self.store.compare_and_set_many(ops):
                kind, row, value = intents[i]
                if isinstance(result, StoreError):
                    log.warning("partition_cas_failed", kind=kind, row=row, error=str(result))
                    continue
                if not result.applied:
                    continue  # someone else moved first: the next refresh sees it
                if kind == "member":
                    assert value is not None
                    self._mine[MEMBERS_ROW] = value
                elif kind == "release":
                    self._mine.pop(row, None)
                    self._hand_over(int(row), now, "handed over")
                elif kind in ("renew", "claim", "takeover"):
                    assert value is not None
                    self._mine[row] = value
                    self._lingering.pop(int(row), None)
                    if kind == "takeover":
                        self.takeovers += 1
                        log.warning("partition_taken_over", partition=row, by=self.member)
                    elif kind == "claim":
                        log.info("partition_claimed", partition=row, by=self.member)
            if renew:
                self._renewed_at = now
            for partition in [p for p, until in self._lingering.items() if until <= now]:
                del self._lingering[partition]
            # Forget observations of cells that are gone (memory stays at 65 rows' worth).
            present = {f"m:{m}" for m in members_row} | {f"p:{r}" for r in found if r != MEMBERS_ROW}
            for key in [k for k in self._seen if k not in present]:
                del self._seen[key]
            return self._status()

    def _next_value(self) -> str:
        """Every value written is unique to its compare-and-set — an attempt id made of the member
        (random per start) and a counter bumped for every call, a retry included — so an unknown
        outcome is settled exactly at the next refresh, by reading the row back: our member's value
        there is adopted (``_mine``), as for lock leases (DESIGN.md §7.7). A release is a delete and
        proves nothing by absence: a refused or unknown one is simply looked at again next refresh."""
        self._version += 1
        return _encode(self.member, self._version, self.lease)

    def _hand_over(self, partition: int, now: float, how: str) -> None:
        """Keep watching a partition we no longer own until its new owner has watched its
        leases long enough to revoke them itself."""
        self._lingering[partition] = now + self._linger()
        log.info("partition_released", partition=partition, by=self.member, how=how)

    def _owned(self) -> frozenset[int]:
        return frozenset(int(row) for row in self._mine if row != MEMBERS_ROW)

    def _status(self) -> PartitionStatus:
        owned = self._owned()
        return PartitionStatus(self.member, owned, owned | frozenset(self._lingering), self._members, self.takeovers)

    def status(self) -> PartitionStatus:
        with self._lock:
            return self._status()

    def release_all(self) -> None:
        """On a clean shutdown: give back every partition and the heartbeat, so the others
        claim them at their next refresh instead of after a lease."""
        with self._lock:
            ops = [
                CompareAndSet(row, {OWNER_COLUMN: raw}, {OWNER_COLUMN: None}, _TABLE)
                for row, raw in self._mine.items()
                if row != MEMBERS_ROW
            ]
            heartbeat = self._mine.get(MEMBERS_ROW)
            if heartbeat is not None:
                ops.append(CompareAndSet(MEMBERS_ROW, {self.member: heartbeat}, {self.member: None}, _TABLE))
            for _, result in self.store.compare_and_set_many(ops):
                if isinstance(result, StoreError):
                    log.warning("partition_release_failed", error=str(result))
            self._mine.clear()
            self._lingering.clear()
