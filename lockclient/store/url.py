"""Store URLs: parsing and validation only. Opening one is :func:`lockclient.store.open_store`."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from lockclient.errors import ConfigurationError

__all__ = ["StoreUrl", "parse_store_url"]

_SCHEMES = ("sqlite", "cassandra")


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
        raw = self.options.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError as exc:
            raise ConfigurationError(f"store URL option {name}={raw!r} is not a number") from exc
        if value < 0:
            raise ConfigurationError(f"store URL option {name}={raw!r} must not be negative")
        return value


def parse_store_url(url: str) -> StoreUrl:
    """Parse ``sqlite:///abs/path.db``, ``sqlite:///rel.db`` or ``cassandra://h1,h2:port/ks?dc=...``."""
    if not url or "://" not in url:
        raise ConfigurationError(f"store URL {url!r} must look like sqlite:///path or cassandra://host/keyspace")
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme not in _SCHEMES:
        raise ConfigurationError(f"store URL scheme {scheme!r} is not one of {', '.join(_SCHEMES)}")
    body, _, query = rest.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=False)) if query else {}
    if scheme == "sqlite":
        # sqlite:///cells.db -> "cells.db" (relative); sqlite:////tmp/cells.db -> "/tmp/cells.db"
        if not body.startswith("/"):
            raise ConfigurationError(f"SQLite store URL {url!r} needs three slashes: sqlite:///path/to/file.db")
        path = unquote(body[1:])
        if not path:
            raise ConfigurationError(f"SQLite store URL {url!r} names no file")
        return StoreUrl(scheme=scheme, path=path, options=options)
    parts = urlsplit(f"//{body}")
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        creds, _, netloc = netloc.rpartition("@")
        user, _, pw = creds.partition(":")
        username, password = unquote(user), (unquote(pw) if pw else None)
    port: int | None = None
    hostpart = netloc
    if ":" in netloc.rsplit(",", 1)[-1]:
        hostpart, _, port_s = netloc.rpartition(":")
        try:
            port = int(port_s)
        except ValueError as exc:
            raise ConfigurationError(f"store URL {url!r} has a bad port {port_s!r}") from exc
        if not 0 < port < 65536:
            raise ConfigurationError(f"store URL {url!r} has a port out of range")
    hosts = tuple(h for h in hostpart.split(",") if h)
    if not hosts:
        raise ConfigurationError(f"Cassandra store URL {url!r} names no host")
    keyspace = parts.path.strip("/")
    if not keyspace:
        raise ConfigurationError(f"Cassandra store URL {url!r} names no keyspace: cassandra://host:9042/keyspace")
    if not keyspace.replace("_", "a").isalnum() or keyspace[0].isdigit():
        raise ConfigurationError(f"Cassandra keyspace {keyspace!r} must be letters, digits and underscores")
    return StoreUrl(
        scheme=scheme, hosts=hosts, port=port, path=keyspace, username=username, password=password, options=options
    )
