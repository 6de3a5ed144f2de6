"""``leasewatch serve``: run one watcher replica with settings from the environment."""

from __future__ import annotations

import math

import typer
import uvicorn
from rich.markup import escape

from leasewatch.settings import LeasewatchSettings
from lockclient.logs import configure_logging
from lockclient.settings import settings_help

app = typer.Typer(help="chronolock leasewatch: revokes dead lock holders and waiters.", no_args_is_help=True)


@app.command(epilog=escape(settings_help(LeasewatchSettings)).replace("\n", "\n\n"))
def serve() -> None:
    """Serve /locks, /locks/{id}, /locks/{id}/wait, POST /locks/{id}/revoke, /healthz, /readyz, /metrics, /docs, /."""
    from leasewatch.app import create_app

    settings = LeasewatchSettings()
    configure_logging(settings.log_level, settings.log_format)
    uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=math.ceil(settings.shutdown_grace),
        )
    ).run()


@app.command()
def settings() -> None:
    """Print the settings this replica would use (secrets hidden)."""
    typer.echo(LeasewatchSettings().model_dump_json(indent=2))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
