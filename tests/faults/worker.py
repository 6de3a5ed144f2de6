"""A lock-client worker for the fault scenarios: takes locks in a loop and records every step.

Run as ``python tests/faults/worker.py NAME --history DIR --kind sync|async|lockctl ...`` with
``CHRONOLOCK_STORE_URL``, ``CHRONOLOCK_TIMESVC_URLS`` (through the nemesis' proxy),
``CHRONOLOCK_LEASEWATCH_URL`` and ``CHRONOLOCK_LEASE`` set, and the repository on PYTHONPATH.
Only the library's public API is used.

* ``sync``: ``get_lock`` with random timeouts and a ``cancel`` event set at a random moment, and
  ``try_get_lock``; inside the lock one or two fenced writes (each after checking ``held``) and a
  tiny hold — sometimes a long one, so a pause or a clock fault can hit a holder.
* ``async``: two tasks doing the same with ``aget_lock``, cancelled at random points by
  ``asyncio.timeout`` and, sometimes, by cancelling the task twice.
* ``lockctl``: ``lockctl run LOCK -- python worker.py --command ...`` in a loop; the command records
  its own start (token and owner from ``CHRONOLOCK_*``), a fenced write, and its exit.

Every worker also reads ``/now`` from each timesvc replica in turn (``--now-urls``) from a
background thread, and a sampler thread records each holder's ``held``/``valid_until``
whenever they change, so the checkers know until when each holder believed it held the lock.
Sleeps use ``threading.Event().wait`` (``time.sleep`` fails under libfaketime).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.append(str(_REPO))

import httpx  # noqa: E402

from lockclient import (  # noqa: E402
    FencedResource,
    LockCancelled,
    LockTimeout,
    RemoteLock,
    RemoteLocker,
    StaleFencingToken,
    open_store,
)
from tests.faults.recorder import Recorder  # noqa: E402

NS = 1_000_000_000
_WRITE_TAKES_HOLDER = "holder" in inspect.signature(FencedResource.write).parameters


class Terminated(Exception):
    """SIGTERM arrived (lockctl stopping its command)."""


def pause(seconds: float) -> None:
    if seconds > 0:
        threading.Event().wait(seconds)


def _moments(lock: RemoteLock) -> dict[str, int]:
    """When the grant's queue cell was written and its deciding look began (monotonic ns, like every
    event's ``t``: libfaketime leaves the monotonic clock alone), for the FIFO checker."""
    out = {}
    for field, attr in (("enqueued", "enqueued_at"), ("looked", "looked_at")):
        moment = getattr(lock, attr, None)
        if moment is not None:
            out[field] = int(moment * NS)
    return out


def _handed(lock: RemoteLock) -> dict[str, int]:
    """A release that handed the lock over (issue 27: the release's compare-and-set grants the
    first in line): the token it granted and when the queue read that chose that waiter began
    (monotonic ns) — the hand-over's deciding look, by which the FIFO checker judges it (the
    waiter's own ``looked_at`` is None: the read was this process's)."""
    lease = lock._lease
    to, read_at = lease.handed_to, lease.handed_read_at
    if to is None or read_at is None:
        return {}
    return {"handed_token": to.token, "handed_look": int(read_at * NS)}


def pick_lock(rng: random.Random, locks: list[str]) -> str:
    """The first lock id is hot (a third of all attempts: long queues, FIFO under contention);
    the rest share the remainder (short queues, fast hand-offs: the run reaches its size)."""
    if len(locks) == 1 or rng.random() < 1 / 3:
        return locks[0]
    return rng.choice(locks[1:])


def fenced_write(rec: Recorder, guard: FencedResource, lock: RemoteLock, key: str) -> bool:
    """One fenced write with the lock's token; returns False once the resource refused it."""
    op = rec.next_id()
    fields = {"op": "write", "id": op, "lock": lock.lock_id, "token": lock.fencing_token, "owner": lock.owner}
    rec.emit("invoke", **fields)
    kwargs: dict[str, Any] = {"holder": lock.owner} if _WRITE_TAKES_HOLDER else {}
    try:
        guard.write(lock.fencing_token, key, lock.owner, **kwargs)
    except StaleFencingToken as exc:
        rec.emit("ok", **fields, result="stale", error=str(exc))
        return False
    except Exception as exc:  # the store failed: the write may or may not have landed
        rec.emit("info", **fields, result="error", error=repr(exc))
        return False
    rec.emit("ok", **fields, result="ok")
    return True


