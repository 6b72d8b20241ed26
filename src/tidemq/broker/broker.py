"""The composition root: build the broker's parts, start them in order, stop them in reverse.

Start: open (and recover) the store on a worker thread, start the store gateway (store
calls on the loop, fdatasync on its flusher thread), load topics, listen, register with
the name servers (or with the name server in this process, for `tidemq server`).

Stop (SIGTERM/SIGINT or `stop()`): stop accepting, answer parked fetches, let in-flight
requests finish (bounded by `shutdown_timeout_ms`), unregister, then flush, checkpoint and
close the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from tidemq.broker.access_control import open_access_control
from tidemq.broker.broker_metrics import BrokerMetrics
from tidemq.broker.broker_parts import BrokerParts
from tidemq.broker.compaction_service import CompactionService
from tidemq.broker.config import BrokerConfig
from tidemq.broker.data_dir_lock import DataDirLock
from tidemq.broker.groups import GroupCoordinator
from tidemq.broker.housekeeping import retention_forever, sweep_forever
from tidemq.broker.listener_settings import (
    listener_ssl_context,
    name_server_ssl_context,
    server_limits,
)
from tidemq.broker.long_polling import LongPolling
from tidemq.broker.member_tables import MemberTables
from tidemq.broker.metrics import MetricsSnapshot, RequestTimes
from tidemq.broker.name_server_link import LocalNameServer, NameServerLink
from tidemq.broker.offset_book import OffsetBook
from tidemq.broker.peer_links import others
from tidemq.broker.pop_service import PopService
from tidemq.broker.queue_lookup import QueueLookup
from tidemq.broker.replica_leader import ReplicaLeader
from tidemq.broker.request_handling import RequestHandling
from tidemq.broker.schema_validation import SchemaCheck
from tidemq.broker.security_sync import SecuritySync
from tidemq.broker.service_states import ServiceStates, created_ms
from tidemq.broker.static_service import StaticService
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.tier_requests import open_tier
from tidemq.broker.timer_service import TimerService
from tidemq.broker.topic_registrations import TopicRegistrations
from tidemq.broker.topics import TopicTable
from tidemq.broker.transaction_service import TransactionService
from tidemq.cluster.membership import check_secret
from tidemq.cluster.nameserver import NameServer
from tidemq.cluster.registration import Registration
from tidemq.cluster.service import NameServerHandlers
from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import InvalidRequest, TidemqError
from tidemq.net.server import ServerConnection, TcpServer
from tidemq.net.tasks import cancel_and_wait, completes_when_cancelled
from tidemq.protocol.commands import ProduceResponse
from tidemq.protocol.frame import Frame
from tidemq.protocol.replica_messages import ElectLeaderRequest, ElectLeaderResponse
from tidemq.store.files import FileSystem
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import MessageType

if TYPE_CHECKING:
    from tidemq.broker.tier_service import TierService

__all__ = ["Broker", "listener_ssl_context", "name_server_ssl_context", "server_limits"]

log = logging.getLogger(__name__)


class Broker:
    def __init__(
        self,
        config: BrokerConfig,
        *,
        clock: Clock | None = None,
        fs: FileSystem | None = None,
        embedded_nameserver: bool = False,
        bootstrap_password: str | None = None,
        cluster_secret: str | None = None,
        replica: ReplicaLeader | None = None,
    ) -> None:
        """`bootstrap_password`: the password of `config.bootstrap_user`, created when
        authentication is on and the broker has no user yet (the CLI reads it from
        TIDEMQ_BOOTSTRAP_PASSWORD). `cluster_secret`: sign the registrations with the
        name servers with it (TIDEMQ_CLUSTER_SECRET; tidemq.cluster.membership)."""
        self.config = config
        #: This broker leads a replica group (`replica_node.py`): the leader's side takes
        #: the gateway over as soon as the store is open.
        self._replica = replica
        self._bootstrap_password = bootstrap_password
        self._cluster_key = None if cluster_secret is None else check_secret(cluster_secret)
        self._clock = clock or SystemClock()
        #: Server-side time per request kind (the HTTP listener's /metrics).
        self.request_times = RequestTimes()
        self._fs = fs
        self._embedded = embedded_nameserver
        self.address = ""
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self.nameserver: NameServer | None = None
        self._local: LocalNameServer | None = None
        self._ns_handlers: NameServerHandlers | None = None
        #: Tiered storage (None: `tiered.url` not set).
        self.tier: TierService | None = None
        #: None: a test's simulated file system, which no second process can share.
        self._lock = None if fs is not None else DataDirLock(config.store.data_dir)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Start serving; return the address clients dial. On failure everything already
        started is stopped again (the store closed) before the error propagates."""
        try:
            return await self._start()
        except BaseException:
            await self._abort_start()
            raise

    async def _abort_start(self) -> None:
        self._stopped.set()  # a later stop() has nothing left to do
        server = getattr(self, "_server", None)
        if server is not None:
            await server.stop_accepting()
            await server.drain(0)
        registration = getattr(self, "_registration", None)
        if registration is not None:
            await registration.stop()
        gateway = getattr(self, "_gateway", None)
        if gateway is not None:
            await gateway.close()
        if self._lock is not None:
            self._lock.release()

    async def _start(self) -> str:
        cfg = self.config
        loop = asyncio.get_running_loop()
        # Before anything else: a bad certificate path fails the start at once.
        listener_tls = listener_ssl_context(cfg)
        name_server_tls = None if self._embedded else name_server_ssl_context(cfg)
        if self._lock is not None:
            self._lock.acquire()
        store = await asyncio.to_thread(
            MessageStore.open, cfg.store, fs=self._fs, clock=self._clock
        )
        self._polling = LongPolling(cfg.max_parked_fetches)
        self._gateway = StoreGateway(store, loop, self._polling.notify)
        if self._replica is not None:
            self._replica.attach(self._gateway)
        self._created_ms = created_ms(store)
        self._topics = TopicTable(cfg, self._gateway)
        self._compaction = CompactionService(
            self._gateway, self._topics, cfg.compaction_check_interval_ms
        )
        await self._topics.refresh()
        lookup = QueueLookup(self._topics, self._gateway)
        self._timers = TimerService(
            cfg,
            self._gateway,
            self._clock,
            lookup.has_queue,
            static_writable=lookup.static_writable,
        )
        self._transactions = TransactionService(cfg, self._gateway, self._clock)
        self._pop = PopService(
            cfg,
            self._gateway,
            polling=self._polling,
            clock=self._clock,
            queues_of=lookup.hosted_queues,
            ensure_topic=lookup.ensure_topic,
            is_fifo=lambda t: self._topics.get(t).message_type is MessageType.FIFO,
            schedule=lambda topic, queue, payload, due, lease: self._timers.schedule(
                topic, queue, payload, due, finishes=lease
            ),
            logical_offset=self._logical_offset,
            pop_limit=self._pop_limit,
        )
        await self._start_services(store)
        self._server = TcpServer(
            self._dispatch,
            server_limits(cfg),
            # Network timeouts run on the real clock, not the broker's: a test that moves a
            # ManualClock by hours (timers, retention) must not close its idle connections.
            ssl_context=listener_tls,
            auth_required=cfg.auth_enabled,
            answer_now=self._answer_now,
        )
        host, port = await self._server.start(cfg.host, cfg.port)
        self.address = cfg.advertised_address or f"{host}:{port}"
        self._security = SecuritySync(
            self._auth,
            self._authz,
            self._gateway,
            address=self.address,
            changed=self._security_changed,
            # Alone with its own name server, this broker is the cluster: no lease.
            name_servers=0 if self._embedded else len(cfg.name_servers),
        )
        self._coordinator = GroupCoordinator(
            self._clock,
            session_timeout_ms_min=cfg.group_session_timeout_ms_min,
            session_timeout_ms_max=cfg.group_session_timeout_ms_max,
        )
        self._static = StaticService(
            cfg.broker_name,
            self._gateway,
            self._topics,
            self._clock,
            transactions=self._transactions,
            timers=self._timers,
            register_now=self._register_now,
            pop_unfinished=self._pop.unfinished,
        )
        self._registrations = TopicRegistrations(self._topics, self._static.chains)
        self._start_requests()
        if self._embedded:
            self._start_local_name_server()
        else:
            self._ns_handlers = None
            self._registration = Registration(
                cfg.broker_name,
                self.address,
                cfg.name_servers,
                self._registrations.topic_list,
                cfg.broker_heartbeat_interval_ms,
                static_topics=self._registrations.static_list,
                created_ms=self._created_ms,
                ssl_context=name_server_tls,
                cluster_key=self._cluster_key,
                journal=self._registrations.journal,
                lookup=self._registrations.lookup,
                leader_epoch=0 if self._replica is None else self._replica.epoch,
                security=self._security,
            )
            self._link = NameServerLink(self._registrations, remote=self._registration)
            self._topics.on_change = self._link.topic_changed
            self._security.confirmer = self._registration.confirm
            await self._registration.start()
        self.tier = self._start_tier()
        self._complete_requests()
        self._start_background(loop)
        tls = " (TLS)" if listener_tls is not None else ""
        auth = " (SCRAM-SHA-256 authentication)" if cfg.auth_enabled else ""
        log.info("broker %s serving on %s%s%s", cfg.broker_name, self.address, tls, auth)
        return self.address

    def _start_local_name_server(self) -> None:
        """The name server in this process (`tidemq server`), told of this broker."""
        local = LocalNameServer(
            self.config,
            self._registrations,
            self._security,
            address=self.address,
            created_ms=self._created_ms,
        )
        self._local, self.nameserver, self._ns_handlers = local, local.nameserver, local.handlers
        self._link = NameServerLink(self._registrations, local=local)
        self._topics.on_change = self._link.topic_changed
        local.register()

    async def _peer_brokers(self) -> dict[str, str]:
        """The other live brokers, as the name servers list them."""
        live = await self._registration.live_brokers()
        return others(live, self.config.broker_name, self.address)

    def _start_security(self, store: MessageStore) -> None:
        access = open_access_control(
            self.config,
            self._gateway,
            store,
            self._clock,
            cluster_key=self._cluster_key,
            bootstrap_password=self._bootstrap_password,
            txn_groups=self._transactions.groups_of,
        )
        self._access, self._auth, self._authz = access, access.auth, access.authz

    def _start_tier(self) -> TierService | None:
        tier = open_tier(self.config, self._gateway, self._topics, self._clock)
        if tier is not None:
            tier.publish_tables = self._tables.publish
            self._pop.tier = self._static.retired.tier = tier
        return tier

    def _start_background(self, loop: asyncio.AbstractEventLoop) -> None:
        self._tasks.append(loop.create_task(sweep_forever(self._coordinator, self._local)))
        self._tasks.append(loop.create_task(retention_forever(self._gateway, self._static)))
        self._tasks.append(loop.create_task(self._service_states.save_periodically()))
        self._tasks.append(loop.create_task(self._compaction.run_forever()))
        if self.tier is not None:
            self._tasks.append(loop.create_task(self.tier.run_forever()))

    @completes_when_cancelled
    async def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        await self._server.stop_accepting()
        self._polling.wake_all()
        await self._server.drain(self.config.shutdown_timeout_ms / 1000)
        await cancel_and_wait(*self._tasks)
        if self.tier is not None:
            await self.tier.close()
        # A run in the worker process finishes its file (which nothing names: the next
        # start removes it) or is cut short by the timeout; then the worker exits.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.to_thread(self._compaction.close), self.config.shutdown_timeout_ms / 1000
            )
        await self._requests.close()
        if not self._embedded:
            await self._registration.stop()
        await self._timers.stop()
        await self._transactions.stop()
        try:
            self._service_states.save()
        except TidemqError:
            log.exception("could not save the timer and transaction state")
        await self._gateway.close()
        if self._lock is not None:
            self._lock.release()
        log.info("broker %s stopped", self.config.broker_name)

    async def check_password(self, user: str, password: str, host: str) -> bool:
        """Whether `password` is `user`'s (the HTTP listener's login; see
        `Authenticator.check_password`)."""
        return await self._auth.check_password(user, password, host)

    def set_schema_check(self, check: SchemaCheck | None) -> None:
        """The schema registry's check for topics with schema.validation=true: the node
        that runs the registry beside this broker sets it once both serve."""
        self._requests.data.schema_check = check

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # ------------------------------------------------------------------ timers, transactions

    def _pop_limit(self, group: str, topic: str, queue: int) -> int | None:
        # The static service is made after the pop service, which calls this later.
        return self._static.fifo.limit(group, topic, queue)

    def _logical_offset(self, topic: str, queue: int, offset: int) -> int:
        # The static service is made after the pop service, which calls this later.
        return self._static.logical_offset(topic, queue, offset)

    async def _start_services(self, store: MessageStore) -> None:
        self._service_states = ServiceStates(
            self._gateway,
            self._timers,
            self._transactions,
            self._pop,
            replica=self._replica,
            interval_ms=self.config.service_checkpoint_interval_ms,
        )
        self._service_states.rebuild(store)
        self._book = OffsetBook(self._gateway)
        await self._book.start()
        self._tables = MemberTables(self._gateway, replicated=self._replica is not None)
        await self._tables.start()
        self._start_security(store)
        await self._transactions.start()
        self._timers.start()

    # ------------------------------------------------------------------ registration

    def _security_changed(self) -> None:
        """Users or ACL entries changed here: tell the name servers now (ADR 15)."""
        self._link.changed()

    async def _register_now(self) -> None:
        """Register in full now (a static topic's chains changed), returning once the name
        servers have it, and once the chains are in the group's log (`member_tables`)."""
        await self._tables.publish()
        await self._link.register_now()

    async def _register_changes(self) -> None:
        await self._link.register_changes()

    def metrics(self, *, per_queue: bool = False) -> MetricsSnapshot:
        """Counters and gauges for the HTTP listener's /metrics (on the broker's loop);
        `per_queue` (`http.metrics_per_queue`): also lag and end offset per queue."""
        return self._metrics.snapshot(per_queue=per_queue)

    # ------------------------------------------------------------------ dispatch

    def _start_requests(self) -> None:
        """What serves requests while the broker registers (logins, fetches, one-message
        produces, lookups by id), as the listener runs already."""
        self._parts = BrokerParts(
            config=self.config,
            clock=self._clock,
            gateway=self._gateway,
            topics=self._topics,
            polling=self._polling,
            timers=self._timers,
            transactions=self._transactions,
            pop=self._pop,
            static=self._static,
            compaction=self._compaction,
            book=self._book,
            coordinator=self._coordinator,
            replica=self._replica,
        )
        self._requests = RequestHandling(
            self._parts,
            self._access,
            address=self.address,
            server=self._server,
            register_changes=self._register_changes,
            confirm_change=self._security.confirm,
            request_times=self.request_times,
        )
        self._handlers = self._requests.handlers

    def _complete_requests(self) -> None:
        """Every request handler once registered, and the metrics."""
        self._requests.complete(
            ns_handlers=self._ns_handlers,
            tier=self.tier,
            remote_counts=self._link.queue_counts,
            peers=None if self._embedded else self._peer_brokers,
            cluster_key=self._cluster_key,
            elect_leader=self._elect_leader,
            replica_fetch=self._replica_fetch,
        )
        self._metrics = BrokerMetrics(
            self._parts,
            traffic=self._requests.data.traffic,
            request_times=self.request_times,
            tier=self.tier,
        )

    def _dispatch(self, frame: Frame, conn: ServerConnection) -> Awaitable[tuple[Any, bytes]]:
        # The dispatcher's coroutine itself, not one more layer around it: each costs
        # every request (docs/design/performance.md). The server starts before it exists.
        return self._requests.dispatcher.dispatch(frame, conn)

    def _answer_now(self, frame: Frame, conn: ServerConnection) -> ProduceResponse | None:
        return self._requests.dispatcher.answer_now(frame, conn)

    async def _elect_leader(self, req: ElectLeaderRequest) -> ElectLeaderResponse:
        if self._replica is None:
            raise InvalidRequest("ELECT_LEADER goes to a replica group's leader")
        return await self._replica.elect(req)

    async def _replica_fetch(self, _: object) -> None:
        raise InvalidRequest(
            "REPLICA_FETCH and REPLICA_FILE go to a replica group member's replication listener "
            "(replication.port), not to its client listener"
        )
