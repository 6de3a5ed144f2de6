"""Settings read from environment variables (pydantic-settings), one object per component.

Names shared by every component start with ``CHRONOLOCK_``; a service's own
settings start with its name (``TIMESVC_``, ``LEASEWATCH_``). The configuration
reference (``docs/configuration.md``, generated from these classes and their
``description=``), the Kubernetes ConfigMaps and ``--help`` use exactly these names;
a test checks that the manifests provide exactly what each settings class reads.

Nothing here fails in silence. Every settings class reads the environment through
:class:`CheckedEnvironment`, which refuses a variable with a chronolock prefix that no
chronolock program reads (:mod:`lockclient.environment`: a misspelt
``CHRONOLOCK_CASANDRA_SSL`` must not turn TLS off without a word), and
``CHRONOLOCK_STORE_URL`` has no default: a client that invented a store — it used to be
``./.chronolock/cells.db``, relative to wherever it ran — took locks nobody else could see.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from lockclient.clientenv import NO_STORE_URL, check_store_url, open_configured_store, tls_options
from lockclient.environment import (
    SERVICE_ENV,
    SERVICE_SECRET_ENV,
    check_environment,
    is_service_link,
    without_service_links,
)
from lockclient.redact import MASK, redact, register_secret, strip_url_credentials
from lockclient.store.url import TlsOptions, TlsVerify

if TYPE_CHECKING:
    from lockclient.store.base import CellStore

__all__ = [
    "NO_STORE_URL",
    "SERVICE_SECRET_ENV",
    "SETTINGS_CONFIG",
    "CheckedEnvironment",
    "ClientSettings",
    "HttpServerSettings",
    "LoggingSettings",
    "StoreSettings",
    "all_env_names",
    "check_token",
    "env_names",
    "known_env_names",
    "parse_named_tokens",
    "redacted_settings",
    "secret_env_names",
    "settings_help",
    "settings_report",
]


def default_replica_id() -> str:
    """``host-pid``: a replica name that is unique on a machine and readable in logs."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _alias(name: str, *deprecated: str) -> AliasChoices:
    """The variable ``name``; ``deprecated`` older spellings are still read (the first is canonical)."""
    return AliasChoices(name, *deprecated)


SETTINGS_CONFIG = SettingsConfigDict(
    extra="ignore",
    populate_by_name=True,
    # NaN and infinities are never a valid duration or count ("inf" passes `gt=0`).
    allow_inf_nan=False,
    # A validation error must not echo what it rejected: it may be a password or a token.
    hide_input_in_errors=True,
)
"""Shared by every settings class: ``SettingsConfigDict(env_prefix=..., **SETTINGS_CONFIG)``."""


