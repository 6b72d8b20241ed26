"""This broker's connections to the other brokers' client listeners, for the one request
brokers make of each other: a group's committed offsets from the broker's own store
(`FetchOffsetsRequest(local_only=True)`, `offset_pull.py`, ADR 17).

The connections use the listener's TLS settings (a broker whose listener speaks TLS
expects its peers' to), and with a cluster secret log in with it (principal
`Broker:<name>`, which a broker with logins lets ask for exactly this request). Without a
secret, a peer that requires logins refuses: its offsets are skipped, with a log line.

One per broker, on its loop. A connection is opened on first use, kept, and opened again
when it has closed (an idle peer closes it).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import Final

from tidemq.broker.config import BrokerConfig
from tidemq.broker.offset_book import OffsetBook
from tidemq.broker.offset_pull import PULL_REQUEST_TIMEOUT_MS, HeldOffset, OffsetPull, PeerList
from tidemq.cluster.security_link import cluster_login
from tidemq.core.clock import Clock
from tidemq.core.errors import AuthorizationFailed, BrokerNotAvailable
from tidemq.net.client import ClientConnection
from tidemq.net.tls import client_context
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import FetchOffsetsRequest, FetchOffsetsResponse

__all__ = [
    "PEER_FRAME_BYTES_MAX",
    "PeerLinks",
    "PeerLogin",
    "check_peer_request",
    "is_peer",
    "offset_pull_from_peers",
    "others",
]

#: The principal of a connection logged in with the cluster secret: another broker.
_PEER_PREFIX: Final = "Broker:"
#: Largest answer taken from a peer: a group's offsets (65,536 queues at about 60 bytes).
PEER_FRAME_BYTES_MAX: Final = 16 << 20


class PeerLogin:
    """What logs this broker in to its peers: its name and the cluster secret's key."""

    def __init__(self, broker_name: str, key: bytes, clock: Clock) -> None:
        self.broker_name = broker_name
        self.key = key
        self.clock = clock


class PeerLinks:
    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None,
        login: PeerLogin | None,
        timeout_ms: int,
    ) -> None:
        """`timeout_ms` bounds each connect, login and request."""
        self._ssl_context = ssl_context
        self._login = login
        self._timeout_s = timeout_ms / 1000
        self._conns: dict[str, ClientConnection] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._closed = False

    async def _conn(self, address: str) -> ClientConnection:
        conn = self._conns.get(address)
        if conn is not None and conn.is_open:
            return conn
        async with self._opening.setdefault(address, asyncio.Lock()):
            conn = self._conns.get(address)
            if conn is not None and conn.is_open:
                return conn
            conn = await ClientConnection.open(
                address,
                max_frame_bytes=PEER_FRAME_BYTES_MAX,
                connect_timeout_s=self._timeout_s,
                ssl_context=self._ssl_context,
            )
            try:
                if self._login is not None:
                    login = self._login
                    await cluster_login(
                        conn, login.broker_name, login.key, login.clock, self._timeout_s
                    )
            except BaseException:
                conn.close()
                raise
            if self._closed:  # stopped meanwhile: this connection must not outlive it
                conn.close()
                raise BrokerNotAvailable("this broker is stopping")
            self._conns[address] = conn
            return conn

    async def committed_offsets(self, address: str, group: str) -> list[HeldOffset]:
        """The group's committed offsets in the store of the broker at `address`, each
        with its commit time (0 when that broker does not say)."""
        conn = await self._conn(address)
        answer, _ = await conn.request(
            FetchOffsetsRequest(group=group, local_only=True),
            FetchOffsetsResponse,
            timeout_s=self._timeout_s,
        )
        times = answer.committed_ms
        if len(times) != len(answer.offsets):
            times = [0] * len(answer.offsets)
        return [
            HeldOffset(o.topic, o.queue, o.offset, ms)
            for o, ms in zip(answer.offsets, times, strict=True)
        ]

    def close(self) -> None:
        self._closed = True
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


def others(brokers: Mapping[str, str], own_name: str, own_address: str) -> dict[str, str]:
    """The live brokers (name -> address) less this one."""
    return {n: a for n, a in brokers.items() if n != own_name and a != own_address}


def is_peer(principal: str | None) -> bool:
    """Whether a connection's principal is another broker (logged in with the cluster
    secret) rather than a user."""
    return principal is not None and principal.startswith(_PEER_PREFIX)


def check_peer_request(code: RequestCode, header: object) -> FetchOffsetsRequest:
    """The one request a broker's login may make here: a group's committed offsets from
    this broker's store. Anything else is AuthorizationFailed (the cluster secret admits
    brokers to each other for this, not as users)."""
    if (
        code is RequestCode.FETCH_OFFSETS
        and isinstance(header, FetchOffsetsRequest)
        and header.local_only
    ):
        return header
    raise AuthorizationFailed(
        f"{code.name} refused: a broker's login may only fetch a group's committed "
        "offsets from this broker's store (FETCH_OFFSETS with local_only)"
    )


def offset_pull_from_peers(
    cfg: BrokerConfig, cluster_key: bytes | None, clock: Clock, book: OffsetBook, peers: PeerList
) -> tuple[OffsetPull, PeerLinks]:
    """What takes a group's committed offsets from the other brokers (`peers`) when the
    group moves here (ADR 17), and the links it asks them over."""
    key = cluster_key
    tls = None
    if cfg.tls:
        tls = client_context(
            cfg.tls_ca_file,
            cfg.tls_cert_file,
            cfg.tls_key_file,
            names=("broker.tls_ca_file", "broker.tls_cert_file", "broker.tls_key_file"),
        )
    login = None if key is None else PeerLogin(cfg.broker_name, key, clock)
    links = PeerLinks(ssl_context=tls, login=login, timeout_ms=PULL_REQUEST_TIMEOUT_MS)
    pull = OffsetPull(
        book,
        peers=peers,
        peer_offsets=links.committed_offsets,
        request_timeout_ms=PULL_REQUEST_TIMEOUT_MS,
    )
    return pull, links
