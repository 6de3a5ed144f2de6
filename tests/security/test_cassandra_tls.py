"""Issue 16, finding 1: TLS to Cassandra, checked against a local TLS node the driver must refuse.

The node is tests/support/fake_cql.py: a loopback server that speaks enough of the native
protocol to receive a login, optionally inside TLS. What it receives tells whether the
password travelled in clear, and whether the driver accepted its certificate. (The same
options against a real Cassandra 4.1 with client encryption: test_cassandra_tls_real.py.)
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockclient import errors
from lockclient.errors import StoreError
from lockclient.settings import StoreSettings
from lockclient.store import open_store
from tests.support.certs import Authority, Issued
from tests.support.fake_cql import FakeCqlNode, fake_cql_node

# Imported this way so that, run against the code before issue 16, the tests fail on their
# assertions instead of at import.
StoreAccessDenied: type[Exception] = getattr(errors, "StoreAccessDenied", RuntimeError)
PASSWORD = "s3cret-Passw0rd-for-tls-tests"
LOGIN = f"\0app\0{PASSWORD}".encode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("pki")
    trusted = Authority(root / "trusted", "trusted-ca")
    other = Authority(root / "other", "other-ca")
    return {
        "ca": trusted.cert,
        "other_ca": other.cert,
        "by_ip": trusted.issue("node-ip", sans=["IP:127.0.0.1"]),
        "by_name": trusted.issue("node-name", sans=["DNS:db.chronolock.test"]),
        "client": trusted.issue("client", sans=["DNS:app.chronolock.test"], client=True),
    }


def _server(cert: Issued, *, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert.cert, cert.key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


@pytest.fixture
def tls_node(pki: dict[str, object]) -> Iterator[FakeCqlNode]:
    cert = pki["by_ip"]
    assert isinstance(cert, Issued)
    with fake_cql_node(_server(cert)) as node:
        yield node


def _url(node: FakeCqlNode, options: str) -> str:
    return f"cassandra://app:{PASSWORD}@{node.address}/ks?protocol_version=4&timeout=3&{options}"


def test_ssl_true_never_sends_the_password_in_clear() -> None:
    """A plaintext node (the issue captured the password from one): with ?ssl=true the driver
    opens TLS, so all the node sees is a ClientHello — never the login."""
    with fake_cql_node() as node:
        with pytest.raises(StoreError):
            open_store(_url(node, "ssl=true"))
        assert node.raw and all(first[:2] == b"\x16\x03" for first in node.raw), node.raw
        assert node.logins == []


def test_a_certificate_from_another_ca_is_refused(tls_node: FakeCqlNode, pki: dict[str, object]) -> None:
    with pytest.raises(StoreAccessDenied, match="certificate"):
        open_store(_url(tls_node, f"ssl_ca={pki['other_ca']}"))
    assert tls_node.logins == [] and tls_node.startups == 0
    # The node's thread records the broken handshake when its own side notices, which can
    # come after the client has already given up (seen on a loaded machine): wait, bounded.
    deadline = time.monotonic() + 10
    while not tls_node.handshake_failures and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tls_node.handshake_failures, "the handshake must have been broken off"


def test_the_system_trust_store_does_not_trust_a_private_ca(tls_node: FakeCqlNode) -> None:
    with pytest.raises(StoreAccessDenied):
        open_store(_url(tls_node, "ssl=true"))
    assert tls_node.logins == []


def test_the_name_is_verified_by_default(pki: dict[str, object]) -> None:
    """The certificate chains to the trusted CA but names db.chronolock.test, not 127.0.0.1."""
    cert = pki["by_name"]
    assert isinstance(cert, Issued)
    with fake_cql_node(_server(cert)) as node:
        with pytest.raises(StoreAccessDenied):
            open_store(_url(node, f"ssl_ca={pki['ca']}"))
        assert node.logins == []
        # ssl_hostname: every node's certificate must carry that name — this one does. The login
        # then reaches the node inside TLS (and is refused by it: the fake node refuses everyone).
        with pytest.raises(StoreAccessDenied, match="rejected the credentials"):
            open_store(_url(node, f"ssl_ca={pki['ca']}&ssl_hostname=db.chronolock.test"))
        assert node.logins == [LOGIN]
        # ssl_verify=ca checks the chain only (weaker; documented).
        with pytest.raises(StoreAccessDenied, match="rejected the credentials"):
            open_store(_url(node, f"ssl_ca={pki['ca']}&ssl_verify=ca"))
        assert len(node.logins) == 2


def test_a_trusted_certificate_for_the_address_carries_the_login(tls_node: FakeCqlNode, pki: dict[str, object]) -> None:
    with pytest.raises(StoreAccessDenied, match="rejected the credentials"):
        open_store(_url(tls_node, f"ssl_ca={pki['ca']}"))
    assert tls_node.logins == [LOGIN]
    assert all(first[:2] == b"\x16\x03" for first in tls_node.raw)


def test_mutual_tls_presents_the_client_certificate(pki: dict[str, object]) -> None:
    cert, client, ca = pki["by_ip"], pki["client"], pki["ca"]
    assert isinstance(cert, Issued) and isinstance(client, Issued) and isinstance(ca, Path)
    with fake_cql_node(_server(cert, client_ca=ca)) as node:
        with pytest.raises(StoreError):
            open_store(_url(node, f"ssl_ca={ca}"))  # no client certificate: the node refuses
        assert node.logins == []
        with pytest.raises(StoreAccessDenied, match="rejected the credentials"):
            open_store(_url(node, f"ssl_ca={ca}&ssl_cert={client.cert}&ssl_key={client.key}"))
        assert node.logins == [LOGIN]


def test_tls_settings_from_the_environment(
    pki: dict[str, object], monkeypatch: pytest.MonkeyPatch, tls_node: FakeCqlNode
) -> None:
    """CHRONOLOCK_CASSANDRA_SSL_* do what the URL options do; the URL's own options win."""
    monkeypatch.setenv("CHRONOLOCK_STORE_URL", f"cassandra://{tls_node.address}/ks?protocol_version=4&timeout=3")
    monkeypatch.setenv("CHRONOLOCK_CASSANDRA_USERNAME", "app")
    monkeypatch.setenv("CHRONOLOCK_CASSANDRA_PASSWORD", PASSWORD)
    monkeypatch.setenv("CHRONOLOCK_CASSANDRA_SSL_CA", str(pki["other_ca"]))
    with pytest.raises(StoreAccessDenied, match="certificate"):
        StoreSettings().open_store()
    monkeypatch.setenv("CHRONOLOCK_CASSANDRA_SSL_CA", str(pki["ca"]))
    with pytest.raises(StoreAccessDenied, match="rejected the credentials"):
        StoreSettings().open_store()
    assert tls_node.logins == [LOGIN]


def test_bad_tls_files_are_configuration_errors(tmp_path: Path, pki: dict[str, object]) -> None:
    from lockclient.errors import ConfigurationError

    with fake_cql_node() as node:
        with pytest.raises(ConfigurationError, match="ssl_ca"):
            open_store(_url(node, f"ssl_ca={tmp_path / 'missing.pem'}"))
        client = pki["client"]
        assert isinstance(client, Issued)
        with pytest.raises(ConfigurationError, match="ssl_cert"):
            open_store(_url(node, f"ssl_ca={pki['ca']}&ssl_cert={client.key}"))  # a key is not a certificate
        assert node.raw == [], "nothing may be sent before the TLS settings are known to be usable"
