"""Issue 25, item 4: re-entry is a clear error, locks are released at exit, and the library's
warnings read as sentences when the application configured no logging.

The findings: re-acquiring a lock the same locker holds blocked on itself until the timeout
(forever with ``timeout=None``), with no hint; a process that exited normally kept its lock until
leasewatch revoked it (~13 s); a holder's ``lock_lost`` warning appeared as a raw dict.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import lockclient
from lockclient import CellStore, LockError, LockTimeout, RemoteLocker, open_store

try:  # the error is new with these tests: on the code before it, they must fail, not stop collecting
    from lockclient import LockReentered
except ImportError:  # pragma: no cover - only on the old code
    LockReentered = type("LockReentered", (LockError,), {})  # type: ignore[misc,assignment]

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


@pytest.fixture
def locker(store: CellStore) -> Iterator[RemoteLocker]:
    with RemoteLocker(store, lease=5) as lk:
        yield lk


# -- re-entry ---------------------------------------------------------------------------------


def test_taking_a_lock_this_thread_holds_is_a_clear_error_at_once(locker: RemoteLocker) -> None:
    held = locker.get_lock("re")
    queue_before = locker.status("re").queue
    started = time.monotonic()
    with pytest.raises(LockReentered) as raised:
        locker.get_lock("re", timeout=5)
    assert time.monotonic() - started < 2, "re-entry waited instead of failing at once"
    assert raised.value.lock_id == "re" and isinstance(raised.value, LockError)
    assert "already holds this lock" in str(raised.value)
    assert locker.status("re").queue == queue_before, "a refused re-entry must not touch the store"
    assert locker.try_get_lock("re") is None  # never waits, so no self-deadlock: busy, as before
    held.release()
    again = locker.get_lock("re", timeout=5)  # released: this thread may take it again
    again.release()


def test_another_thread_of_the_same_locker_waits_for_the_holder(locker: RemoteLocker) -> None:
    """Not re-entry: contention between threads that share one locker (one per process is plenty)."""
    held = locker.get_lock("shared")
    got: list[object] = []

    def other() -> None:
        with locker.get_lock("shared", timeout=30) as lock:
            got.append(lock.fencing_token)

    thread = threading.Thread(target=other)
    thread.start()
    while len(locker.status("shared").queue) < 2:
        time.sleep(0.01)
    held.release()
    thread.join(30)
    assert got == [held.fencing_token + 1]


def test_a_task_that_holds_the_lock_gets_a_clear_error_and_other_tasks_wait(locker: RemoteLocker) -> None:
    async def scenario() -> None:
        order: list[str] = []

        async def other() -> None:
            async with await locker.aget_lock("task", timeout=30):
                order.append("other")

        async with await locker.aget_lock("task"):
            with pytest.raises(LockReentered):
                await locker.aget_lock("task", timeout=5)
            assert await locker.atry_get_lock("task") is None
            waiting = asyncio.create_task(other())
            while len(locker.status("task").queue) < 2:  # noqa: ASYNC110 - polling the store
                await asyncio.sleep(0.01)
            order.append("holder")
        await asyncio.wait_for(waiting, 30)
        assert order == ["holder", "other"]

    asyncio.run(scenario())


def test_a_timed_out_reentry_on_the_old_code_would_have_been_a_timeout(locker: RemoteLocker) -> None:
    """What the user saw before: LockTimeout after the whole timeout. Now: LockReentered, a
    LockError that is not a LockTimeout (so a retry loop on timeouts does not spin on it)."""
    with locker.get_lock("t"), pytest.raises(LockError) as raised:
        locker.get_lock("t", timeout=1)
    assert not isinstance(raised.value, LockTimeout)


# -- exit -------------------------------------------------------------------------------------


def _script(body: str) -> str:
    return f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + textwrap.dedent(body)


def _free(sqlite_url: str, lock_id: str) -> bool:
    with RemoteLocker(open_store(sqlite_url), lease=5, owns_store=True) as lk:
        status = lk.status(lock_id)
    return status.holders == [] and status.queue == []


def _env(sqlite_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOCK_")}
    return env | {"CHRONOLOCK_STORE_URL": sqlite_url}


def test_a_lock_held_at_normal_exit_is_released(sqlite_url: str) -> None:
    """No leasewatch runs here: a lock left behind would stay held (for leasewatch to revoke)."""
    program = _script(
        """
        from lockclient import RemoteLocker
        locker = RemoteLocker.from_env()
        lock = locker.get_lock("job")
        print(lock.fencing_token, flush=True)
        sys.exit(0)  # the end of a script that never released
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], env=_env(sqlite_url), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert _free(sqlite_url, "job"), "the lock outlived its process"


def test_a_forked_child_does_not_release_its_parents_locks(sqlite_url: str) -> None:
    program = _script(
        """
        import os
        from lockclient import RemoteLocker
        locker = RemoteLocker.from_env()
        lock = locker.get_lock("parent")
        child = os.fork()
        if child == 0:
            sys.exit(0)  # the child's normal exit runs its atexit handlers
        os.waitpid(child, 0)
        print("held" if locker.status("parent").holders == [lock.owner] else "released by the child", flush=True)
        lock.release()
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", program],
        env=_env(sqlite_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "held"


def test_sigterm_releases_when_the_application_opts_in(sqlite_url: str) -> None:
    program = _script(
        """
        import time, lockclient
        assert lockclient.exit_on_sigterm()
        locker = lockclient.RemoteLocker.from_env()
        with locker.get_lock("daemon"):
            print("held", flush=True)
            time.sleep(60)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", program], env=_env(sqlite_url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert _free(sqlite_url, "daemon"), "SIGTERM left the lock held"


def test_the_library_does_not_take_sigterm_by_itself(store: CellStore) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with RemoteLocker(store, lease=5) as lk:
        lk.get_lock("x").release()
    assert signal.getsignal(signal.SIGTERM) is before
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # an application's own choice is left alone
    try:
        assert lockclient.exit_on_sigterm() is False
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


# -- readable warnings ----------------------------------------------------------------------------


def test_a_lost_lock_warning_reads_as_a_line_without_logging_configured(sqlite_url: str) -> None:
    program = _script(
        """
        from lockclient import RemoteLocker
        locker = RemoteLocker.from_env(lease=5)
        lock = locker.get_lock("account:42", max_hold=0.3)
        assert lock.lost.wait(30)
        locker.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], env=_env(sqlite_url), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "lock_lost" in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("lock_lost: lock_id=account:42 owner="), lines[0]
    assert "{" not in lines[0] and "'event'" not in lines[0], lines[0]
