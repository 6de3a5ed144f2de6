"""Checkers over a whole recorded history (Jepsen style): each returns the violations it found.

The history is the merged JSON Lines of every process (see :mod:`tests.faults.recorder` for the
event vocabulary). All times are ``time.monotonic_ns()`` values, comparable across processes.
The checkers never trust what a test author expected a fault to do; they judge the history
against DESIGN.md §7:

* :func:`check_fenced_writes` — fencing tokens (§7.1): tokens unique per holder and strictly
  increasing in real-time acquisition order; among the writes the resource *accepted*, tokens
  never go backwards in real-time order, so no older holder's accepted write follows a newer
  holder's (their fenced windows never overlap); the resource ends at the highest accepted token.
* :func:`check_lease_exclusion` — the lease-level promise (§7.1, issue 8): at every grant no
  other owner of that lock id still considers itself holding with a lease it considers valid.
  Each holder's *belief interval* runs from the moment it learnt it holds (the completion of
  its acquisition) to the first of: its release call, its ``lost`` signal, a ``held == False``
  sample, its process' death, and the last ``valid_until`` it reported (it samples that value
  whenever it changes). A holder paused by SIGSTOP keeps believing until that ``valid_until``:
  that is exactly the promise leasewatch must keep. Commands under ``lockctl run`` believe from
  their start to their exit; a command whose *supervisor* was paused or killed is judged only
  until that fault (docs/lockctl.md: only the fencing token protects against a paused supervisor).
  A fenced write refused as stale while its holder still believed it held the lock is the same
  violation seen from the resource.
* :func:`check_no_leaks` — every acquisition ends in a release, a loss signal, or (its process
  having died) a revocation; the store ends empty for every lock id used.
* :func:`check_fifo` — grants follow ticket order (fencing tokens give the grant order) among
  waiters that stayed alive and undisturbed from invocation to grant, once their queue cell
  had time to appear (``enqueue_margin``).
* :func:`check_liveness` — whenever the lock is free and a live waiter waits, a grant follows
  within ``bound`` (lease + scan + grace + slack), extended by the duration of the faults active
  meanwhile (each plus one bound: a fault may leave state that takes one revocation to clear).
* :func:`check_now` — ``/now`` reads are monotonic across all clients in real-time order
  (:func:`tests.support.history.monotonic_read_violations`) and within ``max_skew`` of real time.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from lockclient.clock import TIGHT_US
from tests.support.history import Read, monotonic_read_violations

Event = dict[str, Any]

NS = 1_000_000_000
INFINITE_NS = 2**63
"""Completion time of a read that never completes (no later read is ordered after it)."""

GLOBAL_TARGETS = ("timesvc", "leasewatch", "store")
"""Faults on these disturb every client (a shared service or the shared store)."""

SUPERVISOR_FAULTS = ("kill", "pause")


@dataclass
class Violation:
    checker: str
    message: str
    events: list[Event] = field(default_factory=list)

    def __str__(self) -> str:
        return f"[{self.checker}] {self.message}"


@dataclass
class Fault:
    fid: str
    kind: str
    target: str
    pids: list[int]
    start: int
    end: int
    params: dict[str, Any]

    @property
    def is_global(self) -> bool:
        return self.target.split(":", 1)[0] in GLOBAL_TARGETS or self.target == "*"

    @property
    def duration(self) -> int:
        return self.end - self.start


@dataclass
class Hold:
    """One successful acquisition and its holder's belief interval."""

    op_id: str
    kind: str  # "lib" (RemoteLocker in a worker) or "lockctl" (a command under lockctl run)
    mode: str
    lock: str
    owner: str
    token: int
    ticket: str | None
    proc: str
    pid: int
    invoke: int
    start: int
    end: int = 0
    end_reason: str = ""
    supervisor: int | None = None
    ended_by: str = ""  # "release" / "lost" / "death" / "revoked" / "" (leak)
    events: list[Event] = field(default_factory=list)


