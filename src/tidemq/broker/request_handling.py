"""The request-serving half of the broker: the handlers of each kind of request, the
handler table and router over them, the dispatcher in front (`request_dispatch`), and the
STATUS answer.

Built in two steps, as the broker starts: once it listens, what serves requests while it
registers with the name servers (logins, fetches, one-message produces, lookups by id);
once it is registered, the group handlers and the rest of the table (`complete`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from tidemq.broker.access_control import AccessControl
from tidemq.broker.broker_parts import BrokerParts
from tidemq.broker.handler_table import Handler, RequestRouter, handler_table
from tidemq.broker.handlers.admin import AdminHandlers
from tidemq.broker.handlers.data import DataHandlers
from tidemq.broker.handlers.groups import GroupHandlers, RemoteCounts
from tidemq.broker.handlers.key_query import KeyQueryHandler
from tidemq.broker.handlers.origin_lookup import OriginLookup
from tidemq.broker.handlers.special import SpecialHandlers
from tidemq.broker.metrics import RequestTimes
from tidemq.broker.offset_pull import OffsetPull, PeerList
from tidemq.broker.peer_links import PeerLinks, offset_pull_from_peers
from tidemq.broker.pop_requests import PopRequests
from tidemq.broker.request_dispatch import RequestDispatch
from tidemq.broker.status_report import status_report
from tidemq.broker.tier_requests import TierRequests
from tidemq.cluster.service import NameServerHandlers
from tidemq.net.server import TcpServer
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import FetchOffsetsRequest, FetchOffsetsResponse, StatusResponse
from tidemq.protocol.replica_messages import ElectLeaderRequest, ElectLeaderResponse

if TYPE_CHECKING:
    from tidemq.broker.tier_service import TierService

__all__ = ["RequestHandling"]


class RequestHandling:
    """One per broker, on its loop. `handlers` is the table the router serves from (a test
    may replace an entry); `dispatcher` serves every request the listener takes."""

    def __init__(
        self,
        parts: BrokerParts,
        access: AccessControl,
        *,
        address: str,
        server: TcpServer,
        register_changes: Callable[[], Awaitable[None]],
        confirm_change: Callable[[], Awaitable[None]],
        request_times: RequestTimes,
    ) -> None:
        p, cfg = parts, parts.config
        self._parts = parts
        self._server = server
        self.data = DataHandlers(
            cfg,
            p.gateway,
            p.topics,
            p.polling,
            timers=p.timers,
            transactions=p.transactions,
            static=p.static,
        )
        # What finds messages by key, and delayed or transactional ones by id.
        self._key_query = KeyQueryHandler(p.gateway, p.topics, p.static)
        origins = OriginLookup(p.gateway, p.timers, p.transactions)
        self.special = SpecialHandlers(
            p.timers, p.transactions, cfg.txn_check_delay_ms, static_view=p.static.view
        )
        self.admin = AdminHandlers(
            cfg,
            p.gateway,
            p.topics,
            address,
            static_view=p.static.view,
            register_now=register_changes,
        )
        self.admin.connections = lambda: server.connections
        #: Filled by `complete`: until then only the requests the router and the
        #: dispatcher serve themselves are answered.
        self.handlers: dict[RequestCode, Handler] = {}
        self._router = RequestRouter(
            self.handlers,
            data=self.data,
            special=self.special,
            origins=origins,
            check_read=access.authz.check_read,
        )
        self.dispatcher = RequestDispatch(
            auth=access.auth,
            authz=access.authz,
            producer_owners=access.producer_owners,
            gateway=p.gateway,
            router=self._router,
            data=self.data,
            peer_offsets=self._peer_offsets,
            timer_topic_of=p.timers.topic_of,
            confirm_change=confirm_change,
            request_times=request_times,
        )
        self._offset_pull: OffsetPull | None = None
        self._peer_links: PeerLinks | None = None

    def complete(
        self,
        *,
        ns_handlers: NameServerHandlers | None,
        tier: TierService | None,
        remote_counts: RemoteCounts,
        peers: PeerList | None,
        cluster_key: bytes | None,
        elect_leader: Callable[[ElectLeaderRequest], Awaitable[ElectLeaderResponse]],
        replica_fetch: Callable[[object], Awaitable[None]],
    ) -> None:
        """Once the broker is registered: every handler. `ns_handlers`: the name server in
        this process; `peers` None: no other brokers to pull offsets from."""
        p, cfg = self._parts, self._parts.config
        self._router.ns_handlers = ns_handlers
        self.data.tier = tier
        if peers is not None:
            # What takes a group's committed offsets from the other brokers when the
            # group moves here (ADR 17).
            self._offset_pull, self._peer_links = offset_pull_from_peers(
                cfg, cluster_key, p.clock, p.book, peers
            )
        self.groups = GroupHandlers(
            p.coordinator,
            p.gateway,
            p.book,
            p.topics,
            remote_counts=remote_counts,
            pop_groups=p.pop.groups,
            offset_pull=self._offset_pull,
        )
        self.handlers.update(
            handler_table(
                data=self.data,
                admin=self.admin,
                groups=self.groups,
                special=self.special,
                pop=PopRequests(p.pop, p.static),
                compaction=p.compaction,
                key_query=self._key_query,
                static=p.static,
                tier=TierRequests(cfg.broker_name, p.topics, tier),
                status=self.status,
                elect_leader=elect_leader,
                replica_fetch=replica_fetch,
            )
        )

    async def _peer_offsets(self, req: FetchOffsetsRequest) -> FetchOffsetsResponse:
        return await self.groups.fetch_offsets(req)

    async def close(self) -> None:
        """Stop pulling offsets from the other brokers, and close the links to them."""
        if self._offset_pull is not None:
            await self._offset_pull.close()
        if self._peer_links is not None:
            self._peer_links.close()

    async def status(self) -> StatusResponse:
        p = self._parts
        return await status_report(
            p.config, self.admin, self._server, self.data.traffic, replica=p.replica
        )
