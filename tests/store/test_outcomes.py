"""The classification table (lockclient/store/outcomes.py), row by row, with the driver's own
exception objects — built the way cassandra-driver 3.30 builds them from a server's ERROR frame
(``ErrorMessage.to_exception``) or raises them itself — and what ``translate_error`` makes of each.

Every failure that may leave a write applied must come out UNKNOWN (→ ``StoreOutcomeUnknown``,
settled by reading back); only failures that provably changed nothing may be NOT_SENT / NOT_APPLIED.
"""

from __future__ import annotations

import pytest
from cassandra import (
    AuthenticationFailed,
    ConsistencyLevel,
    OperationTimedOut,
    ReadFailure,
    ReadTimeout,
    Unavailable,
    WriteFailure,
    WriteTimeout,
    WriteType,
)
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionBusy, ConnectionException, ConnectionShutdown
from cassandra.pool import NoConnectionsAvailable
from cassandra.protocol import (
    AlreadyExistsException,
    ErrorMessage,
    InvalidRequestException,
    IsBootstrappingErrorMessage,
    OverloadedErrorMessage,
    ProtocolException,
    ReadFailureMessage,
    ReadTimeoutErrorMessage,
    ServerError,
    SyntaxException,
    UnauthorizedErrorMessage,
    UnavailableErrorMessage,
    WriteFailureMessage,
    WriteTimeoutErrorMessage,
)

from lockclient.errors import StoreError, StoreOutcomeUnknown, StoreUnavailable
from lockclient.store.cassandra import translate_error
from lockclient.store.outcomes import ERROR_CODES, WRITE_TIMEOUTS, Fate, classify

SERIAL = ConsistencyLevel.SERIAL


def write_timeout(write_type: int) -> BaseException:
    """As the driver raises it: the server's 0x1100 frame, decoded, then ``to_exception``."""
    info = {"consistency": SERIAL, "received_responses": 1, "required_responses": 2, "write_type": write_type}
    frame = WriteTimeoutErrorMessage(0x1100, "Operation timed out - received only 1 responses.", info)
    exc = frame.to_exception()
    assert isinstance(exc, WriteTimeout) and exc.write_type == write_type
    return exc


@pytest.mark.parametrize("write_type", sorted(WriteType.value_to_name))
def test_every_write_timeout_type_is_unknown(write_type: int) -> None:
    """SIMPLE on a CAS is the commit step after a quorum accepted; CAS is the Paxos round; the
    others may have reached some replicas (BATCH_LOG: an entry on one batch-log replica is replayed
    later) — none of the eight proves "not applied"."""
    exc = write_timeout(write_type)
    verdict = classify(exc)
    assert verdict.fate is Fate.UNKNOWN, WriteType.value_to_name[write_type]
    assert verdict is WRITE_TIMEOUTS[write_type]
    assert isinstance(translate_error(exc, "compare_and_set"), StoreOutcomeUnknown)


def test_the_table_covers_all_eight_write_types() -> None:
    assert set(WRITE_TIMEOUTS) == set(WriteType.value_to_name) and len(WRITE_TIMEOUTS) == 8


def test_write_failure_after_a_quorum_accepted_is_unknown() -> None:
    """Finding 3: a grant accepted by a quorum whose commit answered WriteFailure was a plain
    StoreError, never settled — the holder record stayed, owned by nobody."""
    info = {
        "consistency": SERIAL,
        "received_responses": 1,
        "required_responses": 2,
        "failures": 1,
        "error_code_map": {"127.0.0.2": 0x0000},
        "write_type": WriteType.CAS,
    }
    exc = WriteFailureMessage(0x1500, "Operation failed - received 1 responses and 1 failures", info).to_exception()
    assert isinstance(exc, WriteFailure)
    assert classify(exc).fate is Fate.UNKNOWN
    error = translate_error(exc, "compare_and_set")
    assert isinstance(error, StoreOutcomeUnknown) and "result unknown" in str(error)


def test_serial_read_timeouts_and_failures_are_unknown() -> None:
    timeout = ReadTimeoutErrorMessage(
        0x1200,
        "Operation timed out",
        {"consistency": SERIAL, "received_responses": 1, "required_responses": 2, "data_retrieved": False},
    ).to_exception()
    failure = ReadFailureMessage(
        0x1300,
        "Operation failed",
        {
            "consistency": SERIAL,
            "received_responses": 1,
            "required_responses": 2,
            "failures": 1,
            "error_code_map": None,
            "data_retrieved": False,
        },
    ).to_exception()
    assert isinstance(timeout, ReadTimeout) and isinstance(failure, ReadFailure)
    for exc in (timeout, failure):
        assert classify(exc).fate is Fate.UNKNOWN
        assert isinstance(translate_error(exc, "compare_and_set"), StoreOutcomeUnknown)


def test_server_error_0x1700_is_unknown() -> None:
    """Driver 3.30 has no class for it: a bare ErrorMessage with the code."""
    exc = ErrorMessage(0x1700, "CAS operation result is unknown - proposal accepted by 1 but not a quorum.", None)
    assert classify(exc).fate is Fate.UNKNOWN
    error = translate_error(exc, "compare_and_set")
    assert isinstance(error, StoreOutcomeUnknown) and "result unknown" in str(error)