@dataclass
class Acquisition:
    """Any acquisition attempt: its invoke, how it completed, and whether the waiter was live."""

    op_id: str
    mode: str
    lock: str
    proc: str
    pid: int
    invoke: int
    complete: int
    outcome: str  # ok / fail / info
    error: str = ""
    token: int | None = None
    ticket: str | None = None
    waited: bool = True
    """False: granted on its first look, its ticket not settled (docs/guarantees.md, "Order (FIFO)")."""
    enqueued: int | None = None
    """When its queue cell was written (``RemoteLock.enqueued_at``, monotonic ns), where recorded."""
    looked: int | None = None
    """When the queue read that decided its grant started (``RemoteLock.looked_at``; for a lock
    handed over by a release, the releaser's read — its ``handed_look``), where recorded."""


class History:
    """An index over the merged events that every checker uses."""

    def __init__(self, events: Iterable[Event]) -> None:
        self.events = sorted(events, key=lambda e: e["t"])
        self.end_t = self.events[-1]["t"] if self.events else 0
        self.by_id: dict[str, dict[str, Event]] = defaultdict(dict)
        for e in self.events:
            if "id" in e and e["type"] in ("invoke", "ok", "fail", "info"):
                self.by_id[e["id"]].setdefault(e["type"], e)
        self.revoked_owners = {e["owner"] for e in self.events if e["type"] == "revocation"}
        self.faults = self._faults()
        self.deaths = self._deaths()
        self.holds = self._holds()
        self.acquisitions = self._acquisitions()

    # -- building ---------------------------------------------------------------------------

    def _faults(self) -> list[Fault]:
        starts: dict[str, Event] = {}
        ends: dict[str, Event] = {}
        for e in self.events:
            if e["type"] == "fault_start":
                starts[e["fid"]] = e
            elif e["type"] == "fault_end":
                ends[e["fid"]] = e
        faults = []
        for fid, s in starts.items():
            end = ends[fid]["t"] if fid in ends else self.end_t
            start = int(s.get("t_start") or s["t"])  # an observed stall is recorded once it is over
            faults.append(
                Fault(fid, s["fault"], s.get("target", "*"), list(s.get("pids", [])), start, end, s.get("params", {}))
            )
        return sorted(faults, key=lambda f: f.start)

    def _deaths(self) -> dict[int, int]:
        """pid -> the earliest moment it was known dead (SIGKILL by the nemesis, or its exit)."""
        deaths: dict[int, int] = {}
        for f in self.faults:
            if f.kind == "kill":
                for pid in f.pids:
                    deaths[pid] = min(deaths.get(pid, f.start), f.start)
        for e in self.events:
            if e["type"] == "proc_exit":
                deaths[e["pid"]] = min(deaths.get(e["pid"], e["t"]), e["t"])
        return deaths

    def faults_on(self, pid: int, kinds: Iterable[str] | None = None) -> list[Fault]:
        wanted = set(kinds) if kinds is not None else None
        return [f for f in self.faults if pid in f.pids and (wanted is None or f.kind in wanted)]

    def disturbed(self, proc: str, pid: int, start: int, end: int) -> bool:
        """Whether any fault touched this process (or everyone) during [start, end]."""
        for f in self.faults:
            if f.start > end or f.end < start:
                continue
            if f.is_global or pid in f.pids or f.target == proc:
                return True
        return False

    def _holds(self) -> list[Hold]:
        holds: list[Hold] = []
        valid: dict[str, list[Event]] = defaultdict(list)
        lost: dict[str, Event] = {}
        release: dict[str, Event] = {}
        release_done: dict[str, Event] = {}
        cmd_exit: dict[str, Event] = {}
        for e in self.events:
            typ = e["type"]
            if typ == "valid":
                valid[e["owner"]].append(e)
            elif typ == "lost":
                lost.setdefault(e["owner"], e)
            elif typ == "invoke" and e.get("op") == "release":
                release.setdefault(e["owner"], e)
            elif typ in ("ok", "fail", "info") and e.get("op") == "release":
                release_done.setdefault(e["owner"], e)
            elif typ == "cmd_exit":
                cmd_exit.setdefault(e["owner"], e)
        for e in self.events:
            if e["type"] == "ok" and e.get("op") == "acquire" and e.get("mode") != "lockctl":
                invoke = self.by_id[e["id"]].get("invoke", e)
                hold = Hold(
                    e["id"], "lib", e.get("mode", "get"), e["lock"], e["owner"], int(e["token"]), e.get("ticket"),
                    e["proc"], e["pid"], invoke["t"], e["t"], events=[invoke, e],
                )  # fmt: skip
                ends: list[tuple[int, str]] = []
                until = e.get("until")
                for sample in valid.get(hold.owner, []):
                    if sample["t"] < hold.start:
                        continue
                    if not sample.get("held", True):
                        ends.append((sample["t"], "held == False"))
                        break
                    until = sample["until"]
                    hold.events.append(sample)
                if until is not None:
                    ends.append((int(until), "last valid_until"))
                if hold.owner in lost:
                    ends.append((lost[hold.owner]["t"], "lost"))
                    hold.events.append(lost[hold.owner])
                if hold.owner in release:
                    ends.append((release[hold.owner]["t"], "release"))
                    hold.events.append(release[hold.owner])
                if hold.pid in self.deaths:
                    ends.append((self.deaths[hold.pid], "process died"))
                hold.end, hold.end_reason = min(ends) if ends else (self.end_t, "history ends")
                done = release_done.get(hold.owner)
                if done is not None and done["type"] == "ok":
                    hold.ended_by = "release" if done.get("result") else "lost"
                    hold.events.append(done)
                elif hold.owner in lost:
                    hold.ended_by = "lost"
                elif hold.pid in self.deaths:
                    hold.ended_by = "death"
                holds.append(hold)
            elif e["type"] == "cmd_start":
                invoke = self.by_id.get(e.get("id", ""), {}).get("invoke", e)
                hold = Hold(
                    str(e.get("id", e["owner"])), "lockctl", "lockctl", e["lock"], e["owner"], int(e["token"]), None,
                    e["proc"], e["pid"], invoke["t"], e["t"], supervisor=e.get("supervisor"), events=[invoke, e],
                )  # fmt: skip
                ends = []
                if hold.owner in cmd_exit:
                    ends.append((cmd_exit[hold.owner]["t"], "command exited"))
                    hold.events.append(cmd_exit[hold.owner])
                if hold.pid in self.deaths:
                    ends.append((self.deaths[hold.pid], "command killed"))
                driver_done = self.by_id.get(e.get("id", ""), {})
                for typ in ("ok", "fail"):
                    if typ in driver_done and driver_done[typ].get("exit") not in (-9, 137):
                        # lockctl exited by itself: it waits for its command first.
                        ends.append((driver_done[typ]["t"], "lockctl exited"))
                if hold.supervisor is not None:
                    for f in self.faults_on(hold.supervisor, SUPERVISOR_FAULTS):
                        if f.end >= hold.start:
                            ends.append((max(f.start, hold.start), f"supervisor {f.kind} (fencing only from here)"))
                hold.end, hold.end_reason = min(ends) if ends else (self.end_t, "history ends")
                if hold.owner in cmd_exit or "ok" in driver_done or "fail" in driver_done:
                    hold.ended_by = "release"
                elif hold.pid in self.deaths:
                    hold.ended_by = "death"
                holds.append(hold)
        for hold in holds:
            if hold.ended_by in ("", "death") and hold.owner in self.revoked_owners:
                hold.ended_by = "revoked"
        return holds

    def _acquisitions(self) -> list[Acquisition]:
        out = []
        cmd_start = {e["id"]: e for e in self.events if e["type"] == "cmd_start" and "id" in e}
        # A lock handed over by a release (issue 27) was decided by the releaser's read of the queue:
        # its grant is judged by when that read began (the worker's release event records it).
        handed: dict[tuple[str, int], int] = {
            (e["lock"], e["handed_token"]): e["handed_look"]
            for e in self.events
            if e["type"] == "ok" and e.get("op") == "release" and "handed_look" in e
        }
        for op_id, phases in self.by_id.items():
            inv = phases.get("invoke")
            if inv is None or inv.get("op") != "acquire":
                continue
            done = phases.get("ok") or phases.get("fail") or phases.get("info")
            if done is None:  # merge() marks these; a raw list may not have
                done = {"t": self.end_t, "type": "info", "reason": "no completion"}
            outcome = done["type"]
            token, ticket = done.get("token"), done.get("ticket")
            complete = done["t"]
            if inv.get("mode") == "lockctl":
                started = cmd_start.get(op_id)
                if started is not None:
                    outcome, token, complete = "ok", int(started["token"]), started["t"]
                elif outcome == "ok":
                    outcome = "fail"  # lockctl ran nothing: busy, timed out, or lost before start
            if inv["pid"] in self.deaths and outcome == "info":
                complete = min(complete, self.deaths[inv["pid"]])
            out.append(
                Acquisition(
                    op_id=op_id,
                    mode=inv.get("mode", "get"),
                    lock=inv["lock"],
                    proc=inv["proc"],
                    pid=inv["pid"],
                    invoke=inv["t"],
                    complete=complete,
                    outcome=outcome,
                    error=str(done.get("error", "")),
                    token=token,
                    ticket=ticket,
                    waited=bool(done.get("waited", True)),
                    enqueued=done.get("enqueued"),
                    looked=done.get("looked", handed.get((inv["lock"], token))),
                )
            )
        return sorted(out, key=lambda a: a.invoke)

    def locks(self) -> set[str]:
        return {a.lock for a in self.acquisitions}


