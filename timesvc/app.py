"""The timesvc HTTP service: ``create_app(settings)`` builds a FastAPI app.

The lifespan opens the store and starts the periodic tick that runs TryUpdateGlobalTime every
``tick`` (:mod:`lockclient.schedule`, on the event loop's monotonic clock, so a wall-clock step
of the host does not stop it); ``GET /now`` runs it on demand too, with
concurrent requests coalesced (:mod:`timesvc.coalesce`). Both go through the
same coalescer, so a tick and a burst of requests never cost more than one
store round trip at a time, and trips are rate-limited to one per
``TIMESVC_MIN_TRIP_INTERVAL`` on average, so a flood of requests cannot become store load.

Error bodies and ``/readyz`` reasons name the kind of failure, never the store's host,
port or file path (those go to the log). ``/status`` needs ``TIMESVC_READ_TOKEN`` when
it is set.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Annotated

from fastapi import Depends, FastAPI, Header, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, Field

from lockclient.errors import ChronolockError, StoreAccessDenied, StoreError
from lockclient.globaltime import (
    GlobalTimeNotEstablished,
    GlobalTimeUpdater,
    UpdateResult,
    check_answerable,
    wall_clock_us,
)
from lockclient.logs import get_logger
from lockclient.schedule import PeriodicSchedule, run_schedule
from lockclient.store import CellStore
from lockclient.store.opener import StoreOpener, public_error
from lockclient.store.url import parse_store_url
from lockclient.version import __version__, build_info
from timesvc.coalesce import Coalescer
from timesvc.settings import TimesvcSettings

__all__ = ["NowResponse", "TimeService", "create_app"]

log = get_logger("timesvc")

REFUSAL_KINDS = ("clock", "replicas")


class NowResponse(BaseModel):
    now_us: int = Field(description="global time, µs since the epoch; never smaller than any value handed out before")
    replica: str = Field(description="the replica that answered")


class ReadyResponse(BaseModel):
    ready: bool
    reasons: list[str] = Field(default_factory=list, description="why it is not ready (empty when ready)")
    refusing: list[str] = Field(
        default_factory=list,
        description="why this replica publishes only the carry and never its clock (a clock refused makes it "
        "not ready; a replica count contradicted by a peer does not, so rolling updates proceed)",
    )


class StatusResponse(BaseModel):
    replica: str
    version: str = Field(description="chronolock version of this replica")
    store: str = Field(description="kind of store (sqlite, or the Cassandra keyspace); never hosts or paths")
    ready: bool
    runaway: bool = Field(
        description="the local wall clock is refused: more than max_skew from the support of a majority of "
        "fresh clock readings (it publishes only the carry)"
    )
    refusing: dict[str, str] = Field(
        description="why this replica publishes only the carry, by kind: clock (its clock disagrees with the "
        "majority) or replicas (a peer is configured for more replicas than TIMESVC_REPLICAS)"
    )
    in_sync: bool = Field(
        description="global time is current for this replica: at its last run with a majority of fresh clock "
        "readings it was within max_skew of their support; until then /now answers 503"
    )
    support_offset_us: int | None = Field(
        description="local wall clock minus the support of a majority of fresh clock readings at the last run "
        "(None: fewer fresh readings than a majority)"
    )
    fresh_readings: int = Field(description="fresh clock readings seen at the last run, this replica's included")
    needed_readings: int = Field(description="fresh readings a support needs: a majority of max(replicas, fresh)")
    local_offset_us: int | None = Field(description="local wall clock minus global time at the last tick")
    global_us: int | None = Field(description="global time at the last successful tick")
    last_publisher: str = Field(description="replica that last wrote GlobalTime, as last seen")
    last_tick_at: datetime | None
    last_tick_ok: bool | None
    last_ok_tick_age_s: float | None = Field(
        description="seconds since the last successful tick (each publishes this replica's clock reading), "
        "on this replica's monotonic clock"
    )
    last_error: str | None
    ticks: int
    failed_ticks: int
    rejected_ticks: int = Field(description="ticks whose local clock was refused")
    replicas: int = Field(description="configured replica count (TIMESVC_REPLICAS)")
    peer_offsets_us: dict[str, int] = Field(
        description="each running peer's clock (its reading, extrapolated conservatively) minus ours, at the last run"
    )
    store_round_trips: int
    now_requests: int = Field(description="GET /now answers since start (a rate is the difference of two readings)")
    now_errors: int = Field(description="GET /now answers that were errors, since start")
    tick_s: float
    max_skew_s: float


class Metrics:
    """Prometheus metrics of one app instance (its own registry, so several apps can share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.now_requests = Counter("timesvc_now_requests", "GET /now requests by outcome", ["outcome"], registry=r)
        self.now_ok = self.now_requests.labels("ok")  # bound once: labels() takes a lock per call
        self.now_errors = self.now_requests.labels("error")
        self.now_latency = Histogram(
            "timesvc_now_latency_seconds",
            "GET /now latency",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.round_trips = Counter(
            "timesvc_store_round_trips", "TryUpdateGlobalTime runs against the store", registry=r
        )
        self.ticks = Counter("timesvc_ticks", "scheduled ticks by outcome", ["outcome"], registry=r)
        self.rejected_ticks = Counter("timesvc_rejected_ticks", "ticks whose local clock was refused", registry=r)
        self.clock_offset = Gauge("timesvc_clock_offset_seconds", "local wall clock minus global time", registry=r)
        self.support_offset = Gauge(
            "timesvc_support_offset_seconds",
            "local wall clock minus the support of a majority of fresh clock readings",
            registry=r,
        )
        self.runaway = Gauge("timesvc_runaway", "1 when the local clock is refused (reason clock)", registry=r)
        self.refusing = Gauge(
            "timesvc_refusing",
            "1 when this replica publishes only the carry, never its clock, by reason (clock, replicas)",
            ["reason"],
            registry=r,
        )
        for reason in REFUSAL_KINDS:
            self.refusing.labels(reason).set(0)
        self.replicas_seen = Gauge(
            "timesvc_replicas_seen", "fresh clock readings at the last run, this replica's included", registry=r
        )
        self.global_time = Gauge("timesvc_global_time_seconds", "global time at the last update", registry=r)
        self.ready = Gauge("timesvc_ready", "1 when /readyz answers 200", registry=r)
        self.build = build_info(r, "timesvc")
        # Settings as gauges, so alert rules compare with the configured values, not copies.
        self.max_skew = Gauge("timesvc_max_skew_seconds", "TIMESVC_MAX_SKEW: runaway threshold", registry=r)
        self.tick = Gauge("timesvc_tick_seconds", "TIMESVC_TICK: seconds between ticks", registry=r)
        self.replicas = Gauge("timesvc_replicas", "TIMESVC_REPLICAS: configured replica count", registry=r)


@dataclass
class _TickState:
    at: datetime | None = None
    ok: bool | None = None
    ok_monotonic: float | None = None
    error: ChronolockError | None = None
    ticks: int = 0
    failed: int = 0
    rejected: int = 0
    last: UpdateResult | None = None


class TimeService:
    """One replica: the store, the updater, the coalescer, and what /status reports."""

    def __init__(
        self,
        settings: TimesvcSettings,
        *,
        store: CellStore | None = None,
        wall_us: Callable[[], int] = wall_clock_us,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.metrics.max_skew.set(settings.max_skew)
        self.metrics.tick.set(settings.tick)
        self.metrics.replicas.set(settings.replicas)
        self._store = store
        self._owns_store = store is None
        self._opener = StoreOpener(settings.open_store)
        parsed = parse_store_url(settings.store_url)
        # What /status shows: the kind of store (and keyspace), not its hosts or file path.
        self._store_kind = f"cassandra keyspace {parsed.path}" if parsed.scheme == "cassandra" else parsed.scheme
        self._wall_us = wall_us
        self._monotonic_ns = monotonic_ns
        self._updater: GlobalTimeUpdater | None = None
        self._state = _TickState()
        self._report_due = False
        self._open_lock = asyncio.Lock()
        # The same counts as timesvc_now_requests_total, readable without the registry (/status).
        self.now_answers = 0
        self.now_failures = 0
        self.coalescer: Coalescer[UpdateResult] = Coalescer(self._round_trip, min_interval=settings.min_trip_interval)

    # -- store and updater -------------------------------------------------------------

    async def _updater_ready(self) -> GlobalTimeUpdater:
        if self._updater is not None:
            return self._updater
        async with self._open_lock:
            if self._updater is None:
                store = self._store
                if store is None:
                    # Backs off after failures: a wrong password must not mean a login per tick.
                    store = self._store = await asyncio.to_thread(self._opener.open)
                    log.info("store_opened", store=store.url)
                self._updater = GlobalTimeUpdater(
                    store,
                    replica_id=self.settings.replica_id,
                    max_skew=self.settings.max_skew,
                    replicas=self.settings.replicas,
                    # A peer whose clock reading has not changed for 4 ticks is not running.
                    stale_after=max(4 * self.settings.tick, 1.0),
                    wall_us=self._wall_us,
                    monotonic_ns=self._monotonic_ns,
                )
        return self._updater

    async def _round_trip(self) -> UpdateResult:
        updater = await self._updater_ready()
        self.metrics.round_trips.inc()
        # The next round trip after a tick also publishes this replica's clock reading (once
        # per tick, whether a tick or a /now request runs it): requests add no writes.
        report, self._report_due = self._report_due, False
        result = await asyncio.to_thread(partial(updater.update, report_clock=report))
        self._record(result)
        return result

    def _record(self, result: UpdateResult) -> None:
        self._state.last = result
        offset = result.local_us - result.now_us
        self.metrics.clock_offset.set(offset / 1e6)
        self.metrics.global_time.set(result.now_us / 1e6)
        self.metrics.runaway.set(1 if result.runaway else 0)
        for reason in REFUSAL_KINDS:
            self.metrics.refusing.labels(reason).set(1 if reason in result.refusing else 0)
        self.metrics.replicas_seen.set(result.fresh)
        if result.support_us is not None:
            self.metrics.support_offset.set((result.local_us - result.support_us) / 1e6)

    async def now(self) -> UpdateResult:
        """A global time >= every value any replica handed out before this call.

        Raises :class:`GlobalTimeNotCurrent` while global time is not current for this replica
        (:attr:`UpdateResult.current`: it has not seen a majority of fresh clock readings confirm it,
        and its own clock disagrees with it): clients then use another replica, or retry, instead of
        taking tickets that may lag real time by as long as the store or the other replicas were
        out (tests/faults finding 2).

        Raises it too while this replica refuses its own clock: it could only hand out the stored
        value and its carry (never its clock), which advance in steps of the other replicas'
        writes — clients extrapolate between answers at real rate, so they are better served by a
        replica that follows a clock. (A replica refusing only because a peer is configured for
        more replicas still answers: that is a rolling update's transient as often as a mistake.)"""
        result = await self.coalescer()
        check_answerable(result, self.settings.replica_id)
        return result

    async def tick(self) -> None:
        """The scheduled TryUpdateGlobalTime run."""
        state = self._state
        state.ticks += 1
        state.at = datetime.now(UTC)
        self._report_due = True
        try:
            result = await self.coalescer()
        except ChronolockError as exc:
            state.ok, state.error = False, exc
            state.failed += 1
            self.metrics.ticks.labels("error").inc()
            log.warning("tick_failed", error=str(exc), error_type=type(exc).__name__)
        else:
            if state.ok is False:
                log.info("tick_recovered")
            state.ok, state.error = True, None
            state.ok_monotonic = time.monotonic()
            self.metrics.ticks.labels("ok").inc()
            if result.runaway:
                state.rejected += 1
                self.metrics.rejected_ticks.inc()
        self.metrics.ready.set(1 if self.readiness()[0] else 0)

    # -- health ----------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, list[str]]:
        reasons: list[str] = []
        state = self._state
        if state.ok is None:
            reasons.append("no tick has completed yet")
        elif not state.ok:
            reasons.append(public_error(state.error) if state.error is not None else "store failed")
        elif state.ok_monotonic is not None and time.monotonic() - state.ok_monotonic > 3 * self.settings.tick + 5:
            reasons.append("no successful tick recently")
        # The clock verdicts are only meaningful while ticks succeed: a replica that cannot
        # write sees global time stand still and its own clock "ahead" of it (a full disk was
        # reported as "local clock runaway" too). Then the store is the reason, not the clock.
        last = state.last
        if state.ok and last is not None:
            if "clock" in last.refusing:
                reasons.append(f"local clock refused: {last.refusing['clock']}")
            if not last.current:
                reasons.append(
                    "global time not current: no majority of fresh clock readings confirms it "
                    f"({last.fresh} of {last.needed} seen) and this clock disagrees with it"
                )
        return (not reasons, reasons)

    def refusals(self) -> list[str]:
        """Why this replica publishes only the carry (empty: it publishes its clock when supported)."""
        last = self._state.last
        return [] if last is None or not self._state.ok else [f"{k}: {v}" for k, v in sorted(last.refusing.items())]

    def status(self) -> StatusResponse:
        state = self._state
        last = state.last
        ready, _ = self.readiness()
        return StatusResponse(
            replica=self.settings.replica_id,
            version=__version__,
            store=self._store_kind,
            ready=ready,
            runaway=bool(last and last.runaway),
            refusing=dict(last.refusing) if last is not None else {},
            in_sync=bool(last and last.current),
            support_offset_us=None if last is None or last.support_us is None else last.local_us - last.support_us,
            fresh_readings=last.fresh if last is not None else 0,
            needed_readings=last.needed if last is not None else self.settings.replicas // 2 + 1,
            local_offset_us=None if last is None else last.local_us - last.now_us,
            global_us=None if last is None else last.now_us,
            last_publisher=self._updater.last_publisher if self._updater else "",
            last_tick_at=state.at,
            last_tick_ok=state.ok,
            last_ok_tick_age_s=None if state.ok_monotonic is None else round(time.monotonic() - state.ok_monotonic, 3),
            last_error=public_error(state.error) if state.error is not None else None,
            ticks=state.ticks,
            failed_ticks=state.failed,
            rejected_ticks=state.rejected,
            replicas=self.settings.replicas,
            peer_offsets_us=dict(self._updater.peer_offsets_us) if self._updater else {},
            store_round_trips=self.coalescer.round_trips,
            now_requests=self.now_answers,
            now_errors=self.now_failures,
            tick_s=self.settings.tick,
            max_skew_s=self.settings.max_skew,
        )

    def close(self) -> None:
        if self._owns_store and self._store is not None:
            self._store.close()


async def _service(request: Request) -> TimeService:  # async: no threadpool hop per request
    service: TimeService = request.app.state.service
    return service


ServiceDep = Annotated[TimeService, Depends(_service)]


def create_app(
    settings: TimesvcSettings | None = None,
    *,
    store: CellStore | None = None,
    wall_us: Callable[[], int] = wall_clock_us,
    monotonic_ns: Callable[[], int] = time.monotonic_ns,
) -> FastAPI:
    """Build a timesvc app. Nothing is opened until the app starts (lifespan)."""
    settings = settings or TimesvcSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = TimeService(settings, store=store, wall_us=wall_us, monotonic_ns=monotonic_ns)
        app.state.service = service
        schedule = PeriodicSchedule()
        schedule.add("tick", settings.tick, first_at=asyncio.get_running_loop().time())
        ticker = asyncio.create_task(run_schedule(schedule, {"tick": service.tick}, name="timesvc"))
        log.info("timesvc_started", replica=settings.replica_id, tick_s=settings.tick, max_skew_s=settings.max_skew)
        try:
            yield
        finally:
            ticker.cancel()
            with suppress(asyncio.CancelledError):
                await ticker
            await asyncio.to_thread(service.close)
            log.info("timesvc_stopped", replica=settings.replica_id)

    app = FastAPI(
        title="chronolock timesvc",
        summary="Monotonic global time for fair distributed locks",
        version=__version__,
        lifespan=lifespan,
    )

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError) -> JSONResponse:
        # The full error (hosts, ports, file paths) goes to the log, a kind of failure to the client.
        log.warning("request_store_error", path=request.url.path, error=str(exc), error_type=type(exc).__name__)
        return JSONResponse(
            status_code=503,
            content={"detail": f"global time unavailable: {public_error(exc)}"},
            headers={"Cache-Control": "no-store", "Retry-After": "30" if isinstance(exc, StoreAccessDenied) else "1"},
        )

    @app.exception_handler(GlobalTimeNotEstablished)
    async def not_established(request: Request, exc: GlobalTimeNotEstablished) -> JSONResponse:
        return JSONResponse(
            status_code=503,
            content={"detail": str(exc)},
            headers={"Cache-Control": "no-store", "Retry-After": "1"},
        )

    read_token = settings.read_token.get_secret_value().encode() if settings.read_token else None

    def require_reader(authorization: str | None) -> None:
        if read_token is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), read_token):
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})

    # /now is the hot path: the body is two fields, encoded by hand instead of validating and
    # serializing a model per request (NowResponse still documents it in the OpenAPI schema).
    replica_json = json.dumps(settings.replica_id)
    no_store = {"Cache-Control": "no-store"}

    @app.get("/now", response_model=NowResponse, summary="Current global time")
    async def now(request: Request) -> Response:
        # No Depends() here: dependency resolution per request costs more than the handler.
        service: TimeService = request.app.state.service
        started = time.perf_counter()
        metrics = service.metrics
        try:
            result = await service.now()
        except ChronolockError:
            metrics.now_errors.inc()
            service.now_answers += 1
            service.now_failures += 1
            raise
        metrics.now_ok.inc()
        service.now_answers += 1
        metrics.now_latency.observe(time.perf_counter() - started)
        body = f'{{"now_us":{result.now_us},"replica":{replica_json}}}'
        return Response(content=body, media_type="application/json", headers=no_store)

    @app.get("/healthz", summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", response_model=ReadyResponse, summary="Store reachable, clock not refused, global time current")
    async def readyz(service: ServiceDep, response: Response) -> ReadyResponse:
        ready, reasons = service.readiness()
        response.status_code = 200 if ready else 503
        return ReadyResponse(ready=ready, reasons=reasons, refusing=service.refusals())

    @app.get(
        "/status",
        response_model=StatusResponse,
        summary="Clock offset, last tick, rejected ticks (TIMESVC_READ_TOKEN, if set)",
        responses={401: {"description": "a bearer token is required"}},
    )
    async def status(
        service: ServiceDep,
        authorization: Annotated[str | None, Header(description="Bearer <token>")] = None,
    ) -> StatusResponse:
        require_reader(authorization)
        return service.status()

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def metrics(service: ServiceDep) -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