def test_unavailable_is_unknown_because_the_commit_step_raises_it_after_a_quorum_accepted() -> None:
    """Cassandra 4.1 (Paxos v1): doPaxos → proposePaxos succeeded → commitPaxos →
    ReplicaPlans.forWrite → assureSufficientLiveReplicasForWrite throws UnavailableException.
    The proposal is chosen by then. "Not applied" would be wrong for a compare-and-set."""
    exc = UnavailableErrorMessage(
        0x1000,
        "Cannot achieve consistency level QUORUM",
        {"consistency": ConsistencyLevel.QUORUM, "required_replicas": 2, "alive_replicas": 1},
    ).to_exception()
    assert isinstance(exc, Unavailable)
    assert classify(exc).fate is Fate.UNKNOWN
    assert isinstance(translate_error(exc, "compare_and_set"), StoreOutcomeUnknown)


@pytest.mark.parametrize(
    ("frame", "fate"),
    [
        (OverloadedErrorMessage(0x1001, "Too many in flight hints", None), Fate.UNKNOWN),
        (ServerError(0x0000, "java.lang.RuntimeException", None), Fate.UNKNOWN),
        (IsBootstrappingErrorMessage(0x1002, "Cannot read from a bootstrapping node", None), Fate.NOT_APPLIED),
    ],
    ids=["overloaded", "server-error", "bootstrapping"],
)
def test_a_coordinator_overloaded_restarting_or_failing(frame: ErrorMessage, fate: Fate) -> None:
    """The driver raises these ErrorMessage subclasses as they are (``on_request_error`` →
    RETHROW under the compare-and-set's FallthroughRetryPolicy). Overloaded: commitPaxos's
    checkHintOverload runs after a quorum accepted; ServerError: Paxos v2's failed commit.
    Bootstrapping: only reads are refused, and a CAS's condition read precedes its proposal."""
    exc = frame.to_exception()
    assert exc is frame
    assert classify(exc).fate is fate
    error = translate_error(exc, "compare_and_set")
    if fate is Fate.UNKNOWN:
        assert isinstance(error, StoreOutcomeUnknown)
    else:
        assert isinstance(error, StoreUnavailable) and not isinstance(error, StoreOutcomeUnknown)


def test_client_side_timeouts_and_connections_lost_mid_request_are_unknown() -> None:
    for exc in (
        OperationTimedOut({"127.0.0.1:9042": "Client request timeout"}, None),
        ConnectionShutdown("Connection to 127.0.0.1:9042 was closed"),
        ConnectionException("[Errno 104] Connection reset by peer", None),
        ConnectionResetError(104, "Connection reset by peer"),
    ):
        assert classify(exc).fate is Fate.UNKNOWN, exc
        assert isinstance(translate_error(exc, "compare_and_set"), StoreOutcomeUnknown), exc


def test_no_host_available_takes_the_worst_fate_of_its_hosts() -> None:
    nothing_tried = NoHostAvailable("Unable to complete the operation against any hosts", {})
    busy = NoHostAvailable(
        "Unable to complete the operation against any hosts",
        {"h1": NoConnectionsAvailable("All connections busy"), "h2": ConnectionBusy("no stream")},
    )
    mixed = NoHostAvailable(
        "Unable to complete the operation against any hosts",
        {"h1": NoConnectionsAvailable(), "h2": ConnectionShutdown("closed mid-request")},
    )
    assert classify(nothing_tried).fate is Fate.NOT_SENT
    assert classify(busy).fate is Fate.NOT_SENT
    assert classify(mixed).fate is Fate.UNKNOWN
    error = translate_error(busy, "compare_and_set")
    assert isinstance(error, StoreUnavailable) and not isinstance(error, StoreOutcomeUnknown)
    assert isinstance(translate_error(mixed, "compare_and_set"), StoreOutcomeUnknown)


@pytest.mark.parametrize(
    "frame",
    [
        InvalidRequestException(0x2200, "Batch with conditions cannot span multiple partitions", None),
        UnauthorizedErrorMessage(0x2100, "User x has no MODIFY permission", None),
        SyntaxException(0x2000, "line 1:0 no viable alternative", None),
        AlreadyExistsException(0x2400, "already exists", {"keyspace": "k", "table": "t"}),
        ProtocolException(0x000A, "Invalid or unsupported protocol version", None),
    ],
    ids=["invalid", "unauthorized", "syntax", "already-exists", "protocol"],
)
def test_requests_refused_before_execution_are_not_applied_and_permanent(frame: ErrorMessage) -> None:
    exc = frame.to_exception()
    verdict = classify(exc)
    assert verdict.fate is Fate.NOT_APPLIED and not verdict.transient
    error = translate_error(exc, "compare_and_set")
    assert type(error) is StoreError


def test_failed_login_is_not_sent() -> None:
    verdict = classify(AuthenticationFailed("Failed to authenticate to 127.0.0.1:9042: bad credentials"))
    assert verdict.fate is Fate.NOT_SENT and not verdict.transient


def test_anything_not_in_the_table_is_unknown() -> None:
    class Strange(Exception):
        pass

    assert classify(Strange("?")).fate is Fate.UNKNOWN
    assert classify(ErrorMessage(0x7777, "a code nobody knows", None)).fate is Fate.UNKNOWN
    assert isinstance(translate_error(Strange("?"), "compare_and_set"), StoreOutcomeUnknown)


def test_every_server_error_code_the_driver_knows_is_in_the_table() -> None:
    from cassandra.protocol import error_classes

    missing = sorted(hex(code) for code in error_classes if code not in ERROR_CODES)
    assert not missing, f"error codes without a row in the table: {missing}"
