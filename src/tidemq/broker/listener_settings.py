"""The broker's listener settings from its config: the TLS contexts of its client listener
and of its connections to the name servers, and the limits its TCP server enforces."""

from __future__ import annotations

import ssl

from tidemq.broker.config import BrokerConfig
from tidemq.core.errors import ConfigError
from tidemq.net.server import ServerLimits
from tidemq.net.tls import client_context, server_context

__all__ = ["listener_ssl_context", "name_server_ssl_context", "server_limits"]


def listener_ssl_context(cfg: BrokerConfig) -> ssl.SSLContext | None:
    """The listener's TLS context from the broker.tls_* keys (None: plaintext); a
    ConfigError naming the key when a file is missing or unreadable."""
    if cfg.tls_cert_file is None or cfg.tls_key_file is None:
        return None
    return server_context(
        cert_file=cfg.tls_cert_file,
        key_file=cfg.tls_key_file,
        ca_file=cfg.tls_ca_file,
        client_auth=cfg.tls_client_auth,
    )


def name_server_ssl_context(cfg: BrokerConfig) -> ssl.SSLContext | None:
    """TLS for the broker's connections to its name servers (None: plaintext): trusts
    broker.tls_ca_file (else the system's CAs) and presents the broker's own certificate,
    for name servers that ask for one."""
    if not cfg.name_server_tls_on:
        return None
    try:
        return client_context(
            cfg.tls_ca_file,
            cfg.tls_cert_file,
            cfg.tls_key_file,
            names=("broker.tls_ca_file", "broker.tls_cert_file", "broker.tls_key_file"),
        )
    except ConfigError as exc:
        raise ConfigError(f"TLS to the name servers: {exc}") from None


def server_limits(cfg: BrokerConfig) -> ServerLimits:
    """The TCP server's limits from the broker.* keys (per address at most the total)."""
    return ServerLimits(
        max_frame_bytes=cfg.max_frame_bytes,
        max_in_flight=cfg.max_in_flight_requests,
        max_connections=cfg.max_connections,
        max_connections_per_address=min(cfg.max_connections_per_address, cfg.max_connections),
        frame_read_timeout_ms=cfg.frame_read_timeout_ms,
        idle_timeout_ms=cfg.connection_idle_timeout_ms,
        login_timeout_ms=cfg.login_timeout_ms,
        write_stall_timeout_ms=cfg.write_stall_timeout_ms,
        write_buffer_high_bytes=cfg.write_buffer_high_bytes,
        max_response_bytes=cfg.max_response_bytes,
        max_response_bytes_per_connection=cfg.max_response_bytes_per_connection,
        max_response_bytes_per_address=cfg.max_response_bytes_per_address,
        max_inbound_bytes=cfg.max_inbound_bytes,
        requests_per_turn=cfg.requests_per_turn,
    )
