"""An aiohttp load generator: closed-loop (N connections, back to back) and open-loop (fixed rate).

aiohttp, not httpx: shared/TESTING.md measured httpx's AsyncClient ~10x slower for many
concurrent clients. One event loop (uvloop when installed) in one process: this machine
has 2 cores and the server needs one of them.

Open-loop latency is measured from each request's *scheduled* send time, so a client
or server stall shows up in the percentiles instead of silently lowering the rate
(coordinated omission); the service time from the actual send is reported beside it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

__all__ = ["ClosedLoopResult", "OpenLoopResult", "closed_loop", "make_session", "open_loop", "run_async"]

T = TypeVar("T")

_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=10)


def run_async(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on uvloop when available (less client CPU on a shared 2-core box)."""
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
        pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(factory())  # type: ignore[arg-type]


def client_loop_name() -> str:
    try:
        import uvloop  # noqa: F401

        return "uvloop"
    except ImportError:  # pragma: no cover
        return "asyncio"


def make_session(max_connections: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=max_connections, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=_REQUEST_TIMEOUT)


@dataclass
class ClosedLoopResult:
    path: str
    connections: int
    duration_s: float
    ok: int
    errors: int
    latencies_s: list[float] = field(repr=False)
    client_cpu_s: float

    @property
    def rps(self) -> float:
        return self.ok / self.duration_s if self.duration_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        from bench.common import percentile

        return {
            "path": self.path,
            "connections": self.connections,
            "duration_s": round(self.duration_s, 3),
            "ok": self.ok,
            "errors": self.errors,
            "rps": round(self.rps, 1),
            "p50_ms": round(percentile(self.latencies_s, 50) * 1e3, 3),
            "p99_ms": round(percentile(self.latencies_s, 99) * 1e3, 3),
            "client_cpu_s": round(self.client_cpu_s, 3),
        }


async def closed_loop(
    session: aiohttp.ClientSession, urls: Sequence[str], path: str, connections: int, duration: float
) -> ClosedLoopResult:
    """``connections`` workers, each sending the next request as soon as the last answered.

    Worker i talks to ``urls[i % len(urls)]``. Bounded: stops sending after ``duration``
    and waits at most the request timeout for the last answers.
    """
    ok = 0
    errors = 0
    latencies: list[float] = []
    perf = time.perf_counter
    cpu_start = time.process_time()
    start = perf()
    end = start + duration

    async def worker(url: str) -> None:
        nonlocal ok, errors
        target = url + path
        while perf() < end:
            sent = perf()
            try:
                async with session.get(target) as response:
                    await response.read()
                    good = response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                good = False
            if good:
                ok += 1
                latencies.append(perf() - sent)
            else:
                errors += 1

    await asyncio.gather(*(worker(urls[i % len(urls)]) for i in range(connections)))
    elapsed = perf() - start
    return ClosedLoopResult(path, connections, elapsed, ok, errors, latencies, time.process_time() - cpu_start)


@dataclass
class OpenLoopResult:
    path: str
    rate: float
    duration_s: float
    sent: int
    ok: int
    errors: int
    latencies_s: list[float] = field(repr=False)
    """From the scheduled send time to the end of the response."""
    service_s: list[float] = field(repr=False)
    """From the actual send to the end of the response."""
    max_send_lag_s: float
    client_cpu_s: float


async def open_loop(
    session: aiohttp.ClientSession, url: str, path: str, rate: float, duration: float
) -> OpenLoopResult:
    """Send ``rate`` requests/s for ``duration`` s on schedule, whatever the answers do."""
    total = max(1, int(rate * duration))
    interval = 1.0 / rate
    target = url + path
    perf = time.perf_counter
    latencies: list[float] = []
    service: list[float] = []
    ok = 0
    errors = 0
    max_lag = 0.0
    cpu_start = time.process_time()

    async def one(scheduled: float) -> None:
        nonlocal ok, errors
        sent = perf()
        try:
            async with session.get(target) as response:
                await response.read()
                good = response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            good = False
        done = perf()
        if good:
            ok += 1
            latencies.append(done - scheduled)
            service.append(done - sent)
        else:
            errors += 1

    tasks: set[asyncio.Task[None]] = set()
    start = perf() + 0.01
    i = 0
    while i < total:
        due = start + i * interval
        now = perf()
        if due > now:
            await asyncio.sleep(due - now)
            now = perf()
        # Fire everything that is due (the loop wakes ~every ms; rates above 1k/s come in bursts).
        while i < total and start + i * interval <= now:
            scheduled = start + i * interval
            max_lag = max(max_lag, now - scheduled)
            task = asyncio.create_task(one(scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
    if tasks:
        await asyncio.wait(tasks, timeout=15)
    elapsed = perf() - start
    return OpenLoopResult(
        path, rate, elapsed, total, ok, errors, latencies, service, max_lag, time.process_time() - cpu_start
    )
