"""The operator page grown into a dashboard (issue 11), and the JSON behind every number on it.

One busy state (tests/leasewatch/busy.py: two timesvc replicas and one that is down, 1,000
held lock ids, a queue of three behind a holder, two threads taking turns on a lock, an
operator revocation and a dead holder revoked) serves every test here. The JSON endpoints are
checked against what was done; then Debian's chromium loads the page and the DOM must show the
holder, the queue in order, the revocations and the time panel. Screenshots go to the test's
tmp dir (and to ``$CHRONOLOCK_PAGE_SCREENSHOTS`` when set: that is how docs/leasewatch-*.png are
made). No assertion is about wall-clock time.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.leasewatch.busy import CHURNED, CRASHED, QUEUED, REVOKED, Busy, busy_state
from tests.support.browser import chromium, dump_dom, elements, screenshot
from tests.support.procs import fleet

pytestmark = pytest.mark.slow

READ = "read-token-0123456789abcdef0123456789a"


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Busy]:
    workdir = tmp_path_factory.mktemp("busy")
    with fleet(workdir) as processes, busy_state(processes, workdir, trend_interval=0.5) as state:
        yield state


def _until(what: str, check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.1)


def _json(busy: Busy, path: str, **params: object) -> Any:
    return busy.get(path, **params)


def test_time_json_shows_each_timesvc_replica_and_names_no_url(busy: Busy) -> None:
    def rates() -> dict[str, Any] | None:
        answer = _json(busy, "/time")
        named = {r["replica"] or f"#{r['target']}": r for r in answer["replicas"]}
        seen = any((named[n]["now_per_s"] or 0) > 0 for n in ("timesvc-a", "timesvc-b"))
        return answer if seen else None

    # The lockers take tickets from both replicas: a /now rate appears after two polls.
    answer = _until("a /now rate", rates)
    assert answer["configured"] == 3 and answer["healthy"] is False
    replicas = {r["replica"] or f"#{r['target']}": r for r in answer["replicas"]}
    assert set(replicas) == {"timesvc-a", "timesvc-b", "#3"}
    for name in ("timesvc-a", "timesvc-b"):
        r = replicas[name]
        assert r["reachable"] and r["ready"] and r["in_sync"] and not r["runaway"], r
        assert r["problems"] == [] and r["error"] is None
        assert r["max_skew_s"] == 1.0 and r["last_ok_tick_age_s"] is not None and r["now_requests"] >= 0
        assert r["last_publisher"] in ("timesvc-a", "timesvc-b")
    down = replicas["#3"]
    assert down["reachable"] is False and down["replica"] is None and down["error"] == "cannot connect"
    assert down["problems"] == ["unreachable: cannot connect"]
    if busy.skewed:
        # timesvc-b's clock runs 0.2 s ahead; GlobalTime follows the clock furthest ahead.
        gap = replicas["timesvc-a"]["offset_s"] - replicas["timesvc-b"]["offset_s"]
        assert gap == pytest.approx(-0.2, abs=0.1)
        # a's estimate of b: b's last publication extrapolated from when a first read it, so it
        # lags by up to a tick plus a store read — more on a loaded machine (seen: -0.04 s in CI).
        tick = httpx.get(f"{busy.timesvc[0].url}/status", timeout=10).json()["tick_s"]
        seen = replicas["timesvc-a"]["peer_offsets_s"]["timesvc-b"]
        assert 0.2 - tick - 0.3 <= seen <= 0.3, (seen, tick)
    # Replicas are named by position and id, never by address.
    raw = httpx.get(f"{busy.leasewatch.url}/time", timeout=10).text
    for process in busy.timesvc:
        assert str(process.port) not in raw
    assert "127.0.0.1" not in raw


def test_trends_json_counts_grants_waits_revocations_and_clock_offsets(busy: Busy) -> None:
    def enough() -> dict[str, Any] | None:
        t = _json(busy, "/trends")
        w = t["window"]
        return t if w["samples"] >= 6 and w["grants"] >= 2 and w["revocations"] >= 2 else None

    trends = _until("trend samples with grants and revocations", enough)
    assert trends["interval_s"] == 0.5 and trends["size"] == 720
    samples = trends["samples"]
    assert [s["at"] for s in samples] == sorted(s["at"] for s in samples)
    assert sum(s["grants"] for s in samples) == trends["window"]["grants"]
    for s in samples:
        if s["wait_p50_s"] is not None:
            assert 0 <= s["wait_p50_s"] <= s["wait_p99_s"]
        assert s["grants_per_s"] >= 0 and s["store_errors"] == 0
    last = samples[-1]
    assert last["locks"] >= 1002  # the 1,000 fleet ids, the queued lock and the churned one
    assert last["longest_wait_s"] > 0  # three waiters behind the holder of orders/eu:42
    assert set(last["clock_offsets_s"]) == {"timesvc-a", "timesvc-b"}
    assert trends["window"]["max_wait_p99_s"] is not None
    assert len(_json(busy, "/trends", limit=3)["samples"]) == 3


def test_lock_json_has_holder_token_hold_time_queue_waits_and_leases(busy: Busy) -> None:
    lock = _json(busy, f"/locks/{quote(QUEUED, safe='')}")
    holder = lock["holder"]
    assert holder["owner"] == busy.holder and holder["fencing_token"] == 1 and lock["fencing_token"] == 1
    assert holder["held_for_s"] is not None and holder["held_for_s"] >= 0 and holder["seen_since"] is not None
    assert holder["lease_s"] == 5.0 and holder["version"] >= 0
    queue = lock["queue"]
    assert [q["owner"] for q in queue] == [busy.holder, *busy.waiters]
    assert queue[0]["holding"] is True and queue[0]["waited_s"] is None
    waits = [q["waited_s"] for q in queue[1:]]
    assert all(w is not None and w > 0 for w in waits)
    assert waits == sorted(waits, reverse=True), "who queued first has waited longest"
    assert [q["enqueued_at"] for q in queue] == sorted(q["enqueued_at"] for q in queue)
    leases = {lease["owner"]: lease for lease in lock["leases"]}
    assert set(leases) == {busy.holder, *busy.waiters}
    assert [o for o, lease in leases.items() if lease["holding"]] == [busy.holder]
    assert all(lease["version"] >= 0 and lease["lease_s"] == 5.0 for lease in leases.values())
    grants = _json(busy, "/observed", lock_id=CHURNED)["grants"]
    assert grants and {g["lock_id"] for g in grants} == {CHURNED}
    assert _json(busy, f"/locks/{quote('nobody/ever', safe='')}")["holder"] is None


def test_revocations_json_filters_by_lock_and_says_who_why_and_which_replica(busy: Busy) -> None:
    by_operator = _json(busy, "/revocations", lock_id=REVOKED)
    assert len(by_operator) == 1
    event = by_operator[0]
    assert event["owner"] == busy.revoked and event["caller"] == "oncall" and event["holder"] is True
    assert event["reason"] == "revoked by an operator" and event["by"] == "leasewatch-1"
    dead = _json(busy, "/revocations", lock_id=CRASHED)
    assert [e["owner"] for e in dead] == [busy.crashed] and dead[0]["caller"] is None
    assert dead[0]["unchanged_for_s"] >= 2.0, "revoked only after its 2 s lease ran out unrenewed"
    assert len(_json(busy, "/revocations", limit=1)) == 1
    assert _json(busy, "/revocations", lock_id="nobody/ever") == []


def test_a_thousand_ids_page_and_search(busy: Busy) -> None:
    page = httpx.get(f"{busy.leasewatch.url}/locks", params={"prefix": "fleet/rack-07/"}, timeout=10)
    ids = [line["lock_id"] for line in page.json()]
    assert ids == [f"fleet/rack-07/node-{i:02d}" for i in range(100)]
    assert all(line["most_overdue"] is None or line["most_overdue"] < 1 for line in page.json())
    first = httpx.get(f"{busy.leasewatch.url}/locks", params={"limit": 100}, timeout=10)
    assert len(first.json()) == 100 and "next" in first.links


def _saved(path: Path) -> None:
    target = os.environ.get("CHRONOLOCK_PAGE_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)


def test_the_page_shows_holder_queue_revocations_and_time_in_a_real_browser(busy: Busy, tmp_path: Path) -> None:
    chromium()  # skips, saying why, where it cannot run
    _until("trend samples to draw", lambda: _json(busy, "/trends")["window"]["samples"] >= 6)
    url = busy.leasewatch.url
    lock_view = f"{url}/#lock={quote(QUEUED, safe='')}"
    dom = dump_dom(lock_view, tmp_path / "profile")
    found = elements(dom)
    assert '<div id="error"></div>' in dom, "every endpoint answered"

    def with_attr(name: str) -> list[tuple[str, dict[str, str], str]]:
        return [e for e in found if name in e[1]]

    # What is this lock doing?
    holder = next(e for e in found if e[1].get("id") == "lock-holder")
    assert holder[2] == busy.holder
    assert [e[1]["data-queue-owner"] for e in with_attr("data-queue-owner")] == [busy.holder, *busy.waiters]
    assert {e[1]["data-lease-owner"] for e in with_attr("data-lease-owner")} == {busy.holder, *busy.waiters}
    assert next(e for e in found if e[1].get("id") == "lock-panel")[1].get("hidden") is None
    assert next(e for e in found if e[1].get("id") == "locks-panel")[1].get("hidden") is not None
    # What went wrong recently?
    revoked = {e[1]["data-revoked"] for e in with_attr("data-revoked")}
    assert {busy.revoked, busy.crashed} <= revoked
    assert "revoked by an operator" in dom and "oncall" in dom
    # Is time healthy?
    assert {e[1]["data-timesvc"] for e in with_attr("data-timesvc")} == {"timesvc-a", "timesvc-b", "#3"}
    assert "unreachable: cannot connect" in dom
    # Trends: sparklines drawn (a path per series with at least two points).
    cards = {e[1]["id"] for e in found if e[1].get("id", "").startswith("trend-")}
    assert cards == {f"trend-{n}" for n in ("grants", "wait", "longest", "revocations", "store-errors", "now")}
    # Issue 25: the big "longest current wait" is the number the line under the cards gives (it was
    # the last trend sample's, seconds older: "5.4 s" above "Longest wait now: 9.6 s").
    card = next(i for i, e in enumerate(found) if e[1].get("id") == "trend-longest")
    longest_figure = next(e[2] for e in found[card:] if e[1].get("class") == "value")
    line = next(e for e in found if e[1].get("id") == "longest")[2]
    assert line.startswith(f"Longest wait now: {longest_figure};"), (longest_figure, line)
    assert sum(1 for e in found if e[0] == "path" and "L" in e[1].get("d", "")) >= 6

    # The list: 1,000 ids in pages of 100, and the search in the fragment.
    listing = elements(dump_dom(f"{url}/", tmp_path / "profile"))
    rows = [e[1]["data-lock"] for e in listing if "data-lock" in e[1]]
    assert len(rows) == 100 and rows == sorted(rows) and rows[0] == "fleet/rack-00/node-00"
    assert "disabled" not in next(e for e in listing if e[1].get("id") == "next")[1], "there is a next page"
    searched = elements(dump_dom(f"{url}/#prefix=fleet%2Frack-07%2F", tmp_path / "profile"))
    rows = [e[1]["data-lock"] for e in searched if "data-lock" in e[1]]
    assert rows == [f"fleet/rack-07/node-{i:02d}" for i in range(100)]

    for name, address, height in (
        ("leasewatch-page.png", f"{url}/", 1500),
        ("leasewatch-lock.png", lock_view, 1500),
    ):
        _saved(screenshot(address, tmp_path / name, tmp_path / "profile", size=(1400, height)))


def test_the_page_sends_the_read_token_from_the_fragment(busy: Busy, tmp_path: Path) -> None:
    """Last in this module: the second replica it starts takes over half of the partitions."""
    chromium()
    guarded = busy.leasewatch_with(env={"LEASEWATCH_READ_TOKEN": READ}, name="leasewatch-guarded")
    view = f"#lock={quote(QUEUED, safe='')}"
    refused = elements(dump_dom(f"{guarded.url}/{view}", tmp_path / "profile"))
    error = next(e for e in refused if e[1].get("id") == "error")[2]
    assert "a valid bearer token is required" in error and "#token=" in error
    shown = dump_dom(f"{guarded.url}/#token={READ}&{view[1:]}", tmp_path / "profile")
    assert '<div id="error"></div>' in shown
    assert next(e for e in elements(shown) if e[1].get("id") == "lock-holder")[2] == busy.holder
