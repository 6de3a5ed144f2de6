"""timesvc settings: ``TIMESVC_*`` plus the shared ``CHRONOLOCK_*`` store settings."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from lockclient.settings import (
    SETTINGS_CONFIG,
    HttpServerSettings,
    LoggingSettings,
    StoreSettings,
    check_token,
    default_replica_id,
)

__all__ = ["TimesvcSettings"]


class TimesvcSettings(StoreSettings, LoggingSettings, HttpServerSettings):
    """Everything ``timesvc serve`` reads from the environment."""

    model_config = SettingsConfigDict(env_prefix="TIMESVC_", **SETTINGS_CONFIG)

    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=8700, ge=0, le=65535, description="port to listen on (0 = any free port)")
    tick: float = Field(default=0.5, gt=0, le=60, description="seconds between TryUpdateGlobalTime runs")
    max_skew: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="s: global time is never more than this ahead of real time while a majority of the "
        "replicas' clocks are within half of it; a clock further than this from the majority's is refused",
    )
    replicas: int = Field(
        default=3,
        ge=1,
        le=99,
        description="how many timesvc replicas run (the same on every replica): a clock is published only "
        "within what a majority of fresh clock readings supports",
    )
    replica_id: str = Field(
        default_factory=default_replica_id,
        min_length=1,
        max_length=128,
        pattern=r"^[^:\s]+$",
        description="name reported in /now and logs",
    )
    shutdown_grace: float = Field(default=5.0, ge=0, le=600, description="s to finish in-flight requests on SIGTERM")
    min_trip_interval: float = Field(
        default=0.002,
        ge=0,
        le=1,
        description="s per store round trip for /now, on average (a burst of 8 is allowed): a flood of "
        "requests waits for the next trip instead of adding store load (at most 1/this trips per second)",
    )
    read_token: SecretStr | None = Field(
        default=None,
        description="bearer token required for /status (unset = /status is open); at least 32 characters",
    )

    @field_validator("read_token")
    @classmethod
    def _strong_token(cls, value: SecretStr | None) -> SecretStr | None:
        return check_token("TIMESVC_READ_TOKEN", value)
