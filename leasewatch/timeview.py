"""Is time healthy? The timesvc replicas as one leasewatch replica sees them.

Locks are only as fair as the tickets' global time, and the person looking at the lock page
wants to know, without a shell, whether every timesvc replica is up, in sync with GlobalTime,
publishing its clock (not refusing it: its clock disagrees with the majority's, or its
``TIMESVC_REPLICAS`` with its peers'), and serving ``/now``. The replicas already say so in their own
``GET /status``; leasewatch polls it server-side (``LEASEWATCH_TIMESVC_URLS``) so that

* the browser needs no route to timesvc and no second token (``LEASEWATCH_TIMESVC_TOKEN``
  stays on the server);
* the cost does not grow with the number of open pages: one poll of every replica per
  :data:`POLL_INTERVAL_S`, whatever reads ``GET /time`` (it serves the last poll);
* a ``/now`` *rate* exists: timesvc reports a count since its start, and the rate is the
  difference of two successive polls over leasewatch's own monotonic clock.

Every poll is bounded (:data:`TIMEOUT_S` per replica, all replicas at once, an answer of
at most :data:`MAX_ANSWER_BYTES`). What fails is said by kind ("no answer within 1.5 s",
"cannot connect", "answered 401: …" with timesvc's own public detail), never with the
replica's URL: a target is named by its position in ``LEASEWATCH_TIMESVC_URLS`` and the
replica id it last answered with (SECURITY.md: answers name no host or port).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from lockclient.logs import get_logger

__all__ = ["MAX_ANSWER_BYTES", "POLL_INTERVAL_S", "TIMEOUT_S", "ReplicaTime", "TimeView"]

log = get_logger("leasewatch")

POLL_INTERVAL_S = 2.0
"""How often every configured timesvc replica's /status is read."""
TIMEOUT_S = 1.5
"""Per replica and poll: connect, send, read, all together (below the poll interval, so polls
never pile up)."""
MAX_ANSWER_BYTES = 65_536
STALE_TICK_S = 10.0
"""A replica whose last successful tick is older than this (and 3 ticks) is not publishing."""


@dataclass(frozen=True)
class ReplicaTime:
    """One configured timesvc replica, as of the last poll."""

    target: int
    """1-based position in LEASEWATCH_TIMESVC_URLS."""
    replica: str | None
    """Its TIMESVC_REPLICA_ID, from the last answer (None: it never answered)."""
    reachable: bool
    """The last poll got a /status answer."""
    error: str | None
    """Why the last poll got none (a kind of failure, no URL)."""
    polled_at: datetime | None
    answered_age_s: float | None
    """Seconds since the last answer (None: never)."""
    version: str | None
    ready: bool | None
    runaway: bool | None
    refusing: dict[str, str]
    """Why it publishes only the carry, never its clock, by kind (clock, replicas); empty: it does not refuse."""
    in_sync: bool | None
    offset_s: float | None
    """Its wall clock minus GlobalTime at its last tick."""
    support_offset_s: float | None
    """Its wall clock minus the support of a majority of fresh clock readings (None: no majority seen)."""
    fresh_readings: int | None
    needed_readings: int | None
    max_skew_s: float | None
    last_tick_ok: bool | None
    last_ok_tick_age_s: float | None
    """Seconds since its last successful tick (each publishes its clock reading), at the answer."""
    last_publisher: str | None
    """The replica that last wrote GlobalTime, as this one saw it."""
    last_error: str | None
    failed_ticks: int | None
    rejected_ticks: int | None
    now_requests: int | None
    now_errors: int | None
    now_per_s: float | None
    """/now answers per second between the last two answers (None: fewer than two, or it restarted)."""
    peer_offsets_s: dict[str, float]
    problems: list[str]
    """What is wrong, in words (empty: healthy)."""

    @property
    def name(self) -> str:
        return self.replica or f"#{self.target}"


