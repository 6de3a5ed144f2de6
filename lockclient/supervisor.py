"""Running the command of ``lockctl run`` so that it never runs without the lock.

``flock(1)`` gets this for free: its lock belongs to an open file the command
inherits, so the lock lives exactly as long as the command. A lease-based lock
belongs to the process that renews it — lockctl — and two things can end it
while the command still runs: lockctl dies (SIGKILL, the OOM killer, a crash),
or the lease stops being renewed (lockctl cut off from the store) and
leasewatch revokes it. Either way the next holder may start its command while
ours still writes. This module closes both, as far as a supervisor can.

**The command is a process group.** The command starts as the leader of a new
process group (``setpgid(0, 0)`` in the child before exec), so everything it
forks — unless it deliberately leaves the group — can be signalled at once with
``killpg``: signals lockctl receives (SIGINT, SIGTERM, SIGHUP), the
termination schedule below, and the clean-up of leftovers.

**lockctl dies → the whole group dies at once.** Two independent mechanisms:

* ``PR_SET_PDEATHSIG(SIGKILL)`` on the command's first process, set in the
  child between fork and exec (Linux; ``prctl`` resolved through ctypes in the
  parent, so the child only makes the call). The classic race: if lockctl died
  *before* the prctl, no signal will ever come, so the child compares
  ``getppid()`` with lockctl's pid afterwards and exits if they differ. The
  death signal follows the *thread* that forked, so lockctl forks from its main
  thread, which lives as long as lockctl. It does not reach grandchildren, and
  the kernel clears it when the command execs a set-user-ID binary (``sudo``).
* A **watchdog**: a tiny ``/bin/sh`` in its own session whose stdin is the read
  end of a pipe; the write end exists only in lockctl (close-on-exec, so the
  command never inherits it). The command's first process writes its pid — the
  pgid — into that pipe from the child *before* exec, so the watchdog knows the
  group before the command runs a single instruction of its own. When lockctl
  ends normally it writes ``done``; when lockctl dies by any means the kernel
  closes its end, the watchdog reads end-of-file without ``done`` and sends
  SIGKILL to the whole group. It ignores SIGINT/SIGTERM/SIGHUP and lives in its
  own session, so a signal aimed at lockctl's job (``kill -9 %1``, a terminal
  hang-up) cannot take it down with lockctl. This is also the fallback where
  ``prctl`` is unavailable (not Linux, or no ``prctl`` in the C library): the
  watchdog alone still kills the group, and since the child itself holds a copy
  of the write end until its exec, even a lockctl that dies mid-spawn cannot slip
  a command past it. (A ``prctl`` that exists but fails is an error: the command
  is not started.)

**The lease runs out → the group is dead before anyone else can be granted the
lock.** leasewatch revokes a lease no earlier than ``valid_until + grace``,
where ``valid_until`` is the start of the holder's last successful renewal
plus the lease (DESIGN.md §6). :class:`TerminationSchedule` therefore sends
SIGTERM at ``valid_until - kill_grace - KILL_MARGIN`` and SIGKILL at
``valid_until - KILL_MARGIN`` at the latest, judged on lockctl's monotonic
clock each poll, independently of any store call (a hung renewal changes
nothing) and of stderr (messages are written by a thread of their own, after
the signal is sent: a stuck log pipe cannot delay a SIGKILL). A renewal that
succeeds in time moves ``valid_until`` and nothing happens. ``KILL_MARGIN``
covers the supervisor's poll interval and signal delivery. Renewals run every
lease/3, so a healthy holder keeps at least 2/3 of a lease;
:func:`kill_grace_problem` refuses settings where termination could start
while renewals are healthy (``kill_grace + KILL_MARGIN`` must be at most half
the lease, leaving lease/6 for a slow renewal). A lost lock (revoked, or its
expiry detected by the lock library) starts the same termination at once:
SIGTERM, SIGKILL after ``kill_grace``.

**Leftovers are gone before the release.** When the command's first process
exits, lockctl sees it with ``waitid(WEXITED | WNOWAIT)``: the zombie stays
unreaped, which keeps the pgid reserved (the kernel cannot hand the number to
a new group while the zombie exists), so ``killpg`` cannot hit a stranger.
Remaining members of the group get SIGTERM, then SIGKILL after ``kill_grace``
(or earlier, by the schedule); lockctl waits until none of them runs (zombies
do not run), tells the watchdog ``done``, reaps, and only then does the caller
release the lock.

**The terminal.** When lockctl runs in the foreground of its controlling
terminal, it hands the terminal's foreground to the command's group (in the
child before exec and again in the parent, as a shell does, with SIGTTOU
ignored), so the command can read the terminal and Ctrl-C reaches the command;
lockctl takes the terminal back when the command ends. If the command is
stopped from the terminal (Ctrl-Z), lockctl takes the terminal back and stops
itself so that the shell regains control; on ``fg``/``bg`` it continues the
command only if the lease is still good for it (a stopped lockctl renews
nothing).

**Not covered.** A *paused* lockctl (SIGSTOP, a frozen VM or container)
cannot run its schedule: only the fencing token (``CHRONOLOCK_FENCING_TOKEN``,
passed on to the protected resource) protects against it. Processes that leave
the command's process group (``setsid``, daemons, ``setpgid``) are not
followed. Processes lockctl may not signal (a set-user-ID program that changed
its real uid) cannot be killed by it.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "DEFAULT_KILL_GRACE",
    "KILL_MARGIN",
    "Decision",
    "LeaseView",
    "Outcome",
    "SupervisionError",
    "Terminal",
    "TerminationSchedule",
    "Watchdog",
    "default_kill_grace",
    "kill_grace_problem",
    "run_supervised",
]

KILL_MARGIN = 0.5
"""Seconds before ``valid_until`` by which the command's group must have been sent SIGKILL.

