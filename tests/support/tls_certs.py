"""A throwaway CA with a server and a client certificate, made with the `openssl` command
line (tests that need TLS skip when it is missing)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Certs", "make_certs"]


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _issue(directory: Path, name: str, subject: str, extensions: str) -> None:
    """A P-256 key and a certificate for it signed by ca.crt, valid for a day."""
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
        cwd=directory,
    )  # fmt: skip


def make_certs(d: Path) -> Certs:
    """In directory `d`: the CA, a server certificate for 127.0.0.1 and localhost, and a
    client certificate."""
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=tidemq test CA",
        cwd=d,
    )  # fmt: skip
    _issue(
        d,
        "server",
        "/CN=localhost",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    _issue(d, "client", "/CN=test-client", "extendedKeyUsage=clientAuth\n")
    return Certs(
        d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key"
    )
