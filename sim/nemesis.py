"""The fault schedule: drawn from the seed before the run, applied at its virtual instants.

The schedule is data (a list of :class:`FaultEvent`), so a failing run can be shrunk — replayed
with fewer and shorter faults — and printed as a replay. Families (``Config.faults``):

* ``pause`` — SIGSTOP a client, leasewatch or timesvc process for up to 12 s;
* ``crash`` — SIGKILL one, restarted as a new incarnation up to 10 s later;
* ``cut`` — a process loses the store (requests and answers) for up to 5 s;
* ``lossy`` — for a while, answers are lost after their request applied, compare-and-sets answer
  "outcome unknown" (applied or not), requests are refused, some legs are slow;
* ``paxos`` — for up to 15 s every Paxos round (compare-and-sets, SERIAL reads) times out, half of
  them after applying: a replica paused (GC, a frozen VM) still "up" in gossip;
* ``coordinator`` — for up to 8 s one process's Paxos rounds (compare-and-sets, SERIAL reads) time
  out, half after applying, while every other process's go through (its coordinator lost its
  quorum, or its link drops answers): the unknown outcome nobody else shares. Drawn only by the
  profiles that name it (``renewals``), not by ``all``;
* ``clock`` — one timesvc replica's wall clock steps (±0.1–600 s), runs fast (1.1×, 1.6×, 2×,
  10×) or slow (0.5×), or stops — one replica at a time, so a majority of clocks stays correct
  (the promise's assumption) — or it restarts misconfigured (``TIMESVC_REPLICAS=1``) with its
  clock 600 s ahead; any other process's wall clock steps or runs off (nothing may trust those);
* ``lie`` — a timesvc replica's ``/now`` answers an absurd value for a while (a client must not
  let it poison its floor).

At the end of the workload everything heals: the quiet phase judges liveness.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from sim.world import NS

if TYPE_CHECKING:
    from sim.scenario import Simulation

__all__ = ["FAMILIES", "FaultEvent", "Nemesis"]

FAMILIES = ("pause", "crash", "cut", "lossy", "paxos", "clock", "lie")
"""What ``faults="all"`` draws from."""
EXTRA_FAMILIES = ("coordinator",)
"""Families a profile must name to get."""


@dataclass(frozen=True)
class FaultEvent:
    at: float
    """Virtual seconds."""
    family: str
    target: str
    """A role and index: ``c1``, ``lw0``, ``ts2``, or ``*`` for the network."""
    duration: float
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.at:.3f}s {self.family} {self.target} for {self.duration:.3f}s{extra}"


class Nemesis:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.events: list[FaultEvent] | None = None
        """Set to replay a given schedule instead of drawing one."""
        self._leasewatch_disturbed: list[tuple[int, int]] = []

    # -- drawing ----------------------------------------------------------------------------------

    def draw(self) -> list[FaultEvent]:
        sim = self.sim
        c = sim.config
        families = [f for f in (c.faults.split(",") if c.faults not in ("all", "") else FAMILIES) if f != "none"]
        if c.faults == "none" or not families:
            return []
        rng = random.Random(f"{sim.seed}/nemesis")
        roles = [f"c{i}" for i in range(c.clients)]
        roles += [f"lw{i}" for i in range(c.leasewatch)]
        roles += [f"ts{i}" for i in range(c.timesvc)]
        events: list[FaultEvent] = []
        t = rng.expovariate(c.fault_rate)
        clock_busy_until = 0.0
        while t < c.duration:
            family = rng.choice(families)
            if family == "pause":
                events.append(FaultEvent(t, "pause", rng.choice(roles), rng.uniform(0.05, 12.0)))
            elif family == "crash":
                events.append(FaultEvent(t, "crash", rng.choice(roles), rng.uniform(0.2, 10.0)))
            elif family == "cut":
                events.append(FaultEvent(t, "cut", rng.choice(roles), rng.uniform(0.05, 5.0)))
            elif family == "lossy":
                rates = {
                    "lose_reply": round(rng.choice((0.0, 0.02, 0.1, 0.3)), 3),
                    "cas_unknown": round(rng.choice((0.0, 0.05, 0.2, 0.5)), 3),
                    "refuse": round(rng.choice((0.0, 0.02, 0.1)), 3),
                    "slow": round(rng.choice((0.0, 0.01, 0.05)), 3),
                }
                events.append(FaultEvent(t, "lossy", "*", rng.uniform(0.5, 10.0), dict(rates)))
            elif family == "paxos":
                events.append(FaultEvent(t, "paxos", "*", rng.uniform(0.5, 15.0)))
            elif family == "coordinator":
                clients = [r for r in roles if r.startswith("c")]
                events.append(FaultEvent(t, "coordinator", rng.choice(clients), rng.uniform(0.5, 8.0)))
            elif family == "clock":
                # A timesvc replica's clock only while the others' are correct: the promise holds
                # while a majority of the configured replicas' clocks are correct (one of three).
                if c.timesvc >= 3 and rng.random() < 0.7 and t >= clock_busy_until:
                    target = f"ts{rng.randrange(c.timesvc)}"
                    duration = rng.uniform(2.0, 30.0)
                    clock_busy_until = t + duration + 1.0
                else:
                    target = rng.choice([r for r in roles if not r.startswith("ts")])
                    duration = rng.uniform(2.0, 30.0)
                    if target.startswith("ts"):
                        if t < clock_busy_until:
                            t += rng.expovariate(c.fault_rate)
                            continue
                        clock_busy_until = t + duration + 1.0
                kinds = [k for k in ("step", "step", "rate", "rate", "stop", "misconfigured") if k in c.clock_faults]
                kind = rng.choice(kinds)
                params: dict[str, Any] = {"kind": kind}
                if kind == "step":
                    params["delta"] = round(rng.choice((-1, 1)) * rng.choice((0.1, 0.6, 2.0, 60.0, 600.0)), 3)
                elif kind == "rate":
                    params["rate"] = rng.choice((1.1, 1.6, 2.0, 10.0, 0.5))
                if kind == "misconfigured" and not target.startswith("ts"):
                    params = {"kind": "step", "delta": 600.0}
                events.append(FaultEvent(t, "clock", target, duration, params))
            elif family == "lie" and c.timesvc >= 3 and t >= clock_busy_until:
                duration = rng.uniform(0.5, 10.0)
                clock_busy_until = t + duration + 1.0
                events.append(FaultEvent(t, "lie", f"ts{rng.randrange(c.timesvc)}", duration))
            t += rng.expovariate(c.fault_rate)
        return events

    # -- applying ---------------------------------------------------------------------------------

    def schedule(self) -> None:
        sim = self.sim
        if self.events is None:
            self.events = self.draw()
        for event in self.events:
            if event.at * NS >= sim.end_of_work:
                continue
            sim.world.at(int(event.at * NS), partial(self._start, event))
        sim.world.at(sim.end_of_work, self._heal_all)

    def _role(self, target: str) -> Any:
        sim = self.sim
        kind, index = target.rstrip("0123456789"), int(target[len(target.rstrip("0123456789")) :] or 0)
        groups: dict[str, list[Any]] = {"c": list(sim.clients), "lw": list(sim.leasewatch), "ts": list(sim.timesvc)}
        group = groups[kind]
        return group[index] if index < len(group) else None

    def _start(self, event: FaultEvent) -> None:
        sim = self.sim
        world = sim.world
        sim.stats.faults += 1
        sim.record("fault", what=event.describe().replace(" ", "_"))
        end = min(int((event.at + event.duration) * NS), sim.end_of_work)
        role = self._role(event.target) if event.target != "*" else None
        if event.family == "pause" and role is not None:
            process = role.process
            process.pause()
            self._mark(event.target, world.now, end)
            world.at(end, process.resume)
        elif event.family == "crash" and role is not None:
            process = role.process
            if process.dead:
                return
            self._mark(event.target, world.now, end)
            if event.target.startswith("c"):
                sim.checkers.crashed(
                    process,
                    leasewatch_healthy_until=self._healthy_until(world.now),
                    leasewatch_recovered_at=self.recovered_at(world.now),
                )
            process.crash()
            world.at(end, lambda: self._restart(role))
        elif event.family == "cut" and role is not None:
            self._mark(event.target, world.now, end)
            sim.network.cut[role.process.name] = end
        elif event.family == "lossy":
            net = sim.network
            self._mark("*", world.now, end)
            net.lose_reply, net.cas_unknown = event.params["lose_reply"], event.params["cas_unknown"]
            net.refuse, net.slow = event.params["refuse"], event.params["slow"]
            world.at(end, self._heal_network)
        elif event.family == "paxos":
            self._mark("*", world.now, end)
            sim.network.paxos_until = max(sim.network.paxos_until, end)
        elif event.family == "coordinator" and role is not None:
            name = role.process.name
            sim.network.paxos_for[name] = max(sim.network.paxos_for.get(name, -1), end)
        elif event.family == "clock" and role is not None:
            self._clock(event, role, end)
        elif event.family == "lie" and role is not None:
            role.lying = True
            world.at(end, lambda: setattr(role, "lying", False))

    def _clock(self, event: FaultEvent, role: Any, end: int) -> None:
        world = self.sim.world
        kind = event.params["kind"]
        if kind == "misconfigured" and event.target.startswith("ts"):
            # Restarted with TIMESVC_REPLICAS=1 and its clock 10 minutes ahead (issue 22, finding 2).
            role.process.crash()
            role.configured = 1
            role.start(wall_offset_ns=600 * NS)

            def back() -> None:
                role.process.crash()
                role.configured = self.sim.config.timesvc
                role.start()

            world.at(end, back)
            return
        wall = role.process.wall
        if kind == "step":
            wall.step(int(event.params["delta"] * NS))
        elif kind == "rate":
            wall.set_rate(float(event.params["rate"]))
        elif kind == "stop":
            wall.set_rate(0.0)
        process = role.process

        def restore() -> None:
            if process.dead:
                return
            # NTP notices and steps the clock back to real time.
            wall.set_rate(1.0)
            wall.step(-wall.offset_ns())

        world.at(end, restore)

    def _restart(self, role: Any) -> None:
        if role.process.dead and self.sim.world.now <= self.sim.end:
            role.start()

    def _heal_network(self) -> None:
        net = self.sim.network
        net.lose_reply = net.cas_unknown = net.refuse = net.slow = 0.0

    def _heal_all(self) -> None:
        sim = self.sim
        self._heal_network()
        sim.network.paxos_until = -1
        sim.network.paxos_for.clear()
        sim.network.cut.clear()
        roles: list[Any] = [*sim.clients, *sim.leasewatch, *sim.timesvc]
        for role in roles:
            if role.process.dead:
                role.start()
            else:
                role.process.resume()
            if getattr(role, "lying", False):
                role.lying = False

    # -- what the liveness checker needs -------------------------------------------------------------

    def _mark(self, target: str, start: int, end: int) -> None:
        if target.startswith("lw"):
            # A leasewatch replica that crashed, paused or lost the store may have lost its partitions
            # (a restarted one is a new member): a dead holder in them is revoked within the take-over
            # (partition lease + grace + a refresh, leasewatch/partitions.py) plus the usual bound, so
            # the usual bound is judged only from then on.
            c = self.sim.config
            takeover = (c.partition_lease + c.grace + 2 * c.scan_interval) * (1 + 2 * c.mono_ppm / 1e6)
            self._leasewatch_disturbed.append((start, end + int(takeover * NS)))
        elif target == "*":
            self._leasewatch_disturbed.append((start, end))

    def recovered_at(self, now: int) -> int:
        """When leasewatch last came out of a disturbance before ``now``: a replica that takes
        partitions over has no observations of their locks and watches each lease for a full lease +
        grace before it revokes (leasewatch/partitions.py), so the usual bound runs from then for a
        lease last renewed before it.

        Or, if later, when the last of leasewatch's requests that a network fault held up is settled
        — answered, or given up by the store driver's request timeout (on leasewatch's own clock;
        ``Network.stalled_until``), possibly after the fault ended: the scan or due check waiting for
        it sees nothing meanwhile (the "scan duration" of docs/guarantees.md), so a renewal made
        meanwhile is stamped when it ends. Found by the primitives search, seed 20261476: a scan's
        read, its answer lost 0.23 s before a lossy window ended, timed out 1.78 s after it, and a
        dead leader's last renewal, made meanwhile, was first seen 1.6 s after it was made."""
        ended = max([end for start, end in self._leasewatch_disturbed if end <= now], default=0)
        stalled = self.sim.network.stalled_until
        return max([ended, *(stalled.get(lw.process.name, 0) for lw in self.sim.leasewatch)])

    def client_undisturbed_since(self, client: str, start: int, until: int) -> int | None:
        """When the last fault that could hold up client ``client``'s own store requests (``c1``:
        its pauses, cut-offs and coordinator faults, and the network's) that began before ``until``
        ended, or ``start`` if later; None if that client crashed in between (its new incarnation
        knows nothing of what the old one was settling). Clocks and timesvc do not count: a
        release needs neither global time nor the wall clock (the keeper's retries run by the
        monotonic clock)."""
        sim = self.sim
        ended = start
        for e in self.events or []:
            at = int(e.at * NS)
            if at >= until or at >= sim.end_of_work:
                continue
            end = min(int((e.at + e.duration) * NS), sim.end_of_work)
            if e.target == client and e.family == "crash" and end > start:
                return None
            if e.target == "*" or (e.target == client and e.family != "clock"):
                ended = max(ended, end)
        return ended

    def _healthy_until(self, now: int) -> int | None:
        """Until when leasewatch (and the network) stays undisturbed from ``now``, as far as the
        schedule says; None if it is disturbed now."""
        horizon = self.sim.end
        for start, end in self._leasewatch_disturbed:
            if start <= now <= end:
                return None
        upcoming = [
            int(e.at * NS)
            for e in self.events or []
            if int(e.at * NS) > now and (e.target == "*" or e.target.startswith("lw"))
        ]
        return min([horizon, *upcoming])
