"""``lockctl``: run a command under a lock, inspect a lock, create the store schema.

``lockctl run NAME -- CMD...`` works like ``flock(1)`` or ``etcdctl lock``: it takes
the lock (first come, first served), runs CMD with ``CHRONOLOCK_LOCK_ID``,
``CHRONOLOCK_FENCING_TOKEN`` and ``CHRONOLOCK_LOCK_OWNER`` added to its environment,
and releases the lock when CMD ends. CMD does **not** inherit lockctl's secrets: the
Cassandra password, leasewatch and timesvc tokens are removed from its environment
and the credentials from ``CHRONOLOCK_STORE_URL`` (``--pass-secrets`` keeps them).

Unlike flock's lock, a lease-based lock lives in the process that renews it, so
lockctl supervises CMD (:mod:`lockclient.supervisor` has the details and the
reasoning) so that no process of CMD's process group runs without the lock:

* CMD runs as the leader of its own process group; signals lockctl receives
  (SIGINT, SIGTERM, SIGHUP) are forwarded to that group, and when lockctl runs
  in the foreground of a terminal the terminal is lent to the group, as a shell
  does, so CMD can read it and Ctrl-C reaches CMD.
* If lockctl dies (SIGKILL, the OOM killer), the group is SIGKILLed at once:
  ``PR_SET_PDEATHSIG`` on CMD (Linux) plus a watchdog process that kills the
  whole group when lockctl's end of a pipe closes. Where ``prctl`` is not
  available the watchdog alone does it.
* When CMD exits, processes it left in its group get SIGTERM, then SIGKILL after
  ``--kill-grace``, *before* the lock is released.
* If the lease is not renewed (lockctl cut off from the store), the group gets
  SIGTERM when ``kill_grace + KILL_MARGIN`` (0.5 s) of the lease are left and
  SIGKILL ``KILL_MARGIN`` before the lease runs out — before leasewatch can
  revoke it and grant the lock to anyone else. A lost lock starts the same at once.
  ``--kill-grace`` + 0.5 s must therefore be at most half the lease; the default
  grace is 2 s, or lease/2 - 0.5 s for leases under 5 s.

Not covered: a *paused* lockctl (SIGSTOP, a frozen VM) — only the fencing token,
passed by CMD to the resource it protects, guards against it; processes that leave
CMD's process group (``setsid``, daemons).

Exit status of ``lockctl run``:

====  ==========================================================================
 N    CMD's own exit status (a CMD killed by signal N gives 128+N, like a shell)
 2    bad usage: invalid lock id, bad ``--timeout`` / ``--lease`` / ``--kill-grace``,
      ``--kill-grace`` too long for the lease (``kill_grace + 0.5 > lease / 2``), or
      a lease under 1 s
 69   the store (or timesvc) is unavailable (EX_UNAVAILABLE)
 70   the lock was lost, or was about to run out, while CMD (or a process it left
      in its group) ran; they were terminated (SIGTERM, then SIGKILL after
      ``--kill-grace`` or just before the lease would run out, whichever is first)
 75   the lock is busy (``--try``) or ``--timeout`` ran out (EX_TEMPFAIL); ``-E CODE``
      (``--conflict-exit-code``) makes it CODE, like ``flock -E``
 78   bad ``CHRONOLOCK_*`` settings, a misspelt (unknown) ``CHRONOLOCK_*``, ``TIMESVC_*`` or
      ``LEASEWATCH_*`` variable, no ``CHRONOLOCK_STORE_URL``, an SQLite store whose directory
      does not exist or that cannot be written, or the store refused the credentials or its
      TLS certificate did not verify (EX_CONFIG: retrying will not help)
 126  CMD could not be executed, or lockctl could not set up its supervision;
      127: CMD was not found
 128+N  lockctl received signal N (SIGINT, SIGTERM, SIGHUP): it forwarded the
      signal to CMD's process group, waited for CMD to end and released the lock
====  ==========================================================================

lockctl writes nothing to stdout while it runs a command (stdout belongs to the
command); its own messages and logs go to stderr.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import ValidationError

from lockclient import metrics
from lockclient.clihelp import flags_without_a_type
from lockclient.entrypoint import describe_validation_error, guarded_main
from lockclient.errors import (
    ClockError,
    ConfigurationError,
    InvalidLockId,
    LockCancelled,
    LockTimeout,
    StoreError,
)
from lockclient.labels import check_label, shorten_label
from lockclient.lockid import validate_lock_id
from lockclient.logs import configure_logging
from lockclient.redact import redact, strip_url_credentials
from lockclient.runkinds import RunKind, parse_duration
from lockclient.settings import (
    SERVICE_SECRET_ENV,
    ClientSettings,
    StoreSettings,
    secret_env_names,
    settings_help,
    settings_report,
)
from lockclient.supervisor import (
    DEFAULT_KILL_GRACE,
    KILL_MARGIN,
    SupervisionError,
    default_kill_grace,
    kill_grace_problem,
    run_supervised,
)
from lockclient.version import version_option

if TYPE_CHECKING:
    from lockclient.locker import LockStatus, RemoteLock, RemoteLocker

__all__ = [
    "EXIT_BUSY",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_CONFIG",
    "EXIT_LOCK_LOST",
    "EXIT_NOT_FOUND",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "app",
    "main",
]

EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE
EXIT_LOCK_LOST = 70  # EX_SOFTWARE: the command ran (partly) without the lock
EXIT_BUSY = 75  # EX_TEMPFAIL, like `flock -n` on a conflict
EXIT_CONFIG = 78  # EX_CONFIG
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _escape_markup(text: str) -> str:
    """``rich.markup.escape`` (the same expression): importing rich.markup for it cost ~10 ms of
    every lockctl start, and help is the only place that needs it."""
    escaped = re.sub(r"(\\*)(\[[a-z#/@][^[]*?])", lambda m: f"{m[1]}{m[1]}\\{m[2]}", text)
    return escaped + "\\" if escaped.endswith("\\") and not escaped.endswith("\\\\") else escaped


# Escaped: typer renders help as rich markup, which would eat the "[default: ...]" of each line.
_EPILOG = _escape_markup(settings_help(ClientSettings)).replace("\n", "\n\n")

flags_without_a_type()  # `--try`, not `--try <bool>`, in --help
app = typer.Typer(
    help="chronolock lockctl: run a command under a fair distributed lock, inspect locks, create the schema, "
    "show the settings.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # never print settings (passwords) in a traceback
    epilog=_EPILOG,
)


@app.callback()
def _options(version: Annotated[bool, version_option("lockctl")] = False) -> None:
    """--version, before any command."""


class Strategy(enum.StrEnum):
    SIMPLE = "SimpleStrategy"
    NETWORK_TOPOLOGY = "NetworkTopologyStrategy"


class LogFormat(enum.StrEnum):
    CONSOLE = "console"
    JSON = "json"


Verbose = Annotated[
    int,
    typer.Option("--verbose", "-v", count=True, help="Log more on stderr: -v info, -vv debug (default: warnings)."),
]
LogFormatOption = Annotated[LogFormat, typer.Option("--log-format", help="Format of lockctl's log lines on stderr.")]


# -- errors -------------------------------------------------------------------------------


def _say(message: str) -> None:
    typer.echo(f"lockctl: {redact(message)}", err=True)


def _fail(code: int, message: str) -> NoReturn:
    _say(message)
    raise typer.Exit(code)


@contextmanager
def _clear_errors() -> Iterator[None]:
    """Turn the library's errors into one clear line on stderr and a documented exit status."""
    try:
        yield
    except InvalidLockId as exc:
        _fail(EXIT_USAGE, f"error: {exc}")
    except ConfigurationError as exc:
        _fail(EXIT_CONFIG, f"configuration error: {exc}")
    except ValidationError as exc:
        _fail(
            EXIT_CONFIG,
            f"configuration error (CHRONOLOCK_* settings): {describe_validation_error(exc, ClientSettings)}",
        )
    except (StoreError, ClockError) as exc:
        _fail(EXIT_UNAVAILABLE, f"unavailable: {exc}")


