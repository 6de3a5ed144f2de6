"""A real Cassandra 4.1 node configured by the Kubernetes manifests' init script, for TLS and role tests.

``../shared/cassandra-modern/node.sh`` runs a 4.1 install but has no switch for
``client_encryption_options``; this test-only helper starts the same install (``CASS_HOME``)
the same way (its Java 17 flags are copied from node.sh), with a ``cassandra.yaml`` of its
own: node.sh's local settings, then **the init container script of
``k8s/base/cassandra.yaml``** applied to it — so the TLS and authentication configuration
the Kubernetes manifests ship is exactly what this node runs (client-to-node and
node-to-node TLS, mutual, PEM keystore; PasswordAuthenticator, CassandraAuthorizer).

**One limit of this machine**: the only Java here is 17, and Cassandra 4.1 supports Java 8
and 11. On 17 every *login over TLS* fails: ``ServerConnection.certificates()`` calls
``SSLSession.getPeerCertificateChain()``, which Java 15+ no longer implements
("UnsupportedOperationException: This method is deprecated and marked for removal"). The
official ``cassandra:4.1.7`` image runs Java 11, where it works. So a node here runs either
TLS (``tls=True``, authentication switched back off) or authentication (``auth=True``, TLS
off) — never both at once. Also seen only here: native protocol v5 over TLS fails ("tlsv1 alert
internal error"; v4 over TLS works), so TLS URLs from this helper carry ``protocol_version=4``.

Nothing from ``CASS_HOME`` is copied into the repository; without ``CASS_HOME`` (CI) the
tests that use it skip, saying why. Ports are chosen free at start; the node is stopped by
the PID this helper started.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import BinaryIO

import yaml

from tests.support.certs import Authority, Issued

__all__ = ["TlsCassandraNode", "cass_home"]

REPO = Path(__file__).resolve().parents[2]
STATEFULSET = REPO / "k8s" / "base" / "cassandra.yaml"


def cass_home() -> Path | None:
    """The Cassandra 4.x install named by CASS_HOME, if it looks usable."""
    home = os.environ.get("CASS_HOME")
    if not home:
        return None
    path = Path(home)
    if not list(path.glob("lib/apache-cassandra*.jar")) or not (path / "conf" / "cassandra.yaml").exists():
        return None
    return path


def _free_pair() -> int:
    """A port p with p and p+1 both free (storage_port and ssl_storage_port)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port >= 65000:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no two adjacent free ports")


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _k8s_init_script() -> str:
    for doc in yaml.safe_load_all(STATEFULSET.read_text()):
        if doc and doc.get("kind") == "StatefulSet":
            init = next(c for c in doc["spec"]["template"]["spec"]["initContainers"] if c["name"] == "config")
            return str(init["command"][2])
    raise AssertionError("no StatefulSet in k8s/base/cassandra.yaml")


