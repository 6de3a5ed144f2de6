"""Store URLs: parsing and validation only. Opening one is :func:`lockclient.store.open_store`.

Every query option is checked here, when the URL is parsed (settings are validated at
start-up, so a bad option stops a service before it serves anything):

* an option the scheme does not know is refused, naming the valid ones — a typo such as
  ``?tiemout=5`` or a TLS option of another driver (``?sslmode=verify-full``) must not
  be accepted silently while the connection runs without it;
* an option given twice is refused (which one would win is a guess);
* numbers must be finite and within a documented range (``busy_timeout=nan`` or
  ``1e308`` used to reach SQLite and fail on the first request instead).

Error messages never quote the password: they show :meth:`StoreUrl.redacted` or a URL
with its user info removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Final, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from lockclient.errors import ConfigurationError
from lockclient.redact import register_secret, strip_url_credentials

__all__ = [
    "CASSANDRA_OPTIONS",
    "SQLITE_OPTIONS",
    "StoreUrl",
    "TlsOptions",
    "TlsVerify",
    "parse_bool",
    "parse_store_url",
]

_SCHEMES = ("sqlite", "cassandra")

TlsVerify = Literal["full", "ca", "none"]
_VERIFY_MODES: Final = ("full", "ca", "none")

# name -> (minimum, maximum, minimum is exclusive) for numeric options, in seconds.
_NUMBERS: Final[dict[str, tuple[float, float, bool]]] = {
    "busy_timeout": (0.0, 600.0, False),
    "gc_grace": (0.0, 10 * 365 * 86400.0, False),
    "timeout": (0.0, 600.0, True),
    "resolve_timeout": (0.0, 3600.0, True),
    "connect_timeout": (0.0, 600.0, True),
    "heartbeat": (0.0, 3600.0, False),
    "heartbeat_timeout": (0.0, 600.0, True),
    "speculate_after": (0.0, 600.0, False),
}

SQLITE_OPTIONS: Final[dict[str, str]] = {
    "busy_timeout": "seconds to wait for a locked database (0-600, default 5)",
    "gc_grace": "seconds a tombstone is kept (0-315360000, default 3600)",
}
CASSANDRA_OPTIONS: Final[dict[str, str]] = {
    "dc": "datacenter to send requests to (routing only)",
    "lock_scope": "cluster (default) or datacenter (LOCAL_QUORUM/LOCAL_SERIAL; needs dc)",
    "timeout": "seconds per request (0-600, default 2)",
    "resolve_timeout": "seconds to settle an unknown compare-and-set outcome (0-3600, default 2 x timeout)",
    "connect_timeout": "seconds to open a connection to a node (0-600, default 5)",
    "heartbeat": "seconds between heartbeats on an idle connection; 0 = none (default 0.5)",
    "heartbeat_timeout": "seconds a heartbeat may go unanswered before the connection is dropped (default 1)",
    "speculate_after": "seconds before an idempotent request is also sent to the next replica; 0 = never (default 0.2)",
    "protocol_version": "native protocol version: 1 (Cassandra 1.2 test node) or 3-6",
    "ssl": "true: TLS to every node (implied by any other ssl_ option)",
    "ssl_ca": "CA bundle (PEM) that node certificates must chain to (default: the system's)",
    "ssl_cert": "client certificate (PEM) for mutual TLS",
    "ssl_key": "private key (PEM) of ssl_cert, if not in the same file",
    "ssl_hostname": "name every node certificate must carry (default: the address connected to)",
    "ssl_verify": "full (chain and name, default), ca (chain only) or none (no verification)",
}
_OPTIONS: Final[dict[str, dict[str, str]]] = {"sqlite": SQLITE_OPTIONS, "cassandra": CASSANDRA_OPTIONS}

_TRUE: Final = ("true", "1", "yes", "on")
_FALSE: Final = ("false", "0", "no", "off")


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(f"{name}={raw!r} must be true or false")


@dataclass(frozen=True)
class TlsOptions:
    """TLS to Cassandra: from URL options (``ssl``, ``ssl_ca``, ...) over the
    ``CHRONOLOCK_CASSANDRA_SSL*`` settings. Files are read when the connection is made."""

    enabled: bool = False
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    hostname: str | None = None
    verify: TlsVerify = "full"

    def __post_init__(self) -> None:
        if self.verify not in _VERIFY_MODES:
            raise ConfigurationError(f"ssl_verify={self.verify!r} must be one of {', '.join(_VERIFY_MODES)}")
        if self.key and not self.cert:
            raise ConfigurationError("ssl_key needs ssl_cert (the client certificate it belongs to)")
        if self.hostname is not None and not self.hostname.strip():
            raise ConfigurationError("ssl_hostname must not be blank")
        if self.hostname is not None and self.verify != "full":
            raise ConfigurationError(f"ssl_hostname is only checked with ssl_verify=full, not {self.verify}")


@dataclass(frozen=True)
class StoreUrl:
    """A parsed store URL."""

    scheme: str
    hosts: tuple[str, ...] = ()
    port: int | None = None
    path: str = ""
    """SQLite: the database file. Cassandra: the keyspace."""
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    options: dict[str, str] = field(default_factory=dict)

    def redacted(self) -> str:
        """The URL without credentials, for logs and ``/status``."""
        query = "&".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        suffix = f"?{query}" if query else ""
        if self.scheme == "sqlite":
            return (
                f"sqlite:///{self.path.lstrip('/')}{suffix}"
                if self.path.startswith("/")
                else f"sqlite:///{self.path}{suffix}"
            )
        port = f":{self.port}" if self.port else ""
        return f"cassandra://{','.join(self.hosts)}{port}/{self.path}{suffix}"

    def float_option(self, name: str, default: float) -> float:
        """A numeric option, already checked (finite, within its range) by :func:`parse_store_url`."""
        raw = self.options.get(name)
        return default if raw is None else _number(name, raw)

    def tls(self, defaults: TlsOptions | None = None) -> TlsOptions:
        """TLS settings: the URL's ``ssl*`` options, or ``defaults`` (settings) when it has none."""
        options = {k: v for k, v in self.options.items() if k == "ssl" or k.startswith("ssl_")}
        if not options:
            return defaults or TlsOptions()
        enabled = parse_bool("ssl", options["ssl"]) if "ssl" in options else True
        if not enabled and len(options) > 1:
            raise ConfigurationError("ssl=false contradicts the other ssl_ options in the store URL")
        verify = options.get("ssl_verify", "full")
        if verify not in _VERIFY_MODES:
            modes = ", ".join(_VERIFY_MODES)
            raise ConfigurationError(f"store URL option ssl_verify={verify!r} must be one of {modes}")
        url_tls = TlsOptions(
            enabled=enabled,
            ca=options.get("ssl_ca") or None,
            cert=options.get("ssl_cert") or None,
            key=options.get("ssl_key") or None,
            hostname=options.get("ssl_hostname"),
            verify=verify,  # type: ignore[arg-type]  # checked just above
        )
        if defaults is not None and enabled:
            # Files and names not given in the URL come from the settings.
            url_tls = replace(
                url_tls,
                ca=url_tls.ca or defaults.ca,
                cert=url_tls.cert or defaults.cert,
                key=url_tls.key or (defaults.key if not url_tls.cert else None),
                hostname=url_tls.hostname
                if url_tls.hostname is not None
                else (defaults.hostname if "ssl_verify" not in options else None),
                verify=url_tls.verify if "ssl_verify" in options else defaults.verify,
            )
        return url_tls


