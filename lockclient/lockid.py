"""Lock ids, owners and tickets (DESIGN.md §5, thesis listing 5)."""

from __future__ import annotations

import unicodedata
import zlib

from lockclient.errors import InvalidLockId
from lockclient.runtime import THREADS, Runtime

__all__ = [
    "INDEX_SHARDS",
    "KINDS",
    "MAX_LOCK_ID_BYTES",
    "ROW_SEPARATOR",
    "TICKET_DIGITS",
    "index_shard",
    "make_owner",
    "make_ticket",
    "owner_host",
    "owner_prefix",
    "primitive_row",
    "split_row",
    "this_host",
    "ticket_time",
    "validate_lock_id",
    "validate_row_id",
]

MAX_LOCK_ID_BYTES = 256
TICKET_DIGITS = 20

INDEX_SHARDS = 64
"""Lock ids with live state are listed in INDEX rows "0".."63" for leasewatch's scan."""


def index_shard(lock_id: str) -> str:
    """The INDEX row that lists ``lock_id``: stable across processes and languages (CRC-32)."""
    return str(zlib.crc32(lock_id.encode("utf-8")) % INDEX_SHARDS)


_INVISIBLE = frozenset({"Cf", "Zl", "Zp", "Cn"})
"""Format characters (zero-width space/joiners, bidi controls, BOM, soft hyphen), line and
paragraph separators, and unassigned code points (their normalization may change with a
later Unicode version)."""


def validate_lock_id(lock_id: object, *, legacy: bool = False) -> str:
    """Check a lock id before any store access; return it unchanged.

    A lock id is non-empty text of at most 256 bytes of UTF-8 without control characters,
    and — since lock ids that *look* the same must *be* the same — it must be in Unicode
    NFC and contain no invisible characters: no format characters (zero-width space or
    joiners, bidi controls such as U+202E, the BOM, the soft hyphen), no line or paragraph
    separators, no spaces other than U+0020, no unassigned code points. Such ids are
    **refused, not normalised**: a lock id is part of the store layout (it names rows), so
    silently normalising would make an existing name mean a different lock.

    ``legacy=True`` applies only the older rules (length, control characters): leasewatch
    uses it so that an operator can still view and revoke a lock created before.
    """
    if not isinstance(lock_id, str):
        raise InvalidLockId(f"lock id must be a string, not {type(lock_id).__name__}")
    if not lock_id:
        raise InvalidLockId("lock id must not be empty")
    if lock_id.isascii() and lock_id.isprintable() and len(lock_id) <= MAX_LOCK_ID_BYTES:
        # The common case, checked in C: in ASCII the control characters (Cc) are exactly the
        # unprintable ones, and ASCII is NFC and visible; one byte of UTF-8 per character. The
        # loop below costs 2.5 us for a 3-character id and 56 us for 200 characters — paid by
        # each of a thousand asyncio tasks in the one loop iteration that starts them (issue 25).
        return lock_id
    try:
        size = len(lock_id.encode("utf-8"))
    except UnicodeEncodeError as exc:  # lone surrogates
        raise InvalidLockId("lock id is not valid Unicode text", lock_id=repr(lock_id)) from exc
    if size > MAX_LOCK_ID_BYTES:
        raise InvalidLockId(f"lock id is {size} bytes of UTF-8; the limit is {MAX_LOCK_ID_BYTES}")
    for ch in lock_id:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise InvalidLockId(f"lock id contains control character U+{ord(ch):04X}", lock_id=repr(lock_id))
    if legacy or lock_id.isascii():
        return lock_id  # ASCII without control characters is always NFC and visible
    if not unicodedata.is_normalized("NFC", lock_id):
        raise InvalidLockId(
            "lock id is not in Unicode NFC (a look-alike of its composed form); use unicodedata.normalize('NFC', id)",
            lock_id=repr(lock_id),
        )
    for ch in lock_id:
        category = unicodedata.category(ch)
        if category in _INVISIBLE or (category == "Zs" and ch != " "):
            name = unicodedata.name(ch, "unassigned")
            raise InvalidLockId(
                f"lock id contains invisible or look-alike character U+{ord(ch):04X} ({name})", lock_id=repr(lock_id)
            )
    return lock_id


def make_owner(task: str | None = None, *, runtime: Runtime = THREADS) -> str:
    """A fresh owner id, unique per acquisition attempt and readable: host, pid, thread (or task), random.

    Uniqueness per attempt matters: a write whose reply was lost is recognised as ours on
    re-read (the kazoo idiom), and a retried attempt never mistakes an old cell for its own.
    """
    return f"{owner_prefix(task, runtime=runtime)}{runtime.token_hex(4)}"


def owner_prefix(task: str | None = None, *, runtime: Runtime = THREADS) -> str:
    """What every owner id :func:`make_owner` makes in this task starts with (``host.pid.thread.``)."""
    who = task or runtime.task_name()
    who = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in who)[:32]
    return f"{runtime.host()}.{runtime.pid()}.{who}."


def owner_host(owner: str) -> str:
    """The host part of an owner id (``host.pid.thread.random``; the host may contain dots)."""
    return owner.rsplit(".", 3)[0]


def this_host(runtime: Runtime = THREADS) -> str:
    return runtime.host()


def make_ticket(time_us: int, owner: str) -> str:
    """Queue column name: 20-digit zero-padded global µs, then the owner (ties broken by owner)."""
    if time_us < 0 or time_us >= 10**TICKET_DIGITS:
        raise ValueError(f"ticket time {time_us} out of range")
    return f"{time_us:0{TICKET_DIGITS}d}{owner}"


def ticket_time(ticket: str) -> int:
    """The global µs a ticket was taken at."""
    return int(ticket[:TICKET_DIGITS])


ROW_SEPARATOR = "\x1f"
"""Between a name and its primitive's kind in a row id (the ASCII unit separator): a semaphore or
read-write lock named ``db`` lives in the rows ``db\x1fsemaphore`` / ``db\x1frwlock`` of the lease
and queue tables. A lock id can never contain a control character, so no lock id — and no name of
another kind — shares those rows: the three are different things with the same name, as in etcd's
key prefixes. (An election *is* the lock of its name: its leader is that lock's holder.)"""

KINDS = ("semaphore", "rwlock")
"""The kinds of primitive with rows of their own (see :data:`ROW_SEPARATOR`)."""


def primitive_row(name: str, kind: str) -> str:
    """The row id of primitive ``kind`` named ``name`` (validated)."""
    if kind not in KINDS:
        raise ValueError(f"unknown primitive kind {kind!r}; expected one of {', '.join(KINDS)}")
    return f"{validate_lock_id(name)}{ROW_SEPARATOR}{kind}"


def split_row(row_id: str) -> tuple[str, str]:
    """(name, kind) of a row id: ``("db", "semaphore")``, or ``(lock_id, "lock")`` for a lock."""
    name, sep, kind = row_id.rpartition(ROW_SEPARATOR)
    if sep and kind in KINDS:
        return name, kind
    return row_id, "lock"


def validate_row_id(row_id: object, *, legacy: bool = False) -> str:
    """A lock id (:func:`validate_lock_id`) or a primitive's row id (``name`` + :data:`ROW_SEPARATOR`
    + a kind of :data:`KINDS`, the name a valid lock id): what leasewatch's endpoints accept."""
    if isinstance(row_id, str):
        name, kind = split_row(row_id)
        if kind != "lock":
            validate_lock_id(name, legacy=legacy)
            return row_id
    return validate_lock_id(row_id, legacy=legacy)
