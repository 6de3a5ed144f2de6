"""Errors raised by chronolock.

Every error the library or a service raises on purpose derives from
:class:`ChronolockError`, and keeps its cause (``raise ... from exc``)::

    ChronolockError
     ├── ConfigurationError          bad store URL, bad settings
     ├── StoreError                  the store failed; ``__cause__`` is the driver's error
     │    ├── StoreUnavailable       the store cannot be reached (timeouts, no hosts, busy)
     │    │    └── StoreOutcomeUnknown   a write was sent and may have applied: read it back
     │    ├── StoreAccessDenied      credentials rejected, or the node's TLS certificate
     │    │                          did not verify (also a ConfigurationError)
     │    └── StoreMisconfigured     the configured SQLite database cannot be used: its
     │                               directory is missing, or it cannot be written
     │                               (also a ConfigurationError)
     ├── ClockError                  no global time could be had
     │    └── TimeServiceUnavailable no timesvc replica answered
     └── LockError                   carries ``lock_id``
          ├── InvalidLockId          rejected before touching the store
          ├── LockTimeout            ``get_lock(timeout=...)`` ran out
          ├── LockCancelled          a pending ``get_lock`` was cancelled
          ├── LockReentered          ``get_lock`` of a lock the same thread or task already holds
          ├── LimitMismatch          a semaphore (read-write lock) used with another limit
          │                          (max_readers) than its holders use
          └── LockNotOwned           the caller does not own the lock (revoked, expired, released)
               └── LockLost          the lease was revoked or could not be renewed in time
"""

from __future__ import annotations

__all__ = [
    "ChronolockError",
    "ClockError",
    "ConfigurationError",
    "InvalidLockId",
    "LimitMismatch",
    "LockCancelled",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockReentered",
    "LockTimeout",
    "StoreAccessDenied",
    "StoreError",
    "StoreMisconfigured",
    "StoreOutcomeUnknown",
    "StoreUnavailable",
    "TimeServiceUnavailable",
]


class ChronolockError(Exception):
    """Base of every error chronolock raises on purpose."""


class ConfigurationError(ChronolockError):
    """A setting or a store URL is malformed."""


class StoreError(ChronolockError):
    """The cell store failed; the driver's exception is attached as ``__cause__``."""


class StoreUnavailable(StoreError):
    """The cell store cannot be reached now (timeout, no live hosts, database busy)."""


class StoreOutcomeUnknown(StoreUnavailable):
    """A write was sent and the store could not say whether it applied (a timeout after the
    request left, Cassandra's "CAS operation result is unknown", a connection lost mid-request,
    a failure of the commit step after a quorum accepted). It may have applied already, or
    apply later: settle it by reading the value back (every compare-and-set value carries an
    attempt id, so "my value is there" is proof), never by assuming either way.

    Every other :class:`StoreError` raised by a write means it did *not* apply
    (:mod:`lockclient.store.outcomes` classifies each driver failure)."""


class StoreAccessDenied(StoreError, ConfigurationError):
    """The store rejected our credentials, or a node's TLS certificate did not verify.

    Not transient — retrying cannot help until the configuration changes — so it is also a
    :class:`ConfigurationError` (``lockctl`` exits 78), and services back off before they try
    again instead of logging in on every request."""


class StoreMisconfigured(StoreError, ConfigurationError):
    """The store the configuration names cannot be used as it is: an SQLite database whose
    directory does not exist (chronolock never creates one: a misspelt path would become a
    store no other process uses), or that this process cannot open for writing.

    Like :class:`StoreAccessDenied`, retrying cannot help until the configuration (a path,
    permissions) changes: ``lockctl`` exits 78. A :class:`StoreError` too, so a service that
    opens its store lazily reports it as the store failing (``/readyz`` 503) and tries again."""


class ClockError(ChronolockError):
    """Global time could not be obtained."""


class TimeServiceUnavailable(ClockError):
    """No timesvc replica answered in time."""


class LockError(ChronolockError):
    """An error about one lock; ``lock_id`` names it."""

    def __init__(self, message: str, *, lock_id: str | None = None) -> None:
        super().__init__(message if lock_id is None else f"{message} (lock {lock_id!r})")
        self.lock_id = lock_id


class InvalidLockId(LockError, ValueError):
    """The lock id is empty, too long, or contains control characters."""


class LimitMismatch(LockError, ValueError):
    """A semaphore was asked for with another ``limit`` (a read-write lock with another
    ``max_readers``) than the one its holders use: the limit is stored with the primitive, and
    changes only while nobody holds it."""


class LockTimeout(LockError, TimeoutError):
    """``get_lock`` did not acquire the lock within its timeout."""


class LockCancelled(LockError):
    """A pending ``get_lock`` was cancelled."""


class LockReentered(LockError):
    """The thread or asyncio task asking for a lock already holds it (acquired through the same
    :class:`~lockclient.RemoteLocker`, not released yet): waiting would wait for itself — until
    the timeout, or forever. Raised at once, before touching the store. Locks are not re-entrant:
    pass the held lock down instead of taking it again."""


class LockNotOwned(LockError):
    """The caller does not hold the lock (it was released, revoked or lost)."""


class LockLost(LockNotOwned):
    """The lease was revoked by leasewatch or could not be renewed within its length."""
