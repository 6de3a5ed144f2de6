"""Locks a process still holds when it ends are released, not left to leasewatch.

Without this, a program that exits normally while holding a lock — a script that took it at the
top and never released it, a ``sys.exit()`` in the middle of a job — keeps the lock until
leasewatch revokes its lease (lease + grace + a look: ~13 s with the defaults), and everyone
waits for that (issue 25).

* **Normal interpreter exit** (the end of the program, ``sys.exit()``, an unhandled exception):
  an :mod:`atexit` handler releases every lock that a live, unclosed
  :class:`~lockclient.RemoteLocker` of this process acquired and nobody released, then closes
  those lockers (waiting a little for
  releases the store did not answer at once). On by default; ``RemoteLocker(...,
  release_at_exit=False)`` opts a locker out. A forked child never releases its parent's locks
  (the handler checks the process id).
* **SIGTERM** kills a Python process outright by default: no ``finally``, no ``with`` exit, no
  ``atexit``. A library must not take over a signal its application may handle itself, so this
  is **opt-in**: :func:`exit_on_sigterm` (call it once at start-up, in the main thread) makes
  SIGTERM raise :class:`SystemExit` (status 143) in the main thread, so the program unwinds —
  its ``with`` blocks release their locks — and exits normally, running the handler above. It
  does nothing if SIGTERM already has a handler (the application's, or a server's such as
  uvicorn's, which shuts down gracefully and exits normally anyway). ``lockctl`` handles
  SIGTERM itself: it forwards the signal to its command and releases the lock.
* SIGKILL, a crash or a power cut release nothing: that is what leases and leasewatch are for.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref
from types import FrameType
from typing import TYPE_CHECKING

from lockclient.logs import get_logger

if TYPE_CHECKING:
    from lockclient.locker import RemoteLocker

__all__ = ["AT_EXIT_TIMEOUT_S", "exit_on_sigterm", "release_at_exit"]

log = get_logger("lockclient")

AT_EXIT_TIMEOUT_S = 2.0
"""How long, per locker, the exit handler waits for releases the store did not answer at once."""

_lockers: weakref.WeakSet[RemoteLocker] = weakref.WeakSet()
_lock = threading.Lock()
_registered_in: set[int] = set()
"""The process ids whose handler is registered (the current process's, and a parent's after a fork)."""


def release_at_exit(locker: RemoteLocker) -> None:
    """Release ``locker``'s unreleased locks (and close it) when the interpreter exits normally."""
    with _lock:
        pid = os.getpid()
        if pid not in _registered_in:
            # Once per process. In a forked child the parent's lockers are not the child's to
            # release (and the parent's handler, inherited, does nothing there: it checks the pid).
            _lockers.clear()
            atexit.register(_at_exit, pid)
            _registered_in.add(pid)
        _lockers.add(locker)


def _at_exit(pid: int) -> None:
    if pid != os.getpid():
        return  # a forked child: these are its parent's locks
    with _lock:
        lockers = list(_lockers)
    for locker in lockers:
        if locker.closed:
            continue  # closed by its owner: its locks were left to expire on purpose (RemoteLocker.close)
        try:
            locker.release_held(reason="interpreter exit")
            locker.close(AT_EXIT_TIMEOUT_S)
        except Exception:  # one locker's failure must not keep the others' locks
            log.exception("release_at_exit_failed")


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> bool:
    """Let SIGTERM end this process like ``sys.exit(143)``, so held locks are released (see the
    module's docstring). Returns False, changing nothing, when SIGTERM already has a handler
    other than the default; call it from the main thread, before starting your own work."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _sigterm)
    return True
