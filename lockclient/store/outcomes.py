"""What each failure the Cassandra driver can raise says about a write: the one classification table.

A request that fails leaves its write in one of three states:

* **NOT_SENT** — it never reached a coordinator that could act on it (no connection, the pool
  was shut down, the login failed). Nothing happened.
* **NOT_APPLIED** — a coordinator received it and refused it before any replica could change
  (invalid, unauthorized, a node still bootstrapping). Nothing happened.
* **UNKNOWN** — it may have applied, now or later: a timeout after it left, a connection lost
  mid-request, a Paxos round that reached some acceptors, a commit step that failed *after*
  a quorum accepted the proposal. Only reading the value back settles it — which is exact,
  because every compare-and-set value carries a unique attempt id (DESIGN.md §7.7).

When in doubt the table says UNKNOWN: a needless read-back costs one round trip; a write
wrongly taken for "not applied" can orphan a holder record or date a lease wrongly (issue 23).

**Why ``Unavailable`` and ``Overloaded`` are UNKNOWN for a compare-and-set**, although
"the coordinator refused" sounds like NOT_APPLIED: in Cassandra 4.1's Paxos v1
(``StorageProxy.doPaxos``) the commit step runs only after ``proposePaxos`` succeeded, i.e.
after a quorum accepted our proposal, and ``commitPaxos`` starts with
``ReplicaPlans.forWrite`` → ``assureSufficientLiveReplicasForWrite`` (throws
``UnavailableException``) and ``checkHintOverload`` (throws ``OverloadedException``). The
value is chosen by then, and the next Paxos round on the partition commits it. The same loop
retries after a proposal that a minority accepted, and that retry's liveness check
(``ReplicaPlans.forPaxos``) can answer Unavailable while the minority's acceptance may still be
completed by a later round. Paxos v2 (``Paxos.cas``) reports a failed commit as
``WriteFailure`` (write type CAS), a timed-out one as ``WriteTimeout`` (CAS), or a
``ServerError``. For a plain write ``Unavailable`` would be NOT_APPLIED (the liveness check
precedes the mutations), but the table does not know the statement, and for last-write-wins
writes (explicit timestamps, idempotent) the difference is only a retry.

Who uses the fate: :func:`lockclient.store.cassandra.translate_error` turns UNKNOWN into
:class:`~lockclient.errors.StoreOutcomeUnknown`, NOT_SENT / NOT_APPLIED into
:class:`~lockclient.errors.StoreUnavailable` when trying again can help (``transient``) and a
plain :class:`~lockclient.errors.StoreError` (or ``StoreAccessDenied``) when it cannot.
:meth:`~lockclient.store.cassandra.CassandraStore.compare_and_set` reads back only what is
UNKNOWN and resends what provably did not apply. ``tests/store/test_outcomes.py`` checks every
row with the driver's own exception objects.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from cassandra import (
    AuthenticationFailed,
    CDCWriteFailure,
    CoordinationFailure,
    FunctionFailure,
    OperationTimedOut,
    ReadFailure,
    ReadTimeout,
    RequestValidationException,
    Unavailable,
    UnresolvableContactPoints,
    UnsupportedOperation,
    WriteFailure,
    WriteTimeout,
    WriteType,
)
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionBusy, ConnectionException, ConnectionShutdown, ProtocolVersionUnsupported
from cassandra.pool import NoConnectionsAvailable
from cassandra.protocol import ErrorMessage

__all__ = ["CAS_RESULT_UNKNOWN", "ERROR_CODES", "TYPES", "WRITE_TIMEOUTS", "Fate", "Verdict", "classify"]


class Fate(enum.Enum):
    """What a failed request did to the write it carried."""

    NOT_SENT = "not sent"
    NOT_APPLIED = "not applied"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One row of the table."""

    fate: Fate
    transient: bool
    """Trying again later can succeed (meaningful for NOT_SENT / NOT_APPLIED; an UNKNOWN outcome
    is always read back first)."""
    why: str


CAS_RESULT_UNKNOWN: Final = 0x1700
"""Server error "CAS operation result is unknown - proposal accepted by 1 but not a quorum"
(protocol v5 ``CAS_WRITE_UNKNOWN``, Cassandra 4.0+). Driver 3.30 has no class for it: it raises a
bare :class:`cassandra.protocol.ErrorMessage` with this code."""

_UNKNOWN_WRITE = "some replicas may have applied it; read back"

