"""How a holder settles what it finds in the store when a compare-and-set's answer was lost.

Pure functions over values: no store, no clock, no thread — the keeper's threads call them, and
so can a deterministic simulator. DESIGN.md §7.7 ("exact under unknown outcomes").

**Attempt ids.** Every value a compare-and-set writes carries an attempt id, fresh for every call
(:func:`lockclient.store.base.new_attempt_id`): a renewal v1 → v2 whose answer was lost and its
retry write *different* values. So the row says which attempt landed, and the lease is dated from
the start of exactly that attempt (finding 1 of issue 23: the retry was taken for the landed
write and the lease was dated from the retry's later start).

**End records.** A release or a revocation deletes the holder record, which leaves nothing behind
to recognise. So it also writes ``~ended`` = ``<token>|<owner>|released|<attempt>`` (or
``revoked``), in the same compare-and-set, conditional on the exact holder record — written
whatever ``~ended`` held (:data:`~lockclient.store.base.ANY`): it holds the previous holder's end,
which the next holder cannot know. Both removals are conditional on the same holder value, so
exactly one end per holder record ever applies, and ``~ended`` names the last holder record that
ended until the next one ends. A holder that finds its record gone or replaced reads it (a SERIAL
read) and knows: its own release landed, or a revocation did.

**When a later end has overwritten it** (the next holder was granted *and* ended before we
looked), the row cannot tell. Only two things remove a holder record: its owner's release and a
revocation. If this process had sent a release, the lock was released by this process as far as
its user is concerned (``release()`` was called while it held the lock) — it is settled as
released, never as lost; :func:`settle_end` says whether that is *proven* by the lease bound (the
record was seen gone before ``valid_until``: leasewatch revokes only ``lease + grace`` after the
holder's last renewal started, so a revocation cannot have come first — except an operator's
explicit one racing the release). Without a release sent, the record can only have been revoked.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["ENDED_COLUMN", "EndRecord", "Found", "judge_answer", "settle_end"]

ENDED_COLUMN: Final = "~ended"
"""The end record of the last holder record that ended, in the lock's row of the lease table."""

How = Literal["released", "revoked"]


@dataclass(frozen=True, slots=True)
class EndRecord:
    """The value of ``~ended``: which holder record ended (its fencing token and owner), how,
    and by which attempt (unique per compare-and-set call)."""

    token: int
    owner: str
    how: How
    attempt: str

    def encode(self) -> str:
        return f"{self.token}|{self.owner}|{self.how}|{self.attempt}"

    @classmethod
    def decode(cls, raw: str | None) -> EndRecord | None:
        """None for absent or malformed (an end record of another version is simply not ours)."""
        if raw is None:
            return None
        parts = raw.split("|")
        if len(parts) != 4 or not parts[0].isdigit() or parts[2] not in ("released", "revoked"):
            return None
        how: How = "released" if parts[2] == "released" else "revoked"
        return cls(int(parts[0]), parts[1], how, parts[3])

    def ends(self, token: int, owner: str) -> bool:
        """Whether this is the end of the holder record with that token and owner."""
        return self.token == token and self.owner == owner


class Found(enum.Enum):
    """What a holder makes of the row it finds (:func:`judge_answer`, :func:`settle_end`)."""

    OURS = "the row holds our current record"
    PENDING = "the row holds the value of an earlier attempt of ours: it applied — adopt it"
    READ_END = "our record is gone or replaced and a release of ours may have done it: read ~ended"
    RELEASED = "our release landed"
    REVOKED = "a revocation ended our record"
    LOST = "our record was removed or replaced by another writer"


def judge_answer(current: str | None, *, ours: str, pending: Collection[str], release_sent: bool) -> Found:
    """A compare-and-set on our holder record was refused (or its outcome stays unknown) and the
    row holds ``current``. ``pending``: the values of earlier attempts whose outcome is unknown;
    ``release_sent``: a release of ours was sent and may have landed."""
    if current == ours:
        return Found.OURS
    if current is not None and current in pending:
        return Found.PENDING
    if release_sent:
        return Found.READ_END
    # Nobody but its owner and a revocation removes a holder record; the owner sent no release.
    return Found.LOST


@dataclass(frozen=True, slots=True)
class Settled:
    """:func:`settle_end`'s answer."""

    found: Found
    proven: bool
    """For RELEASED: proven by our own end record, or by the lease bound (else: released by this
    process's intent, the end record having been overwritten after the lease ran out)."""


def settle_end(
    row: Mapping[str, str],
    *,
    ours: str,
    pending: Collection[str],
    token: int,
    owner: str,
    holder_column: str,
    release_sent: bool,
    seen_before_valid_until: bool,
    ended_column: str = ENDED_COLUMN,
) -> Settled:
    """Settle from the row as read linearizably (a SERIAL read that started after the answer
    that showed our record gone). ``seen_before_valid_until``: that answer came before our lease
    ran out by our own clock. ``ended_column``: where the end records of ``holder_column`` go
    (``~ended:<k>`` for a slot of a primitive with several holders)."""
    current = row.get(holder_column)
    if current == ours:
        return Settled(Found.OURS, True)
    if current is not None and current in pending:
        return Settled(Found.PENDING, True)
    end = EndRecord.decode(row.get(ended_column))
    if end is not None and end.ends(token, owner):
        return Settled(Found.RELEASED if end.how == "released" else Found.REVOKED, True)
    if release_sent:
        # Overwritten by a later holder's end (or removed by a version that wrote none).
        return Settled(Found.RELEASED, seen_before_valid_until)
    return Settled(Found.REVOKED if current is None else Found.LOST, True)
