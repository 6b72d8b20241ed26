"""A broker process with its HTTP listener (the schema registry's REST API, /metrics):
what `tidemq server` and `tidemq broker` run. The listener starts once the broker serves
(the registry reads its log through the broker) and stops first.

On a broker with TLS, the listener serves HTTPS with the broker's certificate and the
registry's client dials the cluster with TLS (trusting broker.tls_ca_file). On a broker
that requires logins, every HTTP request needs Basic credentials of a broker user, and the
registry logs in as `registry_login` (http.registry_user, or the bootstrap user); without
one the node runs no listener, and says so."""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path

from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.client.cluster import ClientConfig
from tidemq.http.config import HttpConfig
from tidemq.http.listener import HttpListener
from tidemq.net.tls import client_context

__all__ = ["Node", "listener_tls", "registry_client_config"]

log = logging.getLogger(__name__)


class Node:
    def __init__(
        self,
        broker: Broker,
        http: HttpConfig,
        *,
        bootstrap: str = "",
        registry_login: tuple[str, str] | None = None,
    ) -> None:
        """`bootstrap`: where the registry's client finds the cluster (the name servers);
        empty: this broker (which then serves its own name server). `registry_login`:
        (user, password) the registry logs in with on a broker that requires logins."""
        self.broker = broker
        self._http = http
        self._bootstrap = bootstrap
        self._login = registry_login
        self.listener: HttpListener | None = None

    async def start(self) -> str:
        address = await self.broker.start()
        cfg = self.broker.config
        if self._http.enabled and cfg.auth_enabled and self._login is None:
            log.warning(
                "no HTTP listener (schema registry): the broker requires logins and the "
                "registry has none to log in with (set http.registry_user and "
                "TIDEMQ_REGISTRY_PASSWORD, or broker.bootstrap_user and "
                "TIDEMQ_BOOTSTRAP_PASSWORD; http.port=-1 silences this)"
            )
        elif self._http.enabled:
            self.listener = HttpListener(
                self._bootstrap or address,
                host=self._http.host or cfg.host,
                port=self._http.port,
                metrics=functools.partial(
                    self.broker.metrics, per_queue=self._http.metrics_per_queue
                ),
                client_config=registry_client_config(cfg, self._login),
                login=self.broker.check_password if cfg.auth_enabled else None,
                tls=listener_tls(cfg),
            )
            http_address = await self.listener.start()
            self.broker.set_schema_check(self.listener.registry.unregistered)
            # A line of its own, like "serving on": scripts and tests read the port.
            sys.stderr.write(f"http on {http_address}\n")
            sys.stderr.flush()
        return address

    async def stop(self) -> None:
        try:
            if self.listener is not None:
                self.broker.set_schema_check(None)
                await self.listener.stop()
        finally:
            await self.broker.stop()


def listener_tls(cfg: BrokerConfig) -> tuple[Path, Path] | None:
    """The HTTP listener's certificate and key: the broker's (None: plain HTTP)."""
    if cfg.tls_cert_file is None or cfg.tls_key_file is None:
        return None
    return cfg.tls_cert_file, cfg.tls_key_file


def registry_client_config(cfg: BrokerConfig, login: tuple[str, str] | None) -> ClientConfig | None:
    """How the registry's client reaches the cluster: TLS when the broker's listener
    has it, and the registry's `login` when the broker requires logins."""
    if cfg.tls_cert_file is None and not cfg.auth_enabled:
        return None
    context = None
    if cfg.tls_cert_file is not None:
        context = client_context(
            cfg.tls_ca_file,
            cfg.tls_cert_file,
            cfg.tls_key_file,
            names=("broker.tls_ca_file", "broker.tls_cert_file", "broker.tls_key_file"),
        )
    user, password = login if cfg.auth_enabled and login else (None, None)
    return ClientConfig(ssl_context=context, username=user, password=password)
