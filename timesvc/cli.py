"""``timesvc serve``: run one replica with settings from the environment."""

from __future__ import annotations

import math

import typer
import uvicorn
from rich.markup import escape

from lockclient.logs import configure_logging
from lockclient.settings import settings_help
from timesvc.settings import TimesvcSettings

app = typer.Typer(help="chronolock timesvc: monotonic global time over the cell store.", no_args_is_help=True)


@app.command(epilog=escape(settings_help(TimesvcSettings)).replace("\n", "\n\n"))
def serve() -> None:
    """Serve GET /now, /healthz, /readyz, /status, /metrics and OpenAPI docs at /docs."""
    from timesvc.app import create_app

    settings = TimesvcSettings()
    configure_logging(settings.log_level, settings.log_format)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=math.ceil(settings.shutdown_grace),
        )
    )
    server.run()


@app.command()
def settings() -> None:
    """Print the settings this replica would use (secrets hidden)."""
    typer.echo(TimesvcSettings().model_dump_json(indent=2))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