class CheckedEnvironment(EnvSettingsSource):
    """The process environment as every chronolock settings class reads it.

    Before anything is read, :func:`lockclient.environment.check_environment` refuses a
    ``CHRONOLOCK_*`` / ``TIMESVC_*`` / ``LEASEWATCH_*`` variable that no chronolock program
    reads (:func:`known_env_names`), so a misspelt setting stops the program instead of being
    ignored. Kubernetes service links (``TIMESVC_PORT=tcp://10.0.0.7:8700``) are not read as
    settings (:func:`lockclient.environment.without_service_links`)."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        check_environment(os.environ, known_env_names(self.settings_cls))
        return without_service_links(super()._load_env_vars())


class StoreSettings(BaseSettings):
    """Where the cells live, and how to reach them. Shared by every component."""

    model_config = SettingsConfigDict(env_prefix="CHRONOLOCK_", **SETTINGS_CONFIG)

    store_url: str = Field(
        default="",
        validate_default=True,  # unset is refused by _valid_url, with NO_STORE_URL
        validation_alias=_alias("CHRONOLOCK_STORE_URL"),
        description="required: sqlite:////absolute/path/cells.db (the directory must exist) or "
        "cassandra://host1,host2:9042/keyspace?dc=dc1",
    )
    cassandra_username: str | None = Field(
        default=None,
        validation_alias=_alias("CHRONOLOCK_CASSANDRA_USERNAME"),
        description="Cassandra user (or put it in the URL)",
    )
    cassandra_password: SecretStr | None = Field(
        default=None, validation_alias=_alias("CHRONOLOCK_CASSANDRA_PASSWORD"), description="Cassandra password"
    )
    cassandra_ssl: bool = Field(
        default=False,
        validation_alias=_alias("CHRONOLOCK_CASSANDRA_SSL"),
        description="TLS to every Cassandra node (implied by any other CHRONOLOCK_CASSANDRA_SSL_* setting)",
    )
    cassandra_ssl_ca: str | None = Field(
        default=None,
        validation_alias=_alias("CHRONOLOCK_CASSANDRA_SSL_CA"),
        description="CA bundle (PEM) node certificates must chain to; unset = the system's trust store",
    )
    cassandra_ssl_cert: str | None = Field(
        default=None,
        validation_alias=_alias("CHRONOLOCK_CASSANDRA_SSL_CERT"),
        description="client certificate (PEM) for mutual TLS",
    )
    cassandra_ssl_key: str | None = Field(
        default=None,
        validation_alias=_alias("CHRONOLOCK_CASSANDRA_SSL_KEY"),
        description="private key (PEM) of the client certificate, if not in the same file",
    )
    cassandra_ssl_hostname: str | None = Field(
        default=None,
        validation_alias=_alias("CHRONOLOCK_CASSANDRA_SSL_HOSTNAME"),
        description="name every node certificate must carry; unset = the address connected to (the driver "
        "connects to node IPs, so certificates then need IP subjectAltNames)",
    )
    cassandra_ssl_verify: TlsVerify = Field(
        default="full",
        validation_alias=_alias("CHRONOLOCK_CASSANDRA_SSL_VERIFY"),
        description="full (chain and name), ca (chain only: any certificate the CA signed passes) or none "
        "(no verification: tests only, logged as a warning)",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment is read through :class:`CheckedEnvironment`; the other sources as usual."""
        return init_settings, CheckedEnvironment(settings_cls), dotenv_settings, file_secret_settings

    @field_validator("store_url")
    @classmethod
    def _valid_url(cls, value: str) -> str:
        # ConfigurationError, not ValueError: it passes through pydantic as it is, so that
        # RemoteLocker.from_env() raises it and every command exits 78 with this message.
        # (lockclient.clientenv: the same check, shared with lockctl run's pydantic-free reader.)
        return check_store_url(value)

    @field_validator("cassandra_ssl_ca", "cassandra_ssl_cert", "cassandra_ssl_key", "cassandra_ssl_hostname")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        # A ConfigMap entry "NAME=" means "not set", not "a file named ''".
        return value.strip() or None if value is not None else None

    def model_post_init(self, context: Any, /) -> None:
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                register_secret(value.get_secret_value())
        self.tls()  # inconsistent TLS settings fail at start-up, not at the first connection

    def tls(self) -> TlsOptions:
        """The TLS settings (the store URL's ``ssl*`` options override them)."""
        return tls_options(self)

    def open_store(self) -> CellStore:
        """Open the configured store."""
        return open_configured_store(self, self.tls())


class LoggingSettings(BaseSettings):
    """Mixed into every service's settings."""

    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="how much is logged")
    log_format: Literal["json", "console"] = Field(
        default="json", description="json (one JSON object per line) or console (readable lines)"
    )


class HttpServerSettings(BaseSettings):
    """Bounds on what one HTTP client may hold: mixed into each service's settings
    (so the variables carry the service's prefix: ``TIMESVC_MAX_CONNECTIONS``, ...)."""

    max_connections: int = Field(
        default=1024,
        ge=1,
        le=100_000,
        description="open connections at most; beyond it the connection waiting longest for a request head is "
        "closed (503 only when every connection is busy being served)",
    )
    header_timeout: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="seconds a connection may take to send a request's head (408 and closed beyond)",
    )
    max_header_bytes: int = Field(
        default=16_384, ge=1024, le=1_048_576, description="bytes of request line + headers at most (431 beyond)"
    )
    max_body_bytes: int = Field(
        default=65_536,
        ge=0,
        le=16_777_216,
        description="bytes of request body at most (413 beyond; no endpoint reads a body)",
    )
    keepalive_timeout: float = Field(
        default=5.0, gt=0, le=300, description="seconds an idle keep-alive connection stays open"
    )