WRITE_TIMEOUTS: Final[Mapping[int, Verdict]] = {
    WriteType.SIMPLE: Verdict(
        Fate.UNKNOWN,
        True,
        "on a compare-and-set: a quorum accepted the proposal and only the commit timed out — the value "
        "is chosen (doPaxos rethrows commitPaxos's timeout with write type SIMPLE); on a plain write: "
        + _UNKNOWN_WRITE,
    ),
    WriteType.BATCH: Verdict(
        Fate.UNKNOWN, True, "the batch log was written, so the batch is replayed and will apply: read back"
    ),
    WriteType.UNLOGGED_BATCH: Verdict(Fate.UNKNOWN, True, _UNKNOWN_WRITE),
    WriteType.COUNTER: Verdict(Fate.UNKNOWN, True, _UNKNOWN_WRITE + " (counters are never resent blindly)"),
    WriteType.BATCH_LOG: Verdict(
        Fate.UNKNOWN,
        True,
        "the batch-log write timed out; an entry that reached one batch-log replica is replayed later, so "
        "'not applied' cannot be assumed",
    ),
    WriteType.CAS: Verdict(
        Fate.UNKNOWN,
        True,
        "the Paxos round timed out: the proposal may have been accepted by some acceptors, and a later "
        "round on the partition completes it (or supersedes it); a SERIAL read settles which",
    ),
    WriteType.VIEW: Verdict(
        Fate.UNKNOWN, True, "the base-table write may have applied; only the view update's lock timed out"
    ),
    WriteType.CDC: Verdict(
        Fate.UNKNOWN, True, "replicas out of CDC space refused it, others may have applied it: read back"
    ),
}
"""``WriteTimeout`` by its ``write_type`` (the native protocol's eight write types)."""

ERROR_CODES: Final[Mapping[int, Verdict]] = {
    0x0000: Verdict(
        Fate.UNKNOWN,
        True,
        "server error: Paxos v2 reports a commit that failed after a quorum accepted this way",
    ),
    0x000A: Verdict(Fate.NOT_APPLIED, False, "protocol error: the node could not decode the request"),
    0x0100: Verdict(Fate.NOT_SENT, False, "bad credentials: no request runs before the login succeeds"),
    0x1000: Verdict(
        Fate.UNKNOWN,
        True,
        "unavailable: on a compare-and-set it is also raised by the commit step, after a quorum accepted "
        "(commitPaxos → ReplicaPlans.forWrite), and by a retry after a minority accepted",
    ),
    0x1001: Verdict(
        Fate.UNKNOWN,
        True,
        "overloaded: on a compare-and-set commitPaxos raises it (checkHintOverload) after a quorum accepted",
    ),
    0x1002: Verdict(
        Fate.NOT_APPLIED,
        True,
        "the coordinator is bootstrapping: it refuses reads (StorageProxy.read), also the condition read "
        "that precedes any proposal of a compare-and-set",
    ),
    0x1003: Verdict(Fate.NOT_APPLIED, True, "truncate failed (never sent by chronolock)"),
    0x1100: WRITE_TIMEOUTS[WriteType.CAS],
    0x1200: Verdict(
        Fate.UNKNOWN,
        True,
        "read timeout: a SERIAL read is a Paxos round (it may complete another's proposal); on a "
        "compare-and-set a later attempt of the same round may follow an earlier partial acceptance",
    ),
    0x1300: Verdict(Fate.UNKNOWN, True, "read failure during a Paxos round: as a read timeout"),
    0x1400: Verdict(Fate.NOT_APPLIED, False, "a user-defined function failed before anything was written"),
    0x1500: Verdict(
        Fate.UNKNOWN,
        True,
        "write failure: some replicas failed, others may have applied; Paxos v2 reports a commit that "
        "failed after a quorum accepted this way (write type CAS)",
    ),
    0x1600: Verdict(Fate.UNKNOWN, True, "CDC space exhausted on some replicas; others may have applied it"),
    CAS_RESULT_UNKNOWN: Verdict(
        Fate.UNKNOWN, True, "CAS operation result is unknown: the proposal was accepted by some, not a quorum"
    ),
    0x2000: Verdict(Fate.NOT_APPLIED, False, "syntax error: refused before execution"),
    0x2100: Verdict(Fate.NOT_APPLIED, False, "unauthorized: refused before execution"),
    0x2200: Verdict(Fate.NOT_APPLIED, False, "invalid request: refused before execution"),
    0x2300: Verdict(Fate.NOT_APPLIED, False, "configuration error: refused before execution"),
    0x2400: Verdict(Fate.NOT_APPLIED, False, "already exists: refused before execution"),
    0x2500: Verdict(Fate.NOT_APPLIED, True, "the node did not know the prepared statement (the driver re-prepares it)"),
    0x8000: Verdict(Fate.UNKNOWN, True, "client write error: the request may have been executed"),
}
"""Server errors by protocol error code (for :class:`ErrorMessage` objects the driver raises as
they are, and for codes it has no class for — 0x1700 among them)."""

