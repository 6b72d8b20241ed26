"""How the broker keeps its name servers told: the name server in this process (`tidemq
server`, `LocalNameServer`) or remote ones (`cluster.registration.Registration`), behind
one `NameServerLink` that the broker's parts call when topics or security change."""

from __future__ import annotations

from tidemq.broker.config import BrokerConfig
from tidemq.broker.security_sync import SecuritySync
from tidemq.broker.topic_registrations import TopicRegistrations
from tidemq.cluster.nameserver import NameServer
from tidemq.cluster.registration import Registration
from tidemq.cluster.service import NameServerHandlers
from tidemq.core.clock import SystemClock

__all__ = ["LocalNameServer", "NameServerLink"]


class LocalNameServer:
    """The name server in this broker's process, which serves this broker alone: it
    registers in-process, and its security tables are the cluster's."""

    def __init__(
        self,
        cfg: BrokerConfig,
        registrations: TopicRegistrations,
        security: SecuritySync,
        *,
        address: str,
        created_ms: int,
    ) -> None:
        self.nameserver = NameServer(
            # The real clock, not the broker's: this broker's heartbeats (`_sweep`) run
            # on real time, so its liveness must be measured on it too. On a
            # ManualClock moved past the TTL the broker lapsed from its own routes
            # ("no live broker is registered"), as the network timeouts would close
            # idle connections (which use the real clock for the same reason).
            SystemClock(),
            broker_ttl_ms=cfg.broker_ttl_ms,
            heartbeat_interval_ms=cfg.broker_heartbeat_interval_ms,
            stale_topic_ms=cfg.stale_topic_ms,
        )
        self.handlers = NameServerHandlers(self.nameserver)
        self._registrations = registrations
        self._security = security
        self._broker_name = cfg.broker_name
        self._address = address
        self._created_ms = created_ms
        self._interval_s = cfg.broker_heartbeat_interval_ms / 1000
        self._since_beat_s = 0.0

    def register(self) -> None:
        self._registrations.register_local(
            self.nameserver, self._broker_name, self._address, created_ms=self._created_ms
        )
        # The embedded name server serves this broker alone: its tables are the cluster's.
        holder = self.handlers.security
        version = self._security.version()
        holder.report(self._broker_name, version, 0)
        if version > holder.held:
            holder.offer(self._security.snapshot())

    def sweep(self, elapsed_s: float) -> None:
        """Called every `elapsed_s`: a heartbeat every heartbeat interval, and silent
        brokers expired."""
        self._since_beat_s += elapsed_s
        if self._since_beat_s >= self._interval_s:
            self._since_beat_s = 0.0
            self.register()
        self.nameserver.expire()


class NameServerLink:
    """Tells the name servers what changed here: exactly one of `local` and `remote`."""

    def __init__(
        self,
        registrations: TopicRegistrations,
        *,
        local: LocalNameServer | None = None,
        remote: Registration | None = None,
    ) -> None:
        assert (local is None) != (remote is None), "one name-server link, local or remote"
        self._registrations = registrations
        self._local = local
        self._remote = remote

    def changed(self) -> None:
        """Users, ACL entries or topics changed here: tell the name servers now (ADR 15)."""
        if self._local is not None:
            self._local.register()
        else:
            assert self._remote is not None
            self._remote.changed()

    def topic_changed(self, name: str | None) -> None:
        self._registrations.journal.touch(name)
        self.changed()

    async def register_now(self) -> None:
        """Register in full now (a static topic's chains changed: not a delta's business),
        returning once the name servers have it."""
        self._registrations.journal.touch(None)
        await self.register_changes()

    async def register_changes(self) -> None:
        """Send the name servers what changed (a topic created, altered or deleted),
        returning once they have it."""
        if self._local is not None:
            self._local.register()
        else:
            assert self._remote is not None
            await self._remote.register_once()

    async def queue_counts(self, topics: list[str]) -> dict[str, int]:
        if self._local is not None:
            return {r.topic: r.queues for r in self._local.nameserver.routes(topics)}
        assert self._remote is not None
        return await self._remote.queue_counts(topics)
