"""Structured logging: one line per event, JSON by default (structlog).

Every line is redacted (:func:`lockclient.redact.redact`) as it is rendered: its values
and a rendered traceback alike — a driver error that quotes a URL with a password, a
token in an exception message. Events logged through :func:`get_logger` are redacted
before they leave the library too, whoever renders them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from lockclient.redact import redact

__all__ = ["configure_logging", "get_logger", "redact_event"]


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redacted(v) for v in value)
    return value


def redact_event(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: every string in the event, nested ones included, redacted."""
    for key, value in list(event_dict.items()):
        if key != "exc_info":
            event_dict[key] = _redacted(value)
    return event_dict


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Route structlog and the standard library's loggers (uvicorn, the driver)
    through one renderer on stderr: JSON objects (``fmt="json"``) or a console format."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(
            colors=False,
            # Plain tracebacks: rich ones print local variables, which can include credentials.
            exception_formatter=structlog.dev.plain_traceback,
        )
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                # Tracebacks become text here, so that they are redacted like everything else.
                structlog.processors.format_exc_info,
                redact_event,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access",):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structured logger that goes through the standard library's ``logging``.

    A library must not print on its own: records go to ``logging.getLogger(name)``, so an
    application decides levels and handlers (unconfigured, Python shows warnings and
    above on stderr). :func:`configure_logging` renders them as JSON lines.
    """
    logger: structlog.stdlib.BoundLogger = structlog.wrap_logger(
        logging.getLogger(name),
        wrapper_class=structlog.stdlib.BoundLogger,
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.contextvars.merge_contextvars,
            redact_event,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
    )
    return logger
