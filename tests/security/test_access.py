"""Issue 16, also-fix: admin and read tokens, confusable lock ids, a truthful OpenAPI schema."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from lockclient import InvalidLockId, RemoteLocker, open_store
from tests.support.procs import BIN, Fleet, free_port, service_env

pytestmark = pytest.mark.slow

ALICE = "alice-token-0123456789abcdef0123456789"
CI = "ci-token-0123456789abcdef0123456789abc"
READ = "read-token-0123456789abcdef0123456789a"


@pytest.mark.parametrize(
    "tokens",
    [
        "",
        "   ",
        "short",
        "alice:short-but-named",
        f"alice:{ALICE},bob",
        f"alice:{ALICE},alice:{CI}",
        f"a:{ALICE},b:{ALICE}",
    ],
)
def test_blank_short_or_ambiguous_admin_tokens_stop_leasewatch_at_start(tokens: str, tmp_path: Path) -> None:
    env = service_env(
        {
            "CHRONOLOCK_STORE_URL": f"sqlite:///{tmp_path}/cells.db",
            "LEASEWATCH_PORT": str(free_port()),
            "LEASEWATCH_ADMIN_TOKENS": tokens,
        }
    )
    result = subprocess.run(
        [str(BIN / "leasewatch"), "serve"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 78, result.stderr
    assert "LEASEWATCH_ADMIN_TOKENS" in result.stderr
    for entry in tokens.split(","):
        token = entry.rpartition(":")[2]  # names may be shown, tokens never
        if len(token.strip()) > 4:
            assert token not in result.stderr, "a rejected token is never echoed"


def test_named_admin_tokens_record_who_revoked(processes: Fleet, sqlite_url: str) -> None:
    lw = processes.leasewatch(sqlite_url, admin_token=f"alice:{ALICE},ci:{CI}")
    lw.wait_ready()
    with open_store(sqlite_url) as store, RemoteLocker(store, lease=30) as locker:
        first, second = locker.get_lock("orders"), locker.get_lock("invoices")
        with httpx.Client(base_url=lw.url, timeout=5) as http:
            assert http.post("/revoke/orders", headers={"Authorization": "Bearer nope-" + "x" * 40}).status_code == 401
            assert http.post("/revoke/orders", headers={"Authorization": f"Basic {ALICE}"}).status_code == 401
            assert http.post("/revoke/orders", headers={"Authorization": f"Bearer {ALICE}"}).json()["revoked"] == [
                first.owner
            ]
            assert http.post("/revoke/invoices", headers={"Authorization": f"Bearer {CI}"}).status_code == 200
            events = {e["lock_id"]: e for e in http.get("/revocations").json()}
            metrics = http.get("/metrics").text
        assert events["orders"]["caller"] == "alice" and events["invoices"]["caller"] == "ci"
        assert 'leasewatch_auth_failures_total{scope="admin"} 2.0' in metrics
        assert first.lost.wait(10) and second.lost.wait(10)
    assert "caller" in lw.log_tail(100) and ALICE not in lw.log_tail(400)


def test_the_read_token_guards_lock_listings_but_not_health_or_waits(processes: Fleet, sqlite_url: str) -> None:
    lw = processes.leasewatch(sqlite_url, admin_token=f"alice:{ALICE}", env={"LEASEWATCH_READ_TOKEN": READ})
    lw.wait_ready()
    with open_store(sqlite_url) as store, RemoteLocker(store, lease=30) as locker:
        lock = locker.get_lock("customer:4711")
        with httpx.Client(base_url=lw.url, timeout=5) as http:
            for path in ("/locks", "/locks/customer%3A4711", "/revocations", "/observed", "/time", "/trends"):
                refused = http.get(path)
                assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer", path
                assert "customer" not in refused.text and lock.owner not in refused.text
                assert http.get(path, headers={"Authorization": f"Bearer {READ}"}).status_code == 200, path
                assert http.get(path, headers={"Authorization": f"Bearer {ALICE}"}).status_code == 200, path
                assert http.get(path, headers={"Authorization": f"Bearer {CI}"}).status_code == 401, path
            for path in ("/healthz", "/readyz", "/metrics", "/"):
                assert http.get(path).status_code == 200, path
            # Clients wait and notify without a token (they only learn about the lock they wait for).
            wait = http.get(f"/wait/customer%3A4711?holder={quote(lock.owner)}&timeout=0.2")
            assert wait.status_code == 200
            assert http.post("/notify/customer%3A4711").status_code == 202
        lock.release()


def test_timesvc_status_needs_the_read_token_when_set(processes: Fleet, sqlite_url: str) -> None:
    replica = processes.timesvc(sqlite_url, name="r", env={"TIMESVC_READ_TOKEN": READ})
    replica.wait_ready()
    with httpx.Client(base_url=replica.url, timeout=5) as http:
        assert http.get("/status").status_code == 401
        assert http.get("/status", headers={"Authorization": f"Bearer {READ}"}).status_code == 200
        assert http.get("/now").status_code == 200  # global time itself is not secret


def test_leasewatch_sends_its_timesvc_token_to_timesvc_status(processes: Fleet, sqlite_url: str) -> None:
    """The page's time panel reads timesvc /status server-side: with TIMESVC_READ_TOKEN set there,
    LEASEWATCH_TIMESVC_TOKEN must carry it; without it the panel says so. Neither token is shown."""
    replica = processes.timesvc(sqlite_url, name="guarded-ts", env={"TIMESVC_READ_TOKEN": READ})
    replica.wait_ready()
    urls = {"LEASEWATCH_TIMESVC_URLS": replica.url, "LEASEWATCH_TREND_INTERVAL": "0.5"}
    without = processes.leasewatch(sqlite_url, name="lw-no-ts-token", env=urls)
    with_token = processes.leasewatch(sqlite_url, name="lw-ts-token", env={**urls, "LEASEWATCH_TIMESVC_TOKEN": READ})

    def polled(lw_url: str) -> dict[str, object]:
        deadline = time.monotonic() + 20
        while True:
            answer = httpx.get(f"{lw_url}/time", timeout=5).json()["replicas"][0]
            if answer["polled_at"] is not None:
                return answer  # type: ignore[no-any-return]
            assert time.monotonic() < deadline, "never polled"
            time.sleep(0.1)

    refused = polled(without.url)
    assert refused["reachable"] is False and refused["error"] == "answered 401: a valid bearer token is required"
    accepted = polled(with_token.url)
    assert accepted["reachable"] is True and accepted["replica"] == "guarded-ts"
    for lw in (without, with_token):
        assert READ not in httpx.get(f"{lw.url}/time", timeout=5).text and READ not in lw.log_tail(400)


LOOK_ALIKES = {
    "NFD (e + combining acute)": "cafe\u0301",
    "zero-width space": "pay\u200bments",
    "zero-width joiner": "pay\u200dments",
    "right-to-left override": "invoice-\u202egnp.exe",
    "BOM": "\ufefforders",
    "no-break space": "order\u00a042",
    "line separator": "a\u2028b",
    "soft hyphen": "pay\u00adments",
}


@pytest.mark.parametrize("name", sorted(LOOK_ALIKES))
def test_look_alike_lock_ids_are_refused_everywhere(name: str, processes: Fleet, sqlite_url: str) -> None:
    lock_id = LOOK_ALIKES[name]
    with open_store(sqlite_url) as store, RemoteLocker(store, lease=5) as locker:
        with pytest.raises(InvalidLockId):
            locker.get_lock(lock_id, timeout=1)
        with pytest.raises(InvalidLockId):
            locker.try_get_lock(lock_id)
    env = service_env({"CHRONOLOCK_STORE_URL": sqlite_url})
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lockctl"), "run", lock_id, "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    if name == "NFD (e + combining acute)":
        lw = processes.leasewatch(sqlite_url)
        answer = httpx.get(f"{lw.url}/wait/{quote(lock_id)}?holder=x&timeout=1", timeout=5)
        assert answer.status_code == 422 and "NFC" in answer.json()["detail"]
        # The composed form is an ordinary lock id.
        with open_store(sqlite_url) as store, RemoteLocker(store, lease=5) as locker:
            locker.get_lock("caf\u00e9", timeout=5).release()


def test_openapi_states_the_real_lock_id_limit(processes: Fleet, sqlite_url: str) -> None:
    lw = processes.leasewatch(sqlite_url)
    schema = httpx.get(f"{lw.url}/openapi.json", timeout=5).json()
    seen = 0
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "lock_id":
                    seen += 1
                    assert parameter["schema"]["maxLength"] == 256, path
                    assert parameter["schema"]["x-max-utf8-bytes"] == 256, path
                    assert "NFC" in parameter["description"], path
    assert seen >= 4  # /wait, /notify, /revoke, /locks/{id}
    assert "1024" not in str(schema)