class ClientSettings(StoreSettings):
    """Settings of the lock client library (``RemoteLocker.from_env()``) and ``lockctl``."""

    timesvc_urls: str = Field(
        default="",
        validation_alias=_alias("CHRONOLOCK_TIMESVC_URLS"),
        description="comma-separated timesvc base URLs, tried in turn (fail-over); empty = take global time "
        "from the store directly (one machine only)",
    )
    leasewatch_url: str = Field(
        default="",
        validation_alias=_alias("CHRONOLOCK_LEASEWATCH_URL"),
        description="leasewatch base URL for wake-ups; empty = poll the store with capped back-off. If "
        "leasewatch is unreachable, waiters fall back to that polling at once (with a cool-down before "
        "trying it again)",
    )
    lease: float = Field(
        default=10.0, gt=0, le=3600, validation_alias=_alias("CHRONOLOCK_LEASE"), description="lease length, seconds"
    )
    http_timeout: float = Field(
        default=2.0,
        gt=0,
        le=600,
        validation_alias=_alias("CHRONOLOCK_HTTP_TIMEOUT"),
        description="timeout per HTTP call, seconds",
    )
    clock_max_age: float = Field(
        default=1.0,
        ge=0,
        le=10,
        validation_alias=_alias("CHRONOLOCK_CLOCK_MAX_AGE"),
        description="seconds a global-time answer is extrapolated with the local monotonic clock for tickets "
        "(refreshed in the background after 0.2 s); 0 = ask timesvc for every ticket",
    )
    allow_store_clock: bool = Field(
        default=False,
        validation_alias=_alias("CHRONOLOCK_ALLOW_STORE_CLOCK"),
        description="without timesvc, global time comes straight from the store, unguarded against a skewed "
        "clock: allowed on the embedded store (one machine), refused on Cassandra unless this is true",
    )


MIN_TOKEN_LENGTH = 32
"""Bearer tokens shorter than this are refused at start-up (``openssl rand -hex 32`` gives 64)."""
_TOKEN_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def check_token(variable: str, value: SecretStr | None) -> SecretStr | None:
    """A bearer token setting: unset is fine; blank or shorter than :data:`MIN_TOKEN_LENGTH` is refused."""
    if value is None:
        return None
    token = value.get_secret_value()
    if not token.strip():
        raise ValueError(f"{variable} is blank: unset it instead (a blank token would be a guessable one)")
    if token != token.strip() or any(ch.isspace() for ch in token):
        raise ValueError(f"{variable} must not contain whitespace")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"{variable} must have at least {MIN_TOKEN_LENGTH} characters (openssl rand -hex 32)")
    register_secret(token)
    return value


def parse_named_tokens(variable: str, value: SecretStr | None) -> dict[str, str]:
    """``name:token,name2:token2`` (or one bare token, named ``admin``) -> {token: name}.

    Each name says *who* acted (it is recorded with every revocation); each token is
    checked like :func:`check_token`. Names and tokens must be unique."""
    if value is None:
        return {}
    raw = value.get_secret_value()
    if not raw.strip():
        raise ValueError(f"{variable} is blank: unset it to disable what it guards")
    entries = [entry.strip() for entry in raw.split(",")]
    tokens: dict[str, str] = {}
    for entry in entries:
        name, sep, token = entry.partition(":")
        if not sep:
            if len(entries) > 1:
                raise ValueError(f"{variable}: with several tokens each must be name:token")
            name, token = "admin", entry
        if not _TOKEN_NAME.match(name):
            raise ValueError(f"{variable}: token name {name!r} must be 1-64 letters, digits, _ . @ -")
        check_token(f"{variable} ({name})", SecretStr(token))
        if token in tokens:
            raise ValueError(f"{variable}: two names share one token")
        if name in tokens.values():
            raise ValueError(f"{variable}: the name {name!r} is used twice")
        tokens[token] = name
    return tokens


def _env_name(settings_cls: type[BaseSettings], name: str) -> str:
    field = settings_cls.model_fields[name]
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0]).upper()  # the canonical name; later choices are deprecated spellings
    if isinstance(alias, str):
        return alias.upper()
    return f"{settings_cls.model_config.get('env_prefix', '')}{name}".upper()


