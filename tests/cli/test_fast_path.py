"""``lockctl run``'s fast path reads what typer reads, or leaves the command line to typer.

The ``lockctl`` script runs ``lockctl run`` without building the typer application
(:mod:`lockclient.lockctl_run`, issue 25 item 3: start-up). Its argument reader must never
read a command line differently from typer: for every command line it accepts, typer calls
:func:`~lockclient.lockctl_run.run_command` with the same NAME, COMMAND and options — checked
here on hand-picked and generated command lines, by letting typer parse each one with
``run_command`` replaced by a recorder. Whatever it does not accept is typer's (help, usage
errors); the plain forms people type must be accepted, or the fast path would be a slow one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockclient import cli
from lockclient.lockctl_run import LogFormat, parse_run_args, run_command

from .support import LOCKCTL

DEFAULTS: dict[str, Any] = {
    "timeout": None,
    "try_": False,
    "conflict_exit_code": 75,
    "lease": None,
    "kill_grace": None,
    "pass_secrets": False,
    "limit": None,
    "shared": False,
    "exclusive": False,
    "max_readers": 16,
    "once_per": None,
    "tolerance": None,
    "label": None,
    "verbose": 0,
    "log_format": LogFormat.CONSOLE,
}


class _Called(Exception):
    pass


def typer_reading(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[str], dict[str, Any]] | None:
    """What typer passes to run_command for ``lockctl run ARGS``, or None if it refuses them."""
    seen: dict[str, Any] = {}

    def record(name: str, command: list[str], **kwargs: Any) -> None:
        seen.update(name=name, command=list(command), kwargs=kwargs)
        raise _Called

    with monkeypatch.context() as patch:
        patch.setattr(cli, "run_command", record)
        try:
            cli.app(["run", *args], prog_name="lockctl", standalone_mode=False)
        except _Called:
            kwargs = dict(seen["kwargs"])
            kwargs.pop("read_settings")
            return seen["name"], seen["command"], kwargs
        except Exception:
            return None
    return None


def fast_reading(args: list[str]) -> tuple[str, list[str], dict[str, Any]] | None:
    parsed = parse_run_args(args)
    if parsed is None:
        return None
    name, command, options = parsed
    return name, command, DEFAULTS | options


def test_defaults_are_run_commands() -> None:
    """The table above is run_command's own defaults (and so typer's, which passes every option)."""
    import inspect

    signature = inspect.signature(run_command)
    assert {k: p.default for k, p in signature.parameters.items() if k in DEFAULTS} == DEFAULTS


PLAIN = [
    ["job", "--", "true"],
    ["job", "true"],
    ["job", "--", "sh", "-c", "echo hi; exit 3"],
    ["-n", "job", "--", "true"],
    ["--try", "job", "--", "./x", "--try"],
    ["job", "--timeout", "5", "--", "true"],
    ["job", "--timeout=0.5", "--", "true"],
    ["-w", "2", "job", "--", "true"],
    ["-w2.5", "job", "--", "true"],
    ["-E", "9", "--try", "job", "--", "true"],
    ["-E0", "job", "--", "true"],
    ["--conflict-exit-code", "255", "job", "--", "true"],
    ["--lease", "30", "--kill-grace", "3", "job", "--", "true"],
    ["--pass-secrets", "job", "--", "env"],
    ["--limit", "3", "db-pool", "--", "./backup.sh"],
    ["--shared", "catalog", "--", "./read.sh"],
    ["--exclusive", "--max-readers", "4", "catalog", "--", "./write.sh"],
    ["--once-per", "1h", "nightly", "--", "./report.sh"],
    ["--once-per", "15m", "--tolerance", "90s", "nightly", "--", "./report.sh"],
    ["--label", "nightly report", "job", "--", "true"],
    ["--label=", "job", "--", "true"],
    ["-v", "job", "--", "true"],
    ["-vv", "job", "--", "true"],
    ["-nv", "job", "--", "true"],
    ["--verbose", "--verbose", "-v", "job", "--", "true"],
    ["--log-format", "json", "job", "--", "true"],
    ["--log-format=console", "job", "--", "true"],
    ["job", "-n", "--", "true"],
    ["job", "true", "-n"],
    ["--", "job", "true", "--", "x"],
    ["job", "-", "--", "-"],
    ["", "--", "true"],
    ["job", "--", ""],
    ["jöb/ü", "--", "printf", "%s\\n", "ü"],
]

REFUSED = [
    [],
    ["job"],
    ["job", "--"],
    ["--help"],
    ["-h", "job", "--", "true"],
    ["job", "--help", "--", "true"],
    ["job", "ls", "-l"],
    ["--timeout", "-1", "job", "--", "true"],
    ["--timeout", "1e3", "job", "--", "true"],
    ["--timeout", "inf", "job", "--", "true"],
    ["--timeout", "nan", "job", "--", "true"],
    ["--timeout", " 5", "job", "--", "true"],
    ["--timeout", "5", "--timeout", "6", "job", "--", "true"],
    ["--timeout"],
    ["-E", "256", "job", "--", "true"],
    ["-E", "-1", "job", "--", "true"],
    ["-E", "07", "job", "--", "true"],
    ["--try=yes", "job", "--", "true"],
    ["--no-try", "job", "--", "true"],
    ["-nE9", "job", "--", "true"],
    ["-x", "job", "--", "true"],
    ["--log-format", "JSON", "job", "--", "true"],
    ["--label", "-x", "job", "--", "true"],
    ["--tim", "5", "job", "--", "true"],
]


@pytest.mark.parametrize("args", PLAIN, ids=lambda a: " ".join(a) or "(none)")
def test_plain_command_lines_are_read_as_typer_reads_them(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fast = fast_reading(args)
    assert fast is not None, "the fast path must read the plain forms"
    assert fast == typer_reading(args, monkeypatch)


@pytest.mark.parametrize("args", REFUSED, ids=lambda a: " ".join(a) or "(none)")
def test_anything_else_is_left_to_typer(args: list[str]) -> None:
    assert parse_run_args(args) is None


TOKENS = st.sampled_from(
    [
        "job",
        "x",
        "--",
        "-",
        "",
        "true",
        "-n",
        "-v",
        "-vv",
        "-nv",
        "-vn",
        "-nn",
        "--try",
        "--verbose",
        "--shared",
        "--exclusive",
        "--pass-secrets",
        "--timeout",
        "-w",
        "-w1",
        "--timeout=3",
        "--timeout=",
        "-E",
        "-E3",
        "--conflict-exit-code",
        "--lease",
        "--lease=20",
        "--kill-grace",
        "--limit",
        "--max-readers",
        "--once-per",
        "--tolerance",
        "--label",
        "--label=a b",
        "--log-format",
        "--log-format=json",
        "json",
        "console",
        "0",
        "1",
        "2.5",
        "10",
        "255",
        "256",
        "007",
        "1h",
        "1e2",
        "-1",
        "--help",
        "-h",
        "--bogus",
        "-z",
        "ls",
        "-l",
    ]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(TOKENS, max_size=9))
def test_generated_command_lines_are_read_as_typer_reads_them_or_left_to_it(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = fast_reading(args)
    if fast is not None:
        assert fast == typer_reading(args, monkeypatch)


def test_help_and_usage_errors_are_typers(tmp_path: Path) -> None:
    """Through the lockctl script: `run --help` is typer's help, a usage error typer's message and exit 2."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_"))}
    env["CHRONOLOCK_STORE_URL"] = f"sqlite:///{tmp_path / 'cells.db'}"
    env["COLUMNS"] = "100"
    shown = subprocess.run([str(LOCKCTL), "run", "--help"], env=env, capture_output=True, text=True, check=False)
    assert shown.returncode == 0
    assert "Usage: lockctl run [OPTIONS]" in shown.stdout
    assert "--conflict-exit-code" in shown.stdout
    bad = subprocess.run([str(LOCKCTL), "run", "job", "ls", "-l"], env=env, capture_output=True, text=True, check=False)
    assert bad.returncode == 2
    assert "No such option" in bad.stderr