Covers the supervisor's poll interval (:data:`POLL`), a late wake-up on a busy
machine and signal delivery. leasewatch adds its own grace on top.
"""

DEFAULT_KILL_GRACE = 2.0
"""Default seconds between SIGTERM and SIGKILL (for leases of 5 s and more; see
:func:`default_kill_grace`). With the default 10 s lease, termination starts 2.5 s
before the lease would run out, which a healthy holder (at least 6.7 s left at
any time) never comes near."""

POLL = 0.02
"""How often the supervisor looks at the command, received signals and the lease."""

EXIT_WAIT = 5.0
"""Bound on waiting for SIGKILLed processes to finish exiting (one stuck in the kernel)."""

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_ORPHANED_EXIT = 137  # the child found lockctl already gone: as if the death signal had come

_WATCHDOG_SCRIPT = """\
trap '' HUP INT QUIT TERM TSTP TTIN TTOU PIPE
pgid=
while read -r line; do
    case $line in
        done) exit 0 ;;
        ''|*[!0-9]*) ;;
        *) pgid=$line ;;
    esac
done
# End of file without "done": the supervisor is gone. A pgid below 2 would mean
# "every process" (-1) or "my own group" (-0): never send those.
if [ -n "$pgid" ] && [ "$pgid" -gt 1 ]; then
    kill -s KILL -- "-$pgid" 2>/dev/null
