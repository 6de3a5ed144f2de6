"""leasewatch settings: ``LEASEWATCH_*`` plus the shared ``CHRONOLOCK_*`` store settings."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from lockclient.settings import LoggingSettings, StoreSettings, default_replica_id

__all__ = ["LeasewatchSettings"]


class LeasewatchSettings(StoreSettings, LoggingSettings):
    """Everything ``leasewatch serve`` reads from the environment."""

    model_config = SettingsConfigDict(env_prefix="LEASEWATCH_", extra="ignore", populate_by_name=True)

    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=8710, ge=0, le=65535, description="port to listen on (0 = any free port)")
    scan_interval: float = Field(default=1.0, gt=0, le=60, description="seconds between scans of live leases")
    grace: float = Field(default=2.0, ge=0, description="s a lease may stay unchanged beyond its length")
    orphan_after: float = Field(
        default=12.0, gt=0, description="s a queue/owner cell without a lease record may live before it is cleared"
    )
    admin_token: SecretStr | None = Field(
        default=None, description="bearer token for POST /locks/{id}/revoke; unset = revoke endpoint refuses"
    )
    gc_interval: float = Field(
        default=60.0,
        gt=0,
        description="seconds between store maintenance passes (SQLite: tombstone GC in batches, WAL checkpoint)",
    )
    partition_lease: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="s a replica's claim on a partition of the lock ids lasts unrenewed; a dead replica's "
        "partitions are taken over after this + grace",
    )
    replica_id: str = Field(default_factory=default_replica_id, description="name reported in logs and events")
    shutdown_grace: float = Field(default=5.0, ge=0, description="s to finish in-flight requests on SIGTERM")
