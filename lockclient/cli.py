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
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lockclient import metrics
from lockclient.clihelp import flags_without_a_type
from lockclient.entrypoint import guarded_main
from lockclient.errors import ConfigurationError
from lockclient.lockctl_run import (  # noqa: F401 - the run machinery, re-exported for cli_admin and cli_primitives
    EXIT_BUSY,
    EXIT_CANNOT_EXECUTE,
    EXIT_CONFIG,
    EXIT_LOCK_LOST,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    FORWARDED_SIGNALS,
    LogFormat,
    _check_seconds,
    _clear_errors,
    _fail,
    _say,
    _setup_logging,
    _signal_name,
    _SignalTrap,
    _supervise,
    child_environment,
    queue_position,
    run_command,
)
from lockclient.lockid import validate_lock_id
from lockclient.settings import ClientSettings, settings_help, settings_report
from lockclient.supervisor import DEFAULT_KILL_GRACE, KILL_MARGIN
from lockclient.version import version_option

if TYPE_CHECKING:
    from lockclient.locker import LockStatus

__all__ = [
    "EXIT_BUSY",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_CONFIG",
    "EXIT_LOCK_LOST",
    "EXIT_NOT_FOUND",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "app",
    "child_environment",
    "main",
    "queue_position",
]


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


Verbose = Annotated[
    int,
    typer.Option("--verbose", "-v", count=True, help="Log more on stderr: -v info, -vv debug (default: warnings)."),
]
LogFormatOption = Annotated[LogFormat, typer.Option("--log-format", help="Format of lockctl's log lines on stderr.")]


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
    # The work is lockclient.lockctl_run's, shared with lockctl's fast path (which runs it without typer).
    run_command(
        name,
        command,
        read_settings=ClientSettings,
        timeout=timeout,
        try_=try_,
        conflict_exit_code=conflict_exit_code,
        lease=lease,
        kill_grace=kill_grace,
        pass_secrets=pass_secrets,
        limit=limit,
        shared=shared,
        exclusive=exclusive,
        max_readers=max_readers,
        once_per=once_per,
        tolerance=tolerance,
        label=label,
        verbose=verbose,
        log_format=log_format,
    )


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