fi
exit 0
"""


class SupervisionError(RuntimeError):
    """lockctl could not set up what keeps the command from running unlocked (the watchdog)."""


# -- settings --------------------------------------------------------------------------------


def default_kill_grace(lease: float, margin: float = KILL_MARGIN) -> float:
    """The kill grace when none is given: :data:`DEFAULT_KILL_GRACE`, or as much as ``lease``
    allows if it is shorter than 5 s (``lease/2 - margin``; negative when no grace fits)."""
    return min(DEFAULT_KILL_GRACE, lease / 2 - margin)


def kill_grace_problem(kill_grace: float, lease: float, margin: float = KILL_MARGIN) -> str | None:
    """Why ``kill_grace`` cannot work with ``lease`` (a message), or None if it can.

    Termination starts when the lease has ``kill_grace + margin`` seconds left.
    Renewals run every lease/3, so a healthy holder always has at least 2/3 of a
    lease left, minus how long a renewal takes; asking for ``kill_grace + margin
    <= lease / 2`` keeps lease/6 of room for a slow renewal, so a healthy lock
    never terminates its own command.
    """
    if not math.isfinite(kill_grace) or kill_grace < 0:
        return f"--kill-grace must be a finite number of seconds >= 0, got {kill_grace}"
    if kill_grace + margin > lease / 2:
        limit = max(lease / 2 - margin, 0.0)
        return (
            f"--kill-grace {kill_grace:g} s is too long for a {lease:g} s lease: the command must be dead "
            f"{margin:g} s before the lease can run out, and termination may start only when less than half "
            f"of the lease is left, so --kill-grace must be at most lease/2 - {margin:g} = {limit:g} s "
            f"(or use a lease of at least {2 * (kill_grace + margin):g} s)"
        )
    return None


# -- the termination schedule ----------------------------------------------------------------


class LeaseView(Protocol):
    """What the schedule reads from the lock; none of it touches the store or blocks."""

    @property
    def valid_until(self) -> float: ...

    @property
    def lost(self) -> threading.Event: ...

    @property
    def lost_reason(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """Send ``signal`` to the command's process group now, because of ``reason``."""

    signal: signal.Signals
    reason: str


class TerminationSchedule:
    """When to SIGTERM and SIGKILL the command's group; pure bookkeeping, the clock is injected.

    ``poll()`` is called every :data:`POLL` seconds and returns the one signal due
    now, if any. Deadlines are recomputed from ``lock.valid_until`` at every
    call, so a renewal that succeeds in time simply moves them; once SIGTERM has
    been sent, a later renewal cancels nothing (the command has been told to
    stop; SIGKILL follows ``kill_grace`` later unless it exits).
    """

    def __init__(
        self,
        lock: LeaseView,
        kill_grace: float,
        *,
        margin: float = KILL_MARGIN,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = lock
        self.kill_grace = kill_grace
        self.margin = margin
        self._monotonic = monotonic
        self.term_sent_at: float | None = None
        self.kill_sent_at: float | None = None
        self.lease_ended = False
        """Termination was caused by the lease (lost, or about to run out): lockctl exits 70."""
        self._requested: str | None = None

    def request(self, reason: str) -> None:
        """Terminate the group for a reason of our own (leftovers): SIGTERM now, SIGKILL after the grace."""
        if self._requested is None:
            self._requested = reason

    def poll(self) -> Decision | None:
        if self.kill_sent_at is not None:
            return None
        now = self._monotonic()
        valid_until = self._lock.valid_until
        left = valid_until - now
        if now >= valid_until - self.margin:
            self.kill_sent_at = now
            self.lease_ended = True
            when = (
                f"runs out in {left:.2f} s"
                if left > 0
                else f"ran out {-left:.2f} s ago (lockctl was stopped or not scheduled)"
            )
            return Decision(
                signal.SIGKILL,
                f"the lease {when} and was not renewed; "
                "killing the command's process group now so that it is dead before anyone else can get the lock",
            )
        if self._lock.lost.is_set():
            self.lease_ended = True
        if self.term_sent_at is not None:
            if now >= self.term_sent_at + self.kill_grace:
                self.kill_sent_at = now
                return Decision(signal.SIGKILL, f"still running {self.kill_grace:g} s after SIGTERM")
            return None
        reason: str | None = None
        if self._lock.lost.is_set():
            reason = f"lost the lock ({self._lock.lost_reason})"
        elif now >= valid_until - self.kill_grace - self.margin:
            self.lease_ended = True
            reason = f"the lease runs out in {left:.2f} s and no renewal has succeeded (store unreachable?)"
        elif self._requested is not None:
            reason = self._requested
        if reason is None:
            return None
        self.term_sent_at = now
        kill_in = min(self.kill_grace, valid_until - self.margin - now)
        return Decision(signal.SIGTERM, f"{reason}; SIGKILL in {kill_in:.2f} s unless it exits")

    def allows_running(self) -> bool:
        """No termination is under way or due now: the command may be continued after a stop."""
        if self.term_sent_at is not None or self.kill_sent_at is not None or self._lock.lost.is_set():
            return False
        return self._monotonic() < self._lock.valid_until - self.kill_grace - self.margin

    def next_event(self) -> float:
        """Monotonic time of the next signal the schedule could send (the supervisor sleeps until then at most)."""
        if self.kill_sent_at is not None:
            return math.inf
        kill_at = self._lock.valid_until - self.margin
        if self.term_sent_at is None:
            return min(kill_at - self.kill_grace, kill_at)
        return min(self.term_sent_at + self.kill_grace, kill_at)


# -- the watchdog -----------------------------------------------------------------------------


class Watchdog:
    """A ``/bin/sh`` that SIGKILLs the command's group if lockctl goes away without saying ``done``."""

    def __init__(self, proc: subprocess.Popen[bytes], fd: int) -> None:
        self.proc = proc
        self.fd: int | None = fd
        """Write end of the pipe; only lockctl holds it (close-on-exec)."""

    @classmethod
    def start(cls) -> Watchdog:
        read_end, write_end = os.pipe()  # both close-on-exec (PEP 446)
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", _WATCHDOG_SCRIPT, "chronolock-watchdog"],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # out of lockctl's process group and away from its terminal
                close_fds=True,
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        return cls(proc, write_end)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def arm(self, pgid: int) -> None:
        """Tell the watchdog the group to kill (normally the child does it itself before exec)."""
        self._write(b"%d\n" % pgid)

    def disarm(self) -> None:
        """lockctl is done with the group: the watchdog exits without killing anything."""
        self._write(b"done\n")
        self.close()

    def close(self) -> None:
        """Close lockctl's end without ``done`` — exactly what lockctl's death does."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def wait(self, timeout: float = 2.0) -> None:
        """Reap the watchdog after disarm/close (it exits at once)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout)

    def _write(self, data: bytes) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(BrokenPipeError):  # the watchdog was killed; warned about elsewhere
            os.write(self.fd, data)


