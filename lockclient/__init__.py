"""chronolock's lock client: fair distributed locks over a Cassandra-style cell store.

from lockclient import RemoteLocker
locker = RemoteLocker.from_env()
with locker.get_lock("account:42") as lock:        # blocks, first come first served
    charge(account=42, fencing_token=lock.fencing_token)
lock = locker.try_get_lock("sms:42")                # never waits; None if busy
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lockclient.clock import AsyncTimeServiceClock, GlobalClock, StoreClock, TimeServiceClock
from lockclient.errors import (
    ChronolockError,
    ClockError,
    ConfigurationError,
    InvalidLockId,
    LimitMismatch,
    LockCancelled,
    LockError,
    LockLost,
    LockNotOwned,
    LockReentered,
    LockTimeout,
    StoreAccessDenied,
    StoreError,
    StoreMisconfigured,
    StoreOutcomeUnknown,
    StoreUnavailable,
    TimeServiceUnavailable,
)
from lockclient.fencing import FencedResource, StaleFencingToken
from lockclient.locker import LockStatus, QueueEntry, RemoteLock, RemoteLocker
from lockclient.shutdown import exit_on_sigterm
from lockclient.store import CellStore, open_store

if TYPE_CHECKING:
    from lockclient.permits import Permit

__all__ = [
    "AsyncTimeServiceClock",
    "CellStore",
    "ChronolockError",
    "ClockError",
    "ConfigurationError",
    "FencedResource",
    "GlobalClock",
    "InvalidLockId",
    "LimitMismatch",
    "LockCancelled",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockReentered",
    "LockStatus",
    "LockTimeout",
    "Permit",
    "QueueEntry",
    "RemoteLock",
    "RemoteLocker",
    "StaleFencingToken",
    "StoreAccessDenied",
    "StoreClock",
    "StoreError",
    "StoreMisconfigured",
    "StoreOutcomeUnknown",
    "StoreUnavailable",
    "TimeServiceClock",
    "TimeServiceUnavailable",
    "exit_on_sigterm",
    "open_store",
]


def __getattr__(name: str) -> Any:
    # Permit (semaphores, read-write locks) is loaded when first named: lockclient.permits imports
    # asyncio and greenlet, which ``import lockclient`` does not pay for (issue 25: import time).
    if name == "Permit":
        from lockclient.permits import Permit

        return Permit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
