"""leasewatch settings: ``LEASEWATCH_*`` plus the shared ``CHRONOLOCK_*`` store settings."""

from __future__ import annotations

from functools import cached_property

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from lockclient.settings import (
    SETTINGS_CONFIG,
    HttpServerSettings,
    LoggingSettings,
    StoreSettings,
    check_token,
    default_replica_id,
    parse_named_tokens,
)

__all__ = ["LeasewatchSettings"]


class LeasewatchSettings(StoreSettings, LoggingSettings, HttpServerSettings):
    """Everything ``leasewatch serve`` reads from the environment."""

    model_config = SettingsConfigDict(env_prefix="LEASEWATCH_", **SETTINGS_CONFIG)

    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=8710, ge=0, le=65535, description="port to listen on (0 = any free port)")
    scan_interval: float = Field(default=1.0, gt=0, le=60, description="seconds between scans of live leases")
    grace: float = Field(default=2.0, ge=0, le=3600, description="s a lease may stay unchanged beyond its length")
    orphan_after: float = Field(
        default=12.0,
        gt=0,
        le=86400,
        description="s a queue/owner cell without a lease record may live before it is cleared",
    )
    admin_tokens: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("LEASEWATCH_ADMIN_TOKENS", "LEASEWATCH_ADMIN_TOKEN"),
        description="bearer tokens for POST /revoke/{id}: name:token,name2:token2 (or one bare token, "
        "named admin), each at least 32 characters; the name is recorded with every revocation; "
        "unset = revocation refused",
    )
    read_token: SecretStr | None = Field(
        default=None,
        description="bearer token required for /locks, /locks/{id}, /revocations and the page "
        "(admin tokens work too); unset = they are open",
    )
    gc_interval: float = Field(
        default=60.0,
        gt=0,
        le=86400,
        description="seconds between store maintenance passes (SQLite: tombstone GC in batches, WAL checkpoint)",
    )
    partition_lease: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="s a replica's claim on a partition of the lock ids lasts unrenewed; a dead replica's "
        "partitions are taken over after this + grace",
    )
    replica_id: str = Field(
        default_factory=default_replica_id,
        min_length=1,
        max_length=128,
        description="name reported in logs and events",
    )
    shutdown_grace: float = Field(default=5.0, ge=0, le=600, description="s to finish in-flight requests on SIGTERM")
    max_waiters: int = Field(
        default=512,
        ge=0,
        le=100_000,
        description="long-polls (GET /wait) open at once in this process; beyond it 429 with Retry-After",
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
