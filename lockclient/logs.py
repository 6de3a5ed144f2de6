"""Structured logging: one line per event, JSON by default (structlog).

Every line is redacted (:func:`lockclient.redact.redact`) as it is rendered: its values
and a rendered traceback alike — a driver error that quotes a URL with a password, a
token in an exception message. Events logged through :func:`get_logger` are redacted
before they leave the library too, whoever renders them.

The library's loggers (:class:`EventLogger`) do not need structlog: each event is one
``logging`` record whose message is the event's dict, shaped as structlog's
``ProcessorFormatter.wrap_for_formatter`` shapes it, so the services' and ``lockctl``'s
:func:`configure_logging` renders it as JSON (or a console line) with every field. An
application that configured nothing (or plain ``logging``) reads the same record as one line,
``lock_lost: lock_id=account:42 owner=... reason="..."`` — not a dict's repr (issue 25). And
``import lockclient`` does not pay for structlog (and asyncio, which structlog imports).
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from lockclient.redact import redact

if TYPE_CHECKING:
    import structlog

__all__ = [
    "ConsoleFormatter",
    "EventLogger",
    "configure_logging",
    "get_logger",
    "quiet_http_client_logs",
    "redact_event",
]


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


class ConsoleFormatter(logging.Formatter):
    """One line per record — UTC time, level, logger, message (an event's fields, readable) — and
    the whole of it redacted, tracebacks included. Needs nothing but ``logging``: ``lockctl``
    starts without importing structlog (issue 25: start-up time)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        record.levelname = record.levelname.lower()
        return redact(super().format(record))


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Route the library's events and the standard library's loggers (uvicorn, the driver)
    through one renderer on stderr: JSON objects (``fmt="json"``, structlog) or one
    readable line each (``fmt="console"``, :class:`ConsoleFormatter`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ConsoleFormatter() if fmt != "json" else _json_formatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access",):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    if root.level > logging.DEBUG:
        quiet_http_client_logs()


def _json_formatter() -> logging.Formatter:
    import structlog

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
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            # Tracebacks become text here, so that they are redacted like everything else.
            structlog.processors.format_exc_info,
            redact_event,
            structlog.processors.JSONRenderer(),
        ],
    )


def quiet_http_client_logs() -> None:
    """httpx and httpcore log every request at INFO ("HTTP Request: GET http://... 200 OK"): in a
    service that long-polls and in ``lockctl -v`` that is noise about chronolock's own plumbing
    (leasewatch logged ~1.5 such lines a second; issue 25). Their warnings still show."""
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _logfmt(value: Any) -> str:
    if isinstance(value, str):
        return value if value and not any(c in value for c in ' ="\n\t') else json.dumps(value)
    return json.dumps(value, default=str, separators=(",", ":"))


class _Event(dict[str, Any]):
    """An event's fields: a dict for structlog's ProcessorFormatter, one readable line for
    anyone else (``logging.LogRecord.getMessage`` calls ``str``)."""

    trace: str | None = None
    """The redacted traceback, for a record logged with :meth:`EventLogger.exception`."""

    def __str__(self) -> str:
        event = self.get("event", "")
        fields = " ".join(f"{key}={_logfmt(value)}" for key, value in self.items() if key not in ("event", "exc_info"))
        line = f"{event}: {fields}" if fields else str(event)
        return f"{line}\n{self.trace.rstrip()}" if self.trace else line

    def __repr__(self) -> str:
        return str(self)


class EventLogger:
    """``log.warning("lock_lost", lock_id=..., reason=...)``: an event name and its fields, sent to
    ``logging.getLogger(name)`` as one record (see the module's docstring). Levels and handlers are
    the application's: a library must not print on its own."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._logger = logging.getLogger(name)

    def _log(self, level: int, method: str, event: str, fields: dict[str, Any], *, trace: bool = False) -> None:
        logger = self._logger
        if logger.disabled or level < logger.getEffectiveLevel():
            return
        record = _Event(redact_event(logger, method, {"event": event, **fields}))
        if trace:
            record["exc_info"] = True
            record.trace = redact(traceback.format_exc())
        # stacklevel 3: the record names the caller of log.warning(...), not this module.
        logger.log(level, record, extra={"_logger": logger, "_name": method}, stacklevel=3)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, "error", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """:meth:`error` with the traceback of the exception being handled."""
        self._log(logging.ERROR, "error", event, fields, trace=True)


def get_logger(name: str) -> EventLogger:
    """A structured logger that goes through the standard library's ``logging``.

    A library must not print on its own: records go to ``logging.getLogger(name)``, so an
    application decides levels and handlers (unconfigured, Python shows warnings and
    above on stderr, one readable line each). :func:`configure_logging` renders them as JSON lines.
    """
    return EventLogger(name)
