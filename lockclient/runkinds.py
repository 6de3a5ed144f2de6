"""What ``lockctl run`` runs a command under, besides a lock: a semaphore's permit (``--limit N``), a
read or write lock (``--shared`` / ``--exclusive``), or a once-per-period hold (``--once-per P``).

**``--once-per P``, side by side with ShedLock.** ShedLock's answer to "this scheduled job must run
once across N replicas" is a lock row with ``lock_until``: a node takes it if ``lock_until <= now``
by *its own wall clock* and sets ``lock_until = now + lockAtMostFor``; when the job ends it sets
``lock_until = max(now, start + lockAtLeastFor)``. Its README: it "assumes that clocks on the nodes
are synchronized"; a node that cannot take the lock skips; a write timeout counts as "not taken".
``lockctl run --once-per P [--tolerance T] NAME -- CMD`` gives the same promise on the fair lock:

==========================  =========================================  =========================================
                            ShedLock                                   lockctl run --once-per P
==========================  =========================================  =========================================
who runs                    whoever finds ``lock_until`` passed         whoever takes lock NAME without waiting
                            (by its own wall clock)                     (``try_get_lock``: nobody holds or waits)
a run's minimum hold        ``lockAtLeastFor`` (from the start, by      ``min_hold = P - T`` of *global time* from
                            the runner's wall clock)                    the grant (:mod:`lockclient.hold`)
a run's maximum hold        ``lockAtMostFor`` (a guess of the job's     the lease: renewed while lockctl lives;
                            longest run; a longer job overlaps the      a dead lockctl's lock is revoked by
                            next one)                                   leasewatch after lease + grace (+ look)
while another host runs it  skipped                                     skipped (exit 0; ``-v`` says so)
clock skew between hosts    breaks it (lock taken early or late)        irrelevant: global time judges ``min_hold``
store write timeout         "not locked" (the job may run twice or      settled exactly by reading back
                            never)                                      (attempt ids): never reported wrongly
fencing                     none                                        ``CHRONOLOCK_FENCING_TOKEN``
==========================  =========================================  =========================================

**The promise.** For a job fired every P on every host (cron), each host firing within ±T/2 of the
schedule in global time: two runs never start less than ``P - T`` of global time apart (the first
one's hold parks the lock until then) and never overlap; a firing is skipped only if another run
started within the last ``P - T`` or still runs — so while one host's firing per period reaches the
store, the job runs once per period. ``T`` defaults to ``min(P/4, 60 s)`` and may be at most P/2.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lockclient import metrics
from lockclient.runtime import Event

if TYPE_CHECKING:
    from lockclient.locker import RemoteLock, RemoteLocker

__all__ = ["RunKind", "default_tolerance", "parse_duration"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``1h30m``, ``1d``, ``500ms`` -> seconds. ValueError otherwise."""
    value = text.strip().lower()
    if not value:
        raise ValueError("empty duration")
    try:
        seconds = float(value)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _PART.finditer(value):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(value) or pos == 0:
            raise ValueError(f"not a duration: {text!r} (use e.g. 90, 90s, 15m, 1h30m, 1d)") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be positive, got {text!r}")
    return seconds


def default_tolerance(period: float) -> float:
    return min(period / 4, 60.0)


@dataclass(frozen=True)
class RunKind:
    """What ``lockctl run`` takes (at most one of the options)."""

    limit: int | None = None
    shared: bool = False
    exclusive: bool = False
    max_readers: int = 16
    once_per: float | None = None
    tolerance: float | None = None

    @property
    def kind(self) -> str:
        if self.limit is not None:
            return "semaphore"
        if self.shared or self.exclusive:
            return "rwlock"
        return "lock"

    def problem(self, *, try_: bool, timeout: float | None) -> str | None:
        """Why these options cannot go together (None: they can)."""
        chosen = [
            name
            for name, on in (
                ("--limit", self.limit is not None),
                ("--shared", self.shared),
                ("--exclusive", self.exclusive),
                ("--once-per", self.once_per is not None),
            )
            if on
        ]
        problems = [
            (len(chosen) > 1, f"{' and '.join(chosen)} exclude each other"),
            (
                self.limit is not None and not 1 <= self.limit <= 256,
                f"--limit must be between 1 and 256, got {self.limit}",
            ),
            (not 1 <= self.max_readers <= 256, f"--max-readers must be between 1 and 256, got {self.max_readers}"),
            (self.tolerance is not None and self.once_per is None, "--tolerance goes with --once-per"),
            (
                self.once_per is not None and timeout is not None,
                "--once-per never waits (a busy lock means the job ran or runs elsewhere): drop --timeout",
            ),
        ]
        if self.once_per is not None and not 0 < self.effective_tolerance <= self.once_per / 2:
            problems.append((True, f"--tolerance must be > 0 and at most half of --once-per ({self.once_per / 2:g} s)"))
        return next((message for bad, message in problems if bad), None)

    @property
    def effective_tolerance(self) -> float:
        assert self.once_per is not None
        return self.tolerance if self.tolerance is not None else default_tolerance(self.once_per)

    @property
    def min_hold(self) -> float | None:
        return None if self.once_per is None else self.once_per - self.effective_tolerance

    def acquire(
        self,
        locker: RemoteLocker,
        name: str,
        *,
        timeout: float | None,
        try_: bool,
        cancel: Event | None,
        label: str | None = None,
    ) -> RemoteLock | None:
        """The lock, permit or hold; None when busy and not waiting (``--try``, ``--once-per``)."""
        lock: RemoteLock | None
        if self.once_per is not None:
            lock = locker.try_get_lock(name, min_hold=self.min_hold, label=label)
            metrics.ONCE_PER_RUNS.labels("skipped" if lock is None else "ran").inc()
        elif self.limit is not None:
            lock = (
                locker.try_get_semaphore(name, self.limit, label=label)
                if try_
                else locker.get_semaphore(name, self.limit, timeout, cancel=cancel, label=label)
            )
        elif try_:
            get = locker.try_get_read_lock if self.shared else locker.try_get_write_lock
            lock = get(name, max_readers=self.max_readers, label=label)
        else:
            wait = locker.get_read_lock if self.shared else locker.get_write_lock
            lock = wait(name, timeout, max_readers=self.max_readers, cancel=cancel, label=label)
        return lock

    def describe(self, name: str) -> str:
        if self.limit is not None:
            return f"semaphore {name!r} ({self.limit} permits)"
        if self.shared:
            return f"read lock of {name!r}"
        if self.exclusive:
            return f"write lock of {name!r}"
        return f"lock {name!r}"