class TlsCassandraNode:
    def __init__(self, workdir: Path, home: Path, *, tls: bool) -> None:
        self.dir = workdir
        self.home = home
        self.tls = tls
        self.auth = not tls  # see the module docstring: not both on Java 17
        self.native_port = _free()
        self.storage_port = _free_pair()
        self.jmx_port = _free()
        self.pki = Authority(workdir / "pki", "node-ca")
        self.node_cert: Issued = self.pki.issue(
            "node", sans=["IP:127.0.0.1", "DNS:cassandra-client.chronolock.svc", "DNS:localhost"]
        )
        self.client_cert: Issued = self.pki.issue("app", sans=["DNS:app.chronolock.test"], client=True)
        self._process: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    # -- configuration --------------------------------------------------------------------

    def _local_yaml(self) -> str:
        """node.sh's settings: one local node on our ports and directories."""
        text = (self.home / "conf" / "cassandra.yaml").read_text()

        def top(key: str, value: str) -> None:
            nonlocal text
            pattern = re.compile(rf"^#? ?{re.escape(key)}:.*$", re.M)
            if pattern.search(text):
                text = pattern.sub(f"{key}: {value}", text, count=1)
            else:
                text += f"\n{key}: {value}\n"

        node = self.dir
        top("cluster_name", "'chronolock-tls-test'")
        top("num_tokens", "1")
        text = re.sub(r"^allocate_tokens_for_local_replication_factor:.*$", "", text, flags=re.M)
        top("initial_token", "0")
        for key in ("hints_directory", "commitlog_directory", "cdc_raw_directory", "saved_caches_directory"):
            top(key, str(node / key.removesuffix("_directory")))
        text = re.sub(
            r"^# ?data_file_directories:\n#? *- .*$",
            f"data_file_directories:\n    - {node}/data",
            text,
            count=1,
            flags=re.M,
        )
        top("listen_address", "127.0.0.1")
        top("rpc_address", "127.0.0.1")
        top("storage_port", str(self.storage_port))
        top("ssl_storage_port", str(self.storage_port + 1))
        top("native_transport_port", str(self.native_port))
        text = re.sub(r'- seeds: ".*"', f'- seeds: "127.0.0.1:{self.storage_port}"', text, count=1)
        return text

    def _configure(self) -> Path:
        """Run the manifests' init script on the local yaml, with its paths moved here."""
        stock, config, tls = self.dir / "stock", self.dir / "conf", self.dir / "tls"
        for directory in (stock, config, tls):
            directory.mkdir(parents=True, exist_ok=True)
        for item in (self.home / "conf").iterdir():
            if item.is_file():
                (stock / item.name).write_bytes(item.read_bytes())
        (stock / "cassandra.yaml").write_text(self._local_yaml())
        (tls / "tls.crt").write_text(self.node_cert.cert.read_text())
        (tls / "tls.key").write_text(self.node_cert.key.read_text())
        (tls / "ca.crt").write_text(self.pki.cert.read_text())
        script = _k8s_init_script().replace("/etc/cassandra/.", f"{stock}/.")
        script = re.sub(r"(?<![\w/])/config", str(config), script)
        script = re.sub(r"(?<![\w/])/tls/", f"{tls}/", script)
        subprocess.run(
            ["bash", "-ec", script],
            env={"PATH": "/usr/bin:/bin", "CASSANDRA_TLS": "required" if self.tls else "off"},
            check=True,
            capture_output=True,
            timeout=60,
        )
        yaml_path = config / "cassandra.yaml"
        # The manifests mount the config at /etc/cassandra; here it lives in config/.
        text = yaml_path.read_text().replace("/etc/cassandra/tls/", f"{config}/tls/")
        if not self.auth:
            text = text.replace("authenticator: PasswordAuthenticator", "authenticator: AllowAllAuthenticator")
            text = text.replace("authorizer: CassandraAuthorizer", "authorizer: AllowAllAuthorizer")
        yaml_path.write_text(text)
        return config

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = 180) -> None:
        config = self._configure()
        for sub in ("data", "commitlog", "saved_caches", "hints", "cdc_raw", "logs"):
            (self.dir / sub).mkdir(exist_ok=True)
        jamm = next(self.home.glob("lib/jamm-*.jar"))
        classpath = ":".join([str(config), *(str(j) for j in sorted(self.home.glob("lib/*.jar")))])
        # Java 17 flags, as in ../shared/cassandra-modern/node.sh.
        java17 = [
            "--add-exports", "java.base/jdk.internal.misc=ALL-UNNAMED",
            "--add-exports", "java.base/jdk.internal.ref=ALL-UNNAMED",
            "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED",
            "--add-exports", "java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
            "--add-exports", "java.management/com.sun.jmx.remote.security=ALL-UNNAMED",
            "--add-exports", "java.rmi/sun.rmi.registry=ALL-UNNAMED",
            "--add-exports", "java.rmi/sun.rmi.server=ALL-UNNAMED",
            "--add-exports", "java.sql/java.sql=ALL-UNNAMED",
            "--add-exports", "java.base/java.lang.ref=ALL-UNNAMED",
            "--add-exports", "jdk.unsupported/sun.misc=ALL-UNNAMED",
        ]  # fmt: skip
        packages = (
            "java.lang.module jdk.internal.loader jdk.internal.ref jdk.internal.reflect jdk.internal.math "
            "jdk.internal.module jdk.internal.util.jar sun.nio.ch java.io java.lang java.lang.reflect "
            "java.lang.invoke java.lang.ref java.math java.net java.nio java.nio.charset java.util "
            "java.util.concurrent java.util.concurrent.atomic java.util.concurrent.locks java.util.regex "
            "java.text java.time java.security"
        )
        for package in packages.split():
            java17 += ["--add-opens", f"java.base/{package}=ALL-UNNAMED"]
        java17 += ["--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED"]
        jvm = [
            "-Xms768M", "-Xmx768M", "-Xss512k", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=300",
            "-XX:+PerfDisableSharedMem", "-XX:ActiveProcessorCount=2",
            "-Djava.net.preferIPv4Stack=true", "-Djdk.attach.allowAttachSelf=true",
            "-Dio.netty.tryReflectionSetAccessible=true", f"-javaagent:{jamm}",
            f"-Dcassandra.config=file://{config}/cassandra.yaml",
            f"-Dcassandra.logdir={self.dir}/logs", f"-Dcassandra.storagedir={self.dir}",
            f"-Dlogback.configurationFile={self.home}/conf/logback.xml",
            "-Dcassandra-foreground=yes", "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            "-Dcassandra.ring_delay_ms=1000", f"-Dcassandra.jmx.local.port={self.jmx_port}",
            # The default superuser is created 10 s after start unless told otherwise.
            "-Dcassandra.superuser_setup_delay_ms=0",
        ]  # fmt: skip
        log = self._log = (self.dir / "logs" / "stdout.log").open("wb")
        self._process = subprocess.Popen(
            ["java", *java17, *jvm, "-cp", classpath, "org.apache.cassandra.service.CassandraDaemon"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"Cassandra exited during start:\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.native_port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.5)
        else:
            self.stop()
            raise RuntimeError(f"native port {self.native_port} not open after {timeout} s:\n{self.log_tail()}")
        if self.auth:
            self._wait_for_superuser(deadline)

    def _wait_for_superuser(self, deadline: float) -> None:
        """The default superuser exists once a login with it succeeds."""
        from lockclient.errors import ChronolockError
        from lockclient.store.cassandra import connect_cluster

        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                cluster, _, _ = connect_cluster(self.url("system"), username="cassandra", password="cassandra")
                cluster.shutdown()
                return
            except ChronolockError as exc:
                last = exc
                time.sleep(1)
        raise RuntimeError(f"the default superuser never worked: {last}\n{self.log_tail()}")

    def url(self, keyspace: str, *, client_cert: bool = True, extra: str = "") -> str:
        options = ""
        if self.tls:
            options = f"&protocol_version=4&ssl_ca={self.pki.cert}"
            if client_cert:
                options += f"&ssl_cert={self.client_cert.cert}&ssl_key={self.client_cert.key}"
        return f"cassandra://127.0.0.1:{self.native_port}/{keyspace}?timeout=10{options}{extra}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = (self.dir / "logs" / "stdout.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        process, self._process = self._process, None
        try:
            if process is None or process.poll() is not None:
                return
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
