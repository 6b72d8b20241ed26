"""The broker's request-handler table: which part answers each request code, and the
router that serves a request by it (after `request_dispatch` has checked the request)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tidemq.broker.compaction_service import CompactionService
from tidemq.broker.handlers.admin import AdminHandlers
from tidemq.broker.handlers.data import DataHandlers
from tidemq.broker.handlers.groups import GroupHandlers
from tidemq.broker.handlers.key_query import KeyQueryHandler
from tidemq.broker.handlers.origin_lookup import OriginLookup
from tidemq.broker.handlers.special import SpecialHandlers
from tidemq.broker.pop_requests import PopRequests
from tidemq.broker.static_service import StaticService
from tidemq.broker.tier_requests import TierRequests
from tidemq.cluster.service import NAMESERVER_CODES, NameServerHandlers
from tidemq.core.errors import InvalidRequest
from tidemq.net.server import ServerConnection
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import StatusResponse
from tidemq.protocol.frame import Frame
from tidemq.protocol.replica_messages import ElectLeaderRequest, ElectLeaderResponse

__all__ = ["Handler", "RequestRouter", "handler_table"]

#: A request's handler: the decoded header and the frame's body in, the answer out (an
#: answer, or an answer and the bytes that follow it).
Handler = Callable[[Any, bytes | memoryview], Awaitable[Any]]


def _plain(fn: Callable[[Any], Awaitable[Any]]) -> Handler:
    """A handler of the header alone."""

    async def run(header: Any, body: bytes | memoryview) -> Any:
        return await fn(header)

    return run


def handler_table(
    *,
    data: DataHandlers,
    admin: AdminHandlers,
    groups: GroupHandlers,
    special: SpecialHandlers,
    pop: PopRequests,
    compaction: CompactionService,
    key_query: KeyQueryHandler,
    static: StaticService,
    tier: TierRequests,
    status: Callable[[], Awaitable[StatusResponse]],
    elect_leader: Callable[[ElectLeaderRequest], Awaitable[ElectLeaderResponse]],
    replica_fetch: Callable[[object], Awaitable[None]],
) -> dict[RequestCode, Handler]:
    """Every request code's handler; the table is built once the parts serve."""
    d, a, g, plain = data, admin, groups, _plain
    return {
        RequestCode.PRODUCE: d.produce,
        RequestCode.FETCH: plain(d.fetch),
        RequestCode.LIST_OFFSETS: plain(d.list_offsets),
        RequestCode.INIT_PRODUCER: plain(d.init_producer),
        RequestCode.CREATE_TOPIC: plain(a.create_topic),
        RequestCode.CREATE_TOPICS: plain(a.create_topics),
        RequestCode.ALTER_TOPIC: plain(a.alter_topic),
        RequestCode.DELETE_TOPIC: plain(a.delete_topic),
        RequestCode.LIST_TOPICS: plain(a.list_topics),
        RequestCode.DESCRIBE_TOPIC: plain(a.describe_topic),
        RequestCode.STATUS: plain(lambda _: status()),
        RequestCode.JOIN_GROUP: plain(g.join),
        RequestCode.HEARTBEAT: plain(g.heartbeat),
        RequestCode.LEAVE_GROUP: plain(g.leave),
        RequestCode.COMMIT_OFFSETS: plain(g.commit),
        RequestCode.FETCH_OFFSETS: plain(g.fetch_offsets),
        RequestCode.LIST_GROUPS: plain(g.list_groups),
        RequestCode.DESCRIBE_GROUP: plain(g.describe),
        RequestCode.RESET_OFFSETS: plain(g.reset),
        RequestCode.CANCEL_DELAYED: plain(special.cancel_delayed),
        RequestCode.TIMER_STATUS: plain(special.timer_status),
        RequestCode.BEGIN_TXN: plain(special.begin),
        RequestCode.END_TXN: plain(special.end),
        RequestCode.SINK_MARKER: plain(special.sink_marker),
        RequestCode.TXN_STATUS: plain(special.txn_status),
        RequestCode.POP_RECEIVE: plain(pop.receive),
        RequestCode.POP_ACK: plain(pop.ack),
        RequestCode.POP_CHANGE_INVISIBLE: plain(pop.change_invisible),
        RequestCode.POP_NACK: plain(pop.nack),
        RequestCode.POP_STATUS: plain(pop.status),
        RequestCode.POP_RESUME: plain(pop.resume),
        RequestCode.KV_GET: plain(compaction.kv_get),
        RequestCode.QUERY_MESSAGES: plain(key_query.query),
        RequestCode.COMPACT: plain(compaction.compact),
        RequestCode.STATIC_OPEN: plain(static.open),
        RequestCode.STATIC_SEAL: plain(static.seal),
        RequestCode.STATIC_UPDATE: plain(static.update),
        RequestCode.STATIC_TIMERS_TAKE: plain(static.take_timers),
        RequestCode.STATIC_TIMERS_ADOPT: plain(static.adopt_timers),
        RequestCode.STATIC_TIMERS_HANDED: plain(static.timers_handed),
        RequestCode.TIER_STATUS: plain(tier.status),
        RequestCode.TIER_FILES: plain(tier.files),
        RequestCode.TIER_OFFLOAD: plain(tier.offload),
        RequestCode.ELECT_LEADER: plain(elect_leader),
        RequestCode.REPLICA_FETCH: plain(replica_fetch),
        RequestCode.REPLICA_FILE: plain(replica_fetch),
    }


