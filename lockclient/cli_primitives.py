"""``lockctl elect`` and ``lockctl watch`` (registered on :data:`lockclient.cli.app` when that module
is imported; ``run``'s ``--limit``, ``--shared``, ``--exclusive`` and ``--once-per`` are in
:mod:`lockclient.runkinds`).

``lockctl elect NAME -- CMD`` stands as a candidate of the election NAME and runs CMD only while it
leads, supervised exactly as ``lockctl run`` supervises a command under a lock
(:mod:`lockclient.supervisor`): CMD gets ``CHRONOLOCK_TERM`` (= ``CHRONOLOCK_FENCING_TOKEN``), is
killed with its process group if lockctl dies, and is terminated before the lease can run out (exit
70) if leadership is lost. One term per invocation: a service manager that restarts it
(``Restart=always``) makes it stand again.

``lockctl watch NAME`` prints what happens to a lock as lines of JSON (:mod:`lockclient.events`).
"""

from __future__ import annotations

import enum
import json
import math
import signal
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from lockclient.cli import (
    _EPILOG,
    LogFormatOption,
    Verbose,
    app,
)
from lockclient.errors import LockCancelled, LockTimeout
from lockclient.lockctl_run import (
    EXIT_BUSY,
    EXIT_USAGE,
    LogFormat,
    _check_seconds,
    _clear_errors,
    _fail,
    _setup_logging,
    _signal_name,
    _SignalTrap,
    _supervise,
)
from lockclient.lockid import validate_lock_id
from lockclient.settings import ClientSettings
from lockclient.supervisor import KILL_MARGIN, default_kill_grace, kill_grace_problem

if TYPE_CHECKING:
    from lockclient.locker import RemoteLocker

__all__ = ["elect", "watch"]


def _kill_grace(settings: ClientSettings, lease: float | None, kill_grace: float | None) -> float:
    """``run``'s rules for --lease and --kill-grace (exit 2 when they do not fit)."""
    _check_seconds("--lease", lease, positive=True)
    if lease is not None and not math.isfinite(lease):
        _fail(EXIT_USAGE, f"error: --lease must be a finite number of seconds, got {lease}")
    _check_seconds("--kill-grace", kill_grace)
    effective = settings.lease if lease is None else lease
    source = f"{effective:g} s from CHRONOLOCK_LEASE" if lease is None else f"--lease {lease:g}"
    if kill_grace is None:
        kill_grace = default_kill_grace(effective)
        if kill_grace < 0:
            _fail(
                EXIT_USAGE,
                f"error: a {effective:g} s lease is too short: the command must be dead {KILL_MARGIN:g} s before "
                f"the lease can run out, so the lease must be at least {2 * KILL_MARGIN:g} s [lease: {source}]",
            )
    problem = kill_grace_problem(kill_grace, effective)
    if problem is not None:
        _fail(EXIT_USAGE, f"error: {problem} [lease: {source}]")
    return kill_grace


@app.command(epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def elect(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Election name (the lock NAME).")],
    command: Annotated[
        list[str],
        typer.Argument(metavar="COMMAND", help="The command and its arguments, after --.", show_default=False),
    ],
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", "-w", help="Give up (exit 75) if not elected within this many seconds."),
    ] = None,
    lease: Annotated[float | None, typer.Option("--lease", help="Lease length in seconds.")] = None,
    kill_grace: Annotated[
        float | None,
        typer.Option(
            "--kill-grace", help="Seconds between SIGTERM and SIGKILL (as for lockctl run).", show_default=False
        ),
    ] = None,
    pass_secrets: Annotated[
        bool, typer.Option("--pass-secrets", help="Let COMMAND inherit lockctl's secrets (as for lockctl run).")
    ] = False,
    verbose: Verbose = 0,
    log_format: LogFormatOption = LogFormat.CONSOLE,
) -> None:
    """Run COMMAND only while leader of election NAME: lockctl elect NAME -- COMMAND [ARGS]...

    Candidates are elected first come, first served; a leader that dies or is cut off is replaced within the
    revocation bound (lease + grace + look period). COMMAND gets CHRONOLOCK_TERM (the term number, also in
    CHRONOLOCK_FENCING_TOKEN: pass it to what the leader writes, so a deposed leader's writes are refused),
    CHRONOLOCK_LOCK_ID and CHRONOLOCK_LOCK_OWNER, and is supervised like lockctl run's: its process group dies
    with lockctl, and is terminated before the lease can run out if leadership is lost. One term: when COMMAND
    exits, lockctl resigns and exits with COMMAND's status (restart it to stand again, e.g. systemd
    Restart=always).

    Example: lockctl elect scheduler -- ./scheduler --term "$CHRONOLOCK_TERM"

    Exit status: COMMAND's own (128+N if killed by signal N); 70 leadership lost while COMMAND ran (it was
    terminated); 75 not elected within --timeout; 69 store unavailable; 2 bad usage; 78 bad settings;
    126/127 COMMAND not executable/not found; 128+N lockctl received signal N.
    """
    _setup_logging(verbose, log_format)
    with _clear_errors():
        settings = ClientSettings()
        validate_lock_id(name)
    _check_seconds("--timeout", timeout)
    grace = _kill_grace(settings, lease, kill_grace)
    if not command:
        _fail(EXIT_USAGE, "error: no command given: lockctl elect NAME -- COMMAND [ARGS]...")
    from lockclient.locker import RemoteLocker

    overrides: dict[str, Any] = {} if lease is None else {"lease": lease}
    with _SignalTrap() as trap:
        with _clear_errors():
            locker = RemoteLocker.from_env(**overrides)
        try:
            code = _lead(locker, name, command, trap, timeout=timeout, kill_grace=grace, pass_secrets=pass_secrets)
        finally:
            locker.close()
    raise typer.Exit(code)


