"""What :func:`lockclient.settle.settle_end` claims as *proven*, case by case — and that our own
``released`` end record is recognised as ours even after the lease ran out (mutation testing,
issue 24: these claims were not pinned by tests/lock/test_settle.py)."""

from __future__ import annotations

from lockclient.lease import HOLDER_COLUMN
from lockclient.settle import ENDED_COLUMN, EndRecord, Found, settle_end

OURS = '{"v":3}'
PENDING = ['{"v":4,"a":"x1"}']


def settle(row: dict[str, str], *, release_sent: bool, in_time: bool) -> tuple[Found, bool]:
    settled = settle_end(
        row,
        ours=OURS,
        pending=PENDING,
        token=7,
        owner="me",
        holder_column=HOLDER_COLUMN,
        release_sent=release_sent,
        seen_before_valid_until=in_time,
    )
    return settled.found, settled.proven


def test_a_released_end_record_round_trips() -> None:
    end = EndRecord(7, "me", "released", "r1")
    assert EndRecord.decode(end.encode()) == end
    assert EndRecord.decode("7|me|released|r1") == end


def test_our_own_release_is_proven_by_its_end_record_even_after_the_lease_ran_out() -> None:
    # The end record names our token and owner: exact, not the lease bound — so seen late or not,
    # the release is proven (without the record it would be "released by intent", unproven).
    released = EndRecord(7, "me", "released", "r1").encode()
    assert settle({ENDED_COLUMN: released}, release_sent=True, in_time=False) == (Found.RELEASED, True)


def test_verdicts_read_from_the_row_itself_are_proven_whenever_they_are_seen() -> None:
    # Our current record, or an earlier attempt of ours, in the row: a fact, not an inference.
    for in_time in (True, False):
        assert settle({HOLDER_COLUMN: OURS}, release_sent=True, in_time=in_time) == (Found.OURS, True)
        assert settle({HOLDER_COLUMN: PENDING[0]}, release_sent=False, in_time=in_time) == (Found.PENDING, True)
    # No release sent: only a revocation (gone) or another writer (replaced) — exact either way.
    later = EndRecord(8, "next", "released", "n1").encode()
    assert settle({ENDED_COLUMN: later}, release_sent=False, in_time=False) == (Found.REVOKED, True)
    assert settle({ENDED_COLUMN: later, HOLDER_COLUMN: '{"o":"next"}'}, release_sent=False, in_time=False) == (
        Found.LOST,
        True,
    )