def env_names(settings_cls: type[BaseSettings]) -> set[str]:
    """The environment variable names a settings class reads (canonical names; for drift checks and docs)."""
    return {_env_name(settings_cls, name) for name in settings_cls.model_fields}


def all_env_names(settings_cls: type[BaseSettings]) -> set[str]:
    """Every variable name a settings class reads: canonical names and deprecated spellings."""
    names: set[str] = set()
    for name, field in settings_cls.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices)
        else:
            names.add(_env_name(settings_cls, name))
    return names


def known_env_names(settings_cls: type[BaseSettings]) -> frozenset[str]:
    """The settings of every chronolock program, as ``settings_cls``'s program accepts them in its
    environment: the lock client's, the services' (:data:`lockclient.environment.SERVICE_ENV`) and
    its own (read from the class, so a setting just added is accepted by its own program even
    before the list catches up; a test keeps the list exact)."""
    return frozenset(all_env_names(ClientSettings) | SERVICE_ENV | all_env_names(settings_cls))


def _is_secret(field: Any) -> bool:
    return "SecretStr" in str(field.annotation)


def secret_env_names(settings_cls: type[BaseSettings]) -> set[str]:
    """Every variable name (deprecated spellings included) that carries a secret."""
    names: set[str] = set()
    for name, field in settings_cls.model_fields.items():
        if not _is_secret(field):
            continue
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices)
        else:
            names.add(_env_name(settings_cls, name))
    return names


def _redacted_values(settings: BaseSettings) -> dict[str, Any]:
    """Variable name -> value, every secret masked and the store URL without credentials."""
    out: dict[str, Any] = {}
    cls = type(settings)
    for name, field in sorted(cls.model_fields.items(), key=lambda item: _env_name(cls, item[0])):
        value = getattr(settings, name)
        if _is_secret(field):
            shown: Any = None if not value else MASK
        elif name == "store_url":
            shown = strip_url_credentials(str(value))
        else:
            shown = value
        out[_env_name(cls, name)] = shown
    return out


def redacted_settings(settings: BaseSettings) -> str:
    """The settings as JSON (by variable name) with every secret masked and the store URL's
    credentials removed: what the ``settings`` commands print with ``--json``."""
    return json.dumps(_redacted_values(settings), indent=2, default=str)


def _shown(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if value == "":
        return "(empty)"
    return str(value)


def settings_report(settings: BaseSettings, *, program: str, as_json: bool = False) -> str:
    """What ``lockctl settings``, ``timesvc settings`` and ``leasewatch settings`` print: every
    setting the program would use, by variable name, where each came from (the environment or
    the default), secrets masked and no credentials in the store URL. ``as_json``: one JSON
    object, variable name -> value (:func:`redacted_settings`)."""
    if as_json:
        return redacted_settings(settings)
    values = {env: _shown(value) for env, value in _redacted_values(settings).items()}
    cls = type(settings)
    given = {_env_name(cls, name) for name in settings.model_fields_set}
    links = {name.upper() for name, value in os.environ.items() if is_service_link(name, value)}
    name_width = max(len(env) for env in values)
    value_width = min(48, max(len(value) for value in values.values()))
    lines = [f"{program} settings (secrets masked as {MASK}, no credentials in the store URL):", ""]
    for env, value in values.items():
        source = "environment" if env in given else "default"
        if env in links and env not in given:
            source += f"; {env} in the environment is a Kubernetes service link, not this setting"
        lines.append(f"  {env:<{name_width}}  {value:<{value_width}}  {source}")
    return redact("\n".join(lines))


def settings_help(settings_cls: type[BaseSettings]) -> str:
    """A plain-text table of a settings class's environment variables, for ``--help``."""
    lines = ["Settings (environment variables):", ""]
    for name, field in sorted(settings_cls.model_fields.items()):
        env = _env_name(settings_cls, name)
        if field.default_factory is not None:
            default = "(per process)"
        elif name == "store_url":
            default = "none, required"
        else:
            default = repr(field.default)
        lines.append(f"  {env:<32} {field.description or ''} [default: {default}]")
    return "\n".join(lines)
