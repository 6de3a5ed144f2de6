"""chronolock side by side with the locks a Python team would pick instead (issue 9).

**The experiment** is the thesis' (bench/locks.py), run against every lock in *one*
invocation: P = 1, then P = 5 processes (multiprocessing, spawn; connected first, then
released together by a barrier, so start-up is not measured) each take the same lock K
times with nothing inside (``hold_s``, default 0, is the same for every lock). Per
acquisition each worker records monotonic times (``time.monotonic`` is one clock for
all processes on Linux): when ``acquire`` was invoked and when it returned (**wait** =
the difference), when ``release`` was invoked and when it returned, and which process.

Reported per lock and P: mean / p50 / p99 / max wait, acquisitions per second (over the
span from the barrier to the last release), the **longest same-process run** (the most
consecutive grants to one process, in grant order = order of the acquire-return times,
which is the grant order because holds never overlap — checked: ``overlaps`` counts
grants that returned before the previous holder began to release, and must be 0),
**Jain's fairness index** over per-process grant counts while all P contend (until the
first process finished its K; 1 = equal shares, 1/P = one process took everything), and
operations per acquisition where they can be counted: by the client (chronolock's
``RemoteLock.store_ops`` / ``round_trips`` / ``lwt_rounds`` and ``release_counts``; the
statements the PostgreSQL and naive Cassandra clients send) or by the server (Redis
``total_commands_processed``, ZooKeeper ``srvr`` packets received, etcd's MVCC
put/range/txn/delete counters), acquisition and release together.

All P = 1 points run first, then all P = 5 points, in the same order, with every server
started once at the beginning: the contended points are measured close together under
the same background load (this machine is small and shared; the load average is
recorded at each point).

**The locks** (each skippable; a skipped row says why):

* chronolock, fair queue (``algorithm="queue"``) on the embedded SQLite store, global
  time from one ``timesvc serve`` replica, with leasewatch wake-ups **on**
  (``LeasewatchWaker``, one ``leasewatch serve``) and **off** (capped back-off polling);
  and the thesis' backoff baseline (``algorithm="backoff"``, sleeps scaled 10× down as
  in bench/locks.py). Public API only: ``RemoteLocker(store, TimeServiceClock(urls),
  lease=10, waker=...)``, ``get_lock(id, timeout=...)``, ``release()``.
* kazoo's ``Lock`` recipe with ZooKeeper (Debian ``zookeeper``; the Java server started
  directly, standalone, from a generated ``zoo.cfg``).
* redis-py's ``Lock`` (blocking, library defaults: ``sleep=0.1``) with Redis (Debian
  ``redis-server``, no persistence).
* PostgreSQL session advisory locks, ``pg_advisory_lock`` / ``pg_advisory_unlock``
  through psycopg, autocommit (Debian ``postgresql-15``: ``initdb`` into a temporary
  directory, ``postgres`` run as the ``postgres`` user when we are root).
* etcd's v3 lock API through its gRPC gateway (HTTP JSON, httpx): one lease per
  process from ``/v3/lease/grant`` for the whole run (its TTL covers the run, as a
  kept-alive session would), then ``/v3/lock/lock`` and ``/v3/lock/unlock`` (Debian
  ``etcd-server``).
* Only when ``CHRONOLOCK_BENCH_CASSANDRA=host[,host...]:port`` names a reachable
  Cassandra 4.x/5.x: "the lock most Cassandra users write" — ``INSERT ... IF NOT EXISTS
  USING TTL 30`` retried every 10 ms while not applied, ``DELETE ... IF owner = ?``
  (retried while its outcome is unknown) — and chronolock's fair queue on the same node
  (timesvc and leasewatch on the ``cassandra://`` store; schema by ``lockctl schema``),
  polling and wake-ups on.

Every server listens on 127.0.0.1 on a free port with its data in a temporary directory,
and is stopped by the PID we started in a ``finally`` block. Every loop is bounded by a
count and by wall time; workers that overrun are killed by PID.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import itertools
import json
import math
import multiprocessing as mp
import os
import pwd
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    free_port,
    machine_info,
    markdown_table,
    percentile,
    system_busy_seconds,
)
from bench.locks import THESIS_MAX_MS, THESIS_MEAN_MS

__all__ = ["PEERS", "PeersConfig", "run"]

HOST = "127.0.0.1"
BIN = Path(sys.executable).parent
CASSANDRA_ENV = "CHRONOLOCK_BENCH_CASSANDRA"
CASSANDRA_KEYSPACE = "chronolock_bench_peers"
INITDB_OPTIONS = ("-U", "postgres", "-A", "trust", "--no-sync", "--no-locale", "-E", "UTF8")
NAIVE_RETRY_S = 0.01
"""The naive Cassandra lock retries a not-applied insert after this sleep."""
NAIVE_TTL_S = 30


@dataclass(frozen=True)
class PeersConfig:
    k: int = 1000
    """Acquisitions per process (P = 1 and P = 5)."""
    cassandra_k: int = 300
    """The same on a real Cassandra, where one acquisition costs tens of ms (keeps the run bounded)."""
    processes: tuple[int, ...] = (1, 5)
    hold_s: float = 0.0
    lease_s: float = 10.0
    backoff_owner_wait_s: float = 0.1
    backoff_step_s: float = 0.005
    only: tuple[str, ...] = ()
    """Peer keys to run (empty: all)."""

    @classmethod
    def quick(cls, k: int | None = None, only: tuple[str, ...] = ()) -> PeersConfig:
        return cls(k=k or 100, cassandra_k=min(k or 50, 50), only=only)

    def k_for(self, peer: Peer) -> int:
        return min(self.k, self.cassandra_k) if peer.cassandra else self.k

    def point_timeout(self, p: int, k: int) -> float:
        """Wall bound of one point's measured part: generous for ~40 ms per acquisition, never unbounded."""
        return 30.0 + 0.04 * k * p


@dataclass(frozen=True)
class Peer:
    key: str
    label: str
    kind: str
    """Worker implementation: chronolock, kazoo, redis, postgres, etcd, cassandra-naive."""
    server: str
    """What must be running: embedded, zookeeper, redis, postgres, etcd, cassandra."""
    options: dict[str, Any] = field(default_factory=dict)
    cassandra: bool = False


