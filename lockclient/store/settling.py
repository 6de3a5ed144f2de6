"""Settling a compare-and-set whose outcome the wire left unknown — the loop every networked
adapter runs around one conditional write (DESIGN.md §3, "Unknown outcomes").

The Cassandra adapter (:mod:`lockclient.store.cassandra`) and the simulator's store client
(``sim/store.py``) run this same code, so the simulator searches the schedules of exactly the
logic that runs against a real ring:

* the answer says applied → applied; says *not applied* while the row holds every value this
  call writes → applied too (:func:`not_applied_answer`: a Paxos round re-proposed an earlier,
  timed-out send of this same call and committed it; values carry the call's attempt id, so
  only this call can have written them);
* the send failed with an UNKNOWN fate (:mod:`lockclient.store.outcomes`:
  :class:`~lockclient.errors.StoreOutcomeUnknown`) → re-read at SERIAL (a Paxos round, which
  completes or durably supersedes any proposal in flight) and judge by value
  (:func:`~lockclient.store.base.resolve_by_value`): our values → applied; the conditions still
  hold → it never applied, send it again; anything else → another writer changed the row
  (``CasResult.uncertain``);
* the send failed and surely did not apply, but may next time
  (:class:`~lockclient.errors.StoreUnavailable`) → send it again;
* anything else (:class:`~lockclient.errors.StoreError`) → raised.

All within ``resolve_for`` seconds of the call, on the caller's runtime clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from lockclient.errors import StoreError, StoreOutcomeUnknown, StoreUnavailable
from lockclient.runtime import THREADS, Runtime
from lockclient.store.base import (
    CasResult,
    Outcome,
    check_updates_visible,
    columns_of,
    conditioned,
    resolve_by_value,
)

__all__ = ["not_applied_answer", "serial_read", "settled_compare_and_set"]

FIRST_PAUSE = 0.01
MAX_PAUSE = 0.5


def not_applied_answer(updates: Mapping[str, str | None], current: Mapping[str, str | None]) -> CasResult:
    """A "not applied" answer with the row as the store saw it: applied after all if the row holds
    every value this call writes (an earlier send of this very call landed; see the module)."""
    if check_updates_visible(updates, current):
        return CasResult(applied=True, current=dict(current))
    return CasResult(applied=False, current=dict(current))


def serial_read(
    read: Callable[[], dict[str, str]], *, resolve_for: float, runtime: Runtime = THREADS
) -> dict[str, str]:
    """A SERIAL read, tried again while it fails transiently (under contention on a ring it can time
    out or answer 0x1700 like a write; a read is always safe to repeat), for ``resolve_for`` s."""
    give_up_at = runtime.monotonic() + resolve_for
    pause = FIRST_PAUSE
    while True:
        try:
            return read()
        except StoreUnavailable:
            if runtime.monotonic() + pause >= give_up_at:
                raise
            runtime.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE)


def settled_compare_and_set(
    send: Callable[[], CasResult],
    reread: Callable[[], Mapping[str, str]],
    row: str,
    expected: Mapping[str, str | None],
    updates: Mapping[str, str | None],
    *,
    resolve_for: float,
    runtime: Runtime = THREADS,
) -> CasResult:
    """One compare-and-set, its unknown outcomes settled (see the module). ``send`` sends it once
    and returns the store's answer (already through :func:`not_applied_answer`) or raises the
    classified failure; ``reread`` is a SERIAL read of the row."""
    give_up_at = runtime.monotonic() + resolve_for
    pause = FIRST_PAUSE
    while True:
        failure: StoreError
        try:
            return send()
        except StoreOutcomeUnknown as exc:
            outcome, current = _resolve(reread, row, expected, updates, exc, give_up_at, resolve_for, runtime)
            if outcome is Outcome.APPLIED:
                return CasResult(applied=True, current={**conditioned(expected), **updates})
            if outcome is Outcome.CHANGED:
                return CasResult(applied=False, current=current, uncertain=True)
            failure = exc
        except StoreUnavailable as exc:
            failure = exc  # NOT_SENT / NOT_APPLIED, worth another try
        if runtime.monotonic() + pause >= give_up_at:
            if isinstance(failure, StoreOutcomeUnknown):
                # The last send was re-read and found not applied (UNCHANGED): settled.
                raise StoreUnavailable(
                    f"compare-and-set on {row!r}: did not apply within {resolve_for:g} s "
                    f"(last attempt: {failure}); the row still holds the expected values"
                ) from failure
            raise failure
        runtime.sleep(pause)
        pause = min(pause * 2, MAX_PAUSE)


def _resolve(
    reread: Callable[[], Mapping[str, str]],
    row: str,
    expected: Mapping[str, str | None],
    updates: Mapping[str, str | None],
    cause: StoreOutcomeUnknown,
    give_up_at: float,
    resolve_for: float,
    runtime: Runtime,
) -> tuple[Outcome, dict[str, str | None]]:
    """Settle an UNKNOWN outcome by SERIAL re-reads (until ``give_up_at``); raises
    :class:`StoreOutcomeUnknown` if none succeeds."""
    pause = FIRST_PAUSE
    while True:
        try:
            now = reread()
        except StoreUnavailable as exc:
            if runtime.monotonic() + pause >= give_up_at:
                raise StoreOutcomeUnknown(
                    f"compare-and-set on {row!r}: outcome unknown ({cause}) and the SERIAL re-read "
                    f"failed for {resolve_for:g} s: {exc}"
                ) from exc
            runtime.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE)
            continue
        current = {c: now.get(c) for c in columns_of(conditioned(expected), updates)}
        return resolve_by_value(expected, updates, current), current
