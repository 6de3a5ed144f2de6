"""Bounded HTTP serving for timesvc and leasewatch: uvicorn with a guarded protocol.

uvicorn with httptools bounds nothing on the way in: no limit on the size of a request's
head (request line + headers), no deadline for receiving it, no cap on connections. A
security review measured what that costs: 50 connections each sending an unfinished
5 MiB header grew leasewatch from 90 to 335 MB (httptools grows a partial header value
by concatenation), and 1,000 connections sending headers one byte at a time stayed open
for as long as the clients wished. :class:`GuardedProtocol` (a subclass of uvicorn's
``HttpToolsProtocol``) adds the missing bounds, per server:

* **head size** (``max_header_bytes``): bytes received while a request's head is being
  parsed are counted; past the limit the connection gets ``431`` and is closed. The
  count is taken per chunk read from the socket (at most 256 KiB), so memory per
  connection stays within limit + one chunk.
* **head time** (``header_timeout``): a connection may spend at most that long between
  becoming idle (accepted, or its last response sent) and the end of the next
  request's head; then it is closed (``408``). An idle keep-alive connection is closed
  earlier by uvicorn's own ``timeout_keep_alive``. A request being served (a long-poll)
  is never subject to it.
* **connections** (``max_connections``): when a new connection would exceed the cap, the
  connection that has been *waiting for a request head the longest* is closed to make
  room — a slow-header flood then only evicts itself, while connections that are being
  served (including long-polls) are never touched. Only if every connection is busy
  being served is the newcomer refused (``503``, ``Retry-After``).
* **request bodies** (``max_body_bytes``): a declared ``Content-Length`` above the limit
  is refused (``413``) before the application runs; a chunked body is counted and the
  connection closed when it exceeds the limit. (No chronolock endpoint reads a body.)

WebSockets are off (no endpoint uses them) and the ``server`` header is not sent.
Everything here is per process; TLS for HTTP terminates in front of the service (a
mesh sidecar or an ingress — see SECURITY.md).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from lockclient.logs import get_logger
from lockclient.settings import HttpServerSettings

__all__ = ["GuardedProtocol", "HttpLimits", "HttpServerSettings", "build_server", "guarded_protocol"]

log = get_logger("lockclient.serving")


@dataclass(frozen=True)
class HttpLimits:
    max_connections: int = 1024
    header_timeout: float = 10.0
    max_header_bytes: int = 16_384
    max_body_bytes: int = 65_536

    @classmethod
    def of(cls, settings: HttpServerSettings) -> HttpLimits:
        return cls(
            max_connections=settings.max_connections,
            header_timeout=settings.header_timeout,
            max_header_bytes=settings.max_header_bytes,
            max_body_bytes=settings.max_body_bytes,
        )


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request we already answered."""


def _response(status: int, reason: str, detail: str, extra: str = "") -> bytes:
    body = f'{{"detail":"{detail}"}}'.encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode("ascii") + body


_TOO_LARGE_HEAD = _response(431, "Request Header Fields Too Large", "request head too large")
_TOO_SLOW = _response(408, "Request Timeout", "request head not received in time")
_BUSY = _response(503, "Service Unavailable", "too many connections", "retry-after: 1\r\n")
_TOO_LARGE_BODY = _response(413, "Content Too Large", "request body too large")
_BAD_LENGTH = _response(400, "Bad Request", "bad content-length")


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounds on heads, time, connections and bodies.

    A subclass per server (:func:`guarded_protocol`) carries the limits and the
    server's bookkeeping in class attributes; uvicorn creates one instance per connection.
    """

    limits: ClassVar[HttpLimits] = HttpLimits()
    waiting: ClassVar[OrderedDict[GuardedProtocol, float]]
    """Connections waiting for a request head, oldest first (-> monotonic time they started)."""
    open_count: ClassVar[int] = 0
    stats: ClassVar[dict[str, int]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counted = False
        self._closed_by_guard = False
        self._head_bytes = 0
        self._in_head = False  # the parser is inside a request head
        self._body_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None

    # -- connection lifetime --------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cls = type(self)
        cls.open_count += 1
        self._counted = True
        if cls.open_count > cls.limits.max_connections:
            victim = next(iter(cls.waiting), None)
            if victim is None:
                cls.stats["refused"] += 1
                self._close_with(_BUSY)
                return
            cls.stats["evicted"] += 1
            victim._close_with(b"")
        self._start_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        self._uncount()
        super().connection_lost(exc)

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            type(self).open_count -= 1

    def _close_with(self, response: bytes) -> None:
        """Answer (if anything) and close; the slot is free at once, not when the peer is gone."""
        self._closed_by_guard = True
        self._stop_waiting()
        self._uncount()
        if self.transport is not None and not self.transport.is_closing():
            if response:
                self.transport.write(response)
            self.transport.close()

    # -- waiting for a request head ---------------------------------------------------------

    def _start_waiting(self) -> None:
        cls = type(self)
        cls.waiting.pop(self, None)
        cls.waiting[self] = time.monotonic()
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(cls.limits.header_timeout, self._head_timed_out)

    def _stop_waiting(self) -> None:
        type(self).waiting.pop(self, None)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self in type(self).waiting:
            type(self).stats["timed_out"] += 1
            self._close_with(_TOO_SLOW)

    # -- parsing ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._closed_by_guard:
            return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _Refused):
                return
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()
            return
        if self._in_head:
            # Counted after parsing, per chunk: the chunk may also hold the end of an earlier
            # request, so the count can only be too high by less than one chunk.
            self._head_bytes += len(data)
            if self._head_bytes > type(self).limits.max_header_bytes:
                type(self).stats["head_too_large"] += 1
                self._close_with(_TOO_LARGE_HEAD)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        self._body_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._stop_waiting()
        length = next((value for name, value in self.headers if name == b"content-length"), None)
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                self._close_with(_BAD_LENGTH)
                raise _Refused from None
            if declared > type(self).limits.max_body_bytes:
                type(self).stats["body_too_large"] += 1
                self._close_with(_TOO_LARGE_BODY)
                raise _Refused
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > type(self).limits.max_body_bytes:
            type(self).stats["body_too_large"] += 1
            if self.cycle is not None and not self.cycle.response_started:
                self._close_with(_TOO_LARGE_BODY)
            else:
                self._close_with(b"")
            raise _Refused
        super().on_body(body)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        # Idle again, unless a pipelined request was already parsed and is being served.
        if not self.pipeline and (self.cycle is None or self.cycle.response_complete):
            self._start_waiting()


def guarded_protocol(limits: HttpLimits) -> type[GuardedProtocol]:
    """A protocol class for one server: its own limits, connection count and waiting list."""
    return type(
        "GuardedServerProtocol",
        (GuardedProtocol,),
        {
            "limits": limits,
            "waiting": OrderedDict(),
            "open_count": 0,
            "stats": {"refused": 0, "evicted": 0, "timed_out": 0, "head_too_large": 0, "body_too_large": 0},
        },
    )


def build_server(
    app: Any,
    *,
    host: str,
    port: int,
    limits: HttpServerSettings,
    shutdown_grace: float,
) -> uvicorn.Server:
    """A uvicorn server for ``app`` with the guarded protocol and the settings' limits."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(HttpLimits.of(limits)),
        ws="none",
        lifespan="on",
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_keep_alive=max(1, math.ceil(limits.keepalive_timeout)),
        timeout_graceful_shutdown=math.ceil(shutdown_grace),
    )
    return uvicorn.Server(config)