PEERS: tuple[Peer, ...] = (
    Peer(
        "chronolock-wake",
        "chronolock queue, embedded store, wake-ups on (leasewatch)",
        "chronolock",
        "embedded",
        {"algorithm": "queue", "wake": True},
    ),
    Peer(
        "chronolock-poll",
        "chronolock queue, embedded store, wake-ups off (polling)",
        "chronolock",
        "embedded",
        {"algorithm": "queue", "wake": False},
    ),
    Peer(
        "chronolock-backoff",
        "chronolock backoff baseline (thesis), embedded store",
        "chronolock",
        "embedded",
        {"algorithm": "backoff", "wake": False},
    ),
    Peer("kazoo", "kazoo Lock + ZooKeeper", "kazoo", "zookeeper"),
    Peer("postgres", "PostgreSQL advisory lock (psycopg)", "postgres", "postgres"),
    Peer("redis", "redis-py Lock + Redis", "redis", "redis"),
    Peer("etcd", "etcd v3 lock API (gRPC gateway, httpx)", "etcd", "etcd"),
    Peer(
        "cassandra-naive",
        "naive Cassandra LWT lock (INSERT IF NOT EXISTS / DELETE IF owner)",
        "cassandra-naive",
        "cassandra",
        cassandra=True,
    ),
    Peer(
        "chronolock-cassandra-poll",
        "chronolock queue on Cassandra, wake-ups off (polling)",
        "chronolock",
        "cassandra",
        {"algorithm": "queue", "wake": False},
        cassandra=True,
    ),
    Peer(
        "chronolock-cassandra-wake",
        "chronolock queue on Cassandra, wake-ups on (leasewatch)",
        "chronolock",
        "cassandra",
        {"algorithm": "queue", "wake": True},
        cassandra=True,
    ),
)
PEER_KEYS = tuple(peer.key for peer in PEERS)
PEERS_BY_KEY = {peer.key: peer for peer in PEERS}


# --------------------------------------------------------------------------------------
# Servers: started on 127.0.0.1 with free ports and temporary data, stopped by PID.
# --------------------------------------------------------------------------------------


class Skip(Exception):
    """A server or client is missing: the rows that need it are skipped, with this reason."""


class ServerProcess:
    """One server process we started; :meth:`stop` signals exactly this PID."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.stop_signal = stop_signal
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_until(self, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Skip(f"{self.name} exited with {self.proc.returncode}: {self.log_tail(3)}")
            with contextlib.suppress(Exception):  # not up yet
                if ready():
                    return
            time.sleep(0.1)
        raise Skip(f"{self.name} not ready within {timeout:.0f} s: {self.log_tail(1)}")

    def log_tail(self, lines: int = 20, limit: int = 300) -> str:
        try:
            text = " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
        return text if len(text) <= limit else "…" + text[-limit:]

    def stop(self) -> None:
        """The stop signal to our PID, SIGKILL after 15 s."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, self.stop_signal)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()


def _service_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMESVC_", "LEASEWATCH_", "CHRONOLOCK_"))}
    env.update(extra)
    return env


def _http_ok(url: str) -> bool:
    import httpx

    return httpx.get(url, timeout=1.0).status_code == 200


def _four_letter(port: int, word: bytes) -> str:
    with socket.create_connection((HOST, port), timeout=2.0) as s:
        s.sendall(word)
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _zookeeper_classpath() -> str:
    """zookeeper.jar from Debian's package files; its manifest's Class-Path names the rest."""
    candidates = [Path("/usr/share/java/zookeeper.jar")]
    for package in ("libzookeeper-java", "zookeeper"):
        listed = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=False).stdout
        candidates += [Path(line) for line in listed.splitlines() if line.endswith("/zookeeper.jar")]
    for jar in candidates:
        if jar.is_file():
            return str(jar)
    raise Skip("no ZooKeeper server: install Debian's zookeeper package (make bench does)")


