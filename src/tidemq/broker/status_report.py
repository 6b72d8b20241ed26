"""The STATUS answer: the admin handler's status, with the listener's limits and their
usage, the traffic since start, the disk, and replication."""

from __future__ import annotations

import msgspec

from tidemq.broker.config import BrokerConfig
from tidemq.broker.handlers.admin import AdminHandlers
from tidemq.broker.metrics import Traffic, disk_usage
from tidemq.broker.replica_leader import ReplicaLeader
from tidemq.net.server import TcpServer
from tidemq.protocol.commands import StatusResponse

__all__ = ["STATUS_LIMITS", "status_report"]

#: The limits the STATUS answer reports, by their config key (`broker.<key>`).
STATUS_LIMITS = (
    "max_connections",
    "max_connections_per_address",
    "max_in_flight_requests",
    "requests_per_turn",
    "max_inbound_bytes",
    "max_response_bytes",
    "max_response_bytes_per_connection",
    "max_response_bytes_per_address",
    "write_buffer_high_bytes",
    "max_frame_bytes",
    "max_message_bytes",
    "max_fetch_bytes",
    "max_parked_fetches",
    "frame_read_timeout_ms",
    "connection_idle_timeout_ms",
    "write_stall_timeout_ms",
)


async def status_report(
    config: BrokerConfig,
    admin: AdminHandlers,
    server: TcpServer,
    traffic: Traffic,
    *,
    replica: ReplicaLeader | None,
) -> StatusResponse:
    """The admin handler's status, with the connection limits and their usage."""
    status = await admin.status()
    server_limits, usage = server.status()
    limits = {key: getattr(config, key) for key in STATUS_LIMITS}
    # As enforced (at most max_connections).
    limits["max_connections_per_address"] = server_limits["max_connections_per_address"]
    topics = traffic.topics.values()
    total, free = disk_usage(config.store.data_dir)
    return msgspec.structs.replace(
        status,
        limits=limits,
        usage=usage,
        messages_in=sum(t.messages_in for t in topics),
        messages_out=sum(t.messages_out for t in topics),
        bytes_in=sum(t.bytes_in for t in topics),
        bytes_out=sum(t.bytes_out for t in topics),
        disk_total_bytes=total,
        disk_free_bytes=free,
        replication=None if replica is None else replica.status(),
    )
