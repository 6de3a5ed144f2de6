"""Global time for the lock client: from timesvc over HTTP, or straight from the store.

Both clocks keep a *floor*: they never hand out a smaller value than they
handed out before, even if fail-over lands on a replica whose answer is
older (a response can only be older than one already seen if it was delayed
in flight — the floor makes that invisible to the caller).

**Extrapolation.** A lock ticket needs global time, but not a round trip per ticket:
both clocks keep their recent answers, each with the local monotonic times its request
was sent and its answer arrived, and extrapolate from them for up to ``max_age`` seconds,
refreshing in the background after ``refresh_after``. An answer ``v`` was global time at
the server at some moment between sending and arrival, and global time advances at real
rate, so at local time ``t`` global time lies in ``[v + (t - arrived), v + (t - sent)]``
(widened by 100 ppm of the sample's age for the two clocks' rate difference). Over the
recent answers the interval is the intersection: its lower end (:meth:`now_us`) is the
largest lower bound, its upper end the smallest upper bound; its width is at most the
round trip of the fastest recent answer — like NTP's minimum-delay filter.

**Tickets are linearizable** (:meth:`ticket_us` and :meth:`settle`). A ticket is the
*upper* end of the interval, so it is at least every global time any client saw before
the ticket was taken; and a contender does not start waiting until the lower end has
passed its ticket (:meth:`settle`, after the queue write and the first look: at most the
round trip of one ``/now`` answer, less what the store took). Hence a waiter whose
enqueue completed before another contender *started* has the smaller ticket, however
close together they are — the same promise as asking timesvc for every ticket (Spanner's
commit wait, with timesvc's answers as the interval). A contender granted on its first
look skips the wait: nobody can overtake a holder, so a later ticket sorting below its own
only queues that contender for its release like any other (``lockclient.fairqueue``). Only a jump of global
time itself (a majority of timesvc replicas adopting clocks ahead of it) breaks the
interval for the samples taken before the jump; they expire after ``max_age``.
``max_age=0`` turns extrapolation off (every value from the source, nothing to wait for).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from lockclient import httpclient
from lockclient.errors import ChronolockError, ClockError, ConfigurationError, StoreError, TimeServiceUnavailable
from lockclient.globaltime import RATE_BOUND, GlobalTimeUpdater
from lockclient.lockid import TICKET_DIGITS
from lockclient.logs import get_logger
from lockclient.runtime import THREADS, Runtime
from lockclient.store import CellStore

if TYPE_CHECKING:
    import httpx  # imported when a timesvc client is built (lockclient.httpclient)

__all__ = [
    "AsyncTimeServiceClock",
    "Extrapolator",
    "GlobalClock",
    "StoreClock",
    "TicketClock",
    "TimeServiceClock",
    "parse_timesvc_urls",
    "settle_ticket_time",
    "take_ticket_time",
]

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


DRIFT = 3 * RATE_BOUND
"""Assumed worst rate difference between this machine's monotonic clock and global time's advance
(1,500 ppm). Global time follows correct clocks (rate error ≤ ρ = :data:`RATE_BOUND`), rises at most
ρ faster than a replica's monotonic clock, and without a majority advances by a carry slowed by ρ
on a monotonic clock that may itself be ρ slow; this clock's own monotonic clock may be ρ off the
other way: 3ρ in all."""


TIGHT_US = 100_000
"""An interval wider than this (100 ms) when a ticket is taken is narrowed by a fresh answer
first instead of being waited out. Not narrower (it was 20 ms): on a loaded 3-node ring every
``/now`` answer took 20–60 ms, so every ticket fetched one more on the acquisition's path — a
round trip that did not even make the interval tight, and cost as much as the grant's Paxos
round (issue 27). Only a contender that waits ever settles its ticket, and it waits for a
holder anyway; an answer slower than this (a paused replica) is still not waited out."""

SETTLE_LIMIT_S = 10.0
"""Safety bound of :meth:`Extrapolator.settle` (a ticket's wait is one round trip at most)."""


class Extrapolator:
    """Global time between answers of a slower source (see the module docstring)."""

    _SAMPLES = 8

    def __init__(
        self,
        fetch: Callable[[], int],
        *,
        max_age: float = 1.0,
        refresh_after: float = 0.2,
        runtime: Runtime = THREADS,
        monotonic_ns: Callable[[], int] | None = None,
        sleep: Callable[[float], None] | None = None,
        name: str = "chronolock-clock",
    ) -> None:
        if not (max_age >= 0 and refresh_after >= 0):
            raise ConfigurationError("clock max_age and refresh_after must be >= 0")
        self._fetch = fetch
        self._max_age_ns = int(max_age * 1e9)
        self._refresh_after_ns = int(min(refresh_after, max_age) * 1e9)
        self._runtime = runtime
        self._monotonic_ns = monotonic_ns or runtime.monotonic_ns
        self._sleep = sleep or runtime.sleep
        self._name = name
        self._lock = threading.Lock()  # never held across a call or a wait
        # (value_us, sent_ns, arrived_ns): the answer and the local times around its round trip.
        self._samples: deque[tuple[int, int, int]] = deque(maxlen=self._SAMPLES)
        self._refreshing = False
        self.fetches = 0
        self.settle_waits = 0
        """How many tickets had to wait for global time to pass them (see :meth:`settle`)."""

    def sample(self) -> int:
        """Ask the source now; remember the answer. Raises what the source raises."""
        sent = self._monotonic_ns()
        value = self._fetch()
        arrived = self._monotonic_ns()
        with self._lock:
            self._samples.append((value, sent, arrived))
            self.fetches += 1
        return value

    @staticmethod
    def _lower(value: int, arrived: int, now: int) -> int:
        return value + int((now - arrived) * (1 - DRIFT)) // 1000

    @staticmethod
    def _upper(value: int, sent: int, now: int) -> int:
        return value + int((now - sent) * (1 + DRIFT)) // 1000 + 1

    def _fresh(self, now: int) -> tuple[list[tuple[int, int, int]], bool]:
        """The samples young enough to extrapolate from, and whether a background refresh
        should start (caller holds no lock)."""
        with self._lock:
            fresh = [x for x in self._samples if now - x[2] <= self._max_age_ns]
            youngest = max((x[2] for x in fresh), default=None)
            stale = youngest is None or now - youngest >= self._refresh_after_ns
            start_refresh = stale and youngest is not None and not self._refreshing
            if start_refresh:
                self._refreshing = True
        if start_refresh:
            self._runtime.spawn(self._refresh, name=self._name)
        return fresh, start_refresh

    def now_us(self) -> int:
        """The lower end of the interval: never ahead of global time."""
        if self._max_age_ns == 0:
            return self.sample()
        now = self._monotonic_ns()
        fresh, _ = self._fresh(now)
        if not fresh:
            return self.sample()
        return max(self._lower(v, arrived, now) for v, _, arrived in fresh)

    def ticket_us(self) -> int:
        """The upper end of the interval: at least the global time anybody could have read
        before this call. Pass it to :meth:`settle` before acting on its order."""
        if self._max_age_ns == 0:
            return self.sample()  # read inside this call: already linearizable
        now = self._monotonic_ns()
        fresh, _ = self._fresh(now)
        if not fresh:
            return self.sample()
        lower, upper = self._bounds(fresh, now)
        for loose_us in (TIGHT_US, None):
            if upper - lower <= (loose_us or self._usual_width_us()):
                break
            # Only loose answers at hand (their round trips were slow: a paused replica, a
            # delayed link, a busy machine): settling on one would wait that long, and a fresh
            # answer — from whichever replica answers now — usually narrows it. A second one
            # only when the first was itself far slower than this source's usual round trip:
            # this process was paused between sending and the answer (or while the request
            # waited to be sent), and once the older answers have expired its interval is as
            # wide as the pause. Taken as the ticket, that width would put this process that
            # far behind everyone (and the ticket floor would keep it there).
            self.sample()
            now = self._monotonic_ns()
            fresh, _ = self._fresh(now)
            lower, upper = self._bounds(fresh, now)
        return upper

    def _usual_width_us(self) -> int:
        """The widest interval a second fresh answer is not worth: four times the fastest round
        trip this clock remembers (expired answers included), at least :data:`TIGHT_US` — so a
        steadily slow source costs one extra answer per loose ticket, as before, never two."""
        with self._lock:
            fastest = min(((arrived - sent) // 1000 for _, sent, arrived in self._samples), default=0)
        return max(TIGHT_US, 4 * fastest)

    def _bounds(self, fresh: list[tuple[int, int, int]], now: int) -> tuple[int, int]:
        lower = max(self._lower(v, arrived, now) for v, _, arrived in fresh)
        # Empty intersection: global time jumped ahead after an older sample; the newer
        # samples' lower end is then the better estimate (and needs no wait).
        return lower, max(lower, min(self._upper(v, sent, now) for v, sent, _ in fresh))

    def settle(self, value_us: int, *, limit: float = SETTLE_LIMIT_S) -> float:
        """Wait until global time has surely passed ``value_us`` (the lower end of the interval
        reached it); returns the time waited. The wait is at most the interval's width when the
        ticket was taken (:data:`TIGHT_US`, or one fresh round trip); ``limit`` only guards
        against a value that did not come from :meth:`ticket_us`. Without extrapolation there
        is nothing to wait for."""
        if self._max_age_ns == 0:
            return 0.0
        budget_ns = int(limit * 1e9)
        start = now = self._monotonic_ns()
        while True:
            with self._lock:
                samples = list(self._samples)
            # Expired samples still bound global time from below (only less tightly).
            lower = max((self._lower(v, arrived, now) for v, _, arrived in samples), default=None)
            if lower is None or lower >= value_us or now - start >= budget_ns:
                if now > start:
                    with self._lock:
                        self.settle_waits += 1
                return (now - start) / 1e9
            self._sleep(min(value_us - lower, (budget_ns - (now - start)) // 1000 + 1) / 1e6)
            now = self._monotonic_ns()

    def _refresh(self) -> None:
        try:
            self.sample()
        except ChronolockError as exc:
            log.debug("clock_refresh_failed", error=str(exc))  # the next call past max_age asks itself
        finally:
            with self._lock:
                self._refreshing = False


@runtime_checkable
class TicketClock(GlobalClock, Protocol):
    """A :class:`GlobalClock` whose values are an interval (see the module docstring):
    ``ticket_us`` is its upper end, ``settle`` waits until global time has passed it."""

    def ticket_us(self) -> int: ...

    def settle(self, value_us: int) -> float: ...


def take_ticket_time(clock: GlobalClock) -> int:
    """The global time for a new lock ticket: the upper end of ``clock``'s interval when it
    has one (then :func:`settle_ticket_time` must run before the ticket's order is relied on).
    A time no ticket can carry (20 digits of µs) is the clock's fault: a ClockError, not a crash."""
    value = clock.ticket_us() if isinstance(clock, TicketClock) else clock.now_us()
    if not 0 <= value < 10**TICKET_DIGITS:
        raise ClockError(f"global time {value} µs is out of range: the clock source is wrong")
    return value


def settle_ticket_time(clock: GlobalClock, value_us: int) -> float:
    """Wait until global time has passed a value from :func:`take_ticket_time`."""
    return clock.settle(value_us) if isinstance(clock, TicketClock) else 0.0


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
    if response.status_code != 200:
        # Say why (e.g. "cannot vouch that global time is current"), not only the status line.
        try:
            detail = str(response.json().get("detail", ""))
        except (ValueError, AttributeError):
            detail = response.text[:200]
        raise TimeServiceUnavailable(
            f"timesvc {url} answered {response.status_code}: {detail or response.reason_phrase}"
        )
    try:
        value = response.json()["now_us"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TimeServiceUnavailable(f"timesvc {url} answered without now_us: {response.text[:200]!r}") from exc
    if not isinstance(value, int) or value <= 0:
        raise TimeServiceUnavailable(f"timesvc {url} answered a bad now_us: {value!r}")
    return value


PLAUSIBILITY_MARGIN_S = 1.0
"""Beyond ``max_skew``, how far an answer may be from what this client already knows of global time
before it needs a second replica's word (seconds)."""


class _Answer(NamedTuple):
    value: int
    sent_ns: int
    arrived_ns: int


class _Replicas:
    """What both timesvc clocks share: the URL list, which replica answered last, the floor, the
    fail-over order and errors, and the judgement of answers.

    **Implausible answers** (issue 22, finding 4: one replica answering ``now_us`` ≥ 10^20 lifted a
    client's floor for good, and every later ticket of that process failed). An answer is accepted
    when it lies within ``max_skew`` + :data:`PLAUSIBILITY_MARGIN_S` of the interval this client
    already knows global time to be in — the last accepted answer, extrapolated at real rate ±
    :data:`DRIFT` to when this one was produced — or when another replica's answer agrees with it
    that closely (the first answer of a client, and the rare legitimate jump of global time: after
    an outage left it behind). Otherwise it is rejected (logged, counted in :attr:`rejected`) and
    the next replica is asked; it never reaches the floor. A client configured with a single URL
    accepts its first answer unchecked: there is nobody to compare it with. A client's first
    answer is not *rejected* while it waits for a second replica's word — every client with several
    URLs asks twice at start, and calling that "implausible" (a WARNING on every start) cried wolf;
    it is counted and logged as rejected only if the answer finally accepted disagrees with it."""

    def __init__(
        self, urls: str | Sequence[str], timeout: float, max_skew: float, monotonic_ns: Callable[[], int]
    ) -> None:
        if timeout <= 0:
            raise ConfigurationError(f"timeout must be positive, got {timeout}")
        if not max_skew > 0:
            raise ConfigurationError(f"max_skew must be positive, got {max_skew}")
        self.urls = parse_timesvc_urls(urls)
        self.preferred = 0
        self.floor = _Floor()
        self.monotonic_ns = monotonic_ns
        self._tolerance_us = int((max_skew + PLAUSIBILITY_MARGIN_S) * 1_000_000)
        self._lock = threading.Lock()
        self._reference: _Answer | None = None
        self.rejected = 0
        """Answers rejected as implausible since this clock was made."""
        self.errors: tuple[type[Exception], ...] = (*httpclient.http_errors(), TimeServiceUnavailable)
        """What makes a request fail over to the next replica."""

    def order(self) -> list[tuple[int, str]]:
        """The replica that answered last first, then the others in turn."""
        n = len(self.urls)
        return [((self.preferred + i) % n, self.urls[(self.preferred + i) % n]) for i in range(n)]

    def _agree(self, a: _Answer, b: _Answer) -> bool:
        """Whether two answers can both be global time, within the tolerance: b, extrapolated back
        or forward to a's round trip at real rate (± DRIFT), falls within a's value ± tolerance."""
        early, late = b.sent_ns - a.arrived_ns, b.arrived_ns - a.sent_ns
        lower = a.value + int(early * (1 - DRIFT if early >= 0 else 1 + DRIFT)) // 1000
        upper = a.value + int(late * (1 + DRIFT if late >= 0 else 1 - DRIFT)) // 1000
        return lower - self._tolerance_us <= b.value <= upper + self._tolerance_us

    def judge(self, url: str, answer: _Answer, others: list[tuple[str, _Answer]]) -> bool:
        """Accept ``answer`` (it becomes the reference) or reject it (counted, logged): plausible
        against the reference, or agreeing with another replica's answer in ``others`` (the answers
        of this fetch so far, by URL). With no reference yet, an answer nobody confirmed yet is only
        held back; the ones the accepted answer disagrees with are rejected then."""
        outvoted: list[tuple[str, _Answer]] = []
        with self._lock:
            reference = self._reference
            accepted = (
                (reference is not None and self._agree(reference, answer))
                or any(self._agree(other, answer) for _, other in others)
                or (reference is None and len(self.urls) == 1)
            )
            if accepted:
                self._reference = answer
                if reference is None:
                    outvoted = [(u, other) for u, other in others if not self._agree(answer, other)]
                    self.rejected += len(outvoted)
            elif reference is not None:
                self.rejected += 1
        if accepted:
            for other_url, other in outvoted:
                self._log_rejected(other_url, other, None)
            return True
        if reference is None:
            log.info("timesvc_answer_unconfirmed", url=url, now_us=answer.value, detail="asking another replica")
        else:
            self._log_rejected(url, answer, reference)
        return False

    @staticmethod
    def _log_rejected(url: str, answer: _Answer, reference: _Answer | None) -> None:
        log.warning(
            "timesvc_answer_rejected",
            url=url,
            now_us=answer.value,
            reference_us=None if reference is None else reference.value,
            detail="implausible: far from what this client knows of global time, and no other replica agrees",
        )

    def answered(self, index: int, value: int, errors: list[str]) -> int:
        if index != self.preferred:
            log.info("timesvc_failover", to=self.urls[index], errors=errors)
            self.preferred = index
        return self.floor.apply(value)

    @staticmethod
    def failed(errors: list[str]) -> TimeServiceUnavailable:
        return TimeServiceUnavailable("no timesvc replica answered plausibly: " + "; ".join(errors))


class TimeServiceClock:
    """Global time from one or more timesvc replicas, with fail-over and extrapolation.

    Requests go to the replica that answered last; on a timeout, a connection
    error or a 5xx it tries the next one, and raises
    :class:`~lockclient.errors.TimeServiceUnavailable` only when every replica failed.
    Between answers, values are extrapolated for up to ``max_age`` seconds (module
    docstring); ``max_age=0`` asks timesvc every time.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout: float = 2.0,
        transport: httpx.BaseTransport | None = None,
        max_age: float = 1.0,
        refresh_after: float = 0.2,
        max_skew: float = 1.0,
        runtime: Runtime = THREADS,
        monotonic_ns: Callable[[], int] | None = None,
    ):
        self._replicas = _Replicas(urls, timeout, max_skew, monotonic_ns or runtime.monotonic_ns)
        self.urls = self._replicas.urls
        self._client = httpclient.client(
            self.urls, timeout=timeout, transport=transport, headers={"Cache-Control": "no-store"}
        )
        self._extrapolator = Extrapolator(
            self.fetch_us, max_age=max_age, refresh_after=refresh_after, runtime=runtime, monotonic_ns=monotonic_ns
        )
        self._ticket_floor = _Floor()

    def fetch_us(self) -> int:
        """One ``GET /now`` (with fail-over, and a second replica's word when the answer is
        implausible: see :class:`_Replicas`), no extrapolation."""
        replicas = self._replicas
        errors: list[str] = []
        others: list[tuple[str, _Answer]] = []
        # A single URL may be a load-balanced Service: ask it again to compare.
        attempts = replicas.order() if len(replicas.urls) > 1 else replicas.order() * 3
        for index, url in attempts:
            sent = replicas.monotonic_ns()
            try:
                value = _parse_now(self._client.get(f"{url}/now"), url)
            except self._replicas.errors as exc:
                errors.append(f"{url}: {exc or type(exc).__name__}")
                continue
            answer = _Answer(value, sent, replicas.monotonic_ns())
            if replicas.judge(url, answer, others):
                return replicas.answered(index, value, errors)
            others.append((url, answer))
            errors.append(f"{url}: implausible now_us {value}")
        raise replicas.failed(errors)

    def now_us(self) -> int:
        return self._replicas.floor.apply(self._extrapolator.now_us())

    def ticket_us(self) -> int:
        return self._ticket_floor.apply(self._extrapolator.ticket_us())

    def settle(self, value_us: int) -> float:
        return self._extrapolator.settle(value_us)

    @property
    def fetches(self) -> int:
        """How many times timesvc was asked."""
        return self._extrapolator.fetches

    @property
    def rejected(self) -> int:
        """How many answers were rejected as implausible."""
        return self._replicas.rejected

    def close(self) -> None:
        self._client.close()


class AsyncTimeServiceClock:
    """The asyncio twin of :class:`TimeServiceClock` (``await clock.anow_us()``)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_skew: float = 1.0,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ):
        self._replicas = _Replicas(urls, timeout, max_skew, monotonic_ns)
        self.urls = self._replicas.urls
        self._client = httpclient.async_client(
            self.urls, timeout=timeout, transport=transport, headers={"Cache-Control": "no-store"}
        )

    async def anow_us(self) -> int:
        replicas = self._replicas
        errors: list[str] = []
        others: list[tuple[str, _Answer]] = []
        attempts = replicas.order() if len(replicas.urls) > 1 else replicas.order() * 3
        for index, url in attempts:
            sent = replicas.monotonic_ns()
            try:
                value = _parse_now(await self._client.get(f"{url}/now"), url)
            except self._replicas.errors as exc:
                errors.append(f"{url}: {exc or type(exc).__name__}")
                continue
            answer = _Answer(value, sent, replicas.monotonic_ns())
            if replicas.judge(url, answer, others):
                return replicas.answered(index, value, errors)
            others.append((url, answer))
            errors.append(f"{url}: implausible now_us {value}")
        raise replicas.failed(errors)

    @property
    def rejected(self) -> int:
        """How many answers were rejected as implausible."""
        return self._replicas.rejected

    async def aclose(self) -> None:
        await self._client.aclose()


_store_clock_ids = itertools.count()


class StoreClock:
    """Global time without timesvc: this process runs TryUpdateGlobalTime itself, on demand.

    For embedded use (one machine, the SQLite store). A store round trip per sample (a
    read, and a write when time moved on), extrapolated in between like
    :class:`TimeServiceClock`. Nobody ticks between samples, so the runaway guard (which
    needs replicas publishing continuously to tell a fast clock from stale global time)
    is off; processes on one machine share one wall clock anyway. On a store shared by
    several machines (Cassandra) an unguarded clock would let one skewed laptop drag
    global time forward for everyone, so it is refused there unless ``allow_shared``
    (``CHRONOLOCK_ALLOW_STORE_CLOCK=true``) says the operator knows: use timesvc.
    """

    def __init__(
        self,
        store: CellStore,
        *,
        max_skew: float = 1.0,
        allow_shared: bool = False,
        max_age: float = 1.0,
        refresh_after: float = 0.2,
        runtime: Runtime = THREADS,
    ) -> None:
        if store.spans_machines and not allow_shared:
            raise ConfigurationError(
                f"global time straight from {store.url} would be unguarded against a skewed clock on any machine "
                "sharing that store: set CHRONOLOCK_TIMESVC_URLS (or CHRONOLOCK_ALLOW_STORE_CLOCK=true to accept it)"
            )
        replica = f"client-{runtime.pid()}-{next(_store_clock_ids)}-{runtime.token_hex(3)}"
        self._updater = GlobalTimeUpdater(
            store,
            replica_id=replica,
            max_skew=max_skew,
            guard=False,
            wall_us=runtime.wall_us,
            monotonic_ns=runtime.monotonic_ns,
            runtime=runtime,
        )
        self._floor = _Floor()
        self._ticket_floor = _Floor()
        self._extrapolator = Extrapolator(self.fetch_us, max_age=max_age, refresh_after=refresh_after, runtime=runtime)

    def fetch_us(self) -> int:
        try:
            return self._updater.update().now_us
        except StoreError:
            raise
        except ChronolockError as exc:  # pragma: no cover - defensive: keep the error family
            raise StoreError(str(exc)) from exc

    def now_us(self) -> int:
        return self._floor.apply(self._extrapolator.now_us())

    def ticket_us(self) -> int:
        return self._ticket_floor.apply(self._extrapolator.ticket_us())

    def settle(self, value_us: int) -> float:
        return self._extrapolator.settle(value_us)

    def close(self) -> None:
        """The store belongs to the caller; nothing to release."""
