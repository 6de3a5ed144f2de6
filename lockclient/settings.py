"""Settings read from environment variables (pydantic-settings), one object per component.

Names shared by every component start with ``CHRONOLOCK_``; a service's own
settings start with its name (``TIMESVC_``, ``LEASEWATCH_``). The README, the
Kubernetes ConfigMaps and ``--help`` use exactly these names; a test checks
that the manifests provide exactly what each settings class reads.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from lockclient.store.url import parse_store_url

if TYPE_CHECKING:
    from lockclient.store.base import CellStore

__all__ = ["ClientSettings", "LoggingSettings", "StoreSettings", "env_names", "settings_help"]

DEFAULT_STORE_URL = "sqlite:///.chronolock/cells.db"


def default_replica_id() -> str:
    """``host-pid``: a replica name that is unique on a machine and readable in logs."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _alias(name: str) -> AliasChoices:
    return AliasChoices(name)


class StoreSettings(BaseSettings):
    """Where the cells live. Shared by every component."""

    model_config = SettingsConfigDict(env_prefix="CHRONOLOCK_", extra="ignore", populate_by_name=True)

    store_url: str = Field(
        default=DEFAULT_STORE_URL,
        validation_alias=_alias("CHRONOLOCK_STORE_URL"),
        description="sqlite:///path/cells.db or cassandra://host1,host2:9042/keyspace?dc=dc1",
    )
    cassandra_username: str | None = Field(
        default=None, validation_alias=_alias("CHRONOLOCK_CASSANDRA_USERNAME"), description="Cassandra user"
    )
    cassandra_password: SecretStr | None = Field(
        default=None, validation_alias=_alias("CHRONOLOCK_CASSANDRA_PASSWORD"), description="Cassandra password"
    )

    @field_validator("store_url")
    @classmethod
    def _valid_url(cls, value: str) -> str:
        parse_store_url(value)  # raises ConfigurationError with a clear message
        return value

    def open_store(self) -> CellStore:
        """Open the configured store."""
        from lockclient.store import open_store

        password = self.cassandra_password.get_secret_value() if self.cassandra_password else None
        return open_store(self.store_url, username=self.cassandra_username, password=password)


class LoggingSettings(BaseSettings):
    """Mixed into every service's settings."""

    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="log level")
    log_format: Literal["json", "console"] = Field(default="json", description="json: one JSON object per line")


class ClientSettings(StoreSettings):
    """Settings of the lock client library (``RemoteLocker.from_env()``) and ``lockctl``."""

    timesvc_urls: str = Field(
        default="",
        validation_alias=_alias("CHRONOLOCK_TIMESVC_URLS"),
        description="comma-separated timesvc base URLs; empty = take global time from the store directly",
    )
    leasewatch_url: str = Field(
        default="",
        validation_alias=_alias("CHRONOLOCK_LEASEWATCH_URL"),
        description="leasewatch base URL for wake-ups; empty = poll the store with capped back-off",
    )
    lease: float = Field(default=10.0, gt=0, validation_alias=_alias("CHRONOLOCK_LEASE"), description="lease length, s")
    http_timeout: float = Field(
        default=2.0, gt=0, validation_alias=_alias("CHRONOLOCK_HTTP_TIMEOUT"), description="timeout per HTTP call, s"
    )
    clock_max_age: float = Field(
        default=1.0,
        ge=0,
        le=10,
        validation_alias=_alias("CHRONOLOCK_CLOCK_MAX_AGE"),
        description="s a global-time answer is extrapolated for tickets (0 = ask every time)",
    )
    allow_store_clock: bool = Field(
        default=False,
        validation_alias=_alias("CHRONOLOCK_ALLOW_STORE_CLOCK"),
        description="allow global time straight from a Cassandra store, without timesvc's runaway guard",
    )


def env_names(settings_cls: type[BaseSettings]) -> set[str]:
    """The environment variable names a settings class reads (for drift checks and docs)."""
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    names: set[str] = set()
    for name, field in settings_cls.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices)
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:
            names.add(f"{prefix}{name}".upper())
    return names


def settings_help(settings_cls: type[BaseSettings]) -> str:
    """A plain-text table of a settings class's environment variables, for ``--help``."""
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    lines = ["Settings (environment variables):", ""]
    for name, field in sorted(settings_cls.model_fields.items()):
        alias = field.validation_alias
        env = str(alias.choices[0]) if isinstance(alias, AliasChoices) else f"{prefix}{name}".upper()
        default = "(per process)" if field.default_factory is not None else repr(field.default)
        lines.append(f"  {env:<32} {field.description or ''} [default: {default}]")
    return "\n".join(lines)