# -- the terminal -----------------------------------------------------------------------------


def _tcsetpgrp(fd: int, pgid: int) -> bool:
    """``tcsetpgrp`` that works from a background group too (SIGTTOU ignored around it)."""
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        return False  # the terminal went away (hang-up) or the group is gone
    finally:
        signal.signal(signal.SIGTTOU, previous)
    return True


class Terminal:
    """The controlling terminal, when lockctl is in its foreground: lent to the command like a shell does."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.own_pgrp = os.getpgrp()
        # Ignored while we supervise: lockctl in the background may still need to write a
        # message to a terminal with `stty tostop`, and must never be stopped for it.
        saved = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        self.saved_ttou = signal.SIG_DFL if saved is None else saved
        self.lent_to: int | None = None

    @classmethod
    def if_foreground(cls) -> Terminal | None:
        """The controlling terminal if lockctl's process group is its foreground group, else None."""
        try:
            fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            return None  # no controlling terminal
        try:
            if os.tcgetpgrp(fd) == os.getpgrp():
                return cls(fd)
        except OSError:
            pass
        os.close(fd)
        return None

    def is_ours(self) -> bool:
        """Is lockctl's group in the foreground now (after a ``fg`` rather than a ``bg``)?"""
        try:
            return os.tcgetpgrp(self.fd) == self.own_pgrp
        except OSError:
            return False

    def lend(self, pgid: int) -> None:
        if _tcsetpgrp(self.fd, pgid):
            self.lent_to = pgid

    def take_back(self) -> None:
        if self.lent_to is None:
            return
        self.lent_to = None
        with contextlib.suppress(OSError):
            if os.tcgetpgrp(self.fd) == self.own_pgrp:
                return
        _tcsetpgrp(self.fd, self.own_pgrp)

    def close(self) -> None:
        self.take_back()
        signal.signal(signal.SIGTTOU, self.saved_ttou)
        os.close(self.fd)


# -- the command's process group ---------------------------------------------------------------