# -- fenced writes --------------------------------------------------------------------------------


def check_fenced_writes(h: History) -> list[Violation]:
    out: list[Violation] = []
    by_lock: dict[str, list[Hold]] = defaultdict(list)
    for hold in h.holds:
        by_lock[hold.lock].append(hold)
    for lock, holds in by_lock.items():
        owners_by_token: dict[int, set[str]] = defaultdict(set)
        for hold in holds:
            owners_by_token[hold.token].add(hold.owner)
        for token, owners in owners_by_token.items():
            if len(owners) > 1:
                out.append(Violation("fencing", f"{lock}: token {token} handed to several owners {sorted(owners)}"))
        # Real-time acquisition order: a grant that completed before another was invoked has a smaller token.
        grants = sorted(holds, key=lambda x: x.start)
        starts = [x.start for x in grants]
        best: list[Hold] = []
        for x in grants:
            best.append(x if not best or x.token > best[-1].token else best[-1])
        for y in holds:
            i = bisect.bisect_left(starts, y.invoke)
            if i and best[i - 1].token >= y.token:
                x = best[i - 1]
                out.append(
                    Violation(
                        "fencing",
                        f"{lock}: token {y.token} ({y.owner}) was invoked after token {x.token} ({x.owner}) had "
                        "been granted: tokens must increase in acquisition order",
                        [*x.events[:2], *y.events[:2]],
                    )
                )

    writes: dict[str, list[tuple[Event, Event]]] = defaultdict(list)
    for phases in h.by_id.values():
        inv = phases.get("invoke")
        if inv is None or inv.get("op") != "write":
            continue
        done = phases.get("ok")
        if done is not None and done.get("result") == "ok":
            writes[inv["lock"]].append((inv, done))
    for lock, accepted in writes.items():
        accepted.sort(key=lambda w: w[1]["t"])
        completes = [w[1]["t"] for w in accepted]
        prefix: list[tuple[Event, Event]] = []
        for w in accepted:
            prefix.append(w if not prefix or w[0]["token"] > prefix[-1][0]["token"] else prefix[-1])
        for inv, done in accepted:
            i = bisect.bisect_left(completes, inv["t"])
            if i and prefix[i - 1][0]["token"] > inv["token"]:
                newer_inv, newer_done = prefix[i - 1]
                out.append(
                    Violation(
                        "fencing",
                        f"{lock}: the resource accepted token {inv['token']} ({inv['owner']}) after it had accepted "
                        f"token {newer_inv['token']} ({newer_inv['owner']}): tokens went backwards, the older "
                        "holder's fenced window overlaps the newer one's",
                        [newer_inv, newer_done, inv, done],
                    )
                )
        highest = max(int(w[0]["token"]) for w in accepted)
        finals = [e for e in h.events if e["type"] == "resource_final" and e["lock"] == lock]
        for final in finals:
            if int(final["highest"]) < highest:
                out.append(
                    Violation(
                        "fencing",
                        f"{lock}: the resource ended at token {final['highest']} below the accepted {highest}",
                        [final],
                    )
                )
    return out


