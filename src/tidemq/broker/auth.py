"""SCRAM-SHA-256 authentication of the broker's connections, and its user store.

On only with `broker.auth_enabled` (docs/design/security.md draws the exchange). A
connection then starts unauthenticated (`ServerConnection.principal` is None, its frames
limited to 64 KiB by the server) and may send only:

* SASL_HANDSHAKE: the mechanisms offered (SCRAM-SHA-256 alone);
* SASL_AUTHENTICATE, twice: client-first -> server-first, client-final -> server-final,
  driven through `tidemq.core.scram.ScramServer`. On success the connection's principal is
  `User:<name>`.

Anything else before that is answered with AuthenticationFailed and the connection is
closed (the server closes after any AuthenticationFailed answer). A failed exchange is
answered after `AUTH_FAILURE_DELAY_S`, with the same message for an unknown user and a
wrong password.

Users live in the broker's metadata (salt, iterations, StoredKey, ServerKey; never a
password) and in memory here. USER_UPSERT / USER_DELETE / USER_LIST manage them; with
authentication on, only the super users (`broker.super_users`, and
`broker.bootstrap_user`) may call them. Deleting a user does not close the connections it
has open already.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, Final

from tidemq.broker.config import BrokerConfig
from tidemq.broker.store_gateway import StoreGateway
from tidemq.core.clock import Clock
from tidemq.core.errors import (
    AuthorizationFailed,
    ConfigError,
    InvalidRequest,
    Unsupported,
)
from tidemq.core.limits import MAX_USERS
from tidemq.core.scram import (
    DEFAULT_ITERATIONS,
    MAX_USERNAME_BYTES,
    Credentials,
    ScramError,
    make_credentials,
    new_salt,
)
from tidemq.net.login import AUTH_FAILURE_DELAY_S, LoginGate
from tidemq.net.server import ServerConnection
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import (
    Empty,
    UserDeleteRequest,
    UserEntry,
    UserListResponse,
    UserUpsertRequest,
)
from tidemq.protocol.frame import Frame

__all__ = [
    "AUTH_CODES",
    "AUTH_FAILURE_DELAY_S",
    "MOCK_SECRET_KEY",
    "Authenticator",
    "check_user_name",
]

log = logging.getLogger(__name__)

#: service_state key of the secret from which unknown users' fake credentials derive
#: (kept, so that an unknown user's fake salt is as stable as a real one's).
MOCK_SECRET_KEY: Final = "auth.mock_secret"
_MOCK_SECRET_BYTES: Final = 32

_SASL_CODES: Final = frozenset({RequestCode.SASL_HANDSHAKE, RequestCode.SASL_AUTHENTICATE})
#: The requests `Authenticator.after_login` serves.
AUTH_CODES: Final = _SASL_CODES | {
    RequestCode.USER_UPSERT,
    RequestCode.USER_DELETE,
    RequestCode.USER_LIST,
}


def check_user_name(name: str) -> None:
    """InvalidRequest unless `name` may name a user (`*` is reserved: every principal)."""
    if not name or not name.isprintable() or name == "*":
        raise InvalidRequest(f"bad user name {name!r}: printable, not empty, not '*'")
    if len(name.encode()) > MAX_USERNAME_BYTES:
        raise InvalidRequest(f"user name longer than {MAX_USERNAME_BYTES} bytes")


class Authenticator:
    """The broker's users and the login of its connections (one per broker, on the
    loop). `enabled` is broker.auth_enabled; the user requests work either way (users
    may be prepared before authentication is turned on)."""

    def __init__(
        self,
        cfg: BrokerConfig,
        gateway: StoreGateway,
        clock: Clock,
        *,
        cluster_login: Callable[[bytes], str] | None = None,
    ) -> None:
        """`cluster_login`: checks another broker's login with the cluster secret and
        returns its principal (`Broker:<name>`); None: brokers cannot log in here."""
        self.enabled = cfg.auth_enabled
        self._gateway = gateway
        self._super = frozenset(f"User:{u}" for u in (*cfg.super_users, cfg.bootstrap_user) if u)
        store = gateway.store
        self._users: dict[str, Credentials] = {
            name: Credentials(salt=s, iterations=i, stored_key=k, server_key=v)
            for name, s, i, k, v in store.metadata.users()
        }
        self._mock_secret = b""
        if self.enabled:  # off: nothing is written (nor read) for authentication
            secret = store.metadata.service_state(MOCK_SECRET_KEY)
            if secret is None or len(secret) < _MOCK_SECRET_BYTES:
                secret = os.urandom(_MOCK_SECRET_BYTES)
                store.metadata.save_service_state({MOCK_SECRET_KEY: secret})
            self._mock_secret = secret
        self._gate = LoginGate(
            self._users.get,
            mock_secret=self._mock_secret,
            clock=clock,
            cluster_login=cluster_login,
        )
        self._login_limit = self._gate.limit
        #: The users' and ACLs' next version counter, asked before each change (the
        #: broker's SecuritySync, ADR 15); None: the change carries no counter.
        self.next_counter: Callable[[], int | None] = lambda: None
        #: Called after each change of the users, with the counter it carried.
        self.on_change: Callable[[int | None], None] = lambda _: None
        #: Awaited before a change request is answered: returns once the tables are
        #: confirmed by a majority of the name servers (SecuritySync.confirm, ADR 26).
        self.confirm: Callable[[], Awaitable[None]] = _nothing_to_confirm

    @property
    def super_users(self) -> frozenset[str]:
        """The principals (`User:<name>`) of broker.super_users and the bootstrap user."""
        return self._super

    def bootstrap(self, user: str | None, password: str | None) -> None:
        """At start: with authentication on and no user yet, create `user` (a super
        user) with `password`."""
        if not self.enabled:
            return
        if self._users:
            return
        if user is None:
            log.warning(
                "broker.auth_enabled is set and there are no users: no client can log in "
                "(set broker.bootstrap_user and TIDEMQ_BOOTSTRAP_PASSWORD)"
            )
            return
        if not password:
            raise ConfigError(
                f"broker.bootstrap_user={user}: the user table is empty and "
                "TIDEMQ_BOOTSTRAP_PASSWORD is not set"
            )
        try:
            check_user_name(user)
        except InvalidRequest as exc:
            raise ConfigError(f"broker.bootstrap_user: {exc}") from None
        try:
            credentials = make_credentials(password, new_salt(os.urandom), DEFAULT_ITERATIONS)
        except ScramError as exc:
            raise ConfigError(f"TIDEMQ_BOOTSTRAP_PASSWORD: {exc}") from None
        self._store(user, credentials)
        log.info("created the bootstrap user %s (a super user)", user)

    def _store(self, name: str, c: Credentials, counter: int | None = None) -> None:
        self._gateway.store.metadata.upsert_user(
            name, c.salt, c.iterations, c.stored_key, c.server_key, counter=counter
        )
        self._users[name] = c

    def rows(self) -> list[tuple[str, Credentials]]:
        """Every user and its credentials, by name."""
        return sorted(self._users.items())

    def replace_users(self, users: dict[str, Credentials]) -> None:
        """Take another version of the users (written to the store by the caller)."""
        self._users.clear()  # in place: the login gate looks users up through this dict
        self._users.update(users)

    # ------------------------------------------------------------------ login

    async def before_login(self, frame: Frame, conn: ServerConnection) -> Any:
        """The answer to a request on a connection not yet authenticated."""
        return await self._gate.before_login(frame, conn)

    async def check_password(self, user: str, password: str, host: str) -> bool:
        """A login that does not speak SCRAM (the HTTP listener's Basic authentication,
        over TLS): whether `password` is `user`'s. The password is salted and iterated
        as SCRAM does, off the loop, and compared with the stored key; failures count
        against `host` like failed SCRAM logins, and are answered after the same delay."""
        if self._login_limit.refused_for_s(host) is not None:
            return False
        credentials = self._users.get(user)
        if credentials is not None:
            try:
                candidate = await asyncio.to_thread(
                    make_credentials, password, credentials.salt, credentials.iterations
                )
            except ScramError:
                candidate = None
            if candidate is not None and hmac.compare_digest(
                candidate.stored_key, credentials.stored_key
            ):
                return True
        self._login_limit.failed(host)
        log.info("HTTP login of %r from %s failed", user, host)
        await asyncio.sleep(AUTH_FAILURE_DELAY_S)
        return False

    # ------------------------------------------------------------------ users

    async def after_login(self, code: RequestCode, header: Any, conn: ServerConnection) -> Any:
        """An AUTH_CODES request on a connection that has logged in (or on any, with
        authentication off): USER_UPSERT, USER_DELETE, USER_LIST (super users only, with
        authentication on); the SASL requests are refused."""
        if code in _SASL_CODES:
            if self.enabled:
                raise InvalidRequest(f"{code.name}: this connection is authenticated already")
            raise Unsupported(
                f"{code.name}: this broker does not authenticate (broker.auth_enabled is off)"
            )
        if self.enabled and conn.principal not in self._super:
            raise AuthorizationFailed(
                f"{conn.principal} may not manage users: only the super users "
                "(broker.super_users) may"
            )
        if code is RequestCode.USER_LIST:
            return UserListResponse(
                users=[UserEntry(name=n, iterations=c.iterations) for n, c in self._users.items()]
            )
        if code is RequestCode.USER_DELETE:
            assert isinstance(header, UserDeleteRequest)
            counter = self.next_counter()  # a deposed writer may not say "no user" either
            if header.name not in self._users:
                await self.confirm()  # "no user" in tables a majority holds
                raise InvalidRequest(f"no user {header.name!r}")
            await self._gateway.call(lambda s: s.metadata.delete_user(header.name, counter=counter))
            del self._users[header.name]
            self.on_change(counter)
            await self.confirm()
            return Empty()
        assert isinstance(header, UserUpsertRequest)
        check_user_name(header.name)
        if header.name not in self._users and len(self._users) >= MAX_USERS:
            raise InvalidRequest(f"at most {MAX_USERS} users in a cluster")
        try:
            credentials = Credentials(
                salt=header.salt,
                iterations=header.iterations,
                stored_key=header.stored_key,
                server_key=header.server_key,
            )
        except ScramError as exc:
            raise InvalidRequest(f"user {header.name!r}: {exc}") from None
        counter = self.next_counter()
        await self._gateway.call(lambda _: self._store(header.name, credentials, counter))
        self.on_change(counter)
        await self.confirm()
        return Empty()


async def _nothing_to_confirm() -> None:
    """No name servers to confirm a change with (a broker without a SecuritySync)."""
