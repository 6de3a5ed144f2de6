"""``timesvc serve``: run one replica with settings from the environment."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from lockclient.clihelp import flags_without_a_type
from lockclient.entrypoint import guarded_main
from lockclient.logs import configure_logging
from lockclient.settings import settings_help, settings_report
from lockclient.version import version_option
from timesvc.settings import TimesvcSettings

flags_without_a_type()
app = typer.Typer(
    help="chronolock timesvc: monotonic global time over the cell store.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # errors go through guarded_main: redacted, no locals
)


@app.callback()
def _options(version: Annotated[bool, version_option("timesvc")] = False) -> None:
    """--version, before any command."""


@app.command(epilog=escape(settings_help(TimesvcSettings)).replace("\n", "\n\n"))
def serve() -> None:
    """Serve GET /now, /healthz, /readyz, /status, /metrics and OpenAPI docs at /docs."""
    from lockclient.serving import build_server
    from timesvc.app import create_app

    settings = TimesvcSettings()
    configure_logging(settings.log_level, settings.log_format)
    build_server(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        limits=settings,
        shutdown_grace=settings.shutdown_grace,
    ).run()


@app.command(epilog=escape(settings_help(TimesvcSettings)).replace("\n", "\n\n"))
def settings(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: variable name -> value.")] = False,
) -> None:
    """Print the settings this replica would use and where each came from (secrets masked, no
    credentials in the store URL). Exit 78, naming the problem, on an invalid, missing or misspelt setting."""
    typer.echo(settings_report(TimesvcSettings(), program="timesvc", as_json=as_json))


def main() -> None:
    guarded_main(app, program="timesvc", settings_cls=TimesvcSettings)


if __name__ == "__main__":
    main()