def _load_prctl() -> Callable[..., Any] | None:
    """libc's ``prctl``, resolved in the parent so the child only calls it; None where unavailable."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    fn: Callable[..., Any] = prctl
    return fn


_HAVE_PROCFS = os.path.exists("/proc/self/stat")


def _running_in_group(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` that can still run (zombies cannot), from /proc."""
    running = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            # "pid (comm) state ppid pgrp ...": comm may contain anything, so split after the last ')'.
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[2]) != pgid:
                continue
            if fields[0] in (b"Z", b"X") and len(os.listdir(f"/proc/{name}/task")) <= 1:
                continue  # a zombie — unless its other threads still run (the leader thread exited first)
        except (OSError, ValueError, IndexError):
            continue  # gone while we looked
        running.append(int(name))
    return running


class CommandGroup:
    """The command's first process and the process group it leads."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.pid <= 1:
            raise ValueError(f"refusing to treat pid {proc.pid} as a process group")
        self.proc = proc
        self.pgid = proc.pid
        self.exited = False
        """The first process has exited (still a zombie until :meth:`reap`)."""

    @classmethod
    def spawn(
        cls, command: Sequence[str], env: dict[str, str], *, watchdog: Watchdog, terminal: Terminal | None
    ) -> CommandGroup:
        """Start ``command`` as the leader of a new process group, armed for lockctl's death.

        Raises what :class:`subprocess.Popen` raises: FileNotFoundError / OSError when
        the command cannot be executed, SubprocessError when the set-up in the child failed.
        """
        supervisor = os.getpid()
        prctl = _load_prctl()
        watchdog_fd = watchdog.fd
        if watchdog_fd is None:
            raise RuntimeError("the watchdog is closed")
        tty_fd = terminal.fd if terminal is not None else -1
        # Dispositions the command must start with. Python ignores SIGPIPE and SIGXFSZ, and we
        # ignore SIGTTOU while lending the terminal; ignored signals survive exec, so restore them
        # (what Popen's restore_signals does, but only after our own write to the watchdog, which
        # must fail with EPIPE rather than kill the child if the watchdog is gone).
        ttou = terminal.saved_ttou if terminal is not None else signal.getsignal(signal.SIGTTOU)
        if ttou is None:  # installed outside Python; the command gets the default
            ttou = signal.SIG_DFL
        sigkill = int(signal.SIGKILL)
        restore = [(signal.SIGPIPE, signal.SIG_DFL), (signal.SIGXFSZ, signal.SIG_DFL), (signal.SIGTTOU, ttou)]

        def in_child() -> None:
            # Runs in the child between fork and exec while other threads of lockctl may hold
            # locks: only system calls and objects prepared above, no imports, no logging.
            if prctl is not None and prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
            if os.getppid() != supervisor:  # lockctl died before the death signal was armed
                os._exit(_ORPHANED_EXIT)
            pid = os.getpid()  # == our new pgid: Popen's setpgid(0, 0) ran before this function
            os.write(watchdog_fd, b"%d\n" % pid)
            if tty_fd >= 0:
                os.tcsetpgrp(tty_fd, pid)  # SIGTTOU is ignored (inherited): allowed from the background
            for sig, disposition in restore:
                signal.signal(sig, disposition)

        # preexec_fn is unsafe with threads only if it takes locks another thread may hold at fork
        # time; in_child makes system calls on objects prepared here and nothing else.
        proc = subprocess.Popen(
            list(command),
            env=env,
            process_group=0,
            preexec_fn=in_child,  # noqa: PLW1509
            restore_signals=False,
            close_fds=True,
        )
        group = cls(proc)
        if terminal is not None:
            terminal.lend(group.pgid)  # again in the parent, as a shell does: whichever runs first wins
        return group

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def poll_leader(self, *, stops: bool) -> os.waitid_result | None:
        """The first process's exit (or stop, with ``stops``), without reaping it; None if neither."""
        options = os.WEXITED | os.WNOHANG | os.WNOWAIT | (os.WSTOPPED if stops else 0)
        try:
            info = os.waitid(os.P_PID, self.pgid, options)
        except ChildProcessError:
            self.exited = True
            return None
        if info is not None and info.si_code in (os.CLD_EXITED, os.CLD_KILLED, os.CLD_DUMPED):
            self.exited = True
            if not _HAVE_PROCFS:
                # Without /proc a zombie leader cannot be told from running members: reap it and probe
                # the group with signal 0 instead (the pgid stays reserved while any member exists).
                self.reap()
        elif info is not None:  # stopped: consume the report so that the next poll does not see it again
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, self.pgid, os.WSTOPPED | os.WNOHANG)
        return info

    def running(self) -> list[int]:
        """Members that can still run (the first process included until it exits); [0] if unknowable."""
        if _HAVE_PROCFS:
            return _running_in_group(self.pgid)
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [0]

    def reap(self) -> int:
        """Reap the first process; its status like a shell's ``$?`` (128+N if killed by signal N)."""
        returncode = self.proc.wait()
        return 128 - returncode if returncode < 0 else returncode


