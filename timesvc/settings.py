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

    host: str = Field(default="127.0.0.1", description="address to listen on (0.0.0.0 in a container)")
    port: int = Field(default=8700, ge=0, le=65535, description="port to listen on (0 = any free port)")
    tick: float = Field(default=0.5, gt=0, le=60, description="seconds between TryUpdateGlobalTime runs")
    max_skew: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="the promise's bound, in seconds: global time is never more than this ahead of real time "
        "while a majority of replicas' clocks are within half of it; a replica publishes at most the "
        "majority's support + half of it, and refuses its clock beyond it. Clients "
        "(TimeServiceClock(max_skew=...)) judge answers with the same value, 1.0 by default",
    )
    replicas: int = Field(
        default=3,
        ge=1,
        le=99,
        description="how many timesvc replicas the deployment runs, the same on every replica: a clock is "
        "published only within what a majority of fresh clock readings supports (1: a lone replica, nothing "
        "to outvote it; a replica configured for fewer than its running peers refuses its clock)",
    )
    replica_id: str = Field(
        default_factory=default_replica_id,
        min_length=1,
        max_length=128,
        pattern=r"^[^:\s]+$",
        description="name in /now, logs and the GlobalTime source cell",
    )
    shutdown_grace: float = Field(
        default=5.0, ge=0, le=600, description="seconds to finish in-flight requests on SIGTERM"
    )
    min_trip_interval: float = Field(
        default=0.002,
        ge=0,
        le=1,
        description="seconds per store round trip on average (a burst of 8 is allowed): at most 1/this trips "
        "per second per replica whatever the request rate; a request waits at most about this much longer, "
        "and only when the rate is reached (0 = no bound)",
    )
    read_token: SecretStr | None = Field(
        default=None,
        description="bearer token /status requires (at least 32 characters); unset = open",
    )

    @field_validator("read_token")
    @classmethod
    def _strong_token(cls, value: SecretStr | None) -> SecretStr | None:
        return check_token("TIMESVC_READ_TOKEN", value)