_MID_REQUEST = Verdict(
    Fate.UNKNOWN,
    True,
    "the connection broke after the request was handed to it (reset, node restarted, heartbeat failed): "
    "the coordinator may have run it",
)

TYPES: Final[tuple[tuple[type[BaseException], Verdict], ...]] = (
    # Order matters: the first class an exception is an instance of decides.
    (WriteFailure, ERROR_CODES[0x1500]),
    (ReadFailure, ERROR_CODES[0x1300]),
    (CoordinationFailure, ERROR_CODES[0x1500]),
    (ReadTimeout, ERROR_CODES[0x1200]),
    (Unavailable, ERROR_CODES[0x1000]),
    (CDCWriteFailure, ERROR_CODES[0x1600]),
    (FunctionFailure, ERROR_CODES[0x1400]),
    (RequestValidationException, ERROR_CODES[0x2200]),
    (AuthenticationFailed, ERROR_CODES[0x0100]),
    (
        OperationTimedOut,
        Verdict(Fate.UNKNOWN, True, "the client stopped waiting; the coordinator may have applied it"),
    ),
    (
        NoConnectionsAvailable,
        Verdict(Fate.NOT_SENT, True, "every connection to the host was busy: nothing was sent"),
    ),
    (ConnectionBusy, Verdict(Fate.NOT_SENT, True, "the connection had no free stream: nothing was sent")),
    (ProtocolVersionUnsupported, Verdict(Fate.NOT_SENT, False, "the node refused the protocol version")),
    (ConnectionShutdown, _MID_REQUEST),
    (ConnectionException, _MID_REQUEST),
    (UnresolvableContactPoints, Verdict(Fate.NOT_SENT, False, "no contact point resolved")),
    (UnsupportedOperation, Verdict(Fate.NOT_SENT, False, "the driver refused the operation")),
    (ConnectionError, _MID_REQUEST),  # a reset surfacing as the OS's own error
    (TimeoutError, Verdict(Fate.UNKNOWN, True, "a timeout after the request may have left")),
)
"""Driver exception classes (after :data:`WRITE_TIMEOUTS`, which needs the write type)."""

_DEFAULT = Verdict(Fate.UNKNOWN, False, "not in the table: assumed unknown, read back before deciding")

_WORST = {Fate.NOT_SENT: 0, Fate.NOT_APPLIED: 1, Fate.UNKNOWN: 2}


def classify(exc: BaseException | str) -> Verdict:
    """The table's row for one failure.

    ``NoHostAvailable`` carries the error each host tried gave (its ``errors``): its fate is the
    worst of theirs, and NOT_SENT when no host was tried at all. The driver records there the
    errors of hosts it could not even borrow a connection from (NOT_SENT), and — under a retry
    policy that moves on to the next host — errors of requests that did reach a host; chronolock's
    compare-and-sets never move on (``FallthroughRetryPolicy``), so theirs are NOT_SENT in
    practice, but the rule does not rely on it. A cause given as text (the driver's "Client
    request timeout" entries) counts as UNKNOWN."""
    if isinstance(exc, str):
        return Verdict(Fate.UNKNOWN, True, f"a host answered {exc!r}")
    if isinstance(exc, WriteTimeout):
        write_type = getattr(exc, "write_type", None)
        found = None if write_type is None else WRITE_TIMEOUTS.get(write_type)
        return found or Verdict(Fate.UNKNOWN, True, f"write timeout of an unknown write type ({write_type!r})")
    if isinstance(exc, NoHostAvailable):
        return _no_host(exc)
    if isinstance(exc, ErrorMessage):
        # The driver's typed server errors come first (WriteTimeout etc. above); what remains is an
        # ErrorMessage subclass (Overloaded, IsBootstrapping, ServerError...) or a bare ErrorMessage
        # with a code the driver has no class for (0x1700).
        return ERROR_CODES.get(getattr(exc, "code", -1), _DEFAULT)
    return next((verdict for kind, verdict in TYPES if isinstance(exc, kind)), _DEFAULT)


def _no_host(exc: NoHostAvailable) -> Verdict:
    causes = list((getattr(exc, "errors", None) or {}).values())
    if not causes:
        return Verdict(Fate.NOT_SENT, True, "no host could be tried: nothing was sent")
    verdicts = [classify(cause) if isinstance(cause, BaseException | str) else _DEFAULT for cause in causes]
    worst = max(verdicts, key=lambda v: _WORST[v.fate])
    return Verdict(
        worst.fate,
        any(v.transient for v in verdicts),
        f"no host available; the worst of what the hosts tried gave: {worst.why}",
    )
