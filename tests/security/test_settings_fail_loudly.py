"""Issue 25, item 1: settings that cannot fail silently.

Found on a fresh clone: a misspelt variable was dropped without a word (``extra="ignore"``) —
``CHRONOLOCK_STORE_ULR`` took the lock in a private store, ``CHRONOLOCK_CASANDRA_SSL=true``
logged in over plaintext — and a client without ``CHRONOLOCK_STORE_URL`` invented
``./.chronolock/cells.db`` (creating directories) wherever it ran. A read-only store exited 69
("try again") instead of 78 ("fix the configuration"). Every entry point now refuses all of it
at start-up: exit 78 from the commands, ConfigurationError from ``RemoteLocker.from_env()``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Only what existed before the fix is imported here, so that every finding's test runs (and
# fails) on the old code; the new helpers are imported by the tests of the helpers themselves.
from leasewatch.settings import LeasewatchSettings
from lockclient.errors import ConfigurationError
from lockclient.locker import RemoteLocker
from lockclient.settings import ClientSettings, StoreSettings, env_names
from lockclient.store import open_store
from lockclient.store.opener import public_error
from timesvc.settings import TimesvcSettings

PREFIXES = ("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_")
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
EXIT_CONFIG = 78
WAIT = 60.0

# The examples, each with the name it misspells (and a value the real setting accepts).
MISSPELT = [
    ("CHRONOLOCK_STORE_ULR", "CHRONOLOCK_STORE_URL", "sqlite:////tmp/elsewhere/cells.db"),
    ("CHRONOLOCK_CASANDRA_SSL", "CHRONOLOCK_CASSANDRA_SSL", "true"),
    ("TIMESVC_MAX_SKWE", "TIMESVC_MAX_SKEW", "2.0"),
    ("LEASEWATCH_GRACEE", "LEASEWATCH_GRACE", "3.0"),
    ("CHRONOLOCK_CASSANDRA_SSL_VERIFYY", "CHRONOLOCK_CASSANDRA_SSL_VERIFY", "full"),
    ("CHRONOLOCK_TIMESVC_URL", "CHRONOLOCK_TIMESVC_URLS", "http://127.0.0.1:8701"),
]

# What the kubelet gives every pod of the namespace for the Services timesvc and leasewatch
# when enableServiceLinks is on (pkg/kubelet/envvars/envvars.go).
SERVICE_LINKS = {
    "TIMESVC_SERVICE_HOST": "10.96.0.10",
    "TIMESVC_SERVICE_PORT": "8700",
    "TIMESVC_SERVICE_PORT_HTTP": "8700",
    "TIMESVC_PORT": "tcp://10.96.0.10:8700",
    "TIMESVC_PORT_8700_TCP": "tcp://10.96.0.10:8700",
    "TIMESVC_PORT_8700_TCP_PROTO": "tcp",
    "TIMESVC_PORT_8700_TCP_PORT": "8700",
    "TIMESVC_PORT_8700_TCP_ADDR": "10.96.0.10",
    "LEASEWATCH_SERVICE_HOST": "10.96.0.11",
    "LEASEWATCH_SERVICE_PORT": "8710",
    "LEASEWATCH_SERVICE_PORT_HTTP": "8710",
    "LEASEWATCH_PORT": "tcp://10.96.0.11:8710",
    "LEASEWATCH_PORT_8710_TCP": "tcp://10.96.0.11:8710",
    "LEASEWATCH_PORT_8710_TCP_PROTO": "tcp",
    "LEASEWATCH_PORT_8710_TCP_PORT": "8710",
    "LEASEWATCH_PORT_8710_TCP_ADDR": "10.96.0.11",
    # A Service named "chronolock-admin" (IPv6 cluster IP, UDP port) in the same namespace.
    "CHRONOLOCK_ADMIN_SERVICE_HOST": "fd00::a",
    "CHRONOLOCK_ADMIN_SERVICE_PORT": "53",
    "CHRONOLOCK_ADMIN_PORT": "udp://[fd00::a]:53",
    "CHRONOLOCK_ADMIN_PORT_53_UDP_ADDR": "fd00::a",
}


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(PREFIXES)}
    env.update(extra)
    return env


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.upper().startswith(PREFIXES):
            monkeypatch.delenv(name)
    return monkeypatch


def _run(args: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=WAIT, check=False, **kwargs)


def _assert_refused(result: subprocess.CompletedProcess[str], *names: str) -> None:
    assert result.returncode == EXIT_CONFIG, (result.returncode, result.stdout, result.stderr)
    assert "configuration error" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    for name in names:
        assert name in result.stderr, (name, result.stderr)


# -- unknown variables -----------------------------------------------------------------------


@pytest.mark.parametrize(("typo", "meant", "value"), MISSPELT)
@pytest.mark.parametrize("settings_cls", [ClientSettings, TimesvcSettings, LeasewatchSettings])
def test_a_misspelt_variable_is_refused_naming_the_closest_valid_one(
    settings_cls: type[StoreSettings], typo: str, meant: str, value: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("CHRONOLOCK_STORE_URL", f"sqlite:///{tmp_path}/cells.db")
    clean_env.setenv(typo, value)
    with pytest.raises(ConfigurationError) as caught:
        settings_cls()
    message = str(caught.value)
    assert f"{typo} is not a chronolock setting (did you mean {meant}?)" in message
    assert value not in message, "a value is never quoted: a misspelt ..._PASSWORD still holds a password"


@pytest.mark.parametrize(("typo", "meant", "value"), MISSPELT)
def test_from_env_raises_configuration_error_for_a_misspelt_variable(
    typo: str, meant: str, value: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("CHRONOLOCK_STORE_URL", f"sqlite:///{tmp_path}/cells.db")
    clean_env.setenv(typo, value)
    with pytest.raises(ConfigurationError, match=f"did you mean {meant}"):
        RemoteLocker.from_env().close()


def test_every_unknown_variable_is_named_at_once_and_lower_case_ones_too(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("CHRONOLOCK_STORE_URL", f"sqlite:///{tmp_path}/cells.db")
    clean_env.setenv("CHRONOLOCK_FOO", "1")
    clean_env.setenv("chronolock_lease_s", "5")  # pydantic-settings reads names in any case
    clean_env.setenv("TIMESVC_URLS", "http://t:8700")  # the prefix of the real name left out
    clean_env.setenv("CHRONOLOCK_PORT", "8080")  # *_PORT without a service link's value
    with pytest.raises(ConfigurationError) as caught:
        ClientSettings()
    message = str(caught.value)
    assert "CHRONOLOCK_FOO is not a chronolock setting (no setting is spelt like it)" in message
    assert "chronolock_lease_s is not a chronolock setting (did you mean CHRONOLOCK_LEASE?)" in message
    assert "TIMESVC_URLS is not a chronolock setting (did you mean CHRONOLOCK_TIMESVC_URLS?)" in message
    assert "CHRONOLOCK_PORT is not a chronolock setting" in message


def test_one_setting_given_twice_in_different_case_is_refused(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("CHRONOLOCK_STORE_URL", f"sqlite:///{tmp_path}/cells.db")
    clean_env.setenv("CHRONOLOCK_LEASE", "10")
    clean_env.setenv("chronolock_lease", "1")
    with pytest.raises(ConfigurationError, match="set twice with different values"):
        ClientSettings()


def test_each_program_accepts_every_programs_variables(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A pod, a shell or `make up` sets the variables of every component at once: each program
    accepts the others' without reading them (and lockctl run's, make up's and the test tools')."""
    valid = {
        "CHRONOLOCK_STORE_URL": f"sqlite:///{tmp_path}/cells.db",
        "CHRONOLOCK_TIMESVC_URLS": "http://127.0.0.1:8701",
        "CHRONOLOCK_LEASEWATCH_URL": "http://127.0.0.1:8704",
        "CHRONOLOCK_LEASE": "5",
        "TIMESVC_MAX_SKEW": "2",
        "TIMESVC_READ_TOKEN": "r" * 40,
        "LEASEWATCH_GRACE": "3",
        "LEASEWATCH_ADMIN_TOKEN": "a" * 40,  # the deprecated spelling is still read
        "CHRONOLOCK_LOCK_ID": "outer-job",  # set by an outer `lockctl run`
        "CHRONOLOCK_FENCING_TOKEN": "7",
        "CHRONOLOCK_LOCK_OWNER": "host.1.MainThread.x",
        "CHRONOLOCK_UP_PORT": "8701",
        "CHRONOLOCK_TEST_CASSANDRA": "127.0.0.1:9042",
        "CHRONOLOCK_BENCH_PAXOS": "v2",
        "CHRONOLOCK_FAULT_SEED": "1",
        **SERVICE_LINKS,
    }
    for name, value in valid.items():
        clean_env.setenv(name, value)
    assert ClientSettings().lease == 5
    assert TimesvcSettings().max_skew == 2
    assert LeasewatchSettings().grace == 3


