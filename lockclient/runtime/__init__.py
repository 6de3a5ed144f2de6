"""The runtime: everything the lock's algorithms take from the world, except the store.

The algorithms (the fair queue, leases and their keeper, the clock client, leasewatch's
watcher and partition leases, timesvc's TryUpdateGlobalTime) never call ``time``,
``threading``, ``random`` or ``socket`` themselves: they ask a :class:`Runtime` for the
time, to sleep, for events, locks and conditions, to start a concurrent task, and for
randomness. Three runtimes drive the same code:

* :class:`ThreadRuntime` (:data:`THREADS`, the default): real clocks and OS threads — the
  synchronous API (``get_lock``), the services and ``lockctl``;
* :mod:`lockclient.runtime.aio`: the same blocking-style code run inside greenlets on an
  asyncio event loop — ``aget_lock`` with no thread per waiter;
* the deterministic simulator (``sim/``): virtual time and a seeded scheduler that chooses
  every interleaving, so a seed is a schedule, reproducible byte for byte.

Why not generators (the h11/h2 "sans-IO" shape)? The algorithms read like the thesis'
listings — straight-line loops with waits and store calls in the middle — and a rewrite
into explicit state machines would change every line of the code it is meant to prove.
Instead the *boundary* is explicit (everything crosses :class:`Runtime` or the
:class:`~lockclient.store.CellStore` port), and the asyncio runtime and the simulator
suspend that straight-line code at exactly those calls with greenlets (the way
SQLAlchemy runs its synchronous core on asyncio). A test runs the simulator with
``time``'s clocks and ``time.sleep`` replaced by traps, so a hidden call is found.
"""

from __future__ import annotations

from lockclient.runtime.base import Condition, Event, Lock, Pool, Runtime, Task
from lockclient.runtime.threads import THREADS, ThreadRuntime

__all__ = ["THREADS", "Condition", "Event", "Lock", "Pool", "Runtime", "Task", "ThreadRuntime"]
