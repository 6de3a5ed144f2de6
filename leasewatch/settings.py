"""leasewatch settings: ``LEASEWATCH_*`` plus the shared ``CHRONOLOCK_*`` store settings."""

from __future__ import annotations

from functools import cached_property
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from lockclient.clock import parse_timesvc_urls
from lockclient.errors import ConfigurationError
from lockclient.settings import (
    SETTINGS_CONFIG,
    HttpServerSettings,
    LoggingSettings,
    StoreSettings,
    check_token,
    default_replica_id,
    parse_named_tokens,
)

__all__ = ["LeasewatchSettings", "timesvc_url_list"]


def timesvc_url_list(value: str) -> list[str]:
    """``LEASEWATCH_TIMESVC_URLS`` → base URLs. Credentials in a URL are refused: the token goes
    in LEASEWATCH_TIMESVC_TOKEN (a URL ends up in logs)."""
    for entry in value.split(","):
        # Before anything that quotes the URL in a message.
        if "@" in urlsplit(entry.strip()).netloc:
            raise ValueError("LEASEWATCH_TIMESVC_URLS must not carry credentials: use LEASEWATCH_TIMESVC_TOKEN")
    try:
        urls = parse_timesvc_urls(value)
    except ConfigurationError as exc:
        raise ValueError(str(exc).replace("CHRONOLOCK_TIMESVC_URLS", "LEASEWATCH_TIMESVC_URLS")) from exc
    if not all(urlsplit(url).hostname for url in urls):
        raise ValueError("every LEASEWATCH_TIMESVC_URLS entry needs a host")
    return urls


class LeasewatchSettings(StoreSettings, LoggingSettings, HttpServerSettings):
    """Everything ``leasewatch serve`` reads from the environment."""

    model_config = SettingsConfigDict(env_prefix="LEASEWATCH_", **SETTINGS_CONFIG)

    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=8710, ge=0, le=65535, description="port to listen on (0 = any free port)")
    scan_interval: float = Field(default=1.0, gt=0, le=60, description="seconds between scans of live leases")
    grace: float = Field(
        default=2.0,
        ge=0,
        le=3600,
        description="seconds a lease may stay unchanged beyond its length before it is revoked",
    )
    orphan_after: float = Field(
        default=12.0,
        gt=0,
        le=86400,
        description="seconds a cell that is nobody's lease (a crashed baseline contender's, a malformed one) "
        "may live before it is cleared; also how long a lock id must be idle before it leaves the index",
    )
    admin_tokens: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("LEASEWATCH_ADMIN_TOKENS", "LEASEWATCH_ADMIN_TOKEN"),
        description="bearer tokens for POST /revoke/{id}: name:token,name2:token2 (or one bare token, "
        "named admin), each at least 32 characters, names and tokens unique; the name is recorded with every "
        "revocation; blank or short tokens stop leasewatch at start-up (exit 78); unset = revocation refused",
    )
    read_token: SecretStr | None = Field(
        default=None,
        description="bearer token /locks, /locks/{id}, /revocations, /observed, /time and /trends require "
        "(admin tokens work too; the page is opened as /#token=<token>); unset = open",
    )
    timesvc_urls: str = Field(
        default="",
        description="comma-separated timesvc base URLs (one per replica, not a load balancer's) whose /status "
        "this replica polls every 2 s for GET /time and the page's time panel; no credentials in the URLs; "
        "empty = no time panel",
    )
    timesvc_token: SecretStr | None = Field(
        default=None,
        description="bearer token sent to those /status endpoints (the replicas' TIMESVC_READ_TOKEN); without "
        "it a guarded replica shows as 'answered 401'",
    )
    trend_interval: float = Field(
        default=5.0,
        ge=0.1,
        le=300,
        description="seconds between trend samples (GET /trends, the page's sparklines); the last 720 are kept "
        "in memory (an hour at 5 s; a restart starts afresh)",
    )
    gc_interval: float = Field(
        default=60.0,
        gt=0,
        le=86400,
        description="seconds between store maintenance passes: on SQLite, tombstones and expired cells older "
        "than gc_grace are purged in batches of 1,000 (each batch its own short transaction, found through "
        "partial indexes), then PRAGMA wal_checkpoint(TRUNCATE) (waiting at most 200 ms for readers; a busy "
        "outcome is logged and retried next time); the store's file and WAL sizes go to /status and "
        "leasewatch_store_bytes",
    )
    partition_lease: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="seconds a replica's claim on its partitions of the lock ids lasts unrenewed (renewed "
        "every third of it); a replica that died is replaced after this + LEASEWATCH_GRACE",
    )
    replica_id: str = Field(
        default_factory=default_replica_id,
        min_length=1,
        max_length=128,
        description="name in logs and revocation events",
    )
    shutdown_grace: float = Field(
        default=5.0, ge=0, le=600, description="seconds to finish in-flight requests on SIGTERM"
    )
    max_waiters: int = Field(
        default=512,
        ge=0,
        le=100_000,
        description="long-polls (GET /wait) open at once in the process (below LEASEWATCH_MAX_CONNECTIONS); "
        "beyond it 429 with Retry-After",
    )
    max_waiters_per_lock: int = Field(
        default=64, ge=1, le=100_000, description="long-polls open at once on one lock id; beyond it 429"
    )
    wait_poll_rate: float = Field(
        default=200.0,
        gt=0,
        le=10_000,
        description="store read pairs per second, at most, for all long-polled lock ids together "
        "(each id is polled every 10 ms while few are awaited, less often when many are)",
    )

    @field_validator("admin_tokens")
    @classmethod
    def _valid_admin_tokens(cls, value: SecretStr | None) -> SecretStr | None:
        parse_named_tokens("LEASEWATCH_ADMIN_TOKENS", value)
        return value

    @field_validator("read_token")
    @classmethod
    def _strong_read_token(cls, value: SecretStr | None) -> SecretStr | None:
        return check_token("LEASEWATCH_READ_TOKEN", value)

    @field_validator("timesvc_token")
    @classmethod
    def _strong_timesvc_token(cls, value: SecretStr | None) -> SecretStr | None:
        return check_token("LEASEWATCH_TIMESVC_TOKEN", value)

    @field_validator("timesvc_urls")
    @classmethod
    def _valid_timesvc_urls(cls, value: str) -> str:
        if value.strip():
            timesvc_url_list(value)
        return value

    @cached_property
    def timesvc_url_list(self) -> list[str]:
        """The timesvc base URLs (empty: none configured)."""
        return timesvc_url_list(self.timesvc_urls) if self.timesvc_urls.strip() else []

    @model_validator(mode="after")
    def _waiters_fit(self) -> LeasewatchSettings:
        if self.max_waiters >= self.max_connections:
            raise ValueError(
                "LEASEWATCH_MAX_WAITERS must be below LEASEWATCH_MAX_CONNECTIONS: long-polls must never "
                "take every connection"
            )
        return self

    @cached_property
    def admin_token_names(self) -> dict[str, str]:
        """token -> caller name."""
        return parse_named_tokens("LEASEWATCH_ADMIN_TOKENS", self.admin_tokens)