def _lead(
    locker: RemoteLocker,
    name: str,
    command: list[str],
    trap: _SignalTrap,
    *,
    timeout: float | None,
    kill_grace: float,
    pass_secrets: bool,
) -> int:
    election = locker.election(name)
    with _clear_errors():
        try:
            leadership = election.campaign(timeout, cancel=trap.event)
        except LockTimeout:
            _fail(EXIT_BUSY, f"not elected leader of {name!r} within {timeout:g} s")
        except LockCancelled:
            sig = trap.first or signal.SIGTERM
            _fail(128 + sig, f"{_signal_name(sig)} while standing for election {name!r}; nothing was run")
    try:
        if trap.first is not None:
            return 128 + trap.first
        env = {"CHRONOLOCK_TERM": str(leadership.term), "CHRONOLOCK_LOCK_KIND": "election"}
        return _supervise(leadership.lock, command, trap, kill_grace, pass_secrets=pass_secrets, extra_env=env)
    finally:
        leadership.resign()


class WatchKind(enum.StrEnum):
    LOCK = "lock"
    SEMAPHORE = "semaphore"
    RWLOCK = "rwlock"

    @property
    def value(self) -> Literal["lock", "semaphore", "rwlock"]:
        return self._value_


@app.command(epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def watch(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Lock (or semaphore, read-write lock) name.")],
    kind: Annotated[
        WatchKind, typer.Option("--kind", help="lock (also an election's), semaphore or rwlock.")
    ] = WatchKind.LOCK,
    count: Annotated[int | None, typer.Option("--count", "-c", min=1, help="Exit after this many events.")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", "-w", help="Exit after this many seconds.")] = None,
    poll: Annotated[float, typer.Option("--poll", help="Read the store at least this often (seconds).")] = 1.0,
    verbose: Verbose = 0,
    log_format: LogFormatOption = LogFormat.CONSOLE,
) -> None:
    """Print what happens to lock NAME as lines of JSON, until interrupted (or --count, --timeout).

    One object per event: "kind" is granted (owner, token), released, revoked, lost (the holder's lease ran
    out unrenewed), queue (the waiters now, in order) or behind (this watch missed the grant or end of the
    tokens in "missed": never a silent gap); "at" is when it was seen (this host's clock). The state found at
    the start comes first, marked "initial".

    Example: lockctl watch nightly-report | jq -c 'select(.kind == "revoked")'

    Exit status: 0 after --count events or --timeout, or on SIGINT/SIGTERM/SIGHUP; 69 store unavailable;
    2 bad usage; 78 bad settings.
    """
    _setup_logging(verbose, log_format)
    _check_seconds("--timeout", timeout)
    _check_seconds("--poll", poll, positive=True)
    with _clear_errors():
        ClientSettings()
        validate_lock_id(name)
    from lockclient.locker import RemoteLocker

    seen = 0
    with _SignalTrap() as trap, _clear_errors():
        locker = RemoteLocker.from_env()
        try:
            for event in locker.watch(name, kind=kind.value, poll=poll, timeout=timeout, cancel=trap.event):
                line = {"at": datetime.now(UTC).isoformat(timespec="microseconds"), **event.to_json()}
                sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
                sys.stdout.flush()
                seen += 1
                if count is not None and seen >= count:
                    break
        except BrokenPipeError:
            pass  # the reader went away (| head): nothing more to say
        finally:
            locker.close()
    raise typer.Exit(0)
