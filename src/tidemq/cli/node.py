"""A broker process with its HTTP listener (the schema registry's REST API): what
`tidemq server` and `tidemq broker` run. The listener starts once the broker serves (the
registry reads its log through the broker) and stops first."""

from __future__ import annotations

import logging
import sys

from tidemq.broker.broker import Broker
from tidemq.http.config import HttpConfig
from tidemq.http.listener import HttpListener

__all__ = ["Node"]

log = logging.getLogger(__name__)


class Node:
    def __init__(self, broker: Broker, http: HttpConfig, *, bootstrap: str = "") -> None:
        """`bootstrap`: where the registry's client finds the cluster (the name servers);
        empty: this broker (which then serves its own name server)."""
        self.broker = broker
        self._http = http
        self._bootstrap = bootstrap
        self.listener: HttpListener | None = None

    async def start(self) -> str:
        address = await self.broker.start()
        cfg = self.broker.config
        if self._http.enabled and (cfg.tls_cert_file is not None or cfg.auth_enabled):
            # The registry reads and writes `_schemas` as a client of the broker; giving
            # that client TLS trust and a login is not built yet.
            log.warning(
                "no HTTP listener (schema registry): the broker requires TLS or a login, "
                "and the registry's own client cannot use them yet (http.port=-1 silences "
                "this)"
            )
        elif self._http.enabled:
            host = self._http.host or self.broker.config.host
            self.listener = HttpListener(
                self._bootstrap or address,
                host=host,
                port=self._http.port,
                metrics=self.broker.metrics,
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