# -- lease-level exclusion ---------------------------------------------------------------------


def check_lease_exclusion(h: History) -> list[Violation]:
    out: list[Violation] = []
    by_lock: dict[str, list[Hold]] = defaultdict(list)
    for hold in h.holds:
        if hold.end > hold.start:
            by_lock[hold.lock].append(hold)
    for lock, holds in by_lock.items():
        holds.sort(key=lambda x: x.start)
        active: list[Hold] = []
        for b in holds:
            active = [a for a in active if a.end > b.start]
            for a in active:
                if a.owner == b.owner:
                    continue
                overlap = (min(a.end, b.end) - b.start) / NS
                out.append(
                    Violation(
                        "lease",
                        f"{lock}: {b.owner} (token {b.token}, {b.kind}) was granted while {a.owner} (token {a.token}, "
                        f"{a.kind}) still considered itself holding with a valid lease for {overlap:.3f}s more "
                        f"(its belief ended by: {a.end_reason})",
                        [*a.events, *b.events[:2]],
                    )
                )
            active.append(b)
    holds_by_owner = {hold.owner: hold for hold in h.holds}
    for phases in h.by_id.values():
        inv, done = phases.get("invoke"), phases.get("ok")
        if inv is None or done is None or inv.get("op") != "write" or done.get("result") != "stale":
            continue
        holder = holds_by_owner.get(inv["owner"])
        if holder is not None and done["t"] < holder.end and holder.kind == "lib":
            out.append(
                Violation(
                    "lease",
                    f"{inv['lock']}: {inv['owner']}'s write with token {inv['token']} was refused as stale while it "
                    f"still believed it held the lock ({(holder.end - done['t']) / NS:.3f}s before its belief ended)",
                    [inv, done],
                )
            )
    return out