def _number(name: str, raw: str) -> float:
    low, high, exclusive = _NUMBERS[name]
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigurationError(f"store URL option {name}={raw!r} is not a number") from exc
    if not math.isfinite(value):
        raise ConfigurationError(f"store URL option {name}={raw!r} must be a finite number")
    if value < low or (exclusive and value == low):
        bound = f"> {low:g}" if exclusive else f">= {low:g}"
        raise ConfigurationError(f"store URL option {name}={raw!r} must be {bound}")
    if value > high:
        raise ConfigurationError(f"store URL option {name}={raw!r} must be at most {high:g}")
    return value


def _check_options(scheme: str, options: list[tuple[str, str]]) -> dict[str, str]:
    known = _OPTIONS[scheme]
    checked: dict[str, str] = {}
    for name, value in options:
        if name not in known:
            raise ConfigurationError(
                f"store URL option {name!r} is not known for {scheme}:// URLs; valid options: {', '.join(known)}"
            )
        if name in checked:
            raise ConfigurationError(f"store URL option {name!r} is given twice")
        if name in _NUMBERS:
            _number(name, value)
        checked[name] = value
    if scheme == "cassandra":
        raw = checked.get("protocol_version")
        if raw is not None and raw.strip() not in ("1", "3", "4", "5", "6"):
            raise ConfigurationError(f"store URL option protocol_version={raw!r} must be 1 or 3-6")
        scope = checked.get("lock_scope", "cluster")
        if scope not in ("cluster", "datacenter"):
            raise ConfigurationError(f"store URL option lock_scope={scope!r} must be 'cluster' or 'datacenter'")
        if scope == "datacenter" and not checked.get("dc"):
            raise ConfigurationError("lock_scope=datacenter needs dc=<local datacenter> in the store URL")
        probe = StoreUrl(scheme=scheme, options=checked)
        probe.tls()  # ssl options: booleans, modes and combinations
    return checked


