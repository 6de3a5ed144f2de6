"""Opening the store from a long-running service: back off after failures; errors safe to show.

A replica opens its store lazily, on the first tick or request, and again after a failed
attempt. Without a pause, every tick and every request tried again: with a wrong
password one timesvc replica made 27 login attempts in 12 s — noise in the cluster's
audit log, load on the authenticator, and for some setups a lockout. :class:`StoreOpener`
remembers the last failure and does not try again before a delay that doubles with each
failure: 1 s up to 60 s when access was denied (credentials or a TLS certificate — only
a configuration change helps), 0.5 s up to 5 s when the store was unreachable (it
usually comes back by itself). Callers get the remembered error meanwhile.

:func:`public_error` is what an HTTP response (or ``/readyz``) may say about a store
error: its kind and, for SQLite, the database's own message — never a host, a port or a
file path, which stay in the logs.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable

from lockclient.errors import (
    ChronolockError,
    ConfigurationError,
    StoreAccessDenied,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
)
from lockclient.logs import get_logger
from lockclient.store.base import CellStore

__all__ = ["StoreOpener", "public_error"]

log = get_logger("lockclient.store")

DENIED_BACKOFF = (1.0, 60.0)
UNAVAILABLE_BACKOFF = (0.5, 5.0)


def public_error(exc: BaseException) -> str:
    """A description of ``exc`` fit for an HTTP body: what kind of failure, never where."""
    if isinstance(exc, StoreMisconfigured):
        kind = "store misconfigured: its directory does not exist, or it cannot be written"
    elif isinstance(exc, StoreAccessDenied):
        kind = "store refused access: credentials rejected, or a TLS certificate did not verify"
    elif isinstance(exc, StoreUnavailable):
        kind = "store unavailable"
    elif isinstance(exc, StoreError):
        kind = "store failed"
    elif isinstance(exc, ConfigurationError):
        kind = "configuration error"
    else:
        kind = "internal error"
    cause = exc.__cause__
    if isinstance(cause, sqlite3.Error):
        detail = str(cause)  # SQLite's messages name no file ("database or disk is full")
    elif cause is not None:
        detail = type(cause).__name__  # the driver's message names hosts and ports
    else:
        detail = ""
    return f"{kind} ({detail})" if detail else kind


class StoreOpener:
    """Open a store once; after a failure, wait (doubling) before trying again."""

    def __init__(self, open_store: Callable[[], CellStore], *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._open_store = open_store
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._store: CellStore | None = None
        self._last: ChronolockError | None = None
        self._retry_at = 0.0
        self._delay = 0.0
        self.attempts = 0

    @property
    def store(self) -> CellStore | None:
        return self._store

    def open(self) -> CellStore:
        """The store, opened now or before. Raises the last error while backing off."""
        with self._lock:
            if self._store is not None:
                return self._store
            now = self._monotonic()
            if self._last is not None and now < self._retry_at:
                last = self._last
                raise type(last)(f"{last} (next attempt in {self._retry_at - now:.1f} s)") from last.__cause__
            self.attempts += 1
            try:
                self._store = self._open_store()
            except ChronolockError as exc:
                first, cap = DENIED_BACKOFF if isinstance(exc, StoreAccessDenied) else UNAVAILABLE_BACKOFF
                same_kind = self._last is not None and isinstance(exc, StoreAccessDenied) == isinstance(
                    self._last, StoreAccessDenied
                )
                self._delay = min(cap, self._delay * 2) if same_kind and self._delay else first
                self._last, self._retry_at = exc, self._monotonic() + self._delay
                log.warning(
                    "store_open_failed",
                    error=str(exc),
                    error_type=type(exc).__name__,
                    attempt=self.attempts,
                    retry_in_s=self._delay,
                )
                raise
            if self._last is not None:
                log.info("store_opened_after_failures", attempts=self.attempts)
            self._last = None
            return self._store
