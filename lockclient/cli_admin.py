"""``lockctl list`` and ``lockctl revoke`` (registered on :data:`lockclient.cli.app` when that module
is imported): an operator's view of every lock, and the end of one holder.

Both read and write the store directly (:mod:`lockclient.admin`), so they work on the embedded
SQLite store with no leasewatch running, as on Cassandra with one: the lock index, the lease rows
and the queue rows are where every lock's state is. ``lockctl revoke`` ends a holder the way
leasewatch revokes a stale one (the same code: :func:`lockclient.admin.end_holder`), so it needs
nothing but the store access any lock client has; leasewatch's ``POST /revoke/{id}?token=N`` does
the same over HTTP, with an admin token and a record of who asked.
"""

from __future__ import annotations

import enum
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lockclient import metrics
from lockclient.cli import (
    _EPILOG,
    LogFormatOption,
    Verbose,
    app,
)
from lockclient.lockctl_run import (
    EXIT_USAGE,
    LogFormat,
    _clear_errors,
    _fail,
    _say,
    _setup_logging,
)
from lockclient.lockid import MAX_LOCK_ID_BYTES, primitive_row, validate_lock_id

if TYPE_CHECKING:
    from lockclient.admin import LockSummary

__all__ = ["EXIT_NOT_HOLDER", "list_command", "revoke"]

EXIT_NOT_HOLDER = 1
"""``lockctl revoke``: no current holder has the fencing token given; nothing was revoked."""


class Kind(enum.StrEnum):
    LOCK = "lock"
    SEMAPHORE = "semaphore"
    RWLOCK = "rwlock"


def _iso(us: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)).isoformat(timespec="milliseconds")


def _held_for(granted_us: int, now_us: int) -> float | None:
    return None if not granted_us else round(max(0.0, (now_us - granted_us) / 1e6), 3)


def _list_dict(summary: LockSummary, now_us: int) -> dict[str, Any]:
    return {
        "lock_id": summary.name,
        "kind": summary.kind,
        "row": summary.lock_id,
        "fencing_token": summary.fencing_token,
        "holders": [
            {
                "owner": h.owner,
                "label": h.label or None,
                "payload": h.payload or None,
                "fencing_token": h.token,
                "granted_at": _iso(h.granted_us) if h.granted_us else None,
                "held_for_s": _held_for(h.granted_us, now_us),
                "slot": h.column,
                "parked": h.parked,
            }
            for h in summary.holders
        ],
        "waiters": summary.waiters,
        "waiter_labels": summary.waiter_labels,
    }


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _print_list(locks: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table()
    for column, justify in (
        ("lock", "left"),
        ("holder", "left"),
        ("label", "left"),
        ("token", "right"),
        ("held for", "right"),
        ("waiters", "right"),
    ):
        # Owners and labels are folded, never cut with "…": an operator copies them.
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for lock in locks:
        name = lock["lock_id"] if lock["kind"] == "lock" else f"{lock['lock_id']} ({lock['kind']})"
        holders = lock["holders"] or [None]
        for i, holder in enumerate(holders):
            first = i == 0
            cells: list[Text | str]
            if holder is None:
                cells = [Text("none", style="green"), Text(""), "", "", str(lock["waiters"])]
            else:
                held = _duration(holder["held_for_s"])
                cells = [
                    Text(holder["owner"]),
                    Text(holder["label"] or ""),
                    str(holder["fencing_token"]),
                    held + (" (parked)" if holder["parked"] else ""),
                ]
                cells.append(str(lock["waiters"]) if first else "")
            table.add_row(Text(name) if first else Text(""), *cells)
    if not locks:
        typer.echo("no lock is held or awaited")
        return
    Console().print(table)


@app.command("list", epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def list_command(
    prefix: Annotated[
        str, typer.Option("--prefix", metavar="TEXT", help="Only locks whose name starts with TEXT.")
    ] = "",
    idle: Annotated[
        bool, typer.Option("--all", help="Also list locks nobody holds or awaits (until leasewatch forgets them).")
    ] = False,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=100_000, metavar="N", help="List at most N locks.")
    ] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON array instead of a table.")] = False,
    verbose: Verbose = 0,
    log_format: LogFormatOption = LogFormat.CONSOLE,
) -> None:
    """List the locks held or awaited now: name, holder owner, label, fencing token, held for, waiters.

    Read straight from the store (CHRONOLOCK_STORE_URL): works on the embedded SQLite store with no
    leasewatch running. Semaphores and read-write locks are listed with their kind, one line per holder.
    "held for" is counted from the grant's global time as the holder estimated it ("?" for holders
    that did not record it: older clients, the baseline algorithm). Exit 69 store unavailable, 78 bad
    settings.
    """
    _setup_logging(verbose, log_format)
    metrics.record_nothing()
    if len(prefix.encode("utf-8", "replace")) > MAX_LOCK_ID_BYTES:
        _fail(EXIT_USAGE, f"error: --prefix is longer than a lock id can be ({MAX_LOCK_ID_BYTES} bytes)")
    from lockclient.admin import list_locks
    from lockclient.locker import RemoteLocker

    with _clear_errors():
        locker = RemoteLocker.from_env()
        try:
            found = list_locks(locker.store, prefix=prefix, limit=limit, idle=idle)
            now_us = locker.clock.now_us()
        finally:
            locker.close()
    data = [_list_dict(summary, now_us) for summary in found]
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        _print_list(data)


@app.command(epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def revoke(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Lock id (or a semaphore's / read-write lock's name).")],
    token: Annotated[
        int,
        typer.Option(
            "--token",
            "-t",
            min=1,
            metavar="N",
            help="The fencing token of the holder to revoke (lockctl list, lockctl status). Required: "
            "only that holder is revoked, never whoever holds the lock by the time you type.",
            show_default=False,
        ),
    ],
    kind: Annotated[
        Kind, typer.Option("--kind", help="What NAME is: a lock, a semaphore or a read-write lock.")
    ] = Kind.LOCK,
    verbose: Verbose = 0,
    log_format: LogFormatOption = LogFormat.CONSOLE,
) -> None:
    """Revoke the holder of NAME whose fencing token is N, as leasewatch revokes a dead holder.

    A compare-and-set on exactly that holder's record deletes it and writes its end record
    ("revoked"); its queue cell goes, and the next waiter takes the lock. The holder finds out at its
    next renewal (lock.lost fires; lockctl run terminates its command and exits 70). Nothing is
    revoked if no current holder has token N (it released, or was revoked, and the lock may have
    changed hands): exit 1. Works on the store directly, with or without leasewatch.

    Exit status: 0 revoked; 1 no current holder has token N; 2 bad usage; 69 store unavailable;
    78 bad settings.
    """
    _setup_logging(verbose, log_format)
    metrics.record_nothing()
    from lockclient.admin import revoke_token
    from lockclient.locker import RemoteLocker

    with _clear_errors():
        validate_lock_id(name)
        row = name if kind is Kind.LOCK else primitive_row(name, kind.value)
        locker = RemoteLocker.from_env()
        try:
            outcome = revoke_token(locker.store, row, token)
        finally:
            locker.close()
    what = f"{kind.value} {name!r}"
    if outcome.revoked is None:
        held = ", ".join(f"{h.owner} (token {h.token})" for h in outcome.holders)
        now = f"held by {held}" if held else "nobody holds it"
        _fail(EXIT_NOT_HOLDER, f"no current holder of {what} has fencing token {token} ({now}); nothing revoked")
    record = outcome.revoked
    label = f" ({record.label})" if record.label else ""
    _say(f"revoked {what}: holder {record.owner}{label}, fencing token {record.token}")
