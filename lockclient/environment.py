"""Which environment variables are chronolock's, and refusing the misspelt ones.

pydantic-settings reads the variables a settings class names and ignores every other one.
For a lock that is the worst possible failure: ``CHRONOLOCK_STORE_ULR=…`` took the lock in a
store nobody else used, ``CHRONOLOCK_CASANDRA_SSL=true`` logged in over plaintext, and both
exited 0. So every variable whose name starts with one of the project's prefixes
(:data:`PREFIXES`, in any case: pydantic-settings matches names case-insensitively) must be
one that *some* chronolock program reads; anything else stops the program at start-up with
a :class:`~lockclient.errors.ConfigurationError` (exit 78) naming the variable and the closest
valid name. Values are never quoted: a misspelt ``…_PASSWORD`` still holds a password.

"Some program", not "this program": a pod, a shell or a CI job often sets the variables of
every component at once (``make up`` passes its whole environment to timesvc and leasewatch),
so a program accepts the others' names without reading them. What counts as chronolock's:

* the settings of the lock client (:class:`~lockclient.settings.ClientSettings`), of the
  services (:data:`SERVICE_ENV`; the library never imports the services, so their names are
  listed here and a test keeps the list equal to their settings classes), and of the program
  itself, deprecated spellings included;
* :data:`RUNTIME_ENV`: what ``lockctl run`` gives its command (which may itself run lockctl)
  and what ``make up`` reads;
* :data:`DEVELOPMENT_ENV` and :data:`DEVELOPMENT_PREFIXES`: knobs of the test suite, the fault
  harness and the benchmarks — never read by a program a user runs;
* Kubernetes service links (:func:`is_service_link`). With ``enableServiceLinks`` on (the
  default; chronolock's manifests turn it off) the kubelet gives every pod
  ``TIMESVC_SERVICE_HOST``, ``TIMESVC_PORT=tcp://10.0.0.7:8700``,
  ``LEASEWATCH_PORT_8710_TCP_ADDR`` and so on for each Service of the namespace: a pod must
  still start. ``TIMESVC_PORT`` and ``LEASEWATCH_PORT`` are also real settings, so a ``*_PORT``
  variable whose value is a link (``tcp://host:port``) is recognised by its value and is not
  read as a setting (:func:`without_service_links`): the kubelet lets a variable the pod spec
  sets win over a link, so a real port setting is never of that shape.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Final

from lockclient.errors import ConfigurationError

__all__ = [
    "DEVELOPMENT_ENV",
    "DEVELOPMENT_PREFIXES",
    "PREFIXES",
    "RUNTIME_ENV",
    "SERVICE_ENV",
    "SERVICE_SECRET_ENV",
    "check_environment",
    "closest_name",
    "is_service_link",
    "without_service_links",
]

PREFIXES: Final = ("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_")
"""A variable whose name starts with one of these (in any case) must be chronolock's."""

