"""A broker's side of cluster-wide users and ACL entries on its name-server connections
(ADR 15): log in with the cluster secret, then after each registration answer push the
broker's tables (the name server asked) or pull the name server's (they are newer).

The broker's tables are behind `SecurityTables` (the broker layer implements it), so this
module needs neither the store nor the broker.
"""

from __future__ import annotations

import logging
from typing import Protocol

import msgspec

from tidemq.cluster.membership import sign, verify
from tidemq.core.clock import Clock
from tidemq.core.errors import AuthenticationFailed, InvalidRequest, Unsupported, WriterFenced
from tidemq.net.client import ClientConnection
from tidemq.protocol.commands import (
    RegisterBrokerResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from tidemq.protocol.security_messages import (
    CLUSTER_MECHANISM,
    ClusterLogin,
    SecurityPullRequest,
    SecurityPushRequest,
    SecurityPushResponse,
    SecuritySnapshot,
    counter_text,
)

__all__ = [
    "BROKER_PRINCIPAL_PREFIX",
    "SecurityTables",
    "check_cluster_login",
    "cluster_login",
    "confirm_change",
    "follow",
    "login_fields",
    "push_fields",
    "take_tables",
]

log = logging.getLogger(__name__)

#: The principal of a broker logged in with the cluster secret: this and its name.
BROKER_PRINCIPAL_PREFIX = "Broker:"
#: Kinds signed with the cluster secret (membership.sign), besides the registrations.
LOGIN_KIND = "CLUSTER_LOGIN"
PUSH_KIND = "SECURITY_PUSH"
PULL_KIND = "SECURITY_PULL"


class SecurityTables(Protocol):
    """The broker's users and ACL entries, as the registration sees them."""

    def version(self) -> tuple[int, int]:
        """(counter, digest) of the tables now."""
        ...

    def snapshot(self) -> SecuritySnapshot:
        """The tables now, whole."""
        ...

    def seen(
        self,
        server: str,
        newest: tuple[int, int],
        writer: str,
        *,
        term: int,
        lease_until_ms: float,
    ) -> None:
        """Name server `server` holds `newest`; `writer` changes the tables ("" unknown)
        under `term` (0: no lease granted), until `lease_until_ms` (monotonic) if it is
        this broker (docs/adr/0020)."""
        ...

    def held_term(self) -> int:
        """The newest writer term a name server granted this broker a live lease for
        (0: none), reported at each registration."""
        ...

    async def apply(self, snapshot: SecuritySnapshot, *, replace: bool = False) -> bool:
        """Replace the tables with a pulled snapshot if it is newer (with `replace`: if
        it is another version, a writer dropping a change no majority confirmed);
        whether it did."""
        ...


def login_fields(broker_name: str) -> list[object]:
    return [broker_name]


def push_fields(request: SecurityPushRequest) -> list[object]:
    fields: list[object] = [request.broker_name, request.snapshot.counter, request.snapshot.digest]
    if request.writer_term:  # signed too: a copy's signature cannot make a confirmation
        fields.append(request.writer_term)
    return fields


async def cluster_login(
    conn: ClientConnection, broker_name: str, key: bytes, clock: Clock, timeout_s: float
) -> None:
    """Log a new name-server connection in with the cluster secret; a name server that
    does not take such logins (no secret of its own) answers Unsupported, and the
    connection goes on without."""
    try:
        await conn.request(
            SaslHandshakeRequest(mechanism=CLUSTER_MECHANISM),
            SaslHandshakeResponse,
            timeout_s=timeout_s,
        )
    except (Unsupported, InvalidRequest):
        return  # a name server without logins, or one older than this
    signed_ms, signature = sign(key, LOGIN_KIND, login_fields(broker_name), now_ms=clock.now_ms())
    login = ClusterLogin(broker_name=broker_name, signed_ms=signed_ms, signature=signature)
    await conn.request(
        SaslAuthenticateRequest(message=msgspec.msgpack.encode(login)),
        SaslAuthenticateResponse,
        timeout_s=timeout_s,
    )


def check_cluster_login(key: bytes, message: bytes, clock: Clock) -> str:
    """A broker's `ClusterLogin` (signed with the cluster secret `key`): its principal
    `Broker:<name>`, or AuthenticationFailed (a bad message, signature or time)."""
    try:
        login = msgspec.msgpack.decode(message, type=ClusterLogin)
    except msgspec.DecodeError:
        raise AuthenticationFailed("bad cluster login message") from None
    verify(
        key,
        LOGIN_KIND,
        login_fields(login.broker_name),
        signed_ms=login.signed_ms,
        signature=login.signature,
        now_ms=clock.now_ms(),
    )
    return f"{BROKER_PRINCIPAL_PREFIX}{login.broker_name}"


async def follow(
    conn: ClientConnection,
    answer: RegisterBrokerResponse,
    tables: SecurityTables,
    *,
    broker_name: str,
    key: bytes | None,
    clock: Clock,
    timeout_s: float,
    sent_ms: float,
) -> None:
    """After a registration answer (its request sent at `sent_ms`, monotonic): note the
    writer and its lease, then push or pull the tables as the answer says."""
    newest = (answer.security_counter, answer.security_digest)
    tables.seen(
        conn.address,
        newest,
        answer.security_writer,
        term=answer.writer_term,
        lease_until_ms=sent_ms + answer.broker_ttl_ms,
    )
    if answer.security_push:
        push = SecurityPushRequest(broker_name=broker_name, snapshot=tables.snapshot())
        if key is not None:
            push.signed_ms, push.signature = sign(
                key, PUSH_KIND, push_fields(push), now_ms=clock.now_ms()
            )
        try:
            await conn.request(push, SecurityPushResponse, timeout_s=timeout_s)
        except WriterFenced as exc:
            # Tables made here under a deposed term: the newer writer's (a newer
            # version: term first) replace them.
            log.warning("users and ACL entries refused by %s: %s", conn.address, exc)
            await _pull(conn, tables, broker_name, key=key, clock=clock, timeout_s=timeout_s)
    elif newest[0] >= 1 and newest > tables.version():
        await _pull(conn, tables, broker_name, key=key, clock=clock, timeout_s=timeout_s)


async def confirm_change(
    conn: ClientConnection,
    snapshot: SecuritySnapshot,
    term: int,
    *,
    broker_name: str,
    key: bytes | None,
    clock: Clock,
    timeout_s: float,
) -> None:
    """Ask one name server to confirm the writer's tables `snapshot`, made under writer
    `term` (docs/adr/0026). Returns once it holds them; raises what it answered
    otherwise (WriterFenced: it has granted a newer term or another holder;
    BrokerNotAvailable: it holds newer tables), or RequestTimeout."""
    push = SecurityPushRequest(broker_name=broker_name, snapshot=snapshot, writer_term=term)
    if key is not None:
        push.signed_ms, push.signature = sign(
            key, PUSH_KIND, push_fields(push), now_ms=clock.now_ms()
        )
    await conn.request(push, SecurityPushResponse, timeout_s=timeout_s)


async def take_tables(
    conn: ClientConnection,
    tables: SecurityTables,
    broker_name: str,
    *,
    key: bytes | None,
    clock: Clock,
    timeout_s: float,
) -> None:
    """Replace the broker's tables with the name server's, whatever their versions: a
    writer whose change the name servers refused under a newer term drops it."""
    await _pull(conn, tables, broker_name, key=key, clock=clock, timeout_s=timeout_s, replace=True)


async def _pull(
    conn: ClientConnection,
    tables: SecurityTables,
    broker_name: str,
    *,
    key: bytes | None,
    clock: Clock,
    timeout_s: float,
    replace: bool = False,
) -> None:
    pull = SecurityPullRequest(broker_name=broker_name)
    if key is not None:
        pull.signed_ms, pull.signature = sign(
            key, PULL_KIND, login_fields(broker_name), now_ms=clock.now_ms()
        )
    snapshot, _ = await conn.request(pull, SecuritySnapshot, timeout_s=timeout_s)
    if await tables.apply(snapshot, replace=replace):
        log.info(
            "took users and ACL entries version %s from name server %s",
            counter_text(snapshot.counter),
            conn.address,
        )
