"""The lock client's settings read without pydantic: ``lockctl run``'s start-up (issue 25, item 3).

:class:`~lockclient.settings.ClientSettings` (pydantic-settings) is *the* definition of the
``CHRONOLOCK_*`` settings: their names, types, bounds, defaults and error messages. Importing
pydantic and pydantic-settings and building the classes costs a CLI start ~150 ms of CPU, more
than everything else ``lockctl run NAME -- true`` does — the target is ``python -c pass`` +
150 ms + the store's round trips. So ``lockctl run`` first tries :func:`read_client_env`: a
reader of the same variables that only ever *accepts* — it answers with the values
``ClientSettings()`` would produce, or with ``None`` whenever it is not certain of that:

* any problem at all — an unknown ``CHRONOLOCK_*`` / ``TIMESVC_*`` / ``LEASEWATCH_*`` variable,
  a prefixed name in lower or mixed case, no or a bad ``CHRONOLOCK_STORE_URL``, a value outside
  the plain forms below, a bound broken, inconsistent TLS settings;
* a number in any form but plain decimal digits (``10``, ``0.5``), a boolean other than
  ``true/false/1/0/yes/no/on/off`` (any case), a verification mode other than ``full/ca/none``.

``None`` sends the caller to ``ClientSettings()`` — the one place that refuses, with the one
wording (exit 78) — so this module never decides that a setting is wrong, and it cannot make a
wrong value right: every value it accepts is one pydantic accepts identically
(``tests/security/test_clientenv.py`` checks that against ``ClientSettings`` on generated
environments, and that the field table here is exactly the class's).

What the two share lives here, pydantic-free: the store URL check (:func:`check_store_url`), the
TLS options (:func:`tls_options`), opening the store (:func:`open_configured_store`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from lockclient.environment import PREFIXES, SERVICE_ENV, check_environment, is_service_link
from lockclient.errors import ConfigurationError
from lockclient.redact import MASK, register_secret
from lockclient.store.url import TlsOptions, TlsVerify, parse_store_url

if TYPE_CHECKING:
    from lockclient.store.base import CellStore

__all__ = [
    "CLIENT_ENV",
    "CLIENT_SECRET_ENV",
    "NO_STORE_URL",
    "ClientConfig",
    "ClientValues",
    "Secret",
    "StoreConfig",
    "check_store_url",
    "open_configured_store",
    "read_client_env",
    "tls_options",
]

NO_STORE_URL = (
    "CHRONOLOCK_STORE_URL is not set, and chronolock does not invent a store: a lock taken in a store "
    "no other process uses excludes nothing. For the local stack run `make up` in a chronolock clone "
    "and paste the export lines it prints (absolute paths); otherwise set it to "
    "sqlite:////absolute/path/cells.db (one machine) or cassandra://host1,host2:9042/keyspace?dc=DC"
)
"""Why a component without ``CHRONOLOCK_STORE_URL`` refuses to start, and how to get one."""


class SecretLike(Protocol):
    def get_secret_value(self) -> str: ...


class StoreConfig(Protocol):
    """What opening the store needs of the settings."""

    @property
    def store_url(self) -> str: ...
    @property
    def cassandra_username(self) -> str | None: ...
    @property
    def cassandra_password(self) -> SecretLike | None: ...  # pydantic's SecretStr, or Secret
    @property
    def cassandra_ssl(self) -> bool: ...
    @property
    def cassandra_ssl_ca(self) -> str | None: ...
    @property
    def cassandra_ssl_cert(self) -> str | None: ...
    @property
    def cassandra_ssl_key(self) -> str | None: ...
    @property
    def cassandra_ssl_hostname(self) -> str | None: ...
    @property
    def cassandra_ssl_verify(self) -> TlsVerify: ...


class ClientConfig(StoreConfig, Protocol):
    """What the lock client needs of its settings: :class:`~lockclient.settings.ClientSettings`
    or, for ``lockctl run``, :class:`ClientValues`."""

    @property
    def timesvc_urls(self) -> str: ...
    @property
    def leasewatch_url(self) -> str: ...
    @property
    def lease(self) -> float: ...
    @property
    def http_timeout(self) -> float: ...
    @property
    def clock_max_age(self) -> float: ...
    @property
    def allow_store_clock(self) -> bool: ...

    def open_store(self) -> CellStore: ...


def check_store_url(value: str) -> str:
    """``CHRONOLOCK_STORE_URL``: required, parseable, and an SQLite path absolute. Raises
    :class:`ConfigurationError` (exit 78) with a message that never quotes a password."""
    if not value.strip():
        raise ConfigurationError(NO_STORE_URL)
    url = parse_store_url(value)  # raises ConfigurationError with a clear message (no password in it)
    if url.scheme == "sqlite" and not os.path.isabs(url.path):
        raise ConfigurationError(
            f"CHRONOLOCK_STORE_URL names a relative SQLite path ({url.path!r}): every process would "
            "resolve it against its own working directory and lock in its own store. Give an absolute "
            "path: sqlite:////absolute/path/cells.db (four slashes)"
        )
    return value


def tls_options(settings: StoreConfig) -> TlsOptions:
    """The TLS settings (the store URL's ``ssl*`` options override them): on when asked for or
    when any file or name is given; the host name is checked only with full verification."""
    ca, cert, key = settings.cassandra_ssl_ca, settings.cassandra_ssl_cert, settings.cassandra_ssl_key
    hostname, verify = settings.cassandra_ssl_hostname, settings.cassandra_ssl_verify
    return TlsOptions(
        enabled=settings.cassandra_ssl or any((ca, cert, key, hostname)),
        ca=ca,
        cert=cert,
        key=key,
        hostname=hostname if verify == "full" else None,
        verify=verify,
    )


def open_configured_store(settings: StoreConfig, tls: TlsOptions) -> CellStore:
    """Open the store the settings name."""
    from lockclient.store import open_store

    password = settings.cassandra_password.get_secret_value() if settings.cassandra_password else None
    return open_store(settings.store_url, username=settings.cassandra_username, password=password, tls=tls)


class Secret:
    """A secret setting's value (pydantic's ``SecretStr`` without pydantic): masked when printed."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret('{MASK}')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True, slots=True)
