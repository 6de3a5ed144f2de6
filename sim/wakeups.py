"""Local wake-ups between simulated processes of one host: the abstract-socket names of
:class:`lockclient.wake.LocalWakeups`, as a registry per host. A datagram is delivered after a
short seeded delay (or lost, with the network's reply-loss probability): a wake-up is only ever
a hint, and the algorithms must stay correct when one is late, lost or spurious."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockclient.runtime import Event
from lockclient.wake import TAKEN, Listener, Taken, Watch
from sim.runtime import SimEvent

if TYPE_CHECKING:
    from sim.world import Process

__all__ = ["SimWakeups", "WakeupHost"]


class WakeupHost:
    """The names bound on one simulated host."""

    def __init__(self) -> None:
        self.bound: dict[tuple[str, str, str], _SimListener] = {}


class _SimListener:
    def __init__(self, wakeups: SimWakeups, key: tuple[str, str, str], watch: Watch) -> None:
        self._wakeups = wakeups
        self._key = key
        self.watch = watch
        self._event = SimEvent(wakeups.process)
        self.closed = False

    def wait(self, timeout: float, cancel: Event | None = None) -> bool:
        if cancel is not None and cancel.is_set():
            return False
        woken = self._event.wait(timeout)
        self._event.clear()
        return woken

    def deliver(self) -> None:
        self._event.set()

    def wake(self) -> None:
        self.deliver()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._wakeups.host.bound.get(self._key) is self:
                del self._wakeups.host.bound[self._key]


class SimWakeups:
    """One process's :class:`~lockclient.wake.Wakeups` on a simulated host."""

    def __init__(self, process: Process, host: WakeupHost, *, loss: float = 0.0) -> None:
        self.process = process
        self.host = host
        self.loss = loss

    def listen(self, lock_id: str, watch: Watch) -> Listener | Taken | None:
        key = (lock_id, watch.kind, watch.value)
        existing = self.host.bound.get(key)
        if existing is not None and not existing.closed and not existing._wakeups.process.dead:
            return TAKEN
        listener = _SimListener(self, key, watch)
        self.host.bound[key] = listener
        return listener

    def announce(self, lock_id: str, *, gone: str | None = None, released: str | None = None) -> bool:
        reached = False
        world = self.process.world
        for kind, value in (("gone", gone), ("holder", released)):
            if value is None:
                continue
            listener = self.host.bound.get((lock_id, kind, value))
            if listener is None or listener.closed or listener._wakeups.process.dead:
                continue
            reached = True
            if self.loss and world.rng.random() < self.loss:
                continue
            world.after(world.rng.randint(5_000, 200_000), listener.deliver)
        return reached
