"""``min_hold``: a lock that stays held for at least a given time of *global* time.

ShedLock's ``lockAtLeastFor``, done without trusting any host's wall clock. A holder that took a
lock with ``min_hold=S`` and releases it earlier does not remove its holder record: it *parks* it —
one compare-and-set rewrites the record with ``until`` = the grant's global time + ``S``
(:attr:`lockclient.lease.HolderRecord.until`) — and deletes its queue cell as any release does.

* **Nobody is granted over a parked record.** A grant is the compare-and-set "no holder record,
  fencing counter n" (:func:`lockclient.algorithm.take`); a parked record is a holder record, so
  the lock stays held, by the store's own rule, with no new condition on any grant.
* **Judged by global time.** A contender that finds a parked record reads global time (timesvc,
  or the store's clock): before ``until`` the lock is busy — ``try_get_lock`` returns None, a
  blocking waiter waits (at most until ``until``, then looks again); at or after ``until`` it
  removes the record by the same compare-and-set a release uses (conditional on exactly that
  value, with an end record "released": its owner did release it) and goes on. Global time never
  decreases across clients (docs/guarantees.md, "Global time"), so no contender anywhere can see ``until`` as
  passed before global time has reached it.
* **When is "the grant"?** Just before its compare-and-set, the grant reads global time's interval
  (:mod:`lockclient.clock`): the lower end goes in the record
  (:attr:`~lockclient.lease.HolderRecord.since`), and ``until`` is the *upper* end — at least any
  global time anybody saw before — plus the compare-and-set's own round trip (on this process's
  monotonic clock) plus ``S``: so ``until`` ≥ the grant's global time + ``S`` as long as global
  time advances at real rate.
* **If nobody comes.** A parked record is renewed by nobody; its lease length is the rest of the
  hold (+1 %), so leasewatch removes it no earlier than that after it first saw it — after
  ``until`` unless global time ran more than 1 % slow against leasewatch's clock — and it blocks
  nothing meanwhile that it should not.
* **A holder that dies** before releasing is revoked by leasewatch after its lease as always (its
  hold may then end before ``S``: ``min_hold`` is a *minimum for a release*, not a reservation
  against a crash — ShedLock's ``lockAtMostFor`` is the lease).
"""

from __future__ import annotations

import math

from lockclient.algorithm import Acquisition, Services
from lockclient.errors import ChronolockError, StoreError
from lockclient.lease import HeldLease, HolderRecord, removal
from lockclient.logs import get_logger

__all__ = ["PARKED_MARGIN", "check_min_hold", "hold_until", "lapse_parked", "prepare_park"]

log = get_logger("lockclient")

PARKED_MARGIN = 0.01
"""A parked record's lease is the rest of its hold plus this fraction: leasewatch judges it on its
own monotonic clock, and must not remove it before global time has passed ``until``."""

MAX_MIN_HOLD = 366 * 86_400.0


def check_min_hold(min_hold: float | None) -> None:
    if min_hold is None:
        return
    if isinstance(min_hold, bool) or not isinstance(min_hold, int | float):
        raise TypeError(f"min_hold must be a number of seconds or None, not {type(min_hold).__name__}")
    if not (0 < min_hold <= MAX_MIN_HOLD) or math.isnan(min_hold):
        raise ValueError(f"min_hold must be > 0 and at most {MAX_MIN_HOLD:g} seconds, got {min_hold}")


def hold_until(lease: HeldLease, min_hold: float, now_monotonic: float) -> int:
    """Global µs until which a lock granted with ``min_hold`` stays held: the upper end of global
    time's interval before the grant's compare-and-set (at least any time anybody had seen) + the
    compare-and-set's round trip + ``min_hold``: never before the grant's global time + min_hold."""
    round_trip = max(0.0, now_monotonic - lease.holding_since)
    return (lease.granted_upper_us or lease.record.since) + math.ceil((round_trip + min_hold) * 1e6)


def prepare_park(services: Services, lease: HeldLease, until: int) -> None:
    """Before a release: park the record if global time has not reached ``until`` yet. If global
    time cannot be read, park anyway (a parked record past its time is removed by the next
    contender: it costs that contender a compare-and-set, never a wrong grant)."""
    try:
        now = services.clock.now_us()
    except ChronolockError as exc:
        log.warning("min_hold_clock_unavailable", lock_id=lease.lock_id, error=str(exc))
        estimate = lease.record.since + int((lease.monotonic() - lease.holding_since) * 1e6)
        lease.park_until = until
        lease.park_lease = max(until - estimate, 1000) / 1e6 * (1 + PARKED_MARGIN)
        return
    if now >= until:
        return
    lease.park_until = until
    lease.park_lease = (until - now) / 1e6 * (1 + PARKED_MARGIN)


def lapse_parked(services: Services, attempt: Acquisition, raw: str) -> float | None:
    """A contender found the holder record ``raw``. None: it is not parked (a holder). Otherwise the
    seconds of global time its hold still has; 0.0 when it is over — then it was removed here (or
    is gone or changed: either way, look again)."""
    try:
        record = HolderRecord.decode(raw)
    except StoreError:
        return None
    if not record.until:
        return None
    now = attempt.io(services.clock.now_us)
    if now < record.until:
        return (record.until - now) / 1e6
    op = removal(attempt.lock_id, raw, record, "released", runtime=services.runtime)
    try:
        attempt.store.compare_and_set(op.row, op.expected, op.updates)
    except StoreError as exc:
        # Unknown or failed: the next look sees whether it is still there.
        log.info("parked_removal_failed", lock_id=attempt.lock_id, owner=record.owner, error=str(exc))
    services.signals.notify(attempt.lock_id)
    return 0.0