@dataclass
class _Target:
    index: int
    url: str
    answer: dict[str, Any] | None = None
    answered_at: float | None = None
    error: str | None = None
    polled_at: datetime | None = None
    count: tuple[float, int] | None = None
    """(monotonic, now_requests) at the last answer."""
    now_per_s: float | None = None


class _BadAnswer(Exception):
    pass


_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "replica": str,
    "ready": bool,
    "runaway": bool,
    "in_sync": bool,
    "max_skew_s": (int, float),
}


class TimeView:
    """Polls ``{url}/status`` of every timesvc replica; :meth:`snapshot` is the last poll."""

    def __init__(
        self,
        urls: list[str],
        token: str | None = None,
        *,
        timeout: float = TIMEOUT_S,
        monotonic: Callable[[], float] = time.monotonic,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._targets = [_Target(i + 1, url) for i, url in enumerate(urls)]
        self._timeout = timeout
        self._monotonic = monotonic
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # No redirects: a /status that redirects elsewhere is not a timesvc answer.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout), headers=headers, follow_redirects=False, transport=transport
        )

    @property
    def configured(self) -> int:
        return len(self._targets)

    async def poll(self) -> None:
        """Read every replica's /status at once; each is bounded by the timeout."""
        await asyncio.gather(*(self._poll_one(target) for target in self._targets))

    async def _poll_one(self, target: _Target) -> None:
        try:
            async with asyncio.timeout(self._timeout + 0.5):  # httpx bounds each phase; this the whole
                answer = await self._fetch(target.url)
        except (TimeoutError, httpx.TimeoutException):
            error = f"no answer within {self._timeout:g} s"
        except httpx.ConnectError:
            error = "cannot connect"
        except httpx.HTTPError as exc:
            error = f"request failed ({type(exc).__name__})"
        except _BadAnswer as exc:
            error = str(exc)
        else:
            now = self._monotonic()
            count = answer.get("now_requests")
            if isinstance(count, int):
                before = target.count
                rate = None
                if before is not None and now > before[0] and count >= before[1]:
                    rate = (count - before[1]) / (now - before[0])
                target.count, target.now_per_s = (now, count), rate
            else:  # an older timesvc without the count
                target.count, target.now_per_s = None, None
            target.answer, target.answered_at, target.error = answer, now, None
            target.polled_at = datetime.now(UTC)
            return
        if target.error != error:
            log.warning("timesvc_status_failed", target=target.index, url=target.url, error=error)
        target.error, target.polled_at = error, datetime.now(UTC)
        target.count, target.now_per_s = None, None

    async def _fetch(self, url: str) -> dict[str, Any]:
        async with self._client.stream("GET", f"{url}/status") as response:
            body = b""
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise _BadAnswer("answer too large")
        if response.status_code != 200:
            # timesvc's error details are public by construction (no host, no path); shortened anyway.
            detail = ""
            try:
                parsed = httpx.Response(200, content=body).json()
                if isinstance(parsed, dict) and isinstance(parsed.get("detail"), str):
                    detail = ": " + parsed["detail"][:200]
            except ValueError:
                pass
            raise _BadAnswer(f"answered {response.status_code}{detail}")
        try:
            answer = httpx.Response(200, content=body).json()
        except ValueError as exc:
            raise _BadAnswer("not a timesvc /status answer (not JSON)") from exc
        if not isinstance(answer, dict) or not all(
            isinstance(answer.get(key), kind) for key, kind in _REQUIRED.items()
        ):
            raise _BadAnswer("not a timesvc /status answer")
        return answer

    def snapshot(self) -> list[ReplicaTime]:
        now = self._monotonic()
        return [self._view(target, now) for target in self._targets]

    def _view(self, target: _Target, now: float) -> ReplicaTime:
        a = target.answer or {}

        def num(key: str) -> float | None:
            value = a.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        def count(key: str) -> int | None:
            value = a.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def flag(key: str) -> bool | None:
            value = a.get(key)
            return value if isinstance(value, bool) else None

        def text(key: str) -> str | None:
            value = a.get(key)
            return value[:200] if isinstance(value, str) else None

        offset_us = num("local_offset_us")
        offset = None if offset_us is None else round(offset_us / 1e6, 6)
        peers = a.get("peer_offsets_us")
        peer_offsets = (
            {str(k)[:128]: round(float(v) / 1e6, 6) for k, v in list(peers.items())[:64] if isinstance(v, int | float)}
            if isinstance(peers, dict)
            else {}
        )
        raw_refusing = a.get("refusing")
        refusing = (
            {str(k)[:32]: str(v)[:300] for k, v in list(raw_refusing.items())[:8]}
            if isinstance(raw_refusing, dict)
            else {}
        )
        support_us = num("support_offset_us")
        reachable = target.answer is not None and target.error is None
        view = ReplicaTime(
            target=target.index,
            replica=text("replica"),
            reachable=reachable,
            error=target.error,
            polled_at=target.polled_at,
            answered_age_s=None if target.answered_at is None else round(now - target.answered_at, 3),
            version=text("version"),
            ready=flag("ready"),
            runaway=flag("runaway"),
            refusing=refusing,
            in_sync=flag("in_sync"),
            offset_s=offset,
            support_offset_s=None if support_us is None else round(support_us / 1e6, 6),
            fresh_readings=count("fresh_readings"),
            needed_readings=count("needed_readings"),
            max_skew_s=num("max_skew_s"),
            last_tick_ok=flag("last_tick_ok"),
            last_ok_tick_age_s=num("last_ok_tick_age_s"),
            last_publisher=text("last_publisher"),
            last_error=text("last_error"),
            failed_ticks=count("failed_ticks"),
            rejected_ticks=count("rejected_ticks"),
            now_requests=count("now_requests"),
            now_errors=count("now_errors"),
            now_per_s=None if target.now_per_s is None else round(target.now_per_s, 3),
            peer_offsets_s=peer_offsets,
            problems=[],
        )
        view.problems.extend(_problems(view, num("tick_s")))
        return view

    async def aclose(self) -> None:
        await self._client.aclose()