SERVICE_ENV: Final = frozenset(
    {
        "LEASEWATCH_ADMIN_TOKEN",  # deprecated spelling of LEASEWATCH_ADMIN_TOKENS, still read
        "LEASEWATCH_ADMIN_TOKENS",
        "LEASEWATCH_GC_INTERVAL",
        "LEASEWATCH_GRACE",
        "LEASEWATCH_HEADER_TIMEOUT",
        "LEASEWATCH_HOST",
        "LEASEWATCH_KEEPALIVE_TIMEOUT",
        "LEASEWATCH_LOG_FORMAT",
        "LEASEWATCH_LOG_LEVEL",
        "LEASEWATCH_MAX_BODY_BYTES",
        "LEASEWATCH_MAX_CONNECTIONS",
        "LEASEWATCH_MAX_HEADER_BYTES",
        "LEASEWATCH_MAX_WAITERS",
        "LEASEWATCH_MAX_WAITERS_PER_LOCK",
        "LEASEWATCH_ORPHAN_AFTER",
        "LEASEWATCH_PARTITION_LEASE",
        "LEASEWATCH_PORT",
        "LEASEWATCH_READ_TOKEN",
        "LEASEWATCH_REPLICA_ID",
        "LEASEWATCH_SCAN_INTERVAL",
        "LEASEWATCH_SHUTDOWN_GRACE",
        "LEASEWATCH_TIMESVC_TOKEN",
        "LEASEWATCH_TIMESVC_URLS",
        "LEASEWATCH_TREND_INTERVAL",
        "LEASEWATCH_WAIT_POLL_RATE",
        "TIMESVC_HEADER_TIMEOUT",
        "TIMESVC_HOST",
        "TIMESVC_KEEPALIVE_TIMEOUT",
        "TIMESVC_LOG_FORMAT",
        "TIMESVC_LOG_LEVEL",
        "TIMESVC_MAX_BODY_BYTES",
        "TIMESVC_MAX_CONNECTIONS",
        "TIMESVC_MAX_HEADER_BYTES",
        "TIMESVC_MAX_SKEW",
        "TIMESVC_MIN_TRIP_INTERVAL",
        "TIMESVC_PORT",
        "TIMESVC_READ_TOKEN",
        "TIMESVC_REPLICAS",
        "TIMESVC_REPLICA_ID",
        "TIMESVC_SHUTDOWN_GRACE",
        "TIMESVC_TICK",
    }
)
"""Every variable timesvc and leasewatch read besides the shared ``CHRONOLOCK_*`` store settings
(deprecated spellings included). A test keeps it equal to their settings classes."""

SERVICE_SECRET_ENV: Final = frozenset(
    {
        "LEASEWATCH_ADMIN_TOKENS",
        "LEASEWATCH_ADMIN_TOKEN",
        "LEASEWATCH_READ_TOKEN",
        "LEASEWATCH_TIMESVC_TOKEN",
        "TIMESVC_READ_TOKEN",
    }
)
"""Secret variables of timesvc and leasewatch (a test keeps this equal to their settings classes).
``lockctl run`` removes them from the command's environment. (Here, not in
:mod:`lockclient.settings`, so that ``lockctl run`` needs no pydantic; that module re-exports it.)"""

RUNTIME_ENV: Final = frozenset(
    {
        # Set by `lockctl run` for its command; a command that runs lockctl or RemoteLocker.from_env()
        # in turn (a nested lock) has them in its environment.
        "CHRONOLOCK_LOCK_ID",
        "CHRONOLOCK_FENCING_TOKEN",
        "CHRONOLOCK_LOCK_OWNER",
        "CHRONOLOCK_LOCK_KIND",  # lock, semaphore, rwlock or election (issue 26)
        "CHRONOLOCK_TERM",  # `lockctl elect`: the leader's term (= its fencing token)
        # `make up` (scripts/up.py): the first of its four ports; its children inherit it.
        "CHRONOLOCK_UP_PORT",
    }
)
"""Variables that are chronolock's without being a setting of a settings class."""

DEVELOPMENT_ENV: Final = frozenset(
    {
        "CHRONOLOCK_PAGE_SCREENSHOTS",  # tests/leasewatch/test_page.py: where to save the page's screenshots
        "CHRONOLOCK_RING_PHASE_S",  # tests/lock/test_ring.py: seconds per phase
        "CHRONOLOCK_RING_SOAK_S",  # tests/lock/test_ring.py: seconds of the no-fault soak
    }
)
DEVELOPMENT_PREFIXES: Final = ("CHRONOLOCK_TEST_", "CHRONOLOCK_BENCH_", "CHRONOLOCK_FAULT_")
"""Namespaces of the test suite (``CHRONOLOCK_TEST_CASSANDRA``), the benchmarks and the fault
harness. No setting will ever be named like them, so a developer's shell may hold any."""

# pkg/kubelet/envvars/envvars.go: for a Service named NAME (upper case, "-" -> "_"), NAME_SERVICE_HOST,
# NAME_SERVICE_PORT, NAME_SERVICE_PORT_<PORT NAME>, and the Docker-link variables NAME_PORT
# (first port), NAME_PORT_<N>_<PROTO> and its _PROTO, _PORT and _ADDR.
_LINK_NAME: Final = re.compile(
    r"[A-Z0-9_]+?_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?|PORT_[0-9]+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)"
)
_LINK_VALUE: Final = re.compile(r"(?:tcp|udp|sctp)://(?:\[[0-9A-Fa-f:.]+\]|[0-9A-Za-z.\-]+):[0-9]{1,5}")