class Sampler:
    """Records ``held`` and ``valid_until`` of every current holder whenever they change."""

    def __init__(self, rec: Recorder, period: float) -> None:
        self.rec = rec
        self.period = period
        self._locks: dict[str, tuple[RemoteLock, tuple[bool, int] | None]] = {}
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self, lock: RemoteLock) -> bool:
        held = lock.held
        until = int(lock.valid_until * NS)
        with self._mutex:
            previous = self._locks.get(lock.owner, (lock, None))[1]
            if previous != (held, until):
                self._locks[lock.owner] = (lock, (held, until))
                self.rec.emit("valid", owner=lock.owner, lock=lock.lock_id, held=held, until=until)
        return held

    def add(self, lock: RemoteLock) -> None:
        with self._mutex:
            self._locks[lock.owner] = (lock, (True, int(lock.valid_until * NS)))

    def remove(self, lock: RemoteLock) -> None:
        with self._mutex:
            self._locks.pop(lock.owner, None)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            with self._mutex:
                locks = [lock for lock, _ in self._locks.values()]
            for lock in locks:
                self.sample(lock)

    def close(self) -> None:
        self._stop.set()


def now_reader(rec: Recorder, urls: list[str], period: float, stop: threading.Event) -> None:
    with httpx.Client(timeout=1.0) as http:
        i = 0
        while not stop.wait(period):
            url = urls[i % len(urls)]
            i += 1
            invoke = time.monotonic_ns()
            try:
                response = http.get(f"{url}/now")
                response.raise_for_status()
                body = response.json()
            except (httpx.HTTPError, ValueError) as exc:
                rec.emit("now", invoke=invoke, url=url, ok=False, error=type(exc).__name__)
                continue
            rec.emit("now", invoke=invoke, url=url, ok=True, value=int(body["now_us"]), replica=body.get("replica"))


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.rec = Recorder(Path(args.history) / f"{args.name}.jsonl", args.name)
        self.stop_file = Path(args.stop_file)
        self.deadline = time.monotonic() + args.duration
        self.ops = 0

    def running(self) -> bool:
        return self.ops < self.args.max_ops and time.monotonic() < self.deadline and not self.stop_file.exists()

    def hold_time(self) -> float:
        if self.rng.random() < self.args.long_hold_p:
            return self.rng.uniform(0.3, self.args.long_hold)
        return self.rng.uniform(0, self.args.hold)

    def on_grant(self, op: str, mode: str, lock: RemoteLock, sampler: Sampler) -> None:
        self.rec.emit(
            "ok", op="acquire", id=op, lock=lock.lock_id, mode=mode, owner=lock.owner, token=lock.fencing_token,
            ticket=getattr(lock, "ticket", None), waited=lock.waited, until=int(lock.valid_until * NS),
            **_moments(lock),
        )  # fmt: skip
        sampler.add(lock)
        owner, lock_id, rec = lock.owner, lock.lock_id, self.rec

        def lost(reason: str) -> None:
            rec.emit("lost", owner=owner, lock=lock_id, reason=reason)

        lock.on_lost(lost)

    def critical_section(self, lock: RemoteLock, guard: FencedResource, sampler: Sampler) -> None:
        hold = self.hold_time()
        writes = self.rng.choice((1, 2))
        for i in range(writes):
            if not sampler.sample(lock):
                break
            if not fenced_write(self.rec, guard, lock, f"k{i}"):
                break
            pause(hold / writes)

    def release(self, lock: RemoteLock, sampler: Sampler) -> None:
        sampler.sample(lock)
        op = self.rec.next_id()
        fields = {"op": "release", "id": op, "lock": lock.lock_id, "owner": lock.owner}
        self.rec.emit("invoke", **fields)
        try:
            result = lock.release()
        except Exception as exc:
            self.rec.emit("fail", **fields, error=repr(exc))
        else:
            self.rec.emit("ok", **fields, result=result, **_handed(lock))
        sampler.remove(lock)

    # -- sync ------------------------------------------------------------------------------------

    def run_sync(self, locker: RemoteLocker) -> None:
        sampler = Sampler(self.rec, self.args.sample)
        guards = {lock_id: FencedResource(locker.store, f"res:{lock_id}") for lock_id in self.args.locks}
        while self.running():
            self.ops += 1
            lock_id = pick_lock(self.rng, self.args.locks)
            op = self.rec.next_id()
            try_ = self.rng.random() < self.args.try_p
            mode = "try" if try_ else "get"
            timeout = self.rng.uniform(0.2, self.args.timeout)
            cancel = threading.Event()
            timer = None
            if not try_ and self.rng.random() < self.args.cancel_p:
                timer = threading.Timer(self.rng.uniform(0, 0.5), cancel.set)
            self.rec.emit("invoke", op="acquire", id=op, lock=lock_id, mode=mode, timeout=timeout,
                          cancel="event" if timer else None)  # fmt: skip
            if timer is not None:
                timer.start()
            try:
                lock = locker.try_get_lock(lock_id) if try_ else locker.get_lock(lock_id, timeout, cancel=cancel)
            except (LockTimeout, LockCancelled) as exc:
                error = "timeout" if isinstance(exc, LockTimeout) else "cancelled"
                self.rec.emit("fail", op="acquire", id=op, lock=lock_id, mode=mode, error=error)
                continue
            except Exception as exc:
                self.rec.emit("fail", op="acquire", id=op, lock=lock_id, mode=mode, error=type(exc).__name__)
                pause(0.05)
                continue
            finally:
                if timer is not None:
                    timer.cancel()
            if lock is None:
                self.rec.emit("fail", op="acquire", id=op, lock=lock_id, mode=mode, error="busy")
                pause(self.rng.uniform(0, 0.01))
                continue
            self.on_grant(op, mode, lock, sampler)
            try:
                self.critical_section(lock, guards[lock_id], sampler)
            finally:
                self.release(lock, sampler)
        sampler.close()

    # -- asyncio ---------------------------------------------------------------------------------

    async def async_task(self, locker: RemoteLocker, sampler: Sampler, rng: random.Random) -> None:
        guards = {lock_id: FencedResource(locker.store, f"res:{lock_id}") for lock_id in self.args.locks}
        while self.running():
            self.ops += 1
            lock_id = pick_lock(rng, self.args.locks)
            op = self.rec.next_id()
            timeout = rng.uniform(0.2, self.args.timeout)
            style = rng.random()
            mode = "aget"
            cancel = "timeout" if style < self.args.cancel_p else None
            if cancel is None and style < self.args.cancel_p + self.args.double_cancel_p:
                cancel = "twice"
            self.rec.emit("invoke", op="acquire", id=op, lock=lock_id, mode=mode, timeout=timeout, cancel=cancel)
            try:
                if style < self.args.cancel_p:
                    async with asyncio.timeout(rng.uniform(0, 0.5)):
                        lock = await locker.aget_lock(lock_id, timeout)
                elif style < self.args.cancel_p + self.args.double_cancel_p:
                    task = asyncio.ensure_future(locker.aget_lock(lock_id, timeout))
                    await asyncio.sleep(rng.uniform(0, 0.3))
                    task.cancel()
                    await asyncio.sleep(rng.uniform(0, 0.01))
                    task.cancel()
                    lock = await task
                else:
                    lock = await locker.aget_lock(lock_id, timeout)
            except (LockTimeout, LockCancelled, TimeoutError, asyncio.CancelledError) as exc:
                error = "timeout" if isinstance(exc, LockTimeout) else "cancelled"
                self.rec.emit("fail", op="acquire", id=op, lock=lock_id, mode=mode, error=error)
                continue
            except Exception as exc:
                self.rec.emit("fail", op="acquire", id=op, lock=lock_id, mode=mode, error=type(exc).__name__)
                await asyncio.sleep(0.05)
                continue
            self.on_grant(op, mode, lock, sampler)
            try:
                await asyncio.to_thread(self.critical_section, lock, guards[lock_id], sampler)
            finally:
                await asyncio.to_thread(self.release, lock, sampler)

    async def run_async(self, locker: RemoteLocker) -> None:
        sampler = Sampler(self.rec, self.args.sample)
        tasks = [self.async_task(locker, sampler, random.Random(self.rng.random())) for _ in range(2)]
        await asyncio.gather(*tasks)
        sampler.close()

    # -- lockctl ---------------------------------------------------------------------------------

    def run_lockctl(self) -> None:
        lockctl = str(Path(sys.executable).parent / "lockctl")
        while self.running():
            pause(self.rng.uniform(0, 2 * self.args.lockctl_pause))  # each run costs two interpreter start-ups
            self.ops += 1
            lock_id = pick_lock(self.rng, self.args.locks)
            op = self.rec.next_id()
            timeout = self.rng.uniform(1.0, self.args.timeout)
            self.rec.emit("invoke", op="acquire", id=op, lock=lock_id, mode="lockctl", timeout=timeout)
            env = dict(os.environ, FAULTS_OP_ID=op, FAULTS_HOLD=str(self.hold_time()))
            command = [sys.executable, __file__, f"{self.args.name}.cmd{self.ops}", "--history", self.args.history]
            command += ["--kind", "command", "--stop-file", self.args.stop_file]
            try:
                done = subprocess.run(
                    [lockctl, "run", lock_id, "--timeout", f"{timeout:.3f}", "--", *command],
                    env=env,
                    capture_output=True,
                    timeout=self.args.timeout + 60,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                self.rec.emit("info", op="acquire", id=op, lock=lock_id, mode="lockctl", error="lockctl hung")
                continue
            code = done.returncode
            typ = "ok" if code == 0 else ("info" if code in (-9, 137) else "fail")
            self.rec.emit(
                typ, op="acquire", id=op, lock=lock_id, mode="lockctl", exit=code, error=f"lockctl exit {code}",
                stderr=done.stderr.decode(errors="replace")[-300:] if code else "",
            )  # fmt: skip

    def run_command(self) -> None:
        """The command under ``lockctl run``: holds what lockctl passed it and writes once, fenced."""
        op = os.environ["FAULTS_OP_ID"]
        lock_id = os.environ["CHRONOLOCK_LOCK_ID"]
        token = int(os.environ["CHRONOLOCK_FENCING_TOKEN"])
        owner = os.environ["CHRONOLOCK_LOCK_OWNER"]

        def terminated(signum: int, frame: object) -> None:
            raise Terminated(signum)

        # lockctl sends SIGTERM when it loses the lock: record the moment we stop, not when lockctl exits.
        signal.signal(signal.SIGTERM, terminated)
        self.rec.emit("cmd_start", id=op, lock=lock_id, owner=owner, token=token, supervisor=os.getppid())
        self._witness_death(op, lock_id, owner)
        try:
            self._command_body(op, lock_id, token, owner)
        except Terminated:
            self.rec.emit("cmd_exit", id=op, lock=lock_id, owner=owner, reason="SIGTERM")
            raise SystemExit(128 + signal.SIGTERM) from None
        except BaseException as exc:
            # A command that fails (its store cannot even be opened on a full disk) stops believing
            # as it exits. Without this line the witness below was the only record, and a witness
            # that starts after its command is gone (an interpreter start-up on a loaded machine)
            # records nothing: the checker then ran the belief on to lockctl's exit, after lockctl's
            # release and the grants that followed it (12 false [lease] violations, 2026-12-07).
            self.rec.emit("cmd_exit", id=op, lock=lock_id, owner=owner, reason=f"error: {exc!r}"[:200])
            raise
        self.rec.emit("cmd_exit", id=op, lock=lock_id, owner=owner, reason="done")

    def _witness_death(self, op: str, lock_id: str, owner: str) -> None:
        """lockctl SIGKILLs the command when its lease is about to run out unrenewed; the command
        cannot record that, and lockctl itself may exit much later, so the checker would believe
        the command ran on until then. A witness outside the command's process group (its own
        session) records the moment the command is gone, on the same monotonic clock: it waits
        on a pidfd of the command, so it ends as soon as the command does."""
        event = {"id": op, "lock": lock_id, "owner": owner, "reason": "died"}
        code = (
            "import json, os, select, sys, time\n"
            "path, proc, pid, fields = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])\n"
            "fd = os.pidfd_open(pid)\n"
            "select.select([fd], [], [])\n"
            "line = {'t': time.monotonic_ns(), 'type': 'cmd_exit', 'proc': proc, 'pid': os.getpid(), **fields}\n"
            "with open(path, 'a', encoding='utf-8') as f:\n"
            "    f.write(json.dumps(line, separators=(',', ':')) + '\\n')\n"
        )
        subprocess.Popen(
            [sys.executable, "-c", code, str(self.rec.path), f"{self.rec.proc}.witness", str(os.getpid()),
             json.dumps(event)],
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def _command_body(self, op: str, lock_id: str, token: int, owner: str) -> None:
        with open_store(os.environ["CHRONOLOCK_STORE_URL"]) as store:
            guard = FencedResource(store, f"res:{lock_id}")
            fields = {"op": "write", "lock": lock_id, "token": token, "owner": owner}
            wid = self.rec.next_id()
            self.rec.emit("invoke", id=wid, **fields)
            kwargs: dict[str, Any] = {"holder": owner} if _WRITE_TAKES_HOLDER else {}
            try:
                guard.write(token, "cmd", owner, **kwargs)
            except StaleFencingToken as exc:
                self.rec.emit("ok", id=wid, **fields, result="stale", error=str(exc))
            except Exception as exc:
                self.rec.emit("info", id=wid, **fields, result="error", error=repr(exc))
            else:
                self.rec.emit("ok", id=wid, **fields, result="ok")
        pause(float(os.environ.get("FAULTS_HOLD", "0")))

    def main(self) -> int:
        if self.args.kind == "command":
            self.run_command()
            return 0
        self.rec.emit("proc_start", kind=self.args.kind, wall_ns=time.time_ns())
        stop = threading.Event()
        readers = [threading.Thread(target=stall_monitor, args=(self.rec, stop), daemon=True)]
        readers[0].start()
        if self.args.now_urls:
            reader = threading.Thread(
                target=now_reader, args=(self.rec, self.args.now_urls.split(","), self.args.now_period, stop)
            )
            reader.start()
            readers.append(reader)
        try:
            if self.args.kind == "lockctl":
                self.run_lockctl()
            else:
                locker = RemoteLocker.from_env()
                try:
                    if self.args.kind == "sync":
                        self.run_sync(locker)
                    else:
                        asyncio.run(self.run_async(locker))
                finally:
                    locker.close()
        finally:
            stop.set()
            for reader in readers:
                reader.join(timeout=5)
            self.rec.emit("proc_done", ops=self.ops)
        return 0


STALL_THRESHOLD_S = 0.5
"""Like the harness's own probe (``Settings.stall_threshold``): a 50 ms sleep of this process
that took this much longer is a stall of this process."""


def stall_monitor(rec: Recorder, stop: threading.Event) -> None:
    """Record the stalls of this very process — no CPU for it on a busy machine (the harness's
    monitor sees only its own) — as observed faults on it, as if the nemesis had paused it: the
    checkers then judge its FIFO order and its waits the way they judge a paused process's."""
    n = 0
    while not stop.is_set():
        started = time.monotonic_ns()
        stop.wait(0.05)
        late = (time.monotonic_ns() - started) / 1e9 - 0.05
        if late > STALL_THRESHOLD_S:
            n += 1
            fid = f"{rec.proc}.stall{n}"
            rec.emit("fault_start", fid=fid, fault="stall", name="observed-stall", target=rec.proc,
                     pids=[rec.pid], params={"host_s": round(late, 3)}, t_start=started)  # fmt: skip
            rec.emit("fault_end", fid=fid)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name")
    p.add_argument("--history", required=True, help="directory for NAME.jsonl")
    p.add_argument("--kind", choices=["sync", "async", "lockctl", "command"], default="sync")
    p.add_argument("--locks", default="a,b,c", type=lambda s: s.split(","))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--max-ops", type=int, default=1_000_000)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--timeout", type=float, default=5.0, help="largest get_lock timeout")
    p.add_argument("--hold", type=float, default=0.003, help="largest short hold")
    p.add_argument("--long-hold", type=float, default=2.0)
    p.add_argument("--long-hold-p", type=float, default=0.01)
    p.add_argument("--try-p", type=float, default=0.1)
    p.add_argument("--cancel-p", type=float, default=0.05)
    p.add_argument("--double-cancel-p", type=float, default=0.02)
    p.add_argument("--sample", type=float, default=0.05, help="seconds between held/valid_until samples")
    p.add_argument("--now-urls", default="", help="timesvc base URLs to read /now from in turn")
    p.add_argument("--now-period", type=float, default=0.2)
    p.add_argument("--lockctl-pause", type=float, default=1.0, help="seconds between two lockctl runs")
    return p.parse_args(argv)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(Worker(parse()).main())
