"""Issue 16: store URL options are checked (finding 1), numbers are finite and in range (also-fix
"numeric options"), and a service or lockctl with a bad setting says so in one line, exit 78."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from leasewatch.settings import LeasewatchSettings
from lockclient.errors import ConfigurationError
from lockclient.settings import ClientSettings
from lockclient.store import open_store, parse_store_url
from timesvc.settings import TimesvcSettings

BIN = Path(sys.executable).parent
PASSWORD = "Sup3r-secret-store-password"


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("cassandra://h/ks?tiemout=5", "tiemout"),
        ("cassandra://h/ks?ssl=true&sslmode=verify-full", "sslmode"),
        ("cassandra://h/ks?consistency=ONE", "consistency"),
        ("sqlite:///x.db?timeout=5", "timeout"),  # a Cassandra option on SQLite
        ("sqlite:///x.db?ssl=true", "ssl"),
    ],
)
def test_unknown_options_are_refused_naming_the_valid_ones(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_store_url(url)
    message = str(caught.value)
    assert repr(named) in message and "valid options" in message
    from lockclient.store.url import CASSANDRA_OPTIONS, SQLITE_OPTIONS

    valid = SQLITE_OPTIONS if url.startswith("sqlite") else CASSANDRA_OPTIONS
    assert all(option in message for option in valid)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///x.db?busy_timeout=nan",
        "sqlite:///x.db?busy_timeout=inf",
        "sqlite:///x.db?busy_timeout=1e308",
        "sqlite:///x.db?busy_timeout=-1",
        "sqlite:///x.db?gc_grace=nan",
        "sqlite:///x.db?busy_timeout=1&busy_timeout=2",
        "cassandra://h/ks?timeout=0",
        "cassandra://h/ks?timeout=nan",
        "cassandra://h/ks?resolve_timeout=1e9",
        "cassandra://h/ks?protocol_version=2",
        "cassandra://h/ks?lock_scope=world",
        "cassandra://h/ks?ssl=maybe",
        "cassandra://h/ks?ssl=false&ssl_ca=/ca.pem",
        "cassandra://h/ks?ssl_verify=sometimes",
        "cassandra://h/ks?ssl_key=/k.pem",
        "cassandra://h/ks?ssl_verify=ca&ssl_hostname=db",
        "cassandra://h/ks?dc",
    ],
)
def test_bad_option_values_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_store_url(url)


def test_valid_options_still_parse() -> None:
    parsed = parse_store_url(
        "cassandra://h1,h2:9042/ks?dc=dc1&lock_scope=datacenter&timeout=2.5&resolve_timeout=9"
        "&ssl_ca=/ca.pem&ssl_cert=/c.pem&ssl_key=/k.pem&ssl_hostname=db.example"
    )
    tls = parsed.tls()  # type: ignore[attr-defined,unused-ignore]
    assert tls.enabled and tls.verify == "full" and tls.hostname == "db.example" and tls.key == "/k.pem"
    assert parse_store_url("sqlite:///x.db?busy_timeout=0&gc_grace=60").float_option("gc_grace", 1) == 60


def test_no_error_message_quotes_the_password() -> None:
    for url in (
        f"cassandra://app:{PASSWORD}@h:99999/ks",
        f"cassandra://app:{PASSWORD}@h:x/ks",
        f"cassandra://app:{PASSWORD}@h:9042/",
        f"cassandra://app:{PASSWORD}@h/ks?tiemout=1",
        f"cassandra://app:{PASSWORD}@/ks",
    ):
        with pytest.raises(ConfigurationError) as caught:
            parse_store_url(url)
        assert PASSWORD not in str(caught.value), str(caught.value)


def test_nan_and_huge_numbers_never_reach_the_store(tmp_path: Path) -> None:
    """busy_timeout=1e308 used to reach sqlite3 and fail on the first /now (a 500)."""
    with pytest.raises(ConfigurationError, match="busy_timeout"):
        open_store(f"sqlite:///{tmp_path}/x.db?busy_timeout=1e308")


@pytest.mark.parametrize(
    ("cls", "name", "value"),
    [
        (ClientSettings, "CHRONOLOCK_LEASE", "nan"),
        (ClientSettings, "CHRONOLOCK_LEASE", "inf"),
        (ClientSettings, "CHRONOLOCK_HTTP_TIMEOUT", "1e308"),
        (TimesvcSettings, "TIMESVC_MAX_SKEW", "inf"),
        (TimesvcSettings, "TIMESVC_SHUTDOWN_GRACE", "nan"),
        (TimesvcSettings, "TIMESVC_MIN_TRIP_INTERVAL", "-1"),
        (TimesvcSettings, "TIMESVC_MAX_CONNECTIONS", "0"),
        (TimesvcSettings, "TIMESVC_HEADER_TIMEOUT", "inf"),
        (LeasewatchSettings, "LEASEWATCH_GRACE", "inf"),
        (LeasewatchSettings, "LEASEWATCH_ORPHAN_AFTER", "nan"),
        (LeasewatchSettings, "LEASEWATCH_GC_INTERVAL", "1e308"),
        (LeasewatchSettings, "LEASEWATCH_WAIT_POLL_RATE", "nan"),
        (LeasewatchSettings, "LEASEWATCH_MAX_WAITERS", "5000"),  # not below max connections
        (LeasewatchSettings, "CHRONOLOCK_CASSANDRA_SSL_VERIFY", "yes-please"),
    ],
)
def test_numeric_settings_are_finite_and_in_range(
    cls: type[ClientSettings], name: str, value: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key in list(os.environ):
        if key.startswith(("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CHRONOLOCK_STORE_URL", f"sqlite:///{tmp_path}/cells.db")  # required (issue 25)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as caught:
        cls()
    assert "input_value" not in str(caught.value), "a rejected value is never echoed (it may be a secret)"


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_"))}
    env.update(extra)
    return env


@pytest.mark.parametrize(
    ("program", "args"),
    [("timesvc", ["serve"]), ("leasewatch", ["serve"]), ("lockctl", ["status", "x"])],
)
def test_bad_settings_give_one_line_and_exit_78(program: str, args: list[str], tmp_path: Path) -> None:
    for url in (f"sqlite:///{tmp_path}/x.db?busy_timeout=nan", f"cassandra://app:{PASSWORD}@h:99999/ks"):
        result = subprocess.run(
            [str(BIN / program), *args],
            env=_clean_env(CHRONOLOCK_STORE_URL=url),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 78, (result.returncode, result.stderr)
        assert "configuration error" in result.stderr
        assert "Traceback" not in result.stderr
        assert PASSWORD not in result.stderr + result.stdout
