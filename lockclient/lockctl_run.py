"""``lockctl run`` itself, without typer: and the fast path that starts it (issue 25, item 3).

:mod:`lockclient.cli` is lockctl's typer application: ``--help``, every command, every usage
error. Building it costs more than everything ``lockctl run NAME -- true`` does — importing
typer and pydantic-settings and turning each command's signature into click parameters (a
pydantic ``TypeAdapter`` per option) took ~200 ms of CPU, against a target of ``python -c
pass`` + 150 ms + the store's round trips. So the ``lockctl`` console script tries
:func:`fast_main` first: it reads ``run``'s arguments with :func:`parse_run_args` and the
settings with :func:`lockclient.clientenv.read_client_env`, and runs :func:`run_command` — the
very function the typer command calls. Both readers only ever *accept*: on anything they are not
certain of — ``--help``, an unknown or repeated option, a value outside its plain form, a
problem with the settings, a missing ``[cli]`` extra — they answer ``None`` and lockctl runs the
typer application as before, which prints the help or refuses with its own words and exit
status. What typer would accept, these read identically (``tests/cli/test_fast_path.py``
compares them on generated command lines and environments).

Exit statuses are :mod:`lockclient.cli`'s table; :func:`run_command` raises ``SystemExit`` with
them (under typer it passes through click unchanged).
"""

from __future__ import annotations

import enum
import errno
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, NoReturn

from lockclient import metrics
from lockclient.clientenv import CLIENT_SECRET_ENV
from lockclient.environment import SERVICE_SECRET_ENV
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
from lockclient.supervisor import (
    KILL_MARGIN,
    SupervisionError,
    default_kill_grace,
    kill_grace_problem,
    run_supervised,
)

if TYPE_CHECKING:
    from lockclient.clientenv import ClientConfig
    from lockclient.locker import LockStatus, RemoteLock, RemoteLocker

__all__ = [
    "EXIT_BUSY",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_CONFIG",
    "EXIT_LOCK_LOST",
    "EXIT_NOT_FOUND",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "LogFormat",
    "child_environment",
    "fast_main",
    "parse_run_args",
    "queue_position",
    "run_command",
]

EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE
EXIT_LOCK_LOST = 70  # EX_SOFTWARE: the command ran (partly) without the lock
EXIT_BUSY = 75  # EX_TEMPFAIL, like `flock -n` on a conflict
EXIT_CONFIG = 78  # EX_CONFIG
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class LogFormat(enum.StrEnum):
    CONSOLE = "console"
    JSON = "json"


# -- errors -------------------------------------------------------------------------------


_ANSI = re.compile(r"\033\[[;?0-9]*[a-zA-Z]")


def _say(message: str) -> None:
    """One line on stderr, as ``typer.echo(..., err=True)`` writes it (colour codes dropped when
    stderr is not a terminal; flushed)."""
    line = f"lockctl: {redact(message)}\n"
    stream = sys.stderr
    if stream is None:
        return
    if not stream.isatty():
        line = _ANSI.sub("", line)
    stream.write(line)
    stream.flush()


def _fail(code: int, message: str) -> NoReturn:
    _say(message)
    # SystemExit, not typer.Exit: this module runs without typer (lockctl run's fast path); under
    # typer it passes through click to the same exit status.
    raise SystemExit(code)


@contextmanager
def _clear_errors() -> Iterator[None]:
    """Turn the library's errors into one clear line on stderr and a documented exit status."""
    try:
        yield
    except InvalidLockId as exc:
        _fail(EXIT_USAGE, f"error: {exc}")
    except ConfigurationError as exc:
        _fail(EXIT_CONFIG, f"configuration error: {exc}")
    except (StoreError, ClockError) as exc:
        _fail(EXIT_UNAVAILABLE, f"unavailable: {exc}")
    except Exception as exc:
        from lockclient.entrypoint import describe_validation_error, is_validation_error

        if not is_validation_error(exc):  # (pydantic is not imported to tell: the fast path never loads it)
            raise
        from lockclient.settings import ClientSettings

        _fail(
            EXIT_CONFIG,
            f"configuration error (CHRONOLOCK_* settings): {describe_validation_error(exc, ClientSettings)}",
        )


