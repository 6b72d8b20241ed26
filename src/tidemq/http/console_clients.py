"""The clients the web console acts through. On a listener without logins, one admin
client and one producer for every request. On a broker that requires logins, the console
acts as the user who logged in to the listener (HTTP Basic, `login.py`): each user gets
clients logging in to the brokers with that user's own name and password, so the
brokers' ACLs decide what the console may show and do, exactly as for that user's own
`tidemq` commands. Never the listener's own (registry) user: that would let any user
act with its rights.

At most `MAX_CONSOLE_USERS` users' clients are kept; the least recently used are closed
first (a returning user logs in again)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from typing import Final

from starlette.requests import Request

from tidemq.client.admin import AsyncAdmin
from tidemq.client.cluster import ClientConfig
from tidemq.client.producer import AsyncProducer
from tidemq.http.console_data import ConsoleData
from tidemq.http.registry_service import RegistryService

__all__ = ["MAX_CONSOLE_USERS", "ConsoleClients"]

#: Users whose console clients are kept open at once.
MAX_CONSOLE_USERS: Final = 32


class ConsoleClients:
    def __init__(
        self,
        bootstrap: str,
        registry: RegistryService,
        *,
        client_config: ClientConfig | None = None,
        per_user: bool = False,
    ) -> None:
        """`per_user`: the listener checks logins, and the console acts as each user."""
        self._bootstrap = bootstrap
        self._registry = registry
        self._config = client_config
        self._per_user = per_user
        self._open: OrderedDict[bytes, tuple[AsyncAdmin, AsyncProducer, ConsoleData]] = (
            OrderedDict()
        )

    def _make(self, config: ClientConfig | None) -> tuple[AsyncAdmin, AsyncProducer, ConsoleData]:
        admin = AsyncAdmin(self._bootstrap, client_config=config)
        producer = AsyncProducer(self._bootstrap, client_config=config)
        return admin, producer, ConsoleData(admin, producer, self._registry)

    async def for_request(self, request: Request) -> ConsoleData:
        key = b""
        config = self._config
        if self._per_user:
            login = request.scope.get("tidemq.login")
            if login is None:  # BasicAuth always sets it; refuse rather than act as admin
                raise PermissionError("the console needs a login on this listener")
            user, password = login
            key = hashlib.sha256(f"{user}\0{password}".encode()).digest()
            config = dataclasses.replace(
                self._config or ClientConfig(), username=user, password=password
            )
        entry = self._open.get(key)
        if entry is None:
            entry = self._open[key] = self._make(config)
            while len(self._open) > MAX_CONSOLE_USERS:
                _, (admin, producer, _data) = self._open.popitem(last=False)
                await producer.close()
                await admin.close()
        self._open.move_to_end(key)
        return entry[2]

    async def close(self) -> None:
        while self._open:
            _, (admin, producer, _data) = self._open.popitem()
            await producer.close()
            await admin.close()
