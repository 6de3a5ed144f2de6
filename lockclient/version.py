"""chronolock's version, from one source: the installed distribution's metadata.

``pyproject.toml`` holds the version; installing (a wheel, an sdist, or ``pip install -e``)
writes it into the distribution's metadata, which :mod:`importlib.metadata` reads here.
Every place that reports a version — ``/status`` and ``chronolock_build_info`` of both
services, the OpenAPI documents, ``--version`` of the three commands — takes it from
:data:`__version__`. Run from a source tree that was never installed, it is ``0+unknown``.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the services' and the CLI's: imported where used, not by the library's base install
    import typer
    from prometheus_client import CollectorRegistry, Info

__all__ = ["DISTRIBUTION", "__version__", "build_info", "version_option"]

DISTRIBUTION = "chronolock"


def _installed_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


__version__: str = _installed_version()


def build_info(registry: CollectorRegistry, component: str) -> Info:
    """``chronolock_build_info{component, version, python} 1`` in ``registry``.

    The usual Prometheus idiom for "which build runs where": a constant 1 whose labels carry
    the facts, so a query can join on it (``… * on(instance) group_left(version)
    chronolock_build_info``) and a dashboard can show versions side by side during a rollout."""
    from prometheus_client import Info

    info = Info("chronolock_build", "version of the running chronolock component", registry=registry)
    info.info({"component": component, "version": __version__, "python": platform.python_version()})
    return info


def version_option(program: str) -> typer.models.OptionInfo:
    """A ``--version`` option (for ``Annotated[bool, ...]``) of a typer app's callback.

    It prints ``<program> <version>`` and exits 0 before any command runs."""
    import typer

    def show(value: bool) -> None:
        if value:
            typer.echo(f"{program} {__version__}")
            raise typer.Exit(0)

    option: typer.models.OptionInfo = typer.Option(
        "--version", callback=show, is_eager=True, help="Print the version and exit."
    )
    return option