def test_service_links_are_not_read_as_ports(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With enableServiceLinks on and no port in the pod spec, TIMESVC_PORT is the kubelet's
    ``tcp://10.96.0.10:8700``: it used to stop timesvc (not an int); the default port applies."""
    clean_env.setenv("CHRONOLOCK_STORE_URL", f"sqlite:///{tmp_path}/cells.db")
    for name, value in SERVICE_LINKS.items():
        clean_env.setenv(name, value)
    assert TimesvcSettings().port == 8700
    assert LeasewatchSettings().port == 8710
    clean_env.setenv("TIMESVC_PORT", "9999")  # a pod spec's own value wins over the link: it is read
    assert TimesvcSettings().port == 9999


def test_a_timesvc_pod_with_service_links_on_starts(processes: Any, tmp_path: Path) -> None:
    """Every link variable of the namespace in a real replica's environment; the port is the pod
    spec's (it overrides the link, as the kubelet does). The replica serves."""
    links = {name: value for name, value in SERVICE_LINKS.items() if name != "TIMESVC_PORT"}
    replica = processes.timesvc(f"sqlite:///{tmp_path}/cells.db", env=links)
    replica.wait_ready()


def test_the_service_variable_list_is_exactly_what_the_services_read() -> None:
    """The library does not import the services; its list of their variables must not drift."""
    from lockclient.environment import SERVICE_ENV
    from lockclient.settings import all_env_names

    services = all_env_names(TimesvcSettings) | all_env_names(LeasewatchSettings)
    assert services - all_env_names(StoreSettings) == SERVICE_ENV


# Names in the repository that are not variables chronolock reads, on purpose: the misspellings
# these tests and the README show, a worker's positional argument, a service-link example.
NOT_VARIABLES = {typo for typo, _, _ in MISSPELT} | {
    "CHRONOLOCK_FOO",
    "CHRONOLOCK_PORT",
    "CHRONOLOCK_PASSWORD",
    "CHRONOLOCK_XYZZY",
    "LEASEWATCH_TIMESVC_URL",
    "CHRONOLOCK_ADMIN_PORT",  # a service link, recognised by its value (tcp://...), not its name
    "TIMESVC_URLS",  # tests/lock/ring_worker.py: an argument's name
}
_NAME = re.compile(r"\b(?:CHRONOLOCK|TIMESVC|LEASEWATCH)_[A-Z0-9_]*[A-Z0-9]\b")


def test_every_variable_the_repository_names_is_accepted() -> None:
    """A variable added to a tool, a test or a manifest without being registered would stop every
    program that finds it in its environment: every name in the repository must be accepted."""
    from lockclient.environment import check_environment
    from lockclient.settings import known_env_names

    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    names: set[str] = set()
    for relative in files.splitlines():
        path = REPO / relative
        if path.suffix in (".png", ".json") or not path.is_file():
            continue
        names.update(_NAME.findall(path.read_text(errors="replace")))
    names -= NOT_VARIABLES
    assert "CHRONOLOCK_STORE_URL" in names and "CHRONOLOCK_TEST_CASSANDRA" in names  # the scan works
    unknown = []
    for name in sorted(names):
        try:
            check_environment({name: "x"}, known_env_names(ClientSettings))
        except ConfigurationError:
            unknown.append(name)
    assert not unknown, f"named in the repository but refused at start-up: {unknown} (lockclient/environment.py)"


def test_the_closest_name_prefers_the_same_prefix_and_gives_none_when_nothing_is_close() -> None:
    from lockclient.environment import DEVELOPMENT_ENV, RUNTIME_ENV, closest_name
    from lockclient.settings import known_env_names

    known = known_env_names(ClientSettings) | RUNTIME_ENV | DEVELOPMENT_ENV
    assert closest_name("CHRONOLOCK_TIMESVC_URL", known) == "CHRONOLOCK_TIMESVC_URLS"
    assert closest_name("LEASEWATCH_TIMESVC_URL", known) == "LEASEWATCH_TIMESVC_URLS"
    assert closest_name("CHRONOLOCK_PASSWORD", known) == "CHRONOLOCK_CASSANDRA_PASSWORD"
    assert closest_name("CHRONOLOCK_XYZZY", known) is None


# Every entry point, each with one of the examples. The store URL is valid, so the misspelt
# variable is the only problem; before, each of these ran (or served) as if it were not there.
ENTRY_POINTS = [
    ("lockctl", ["run", "job", "--", sys.executable, "-c", "open('ran', 'w')"]),
    ("lockctl", ["status", "job"]),
    ("lockctl", ["schema"]),
    ("lockctl", ["roles", "--schema-password-file", "pw", "--client-password-file", "pw"]),
    ("lockctl", ["settings"]),
    ("timesvc", ["serve"]),
    ("timesvc", ["settings"]),
    ("leasewatch", ["serve"]),
    ("leasewatch", ["settings", "--json"]),
]


@pytest.mark.parametrize(("index", "program", "args"), [(i, *entry) for i, entry in enumerate(ENTRY_POINTS)])
def test_every_entry_point_refuses_a_misspelt_variable_with_exit_78(
    index: int, program: str, args: list[str], tmp_path: Path
) -> None:
    typo, meant, value = MISSPELT[index % len(MISSPELT)]
    (tmp_path / "pw").write_text("p" * 20)
    env = _clean_env(
        CHRONOLOCK_STORE_URL=f"sqlite:///{tmp_path}/cells.db",
        TIMESVC_PORT="0",
        LEASEWATCH_PORT="0",
        **{typo: value},
    )
    result = _run([str(BIN / program), *args], env, cwd=tmp_path)
    _assert_refused(result, typo, f"did you mean {meant}?")
    assert not (tmp_path / "ran").exists(), "the command ran"
    assert not (tmp_path / "cells.db").exists(), "the store was opened"


# -- no store URL, no invented store ---------------------------------------------------------


def test_lockctl_without_a_store_url_refuses_to_invent_one(tmp_path: Path) -> None:
    """It used to exit 0 after creating ./.chronolock/cells.db in whatever directory it ran in."""
    result = _run([str(BIN / "lockctl"), "run", "job", "--", "touch", "ran"], _clean_env(), cwd=tmp_path)
    _assert_refused(result, "CHRONOLOCK_STORE_URL is not set", "make up", "absolute")
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing may be created: no store, no command run"


@pytest.mark.parametrize("program", ["timesvc", "leasewatch"])
def test_a_service_without_a_store_url_refuses_to_start(program: str, tmp_path: Path) -> None:
    result = _run([str(BIN / program), "serve"], _clean_env(TIMESVC_PORT="0", LEASEWATCH_PORT="0"), cwd=tmp_path)
    _assert_refused(result, "CHRONOLOCK_STORE_URL is not set")
    assert list(tmp_path.iterdir()) == []


def test_from_env_without_a_store_url_raises_configuration_error(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match=r"CHRONOLOCK_STORE_URL is not set.*make up"):
        RemoteLocker.from_env().close()
    assert list(tmp_path.iterdir()) == []


def test_a_relative_sqlite_path_is_refused(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``sqlite:///cells.db`` names a different file in every working directory: a private store again."""
    clean_env.chdir(tmp_path)
    clean_env.setenv("CHRONOLOCK_STORE_URL", "sqlite:///cells.db")
    with pytest.raises(ConfigurationError, match="relative SQLite path"):
        RemoteLocker.from_env().close()
    assert list(tmp_path.iterdir()) == []


def test_a_missing_store_directory_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "deeper"
    env = _clean_env(CHRONOLOCK_STORE_URL=f"sqlite:///{missing}/cells.db")
    result = _run([str(BIN / "lockctl"), "run", "job", "--", "touch", str(tmp_path / "ran")], env)
    _assert_refused(result, "does not exist", "does not create it")
    assert not (tmp_path / "no-such-dir").exists()
    assert not (tmp_path / "ran").exists()
    with pytest.raises(ConfigurationError):
        open_store(f"sqlite:///{missing}/cells.db")
    assert not (tmp_path / "no-such-dir").exists()


def test_a_store_path_that_is_a_directory_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "cells.db").mkdir()
    env = _clean_env(CHRONOLOCK_STORE_URL=f"sqlite:///{tmp_path}/cells.db")
    result = _run([str(BIN / "lockctl"), "status", "job"], env)
    _assert_refused(result, "cannot be opened for writing")


@pytest.fixture
def read_only_store() -> Iterator[tuple[Path, list[str]]]:
    """A store with its lock cells, that the user running lockctl may read but not write, and the
    command prefix that runs a program as that user.

    Root writes read-only files anyway, so when the suite runs as root lockctl runs as nobody
    (setpriv; in a directory of its own under /tmp: pytest's tmp dirs are private to their owner)."""
    as_user: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv (util-linux): cannot run lockctl as another user")
        as_user = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        probe = _run([*as_user, sys.executable, "-c", "import lockclient.cli"], _clean_env(), cwd="/")
        if probe.returncode != 0:
            pytest.skip(f"running as root, and user nobody cannot run this interpreter: {probe.stderr[-300:]}")
    directory = Path(tempfile.mkdtemp(prefix="chronolock-ro-"))
    try:
        open_store(f"sqlite:///{directory}/cells.db").close()  # created by its owner
        for path in directory.iterdir():
            path.chmod(0o444)
        directory.chmod(0o555)
        yield directory, as_user
    finally:
        directory.chmod(0o755)
        shutil.rmtree(directory)


def test_a_read_only_store_is_a_configuration_error_not_unavailable(
    read_only_store: tuple[Path, list[str]],
) -> None:
    """It said "unable to open database file" and exited 69 (EX_UNAVAILABLE: try again later);
    only a change of permissions helps, so it is 78 (EX_CONFIG), naming what to check."""
    directory, as_user = read_only_store
    env = _clean_env(CHRONOLOCK_STORE_URL=f"sqlite:///{directory}/cells.db")
    check = f"import os; print(os.access({str(directory / 'cells.db')!r}, os.W_OK))"
    writable = _run([*as_user, sys.executable, "-c", check], env, cwd="/")
    assert writable.stdout.strip() == "False", "precondition: lockctl's user cannot write the store"
    for args in (["run", "job", "--", "true"], ["status", "job"]):
        result = _run([*as_user, str(BIN / "lockctl"), *args], env, cwd="/")
        _assert_refused(result, "cannot be opened for writing", "permissions")


def test_a_read_only_store_is_reported_as_such_by_the_services() -> None:
    """What /readyz may say (lockclient.store.opener.public_error): the kind, no path. And a
    service whose store directory is missing answers 503, not a dropped connection."""
    from lockclient.errors import StoreError, StoreMisconfigured

    with pytest.raises(StoreMisconfigured) as caught:
        open_store("sqlite:////secret/path/cells.db")
    assert isinstance(caught.value, StoreError) and isinstance(caught.value, ConfigurationError)
    assert public_error(caught.value) == "store misconfigured: its directory does not exist, or it cannot be written"
    error = StoreMisconfigured("the SQLite store '/secret/path/cells.db' cannot be opened for writing")
    error.__cause__ = sqlite3.OperationalError("attempt to write a readonly database")
    shown = public_error(error)
    assert shown == (
        "store misconfigured: its directory does not exist, or it cannot be written "
        "(attempt to write a readonly database)"
    )
    assert "/secret/path" not in shown


# -- the settings commands -------------------------------------------------------------------


SETTINGS_COMMANDS = [
    ("lockctl", {"CHRONOLOCK_LEASE": "7.5"}, {"CHRONOLOCK_LEASE": 7.5, "CHRONOLOCK_HTTP_TIMEOUT": 2.0}),
    ("timesvc", {"TIMESVC_MAX_SKEW": "2.5"}, {"TIMESVC_MAX_SKEW": 2.5, "TIMESVC_TICK": 0.5}),
    ("leasewatch", {"LEASEWATCH_GRACE": "3.5"}, {"LEASEWATCH_GRACE": 3.5, "LEASEWATCH_SCAN_INTERVAL": 1.0}),
]


@pytest.mark.parametrize(("program", "given", "expected"), SETTINGS_COMMANDS)
def test_settings_prints_the_effective_settings_and_where_each_came_from(
    program: str, given: dict[str, str], expected: dict[str, float], tmp_path: Path
) -> None:
    password = "Settings-Passw0rd-never-shown"
    env = _clean_env(
        CHRONOLOCK_STORE_URL=f"cassandra://app:{password}@db1:9042/chronolock?dc=dc1",
        CHRONOLOCK_CASSANDRA_SSL="true",
        **given,
    )
    human = _run([str(BIN / program), "settings"], env)
    assert human.returncode == 0, human.stderr
    assert password not in human.stdout + human.stderr
    rows = {
        line.split()[0]: line.split()[1:]
        for line in human.stdout.splitlines()
        if line.startswith("  ") and line.split()[0].isupper()
    }
    settings_cls = {"lockctl": ClientSettings, "timesvc": TimesvcSettings, "leasewatch": LeasewatchSettings}[program]
    assert set(rows) == env_names(settings_cls)
    assert rows["CHRONOLOCK_STORE_URL"] == ["cassandra://db1:9042/chronolock?dc=dc1", "environment"]
    assert rows["CHRONOLOCK_CASSANDRA_SSL"] == ["true", "environment"]
    assert rows["CHRONOLOCK_CASSANDRA_PASSWORD"] == ["(unset)", "default"]
    for name, value in expected.items():
        assert rows[name] == [f"{value:g}", "environment" if name in given else "default"]

    as_json = _run([str(BIN / program), "settings", "--json"], env)
    assert as_json.returncode == 0, as_json.stderr
    shown = json.loads(as_json.stdout)
    assert set(shown) == env_names(settings_cls)
    assert shown["CHRONOLOCK_STORE_URL"] == "cassandra://db1:9042/chronolock?dc=dc1"
    assert shown["CHRONOLOCK_CASSANDRA_SSL"] is True
    for name, value in expected.items():
        assert shown[name] == value


def test_settings_shows_a_service_link_it_did_not_read() -> None:
    env = _clean_env(CHRONOLOCK_STORE_URL="sqlite:////var/lib/chronolock/cells.db", **SERVICE_LINKS)
    result = _run([str(BIN / "timesvc"), "settings"], env)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.split()[:1] == ["TIMESVC_PORT"])
    assert line.split()[1:3] == ["8700", "default;"] and "Kubernetes service link" in line
