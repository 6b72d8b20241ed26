"""The HTTP listener of a tidemq process: uvicorn serving a Starlette app in the
process's own event loop, beside the broker (its requests are small, and the registry's
and the console's work is a few client calls: no thread or process of its own). It
serves the schema registry, `/metrics`, and the web console (`/ui/`, `/api/...`).

uvicorn's `Server.serve` would install its own SIGINT/SIGTERM handlers; the CLI owns
those, so the listener drives uvicorn's startup, main loop and shutdown itself.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from tidemq.client.cluster import ClientConfig
from tidemq.http.console_api import console_routes
from tidemq.http.console_clients import ConsoleClients
from tidemq.http.login import BasicAuth, CheckPassword
from tidemq.http.metrics_api import Snapshot, metrics_routes
from tidemq.http.registry_api import registry_routes
from tidemq.http.registry_service import RegistryService

__all__ = ["HttpListener"]

log = logging.getLogger(__name__)


class HttpListener:
    def __init__(
        self,
        bootstrap: str,
        *,
        host: str = "127.0.0.1",
        port: int = 8085,
        client_config: ClientConfig | None = None,
        metrics: Callable[[], Snapshot] | None = None,
        login: CheckPassword | None = None,
        tls: tuple[Path, Path] | None = None,
        lazy_registry: bool = False,
    ) -> None:
        """`metrics`: the broker's snapshot for `/metrics` (None: no such path).
        `client_config`: how the registry reaches the cluster (TLS, its login).
        `login`: every request needs HTTP Basic credentials this accepts (`login.py`).
        `tls`: (certificate, key) PEM files: HTTPS. `lazy_registry`: listen without
        reading the registry first; it opens at its first request (a replica group
        member serves `/metrics` while its group has no leader)."""
        self._lazy_registry = lazy_registry
        self.registry = RegistryService(bootstrap, client_config=client_config)
        self._console = ConsoleClients(
            bootstrap, self.registry, client_config=client_config, per_user=login is not None
        )
        routes: list[BaseRoute] = list(registry_routes(self.registry))
        if metrics is not None:
            routes += metrics_routes(metrics)
        routes += console_routes(self._console.for_request, bootstrap)
        self.app = Starlette(routes=routes)
        served: Any = self.app if login is None else BasicAuth(self.app, login)
        cert, key = tls if tls is not None else (None, None)
        self._config = uvicorn.Config(
            served,
            host=host,
            port=port,
            ssl_certfile=cert,
            ssl_keyfile=key,
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="none",
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(self._config)
        self._task: asyncio.Task[None] | None = None
        self.address = ""

    async def start(self) -> str:
        """Read the registry (unless lazy), then listen; returns host:port."""
        try:
            if not self._lazy_registry:
                await self.registry.start()
        except BaseException:
            await self.registry.close()
            raise
        try:
            # Bound here, not by uvicorn: on a taken port uvicorn calls sys.exit.
            sock = socket.create_server((self._config.host, self._config.port))
        except OSError as exc:
            await self.registry.close()
            raise OSError(
                f"the HTTP listener cannot bind {self._config.host}:{self._config.port} "
                f"({exc.strerror}); another tidemq server or broker on this machine? Pass "
                "--http-port N (0: any free port, -1: no HTTP listener)"
            ) from None
        self._config.load()
        self._server.lifespan = self._config.lifespan_class(self._config)
        await self._server.startup(sockets=[sock])
        host, port = sock.getsockname()[:2]
        self.address = f"{host}:{port}"
        self._task = asyncio.get_running_loop().create_task(self._server.main_loop())
        log.info("HTTP (schema registry, metrics, console at /ui/) on %s", self.address)
        return self.address

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            # asyncio.wait: the caller's own cancellation still propagates (see net.tasks).
            await asyncio.wait([self._task])
            if not self._task.cancelled():
                self._task.result()  # what the server's loop raised, if anything
            await self._server.shutdown()
        await self._console.close()
        await self.registry.close()