def _is_link_port(name: str, value: str) -> bool:
    """``NAME_PORT=tcp://10.0.0.7:8700``: the first port of a Service, as a Docker link."""
    return name.endswith("_PORT") and _LINK_VALUE.fullmatch(value) is not None


def is_service_link(name: str, value: str) -> bool:
    """Whether ``name=value`` is one of the variables the kubelet derives from a Service."""
    upper = name.upper()
    return _LINK_NAME.fullmatch(upper) is not None or _is_link_port(upper, value)


def without_service_links(environ: Mapping[str, str | None]) -> dict[str, str | None]:
    """``environ`` without ``*_PORT`` variables that hold a service link: ``TIMESVC_PORT=tcp://…``
    is the kubelet's, never a port to listen on (a pod spec's own TIMESVC_PORT would have won)."""
    return {name: value for name, value in environ.items() if value is None or not _is_link_port(name.upper(), value)}


def _ours(name: str) -> bool:
    return name.upper().startswith(PREFIXES)


def _key(name: str) -> tuple[str, str]:
    """(prefix, rest): the part that is compared when looking for the closest name."""
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return prefix, name[len(prefix) :]
    return "", name


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The valid name ``name`` most likely misspells, if one is close enough.

    Names are compared without their prefix (``CHRONOLOCK_`` shared by two names would
    make ``CHRONOLOCK_FOO`` look like ``CHRONOLOCK_UP_PORT``); on a tie the name with the
    same prefix wins (``CHRONOLOCK_TIMESVC_URL`` -> ``CHRONOLOCK_TIMESVC_URLS``, not
    ``LEASEWATCH_TIMESVC_URLS``). A name given without its prefix (``TIMESVC_URLS``)
    finds the one it ends."""
    upper = name.upper()
    candidates = sorted(set(known))
    prefix, rest = _key(upper)
    best: tuple[float, str] | None = None
    for candidate in candidates:
        other_prefix, other_rest = _key(candidate)
        score = difflib.SequenceMatcher(None, rest, other_rest).ratio() + (0.01 if other_prefix == prefix else 0.0)
        if best is None or score > best[0]:
            best = (score, candidate)
    if best is not None and best[0] >= 0.6:
        return best[1]
    ending = [candidate for candidate in candidates if candidate.endswith(f"_{upper}")]
    return ending[0] if ending else None


def _accepted(name: str, value: str, known: frozenset[str]) -> bool:
    upper = name.upper()
    return (
        upper in known
        or upper in RUNTIME_ENV
        or upper in DEVELOPMENT_ENV
        or upper.startswith(DEVELOPMENT_PREFIXES)
        or is_service_link(upper, value)
    )


def check_environment(environ: Mapping[str, str], known: Iterable[str]) -> None:
    """Refuse a variable with a chronolock prefix that no chronolock program reads.

    ``known``: every setting name of every program (upper case). Raises
    :class:`ConfigurationError` naming each unknown variable and the closest valid name,
    and each variable set twice in different case with different values (which one a
    case-insensitive reader takes is a guess). Values are never quoted."""
    names = frozenset(known)
    problems: list[str] = []
    by_upper: dict[str, list[str]] = {}
    for name, value in sorted(environ.items()):
        if not _ours(name):
            continue
        by_upper.setdefault(name.upper(), []).append(name)
        if _accepted(name, value, names):
            continue
        guess = closest_name(name, names | RUNTIME_ENV)
        hint = f"did you mean {guess}?" if guess else "no setting is spelt like it"
        problems.append(f"{name} is not a chronolock setting ({hint})")
    for spellings in by_upper.values():
        if len(spellings) > 1 and len({environ[name] for name in spellings}) > 1:
            problems.append(f"{' and '.join(spellings)} are one setting set twice with different values")
    if problems:
        raise ConfigurationError(
            "; ".join(problems) + ". A misspelt variable would be ignored in silence, so unknown "
            f"{'/'.join(p + '*' for p in PREFIXES)} variables are refused (`--help` lists the settings)"
        )
