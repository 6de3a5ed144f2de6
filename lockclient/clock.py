"""Global time for the lock client: from timesvc over HTTP, or straight from the store.

Both clocks keep a *floor*: they never hand out a smaller value than they
handed out before, even if fail-over lands on a replica whose answer is
older (a response can only be older than one already seen if it was delayed
in flight — the floor makes that invisible to the caller).
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import httpx

from lockclient.errors import ChronolockError, ConfigurationError, StoreError, TimeServiceUnavailable
from lockclient.globaltime import GlobalTimeUpdater
from lockclient.logs import get_logger
from lockclient.store import CellStore

__all__ = ["AsyncTimeServiceClock", "GlobalClock", "StoreClock", "TimeServiceClock", "parse_timesvc_urls"]

log = get_logger("lockclient.clock")


@runtime_checkable
class GlobalClock(Protocol):
    """Anything that hands out non-decreasing global time in µs."""

    def now_us(self) -> int:
        """Global time in µs; never smaller than a value this clock returned before."""
        ...

    def close(self) -> None: ...


class _Floor:
    """The monotonic floor shared by the clocks. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    def apply(self, value: int) -> int:
        with self._lock:
            self._value = max(self._value, value)
            return self._value


def parse_timesvc_urls(urls: str | Sequence[str]) -> list[str]:
    """``"http://a:8700, http://b:8700"`` or a list → validated base URLs without trailing slash."""
    items = [u.strip() for u in (urls.split(",") if isinstance(urls, str) else urls) if u and u.strip()]
    if not items:
        raise ConfigurationError("no timesvc URL given (CHRONOLOCK_TIMESVC_URLS)")
    for url in items:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"timesvc URL {url!r} must start with http:// or https://")
    return [u.rstrip("/") for u in items]


def _parse_now(response: httpx.Response, url: str) -> int:
    response.raise_for_status()
    try:
        value = response.json()["now_us"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TimeServiceUnavailable(f"timesvc {url} answered without now_us: {response.text[:200]!r}") from exc
    if not isinstance(value, int) or value <= 0:
        raise TimeServiceUnavailable(f"timesvc {url} answered a bad now_us: {value!r}")
    return value


class _Replicas:
    """What both timesvc clocks share: the URL list, which replica answered last, the floor,
    and the fail-over order and errors."""

    def __init__(self, urls: str | Sequence[str], timeout: float) -> None:
        if timeout <= 0:
            raise ConfigurationError(f"timeout must be positive, got {timeout}")
        self.urls = parse_timesvc_urls(urls)
        self.preferred = 0
        self.floor = _Floor()

    def order(self) -> list[tuple[int, str]]:
        """The replica that answered last first, then the others in turn."""
        n = len(self.urls)
        return [((self.preferred + i) % n, self.urls[(self.preferred + i) % n]) for i in range(n)]

    def answered(self, index: int, value: int, errors: list[str]) -> int:
        if index != self.preferred:
            log.info("timesvc_failover", to=self.urls[index], errors=errors)
            self.preferred = index
        return self.floor.apply(value)

    @staticmethod
    def failed(errors: list[str]) -> TimeServiceUnavailable:
        return TimeServiceUnavailable("no timesvc replica answered: " + "; ".join(errors))


_FAILOVER_ERRORS = (httpx.HTTPError, TimeServiceUnavailable)


class TimeServiceClock:
    """Global time from one or more timesvc replicas, with fail-over.

    Requests go to the replica that answered last; on a timeout, a connection
    error or a 5xx it tries the next one, and raises
    :class:`~lockclient.errors.TimeServiceUnavailable` only when every replica failed.
    """

    def __init__(
        self, urls: str | Sequence[str], *, timeout: float = 2.0, transport: httpx.BaseTransport | None = None
    ):
        self._replicas = _Replicas(urls, timeout)
        self.urls = self._replicas.urls
        self._client = httpx.Client(timeout=timeout, transport=transport, headers={"Cache-Control": "no-store"})

    def now_us(self) -> int:
        errors: list[str] = []
        for index, url in self._replicas.order():
            try:
                value = _parse_now(self._client.get(f"{url}/now"), url)
            except _FAILOVER_ERRORS as exc:
                errors.append(f"{url}: {exc or type(exc).__name__}")
                continue
            return self._replicas.answered(index, value, errors)
        raise self._replicas.failed(errors)

    def close(self) -> None:
        self._client.close()


class AsyncTimeServiceClock:
    """The asyncio twin of :class:`TimeServiceClock` (``await clock.anow_us()``)."""

    def __init__(
        self, urls: str | Sequence[str], *, timeout: float = 2.0, transport: httpx.AsyncBaseTransport | None = None
    ):
        self._replicas = _Replicas(urls, timeout)
        self.urls = self._replicas.urls
        self._client = httpx.AsyncClient(timeout=timeout, transport=transport, headers={"Cache-Control": "no-store"})

    async def anow_us(self) -> int:
        errors: list[str] = []
        for index, url in self._replicas.order():
            try:
                value = _parse_now(await self._client.get(f"{url}/now"), url)
            except _FAILOVER_ERRORS as exc:
                errors.append(f"{url}: {exc or type(exc).__name__}")
                continue
            return self._replicas.answered(index, value, errors)
        raise self._replicas.failed(errors)

    async def aclose(self) -> None:
        await self._client.aclose()


_store_clock_ids = itertools.count()


class StoreClock:
    """Global time without timesvc: this process runs TryUpdateGlobalTime itself, on demand.

    For embedded use (one machine, the SQLite store). Each call is one store
    round trip (a read, and a write when time moved on). Nobody ticks between
    calls, so the runaway guard (which needs replicas publishing continuously to
    tell a fast clock from stale global time) is off; processes on one machine
    share one wall clock anyway. Across machines, use timesvc.
    """

    def __init__(self, store: CellStore, *, max_skew: float = 1.0) -> None:
        replica = f"client-{os.getpid()}-{next(_store_clock_ids)}-{uuid.uuid4().hex[:6]}"
        self._updater = GlobalTimeUpdater(store, replica_id=replica, max_skew=max_skew, guard=False)
        self._floor = _Floor()

    def now_us(self) -> int:
        try:
            return self._floor.apply(self._updater.update().now_us)
        except StoreError:
            raise
        except ChronolockError as exc:  # pragma: no cover - defensive: keep the error family
            raise StoreError(str(exc)) from exc

    def close(self) -> None:
        """The store belongs to the caller; nothing to release."""