def _problems(view: ReplicaTime, tick_s: float | None) -> list[str]:
    """The verdict the page colours by: what an operator would have to act on."""
    problems: list[str] = []
    if not view.reachable:
        problems.append(f"unreachable: {view.error}" if view.error else "not polled yet")
        if view.replica is None:
            return problems
        # The rest is from its last answer, still worth showing.
    if "clock" in view.refusing:
        problems.append(f"refuses its clock: {view.refusing['clock']}; /now answers 503")
    elif view.runaway:  # an older timesvc without the reasons
        problems.append("runaway clock: not published")
    if "replicas" in view.refusing:
        problems.append(f"refuses its clock: {view.refusing['replicas']} (check TIMESVC_REPLICAS)")
    for kind, reason in view.refusing.items():
        if kind not in ("clock", "replicas"):
            problems.append(f"refuses its clock ({kind}): {reason}")
    if view.in_sync is False:
        seen = (
            f" ({view.fresh_readings} of {view.needed_readings} fresh clock readings seen)"
            if view.fresh_readings is not None and view.needed_readings is not None
            else ""
        )
        problems.append(f"global time not current here{seen}: /now answers 503")
    if view.ready is False and not view.runaway and not view.refusing and view.in_sync is not False:
        problems.append("not ready")
    if view.offset_s is not None and view.max_skew_s is not None and abs(view.offset_s) > view.max_skew_s:
        problems.append(f"clock {view.offset_s:+.3f} s from GlobalTime, beyond max_skew {view.max_skew_s:g} s")
    stale = max(STALE_TICK_S, 3 * tick_s) if tick_s else STALE_TICK_S
    if view.last_ok_tick_age_s is not None and view.last_ok_tick_age_s > stale:
        problems.append(f"no successful tick for {view.last_ok_tick_age_s:.0f} s")
    if view.last_tick_ok is False and view.last_error:
        problems.append(f"last tick failed: {view.last_error}")
    return problems
