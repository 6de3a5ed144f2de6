"""Loaded (via PYTHONPATH) only into processes started under libfaketime by the tests.

With FAKETIME_DONT_FAKE_MONOTONIC=1, Python >= 3.11's time.sleep fails with EINVAL
(it uses clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)); Event.wait works
(shared/TESTING.md). Replace it for the skewed process only.
"""

import threading
import time


def _sleep(seconds: float) -> None:
    if seconds > 0:
        threading.Event().wait(seconds)


time.sleep = _sleep
