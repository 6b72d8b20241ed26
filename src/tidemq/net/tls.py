"""TLS contexts for the listeners and the clients, built once from files named in config.

Both sides: TLS 1.2 at least (1.3 when both ends have it, which OpenSSL prefers on its
own); reliability.md section 6.1. A server context may ask for client certificates
(`TlsClientAuth`), verified against the CA file; a client context verifies the server's
certificate and host name (against the CA file, or the system's trusted CAs) and may
present a certificate of its own.

Every problem with a file is a ConfigError naming the setting it came from, raised when
the context is built (at start), not at the first connection.
"""

from __future__ import annotations

import enum
import ipaddress
import ssl
from pathlib import Path

from tidemq.core.errors import ConfigError

__all__ = [
    "MIN_TLS_VERSION",
    "TlsClientAuth",
    "client_context",
    "is_loopback",
    "server_context",
]

MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2


class TlsClientAuth(enum.StrEnum):
    """Whether a TLS listener asks its clients for a certificate."""

    #: No client certificate is asked for.
    NONE = "none"
    #: Asked for; one that is sent must be valid (signed by the CA file).
    OPTIONAL = "optional"
    #: A valid client certificate is required: a client without one is refused.
    REQUIRED = "required"


_VERIFY_MODES = {
    TlsClientAuth.NONE: ssl.CERT_NONE,
    TlsClientAuth.OPTIONAL: ssl.CERT_OPTIONAL,
    TlsClientAuth.REQUIRED: ssl.CERT_REQUIRED,
}


def _readable(path: Path, key: str) -> None:
    """A clear error naming `key` when `path` cannot be read (ssl's own is 'No such file')."""
    try:
        with path.open("rb") as fh:
            fh.read(1)
    except FileNotFoundError:
        raise ConfigError(f"{key}: {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{key}: {path} is a directory, not a PEM file") from None
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None


def _load_chain(
    ctx: ssl.SSLContext, cert_file: Path, key_file: Path, keys: tuple[str, str]
) -> None:
    _readable(cert_file, keys[0])
    _readable(key_file, keys[1])
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"{keys[0]} / {keys[1]}: not a PEM certificate and its private key "
            f"({cert_file}, {key_file}): {exc.reason or exc}"
        ) from None


def _load_ca(ctx: ssl.SSLContext, ca_file: Path, key: str) -> None:
    _readable(ca_file, key)
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"{key}: {ca_file} holds no PEM CA certificate: {exc.reason or exc}"
        ) from None


def server_context(
    *,
    cert_file: Path,
    key_file: Path,
    ca_file: Path | None = None,
    client_auth: TlsClientAuth | None = None,
    key_prefix: str = "broker.",
) -> ssl.SSLContext:
    """A listener's context. `client_auth` None: REQUIRED when `ca_file` is given, else
    NONE. Errors name the settings as `<key_prefix>tls_cert_file` and so on."""
    auth = client_auth or (TlsClientAuth.REQUIRED if ca_file is not None else TlsClientAuth.NONE)
    if auth is not TlsClientAuth.NONE and ca_file is None:
        raise ConfigError(
            f"{key_prefix}tls_client_auth={auth.value} needs {key_prefix}tls_ca_file "
            "(the CA that signs the client certificates)"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_TLS_VERSION
    _load_chain(
        ctx, cert_file, key_file, (f"{key_prefix}tls_cert_file", f"{key_prefix}tls_key_file")
    )
    if ca_file is not None:
        _load_ca(ctx, ca_file, f"{key_prefix}tls_ca_file")
    ctx.verify_mode = _VERIFY_MODES[auth]
    return ctx


def client_context(
    ca_file: str | Path | None = None,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
    *,
    check_hostname: bool = True,
    names: tuple[str, str, str] = ("ca_file", "cert_file", "key_file"),
) -> ssl.SSLContext:
    """A client's context: verifies the server's certificate against `ca_file` (None: the
    system's trusted CAs) and, with `check_hostname`, that it names the host dialled (an
    IP address must be in the certificate's subjectAltName). `cert_file` (and `key_file`,
    unless the key is in the same PEM file) is the certificate to present to a listener
    that asks for one. Errors name the files as `names` (the caller's spelling of the
    ca, cert and key settings)."""
    if key_file is not None and cert_file is None:
        raise ConfigError(f"{names[2]} needs {names[1]} (the certificate of that key)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = MIN_TLS_VERSION
    ctx.check_hostname = check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    if ca_file is not None:
        _load_ca(ctx, Path(ca_file), names[0])
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert_file is not None:
        cert = Path(cert_file)
        key = Path(key_file) if key_file is not None else cert
        _load_chain(ctx, cert, key, (names[1], names[2]))
    return ctx


def is_loopback(host: str) -> bool:
    """Whether binding `host` listens only on this machine ("localhost" too; "" and
    "0.0.0.0" are every interface, so no)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