#: Name-server requests an embedded name server never takes from a connection.
_SELF_REGISTERED = frozenset(
    {
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.SECURITY_PUSH,
        RequestCode.SECURITY_PULL,
    }
)


class RequestRouter:
    """Serves a checked request: by `handlers` (the table above, which the router shares,
    not copies), or itself for the codes that need the connection or that only the
    embedded name server answers (`ns_handlers`)."""

    def __init__(
        self,
        handlers: dict[RequestCode, Handler],
        *,
        data: DataHandlers,
        special: SpecialHandlers,
        origins: OriginLookup,
        check_read: Callable[[RequestCode, str | None, str, str], None],
    ) -> None:
        self.handlers = handlers
        #: The name server in this process (set once it runs; None: none).
        self.ns_handlers: NameServerHandlers | None = None
        self._data = data
        self._special = special
        self._origins = origins
        self._check_read = check_read

    async def serve(
        self, code: RequestCode, header: Any, frame: Frame, conn: ServerConnection
    ) -> tuple[Any, bytes]:
        if code in NAMESERVER_CODES:
            if self.ns_handlers is None:
                raise InvalidRequest(
                    f"{code.name} goes to a name server; this broker runs without one"
                )
            if code in _SELF_REGISTERED:
                # The embedded name server routes to this broker alone, which registers
                # in-process: a registration over the wire could only hijack its routes
                # (or make its topics vanish), so none is taken from any connection.
                raise InvalidRequest(
                    f"{code.name} refused: this server's name server serves only its own "
                    "broker; run `tidemq namesrv` and `tidemq broker` for a cluster"
                )
            return self.ns_handlers.handle(code, header), b""
        if code is RequestCode.REGISTER_CHECKER:
            return self._special.register_checker(header, conn), b""
        if code is RequestCode.FETCH:
            # The answer's bytes are charged to the connection's response budget.
            return await self._data.fetch(header, budget=conn.budget)
        if code is RequestCode.CHECK_TXN:
            raise InvalidRequest("CHECK_TXN goes from the broker to a client, not the other way")
        if code is RequestCode.ORIGIN_MESSAGE:
            answer, body = await self._origins.find(header)
            if answer.found:
                self._check_read(code, conn.principal, conn.host, answer.topic)
            return answer, body
        result = await self.handlers[code](header, frame.body)
        if isinstance(result, tuple):
            return result
        return result, b""
