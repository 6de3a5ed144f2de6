"""``lockctl run``'s pydantic-free settings reader agrees with ``ClientSettings`` — or abstains.

:func:`lockclient.clientenv.read_client_env` exists for start-up time (issue 25, item 3). The
settings are a safety feature (issue 25, item 1): a misspelt variable, a missing store URL or a
bad value must stop lockctl with exit 78. The reader never refuses anything itself: it returns
values only when ``ClientSettings()`` would accept the environment and produce exactly those
values, and None otherwise (lockctl then runs ``ClientSettings()``, which refuses). Checked
here on generated environments, with the field table held equal to the class.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from lockclient.clientenv import (
    CLIENT_ENV,
    CLIENT_SECRET_ENV,
    FIELDS,
    FLOAT_BOUNDS,
    ClientValues,
    read_client_env,
)
from lockclient.settings import ClientSettings, StoreSettings, all_env_names, secret_env_names

URL = "sqlite:////tmp/chronolock-clientenv-test/cells.db"


def _full(env: dict[str, str]) -> ClientSettings | Exception:
    with mock.patch.dict(os.environ, env, clear=True):
        try:
            return ClientSettings()
        except Exception as exc:  # ValidationError, ConfigurationError
            return exc


def _plain(value: Any) -> Any:
    return value.get_secret_value() if isinstance(value, SecretStr) or hasattr(value, "get_secret_value") else value


def assert_agrees(env: dict[str, str]) -> ClientValues | None:
    fast = read_client_env(env)
    if fast is None:
        return None
    full = _full(env)
    assert not isinstance(full, Exception), f"the fast reader accepted what ClientSettings refuses: {full}"
    for name in FIELDS:
        assert _plain(getattr(fast, name)) == _plain(getattr(full, name)), name
        assert type(getattr(fast, name)) is type(getattr(full, name)) or name == "cassandra_password", name
    assert fast.tls() == full.tls()
    return fast


def test_the_table_is_client_settings() -> None:
    assert set(FIELDS) == set(ClientSettings.model_fields)
    for name, (variable, _kind) in FIELDS.items():
        field = ClientSettings.model_fields[name]
        assert field.validation_alias is not None
        assert list(field.validation_alias.choices) == [variable], name  # type: ignore[union-attr]
        default = ClientValues.__dataclass_fields__[name].default
        if name != "store_url":
            assert default == field.default, name
    assert all_env_names(ClientSettings) == CLIENT_ENV
    assert secret_env_names(ClientSettings) | secret_env_names(StoreSettings) == CLIENT_SECRET_ENV
    for name, (lower, inclusive, upper) in FLOAT_BOUNDS.items():
        metadata = {type(m).__name__: m for m in ClientSettings.model_fields[name].metadata}
        assert metadata["Le"].le == upper, name
        if inclusive:
            assert metadata["Ge"].ge == lower, name
        else:
            assert metadata["Gt"].gt == lower, name
    kinds = {kind for _variable, kind in FIELDS.values()}
    assert kinds <= {"str", "opt", "path", "secret", "bool", "verify", "float"}


def test_everyday_environments_are_read() -> None:
    """The forms people write are read by the fast reader (or lockctl would start slowly)."""
    assert assert_agrees({"CHRONOLOCK_STORE_URL": URL}) == ClientValues(store_url=URL)
    everyday = {
        "CHRONOLOCK_STORE_URL": "cassandra://h1,h2:9042/chronolock?dc=dc1",
        "CHRONOLOCK_CASSANDRA_USERNAME": "chronolock",
        "CHRONOLOCK_CASSANDRA_PASSWORD": "a-long-password-for-the-store",
        "CHRONOLOCK_CASSANDRA_SSL": "true",
        "CHRONOLOCK_CASSANDRA_SSL_CA": "/etc/ca.pem",
        "CHRONOLOCK_CASSANDRA_SSL_VERIFY": "full",
        "CHRONOLOCK_TIMESVC_URLS": "http://t1:8700,http://t2:8700",
        "CHRONOLOCK_LEASEWATCH_URL": "http://lw:8710",
        "CHRONOLOCK_LEASE": "10",
        "CHRONOLOCK_HTTP_TIMEOUT": "2.5",
        "CHRONOLOCK_CLOCK_MAX_AGE": "0",
        "CHRONOLOCK_ALLOW_STORE_CLOCK": "false",
        "TIMESVC_PORT": "8700",  # another component's setting: accepted, not read
        "CHRONOLOCK_LOCK_ID": "outer",  # set by an outer lockctl run
    }
    assert assert_agrees(everyday) is not None


@pytest.mark.parametrize(
    "env",
    [
        {},  # no store URL: ClientSettings refuses it (exit 78)
        {"CHRONOLOCK_STORE_URL": ""},
        {"CHRONOLOCK_STORE_URL": "sqlite:///relative.db"},
        {"CHRONOLOCK_STORE_URL": URL, "CHRONOLOCK_STORE_ULR": URL},  # misspelt: refused
        {"CHRONOLOCK_STORE_URL": URL, "CHRONOLOCK_CASANDRA_SSL": "true"},
        {"CHRONOLOCK_STORE_URL": URL, "TIMESVC_MAX_SKWE": "1"},
        {"CHRONOLOCK_STORE_URL": URL, "chronolock_lease": "5"},  # case games
        {"chronolock_store_url": URL},
        {"CHRONOLOCK_STORE_URL": URL, "CHRONOLOCK_LEASE": "0"},
        {"CHRONOLOCK_STORE_URL": URL, "CHRONOLOCK_LEASE": "3601"},
        {"CHRONOLOCK_STORE_URL": URL, "CHRONOLOCK_LEASE": "inf"},
        {"CHRONOLOCK_STORE_URL": URL, "CHRONOLOCK_LEASE": "1e3"},
        {"CHRONOLOCK_STORE_URL": URL, "CHRONOLOCK_CASSANDRA_SSL": "maybe"},
        {"CHRONOLOCK_STORE_URL": URL, "CHRONOLOCK_CASSANDRA_SSL_VERIFY": "FULL"},
        {"CHRONOLOCK_STORE_URL": URL, "CHRONOLOCK_CASSANDRA_SSL_KEY": "/k.pem"},  # a key without a certificate
    ],
)
def test_anything_doubtful_is_left_to_client_settings(env: dict[str, str]) -> None:
    assert read_client_env(env) is None


def _values(*plain: str) -> st.SearchStrategy[str]:
    listed = st.sampled_from(plain)
    return st.one_of(listed, listed, listed, st.text(max_size=6))  # mostly the listed forms


BOOLS = _values("true", "false", "True", "FALSE", "1", "0", "yes", "no", "on", "off", "t", "f", "y", "n", " true", "")
NUMBERS = _values("10", "0.5", "0", "0.0", "3600", "3600.0", "3601", "600", "601", "010", "1e3", " 5", "5 ", "inf")
NUMBERS = st.one_of(NUMBERS, st.from_regex(r"\A[0-9]{1,4}(\.[0-9]{1,4})?\Z"))
TEXTS = _values("", " ", "/etc/ca.pem", " /etc/ca.pem ", "db.example", "chronolock")
URLS = _values(URL, "sqlite:///rel.db", "", "cassandra://h:9042/ks?dc=dc1", "cassandra://u:p@h/ks", "mysql://h/x")
VALUES = {
    "CHRONOLOCK_STORE_URL": URLS,
    "CHRONOLOCK_CASSANDRA_USERNAME": TEXTS,
    "CHRONOLOCK_CASSANDRA_PASSWORD": TEXTS,
    "CHRONOLOCK_CASSANDRA_SSL": BOOLS,
    "CHRONOLOCK_CASSANDRA_SSL_CA": TEXTS,
    "CHRONOLOCK_CASSANDRA_SSL_CERT": TEXTS,
    "CHRONOLOCK_CASSANDRA_SSL_KEY": TEXTS,
    "CHRONOLOCK_CASSANDRA_SSL_HOSTNAME": TEXTS,
    "CHRONOLOCK_CASSANDRA_SSL_VERIFY": _values("full", "ca", "none", "Full", ""),
    "CHRONOLOCK_TIMESVC_URLS": TEXTS,
    "CHRONOLOCK_LEASEWATCH_URL": TEXTS,
    "CHRONOLOCK_LEASE": NUMBERS,
    "CHRONOLOCK_HTTP_TIMEOUT": NUMBERS,
    "CHRONOLOCK_CLOCK_MAX_AGE": NUMBERS,
    "CHRONOLOCK_ALLOW_STORE_CLOCK": BOOLS,
    # Not the client's: another component's, a runtime one, a service link, a misspelling.
    "TIMESVC_PORT": _values("8700", "tcp://10.0.0.7:8700"),
    "CHRONOLOCK_LOCK_ID": TEXTS,
    "CHRONOLOCK_TIMESVC_URL": TEXTS,
    "LEASEWATCH_PORT_8710_TCP": _values("tcp://10.0.0.8:8710"),
}


@st.composite
def environments(draw: st.DrawFn) -> dict[str, str]:
    names = draw(st.sets(st.sampled_from(sorted(VALUES)), max_size=5))
    env = {name: draw(VALUES[name]) for name in sorted(names)}
    if draw(st.booleans()):
        env["CHRONOLOCK_STORE_URL"] = URL  # most generated environments should be readable at all
    return {name: value for name, value in env.items() if "\x00" not in value}


@settings(max_examples=600, deadline=None)
@given(environments())
def test_generated_environments_read_as_client_settings_reads_them_or_left_to_it(env: dict[str, str]) -> None:
    assert_agrees(env)


def test_lockctl_run_refuses_a_misspelt_variable_with_exit_78(tmp_path: Path) -> None:
    """Through the lockctl script (the fast path in front): the safety checks are all still there."""
    import subprocess

    from tests.cli.support import LOCKCTL

    base = {k: v for k, v in os.environ.items() if not k.startswith(("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_"))}
    url = f"sqlite:///{tmp_path / 'cells.db'}"
    cases = [
        (base | {"CHRONOLOCK_STORE_URL": url, "CHRONOLOCK_TIMESVC_URL": "3"}, "CHRONOLOCK_TIMESVC_URL"),
        (base, "CHRONOLOCK_STORE_URL is not set"),
        (base | {"CHRONOLOCK_STORE_URL": url, "CHRONOLOCK_LEASE": "0"}, "CHRONOLOCK_LEASE"),
        (base | {"CHRONOLOCK_STORE_URL": f"sqlite:///{tmp_path / 'missing' / 'cells.db'}"}, "missing"),
    ]
    for env, named in cases:
        done = subprocess.run(
            [str(LOCKCTL), "run", "job", "--", "true"], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 78, (named, done.stderr)
        assert named in done.stderr
    ok = subprocess.run(
        [str(LOCKCTL), "run", "job", "--", "true"],
        env=base | {"CHRONOLOCK_STORE_URL": url},
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
