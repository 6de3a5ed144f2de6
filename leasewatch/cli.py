"""``leasewatch serve``: run one watcher replica with settings from the environment."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from leasewatch.settings import LeasewatchSettings
from lockclient.clihelp import flags_without_a_type
from lockclient.entrypoint import guarded_main
from lockclient.logs import configure_logging
from lockclient.settings import settings_help, settings_report
from lockclient.version import version_option

flags_without_a_type()
app = typer.Typer(
    help="chronolock leasewatch: revokes dead lock holders and waiters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # errors go through guarded_main: redacted, no locals
)


@app.callback()
def _options(version: Annotated[bool, version_option("leasewatch")] = False) -> None:
    """--version, before any command."""


@app.command(epilog=escape(settings_help(LeasewatchSettings)).replace("\n", "\n\n"))
def serve() -> None:
    """Serve /locks, /locks/{id}, /wait/{id}, /notify/{id}, POST /revoke/{id}, /revocations, /healthz,
    /readyz, /metrics, /docs and /."""
    from leasewatch.app import create_app
    from lockclient.serving import build_server

    settings = LeasewatchSettings()
    configure_logging(settings.log_level, settings.log_format)
    build_server(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        limits=settings,
        shutdown_grace=settings.shutdown_grace,
    ).run()


@app.command(epilog=escape(settings_help(LeasewatchSettings)).replace("\n", "\n\n"))
def settings(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: variable name -> value.")] = False,
) -> None:
    """Print the settings this replica would use and where each came from (secrets masked, no
    credentials in the store URL). Exit 78, naming the problem, on an invalid, missing or misspelt setting."""
    typer.echo(settings_report(LeasewatchSettings(), program="leasewatch", as_json=as_json))


def main() -> None:
    guarded_main(app, program="leasewatch", settings_cls=LeasewatchSettings)


if __name__ == "__main__":
    main()
