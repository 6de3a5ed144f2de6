"""TLS to Cassandra: an :class:`ssl.SSLContext` built from :class:`~lockclient.store.url.TlsOptions`.

The driver (``cassandra-driver`` 3.x) takes ``Cluster(ssl_context=..., ssl_options=...)``
and wraps every socket with the context. With ``check_hostname`` on, it verifies each
node's certificate against the address it connects to — an **IP address**, because the
driver resolves contact points and discovers the other nodes from ``system.peers``. So:

* ``ssl_verify=full`` (default) without ``ssl_hostname``: every node certificate must
  carry the node's IP address (an IP subjectAltName) — what per-node certificates from,
  say, cert-manager's csi-driver provide;
* ``ssl_verify=full`` with ``ssl_hostname=NAME``: every node certificate must carry
  ``NAME`` (``server_hostname`` for every connection) — a certificate shared by the
  nodes of a StatefulSet, issued for the cluster's Service name;
* ``ssl_verify=ca``: the chain is verified, the name is not (any certificate the CA
  signed is accepted — weaker: anyone holding one can impersonate a node);
* ``ssl_verify=none``: encryption without authentication; only for tests. It is
  logged as a warning every time a store is opened with it.

TLS 1.2 is the minimum. A client certificate (``ssl_cert``, ``ssl_key``) is presented
when the node asks for one (``require_client_auth: true``, mutual TLS).
"""

from __future__ import annotations

import ssl
from typing import Any

from lockclient.errors import ConfigurationError
from lockclient.logs import get_logger
from lockclient.store.url import TlsOptions

__all__ = ["driver_tls_arguments", "ssl_context"]

log = get_logger("lockclient.store")


def ssl_context(tls: TlsOptions) -> ssl.SSLContext:
    """The client-side context for ``tls`` (which must be enabled). Raises ConfigurationError
    when a file cannot be read or does not hold what it should."""
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot load the CA bundle ssl_ca={tls.ca!r}: {exc}") from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.verify == "ca":
        context.check_hostname = False
    elif tls.verify == "none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if tls.cert:
        try:
            context.load_cert_chain(tls.cert, tls.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(
                f"cannot load the client certificate ssl_cert={tls.cert!r}"
                + (f" with ssl_key={tls.key!r}" if tls.key else "")
                + f": {exc}"
            ) from exc
    return context


def driver_tls_arguments(tls: TlsOptions) -> dict[str, Any]:
    """Keyword arguments for ``cassandra.cluster.Cluster``: none when TLS is off."""
    if not tls.enabled:
        return {}
    if tls.verify == "none":
        log.warning("cassandra_tls_unverified", detail="ssl_verify=none: node certificates are not checked")
    arguments: dict[str, Any] = {"ssl_context": ssl_context(tls)}
    if tls.verify == "full" and tls.hostname:
        arguments["ssl_options"] = {"server_hostname": tls.hostname}
    return arguments
