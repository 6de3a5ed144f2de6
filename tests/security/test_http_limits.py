"""Issue 16, finding 2: bounded HTTP — the review's two attacks against real service processes.

* 50 connections each sending an unfinished 5 MiB header (leasewatch grew from 90 to
  335 MB, above its 256 Mi limit): memory must stay flat, each connection answered 431;
* 1,000 connections sending a header one byte at a time (they stayed open 40 s): every one
  is closed within the header timeout (or evicted earlier to make room);

and in both the service keeps answering ``/healthz`` quickly. Plus: oversized bodies are
refused with 413. Bounded in time: every attack gives up after a fixed deadline.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import time
from dataclasses import dataclass, field

import pytest

from tests.support.procs import Fleet, ServiceProcess

pytestmark = pytest.mark.slow

MiB = 1024 * 1024


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@dataclass
class Probe:
    """Latencies of GET /healthz on fresh connections while an attack runs."""

    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    async def run(self, port: int, stop: asyncio.Event, every: float = 0.05) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                head = await asyncio.wait_for(reader.read(64), 5)
                writer.close()
                if not head.startswith(b"HTTP/1.1 200"):
                    self.failures.append(head[:40].decode(errors="replace"))
                else:
                    self.latencies.append(time.monotonic() - started)
            except (OSError, TimeoutError) as exc:
                self.failures.append(repr(exc))
            await asyncio.sleep(every)

    def summary(self) -> str:
        if not self.latencies:
            return "no successful probe"
        ordered = sorted(self.latencies)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return (
            f"{len(ordered)} probes, p50 {statistics.median(ordered) * 1000:.1f} ms, "
            f"p99 {p99 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms, failures {len(self.failures)}"
        )


def _start(processes: Fleet, service: str, sqlite_url: str, **limits: str) -> ServiceProcess:
    prefix = service.upper()
    env = {f"{prefix}_{key.upper()}": value for key, value in limits.items()}
    if service == "timesvc":
        proc = processes.timesvc(sqlite_url, name=service, env=env)
    else:
        proc = processes.leasewatch(sqlite_url, name=service, env=env)
    proc.wait_ready()
    return proc


async def _big_header(port: int, size: int, outcome: list[str]) -> None:
    """Send a request head whose one header never ends; stop when the server closes or at 20 s."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        outcome.append(f"connect:{exc!r}")
        return
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: ")
    chunk = b"a" * 65536
    sent = 0
    try:
        async with asyncio.timeout(20):
            while sent < size:
                writer.write(chunk)
                await writer.drain()
                sent += len(chunk)
            answer = await reader.read(64)  # the server never got a full head: wait for it to act
            outcome.append(answer[:12].decode(errors="replace") or "closed")
    except (ConnectionError, OSError):
        try:
            answer = await asyncio.wait_for(reader.read(64), 1)
        except (ConnectionError, OSError, TimeoutError):
            answer = b""
        outcome.append(answer[:12].decode(errors="replace") or "reset")
    except TimeoutError:
        outcome.append("still open")
    finally:
        writer.close()


@pytest.mark.parametrize("service", ["leasewatch", "timesvc"])
def test_unfinished_5_mib_headers_on_50_connections_keep_memory_flat(
    processes: Fleet, sqlite_url: str, service: str
) -> None:
    proc = _start(processes, service, sqlite_url)
    before = rss_mib(proc.pid)
    outcomes: list[str] = []
    probe = Probe()
    peak = before

    async def attack() -> None:
        nonlocal peak
        stop = asyncio.Event()
        prober = asyncio.create_task(probe.run(proc.port, stop))

        async def attacker() -> None:
            # Again and again for 3 s (each attempt ends only when the server closes it), so that
            # the probe measures /healthz under a sustained attack.
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and "still open" not in outcomes:
                await _big_header(proc.port, 5 * MiB, outcomes)

        attackers = [asyncio.create_task(attacker()) for _ in range(50)]
        while not all(task.done() for task in attackers):
            peak = max(peak, rss_mib(proc.pid))
            await asyncio.sleep(0.05)
        peak = max(peak, rss_mib(proc.pid))
        stop.set()
        await prober

    started = time.monotonic()
    asyncio.run(attack())
    took = time.monotonic() - started
    after = rss_mib(proc.pid)
    print(
        f"\n{service}: RSS {before:.0f} MiB before, peak {peak:.0f} MiB, {after:.0f} MiB after 50 x 5 MiB "
        f"unfinished headers, {len(outcomes)} attempts in {took:.1f} s; outcomes {sorted(set(outcomes))}; "
        f"/healthz during: {probe.summary()}"
    )
    assert len(outcomes) >= 50
    assert "still open" not in outcomes, outcomes
    # 431, or a reset: the server closes with the rest of the head unread, and the kernel then
    # resets the connection (the client may lose the 431 it had not read yet).
    assert all(o.startswith("HTTP/1.1 431") or o in ("reset", "closed") for o in outcomes), outcomes
    assert peak - before < 40, f"RSS grew by {peak - before:.0f} MiB"
    assert probe.latencies and not probe.failures, probe.failures[:5]
    assert max(probe.latencies) < 2.0, probe.summary()