class ClientValues:
    """The values ``ClientSettings()`` would hold, read by :func:`read_client_env`."""

    store_url: str
    cassandra_username: str | None = None
    cassandra_password: Secret | None = None
    cassandra_ssl: bool = False
    cassandra_ssl_ca: str | None = None
    cassandra_ssl_cert: str | None = None
    cassandra_ssl_key: str | None = None
    cassandra_ssl_hostname: str | None = None
    cassandra_ssl_verify: TlsVerify = "full"
    timesvc_urls: str = ""
    leasewatch_url: str = ""
    lease: float = 10.0
    http_timeout: float = 2.0
    clock_max_age: float = 1.0
    allow_store_clock: bool = False

    def tls(self) -> TlsOptions:
        return tls_options(self)

    def open_store(self) -> CellStore:
        return open_configured_store(self, self.tls())


# The field table: attribute -> (variable, kind, bounds). Kinds: str (as given), opt (unset = None),
# path (blank = None, stripped), secret, bool, float (lower, lower inclusive, upper), verify.
# A test keeps it equal to ClientSettings (names, variables, defaults, bounds).
FLOAT_BOUNDS: Final[dict[str, tuple[float, bool, float]]] = {
    "lease": (0.0, False, 3600.0),
    "http_timeout": (0.0, False, 600.0),
    "clock_max_age": (0.0, True, 10.0),
}
FIELDS: Final[dict[str, tuple[str, str]]] = {
    "store_url": ("CHRONOLOCK_STORE_URL", "str"),
    "cassandra_username": ("CHRONOLOCK_CASSANDRA_USERNAME", "opt"),
    "cassandra_password": ("CHRONOLOCK_CASSANDRA_PASSWORD", "secret"),
    "cassandra_ssl": ("CHRONOLOCK_CASSANDRA_SSL", "bool"),
    "cassandra_ssl_ca": ("CHRONOLOCK_CASSANDRA_SSL_CA", "path"),
    "cassandra_ssl_cert": ("CHRONOLOCK_CASSANDRA_SSL_CERT", "path"),
    "cassandra_ssl_key": ("CHRONOLOCK_CASSANDRA_SSL_KEY", "path"),
    "cassandra_ssl_hostname": ("CHRONOLOCK_CASSANDRA_SSL_HOSTNAME", "path"),
    "cassandra_ssl_verify": ("CHRONOLOCK_CASSANDRA_SSL_VERIFY", "verify"),
    "timesvc_urls": ("CHRONOLOCK_TIMESVC_URLS", "str"),
    "leasewatch_url": ("CHRONOLOCK_LEASEWATCH_URL", "str"),
    "lease": ("CHRONOLOCK_LEASE", "float"),
    "http_timeout": ("CHRONOLOCK_HTTP_TIMEOUT", "float"),
    "clock_max_age": ("CHRONOLOCK_CLOCK_MAX_AGE", "float"),
    "allow_store_clock": ("CHRONOLOCK_ALLOW_STORE_CLOCK", "bool"),
}