def parse_store_url(url: str) -> StoreUrl:
    """Parse ``sqlite:///abs/path.db``, ``sqlite:///rel.db`` or ``cassandra://h1,h2:port/ks?dc=...``."""
    if not url or "://" not in url:
        raise ConfigurationError(
            f"store URL {strip_url_credentials(url)!r} must look like sqlite:///path or cassandra://host/keyspace"
        )
    shown = strip_url_credentials(url)
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme not in _SCHEMES:
        raise ConfigurationError(f"store URL scheme {scheme!r} is not one of {', '.join(_SCHEMES)}")
    body, _, query = rest.partition("?")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True) if query else []
    except ValueError as exc:
        raise ConfigurationError(f"store URL {shown!r} has a malformed query string") from exc
    if scheme == "sqlite":
        options = _check_options(scheme, pairs)
        # sqlite:///cells.db -> "cells.db" (relative); sqlite:////tmp/cells.db -> "/tmp/cells.db"
        if not body.startswith("/"):
            raise ConfigurationError(f"SQLite store URL {shown!r} needs three slashes: sqlite:///path/to/file.db")
        path = unquote(body[1:])
        if not path:
            raise ConfigurationError(f"SQLite store URL {shown!r} names no file")
        return StoreUrl(scheme=scheme, path=path, options=options)
    parts = urlsplit(f"//{body}")
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        creds, _, netloc = netloc.rpartition("@")
        user, _, pw = creds.partition(":")
        username, password = unquote(user), (unquote(pw) if pw else None)
        register_secret(password)
    options = _check_options(scheme, pairs)
    port: int | None = None
    hostpart = netloc
    if ":" in netloc.rsplit(",", 1)[-1]:
        hostpart, _, port_s = netloc.rpartition(":")
        try:
            port = int(port_s)
        except ValueError as exc:
            raise ConfigurationError(f"store URL {shown!r} has a bad port {port_s!r}") from exc
        if not 0 < port < 65536:
            raise ConfigurationError(f"store URL {shown!r} has a port out of range")
    hosts = tuple(h for h in hostpart.split(",") if h)
    if not hosts:
        raise ConfigurationError(f"Cassandra store URL {shown!r} names no host")
    keyspace = parts.path.strip("/")
    if not keyspace:
        raise ConfigurationError(f"Cassandra store URL {shown!r} names no keyspace: cassandra://host:9042/keyspace")
    if not keyspace.replace("_", "a").isalnum() or keyspace[0].isdigit():
        raise ConfigurationError(f"Cassandra keyspace {keyspace!r} must be letters, digits and underscores")
    return StoreUrl(
        scheme=scheme, hosts=hosts, port=port, path=keyspace, username=username, password=password, options=options
    )