async def _slow_header(port: int, run_for: float, closed_after: list[float], refused: list[float]) -> None:
    started = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        refused.append(time.monotonic() - started)
        return
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        await writer.drain()
        while time.monotonic() - started < run_for:
            writer.write(b"X")  # one byte of a header that never ends
            await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(256), 1.0)
            except TimeoutError:
                continue
            if data.startswith(b"HTTP/1.1 503"):
                refused.append(time.monotonic() - started)
            else:  # b"" (closed: evicted) or a 408 (timed out)
                closed_after.append(time.monotonic() - started)
            return
    except (ConnectionError, OSError):
        closed_after.append(time.monotonic() - started)
    finally:
        writer.close()


@pytest.mark.parametrize("service", ["timesvc", "leasewatch"])
def test_1000_slow_header_connections_are_closed_and_the_service_keeps_answering(
    processes: Fleet, sqlite_url: str, service: str
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2500:
        pytest.skip(f"needs 2,500 file descriptors for 1,000 client sockets; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2500), hard))
    header_timeout = 2.0
    limits = {"header_timeout": str(header_timeout), "max_connections": "300"}
    if service == "leasewatch":
        limits["max_waiters"] = "100"
    proc = _start(processes, service, sqlite_url, **limits)
    before = rss_mib(proc.pid)
    closed_after: list[float] = []
    refused: list[float] = []
    probe = Probe()
    run_for = header_timeout + 8

    async def attack() -> None:
        stop = asyncio.Event()
        prober = asyncio.create_task(probe.run(proc.port, stop, every=0.1))
        attackers = []
        for _ in range(1000):
            attackers.append(asyncio.create_task(_slow_header(proc.port, run_for, closed_after, refused)))
            await asyncio.sleep(0.001)  # ~1 s to open them all
        await asyncio.gather(*attackers)
        stop.set()
        await prober

    try:
        asyncio.run(attack())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    after = rss_mib(proc.pid)
    still_open = 1000 - len(closed_after) - len(refused)
    print(
        f"\n{service}: 1,000 slow-header connections: {len(closed_after)} closed by the server "
        f"(max {max(closed_after, default=0):.1f} s after connecting), {len(refused)} refused, {still_open} still "
        f"open after {run_for:.0f} s; RSS {before:.0f} -> {after:.0f} MiB; /healthz during: {probe.summary()}"
    )
    assert still_open == 0
    assert max(closed_after) <= header_timeout + 3.0
    assert after - before < 40
    assert probe.latencies and len(probe.failures) <= 0.05 * (len(probe.latencies) + len(probe.failures))
    assert max(probe.latencies) < 2.0, probe.summary()


def test_oversized_bodies_are_refused(processes: Fleet, sqlite_url: str) -> None:
    proc = _start(processes, "leasewatch", sqlite_url, max_body_bytes="1024")

    async def send(head: bytes, body: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", proc.port)
        writer.write(head + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(200), 5)
        writer.close()
        return answer

    declared = asyncio.run(send(b"POST /notify/x HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n", b""))
    assert declared.startswith(b"HTTP/1.1 413")
    chunk = b"800\r\n" + b"z" * 2048 + b"\r\n"
    chunked = asyncio.run(
        send(b"POST /notify/x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n", chunk * 4 + b"0\r\n\r\n")
    )
    assert chunked.startswith(b"HTTP/1.1 413") or chunked == b""
    fine = asyncio.run(send(b"POST /notify/x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n", b"{}"))
    assert fine.startswith(b"HTTP/1.1 202"), fine