def _check_seconds(name: str, value: float | None, *, positive: bool = False) -> None:
    if value is None:
        return
    if math.isnan(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        _fail(EXIT_USAGE, f"error: {name} must be {bound} seconds, got {value}")


def _setup_logging(verbose: int, log_format: str) -> None:
    level = "warning" if verbose <= 0 else ("info" if verbose == 1 else "debug")
    configure_logging(level, str(log_format))
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


def run_command(
    name: str,
    command: list[str],
    *,
    read_settings: Callable[[], ClientConfig],
    timeout: float | None = None,
    try_: bool = False,
    conflict_exit_code: int = EXIT_BUSY,
    lease: float | None = None,
    kill_grace: float | None = None,
    pass_secrets: bool = False,
    limit: int | None = None,
    shared: bool = False,
    exclusive: bool = False,
    max_readers: int = 16,
    once_per: str | None = None,
    tolerance: str | None = None,
    label: str | None = None,
    verbose: int = 0,
    log_format: str = LogFormat.CONSOLE,
) -> NoReturn:
    """``lockctl run`` with its arguments parsed (by typer, or by :func:`parse_run_args`): ends in
    ``SystemExit`` with the documented status. ``read_settings``: ``ClientSettings`` under typer,
    the values :func:`lockclient.clientenv.read_client_env` read on the fast path."""
    _setup_logging(verbose, log_format)
    metrics.record_nothing()  # lockctl exposes no /metrics: never import prometheus_client
    with _clear_errors():
        # First: a misspelt CHRONOLOCK_* variable or a missing store URL stops lockctl (exit 78)
        # before it takes a lock in a store nobody else uses.
        settings = read_settings()
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
            locker = RemoteLocker.from_settings(settings, **overrides)
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
    raise SystemExit(code)


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
    secrets = CLIENT_SECRET_ENV | SERVICE_SECRET_ENV
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


# -- the fast path --------------------------------------------------------------------------

# run's options as typer declares them (lockclient.cli.run): option -> (parameter, kind).
# Kinds: flag (True when given), count (-v), float, int, code (0..255), str, format.
_OPTIONS: Final[dict[str, tuple[str, str]]] = {
    "--timeout": ("timeout", "float"),
    "-w": ("timeout", "float"),
    "--try": ("try_", "flag"),
    "-n": ("try_", "flag"),
    "--conflict-exit-code": ("conflict_exit_code", "code"),
    "-E": ("conflict_exit_code", "code"),
    "--lease": ("lease", "float"),
    "--kill-grace": ("kill_grace", "float"),
    "--pass-secrets": ("pass_secrets", "flag"),
    "--limit": ("limit", "int"),
    "--shared": ("shared", "flag"),
    "--exclusive": ("exclusive", "flag"),
    "--max-readers": ("max_readers", "int"),
    "--once-per": ("once_per", "str"),
    "--tolerance": ("tolerance", "str"),
    "--label": ("label", "str"),
    "--verbose": ("verbose", "count"),
    "-v": ("verbose", "count"),
    "--log-format": ("log_format", "format"),
}
_SHORT_FLAGS: Final = frozenset({"n", "v"})
_PLAIN_FLOAT: Final = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")
_PLAIN_INT: Final = re.compile(r"0|[1-9][0-9]{0,8}")


class _NotSure(Exception):
    """An argument the fast path does not read: typer does."""


def _converted(kind: str, raw: str) -> object:
    if kind == "float":
        if _PLAIN_FLOAT.fullmatch(raw) is None:
            raise _NotSure
        return float(raw)
    if kind in ("int", "code"):
        if _PLAIN_INT.fullmatch(raw) is None:
            raise _NotSure
        number = int(raw)
        if kind == "code" and number > 255:
            raise _NotSure  # typer's range error
        return number
    if kind == "format":
        if raw not in (LogFormat.CONSOLE.value, LogFormat.JSON.value):
            raise _NotSure
        return LogFormat(raw)
    return raw  # str


def parse_run_args(args: Sequence[str]) -> tuple[str, list[str], dict[str, Any]] | None:
    """``lockctl run``'s arguments (after ``run``) as typer reads them — NAME, COMMAND and the
    options given — or None if they hold anything but the plain forms: options (``--timeout 5``,
    ``--timeout=5``, ``-w 5``, ``-w5``, ``-nv``) anywhere before ``--``, positional arguments
    (NAME, then COMMAND), ``--``, then COMMAND's arguments. None for ``--help``, an unknown,
    repeated or clustered option with a value, a value that is not plainly a number, a choice or
    a word (a value starting with ``-``), and a missing NAME or COMMAND: typer decides those."""
    positional: list[str] = []
    options: dict[str, Any] = {}
    given: set[str] = set()
    i = 0
    try:
        while i < len(args):
            arg = args[i]
            i += 1
            if arg == "--":
                positional.extend(args[i:])
                break
            if not arg.startswith("-") or arg == "-":
                positional.append(arg)
                continue
            if arg.startswith("--"):
                option, equals, inline = arg.partition("=")
                spec = _OPTIONS.get(option)
                if spec is None:
                    raise _NotSure
                parameter, kind = spec
                if kind in ("flag", "count"):
                    if equals:
                        raise _NotSure  # `--try=...`: typer's error
                    options[parameter] = options.get(parameter, 0) + 1 if kind == "count" else True
                    continue
                if equals:
                    raw = inline
                elif i < len(args):
                    raw = args[i]
                    i += 1
                else:
                    raise _NotSure  # typer: the option needs a value
            else:
                letters = arg[1:]
                spec = _OPTIONS.get(arg[:2])
                if spec is None:
                    raise _NotSure
                parameter, kind = spec
                if kind in ("flag", "count"):
                    if not set(letters) <= _SHORT_FLAGS:
                        raise _NotSure  # a cluster with an option taking a value, or an unknown letter
                    for letter in letters:
                        flag_parameter, flag_kind = _OPTIONS[f"-{letter}"]
                        if flag_kind == "count":
                            options[flag_parameter] = options.get(flag_parameter, 0) + 1
                        else:
                            options[flag_parameter] = True
                    continue
                if len(letters) > 1:
                    raw = letters[1:]
                elif i < len(args):
                    raw = args[i]
                    i += 1
                else:
                    raise _NotSure
            if parameter in given or raw.startswith("-"):
                raise _NotSure  # given twice, or a value that looks like an option: typer's reading
            given.add(parameter)
            options[parameter] = _converted(kind, raw)
    except _NotSure:
        return None
    if len(positional) < 2:
        return None  # typer: missing NAME or COMMAND
    return positional[0], positional[1:], options


def _cli_installed() -> bool:
    """The ``[cli]`` extra (typer, rich) is installed: lockctl is its command, fast path or not."""
    from importlib.util import find_spec

    return all(find_spec(name) is not None for name in ("typer", "rich"))


def fast_main(argv: Sequence[str]) -> None:
    """``lockctl run ...`` without typer when :func:`parse_run_args` and
    :func:`~lockclient.clientenv.read_client_env` both read it (ends in ``SystemExit``);
    returns without doing anything otherwise, and the caller runs the typer application."""
    if len(argv) < 2 or argv[0] != "run" or "_LOCKCTL_COMPLETE" in os.environ:
        return  # another command, or a shell-completion request (click's): typer's
    parsed = parse_run_args(argv[1:])
    if parsed is None or not _cli_installed():
        return
    from lockclient.clientenv import read_client_env

    settings = read_client_env()
    if settings is None:
        return
    name, command, options = parsed
    from lockclient.entrypoint import guarded_main

    def run() -> None:
        # As click runs a command: Ctrl-C before the signal trap is in place exits 130, and a
        # closed pipe on a standard stream 1.
        try:
            run_command(name, command, read_settings=lambda: settings, **options)
        except KeyboardInterrupt:
            raise SystemExit(130) from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise SystemExit(1) from None
            raise

    guarded_main(run, program="lockctl")
