"""The console scripts: each command itself, or one clear line when its extra is not installed.

``pip install chronolock`` installs the library with light dependencies only; the command line
(typer, rich) is the ``[cli]`` extra and the services (FastAPI, uvicorn, APScheduler) the
``[server]`` extra. The scripts are installed either way, so without the extra a command says
what to install instead of ending in a ``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["EXIT_MISSING_EXTRA", "leasewatch", "lockctl", "timesvc"]

EXIT_MISSING_EXTRA = 78
"""EX_CONFIG: the installation lacks what the command needs; running it again cannot help."""

_CLI = ("typer", "rich", "click")
_SERVER = (*_CLI, "fastapi", "starlette", "uvicorn", "httptools", "apscheduler")


def _run(program: str, module: str, extra: str, provided_by_extra: tuple[str, ...]) -> None:
    try:
        main = importlib.import_module(module).main
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in provided_by_extra:
            raise
        print(
            f"{program}: this command needs the [{extra}] extra ({exc.name} is not installed): "
            f"pip install 'chronolock[{extra}]'",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_MISSING_EXTRA) from None
    main()


def lockctl() -> None:
    """``lockctl`` (:func:`lockclient.cli.main`): needs ``chronolock[cli]``.

    ``lockctl run`` is tried first without building the typer application
    (:func:`lockclient.lockctl_run.fast_main`: issue 25's start-up target); whatever that path does
    not read with certainty — help, usage errors, bad settings, every other command — is typer's."""
    from lockclient.lockctl_run import fast_main

    fast_main(sys.argv[1:])  # returns only when it did not run the command
    _run("lockctl", "lockclient.cli", "cli", _CLI)


def timesvc() -> None:
    """``timesvc`` (:func:`timesvc.cli.main`): needs ``chronolock[server]``."""
    _run("timesvc", "timesvc.cli", "server", _SERVER)


def leasewatch() -> None:
    """``leasewatch`` (:func:`leasewatch.cli.main`): needs ``chronolock[server]``."""
    _run("leasewatch", "leasewatch.cli", "server", _SERVER)
