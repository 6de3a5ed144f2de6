"""Issue 16, findings 1 and 4 on real Cassandra 4.1 nodes configured by the Kubernetes manifests'
own init script (tests/support/cassandra_tls_node.py):

* TLS: client encryption required with client certificates (mutual TLS at the handshake) —
  plaintext, an unknown CA, a missing or foreign client certificate and a wrong
  ``ssl_hostname`` are refused; locks work over it; ``lockctl`` takes the
  ``CHRONOLOCK_CASSANDRA_SSL_*`` settings exactly as the ConfigMap sets them;
* roles: ``lockctl roles`` as the default superuser, ``lockctl schema --grant-to`` as the
  schema role, locks as the client role — which can do nothing but SELECT and MODIFY.

On this machine's Java 17 a Cassandra 4.1 login over TLS fails (see the helper's docstring),
so TLS and logins are checked on two nodes: TLS without authentication, authentication
without TLS. Needs a Cassandra 4.x server install at ``CASS_HOME``
(../shared/cassandra-modern/README.md); skips cleanly without one, as on CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockclient import RemoteLocker, StoreAccessDenied, open_store
from lockclient.errors import StoreError
from lockclient.store.cassandra import connect_cluster
from lockclient.store.cassandra_schema import create_roles, create_schema
from tests.support.cassandra_tls_node import TlsCassandraNode, cass_home
from tests.support.certs import Authority

pytestmark = [pytest.mark.cassandra, pytest.mark.slow]

SCHEMA_PASSWORD = "schema-role-password-for-tests"
CLIENT_PASSWORD = "client-role-password-for-tests"
LOCKCTL = str(Path(sys.executable).parent / "lockctl")


def _node(tmp_path_factory: pytest.TempPathFactory, *, tls: bool) -> Iterator[TlsCassandraNode]:
    home = cass_home()
    if home is None:
        pytest.skip("no Cassandra 4.x server install: set CASS_HOME (../shared/cassandra-modern/README.md)")
    node = TlsCassandraNode(tmp_path_factory.mktemp("cassandra-tls" if tls else "cassandra-auth"), home, tls=tls)
    try:
        node.start()
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCassandraNode]:
    yield from _node(tmp_path_factory, tls=True)


@pytest.fixture(scope="module")
def auth_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCassandraNode]:
    yield from _node(tmp_path_factory, tls=False)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_"))}
    env.update(extra)
    return env


def test_the_node_refuses_plaintext_unverified_and_anonymous_clients(
    tls_node: TlsCassandraNode, tmp_path: Path
) -> None:
    plain = f"cassandra://127.0.0.1:{tls_node.native_port}/system?timeout=5&protocol_version=4"
    with pytest.raises(StoreError):
        connect_cluster(plain)  # client encryption is required (optional: false)
    other = Authority(tmp_path / "other", "other-ca")
    with pytest.raises(StoreAccessDenied):
        connect_cluster(plain + f"&ssl_ca={other.cert}")  # we refuse the node's certificate
    with pytest.raises(StoreError):
        connect_cluster(tls_node.url("system", client_cert=False))  # the node refuses: no client certificate
    stranger = other.issue("stranger", sans=["DNS:x"], client=True)
    with pytest.raises(StoreError):
        connect_cluster(plain + f"&ssl_ca={tls_node.pki.cert}&ssl_cert={stranger.cert}&ssl_key={stranger.key}")
    with pytest.raises(StoreAccessDenied):
        connect_cluster(tls_node.url("system", extra="&ssl_hostname=somebody-else.example"))
    # The node's certificate carries the client Service name the manifests put in ssl_hostname.
    cluster, session, _ = connect_cluster(tls_node.url("system", extra="&ssl_hostname=cassandra-client.chronolock.svc"))
    try:
        assert session.execute("SELECT release_version FROM system.local").one()[0].startswith("4.")
    finally:
        cluster.shutdown()


def test_locks_over_mutual_tls_with_the_configmap_settings(tls_node: TlsCassandraNode) -> None:
    url = tls_node.url("chronolock_tls")
    create_schema(url)
    with open_store(url) as store, RemoteLocker(store, lease=5, allow_store_clock=True) as locker:
        first = locker.get_lock("tls:1", timeout=30)
        first.release()
        assert locker.get_lock("tls:1", timeout=30).fencing_token == first.fencing_token + 1
    # lockctl, with TLS from CHRONOLOCK_CASSANDRA_SSL_* (as k8s/base/store.env sets them).
    env = _clean_env(
        CHRONOLOCK_STORE_URL=f"cassandra://127.0.0.1:{tls_node.native_port}/chronolock_tls?timeout=10&protocol_version=4",
        CHRONOLOCK_CASSANDRA_SSL="true",
        CHRONOLOCK_CASSANDRA_SSL_CA=str(tls_node.pki.cert),
        CHRONOLOCK_CASSANDRA_SSL_CERT=str(tls_node.client_cert.cert),
        CHRONOLOCK_CASSANDRA_SSL_KEY=str(tls_node.client_cert.key),
        CHRONOLOCK_CASSANDRA_SSL_HOSTNAME="cassandra-client.chronolock.svc",
        CHRONOLOCK_CASSANDRA_SSL_VERIFY="full",
        CHRONOLOCK_ALLOW_STORE_CLOCK="true",
    )
    done = subprocess.run(
        [LOCKCTL, "run", "tls:job", "--", sys.executable, "-c", "print('ran')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran"
    env["CHRONOLOCK_CASSANDRA_SSL_HOSTNAME"] = "somebody-else.example"
    refused = subprocess.run(
        [LOCKCTL, "status", "tls:job"], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert refused.returncode == 78, refused.stderr  # a certificate that does not verify: configuration


def test_least_privilege_roles(auth_node: TlsCassandraNode) -> None:
    """lockctl roles (as the default superuser), lockctl schema --grant-to (as the schema role), then
    the client role runs locks — and can do nothing else."""
    url = auth_node.url("chronolock_sec")
    ran = create_roles(
        url,
        schema_role="chronolock_schema",
        schema_password=SCHEMA_PASSWORD,
        client_role="chronolock",
        client_password=CLIENT_PASSWORD,
        username="cassandra",
        password="cassandra",
    )
    assert not any(SCHEMA_PASSWORD in s or CLIENT_PASSWORD in s for s in ran)
    create_schema(url, username="chronolock_schema", password=SCHEMA_PASSWORD, grant_to=("chronolock",))
    with (
        open_store(url, username="chronolock", password=CLIENT_PASSWORD) as store,
        RemoteLocker(store, lease=5, allow_store_clock=True) as locker,
    ):
        first = locker.get_lock("roles:1", timeout=30)
        first.release()
        assert locker.get_lock("roles:1", timeout=30).fencing_token == first.fencing_token + 1
    forbidden = {
        "chronolock": (
            "DROP TABLE chronolock_sec.lock_queue",
            # Not here: TRUNCATE. Cassandra's MODIFY (the least that allows writes) includes it —
            # SECURITY.md says so; a client role can wipe lock state, not change the schema.
            "ALTER TABLE chronolock_sec.lock_queue WITH comment = 'x'",
            "CREATE KEYSPACE evil WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
            "CREATE ROLE evil WITH LOGIN = true AND PASSWORD = 'evil-evil-evil-evil'",
            "GRANT ALL PERMISSIONS ON KEYSPACE chronolock_sec TO chronolock",
        ),
        "chronolock_schema": (
            "CREATE ROLE evil WITH LOGIN = true AND PASSWORD = 'evil-evil-evil-evil'",
            "ALTER ROLE chronolock WITH SUPERUSER = true",
        ),
    }
    for role, password in (("chronolock", CLIENT_PASSWORD), ("chronolock_schema", SCHEMA_PASSWORD)):
        cluster, session, _ = connect_cluster(url, username=role, password=password)
        try:
            for statement in forbidden[role]:
                with pytest.raises(Exception, match=r"Unauthorized|permission|superuser"):
                    session.execute(statement)
        finally:
            cluster.shutdown()
    # Running it again only updates the passwords (idempotent), and lockctl says 78 for a wrong one.
    create_roles(
        url,
        schema_role="chronolock_schema",
        schema_password=SCHEMA_PASSWORD,
        client_role="chronolock",
        client_password=CLIENT_PASSWORD,
        username="cassandra",
        password="cassandra",
    )
    refused = subprocess.run(
        [LOCKCTL, "status", "roles:1"],
        env=_clean_env(
            CHRONOLOCK_STORE_URL=url,
            CHRONOLOCK_CASSANDRA_USERNAME="chronolock",
            CHRONOLOCK_CASSANDRA_PASSWORD="not-the-password-of-this-role",
        ),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert refused.returncode == 78, refused.stderr
    assert "not-the-password-of-this-role" not in refused.stderr