# -- leaks -----------------------------------------------------------------------------------------


def check_no_leaks(h: History) -> list[Violation]:
    out: list[Violation] = []
    for hold in h.holds:
        if hold.ended_by == "":
            out.append(
                Violation(
                    "leak",
                    f"{hold.lock}: {hold.owner} (token {hold.token}) never ended in a release, a loss signal or a "
                    "revocation",
                    hold.events,
                )
            )
        elif (
            hold.ended_by == "death"
            and hold.kind == "lib"
            and not any(e["type"] == "final" and e["lock"] == hold.lock for e in h.events)
        ):
            # Died holding and no revocation seen: the final state of the lock id must show it
            # cleared; without that record there is nothing that proves it did not leak.
            out.append(
                Violation("leak", f"{hold.lock}: {hold.owner} died holding and no revocation was seen", hold.events)
            )
    for e in h.events:
        if e["type"] != "final":
            continue
        if e.get("holders") or e.get("queue") or e.get("leases"):
            out.append(
                Violation(
                    "leak",
                    f"{e['lock']}: store not empty {e.get('waited_s', '?')}s after the last operation: "
                    f"holders={e.get('holders')} queue={e.get('queue')} leases={e.get('leases')}",
                    [e],
                )
            )
    return out


# -- FIFO ------------------------------------------------------------------------------------------


def _ticket_us(ticket: str) -> int:
    return int(ticket[:20])


def _overtaken(a: Acquisition, b: Acquisition, margin_us: int) -> bool:
    """Whether B's grant before A's breaks FIFO (A has the smaller ticket, B the smaller token).

    Where both recorded when it happened — A's queue cell written, B's deciding look started — the
    promise itself is the rule (docs/guarantees.md, "Order (FIFO)"): A's cell was written before
    that look began, so the look saw it ahead. The time between a ticket and its cell is no proof
    of anything on a busy machine: a process starved for 2 s between taking its ticket and writing
    its cell (a fresh clone at load ~50 did it) is rightly overtaken by a look in between. Where
    they were not recorded (lockctl's supervisor), a ticket ``margin_us`` older stands in for the
    cell having been written before B took its ticket."""
    assert a.ticket is not None and b.ticket is not None
    if _ticket_us(a.ticket) >= _ticket_us(b.ticket):
        return False
    if a.enqueued is not None and b.looked is not None:
        return a.enqueued < b.looked
    return _ticket_us(b.ticket) - _ticket_us(a.ticket) >= margin_us


