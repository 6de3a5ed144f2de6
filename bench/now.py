"""``GET /now`` throughput and latency, against the bare endpoint of the same server (DESIGN.md §9).

One timesvc replica (``timesvc serve``, uvicorn, one worker) on the embedded SQLite
store. In the same run and against the same process, closed-loop clients alternate
between the bare endpoint ``GET /healthz`` (FastAPI + uvicorn, no store) and
``GET /now`` (the coalesced TryUpdateGlobalTime round trip): bare, now, bare, now, …
The median of each is reported, and their ratio — the cost of global time over the
HTTP stack itself. Then an open-loop run at half of /now's median max rate gives the
latency percentiles a client sees at a sustainable load.

Store round trips per /now request come from ``/status`` (``store_round_trips``,
which also counts the scheduled ticks, 2/s by default) over the client's request count:
well under 1 means concurrent requests were coalesced.

For context, the same closed-loop /now and bare runs against 3 replicas on one SQLite
file (connections spread round-robin over the replicas).

The load generator shares the machine's cores with the server(s): one client process
with one event loop, so on a 2-core box the server gets the other core.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    TimesvcProcess,
    cpu_seconds,
    fleet,
    machine_info,
    markdown_table,
    percentile,
    rss_kib,
    system_busy_seconds,
    write_results,
)
from bench.loadgen import ClosedLoopResult, client_loop_name, closed_loop, make_session, open_loop, run_async

__all__ = ["NowConfig", "run"]

BARE = "/healthz"
NOW = "/now"
LOW_RATE = 100.0
"""A light open-loop load (req/s) reported beside the half-max-rate one."""


@dataclass(frozen=True)
class NowConfig:
    connections: int = 64
    point_s: float = 10.0
    rounds: int = 3
    open_loop_s: float = 15.0
    replicas3_point_s: float = 10.0
    warmup_s: float = 2.0

    @classmethod
    def quick(cls) -> NowConfig:
        return cls(point_s=3.0, rounds=2, open_loop_s=5.0, replicas3_point_s=3.0, warmup_s=1.0)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def _status_sum(procs: list[TimesvcProcess], key: str) -> int:
    return sum(int(p.status()[key]) for p in procs)


async def _one_replica(cfg: NowConfig, proc: TimesvcProcess) -> dict[str, Any]:
    pid = proc.pid
    out: dict[str, Any] = {"replica_pid": pid, "rss_kib_idle": rss_kib(pid)}
    async with make_session(max(cfg.connections, 256)) as session:
        # Warm-up (connections, code paths, SQLite page cache); not measured.
        for path in (BARE, NOW):
            await closed_loop(session, [proc.url], path, cfg.connections, cfg.warmup_s / 2)
        out["rss_kib_before_load"] = rss_kib(pid)

        points: list[dict[str, Any]] = []
        for round_no in range(cfg.rounds):
            for path in (BARE, NOW):
                trips_before = proc.status()["store_round_trips"]
                cpu_before = cpu_seconds(pid) or 0.0
                busy_before = system_busy_seconds()
                result: ClosedLoopResult = await closed_loop(session, [proc.url], path, cfg.connections, cfg.point_s)
                server_cpu = (cpu_seconds(pid) or 0.0) - cpu_before
                others_cpu = system_busy_seconds() - busy_before - server_cpu - result.client_cpu_s
                trips = proc.status()["store_round_trips"] - trips_before
                point = result.summary()
                point.update(
                    round=round_no,
                    server_cpu_s=round(server_cpu, 3),
                    server_cpu_util=round(server_cpu / result.duration_s, 3),
                    client_cpu_util=round(result.client_cpu_s / result.duration_s, 3),
                    others_cpu_util=round(max(0.0, others_cpu) / result.duration_s, 3),
                    store_round_trips=trips,
                    round_trips_per_request=round(trips / result.ok, 4) if result.ok else None,
                )
                points.append(point)
                print(
                    f"  [now] round {round_no + 1}/{cfg.rounds} {path:<8} {point['rps']:>8.0f} req/s  "
                    f"p99 {point['p99_ms']:.2f} ms  CPU server {point['server_cpu_util']:.0%} "
                    f"client {point['client_cpu_util']:.0%} others {point['others_cpu_util']:.0%}  "
                    f"round trips/req {point['round_trips_per_request']}",
                    flush=True,
                )
        out["closed_loop_points"] = points
        bare_rps = [p["rps"] for p in points if p["path"] == BARE]
        now_rps = [p["rps"] for p in points if p["path"] == NOW]
        out["bare_rps_median"] = statistics.median(bare_rps)
        out["now_rps_median"] = statistics.median(now_rps)
        out["ratio_now_over_bare"] = round(out["now_rps_median"] / out["bare_rps_median"], 3)
        out["ratio_per_round"] = [round(n / b, 3) for b, n in zip(bare_rps, now_rps, strict=True)]

        out["open_loop"] = await _open_loop_point(session, proc, out["now_rps_median"] / 2, cfg.open_loop_s)
        # Context: a light fixed load, where the latency is the server's own, not queueing.
        out["open_loop_low"] = await _open_loop_point(session, proc, LOW_RATE, min(cfg.open_loop_s, 10.0))
    out["rss_kib_after_load"] = rss_kib(pid)
    out["rss_kib_peak"] = rss_kib(pid, "VmHWM")
    return out


async def _open_loop_point(
    session: aiohttp.ClientSession, proc: TimesvcProcess, rate: float, duration: float
) -> dict[str, Any]:
    pid = proc.pid
    trips_before = proc.status()["store_round_trips"]
    cpu_before = cpu_seconds(pid) or 0.0
    busy_before = system_busy_seconds()
    ol = await open_loop(session, proc.url, NOW, rate, duration)
    server_cpu = (cpu_seconds(pid) or 0.0) - cpu_before
    others_cpu = system_busy_seconds() - busy_before - server_cpu - ol.client_cpu_s
    trips = proc.status()["store_round_trips"] - trips_before
    o = {
        "path": NOW,
        "rate": round(rate, 1),
        "duration_s": round(ol.duration_s, 3),
        "sent": ol.sent,
        "ok": ol.ok,
        "errors": ol.errors,
        "p50_ms": _ms(percentile(ol.latencies_s, 50)),
        "p99_ms": _ms(percentile(ol.latencies_s, 99)),
        "p999_ms": _ms(percentile(ol.latencies_s, 99.9)),
        "max_ms": _ms(max(ol.latencies_s, default=float("nan"))),
        "service_p50_ms": _ms(percentile(ol.service_s, 50)),
        "service_p99_ms": _ms(percentile(ol.service_s, 99)),
        "service_p999_ms": _ms(percentile(ol.service_s, 99.9)),
        "max_send_lag_ms": _ms(ol.max_send_lag_s),
        "client_cpu_s": round(ol.client_cpu_s, 3),
        "server_cpu_util": round(server_cpu / ol.duration_s, 3),
        "client_cpu_util": round(ol.client_cpu_s / ol.duration_s, 3),
        "others_cpu_util": round(max(0.0, others_cpu) / ol.duration_s, 3),
        "store_round_trips": trips,
        "round_trips_per_request": round(trips / ol.ok, 4) if ol.ok else None,
    }
    print(
        f"  [now] open loop {o['rate']:.0f} req/s: p50 {o['p50_ms']} ms, p99 {o['p99_ms']} ms, "
        f"p99.9 {o['p999_ms']} ms, errors {o['errors']}, CPU server {o['server_cpu_util']:.0%} "
        f"client {o['client_cpu_util']:.0%} others {o['others_cpu_util']:.0%}",
        flush=True,
    )
    return o


async def _three_replicas(cfg: NowConfig, procs: list[TimesvcProcess]) -> dict[str, Any]:
    urls = [p.url for p in procs]
    out: dict[str, Any] = {"replicas": len(procs)}
    async with make_session(cfg.connections) as session:
        for path in (BARE, NOW):
            await closed_loop(session, urls, path, cfg.connections, 0.5)
        for path in (BARE, NOW):
            trips_before = _status_sum(procs, "store_round_trips")
            result = await closed_loop(session, urls, path, cfg.connections, cfg.replicas3_point_s)
            trips = _status_sum(procs, "store_round_trips") - trips_before
            point = result.summary()
            point.update(
                store_round_trips=trips, round_trips_per_request=round(trips / result.ok, 4) if result.ok else None
            )
            out[path.strip("/")] = point
            print(f"  [now] 3 replicas {path:<8} {point['rps']:>8.0f} req/s  p99 {point['p99_ms']:.2f} ms", flush=True)
    out["ratio_now_over_bare"] = round(out["now"]["rps"] / out["healthz"]["rps"], 3) if out["healthz"]["rps"] else None
    out["rss_kib_after_load"] = [rss_kib(p.pid) for p in procs]
    return out


def _markdown(data: dict[str, Any]) -> str:
    one = data["one_replica"]
    cfg = data["config"]
    pts = one["closed_loop_points"]

    def med(path: str, key: str) -> float:
        return float(statistics.median(p[key] for p in pts if p["path"] == path))

    def _cpu(path: str) -> str:
        return " / ".join(f"{med(path, k):.0%}" for k in ("server_cpu_util", "client_cpu_util", "others_cpu_util"))

    ratio = one["ratio_now_over_bare"]
    rows = [
        [
            f"bare `GET {BARE}`",
            one["bare_rps_median"],
            " / ".join(f"{p['rps']:.0f}" for p in pts if p["path"] == BARE),
            med(BARE, "p50_ms"),
            med(BARE, "p99_ms"),
            _cpu(BARE),
            "–",
        ],
        [
            f"`GET {NOW}`",
            one["now_rps_median"],
            " / ".join(f"{p['rps']:.0f}" for p in pts if p["path"] == NOW),
            med(NOW, "p50_ms"),
            med(NOW, "p99_ms"),
            _cpu(NOW),
            f"{med(NOW, 'round_trips_per_request'):.3f}",
        ],
    ]
    ol = one["open_loop"]
    three = data["three_replicas"]
    parts = [
        "### timesvc `GET /now` vs the bare endpoint (one replica, same process, same run)",
        "",
        f"Closed loop: {cfg['connections']} aiohttp connections, {cfg['point_s']:g} s per point, "
        f"{cfg['rounds']} alternating rounds (bare, now, …); median reported. "
        f"Client: one process, one {data['client_loop']} event loop"
        + (
            f", pinned to CPU {data['pinning']['client_cpu']} while the server is pinned to CPU "
            f"{data['pinning']['server_cpu']} (each on its own core of the {data['machine']['cpus']}). "
            if data.get("pinning")
            else f", **on the same {data['machine']['cpus']} cores as the server**, so the numbers are a lower "
            "bound for the server. "
        )
        + "CPU columns: share of one core used by the server process, the load generator, and everything else on "
        "the machine during the point.",
        "",
        markdown_table(
            [
                "endpoint",
                "max req/s (median)",
                "each round",
                "p50 ms",
                "p99 ms",
                "CPU server / client / others",
                "store trips / req",
            ],
            rows,
        ),
        "",
        f"**Ratio /now ÷ bare: {ratio:.2f}** (target ≥ 0.7: {'met' if ratio >= 0.7 else 'MISSED'}; "
        f"per round {', '.join(f'{r:.2f}' for r in one['ratio_per_round'])}).",
        "",
        f"Open loop (fixed rate, latency from the scheduled send time) at half the /now max rate for "
        f"{cfg['open_loop_s']:g} s, and at a light {LOW_RATE:g} req/s for context:",
        "",
        markdown_table(
            [
                "rate req/s",
                "sent",
                "errors",
                "p50 ms",
                "p99 ms",
                "p99.9 ms",
                "max ms",
                "service p99 ms",
                "CPU server / client / others",
                "trips / req",
            ],
            [
                [
                    f"{o['rate']:.0f}{label}",
                    o["sent"],
                    o["errors"],
                    o["p50_ms"],
                    o["p99_ms"],
                    o["p999_ms"],
                    o["max_ms"],
                    o["service_p99_ms"],
                    f"{o['server_cpu_util']:.0%} / {o['client_cpu_util']:.0%} / {o['others_cpu_util']:.0%}",
                    f"{o['round_trips_per_request']:.3f}",
                ]
                for o, label in ((ol, " (½ max)"), (one["open_loop_low"], " (light)"))
            ],
        ),
        "",
        f"**p99 at half max rate: {ol['p99_ms']:.2f} ms** (target ≤ 5 ms: "
        f"{'met' if ol['p99_ms'] <= 5 else 'MISSED'}). Service p99 is measured from the actual send; "
        f"the largest send lag of the generator was {ol['max_send_lag_ms']:.1f} ms. CPU: share of one core.",
        "",
        f"Replica RSS: {one['rss_kib_idle'] / 1024:.1f} MiB idle, {one['rss_kib_before_load'] / 1024:.1f} MiB "
        f"after warm-up, {one['rss_kib_after_load'] / 1024:.1f} MiB after all load "
        f"(peak {one['rss_kib_peak'] / 1024:.1f} MiB).",
        "",
        "Store trips / req = `store_round_trips` from `/status` (including the 2 scheduled ticks/s) ÷ requests "
        "answered: below 1 means concurrent requests shared one TryUpdateGlobalTime round trip (coalescing).",
        "",
        f"For context — 3 replicas on one SQLite file, {cfg['connections']} connections spread over them, "
        f"{cfg['replicas3_point_s']:g} s each (5 processes on {data['machine']['cpus']} cores):",
        "",
        markdown_table(
            ["endpoint", "req/s", "p50 ms", "p99 ms", "store trips / req"],
            [
                [
                    f"bare `GET {BARE}`",
                    three["healthz"]["rps"],
                    three["healthz"]["p50_ms"],
                    three["healthz"]["p99_ms"],
                    "–",
                ],
                [
                    f"`GET {NOW}`",
                    three["now"]["rps"],
                    three["now"]["p50_ms"],
                    three["now"]["p99_ms"],
                    f"{three['now']['round_trips_per_request']:.3f}",
                ],
            ],
        ),
        "",
        f"Machine: {data['machine']['cpus']} cores, Python {data['machine']['python']}, load average "
        f"{data['machine']['loadavg_1m_at_start']} at start; noisy — compare ratios from one run, not absolute "
        "numbers across runs.",
    ]
    return "\n".join(parts)


def run(*, quick: bool = False) -> dict[str, Any]:
    cfg = NowConfig.quick() if quick else NowConfig()
    data: dict[str, Any] = {
        "benchmark": "now",
        "quick": quick,
        "config": cfg.__dict__,
        "machine": machine_info(),
        "client_loop": client_loop_name(),
    }
    print(f"[now] {'quick' if quick else 'full'} run: {cfg}", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="chronolock-bench-now-") as tmp:
        workdir = Path(tmp)
        with fleet(workdir) as f:
            proc = f.timesvc(f"sqlite:///{workdir / 'one.db'}", "bench-now-1")
            proc.wait_ready()
            # Keep the system under test and the load generator off each other's core
            # (standard load-test hygiene): the server on one CPU, this process on another.
            cpus = sorted(os.sched_getaffinity(0))
            pinned = len(cpus) >= 2
            if pinned:
                os.sched_setaffinity(proc.pid, {cpus[0]})
                os.sched_setaffinity(0, {cpus[1]})
            data["pinning"] = {"server_cpu": cpus[0], "client_cpu": cpus[1]} if pinned else None
            try:
                data["one_replica"] = run_async(lambda: _one_replica(cfg, proc))
            finally:
                if pinned:
                    os.sched_setaffinity(0, set(cpus))
        with fleet(workdir) as f:
            store = f"sqlite:///{workdir / 'three.db'}"
            procs = [f.timesvc(store, f"bench-now-3-{i}", replicas=3) for i in range(3)]
            for p in procs:
                p.wait_ready()
            data["three_replicas"] = run_async(lambda: _three_replicas(cfg, procs))
    data["elapsed_s"] = round(time.monotonic() - started, 1)
    write_results("now", data, _markdown(data))
    return data
