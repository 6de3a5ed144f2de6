"""chronolock's lock client: fair distributed locks over a Cassandra-style cell store.

from lockclient import RemoteLocker
locker = RemoteLocker.from_env()
with locker.get_lock("account:42") as lock:        # blocks, first come first served
    charge(account=42, fencing_token=lock.fencing_token)
lock = locker.try_get_lock("sms:42")                # never waits; None if busy
"""

from __future__ import annotations

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
from lockclient.permits import Permit
from lockclient.store import CellStore, open_store

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
    "open_store",
]