def _check_seconds(name: str, value: float | None, *, positive: bool = False) -> None:
    if value is None:
        return
    if math.isnan(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        _fail(EXIT_USAGE, f"error: {name} must be {bound} seconds, got {value}")


def _setup_logging(verbose: int, log_format: LogFormat) -> None:
    level = "warning" if verbose <= 0 else ("info" if verbose == 1 else "debug")
    configure_logging(level, log_format.value)
    if verbose <= 0:
        # The driver logs every failed connection attempt with a traceback; lockctl reports the
        # outcome in one line (StoreUnavailable) instead. -v shows the driver's side of it.
        logging.getLogger("cassandra").setLevel(logging.CRITICAL)


# -- signals ------------------------------------------------------------------------------


class _SignalTrap:
    """Record SIGINT/SIGTERM/SIGHUP instead of dying, so the lock is always released.

    The handler only records the signal and sets ``event`` (also passed to ``get_lock``
    as its ``cancel``); the main loop does the work.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self.event = threading.Event()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalTrap:
        for sig in FORWARDED_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        self.event.set()

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


# -- run ------------------------------------------------------------------------------------


@app.command(epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def run(
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="Lock id: non-empty, at most 256 bytes, no control characters.")
    ],
    command: Annotated[
        list[str],
        typer.Argument(metavar="COMMAND", help="The command and its arguments, after --.", show_default=False),
    ],
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", "-w", help="Give up (exit 75) after waiting this many seconds. Default: wait."),
    ] = None,
    try_: Annotated[
        bool,
        typer.Option("--try", "-n", help="Do not wait: exit 75 at once if the lock is held or has waiters."),
    ] = False,
    conflict_exit_code: Annotated[
        int,
        typer.Option(
            "--conflict-exit-code",
            "-E",
            min=0,
            max=255,
            metavar="CODE",
            help="Exit status when the lock is busy (--try) or --timeout runs out, like flock -E.",
        ),
    ] = EXIT_BUSY,
    lease: Annotated[
        float | None,
        typer.Option("--lease", help="Lease length in seconds (default: CHRONOLOCK_LEASE)."),
    ] = None,
    kill_grace: Annotated[
        float | None,
        typer.Option(
            "--kill-grace",
            help=(
                "Seconds between SIGTERM and SIGKILL when the command's process group must stop (lock lost, "
                f"lease running out, leftovers after the command exits). kill-grace + {KILL_MARGIN:g} s must be "
                f"at most half the lease. Default: {DEFAULT_KILL_GRACE:g} s, or lease/2 - {KILL_MARGIN:g} s "
                "for leases under 5 s."
            ),
            show_default=False,
        ),
    ] = None,
    pass_secrets: Annotated[
        bool,
        typer.Option(
            "--pass-secrets",
            help="Let COMMAND inherit lockctl's secrets (Cassandra password, tokens, credentials in "
            "CHRONOLOCK_STORE_URL). Default: they are removed from its environment.",
        ),
    ] = False,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            metavar="N",
            help="Run under one of N permits of the semaphore NAME (up to N commands at once, first come, "
            "first served), not under the lock NAME.",
            show_default=False,
        ),
    ] = None,
    shared: Annotated[
        bool,
        typer.Option(
            "--shared",
            help="Run under a read lock of the read-write lock NAME: with other --shared commands, never with an "
            "--exclusive one; a waiting --exclusive command is not overtaken.",
        ),
    ] = False,
    exclusive: Annotated[
        bool, typer.Option("--exclusive", help="Run under the write lock of the read-write lock NAME (alone).")
    ] = False,
    max_readers: Annotated[
        int, typer.Option("--max-readers", metavar="N", help="Readers of the read-write lock at once, at most.")
    ] = 16,
    once_per: Annotated[
        str | None,
        typer.Option(
            "--once-per",
            metavar="DURATION",
            help="Run at most once per DURATION (e.g. 1h, 15m, 90s) across every host that fires this (cron): "
            "never waits; exit 0 without running if the job ran within DURATION - tolerance of global time, "
            "or runs now. Judged by global time, never a host's clock.",
            show_default=False,
        ),
    ] = None,
    tolerance: Annotated[
        str | None,
        typer.Option(
            "--tolerance",
            metavar="DURATION",
            help="With --once-per: how far apart the hosts' firings of one period may be (default min(period/4, "
            "60s); at most period/2). Runs start at least period - tolerance apart.",
            show_default=False,
        ),
    ] = None,
    label: Annotated[
        str | None,
        typer.Option(
            "--label",
            metavar="TEXT",
            help="Label shown with the holder by lockctl list / status and leasewatch (at most 200 bytes). "
            "Default: 'lockctl run: COMMAND ARGS...', shortened to fit.",
            show_default=False,
        ),
    ] = None,
    verbose: Verbose = 0,
    log_format: LogFormatOption = LogFormat.CONSOLE,
) -> None:
    """Run COMMAND while holding lock NAME, like flock(1): lockctl run NAME -- COMMAND [ARGS]...

    COMMAND gets CHRONOLOCK_LOCK_ID, CHRONOLOCK_FENCING_TOKEN and CHRONOLOCK_LOCK_OWNER in its environment,
    and not lockctl's secrets (unless --pass-secrets).

    COMMAND runs in its own process group. If lockctl dies, the group is killed at once; when COMMAND
    exits, processes it left in the group are terminated before the lock is released; if the lease is
    not renewed, the group is terminated before the lease can run out. A paused lockctl is covered only
    by the fencing token, and processes that leave the group (setsid, daemons) are not covered.

    With --limit N, --shared / --exclusive or --once-per DURATION, COMMAND runs under a semaphore's permit, a
    read or write lock, or a once-per-period hold instead (examples: lockctl run --limit 3 db-pool -- ./backup.sh;
    lockctl run --shared catalog -- ./read-catalog.sh; lockctl run --once-per 1h nightly -- ./report.sh from cron
    on every host).

    Exit status: COMMAND's own (128+N if killed by signal N);
    0 without running COMMAND: --once-per found the job done (or running) for this period;
    75 (or -E CODE) lock busy (--try) or --timeout ran out;
    70 lock lost or lease running out while COMMAND ran (COMMAND was terminated);
    69 store unavailable; 2 bad usage (also --kill-grace too long for the lease); 78 bad or unknown CHRONOLOCK_*
    settings, no CHRONOLOCK_STORE_URL, or a store that cannot be written;
    126/127 COMMAND not executable/not found;
    128+N lockctl received signal N (forwarded to COMMAND's process group, lock released).
    """
    _setup_logging(verbose, log_format)
    metrics.record_nothing()  # lockctl exposes no /metrics: never import prometheus_client
    with _clear_errors():
        # First: a misspelt CHRONOLOCK_* variable or a missing store URL stops lockctl (exit 78)
        # before it takes a lock in a store nobody else uses.
        settings = ClientSettings()
        validate_lock_id(name)
    _check_seconds("--timeout", timeout)
    _check_seconds("--lease", lease, positive=True)
    if lease is not None and not math.isfinite(lease):
        _fail(EXIT_USAGE, f"error: --lease must be a finite number of seconds, got {lease}")
    _check_seconds("--kill-grace", kill_grace)
    if kill_grace is not None and not math.isfinite(kill_grace):
        _fail(EXIT_USAGE, f"error: --kill-grace must be a finite number of seconds, got {kill_grace}")
    if try_ and timeout is not None:
        _fail(EXIT_USAGE, "error: --try and --timeout exclude each other (--try never waits)")
    if not command:
        _fail(EXIT_USAGE, "error: no command given: lockctl run NAME -- COMMAND [ARGS]...")
    how = _run_kind(limit, shared, exclusive, max_readers, once_per, tolerance, try_=try_, timeout=timeout)
    if label is None:
        label = shorten_label(f"lockctl run: {shlex.join(command)}")
    else:
        try:
            check_label(label)
        except ValueError as exc:
            _fail(EXIT_USAGE, f"error: --label: {exc}")

    from lockclient.locker import RemoteLocker

    if lease is None:
        effective_lease = settings.lease
        source = f"{effective_lease:g} s from CHRONOLOCK_LEASE"
    else:
        effective_lease, source = lease, f"--lease {lease:g}"
    if kill_grace is None:
        kill_grace = default_kill_grace(effective_lease)
        if kill_grace < 0:
            _fail(
                EXIT_USAGE,
                f"error: a {effective_lease:g} s lease is too short for lockctl run: the command must be dead "
                f"{KILL_MARGIN:g} s before the lease can run out and termination may start only when less than "
                f"half of the lease is left, so the lease must be at least {2 * KILL_MARGIN:g} s [lease: {source}]",
            )
    problem = kill_grace_problem(kill_grace, effective_lease)
    if problem is not None:
        _fail(EXIT_USAGE, f"error: {problem} [lease: {source}]")

    overrides: dict[str, Any] = {} if lease is None else {"lease": lease}
    with _SignalTrap() as trap:
        with _clear_errors():
            locker = RemoteLocker.from_env(**overrides)
        try:
            code = _run_locked(
                locker,
                name,
                command,
                trap,
                timeout=timeout,
                try_=try_,
                kill_grace=kill_grace,
                pass_secrets=pass_secrets,
                conflict_exit_code=conflict_exit_code,
                verbose=verbose > 0,
                how=how,
                label=label,
            )
        finally:
            locker.close()
    raise typer.Exit(code)


def _run_kind(
    limit: int | None,
    shared: bool,
    exclusive: bool,
    max_readers: int,
    once_per: str | None,
    tolerance: str | None,
    *,
    try_: bool,
    timeout: float | None,
) -> RunKind:
    """``run``'s --limit / --shared / --exclusive / --once-per, checked (exit 2 when they cannot go together)."""
    try:
        period = None if once_per is None else parse_duration(once_per)
        slack = None if tolerance is None else parse_duration(tolerance)
    except ValueError as exc:
        _fail(EXIT_USAGE, f"error: {exc}")
    how = RunKind(limit, shared, exclusive, max_readers, period, slack)
    problem = how.problem(try_=try_, timeout=timeout)
    if problem is not None:
        _fail(EXIT_USAGE, f"error: {problem}")
    return how


def _run_locked(
    locker: RemoteLocker,
    name: str,
    command: list[str],
    trap: _SignalTrap,
    *,
    timeout: float | None,
    try_: bool,
    kill_grace: float,
    pass_secrets: bool = False,
    conflict_exit_code: int = EXIT_BUSY,
    verbose: bool = False,
    how: RunKind | None = None,
    label: str | None = None,
) -> int:
    lock: RemoteLock | None
    started = time.monotonic()
    progress = _Progress(locker, name) if verbose and not try_ else None
    with _clear_errors():
        try:
            if how is not None and (how.kind != "lock" or how.once_per is not None):
                lock = how.acquire(locker, name, timeout=timeout, try_=try_, cancel=trap.event, label=label)
                if lock is None and how.once_per is not None:
                    logging.getLogger("lockctl").info(
                        "once-per: %r ran within the last %gs of global time, or runs now: skipped", name, how.min_hold
                    )
                    return 0
                if lock is None:
                    _fail(conflict_exit_code, f"{how.describe(name)} is busy; not waiting (--try)")
            elif try_:
                lock = locker.try_get_lock(name, label=label)
                if lock is None:
                    _fail(conflict_exit_code, f"lock {name!r} is busy (held or awaited); not waiting (--try)")
            else:
                if progress is not None:
                    progress.start()
                try:
                    lock = locker.get_lock(name, timeout, cancel=trap.event, label=label)
                finally:
                    if progress is not None:
                        progress.stop()
        except LockTimeout:
            what = how.describe(name) if how is not None else f"lock {name!r}"
            _fail(conflict_exit_code, f"timed out after {timeout:g} s waiting for {what}")
        except LockCancelled:
            sig = trap.first or signal.SIGTERM
            _fail(128 + sig, f"{_signal_name(sig)} while waiting for lock {name!r}; nothing was run")
    if verbose:
        _say(
            f"lock {name!r}: acquired after {time.monotonic() - started:.2f} s, fencing token "
            f"{lock.fencing_token}; running {command[0]}"
        )
    try:
        if trap.first is not None:  # a signal arrived just as we acquired
            _say(f"{_signal_name(trap.first)} received; the command was not started")
            return 128 + trap.first
        return _supervise(lock, command, trap, kill_grace, pass_secrets=pass_secrets)
    finally:
        lock.release()  # never raises for the store: a release it could not finish goes on in the background
        if verbose:
            _say(f"lock {name!r}: released")
        if lock.cleanup_pending:
            _say(
                f"warning: the store did not answer the release of lock {name!r}; retrying for a few seconds "
                "before exiting (if that fails too, leasewatch clears it after the lease)"
            )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def queue_position(status: LockStatus, owner_prefix: str) -> str | None:
    """Where the acquisition whose owner starts with ``owner_prefix`` stands, in words —
    ``waiting behind vm.12.MainThread.a1b2 (the holder), 1st in line`` — or None if its queue
    cell is not there (not queued yet, or granted)."""
    queue = status.queue
    mine = next((i for i, entry in enumerate(queue) if entry.owner.startswith(owner_prefix)), None)
    if mine is None or queue[mine].owner in status.holders:
        return None
    waiters_ahead = sum(1 for entry in queue[:mine] if entry.owner not in status.holders)
    place = f"{_ordinal(waiters_ahead + 1)} in line"
    if mine == 0:
        return f"{place}; nobody holds the lock (taking it)"
    ahead = queue[mine - 1].owner
    return f"waiting behind {ahead}{' (the holder)' if ahead in status.holders else ''}, {place}"


class _Progress:
    """``lockctl run -v``: where this run stands in the lock's queue, in words, each time it changes
    (read with :meth:`RemoteLocker.status` once a second on a thread of its own; the acquisition
    itself is lockctl's only one, in its main thread, so its owner starts with ``host.pid.``)."""

    INTERVAL = 1.0

    def __init__(self, locker: RemoteLocker, name: str) -> None:
        from lockclient.runtime.threads import host_name

        self._locker = locker
        self._name = name
        self._prefix = f"{host_name()}.{os.getpid()}."
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lockctl-progress", daemon=True)
        self._last: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        # The first look after a moment: an uncontended acquisition is over by then, and says nothing.
        wait = 0.2
        while not self._stop.wait(wait):
            wait = self.INTERVAL
            try:
                where = queue_position(self._locker.status(self._name), self._prefix)
            except Exception:  # noqa: S112 - a progress line is never worth failing the run for
                continue
            if where is not None and where != self._last and not self._stop.is_set():
                self._last = where
                _say(f"lock {self._name!r}: {where}")


def child_environment(environ: dict[str, str], *, pass_secrets: bool = False) -> dict[str, str]:
    """The environment COMMAND gets: lockctl's, without the secrets of any chronolock component
    (the Cassandra password, leasewatch and timesvc tokens) and without credentials in
    ``CHRONOLOCK_STORE_URL`` — unless ``pass_secrets``. COMMAND is someone else's program:
    it needs the lock, not the right to rewrite every lock's cells."""
    env = dict(environ)
    if pass_secrets:
        return env
    # The library never imports the services: their secret names are listed in
    # SERVICE_SECRET_ENV (a test keeps the list equal to what their settings classes read).
    secrets = secret_env_names(StoreSettings) | secret_env_names(ClientSettings) | SERVICE_SECRET_ENV
    for name in secrets:
        env.pop(name, None)
    url = env.get("CHRONOLOCK_STORE_URL")
    if url is not None:
        env["CHRONOLOCK_STORE_URL"] = strip_url_credentials(url)
    return env


def _supervise(
    lock: RemoteLock,
    command: list[str],
    trap: _SignalTrap,
    kill_grace: float,
    *,
    pass_secrets: bool = False,
    extra_env: dict[str, str] | None = None,
) -> int:
    """Run the command under supervision (lockclient.supervisor); return lockctl's exit status."""
    refusal = _why_not_start(lock, kill_grace)
    if refusal is not None:
        _say(refusal)
        return EXIT_LOCK_LOST
    env = child_environment(dict(os.environ), pass_secrets=pass_secrets)
    name = getattr(lock, "name", lock.lock_id)  # a semaphore's or read-write lock's name, not its row
    env.update(
        CHRONOLOCK_LOCK_ID=name,
        CHRONOLOCK_FENCING_TOKEN=str(lock.fencing_token),
        CHRONOLOCK_LOCK_OWNER=lock.owner,
        CHRONOLOCK_LOCK_KIND=getattr(lock, "kind", "lock"),
    )
    env.update(extra_env or {})

    def say(message: str) -> None:
        _say(f"lock {lock.lock_id!r}: {message}")

    try:
        outcome = run_supervised(lock, command, env, kill_grace=kill_grace, received=trap.received, say=say)
    except (SupervisionError, subprocess.SubprocessError, OSError) as exc:
        code, message = _start_failure(command[0], exc)
        _say(message)
        return code
    if outcome.lease_ended:
        _say(
            f"lost lock {lock.lock_id!r} (or its lease was about to run out) while the command ran "
            f"({lock.lost_reason or 'not renewed in time'}); the command ended with status {outcome.status}"
        )
        return EXIT_LOCK_LOST
    if trap.first is not None:
        return 128 + trap.first
    return outcome.status


def _why_not_start(lock: RemoteLock, kill_grace: float) -> str | None:
    if lock.lost.is_set():
        return f"lost lock {lock.lock_id!r} before the command started ({lock.lost_reason}); not running it"
    left = lock.valid_until - time.monotonic()
    if left <= kill_grace + KILL_MARGIN:
        # Only when the store is failing: the command would be terminated as soon as it started.
        return (
            f"the lease of lock {lock.lock_id!r} runs out in {max(left, 0):.2f} s and was not renewed; "
            "not running the command"
        )
    return None


def _start_failure(program: str, exc: Exception) -> tuple[int, str]:
    if isinstance(exc, SupervisionError):
        return EXIT_CANNOT_EXECUTE, f"not running {program}: {exc}"
    if isinstance(exc, FileNotFoundError):
        return EXIT_NOT_FOUND, f"{program}: command not found"
    if isinstance(exc, OSError):
        return EXIT_CANNOT_EXECUTE, f"{program}: cannot execute: {exc.strerror or exc}"
    return EXIT_CANNOT_EXECUTE, f"{program}: cannot start it under supervision: {exc}"


# -- status ---------------------------------------------------------------------------------


def _iso(us: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)).isoformat(timespec="microseconds")


def _status_dict(status: LockStatus) -> dict[str, Any]:
    from lockclient.lockid import ticket_time

    return {
        "lock_id": status.lock_id,
        "held": bool(status.holders),
        "holders": list(status.holders),
        "fencing_token": status.fencing_token,
        "fencing_owner": status.fencing_owner or None,
        "queue": [
            {
                "position": position,
                "owner": entry.owner,
                "ticket": entry.ticket,
                "enqueued_us": entry.enqueued_us,
                "enqueued_at": _iso(entry.enqueued_us),
                "label": entry.label or None,
            }
            for position, entry in enumerate(status.queue)
        ],
        "leases": [
            {
                "owner": owner,
                "version": record.version,
                "lease": record.lease,
                "holding": record.holding or owner in status.holders,
                "ticket": record.ticket,
                "enqueued_at": _iso(ticket_time(record.ticket)) if record.ticket[:1].isdigit() else None,
                "label": record.label or None,
                "payload": record.payload or None,
            }
            for owner, record in sorted(status.leases.items())
        ],
    }


def _print_status(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("lock", Text(data["lock_id"]))
    holders = data["holders"]
    summary.add_row("holder", Text(", ".join(holders)) if holders else Text("none (free)", style="green"))
    for record in data["leases"]:
        if record["holding"] and record["label"]:
            summary.add_row("label", Text(record["label"]))
        if record["holding"] and record["payload"]:
            summary.add_row("payload", Text(record["payload"]))
    token = data["fencing_token"]
    if token:
        summary.add_row("fencing token", Text(f"{token} (taken by {data['fencing_owner'] or '?'})"))
    else:
        summary.add_row("fencing token", Text("0 (never acquired)"))
    console.print(summary)

    queue = Table(title="queue (first come, first served)", title_justify="left")
    queue.add_column("#", justify="right")
    queue.add_column("ticket time (UTC)")
    queue.add_column("owner")
    queue.add_column("label")
    for entry in data["queue"]:
        queue.add_row(str(entry["position"]), entry["enqueued_at"], Text(entry["owner"]), Text(entry["label"] or ""))
    if not data["queue"]:
        queue.add_row("", "empty", "", "")
    console.print(queue)

    leases = Table(title="lease records", title_justify="left")
    leases.add_column("owner")
    leases.add_column("version", justify="right")
    leases.add_column("lease (s)", justify="right")
    leases.add_column("holding")
    for record in data["leases"]:
        leases.add_row(
            Text(record["owner"]), str(record["version"]), f"{record['lease']:g}", "yes" if record["holding"] else "no"
        )
    if not data["leases"]:
        leases.add_row("none", "", "", "")
    console.print(leases)


@app.command(epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def status(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Lock id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    verbose: Verbose = 0,
    log_format: LogFormatOption = LogFormat.CONSOLE,
) -> None:
    """Show a lock's holder(s), fencing token, queue in order and lease records."""
    _setup_logging(verbose, log_format)
    metrics.record_nothing()
    from lockclient.locker import RemoteLocker

    with _clear_errors():
        validate_lock_id(name)
        locker = RemoteLocker.from_env()
        try:
            data = _status_dict(locker.status(name))
        finally:
            locker.close()
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        _print_status(data)


# -- schema ---------------------------------------------------------------------------------


@app.command(epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def schema(
    replication_factor: Annotated[
        int, typer.Option("--replication-factor", min=1, help="Replicas per datacenter (Cassandra).")
    ] = 1,
    strategy: Annotated[
        Strategy, typer.Option("--strategy", help="Keyspace replication strategy (Cassandra).")
    ] = Strategy.SIMPLE,
    datacenter: Annotated[
        str | None,
        typer.Option("--datacenter", help="Datacenter for NetworkTopologyStrategy (default: the URL's dc option)."),
    ] = None,
    gc_grace_seconds: Annotated[
        int | None,
        typer.Option(
            "--gc-grace-seconds",
            help="Tombstone grace of every table (Cassandra); no lower than the hint window and repair interval.",
        ),
    ] = None,
    grant_to: Annotated[
        list[str] | None,
        typer.Option(
            "--grant-to",
            metavar="ROLE",
            help="Grant this client role SELECT and MODIFY on the keyspace — all a lock client, timesvc or "
            "leasewatch needs (Cassandra; repeatable). Run as the schema role (lockctl roles).",
        ),
    ] = None,
    verbose: Verbose = 0,
    log_format: LogFormatOption = LogFormat.CONSOLE,
) -> None:
    """Create the store's schema if missing (idempotent). The store comes from CHRONOLOCK_STORE_URL."""
    _setup_logging(verbose, log_format)
    from lockclient.store.url import parse_store_url

    with _clear_errors():
        settings = ClientSettings()
        url = parse_store_url(settings.store_url)
        if url.scheme == "sqlite":
            if grant_to:
                _fail(EXIT_USAGE, "error: --grant-to needs a Cassandra store (SQLite has no roles)")
            store = settings.open_store()
            store.close()
            typer.echo(f"SQLite store {url.redacted()}: tables are created when the store is opened; ready.")
            return
        if strategy is Strategy.NETWORK_TOPOLOGY and not (datacenter or url.options.get("dc")):
            _fail(EXIT_USAGE, "error: --strategy NetworkTopologyStrategy needs --datacenter (or ?dc= in the URL)")
        from lockclient.store.cassandra_schema import SCHEMA_VERSION, create_schema

        password = settings.cassandra_password.get_secret_value() if settings.cassandra_password else None
        extra: dict[str, Any] = {} if gc_grace_seconds is None else {"gc_grace_seconds": gc_grace_seconds}
        try:
            statements = create_schema(
                settings.store_url,
                replication_factor=replication_factor,
                strategy=strategy.value,
                datacenter=datacenter,
                username=settings.cassandra_username,
                password=password,
                tls=settings.tls(),
                grant_to=tuple(grant_to or ()),
                **extra,
            )
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("cassandra"):
                raise
            raise ConfigurationError(
                "the Cassandra store needs cassandra-driver: pip install 'chronolock[cassandra]'"
            ) from exc
    for statement in statements:
        typer.echo(f"{statement};")
    typer.echo(f"-- chronolock schema version {SCHEMA_VERSION} on {url.redacted()}: {len(statements)} statements")


def _read_secret_file(option: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError as exc:
        _fail(EXIT_USAGE, f"error: cannot read {option} {path}: {exc.strerror or exc}")


@app.command(epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def roles(
    schema_role: Annotated[
        str, typer.Option("--schema-role", help="Role for `lockctl schema`: CREATE ON ALL KEYSPACES only.")
    ] = "chronolock_schema",
    schema_password_file: Annotated[
        str, typer.Option("--schema-password-file", metavar="FILE", help="File holding the schema role's password.")
    ] = "",
    client_role: Annotated[
        str,
        typer.Option("--client-role", help="Role for clients, timesvc and leasewatch (no permissions until granted)."),
    ] = "chronolock",
    client_password_file: Annotated[
        str, typer.Option("--client-password-file", metavar="FILE", help="File holding the client role's password.")
    ] = "",
    verbose: Verbose = 0,
    log_format: LogFormatOption = LogFormat.CONSOLE,
) -> None:
    """Create (or update) the schema role and the client role, neither a superuser (Cassandra 2.2+).

    Run once with an administrator's login (CHRONOLOCK_CASSANDRA_USERNAME/PASSWORD); then run
    `lockctl schema --grant-to CLIENT_ROLE` as the schema role, and everything else as the client
    role, which can only SELECT and MODIFY the keyspace. Passwords are read from files (Secrets
    mounted as files), never from the command line; each needs at least 16 characters.
    """
    _setup_logging(verbose, log_format)
    if not schema_password_file or not client_password_file:
        _fail(EXIT_USAGE, "error: --schema-password-file and --client-password-file are required")
    schema_password = _read_secret_file("--schema-password-file", schema_password_file)
    client_password = _read_secret_file("--client-password-file", client_password_file)
    with _clear_errors():
        settings = ClientSettings()
        from lockclient.store.url import parse_store_url

        url = parse_store_url(settings.store_url)
        if url.scheme != "cassandra":
            _fail(EXIT_USAGE, "error: roles need a Cassandra store (CHRONOLOCK_STORE_URL=cassandra://...)")
        from lockclient.store.cassandra_schema import create_roles

        password = settings.cassandra_password.get_secret_value() if settings.cassandra_password else None
        statements = create_roles(
            settings.store_url,
            schema_role=schema_role,
            schema_password=schema_password,
            client_role=client_role,
            client_password=client_password,
            username=settings.cassandra_username,
            password=password,
            tls=settings.tls(),
        )
    for statement in statements:
        typer.echo(f"{statement};")
    typer.echo(f"-- roles {schema_role} (schema) and {client_role} (client) on {url.redacted()}")


# -- settings -------------------------------------------------------------------------------


@app.command("settings", epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def settings_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: variable name -> value.")] = False,
) -> None:
    """Print the settings lockctl (and RemoteLocker.from_env()) would use, and where each came from.

    Secrets are masked and the store URL is shown without credentials. Exit 78, naming the problem, if
    a setting is invalid, CHRONOLOCK_STORE_URL is missing or a CHRONOLOCK_* / TIMESVC_* / LEASEWATCH_*
    variable is misspelt.
    """
    with _clear_errors():
        current = ClientSettings()
    typer.echo(settings_report(current, program="lockctl", as_json=as_json))


# `lockctl elect` and `lockctl watch` (issue 26) live in their own module; importing it registers them.
# `lockctl list` and `lockctl revoke` (issue 25) too.
from lockclient import cli_admin as _cli_admin  # noqa: E402, F401
from lockclient import cli_primitives as _cli_primitives  # noqa: E402, F401


def main() -> None:
    guarded_main(app, program="lockctl", settings_cls=ClientSettings)


if __name__ == "__main__":
    main()