def check_fifo(h: History, *, enqueue_margin: float = 1.0, max_wait: float = 60.0) -> list[Violation]:
    """A waiter A undisturbed from its invocation to its grant must be granted before B (smaller
    token) when its ticket is smaller and its queue cell was written before B's deciding look
    began (:func:`_overtaken`; without those moments recorded, when its ticket is at least
    ``enqueue_margin`` older). Tickets start with their global time in µs."""
    out: list[Violation] = []
    margin_us = int(enqueue_margin * 1_000_000)
    window = int(max_wait * NS)
    by_lock: dict[str, list[Acquisition]] = defaultdict(list)
    for a in h.acquisitions:
        if a.outcome == "ok" and a.ticket is not None and a.token is not None:
            by_lock[a.lock].append(a)
    for lock, grants in by_lock.items():
        grants.sort(key=lambda a: a.invoke)
        invokes = [a.invoke for a in grants]
        for b in grants:
            lo = bisect.bisect_left(invokes, b.invoke - window)
            hi = bisect.bisect_right(invokes, b.invoke)
            for a in grants[lo:hi]:
                assert a.token is not None and b.token is not None and a.ticket is not None and b.ticket is not None
                if (
                    a.token > b.token
                    and _overtaken(a, b, margin_us)
                    and not h.disturbed(a.proc, a.pid, a.invoke, a.complete)
                ):
                    out.append(
                        Violation(
                            "fifo",
                            f"{lock}: {b.op_id} (ticket {b.ticket}) was granted token {b.token} before {a.op_id} "
                            f"(ticket {(_ticket_us(b.ticket) - _ticket_us(a.ticket)) / 1e6:.3f}s earlier: {a.ticket}, "
                            f"undisturbed{_cell_and_look(a, b)}) got token {a.token}",
                            [h.by_id[a.op_id]["invoke"], h.by_id[b.op_id]["invoke"]],
                        )
                    )
    return out


def _cell_and_look(a: Acquisition, b: Acquisition) -> str:
    if a.enqueued is None or b.looked is None:
        return ""
    return f", its cell written {(b.looked - a.enqueued) / NS:.3f}s before that grant's look began"


# -- liveness --------------------------------------------------------------------------------------


def _busy_intervals(h: History, lock: str, bound: int) -> list[tuple[int, int]]:
    spans = [(x.start, x.end) for x in h.holds if x.lock == lock]
    for a in h.acquisitions:
        if a.lock == lock and a.outcome == "info":
            # Killed mid-acquisition: it may hold the lock in the store until revoked.
            spans.append((a.invoke, a.complete + bound))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def _relevant_faults(h: History, lock: str, bound: int) -> list[Fault]:
    """Faults that can delay a grant of ``lock``: global ones, and those on a process that was
    acquiring or holding this lock id around the fault."""
    spans: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for a in h.acquisitions:
        if a.lock == lock:
            spans[a.pid].append((a.invoke, a.complete))
    for x in h.holds:
        if x.lock == lock:
            spans[x.pid].append((x.start, max(x.end, x.start)))
            if x.supervisor is not None:
                spans[x.supervisor].append((x.start, max(x.end, x.start)))
    relevant = []
    for f in h.faults:
        if f.is_global or any(s <= f.end and e >= f.start - bound for pid in f.pids for s, e in spans.get(pid, [])):
            relevant.append(f)
    return relevant


def _deadline(faults: list[Fault], t: int, bound: int) -> int:
    """``bound`` after the later of ``t`` and the end of every relevant fault overlapping the wait."""
    deadline = t + bound
    while True:
        ends = [f.end for f in faults if f.start <= deadline and f.end >= t - bound]
        new = max([t, *ends]) + bound
        if new <= deadline:
            return deadline
        deadline = new


