"""k8s/monitoring: the alert rules are valid and unit-tested with promtool, and every metric the
rules and the Grafana dashboard query is exported by running timesvc and leasewatch processes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from lockclient import RemoteLocker, open_store
from tests.support.procs import Fleet

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "k8s" / "monitoring"
RULES = MONITORING / "chronolock.rules.yml"
RULE_TESTS = MONITORING / "chronolock.rules.test.yml"
DASHBOARD = MONITORING / "chronolock-dashboard.json"

# PromQL words that are not metric names: functions are recognised by the "(" after them.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}
_SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("",),
}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: `make test` installs Debian's prometheus package (DEBIAN_PACKAGES)")
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values, templates)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery windows
    text = re.sub(r"\b\d[\w.]*", "", text)  # numbers and durations (5m, 1e3)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word, rest = match.group(0), text[match.end() :].lstrip()
        if rest.startswith("(") or word in _KEYWORDS or word.startswith("$"):
            continue
        if text[match.start() - 1 : match.start()] == "$":  # Grafana variables ($__rate_interval)
            continue
        names.add(word)
    return names


def test_metric_names_are_found_in_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, instance) (rate(x_seconds_bucket{instance=~"$instance"}'
        "[$__rate_interval]))) > on(instance) y_total offset 5m and bool z"
    )
    assert metric_names(expr) == {"x_seconds_bucket", "y_total", "z"}
    assert metric_names("abs(a) > on(instance) b") == {"a", "b"}


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            exprs.append(re.sub(r"^label_values\(([^,)]+).*", r"\1", query["query"]))
    return exprs


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in done.stdout


def test_promtool_unit_tests_pass_and_cover_every_alert() -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        check=False,
        cwd=MONITORING,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    fired = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == fired, f"alerts without a firing test: {sorted(alerts - fired)}"


def exported_names(metrics_text: str) -> set[str]:
    """Every sample name a /metrics page declares (families without samples yet included)."""
    names = set()
    for family in text_string_to_metric_families(metrics_text):
        names.update(family.name + suffix for suffix in _SAMPLE_SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def _maintained(lw_url: str) -> None:
    deadline = time.monotonic() + 15
    while not httpx.get(f"{lw_url}/status", timeout=5).json()["store"]:
        assert time.monotonic() < deadline, "no store maintenance reported"
        time.sleep(0.05)


def _queued(lw_url: str, lock_id: str, length: int) -> None:
    deadline = time.monotonic() + 15
    while True:
        body = httpx.get(f"{lw_url}/locks/{lock_id}", timeout=5).json()
        if len(body["queue"]) >= length:
            return
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


@pytest.mark.slow
def test_every_metric_queried_is_exported_by_the_running_services(processes: Fleet, sqlite_url: str) -> None:
    timesvc = processes.timesvc(sqlite_url)
    leasewatch = processes.leasewatch(sqlite_url, scan_interval=0.1)
    timesvc.wait_ready()
    leasewatch.wait_ready()
    # A busy moment: one holder, one waiter, so the wait and grant metrics have values.
    with open_store(sqlite_url) as store, RemoteLocker(store, lease=3) as locker:
        holder = locker.get_lock("monitored")
        waiter_side = RemoteLocker(open_store(sqlite_url), lease=3, owns_store=True)
        granted = threading.Event()

        def wait_for_it() -> None:
            with waiter_side.get_lock("monitored", timeout=30):
                granted.set()

        thread = threading.Thread(target=wait_for_it)
        thread.start()
        try:
            _queued(leasewatch.url, "monitored", 2)
            _maintained(leasewatch.url)  # the store's sizes are in the metrics
            time.sleep(0.5)  # a few scans see the waiter waiting
            observed = httpx.get(f"{leasewatch.url}/observed", timeout=5).json()
            httpx.get(f"{timesvc.url}/now", timeout=5).raise_for_status()
            lw_text = httpx.get(f"{leasewatch.url}/metrics", timeout=5).text
            ts_text = httpx.get(f"{timesvc.url}/metrics", timeout=5).text
        finally:
            holder.release()
            thread.join(timeout=30)
            waiter_side.close()
    assert granted.is_set()

    exported = exported_names(lw_text) | exported_names(ts_text)
    for source, exprs in (("rules", rule_exprs()), ("dashboard", dashboard_exprs())):
        queried = set().union(*(metric_names(e) for e in exprs))
        assert queried, source
        missing = sorted(queried - exported)
        assert not missing, f"{source} query metrics that no service exports: {missing}"

    families = list(text_string_to_metric_families(lw_text))
    samples = {s.name: s.value for f in families for s in f.samples if not s.labels}
    assert samples["leasewatch_grants_observed_total"] >= 1
    assert samples["leasewatch_oldest_waiter_seconds"] > 0
    assert 0 < samples["leasewatch_oldest_waiter_leases"] < 5
    # One replica owns every partition: the partition alerts' sum equals the total.
    assert samples["leasewatch_partitions_owned"] == samples["leasewatch_partitions"] == 64
    assert samples["leasewatch_partition_takeovers_total"] == 0
    sizes = {s.labels["file"]: s.value for f in families for s in f.samples if s.name == "leasewatch_store_bytes"}
    assert sizes["database"] > 0 and "wal" in sizes
    # The JSON the alerts' runbook points to (/observed) names the lock behind the longest wait.
    assert observed["longest_wait"]["lock_id"] == "monitored" and observed["longest_wait"]["seconds"] > 0
    assert [g["lock_id"] for g in observed["grants"]] == ["monitored"]
    assert observed["store_errors"] == []