# -- the supervisor loop -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int
    """The command's status like a shell's ``$?``."""
    lease_ended: bool
    """The lease was lost or about to run out while the command (or a leftover) ran: it was terminated."""


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class _Messages:
    """lockctl's messages, written by a thread of their own.

    The supervisor loop must never block, on the store or on anything else: stderr
    may be a pipe whose reader is stuck (a paused log collector), and a blocked
    write there must not delay a SIGKILL.
    """

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="lockctl-messages", daemon=True)
        self._thread.start()

    def __call__(self, message: str) -> None:
        self._queue.put(message)

    def close(self, timeout: float = 2.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (message := self._queue.get()) is not None:
            with contextlib.suppress(Exception):  # a closed stderr must not end the supervision
                self._say(message)


def run_supervised(
    lock: LeaseView,
    command: Sequence[str],
    env: dict[str, str],
    *,
    kill_grace: float,
    received: Sequence[int],
    say: Callable[[str], None],
    margin: float = KILL_MARGIN,
) -> Outcome:
    """Run ``command`` in its own process group under ``lock``; return when no member can run any more.

    ``received`` is the list of signals lockctl has caught (appended to by its
    handler); each is forwarded to the group once. Raises like
    :meth:`CommandGroup.spawn` (and OSError if the watchdog cannot start) without
    having started anything that survives.
    """
    try:
        watchdog = Watchdog.start()
    except OSError as exc:
        raise SupervisionError(f"cannot start the watchdog (/bin/sh): {exc}") from exc
    terminal = Terminal.if_foreground()
    group: CommandGroup | None = None
    messages = _Messages(say)
    try:
        group = CommandGroup.spawn(command, env, watchdog=watchdog, terminal=terminal)
        schedule = TerminationSchedule(lock, kill_grace, margin=margin)
        _supervise(group, schedule, received, terminal, watchdog, messages)
        lease_ended = schedule.lease_ended or lock.lost.is_set()
    except BaseException:
        if group is not None:
            # lockctl itself failed: never leave the command (or what is left of it) running unlocked.
            # The unreaped leader still reserves the pgid, so this cannot hit a stranger.
            group.signal(signal.SIGKILL)
            _wait_until_none_run(group)
        raise
    finally:
        if terminal is not None:
            terminal.close()
        # Nothing of the group runs any more (or it never started): the watchdog may go.
        watchdog.disarm()
        watchdog.wait()
        messages.close()
    # Reap last: until now the zombie kept the pgid reserved for every killpg above.
    return Outcome(group.reap(), lease_ended)


def _wait_until_none_run(group: CommandGroup, timeout: float = EXIT_WAIT) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        if not group.exited:
            group.poll_leader(stops=False)
        running = group.running() if group.exited else [group.pgid]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.005)


def _supervise(
    group: CommandGroup,
    schedule: TerminationSchedule,
    received: Sequence[int],
    terminal: Terminal | None,
    watchdog: Watchdog,
    say: Callable[[str], None],
) -> None:
    exit_notice = _LeaderExit(group.pgid)
    try:
        _supervision_loop(group, schedule, received, terminal, watchdog, say, exit_notice)
    finally:
        exit_notice.close()