def check_liveness(h: History, *, bound: float) -> list[Violation]:
    out: list[Violation] = []
    b = int(bound * NS)
    for lock in sorted(h.locks()):
        busy = _busy_intervals(h, lock, b)
        starts = [s for s, _ in busy]
        faults: list[Fault] | None = None
        # Not judged as waiters: try_get_lock never waits, and a `lockctl run` driver's attempt hides its
        # enqueue and its grant behind two interpreter start-ups (lockctl's, then the command's), which the
        # history cannot see; lockctl holds still count as busy spans.
        for w in (a for a in h.acquisitions if a.lock == lock and a.mode not in ("try", "lockctl")):
            i = bisect.bisect_right(starts, w.invoke) - 1
            t = w.invoke if i < 0 or busy[i][1] <= w.invoke else busy[i][1]
            k = i + 1
            while t < w.complete:
                gap_end = starts[k] if k < len(busy) else h.end_t
                if gap_end - t > b:
                    if faults is None:
                        faults = _relevant_faults(h, lock, b)
                    deadline = _deadline(faults, t, b)
                    died = h.deaths.get(w.pid)
                    if gap_end > deadline and w.complete > deadline and (died is None or died > deadline):
                        out.append(
                            Violation(
                                "liveness",
                                f"{lock}: free from {t / NS:.3f} with {w.op_id} waiting, but "
                                + f"nobody took it for {(gap_end - t) / NS:.3f}s"
                                + f" (allowed {(deadline - t) / NS:.3f}s with the faults active then)",
                                [h.by_id[w.op_id]["invoke"]],
                            )
                        )
                        break
                if k >= len(busy):
                    break
                t = busy[k][1]
                k += 1
    return out


# -- /now -----------------------------------------------------------------------------------------


@dataclass
class NowStats:
    """``max_ahead_s`` / ``max_behind_s``: the largest offset of a /now value from real time that the
    read's own window [invoke, complete] allows (so they include the read's latency)."""

    reads: int
    failed: int
    max_ahead_s: float
    max_behind_s: float
    max_outside_s: float = 0.0
    """The largest distance of a value from its read's window [invoke, complete] in real time: what
    is certainly offset, whatever the latency (0 when every value fell inside its window)."""
    tickets_within_disagreement: int = 0
    """Ticket-order deviations within one /now round trip (timesvc replicas' disagreement)."""
    max_ticket_deviation_s: float = 0.0
    """The largest of them."""


def now_reads(h: History, *, tickets: bool = True) -> tuple[list[Read], list[Event]]:
    """Every ``/now`` value a client saw: the readers' reads and — ``tickets`` — each granted
    acquisition's ticket, a global time its client took (from timesvc) inside the acquisition's
    window [invoke, grant]; a ticket may be older than that when the enqueue was retried, never newer,
    so a ticket counts as a read that completed at the grant and was invoked at the acquisition's invoke."""
    reads = []
    raw = []
    clients: dict[str, int] = {}
    for e in h.events:
        if e["type"] == "now" and e.get("ok"):
            client = clients.setdefault(e["proc"], len(clients))
            reads.append(Read(client, int(e["invoke"]), int(e["t"]), int(e["value"]), str(e.get("replica", ""))))
            raw.append(e)
    if tickets:
        for a in h.acquisitions:
            if a.outcome == "ok" and a.ticket:
                client = clients.setdefault(a.proc, len(clients))
                reads.append(Read(client, a.invoke, a.complete, int(a.ticket[:20]), f"ticket of {a.op_id}"))
                raw.append({"type": "ticket", "proc": a.proc, "id": a.op_id, "t": a.complete, "ticket": a.ticket})
    return reads, raw


