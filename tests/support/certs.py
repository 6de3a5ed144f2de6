"""Throw-away X.509 certificates for TLS tests, made with the ``openssl`` command (Debian's).

A test gets a CA and certificates signed by it, valid for two days, with the
subjectAltNames it asks for. Keys are RSA 2048 in PKCS#8 PEM — what Python's ``ssl`` and
Cassandra 4.1's ``PEMBasedSslContextFactory`` both read.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["Authority", "Issued", "openssl"]


def openssl() -> str:
    path = shutil.which("openssl")
    if path is None:
        pytest.fail("openssl is not installed: `make test` installs Debian's openssl package")
    return path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run([openssl(), *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path

    def combined(self) -> Path:
        """Key and certificate in one PEM file (what Cassandra's PEM keystore reads)."""
        path = self.cert.with_suffix(".keystore.pem")
        path.write_text(self.key.read_text() + self.cert.read_text())
        return path


class Authority:
    """A certificate authority in ``directory``."""

    def __init__(self, directory: Path, name: str = "chronolock-test-ca") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.cert = self.dir / f"{name}.pem"
        self.key = self.dir / f"{name}.key"
        _run(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", str(self.key), "-out", str(self.cert),
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=self.dir,
        )  # fmt: skip

    def issue(self, name: str, *, sans: list[str], client: bool = False) -> Issued:
        """A certificate for ``name`` with subjectAltNames like ``IP:127.0.0.1``, ``DNS:node.test``."""
        key = self.dir / f"{name}.key"
        csr = self.dir / f"{name}.csr"
        cert = self.dir / f"{name}.pem"
        ext = self.dir / f"{name}.ext"
        usage = "clientAuth" if client else "serverAuth"
        lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment", f"extendedKeyUsage={usage}"]
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        ext.write_text("\n".join(lines) + "\n")
        _run("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key),
             "-out", str(csr), cwd=self.dir)  # fmt: skip
        _run("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key), "-CAcreateserial",
             "-days", "2", "-out", str(cert), "-extfile", str(ext), cwd=self.dir)  # fmt: skip
        return Issued(cert=cert, key=key)
