"""Worker functions run in separate processes by the contract suite (spawn start method)."""

from __future__ import annotations

import uuid

from lockclient.store import Table, open_store


def counter_value(raw: str | None) -> int:
    return int((raw or "0").partition("|")[0])


def write_versions(url: str, row: str, column: str, timestamps: list[int]) -> None:
    """Write one cell many times with the given timestamps (value = the timestamp)."""
    with open_store(url) as store:
        for ts in timestamps:
            store.put(Table.QUEUE, row, column, f"v{ts:020d}", timestamp=ts)


def append_columns(url: str, row: str, prefix: str, count: int) -> None:
    with open_store(url) as store:
        for i in range(count):
            store.put(Table.QUEUE, row, f"{prefix}-{i:05d}", prefix, timestamp=1_000 + i)


def cas_increment(url: str, row: str, times: int) -> tuple[list[str], int]:
    """Increment a counter cell `times` times by read-modify-write compare-and-set; returns the
    values this worker's successful increments wrote and how many attempts ended *uncertain*
    (outcome unknown and the row changed since: applied or not, nobody can tell).

    Values are ``"<n>|<writer>"``: unique, as the port's contract requires (lockclient/store/
    base.py) — that is what lets an unknown or re-proposed outcome be recognised as ours."""
    me = uuid.uuid4().hex
    written: list[str] = []
    uncertain = 0
    with open_store(url) as store:
        while len(written) < times:
            current = store.read_versioned(row).get("counter")
            nxt = f"{counter_value(current) + 1}|{me}"
            result = store.compare_and_set(row, {"counter": current}, {"counter": nxt})
            if result.applied:
                written.append(nxt)
            elif result.uncertain:
                uncertain += 1
    return written, uncertain