def check_now(
    h: History, *, max_skew: float, wall_minus_mono_ns: int, tickets: bool = True
) -> tuple[list[Violation], NowStats]:
    """``/now`` reads must be linearizable among themselves, strictly, and every value within
    ``max_skew`` of real time at some moment of its read's window — always: no fault of one timesvc
    clock excuses a value (issue 22; the checker used to excuse ticket deviations while a timesvc
    clock ran fast or had jumped, which hid global time being dragged). Tickets (docs/guarantees.md, "Order") are
    linearizable with the reads too, with one documented exception, counted in the stats: by up to the
    timesvc replicas' disagreement — bounded here by the slowest ``/now`` round trip of the readers
    within a second of the ticket's acquisition."""
    out: list[Violation] = []
    reads, raw = now_reads(h, tickets=tickets)
    # A ticket granted on the first look skipped the commit wait (docs/guarantees.md, "Order (FIFO)"): it is
    # still at least every value read before its acquisition began, but a read that starts after
    # the grant may be below it — as if the ticket's read never completed.
    unsettled = {f"ticket of {a.op_id}" for a in h.acquisitions if a.outcome == "ok" and a.ticket and not a.waited}
    ordered = [replace(r, completed_ns=INFINITE_NS) if r.replica in unsettled else r for r in reads]
    plain = sorted((r for r in reads if not r.replica.startswith("ticket of ")), key=lambda r: r.completed_ns)
    plain_done = [r.completed_ns for r in plain]
    within = 0
    deviation = 0.0

    def round_trip_near(r: Read) -> int:
        lo = bisect.bisect_left(plain_done, r.invoked_ns - NS)
        hi = bisect.bisect_right(plain_done, r.completed_ns + NS)
        return max((p.completed_ns - p.invoked_ns for p in plain[lo:hi]), default=0)

    original = {r.replica: r for r in reads if r.replica in unsettled}
    for moved, required in monotonic_read_violations(ordered):
        read = original.get(moved.replica, moved)
        backwards_us = required.value - read.value
        tickets_involved = [r for r in (read, required) if r.replica.startswith("ticket of ")]
        if tickets_involved and backwards_us * 1000 <= max(round_trip_near(r) for r in tickets_involved):
            within += 1
            deviation = max(deviation, backwards_us / 1e6)
            continue
        out.append(
            Violation(
                "now-monotonic",
                f"client {read.client} read {read.value} from {read.replica} after client {required.client} "
                f"read {required.value} from {required.replica} had completed ({backwards_us / 1e6:.6f}s backwards)",
            )
        )
    # A client's tickets never decrease (its clock's ticket floor): a ticket may repeat the largest
    # this client took before — whose own width was judged when it was taken.
    floor_before: dict[str, int] = {}
    by_client: dict[int, list[Read]] = defaultdict(list)
    for r in reads:
        if r.replica.startswith("ticket of "):
            by_client[r.client].append(r)
    for mine in by_client.values():
        mine.sort(key=lambda r: r.invoked_ns)
        done = sorted(mine, key=lambda r: r.completed_ns)
        best, k = 0, 0
        for r in mine:
            while k < len(done) and done[k].completed_ns < r.invoked_ns:
                best = max(best, done[k].value)
                k += 1
            floor_before[r.replica] = best
    skew_us = max_skew * 1e6
    ahead = behind = -math.inf
    outside = 0.0
    for read, e in zip(reads, raw, strict=True):
        wall_invoke_us = (read.invoked_ns + wall_minus_mono_ns) / 1000
        wall_complete_us = (read.completed_ns + wall_minus_mono_ns) / 1000
        # The value was produced somewhere inside [invoke, complete]: these bound its offset.
        ahead = max(ahead, (read.value - wall_invoke_us) / 1e6)
        behind = max(behind, (wall_complete_us - read.value) / 1e6)
        outside = max(outside, (read.value - wall_complete_us) / 1e6, (wall_invoke_us - read.value) / 1e6)
        # An unsettled ticket is the upper end of its clock's interval: ahead of global time by
        # at most the interval's width — TIGHT_US, or the round trip of an answer fetched inside
        # the acquisition (lockclient.clock.Extrapolator.ticket_us).
        slack_us = max(TIGHT_US, (read.completed_ns - read.invoked_ns) / 1000) if read.replica in unsettled else 0
        if read.replica in unsettled and read.value <= floor_before.get(read.replica, 0):
            slack_us = math.inf
        if read.value > wall_complete_us + skew_us + slack_us or read.value < wall_invoke_us - skew_us:
            out.append(
                Violation(
                    "now-offset",
                    f"{e['proc']} read {read.value} from {read.replica}: "
                    f"{(read.value - wall_complete_us) / 1e6:+.3f}s from real time (max_skew {max_skew}s)",
                    [e],
                )
            )
    failed = sum(1 for e in h.events if e["type"] == "now" and not e.get("ok"))
    return out, NowStats(len(reads), failed, max(ahead, 0.0), max(behind, 0.0), outside, within, deviation)


# -- everything ------------------------------------------------------------------------------------


def check_all(
    h: History, *, bound: float, max_skew: float, wall_minus_mono_ns: int, enqueue_margin: float = 1.0
) -> tuple[list[Violation], NowStats]:
    violations = [
        *check_fenced_writes(h),
        *check_lease_exclusion(h),
        *check_no_leaks(h),
        *check_fifo(h, enqueue_margin=enqueue_margin),
        *check_liveness(h, bound=bound),
    ]
    now_violations, stats = check_now(h, max_skew=max_skew, wall_minus_mono_ns=wall_minus_mono_ns)
    return [*violations, *now_violations], stats
