"""HTTP fuzzing of every endpoint of timesvc and leasewatch from their own OpenAPI (schemathesis).

Both services run as real processes on one embedded store that holds live state: a lock held by
a client, a waiter queued behind it, a revocation already recorded. For every operation the
services publish, schemathesis draws valid (positive) and invalid (negative) requests; every
answer must be below 500, and every *rejected* request (4xx) must leave the state as it was:
the same holders, queue, lease owners and fencing token of every lock, and the same revocations.
``POST /revoke/{id}`` is fuzzed both without credentials (always rejected) and with the
admin token (so the positive path runs too, on generated lock ids that never hold our locks).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

pytest.importorskip("schemathesis")

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from lockclient import RemoteLocker, open_store
from tests.support.procs import Fleet, ServiceProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    # schemathesis' strategies use the random module, which hypothesis deprecates (its warning, not ours).
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning"),
]

TOKEN = "fuzz-admin-token-0123456789abcdef0123"  # at least 32 characters (issue 16)
EXAMPLES = 30
"""Per operation and generation mode (operations without parameters need only a couple)."""
LOCKS = ("fuzz:held", "fuzz:other")


@dataclass
class Stack:
    store_url: str
    timesvc: ServiceProcess
    leasewatch: ServiceProcess
    locker: RemoteLocker

    def snapshot(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for lock_id in LOCKS:
            status = self.locker.status(lock_id)
            state[lock_id] = (
                tuple(status.holders),
                tuple(q.owner for q in status.queue),
                tuple(sorted(status.leases)),
                status.fencing_token,
            )
        revocations = httpx.get(f"{self.leasewatch.url}/revocations", timeout=5).json()
        state["revocations"] = sorted((r["lock_id"], r["owner"]) for r in revocations)
        return state


@pytest.fixture
def stack(processes: Fleet, sqlite_url: str) -> Iterator[Stack]:
    timesvc = processes.timesvc(sqlite_url, name="fuzz-timesvc")
    leasewatch = processes.leasewatch(sqlite_url, name="fuzz-leasewatch", admin_token=TOKEN)
    timesvc.wait_ready()
    leasewatch.wait_ready()
    with open_store(sqlite_url) as store, RemoteLocker(store, lease=5.0) as locker:
        holder = locker.get_lock(LOCKS[0], timeout=10)
        waiting = threading.Event()
        waiter_locker = RemoteLocker(open_store(sqlite_url), lease=5.0, owns_store=True)
        done = threading.Event()

        def wait_in_queue() -> None:
            waiting.set()
            with contextlib.suppress(Exception):  # cancelled at teardown
                waiter_locker.get_lock(LOCKS[0], timeout=600, cancel=done).release()

        thread = threading.Thread(target=wait_in_queue, daemon=True)
        thread.start()
        waiting.wait(5)
        # One revocation on record, so /revocations has content to keep unchanged.
        doomed = locker.get_lock(LOCKS[1], timeout=10)
        httpx.post(
            f"{leasewatch.url}/revoke/{LOCKS[1].replace(':', '%3A')}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        ).raise_for_status()
        doomed.release()
        try:
            yield Stack(sqlite_url, timesvc, leasewatch, locker)
        finally:
            done.set()
            thread.join(timeout=10)
            waiter_locker.close()
            holder.release()


def fuzz(stack: Stack, service: ServiceProcess, label: str) -> list[str]:
    schema = schemathesis.openapi.from_url(f"{service.url}/openapi.json")
    problems: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert operations, f"{label} publishes no operations"
    counts: dict[str, int] = {}
    for operation in operations:
        modes = [schemathesis.GenerationMode.POSITIVE]
        if any(True for _ in operation.iter_parameters()):
            modes.append(schemathesis.GenerationMode.NEGATIVE)  # nothing to break without parameters
        for mode in modes:
            strategy = operation.as_strategy(generation_mode=mode)

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy, admin=st.booleans())
            def one(case: schemathesis.Case[Any], admin: bool) -> None:
                headers = dict(case.headers or {})
                query = case.query or {}
                timeout = query.get("timeout")
                if case.formatted_path.endswith("/wait") and isinstance(timeout, int | float) and 0.3 < timeout <= 30:
                    query["timeout"] = 0.3  # a valid long-poll waits all of it here (nothing moves): keep runs short
                if admin and case.method.upper() == "POST":
                    headers["Authorization"] = f"Bearer {TOKEN}"
                before = stack.snapshot()
                response = case.call(base_url=service.url, headers=headers, timeout=30)
                counts[case.operation.label] = counts.get(case.operation.label, 0) + 1
                if response.status_code >= 500:
                    problems.append(
                        f"{label} {case.method} {case.formatted_path}: {response.status_code} {response.text[:200]}"
                    )
                elif response.status_code >= 400:
                    after = stack.snapshot()
                    if after != before:
                        problems.append(
                            f"{label} {case.method} {case.formatted_path} was rejected ({response.status_code}) "
                            f"but changed the state: {before} -> {after}"
                        )

            try:
                one()
            except Unsatisfiable:
                if mode is schemathesis.GenerationMode.POSITIVE:
                    raise
                # No parameters to break (GET /now, /healthz, ...): no negative case exists.
    print(f"{label}: {sum(counts.values())} requests over {len(counts)} operations: {counts}")
    return problems


def test_fuzz_timesvc_and_leasewatch_from_their_openapi(stack: Stack) -> None:
    problems = fuzz(stack, stack.timesvc, "timesvc") + fuzz(stack, stack.leasewatch, "leasewatch")
    assert stack.snapshot()["fuzz:held"][0], "the held lock survived the fuzzing"
    assert not problems, "\n".join(problems[:20])