class Servers:
    """Everything the selected rows need, started once; ``skipped`` maps a server to why it is missing."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: list[ServerProcess] = []
        self.skipped: dict[str, str] = {}
        self.params: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, str] = {}
        self.stat_readers: dict[str, Callable[[], float]] = {}
        self.zookeeper_tick_ms = 2000
        """ZooKeeper's tickTime: sessions may time out between 2 and 20 ticks (bench/election.py sets 500)."""

    def _start(self, name: str, argv: list[str], **kwargs: Any) -> ServerProcess:
        proc = ServerProcess(name, argv, self.workdir / f"{name}.log", **kwargs)
        self.processes.append(proc)
        return proc

    def stop_all(self) -> None:
        errors: list[BaseException] = []
        for proc in reversed(self.processes):
            try:
                proc.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        self.processes.clear()
        if errors:
            raise errors[0]

    def start(self, server: str) -> None:
        starter = {
            "embedded": self._embedded,
            "zookeeper": self._zookeeper,
            "redis": self._redis,
            "postgres": self._postgres,
            "etcd": self._etcd,
            "cassandra": self._cassandra,
        }[server]
        started = time.monotonic()
        try:
            starter()
        except Skip as exc:
            self.skipped[server] = str(exc)
            print(f"  [peers] {server}: skipped — {exc}", flush=True)
        else:
            print(f"  [peers] {server} up in {time.monotonic() - started:.1f} s", flush=True)

    # -- chronolock on the embedded store ------------------------------------------------

    def _chronolock_services(self, name: str, store_url: str) -> dict[str, Any]:
        timesvc_port, leasewatch_port = free_port(), free_port()
        timesvc = self._start(
            f"{name}-timesvc",
            [str(BIN / "timesvc"), "serve"],
            env=_service_env(
                {
                    "CHRONOLOCK_STORE_URL": store_url,
                    "TIMESVC_HOST": HOST,
                    "TIMESVC_PORT": str(timesvc_port),
                    "TIMESVC_REPLICA_ID": f"{name}-timesvc",
                    "TIMESVC_REPLICAS": "1",  # a lone replica: no majority to wait for
                    "TIMESVC_SHUTDOWN_GRACE": "1",
                    "TIMESVC_LOG_LEVEL": "warning",
                }
            ),
        )
        leasewatch = self._start(
            f"{name}-leasewatch",
            [str(BIN / "leasewatch"), "serve"],
            env=_service_env(
                {
                    "CHRONOLOCK_STORE_URL": store_url,
                    "LEASEWATCH_HOST": HOST,
                    "LEASEWATCH_PORT": str(leasewatch_port),
                    "LEASEWATCH_REPLICA_ID": f"{name}-leasewatch",
                    "LEASEWATCH_SHUTDOWN_GRACE": "1",
                    "LEASEWATCH_LOG_LEVEL": "warning",
                }
            ),
        )
        timesvc_url = f"http://{HOST}:{timesvc_port}"
        leasewatch_url = f"http://{HOST}:{leasewatch_port}"
        timesvc.wait_until(lambda: _http_ok(f"{timesvc_url}/readyz"), 60)
        leasewatch.wait_until(lambda: _http_ok(f"{leasewatch_url}/healthz"), 60)
        return {"store_url": store_url, "timesvc_urls": [timesvc_url], "leasewatch_url": leasewatch_url}

    def _embedded(self) -> None:
        if not (BIN / "timesvc").exists() or not (BIN / "leasewatch").exists():
            raise Skip(f"no timesvc/leasewatch in {BIN}: run make install")
        self.params["embedded"] = self._chronolock_services("embedded", f"sqlite:///{self.workdir / 'cells.db'}")
        from importlib.metadata import version

        self.versions["chronolock"] = version("chronolock")

    # -- ZooKeeper -------------------------------------------------------------------------

    def _zookeeper(self) -> None:
        try:
            import kazoo.version
        except ImportError as exc:
            raise Skip("no kazoo: pip install -e '.[dev]'") from exc
        java = shutil.which("java")
        if java is None:
            raise Skip("no java for ZooKeeper")
        classpath = _zookeeper_classpath()
        port = free_port()
        data = self.workdir / "zookeeper"
        data.mkdir()
        cfg = data / "zoo.cfg"
        cfg.write_text(
            "\n".join(
                [
                    f"tickTime={self.zookeeper_tick_ms}",
                    f"dataDir={data / 'data'}",
                    f"clientPort={port}",
                    f"clientPortAddress={HOST}",
                    "maxClientCnxns=0",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=srvr",
                    "",
                ]
            )
        )
        proc = self._start(
            "zookeeper",
            [java, "-Xmx256m", "-cp", classpath, "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
        )
        proc.wait_until(lambda: "Mode: standalone" in _four_letter(port, b"srvr"), 90)
        srvr = _four_letter(port, b"srvr")
        self.versions["ZooKeeper"] = srvr.split("\n", 1)[0].removeprefix("Zookeeper version: ").split("-", 1)[0]
        self.versions["kazoo"] = kazoo.version.__version__
        self.params["zookeeper"] = {"hosts": f"{HOST}:{port}"}

        def received() -> float:
            match = re.search(r"Received: (\d+)", _four_letter(port, b"srvr"))
            return float(match.group(1)) if match else math.nan

        self.stat_readers["zookeeper"] = received

    # -- Redis -----------------------------------------------------------------------------

    def _redis(self) -> None:
        try:
            import redis
        except ImportError as exc:
            raise Skip("no redis-py: pip install -e '.[dev]'") from exc
        binary = shutil.which("redis-server")
        if binary is None:
            raise Skip("no redis-server: install Debian's redis-server package (make bench does)")
        port = free_port()
        data = self.workdir / "redis"
        data.mkdir()
        proc = self._start(
            "redis",
            [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no", "--dir", str(data)],
        )
        client = redis.Redis(host=HOST, port=port, socket_timeout=2)
        proc.wait_until(lambda: bool(client.ping()), 30)
        self.versions["Redis"] = str(client.info("server")["redis_version"])
        self.versions["redis-py"] = redis.__version__
        self.params["redis"] = {"host": HOST, "port": port}

        def commands() -> float:
            return float(client.info("stats")["total_commands_processed"])

        self.stat_readers["redis"] = commands

    # -- PostgreSQL ------------------------------------------------------------------------

    def _postgres(self) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise Skip("no psycopg: pip install -e '.[dev]'") from exc
        bindir = Path("/usr/lib/postgresql/15/bin")
        if not (bindir / "postgres").exists():
            found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
            if not found:
                raise Skip("no PostgreSQL server: install Debian's postgresql-15 package (make bench does)")
            bindir = found[-1].parent
        # postgres refuses to run as root: run it (and initdb) as an unprivileged user, by
        # setpriv, which execs in place, so the PID we stop is the postmaster itself.
        prefix: list[str] = []
        root = Path(tempfile.mkdtemp(prefix="chronolock-bench-pg-"))
        self._pg_root = root
        if os.geteuid() == 0:
            user = next((name for name in ("postgres", "nobody") if _user_exists(name)), None)
            setpriv = shutil.which("setpriv")
            if user is None or setpriv is None:
                raise Skip("running as root without a postgres/nobody user or setpriv to drop privileges")
            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
            prefix = [setpriv, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--"]
        data = root / "data"
        initdb = subprocess.run(
            [*prefix, str(bindir / "initdb"), "-D", str(data), *INITDB_OPTIONS],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if initdb.returncode != 0:
            raise Skip(f"initdb failed: {initdb.stderr.strip()[-300:]}")
        port = free_port()
        pg_settings = ["-c", f"listen_addresses={HOST}", "-c", "max_connections=30"]
        proc = self._start(
            "postgres",
            [*prefix, str(bindir / "postgres"), "-D", str(data), "-k", str(root), "-p", str(port), *pg_settings],
            stop_signal=signal.SIGINT,  # "fast" shutdown; SIGTERM would wait for sessions to end
        )

        def connects() -> bool:
            with psycopg.connect(host=HOST, port=port, user="postgres", dbname="postgres", connect_timeout=2) as c:
                row = c.execute("SHOW server_version").fetchone()
                self.versions["PostgreSQL"] = str(row[0]).split(" ", 1)[0] if row else "?"
            return True

        proc.wait_until(connects, 60)
        self.versions["psycopg"] = psycopg.__version__
        self.params["postgres"] = {"host": HOST, "port": port, "user": "postgres"}

    # -- etcd ------------------------------------------------------------------------------

    def _etcd(self) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise Skip("no etcd: install Debian's etcd-server package (make bench does)")
        import httpx

        client_port, peer_port = free_port(), free_port()
        client_url, peer_url = f"http://{HOST}:{client_port}", f"http://{HOST}:{peer_port}"
        proc = self._start(
            "etcd",
            [
                binary,
                "--name=bench",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=bench={peer_url}",
            ],
        )
        proc.wait_until(lambda: httpx.get(f"{client_url}/health", timeout=1).json().get("health") == "true", 60)
        self.versions["etcd"] = str(httpx.get(f"{client_url}/version", timeout=2).json().get("etcdserver"))
        self.versions["httpx"] = httpx.__version__
        self.params["etcd"] = {"url": client_url}

        def mvcc_ops() -> float:
            text = httpx.get(f"{client_url}/metrics", timeout=5).text
            total = 0.0
            for name in ("put", "range", "txn", "delete"):
                match = re.search(rf"^etcd_mvcc_{name}_total (\S+)$", text, re.MULTILINE)
                total += float(match.group(1)) if match else math.nan
            return total

        self.stat_readers["etcd"] = mvcc_ops

    # -- Cassandra (external, only when named) --------------------------------------------

    def _cassandra(self) -> None:
        target = os.environ.get(CASSANDRA_ENV, "").strip()
        if not target:
            raise Skip(f"no Cassandra: set {CASSANDRA_ENV}=host[,host...]:port to a running Cassandra 4.x/5.x")
        hosts_part, _, port_part = target.rpartition(":")
        if not hosts_part or not port_part.isdigit():
            raise Skip(f"{CASSANDRA_ENV}={target!r} is not host[,host...]:port")
        hosts, port = [h for h in hosts_part.split(",") if h], int(port_part)
        try:
            with socket.create_connection((hosts[0], port), timeout=3):
                pass
        except OSError as exc:
            raise Skip(f"no Cassandra listening at {hosts[0]}:{port} ({exc})") from exc
        try:
            from cassandra.cluster import Cluster
        except ImportError as exc:
            raise Skip("no cassandra-driver: pip install -e '.[cassandra]'") from exc
        cluster = Cluster(hosts, port=port, connect_timeout=10)
        try:
            session = cluster.connect()
            row = session.execute("SELECT release_version FROM system.local").one()
            release = str(row[0]) if row else "?"
            if not release.split(".")[0].isdigit() or int(release.split(".")[0]) < 4:
                raise Skip(f"Cassandra {release} at {target}: the comparison needs 4.x/5.x (lightweight transactions)")
            self.versions["Cassandra"] = release
            import cassandra

            self.versions["cassandra-driver"] = cassandra.__version__
            store_url = f"cassandra://{','.join(hosts)}:{port}/{CASSANDRA_KEYSPACE}"
            schema = subprocess.run(
                [str(BIN / "lockctl"), "schema", "--replication-factor", str(min(3, len(hosts)))],
                env=_service_env({"CHRONOLOCK_STORE_URL": store_url}),
                capture_output=True,
                text=True,
                check=False,
                timeout=180,
            )
            if schema.returncode != 0:
                raise Skip(f"lockctl schema failed ({schema.returncode}): {schema.stderr.strip()[-300:]}")
            session.execute(
                f"CREATE TABLE IF NOT EXISTS {CASSANDRA_KEYSPACE}.naive_locks (id text PRIMARY KEY, owner text)"
            )
        finally:
            cluster.shutdown()
        self.params["cassandra"] = {
            "hosts": hosts,
            "port": port,
            "keyspace": CASSANDRA_KEYSPACE,
            **self._chronolock_services("cassandra", store_url),
        }

    def cleanup(self) -> None:
        root = getattr(self, "_pg_root", None)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@contextlib.contextmanager
def servers(workdir: Path, needed: list[str]) -> Iterator[Servers]:
    s = Servers(workdir)
    try:
        for server in needed:
            s.start(server)
        yield s
    finally:
        try:
            s.stop_all()
        finally:
            s.cleanup()


# --------------------------------------------------------------------------------------
# Workers: one process per contender, one client per lock kind.
# --------------------------------------------------------------------------------------

Counts = tuple[int | None, int | None, int | None]
"""Operations, sequential round trips, LWT rounds — None where the client cannot count."""
UNCOUNTED: Counts = (None, None, None)


@dataclass
class Grant:
    handle: Any
    token: int | None = None
    counts: Counts = UNCOUNTED
    ticket_us: int | None = None
    """chronolock's fair queue: the global time of the ticket the grant was made for."""
    enqueued_at: float | None = None
    """...``time.monotonic()`` when its queue cell was written (one clock for all processes here)."""
    looked_at: float | None = None
    """...and when the queue read that preceded the grant started: FIFO is promised among the
    cells written before it (docs/guarantees.md, "Order (FIFO)")."""


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    kind: str
    lock_name: str
    params: dict[str, Any]
    options: dict[str, Any]
    k: int
    hold_s: float
    lease_s: float
    backoff_owner_wait_s: float
    backoff_step_s: float
    deadline_s: float
    out_path: str


class _Client:
    """What each lock kind implements for the worker loop."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.p = spec.params

    def open(self) -> None:  # connect, before the barrier
        raise NotImplementedError

    def acquire(self, timeout: float) -> Grant | None:  # None: timed out
        raise NotImplementedError

    def release(self, grant: Grant) -> Counts:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        return {}


class _Chronolock(_Client):
    def open(self) -> None:
        from lockclient import RemoteLocker, TimeServiceClock, open_store
        from lockclient.wake import LeasewatchWaker

        self.store = open_store(self.p["store_url"])
        self.clock = TimeServiceClock(self.p["timesvc_urls"])
        self.waker = LeasewatchWaker(self.p["leasewatch_url"]) if self.spec.options["wake"] else None
        self.locker = RemoteLocker(
            self.store,
            self.clock,
            lease=self.spec.lease_s,
            algorithm=self.spec.options["algorithm"],
            waker=self.waker,
            backoff_owner_wait=self.spec.backoff_owner_wait_s,
            backoff_step=self.spec.backoff_step_s,
        )
        self.clock.now_us()  # open the HTTP connection before the clock starts

    def acquire(self, timeout: float) -> Grant | None:
        from lockclient.errors import LockTimeout
        from lockclient.lockid import ticket_time

        try:
            lock = self.locker.get_lock(self.spec.lock_name, timeout=timeout)
        except LockTimeout:
            return None
        counts = (lock.store_ops, lock.round_trips, lock.lwt_rounds)
        if not lock.ticket[:1].isdigit():  # the backoff baseline has no queue
            return Grant(lock, lock.fencing_token, counts)
        return Grant(lock, lock.fencing_token, counts, ticket_time(lock.ticket), lock.enqueued_at, lock.looked_at)

    def release(self, grant: Grant) -> Counts:
        lock = grant.handle
        if not lock.release():
            raise RuntimeError(f"release of {lock!r} returned False (lost or not clean)")
        c = lock.release_counts
        return (c.total, c.round_trips, c.lwt_rounds)

    def close(self) -> None:
        self.locker.close()
        if self.waker is not None:
            self.waker.close()
        self.clock.close()
        self.store.close()

    def stats(self) -> dict[str, Any]:
        if self.waker is None:
            return {}
        return {
            "wakeups": self.waker.wakeups,
            "fallbacks": self.waker.fallbacks,
            "notifications": self.waker.notifications,
            "notices_skipped": self.waker.notices_skipped,
        }


class _Kazoo(_Client):
    def open(self) -> None:
        from kazoo.client import KazooClient

        self.zk = KazooClient(hosts=self.p["hosts"], timeout=10.0)
        self.zk.start(timeout=30)
        self.lock = self.zk.Lock(f"/bench/{self.spec.lock_name}", identifier=f"worker-{self.spec.index}")

    def acquire(self, timeout: float) -> Grant | None:
        from kazoo.exceptions import LockTimeout

        try:
            if not self.lock.acquire(blocking=True, timeout=timeout):
                return None
        except LockTimeout:
            return None
        # The sequence number of our znode: the recipe grants in this order.
        node = self.lock.node or ""
        token = int(node[-10:]) if node[-10:].isdigit() else None
        return Grant(self.lock, token)

    def release(self, grant: Grant) -> Counts:
        if not self.lock.release():
            raise RuntimeError("kazoo Lock.release returned False")
        return UNCOUNTED

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()


class _Redis(_Client):
    def open(self) -> None:
        import redis

        self.r = redis.Redis(host=self.p["host"], port=self.p["port"], socket_timeout=30)
        self.r.ping()
        # The library's defaults (sleep=0.1 between attempts), as a user would write it.
        self.lock = self.r.lock(f"bench:{self.spec.lock_name}", timeout=30)

    def acquire(self, timeout: float) -> Grant | None:
        if not self.lock.acquire(blocking=True, blocking_timeout=timeout):
            return None
        return Grant(self.lock)

    def release(self, grant: Grant) -> Counts:
        self.lock.release()
        return UNCOUNTED

    def close(self) -> None:
        self.r.close()


class _Postgres(_Client):
    def open(self) -> None:
        import psycopg

        self.conn = psycopg.connect(
            host=self.p["host"],
            port=self.p["port"],
            user=self.p["user"],
            dbname="postgres",
            autocommit=True,
            connect_timeout=10,
        )
        # A waiter blocked in pg_advisory_lock is cancelled by the server after this.
        self.conn.execute(f"SET statement_timeout = {int(self.spec.deadline_s * 1000)}")
        self.key = int(uuid.UUID(hex=self.spec.lock_name[-32:]).int % (2**62))

    def acquire(self, timeout: float) -> Grant | None:
        import psycopg

        try:
            self.conn.execute("SELECT pg_advisory_lock(%s)", (self.key,))
        except psycopg.errors.QueryCanceled:
            return None
        return Grant(self.key, None, (1, 1, None))

    def release(self, grant: Grant) -> Counts:
        row = self.conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,)).fetchone()
        if not row or row[0] is not True:
            raise RuntimeError("pg_advisory_unlock: the lock was not held")
        return (1, 1, None)

    def close(self) -> None:
        self.conn.close()


class _Etcd(_Client):
    def open(self) -> None:
        import httpx

        self.http = httpx.Client(base_url=self.p["url"], timeout=10.0)
        # One lease for the whole run, its TTL beyond the run's bound: what a kept-alive
        # session gives a real client, without a keep-alive stream in this benchmark.
        ttl = int(self.spec.deadline_s) + 120
        response = self.http.post("/v3/lease/grant", json={"TTL": ttl})
        response.raise_for_status()
        self.lease = response.json()["ID"]
        self.name = base64.b64encode(f"bench/{self.spec.lock_name}".encode()).decode()

    def acquire(self, timeout: float) -> Grant | None:
        import httpx

        try:
            response = self.http.post(
                "/v3/lock/lock", json={"name": self.name, "lease": self.lease}, timeout=httpx.Timeout(timeout + 0.5)
            )
        except httpx.TimeoutException:
            return None
        response.raise_for_status()
        body = response.json()
        return Grant(body["key"], int(body["header"]["revision"]))

    def release(self, grant: Grant) -> Counts:
        self.http.post("/v3/lock/unlock", json={"key": grant.handle}).raise_for_status()
        return UNCOUNTED

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.http.post("/v3/lease/revoke", json={"ID": self.lease})
        self.http.close()


class _CassandraNaive(_Client):
    """The lock most Cassandra users write: one LWT row with a TTL, retried while taken."""

    def open(self) -> None:
        from cassandra.cluster import Cluster
        from cassandra.query import dict_factory

        self.cluster = Cluster(self.p["hosts"], port=self.p["port"], connect_timeout=10)
        self.session = self.cluster.connect(self.p["keyspace"])
        self.session.row_factory = dict_factory
        self.insert = self.session.prepare(
            f"INSERT INTO naive_locks (id, owner) VALUES (?, ?) IF NOT EXISTS USING TTL {NAIVE_TTL_S}"
        )
        self.delete = self.session.prepare("DELETE FROM naive_locks WHERE id = ? IF owner = ?")
        self.unknown = 0
        self.not_ours = 0

    def acquire(self, timeout: float) -> Grant | None:
        from cassandra import DriverException
        from cassandra.protocol import ErrorMessage

        owner = uuid.uuid4().hex
        deadline = time.monotonic() + timeout
        attempts = 0
        while True:
            attempts += 1
            try:
                rs = self.session.execute(self.insert, (self.spec.lock_name, owner))
                # Not applied with our own owner: an earlier attempt of ours applied but its
                # reply was lost (a CAS timeout means "unknown", not "failed").
                if rs.was_applied or (rs.one() or {}).get("owner") == owner:
                    return Grant(owner, None, (attempts, attempts, attempts))
            except (DriverException, ErrorMessage):
                self.unknown += 1
            if time.monotonic() >= deadline:
                return None
            time.sleep(NAIVE_RETRY_S)

    def release(self, grant: Grant) -> Counts:
        from cassandra import DriverException
        from cassandra.protocol import ErrorMessage

        # A timed-out conditional delete is retried (not applied the second time if the first
        # one was): a worker that gave up here would leave the row for its whole TTL.
        give_up_at = time.monotonic() + NAIVE_TTL_S
        attempts = 0
        while True:
            attempts += 1
            try:
                rs = self.session.execute(self.delete, (self.spec.lock_name, grant.handle))
            except (DriverException, ErrorMessage):
                self.unknown += 1
                if time.monotonic() >= give_up_at:
                    raise
                time.sleep(NAIVE_RETRY_S)
                continue
            if not rs.was_applied and attempts == 1:
                self.not_ours += 1  # the TTL ran out and someone else holds it now
            return (attempts, attempts, attempts)

    def close(self) -> None:
        self.cluster.shutdown()

    def stats(self) -> dict[str, Any]:
        return {"unknown_outcomes": self.unknown, "release_found_another_owner": self.not_ours}


CLIENTS: dict[str, type[_Client]] = {
    "chronolock": _Chronolock,
    "kazoo": _Kazoo,
    "redis": _Redis,
    "postgres": _Postgres,
    "etcd": _Etcd,
    "cassandra-naive": _CassandraNaive,
}


def _worker(spec: WorkerSpec, barrier: Any) -> None:
    """One contender process: take the lock K times, write what happened as JSON."""
    client = CLIENTS[spec.kind](spec)
    records: list[list[Any]] = []
    error: str | None = None
    start: float | None = None
    opened = False
    try:
        try:
            client.open()
            opened = True
        except BaseException:
            barrier.abort()  # the others stop waiting at once
            raise
        barrier.wait(timeout=180)
        start = time.monotonic()
        deadline = start + spec.deadline_s
        for _ in range(spec.k):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                error = "deadline reached"
                break
            invoked = time.monotonic()
            grant = client.acquire(remaining)
            acquired = time.monotonic()
            if grant is None:
                error = "deadline reached while waiting"
                break
            if spec.hold_s > 0:
                time.sleep(spec.hold_s)
            releasing = time.monotonic()
            release_counts = client.release(grant)
            released = time.monotonic()
            records.append(
                [
                    *(invoked, acquired, releasing, released, grant.token, *grant.counts, *release_counts),
                    *(grant.ticket_us, grant.enqueued_at, grant.looked_at),
                ]
            )
    except Exception as exc:  # report, do not hang the parent
        error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        stats: dict[str, Any] = {}
        if opened:
            stats = client.stats()
            try:
                client.close()
            except Exception as exc:
                error = error or f"close: {type(exc).__name__}: {exc}"
    Path(spec.out_path).write_text(
        json.dumps(
            {
                "index": spec.index,
                "pid": os.getpid(),
                "start": start,
                "records": records,
                "error": error,
                "stats": stats,
            }
        )
    )


# --------------------------------------------------------------------------------------
# One point: P processes × K acquisitions of one lock.
# --------------------------------------------------------------------------------------


def _tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and of its children it has reaped (PostgreSQL's backends:
    one process per connection, gone when the connection closes), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    # After the command name: utime, stime, cutime, cstime are fields 14–17 (1-based, proc(5)).
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _our_cpu_seconds(server_pids: list[int]) -> float:
    """CPU used by this process, its finished children (the workers) and the servers we started
    (with their live and reaped children)."""
    t = os.times()
    servers = 0.0
    for pid in server_pids:
        servers += _tree_cpu_seconds(pid)
        with contextlib.suppress(OSError, ValueError):
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                servers += _tree_cpu_seconds(int(child))
    return t.user + t.system + t.children_user + t.children_system + servers


def _point(
    cfg: PeersConfig, peer: Peer, params: dict[str, Any], p: int, workdir: Path, server_pids: list[int]
) -> dict[str, Any]:
    k = cfg.k_for(peer)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(p)
    lock_name = f"bench-{peer.key}-p{p}-{uuid.uuid4().hex}"
    timeout = cfg.point_timeout(p, k)
    specs = [
        WorkerSpec(
            index=i,
            kind=peer.kind,
            lock_name=lock_name,
            params=params,
            options=peer.options,
            k=k,
            hold_s=cfg.hold_s,
            lease_s=cfg.lease_s,
            backoff_owner_wait_s=cfg.backoff_owner_wait_s,
            backoff_step_s=cfg.backoff_step_s,
            deadline_s=timeout,
            out_path=str(workdir / f"{lock_name}-{i}.json"),
        )
        for i in range(p)
    ]
    procs = [
        ctx.Process(target=_worker, args=(spec, barrier), name=f"peers-{peer.key}-{i}") for i, spec in enumerate(specs)
    ]
    load_before = os.getloadavg()[0]
    busy_before, ours_before, wall_before = system_busy_seconds(), _our_cpu_seconds(server_pids), time.monotonic()
    try:
        for proc in procs:
            proc.start()
        end_by = time.monotonic() + timeout + 180  # + spawn, imports, connections
        for proc in procs:
            proc.join(timeout=max(0.0, end_by - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                print(f"  [peers] killing worker pid {proc.pid} (over its time bound)", flush=True)
                proc.kill()  # SIGKILL to this PID
                proc.join(timeout=10)
    wall = max(1e-9, time.monotonic() - wall_before)
    busy = (system_busy_seconds() - busy_before) / wall
    ours = (_our_cpu_seconds(server_pids) - ours_before) / wall
    results = []
    for spec in specs:
        path = Path(spec.out_path)
        if path.exists():
            results.append(json.loads(path.read_text()))
        else:
            results.append({"index": spec.index, "pid": None, "start": None, "records": [], "error": "no result"})
    out = analyse(peer, p, k, results)
    out["loadavg_1m_before"] = round(load_before, 2)
    out["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    out["busy_cores_during"] = round(busy, 2)
    # What else ran on the machine meanwhile (an external Cassandra counts here too).
    out["other_cores_during"] = round(max(0.0, busy - ours), 2)
    return out


def jain_index(counts: list[int]) -> float:
    """Jain's fairness index: (Σx)² / (n·Σx²); 1 when all equal, 1/n when one has everything."""
    if not counts or not any(counts):
        return math.nan
    return sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts))


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def _mean_or_none(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.fmean(known), 2) if known and len(known) == len(values) else None


def ticket_overtakes(grants: list[Any]) -> dict[str, Any]:
    """How far the grants (in grant order: acquired first; ticket, enqueued-at and looked-at
    last) left ticket order. A grant is *overtaken* by every grant made before it for a later
    ticket; that breaks the FIFO promise only if its queue cell was written before the
    overtaker's grant-deciding look started (``fifo_violations``) — a cell still being written,
    or a ticket taken late by a process waiting for a core, may lose its turn. None where the
    lock has no tickets."""
    if not grants or any(g[8] is None for g in grants):
        return {
            "grants_overtaken": None,
            "overtakers_max": None,
            "overtake_ticket_gap_max_ms": None,
            "fifo_violations": None,
        }
    granted: list[int] = []  # tickets granted so far, sorted
    overtaken = most = violations = 0
    gap_us = 0
    for i, g in enumerate(grants):
        ticket, enqueued_at = g[8], g[9]
        later = len(granted) - bisect.bisect_right(granted, ticket)
        if later:
            overtaken += 1
            most = max(most, later)
            gap_us = max(gap_us, granted[-1] - ticket)
            # Only grants made after our cell was written can have looked after it.
            j = i - 1
            while j >= 0 and enqueued_at is not None and grants[j][0] > enqueued_at:
                h = grants[j]
                if h[8] > ticket and h[10] is not None and h[10] > enqueued_at:
                    violations += 1
                j -= 1
        bisect.insort(granted, ticket)
    return {
        "grants_overtaken": overtaken,
        "overtakers_max": most,
        "overtake_ticket_gap_max_ms": gap_us / 1e3,
        "fifo_violations": violations,
    }


def analyse(peer: Peer, p: int, k: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    starts = [r["start"] for r in results if r["start"] is not None]
    t0 = min(starts) if starts else 0.0
    # (acquired, releasing, released, process, wait, token, acquire counts, release counts, ticket,
    # enqueued at, looked at)
    grants = sorted(
        (
            (rec[1], rec[2], rec[3], r["index"], rec[1] - rec[0], rec[4], rec[5:8], rec[8:11], *rec[11:14])
            for r in results
            for rec in r["records"]
        ),
        key=lambda g: g[0],
    )
    waits = [g[4] for g in grants]

    def longest_run(sequence: list[Any]) -> int:
        longest, current, previous = 0, 0, None
        for g in sequence:
            current = current + 1 if g[3] == previous else 1
            previous = g[3]
            longest = max(longest, current)
        return longest

    # Mutual exclusion across processes on the shared monotonic clock: a grant returned
    # before the previous holder started releasing means two holders at once.
    overlaps = sum(1 for x, y in itertools.pairwise(grants) if y[0] < x[1])
    tokens = [g[5] for g in grants]
    tokens_in_order = None if any(t is None for t in tokens) else all(a < b for a, b in itertools.pairwise(tokens))

    finish_times = [max(rec[1] for rec in r["records"]) for r in results if r["records"]]
    window_end = min(finish_times) if len(finish_times) == p else math.inf
    contended = [g for g in grants if g[0] <= window_end]
    per_process = [sum(1 for g in contended if g[3] == i) for i in range(p)]
    # Runs count while all P contend: after the first process finished its K, the last ones
    # left take the lock in runs however fair the lock is.
    longest = longest_run(contended)
    overtaken = ticket_overtakes(contended)
    release_ms = [(g[2] - g[1]) * 1e3 for g in grants]
    span = (max(g[2] for g in grants) - t0) if grants else 0.0

    acquire_ops = [g[6][0] for g in grants]
    release_ops = [g[7][0] for g in grants]
    out: dict[str, Any] = {
        "peer": peer.key,
        "label": peer.label,
        "processes": p,
        "k": k,
        "acquisitions": len(grants),
        "complete": len(grants) == p * k and not any(r["error"] for r in results),
        "errors": [r["error"] for r in results if r["error"]],
        "span_s": round(span, 3),
        "acquisitions_per_s": round(len(grants) / span, 1) if span > 0 else None,
        "wait_mean_ms": _ms(statistics.fmean(waits)) if waits else None,
        "wait_p50_ms": _ms(percentile(waits, 50)) if waits else None,
        "wait_p99_ms": _ms(percentile(waits, 99)) if waits else None,
        "wait_max_ms": _ms(max(waits)) if waits else None,
        "longest_run": longest,
        "longest_run_whole_point": longest_run(grants),
        "release_p50_ms": round(percentile(release_ms, 50), 3) if release_ms else None,
        "release_p99_ms": round(percentile(release_ms, 99), 3) if release_ms else None,
        "grants_per_process_while_all_contend": per_process,
        "jain_index": round(jain_index(per_process), 3) if grants else None,
        "overlapping_holds": overlaps,
        "tokens_in_grant_order": tokens_in_order,
        **overtaken,
        "client_ops_acquire_mean": _mean_or_none(acquire_ops),
        "client_ops_acquire_max": max(acquire_ops) if acquire_ops and None not in acquire_ops else None,
        "client_ops_release_mean": _mean_or_none(release_ops),
        "round_trips_acquire_mean": _mean_or_none([g[6][1] for g in grants]),
        "round_trips_release_mean": _mean_or_none([g[7][1] for g in grants]),
        "lwt_rounds_acquire_mean": _mean_or_none([g[6][2] for g in grants]),
        "lwt_rounds_release_mean": _mean_or_none([g[7][2] for g in grants]),
        "worker_stats": [r.get("stats", {}) for r in results],
        # Raw: per grant in grant order — process, ms since the barrier when acquire was
        # invoked, wait ms, and the counts (acquire ops/round trips/LWT, release the same).
        # The time release took, ms, then the ticket's global µs (chronolock's queue; else null).
        "grants": [
            [g[3], round((g[0] - g[4] - t0) * 1e3, 3), round(g[4] * 1e3, 3), *g[6], *g[7], round(rel, 3), *g[8:11]]
            for g, rel in zip(grants, release_ms, strict=True)
        ],
    }
    print(
        f"  [peers] {peer.key:<26} P={p} K={k}: {len(grants)} grants in {span:.1f} s, wait mean "
        f"{out['wait_mean_ms']} p99 {out['wait_p99_ms']} max {out['wait_max_ms']} ms, "
        f"{out['acquisitions_per_s']} acq/s, longest run {longest}, Jain {out['jain_index']}, overlaps {overlaps}"
        + (f", errors {out['errors']}" if out["errors"] else ""),
        flush=True,
    )
    return out


# --------------------------------------------------------------------------------------
# Output: JSON, Markdown, one plot.
# --------------------------------------------------------------------------------------


def _overtaken_cell(r: dict[str, Any]) -> str:
    if r.get("grants_overtaken") is None:
        return "–"
    if r["grants_overtaken"] == 0:
        return "0"
    return (
        f"{r['grants_overtaken']} (≤ {r['overtakers_max']}, ≤ {_fmt(r['overtake_ticket_gap_max_ms'])} ms; "
        f"FIFO violations {r['fifo_violations']})"
    )


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def _ops_cell(r: dict[str, Any]) -> str:
    if r.get("client_ops_acquire_mean") is not None:
        release = r.get("client_ops_release_mean")
        return f"{_fmt(r['client_ops_acquire_mean'])} + {_fmt(release)}"
    if r.get("server_ops_per_acquisition") is not None:
        return f"{_fmt(r['server_ops_per_acquisition'])} (server)"
    return "–"


def _rt_cell(r: dict[str, Any]) -> str:
    if r.get("round_trips_acquire_mean") is None:
        return "–"
    lwt = r.get("lwt_rounds_acquire_mean")
    text = f"{_fmt(r['round_trips_acquire_mean'])} + {_fmt(r.get('round_trips_release_mean'))}"
    if lwt is not None:
        text += f" ({_fmt(lwt)} + {_fmt(r.get('lwt_rounds_release_mean'))} LWT)"
    return text


def markdown(data: dict[str, Any]) -> str:
    cfg = data["config"]
    points = {(r["peer"], r["processes"]): r for r in data["points"]}
    ps = cfg["processes"]
    machine = data["machine"]

    def mean_max(peer: Peer, p: int) -> str:
        r = points.get((peer.key, p))
        if r is None:
            return "–"
        mark = "" if r["complete"] else " (incomplete)"
        return f"{_fmt(r['wait_mean_ms'])} / {_fmt(r['wait_max_ms'])}{mark}"

    def p5(peer: Peer, key: str) -> str:
        r = points.get((peer.key, max(ps)))
        return "–" if r is None else _fmt(r[key])

    summary_rows = []
    detail_rows = []
    skipped = []
    for peer in PEERS:
        if peer.key in data["skipped"]:
            skipped.append(peer)
            summary_rows.append([peer.label, f"skipped: {data['skipped'][peer.key]}", "", "", "", ""])
            continue
        if not any((peer.key, p) in points for p in ps):
            continue
        summary_rows.append(
            [
                peer.label,
                *(mean_max(peer, p) for p in ps),
                p5(peer, "acquisitions_per_s"),
                p5(peer, "longest_run"),
                p5(peer, "jain_index"),
            ]
        )
        for p in ps:
            r = points.get((peer.key, p))
            if r is None:
                continue
            detail_rows.append(
                [
                    peer.label,
                    p,
                    r["k"],
                    f"{r['acquisitions']}{'' if r['complete'] else ' (incomplete)'}",
                    _fmt(r["wait_mean_ms"]),
                    _fmt(r["wait_p50_ms"]),
                    _fmt(r["wait_p99_ms"]),
                    _fmt(r["wait_max_ms"]),
                    _fmt(r["acquisitions_per_s"]),
                    r["longest_run"],
                    _overtaken_cell(r),
                    _fmt(r["jain_index"]),
                    _ops_cell(r),
                    _rt_cell(r),
                    r["overlapping_holds"],
                    _fmt(r["release_p50_ms"]),
                    _fmt(r["other_cores_during"], 2),
                ]
            )
    p_headers = [f"P = {p}: mean / max wait ms" for p in ps]
    ran_on_cassandra = any(PEERS_BY_KEY[r["peer"]].cassandra for r in data["points"])
    on_cassandra = f" (on Cassandra K = {min(cfg['k'], cfg['cassandra_k'])})" if ran_on_cassandra else ""
    thesis_columns: list[tuple[str, Callable[[int], str]]] = [
        ("thesis queue", lambda p: f"{THESIS_MEAN_MS[p]['queue']} / {THESIS_MAX_MS[p]['queue']:,}"),
        ("thesis backoff", lambda p: f"{THESIS_MEAN_MS[p]['backoff']} / {THESIS_MAX_MS[p]['backoff']:,}"),
    ]
    for key, label in (
        ("chronolock-cassandra-wake", "chronolock queue, Cassandra 4.x, wake-ups on"),
        ("chronolock-cassandra-poll", "same, polling"),
        ("chronolock-wake", "chronolock queue, embedded, wake-ups on"),
        ("chronolock-poll", "same, polling"),
        ("chronolock-backoff", "chronolock backoff, embedded"),
    ):
        if any((key, p) in points for p in ps):
            thesis_columns.append((label, lambda p, key=key: mean_max(PEERS_BY_KEY[key], p)))
    thesis_rows = [[p, *(column(p) for _, column in thesis_columns)] for p in ps if p in THESIS_MEAN_MS]
    parts = [
        f"### The thesis experiment, side by side: P processes × K acquisitions of one lock, hold "
        f"{cfg['hold_s'] * 1e3:g} ms",
        "",
        f"K = {cfg['k']} per process{on_cassandra}; "
        f"all P = {min(ps)} points first, then all P = {max(ps)} points, in one run "
        f"({data['when_utc']}, {data['elapsed_s']:.0f} s). Every server on 127.0.0.1 on this machine.",
        "",
        markdown_table(
            ["lock", *p_headers, f"P = {max(ps)} acq/s", f"P = {max(ps)} longest run", f"P = {max(ps)} Jain index"],
            summary_rows,
        ),
        "",
        "Details: wait = time inside acquire; acq/s over the whole span; longest run = most consecutive "
        "grants to one process while all P contend (a fair FIFO lock: 1); overtaken = chronolock's queue: "
        "grants made after a grant for a later ticket, while all P contend (most overtakers of one grant, "
        "largest ticket gap; FIFO violations = overtakes by a grant whose deciding look started after "
        "the overtaken cell was written, must be 0), so a run of one process is told from a process "
        "that took its ticket late; "
        "Jain index over grants per "
        "process while all contend (1 = equal); "
        "ops/acq = acquire + release operations counted by the client (chronolock: store operations; "
        "PostgreSQL, naive Cassandra: statements), or by the server for all clients together "
        "(Redis commands, ZooKeeper packets received, etcd MVCC put+range+txn+delete); round trips = "
        "sequential store round trips on the caller's path, acquire + release (LWT = Paxos rounds); "
        "overlaps = grants before the previous holder released (must be 0); other CPU = cores busy with "
        "processes other than this benchmark, its workers and the servers it started (an external "
        "Cassandra counts here), averaged over the point.",
        "",
        markdown_table(
            [
                "lock",
                "P",
                "K",
                "grants",
                "mean ms",
                "p50 ms",
                "p99 ms",
                "max ms",
                "acq/s",
                "longest run",
                "overtaken",
                "Jain",
                "ops/acq",
                "round trips",
                "overlaps",
                "release p50 ms",
                "other CPU",
            ],
            detail_rows,
        ),
        "",
        "The thesis' numbers beside ours, mean / max wait ms (thesis §6: K = 5000, a 3-node Cassandra 1.2 "
        "cluster without LWT, 3 timesvc replicas; its backoff sleeps 10× longer than ours):",
        "",
        markdown_table(["P", *(label for label, _ in thesis_columns)], thesis_rows),
        "",
        "Versions: " + ", ".join(f"{name} {version}" for name, version in sorted(data["versions"].items())) + ".",
        "",
        f"Machine: {machine['cpus']} cores, {machine.get('ram_gib', '?')} GiB RAM, {machine.get('os', '?')}, "
        f"Python {machine['python']}; load average {machine['loadavg_1m_at_start']} at start, "
        f"{data['loadavg_1m_at_end']} at the end. Wait distributions: `peers-waits.png`.",
    ]
    errors = [
        f"{r['peer']} P={r['processes']}: "
        + "; ".join(
            f"{e} (×{r['errors'].count(e)})" if r["errors"].count(e) > 1 else e for e in dict.fromkeys(r["errors"])
        )
        for r in data["points"]
        if r["errors"]
    ]
    if errors:
        parts += ["", "Errors: " + " — ".join(errors)]
    return "\n".join(parts)


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ps = data["config"]["processes"]
    fig, axes = plt.subplots(1, len(ps), figsize=(6.5 * len(ps), 5.2), dpi=110, sharey=True)
    axes = list(axes) if len(ps) > 1 else [axes]
    colours = plt.get_cmap("tab10").colors
    for ax, p in zip(axes, ps, strict=True):
        for i, peer in enumerate(PEERS):
            r = next((r for r in data["points"] if r["peer"] == peer.key and r["processes"] == p), None)
            if r is None or not r["grants"]:
                continue
            waits = sorted(max(g[2], 1e-3) for g in r["grants"])
            n = len(waits)
            ax.step(
                waits,
                [(j + 1) / n for j in range(n)],
                where="post",
                color=colours[i % len(colours)],
                linestyle="-" if peer.kind == "chronolock" else "--",
                linewidth=1.4,
                label=peer.label,
            )
        ax.set_xscale("log")
        ax.set_xlabel("wait per acquisition, ms (log)")
        cfg = data["config"]
        on_cassandra = (
            f" (Cassandra rows {min(cfg['k'], cfg['cassandra_k'])})"
            if any(PEERS_BY_KEY[r["peer"]].cassandra for r in data["points"])
            else ""
        )
        ax.set_title(f"P = {p}, K = {cfg['k']} per process{on_cassandra}", fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
    axes[0].set_ylabel("fraction of acquisitions waiting ≤ x (ECDF)")
    handles, labels = axes[-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle("Wait-time distributions, same experiment, one run (solid: chronolock; dashed: peers)", fontsize=11)
    fig.tight_layout(rect=(0, 0.17, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def _machine() -> dict[str, Any]:
    info = machine_info()
    with contextlib.suppress(OSError):
        meminfo = Path("/proc/meminfo").read_text()
        match = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
        if match:
            info["ram_gib"] = round(int(match.group(1)) / 2**20, 1)
    with contextlib.suppress(OSError):
        match = re.search(r'^PRETTY_NAME="?([^"\n]+)', Path("/etc/os-release").read_text(), re.MULTILINE)
        if match:
            info["os"] = match.group(1)
    with contextlib.suppress(OSError):
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        if match:
            info["cpu_model"] = match.group(1).strip()
    return info


def run(*, quick: bool = False, k: int | None = None, only: tuple[str, ...] = ()) -> dict[str, Any]:
    unknown = [key for key in only if key not in PEER_KEYS]
    if unknown:
        raise SystemExit(f"unknown peers {unknown}; choose from {', '.join(PEER_KEYS)}")
    cfg = PeersConfig.quick(k, only) if quick else PeersConfig(k=k or PeersConfig.k, only=only)
    selected = [peer for peer in PEERS if not only or peer.key in only]
    data: dict[str, Any] = {
        "benchmark": "peers",
        "quick": quick,
        "config": asdict(cfg),
        "machine": _machine(),
        "when_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "points": [],
        "skipped": {},
    }
    print(f"[peers] {'quick' if quick else 'full'} run: {cfg}", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="chronolock-bench-peers-") as tmp:
        workdir = Path(tmp)
        needed = list(dict.fromkeys(peer.server for peer in selected))
        with servers(workdir, needed) as s:
            data["versions"] = s.versions
            runnable = []
            for peer in selected:
                if peer.server in s.skipped:
                    data["skipped"][peer.key] = s.skipped[peer.server]
                else:
                    runnable.append(peer)
            # Every P = 1 point first, then every P = 5 point: the contended points of all
            # locks are measured close together, under the same background load.
            for p in cfg.processes:
                for peer in runnable:
                    read_stat = s.stat_readers.get(peer.server)
                    before = read_stat() if read_stat else None
                    point = _point(cfg, peer, s.params[peer.server], p, workdir, [x.pid for x in s.processes])
                    if read_stat is not None and before is not None and point["acquisitions"]:
                        point["server_ops_per_acquisition"] = round((read_stat() - before) / point["acquisitions"], 2)
                    data["points"].append(point)
    data["elapsed_s"] = round(time.monotonic() - started, 1)
    data["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    if data["points"]:
        plot(data, RESULTS_DIR / "peers-waits.png")
    text = markdown(data)
    (RESULTS_DIR / "peers.json").write_text(json.dumps(data, sort_keys=True) + "\n")
    (RESULTS_DIR / "peers.md").write_text(text.rstrip() + "\n")
    print(text, flush=True)
    print(f"\n(wrote {RESULTS_DIR / 'peers'}.json, .md and peers-waits.png)\n", flush=True)
    return data