class _LeaderExit:
    """Wakes the supervision loop the moment the command exits (a pidfd, Linux 5.3+) instead of at
    its next poll: ``lockctl run -- true`` used to end a whole :data:`POLL` (20 ms) after ``true``
    did (issue 25: start-up). Stops and signals are still seen at the next poll, as before;
    without pidfds the loop simply sleeps."""

    def __init__(self, pid: int) -> None:
        self._fd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # not Linux, an old kernel, or out of descriptors
            self._fd = os.pidfd_open(pid)

    def wait(self, seconds: float, *, exited: bool) -> None:
        """Sleep ``seconds``, or less if the (still running) command exits meanwhile."""
        if self._fd is None or exited:  # once it exited the pidfd stays readable: sleep for real
            time.sleep(seconds)
        else:
            select.select([self._fd], [], [], seconds)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _supervision_loop(
    group: CommandGroup,
    schedule: TerminationSchedule,
    received: Sequence[int],
    terminal: Terminal | None,
    watchdog: Watchdog,
    say: Callable[[str], None],
    exit_notice: _LeaderExit,
) -> None:
    forwarded = 0
    leftovers_reported = False
    watchdog_reported = False
    while True:
        while forwarded < len(received):
            sig = received[forwarded]
            forwarded += 1
            group.signal(sig)

        if not group.exited:
            info = group.poll_leader(stops=terminal is not None)
            if info is not None and not group.exited and terminal is not None:
                _suspend_with_the_command(group, schedule, terminal, info.si_status)
                continue
            if group.exited and terminal is not None:
                terminal.take_back()
        if group.exited:
            running = group.running()
            if not running:
                return
            if not leftovers_reported:
                leftovers_reported = True
                shown = ", ".join(str(pid) for pid in running[:10] if pid) or "unknown pids"
                say(
                    f"the command exited but left {len(running)} process(es) in its process group ({shown}); "
                    "terminating them before releasing the lock"
                )
                schedule.request("leftover processes of the command")
            if schedule.kill_sent_at is not None and time.monotonic() - schedule.kill_sent_at > EXIT_WAIT:
                say(f"warning: process(es) {running} still exiting {EXIT_WAIT:g} s after SIGKILL; giving up on them")
                return

        decision = schedule.poll()
        if decision is not None:
            group.signal(decision.signal)
            if decision.signal == signal.SIGTERM:
                group.signal(signal.SIGCONT)  # a stopped process would not see SIGTERM until continued
            say(f"{decision.reason}: sent {_signal_name(decision.signal)} to the command's process group")

        if not watchdog_reported and not watchdog.alive:
            watchdog_reported = True
            say("warning: the watchdog process died; if lockctl is killed now, the command's children may survive")

        wait = min(POLL, schedule.next_event() - time.monotonic())
        exit_notice.wait(max(wait, 0.001), exited=group.exited)


def _suspend_with_the_command(
    group: CommandGroup, schedule: TerminationSchedule, terminal: Terminal, stopped_by: int
) -> None:
    """The command was stopped (Ctrl-Z): stop lockctl too, like a shell's job, as ``sudo`` does.

    The shell only regains its terminal when every process of *its* job (lockctl)
    has stopped. While lockctl is stopped nothing renews the lease, so on
    ``fg``/``bg`` the command is continued only if the schedule still allows it.
    """
    terminal.take_back()
    # SIGTSTP rather than SIGSTOP: in an orphaned process group, where no shell could ever
    # continue us, the kernel discards it and we simply go on (a SIGSTOPped command excepted).
    os.kill(os.getpid(), signal.SIGSTOP if stopped_by == signal.SIGSTOP else signal.SIGTSTP)
    # Continued (fg or bg). If the lease ran short meanwhile, leave the command stopped: the
    # loop's schedule terminates it (SIGTERM is followed by SIGCONT; SIGKILL needs none).
    if not schedule.allows_running():
        return
    if terminal.is_ours():  # fg; after bg the terminal stays the shell's and is not taken back later
        terminal.lend(group.pgid)
    group.signal(signal.SIGCONT)
