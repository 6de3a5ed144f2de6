"""leasewatch.timeview: what a poll of timesvc /status makes of each answer, and of no answer.

The transport is faked (httpx.MockTransport) and so is time: the rest is the real code. Real
timesvc processes behind GET /time are in tests/leasewatch/test_page.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx

from leasewatch.timeview import MAX_ANSWER_BYTES, TimeView

URL = "http://timesvc-secret-host.internal:8700"


def status(**overrides: Any) -> dict[str, Any]:
    body = {
        "replica": "ts-1",
        "version": "0.1.0",
        "store": "sqlite",
        "ready": True,
        "runaway": False,
        "in_sync": True,
        "local_offset_us": -1500,
        "global_us": 1_700_000_000_000_000,
        "last_publisher": "ts-1",
        "last_tick_at": "2026-01-01T00:00:00Z",
        "last_tick_ok": True,
        "last_ok_tick_age_s": 0.2,
        "last_error": None,
        "ticks": 10,
        "failed_ticks": 0,
        "rejected_ticks": 0,
        "replicas": 3,
        "peer_offsets_us": {"ts-2": 250_000},
        "store_round_trips": 10,
        "now_requests": 100,
        "now_errors": 0,
        "tick_s": 1.0,
        "max_skew_s": 1.0,
    }
    return body | overrides


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def view(
    handler: Callable[[httpx.Request], httpx.Response], clock: Clock | None = None, token: str | None = None
) -> TimeView:
    return TimeView([URL], token, monotonic=clock or Clock(), transport=httpx.MockTransport(handler))


def poll(tv: TimeView) -> Any:
    asyncio.run(tv.poll())
    return tv.snapshot()[0]


def test_a_healthy_answer_and_the_now_rate_between_two_polls() -> None:
    clock = Clock()
    answers = iter([status(now_requests=100), status(now_requests=160)])
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=next(answers))

    tv = view(handler, clock, token="t" * 40)

    async def twice() -> None:
        await tv.poll()
        clock.t += 2.0
        await tv.poll()
        await tv.aclose()

    asyncio.run(twice())
    r = tv.snapshot()[0]
    assert seen[0].url.path == "/status" and seen[0].headers["authorization"] == "Bearer " + "t" * 40
    assert r.reachable and r.replica == "ts-1" and r.problems == []
    assert r.offset_s == -0.0015 and r.peer_offsets_s == {"ts-2": 0.25}
    assert r.now_requests == 160 and r.now_per_s == 30.0
    assert r.answered_age_s == 0.0


def test_each_failure_is_named_by_kind_without_the_url() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused to timesvc-secret-host.internal", request=request)

    def stall(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out reading timesvc-secret-host.internal", request=request)

    cases = {
        "cannot connect": refuse,
        "no answer within 1.5 s": stall,
        "answered 401: a valid bearer token is required": lambda r: httpx.Response(
            401, json={"detail": "a valid bearer token is required"}
        ),
        "answered 502": lambda r: httpx.Response(502, text="<html>bad gateway</html>"),
        "not a timesvc /status answer (not JSON)": lambda r: httpx.Response(200, text="hello"),
        "not a timesvc /status answer": lambda r: httpx.Response(200, json={"replica": 3}),
        "answer too large": lambda r: httpx.Response(200, content=b" " * (MAX_ANSWER_BYTES + 1)),
        "answered 302": lambda r: httpx.Response(302, headers={"Location": "http://elsewhere/status"}),
    }
    for error, handler in cases.items():
        r = poll(view(handler))
        assert r.reachable is False and r.error == error, (error, r.error)
        assert r.problems == [f"unreachable: {error}"] and r.replica is None and r.now_per_s is None
        assert "secret-host" not in json.dumps([*r.problems, r.error])


def test_a_replica_that_stops_answering_keeps_its_last_answer_but_is_unreachable() -> None:
    answers: list[httpx.Response] = [httpx.Response(200, json=status())]

    def handler(request: httpx.Request) -> httpx.Response:
        if answers:
            return answers.pop()
        raise httpx.ConnectError("refused", request=request)

    clock = Clock()
    tv = view(handler, clock)
    poll(tv)
    clock.t += 4
    r = poll(tv)
    assert r.reachable is False and r.replica == "ts-1" and r.answered_age_s == 4.0
    assert r.problems == ["unreachable: cannot connect"]


def test_problems_name_what_an_operator_acts_on() -> None:
    bad = status(
        runaway=True,
        ready=False,
        in_sync=False,
        local_offset_us=2_500_000,
        last_ok_tick_age_s=30.0,
        last_tick_ok=False,
        last_error="store unavailable",
    )
    r = poll(view(lambda request: httpx.Response(200, json=bad)))
    assert r.reachable
    assert r.problems == [
        "runaway clock: not published",  # an older timesvc: no reasons
        "global time not current here: /now answers 503",
        "clock +2.500 s from GlobalTime, beyond max_skew 1 s",
        "no successful tick for 30 s",
        "last tick failed: store unavailable",
    ]


def test_a_refusing_replica_says_why_on_the_time_panel() -> None:
    """Issue 22: a replica that refuses to publish its clock says so, with its reason."""
    refusing = status(
        runaway=True,
        ready=False,
        refusing={
            "clock": "local clock +600.000s from the support of a majority of fresh clock readings (3 seen)",
            "replicas": "configured for 1 replicas (TIMESVC_REPLICAS), but a running peer is configured for 3",
        },
        support_offset_us=600_000_000,
        fresh_readings=3,
        needed_readings=2,
    )
    r = poll(view(lambda request: httpx.Response(200, json=refusing)))
    assert r.refusing.keys() == {"clock", "replicas"} and r.support_offset_s == 600.0
    assert r.fresh_readings == 3 and r.needed_readings == 2
    assert r.problems[:2] == [
        "refuses its clock: local clock +600.000s from the support of a majority of fresh clock readings "
        "(3 seen); /now answers 503",
        "refuses its clock: configured for 1 replicas (TIMESVC_REPLICAS), but a running peer is configured for 3 "
        "(check TIMESVC_REPLICAS)",
    ]
    not_current = status(in_sync=False, ready=False, fresh_readings=1, needed_readings=2)
    r = poll(view(lambda request: httpx.Response(200, json=not_current)))
    assert r.problems == ["global time not current here (1 of 2 fresh clock readings seen): /now answers 503"]
    # An older timesvc without the /now count: no rate, nothing else lost.
    old = {k: v for k, v in status().items() if k not in ("now_requests", "now_errors", "last_ok_tick_age_s")}
    r = poll(view(lambda request: httpx.Response(200, json=old)))
    assert r.reachable and r.problems == [] and r.now_requests is None and r.now_per_s is None