CLIENT_ENV: Final = frozenset(variable for variable, _kind in FIELDS.values())
"""Every variable ``ClientSettings`` reads (a test keeps it equal to the class)."""
CLIENT_SECRET_ENV: Final = frozenset(variable for variable, kind in FIELDS.values() if kind == "secret")
"""The variables of ``ClientSettings`` that carry a secret (a test keeps it equal to the class)."""

_TRUE: Final = frozenset({"true", "1", "yes", "on"})
_FALSE: Final = frozenset({"false", "0", "no", "off"})
_PLAIN_NUMBER: Final = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")
_VERIFY: Final = ("full", "ca", "none")


class _Unsure(Exception):
    """A value this reader does not interpret: ClientSettings() decides."""


def _value(kind: str, raw: str, name: str) -> object:
    if kind == "path":
        return raw.strip() or None
    if kind == "secret":
        return Secret(raw)
    if kind == "bool":
        lowered = raw.lower()
        if lowered not in _TRUE | _FALSE:
            raise _Unsure
        return lowered in _TRUE
    if kind == "verify":
        if raw not in _VERIFY:
            raise _Unsure
        return raw
    if kind == "float":
        if _PLAIN_NUMBER.fullmatch(raw) is None:
            raise _Unsure
        number = float(raw)
        lower, inclusive, upper = FLOAT_BOUNDS[name]
        if number > upper or number < lower or (number == lower and not inclusive):
            raise _Unsure
        return number
    return raw  # str, opt: as given


def read_client_env(environ: Mapping[str, str] | None = None) -> ClientValues | None:
    """The values of ``ClientSettings()`` for this environment, or None if not sure (see the module)."""
    env = os.environ if environ is None else environ
    for name in env:
        if name.upper().startswith(PREFIXES) and name != name.upper():
            return None  # case games: pydantic-settings matches names case-insensitively
    try:
        check_environment(env, CLIENT_ENV | SERVICE_ENV)
    except ConfigurationError:
        return None
    values: dict[str, object] = {}
    try:
        for name, (variable, kind) in FIELDS.items():
            raw = env.get(variable)
            if raw is None:
                continue
            if is_service_link(variable, raw):
                return None
            values[name] = _value(kind, raw, name)
        store_url = values.pop("store_url", "")
        assert isinstance(store_url, str)
        check_store_url(store_url)
        result = ClientValues(store_url=store_url, **values)  # type: ignore[arg-type]
        result.tls()  # inconsistent TLS settings: ClientSettings() says what is wrong
    except (_Unsure, ConfigurationError):
        return None
    if result.cassandra_password is not None:
        register_secret(result.cassandra_password.get_secret_value())
    return result
