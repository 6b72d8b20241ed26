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
import dataclasses
import fcntl
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from tidemq.broker.auth import AUTH_CODES, Authenticator
from tidemq.broker.authorization import ACL_CODES, FILTERED_CODES, Authorization
from tidemq.broker.compaction_service import CompactionService
from tidemq.broker.config import BrokerConfig
from tidemq.broker.groups import GroupCoordinator
from tidemq.broker.handlers.admin import AdminHandlers
from tidemq.broker.handlers.data import DataHandlers
from tidemq.broker.handlers.groups import GroupHandlers
from tidemq.broker.handlers.key_query import KeyQueryHandler
from tidemq.broker.handlers.origin_lookup import OriginLookup
from tidemq.broker.handlers.special import SpecialHandlers
from tidemq.broker.long_polling import LongPolling
from tidemq.broker.member_tables import MemberTables
from tidemq.broker.metrics import (
    MetricsSnapshot,
    RequestTimes,
    consumer_lag,
    consumer_lag_latency,
    disk_usage,
    pop_totals,
    queue_ends,
    queue_lag,
    reserve_time_ms,
    tier_backlog,
)
from tidemq.broker.offset_book import OffsetBook
from tidemq.broker.offset_pull import PULL_REQUEST_TIMEOUT_MS, OffsetPull
from tidemq.broker.peer_links import PeerLinks, PeerLogin, check_peer_request, is_peer, others
from tidemq.broker.pop_service import PopService
from tidemq.broker.producer_owner_topic import ProducerOwnerTopic
from tidemq.broker.producer_owners import MAX_PRODUCER_OWNERS, ProducerOwners
from tidemq.broker.replica_leader import ReplicaLeader
from tidemq.broker.schema_validation import SchemaCheck
from tidemq.broker.security_sync import SecuritySync
from tidemq.broker.static_service import StaticService
from tidemq.broker.static_view import rebase_popped
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.system_topics import (
    HALF_TOPIC,
    OP_TOPIC,
    POP_TOPIC,
    TIMER_TOPIC,
    ensure_internal_topics,
    scan_moved,
)
from tidemq.broker.timer_service import TimerService
from tidemq.broker.topic_registrations import TopicRegistrations
from tidemq.broker.topics import TopicTable
from tidemq.broker.transaction_service import TransactionService
from tidemq.cluster.membership import check_secret
from tidemq.cluster.nameserver import NameServer
from tidemq.cluster.registration import Registration
from tidemq.cluster.security_link import check_cluster_login
from tidemq.cluster.service import NAMESERVER_CODES, NameServerHandlers
from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import (
    ConfigError,
    DiskFull,
    InvalidRequest,
    QueueNotFound,
    TidemqError,
    TopicAlreadyExists,
    TopicNotFound,
)
from tidemq.net.server import ServerConnection, ServerLimits, TcpServer
from tidemq.net.tls import client_context, server_context
from tidemq.protocol.codec import decode_request
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import (
    Empty,
    PopNackRequest,
    PopQueueStatus,
    PopReceiveRequest,
    PopReceiveResponse,
    PopStatusResponse,
    ProduceResponse,
    StatusResponse,
)
from tidemq.protocol.frame import Frame
from tidemq.protocol.replica_messages import ElectLeaderRequest, ElectLeaderResponse
from tidemq.protocol.tier_messages import (
    TierFilesRequest,
    TierFilesResponse,
    TierOffloadRequest,
    TierStatusRequest,
    TierStatusResponse,
)
from tidemq.store.files import FileSystem
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import MessageType

if TYPE_CHECKING:
    from tidemq.broker.tier_service import TierService

__all__ = ["Broker", "listener_ssl_context", "name_server_ssl_context"]

log = logging.getLogger(__name__)

#: How often expired group members and silent brokers are swept.
_SWEEP_INTERVAL_S = 1.0
#: service_state key of the broker's creation time (8 bytes, big-endian epoch ms).
_CREATED_KEY = "broker.created_ms"
#: How often retention runs.
_RETENTION_INTERVAL_S = 60.0

Handler = Callable[[Any, bytes | memoryview], Awaitable[Any]]


def listener_ssl_context(cfg: BrokerConfig) -> ssl.SSLContext | None:
    """The listener's TLS context from the broker.tls_* keys (None: plaintext); a
    ConfigError naming the key when a file is missing or unreadable."""
    if cfg.tls_cert_file is None or cfg.tls_key_file is None:
        return None
    return server_context(
        cert_file=cfg.tls_cert_file,
        key_file=cfg.tls_key_file,
        ca_file=cfg.tls_ca_file,
        client_auth=cfg.tls_client_auth,
    )


def name_server_ssl_context(cfg: BrokerConfig) -> ssl.SSLContext | None:
    """TLS for the broker's connections to its name servers (None: plaintext): trusts
    broker.tls_ca_file (else the system's CAs) and presents the broker's own certificate,
    for name servers that ask for one."""
    if not cfg.name_server_tls_on:
        return None
    try:
        return client_context(
            cfg.tls_ca_file,
            cfg.tls_cert_file,
            cfg.tls_key_file,
            names=("broker.tls_ca_file", "broker.tls_cert_file", "broker.tls_key_file"),
        )
    except ConfigError as exc:
        raise ConfigError(f"TLS to the name servers: {exc}") from None


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
        #: Tiered storage (None: `tiered.url` not set).
        self.tier: TierService | None = None
        self._lock_fd: int | None = None

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
        self._release_lock()

    def _acquire_lock(self) -> None:
        """One broker per data directory: a second one would interleave writes to the same
        log. An advisory lock that the kernel drops when the process dies, even by kill -9."""
        if self._fs is not None:
            return  # a test's simulated file system: no second process can share it
        data_dir = self.config.store.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(
                f"data directory {data_dir} is in use by another tidemq process"
            ) from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        fd = self._lock_fd
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock
            self._lock_fd = None

    async def _start(self) -> str:
        cfg = self.config
        loop = asyncio.get_running_loop()
        # Before anything else: a bad certificate path fails the start at once.
        listener_tls = listener_ssl_context(cfg)
        name_server_tls = None if self._embedded else name_server_ssl_context(cfg)
        self._acquire_lock()
        store = await asyncio.to_thread(
            MessageStore.open, cfg.store, fs=self._fs, clock=self._clock
        )
        self._polling = LongPolling(cfg.max_parked_fetches)
        self._gateway = StoreGateway(store, loop, self._polling.notify)
        if self._replica is not None:
            self._replica.attach(self._gateway)
        self._created_ms = _created_ms(store)
        self._topics = TopicTable(cfg, self._gateway)
        self._compaction = CompactionService(
            self._gateway, self._topics, cfg.compaction_check_interval_ms
        )
        await self._topics.refresh()
        self._timers = TimerService(
            cfg,
            self._gateway,
            self._clock,
            self._topic_has_queue,
            static_writable=self._static_writable,
        )
        self._transactions = TransactionService(cfg, self._gateway, self._clock)
        self._pop = PopService(
            cfg,
            self._gateway,
            polling=self._polling,
            clock=self._clock,
            queues_of=self._hosted_queues,
            ensure_topic=self._ensure_topic,
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
        self._data = DataHandlers(
            cfg,
            self._gateway,
            self._topics,
            self._polling,
            timers=self._timers,
            transactions=self._transactions,
            static=self._static,
        )
        self._key_query, self._origins = self._finders()
        self._special = SpecialHandlers(
            self._timers,
            self._transactions,
            cfg.txn_check_delay_ms,
            static_view=self._static.view,
        )
        self._admin = AdminHandlers(
            cfg,
            self._gateway,
            self._topics,
            self.address,
            static_view=self._static.view,
            register_now=self._register_changes,
        )
        self._admin.connections = lambda: self._server.connections
        if self._embedded:
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
            self._ns_handlers: NameServerHandlers | None = NameServerHandlers(self.nameserver)
            self._topics.on_change = self._topic_changed
            self._register_local()
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
            self._topics.on_change = self._topic_changed
            await self._registration.start()
        self._groups = self._group_handlers()
        self.tier = self._start_tier()
        self._handlers = self._handler_table()
        self._start_background(loop)
        tls = " (TLS)" if listener_tls is not None else ""
        auth = " (SCRAM-SHA-256 authentication)" if cfg.auth_enabled else ""
        log.info("broker %s serving on %s%s%s", cfg.broker_name, self.address, tls, auth)
        return self.address

    def _group_handlers(self) -> GroupHandlers:
        self._offset_pull, self._peer_links = self._start_offset_pull()
        return GroupHandlers(
            self._coordinator,
            self._gateway,
            self._book,
            self._topics,
            remote_counts=self._cluster_queue_counts,
            pop_groups=self._pop.groups,
            offset_pull=self._offset_pull,
        )

    def _start_offset_pull(self) -> tuple[OffsetPull | None, PeerLinks | None]:
        """What takes a group's committed offsets from the other brokers when the group
        moves here (ADR 17); nothing for a broker with its own name server (alone)."""
        if self._embedded:
            return None, None
        cfg, key = self.config, self._cluster_key
        tls = None
        if cfg.tls:
            tls = client_context(
                cfg.tls_ca_file,
                cfg.tls_cert_file,
                cfg.tls_key_file,
                names=("broker.tls_ca_file", "broker.tls_cert_file", "broker.tls_key_file"),
            )
        login = None if key is None else PeerLogin(cfg.broker_name, key, self._clock)
        links = PeerLinks(ssl_context=tls, login=login, timeout_ms=PULL_REQUEST_TIMEOUT_MS)
        pull = OffsetPull(
            self._book,
            peers=self._peer_brokers,
            peer_offsets=links.committed_offsets,
            request_timeout_ms=PULL_REQUEST_TIMEOUT_MS,
        )
        return pull, links

    async def _peer_brokers(self) -> dict[str, str]:
        """The other live brokers, as the name servers list them."""
        live = await self._registration.live_brokers()
        return others(live, self.config.broker_name, self.address)

    def _start_security(self, store: MessageStore) -> None:
        """Logins, producer-id owners and ACLs, from the store."""
        cfg = self.config
        key, clock = self._cluster_key, self._clock
        self._auth = Authenticator(
            cfg,
            self._gateway,
            clock,
            # Other brokers log in with the cluster secret to fetch a group's offsets.
            cluster_login=None if key is None else lambda m: check_cluster_login(key, m, clock),
        )
        self._auth.bootstrap(cfg.bootstrap_user, self._bootstrap_password)
        durable = ProducerOwnerTopic(self._gateway, keep=MAX_PRODUCER_OWNERS)
        self._producer_owners = ProducerOwners(save=durable.save, load=durable.load)
        self._authz = Authorization(
            enabled=cfg.authorization_enabled,
            super_users=self._auth.super_users,
            rows=store.metadata.acls(),
            save=lambda rows, counter: store.metadata.add_acls(rows, counter=counter),
            remove=lambda rows, counter: store.metadata.delete_acls(rows, counter=counter),
            txn_groups=self._transactions.groups_of,
            clock=self._clock,
        )

    def _start_tier(self) -> TierService | None:
        """The tier service, when `tiered.url` is set (its modules need pyarrow and
        obstore, so they are imported only then)."""
        cfg = self.config
        if not cfg.tiered.enabled:
            return None
        try:
            from tidemq.broker.tier_service import TierService  # noqa: PLC0415
        except ImportError as exc:
            raise ConfigError(
                f"tiered.url is set but tiered storage cannot load ({exc}); install "
                "tidemq[server] (pyarrow and obstore)"
            ) from None
        tier = TierService(cfg.tiered, cfg.broker_name, self._gateway, self._topics, self._clock)
        tier.publish_tables = self._tables.publish
        self._data.tier = self._pop.tier = self._static.retired.tier = tier
        return tier

    def _start_background(self, loop: asyncio.AbstractEventLoop) -> None:
        self._tasks.append(loop.create_task(self._sweep()))
        self._tasks.append(loop.create_task(self._retention()))
        self._tasks.append(loop.create_task(self._save_services_periodically()))
        self._tasks.append(loop.create_task(self._compaction.run_forever()))
        if self.tier is not None:
            self._tasks.append(loop.create_task(self.tier.run_forever()))

    async def _tier_status(self, req: TierStatusRequest) -> TierStatusResponse:
        if self.tier is None:
            return TierStatusResponse(enabled=False, broker=self.config.broker_name)
        return await self.tier.status(req)

    async def _tier_offload(self, req: TierOffloadRequest) -> TierStatusResponse:
        self._topics.get(req.topic)  # TopicNotFound
        if self.tier is None:
            raise ConfigError(
                f"broker {self.config.broker_name} has no tiered storage (tiered.url)"
            )
        await self.tier.offload_now(req.topic)
        return await self.tier.status(TierStatusRequest(topic=req.topic))

    async def _tier_files(self, req: TierFilesRequest) -> TierFilesResponse:
        if req.queue >= 0:
            await self._topics.check_queue(req.topic, req.queue)
        else:
            self._topics.get(req.topic)  # TopicNotFound
        if self.tier is None:
            return TierFilesResponse()
        return await self.tier.reads.files(req)

    async def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        await self._server.stop_accepting()
        self._polling.wake_all()
        await self._server.drain(self.config.shutdown_timeout_ms / 1000)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.tier is not None:
            await self.tier.close()
        # A run in the worker process finishes its file (which nothing names: the next
        # start removes it) or is cut short by the timeout; then the worker exits.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.to_thread(self._compaction.close), self.config.shutdown_timeout_ms / 1000
            )
        if self._offset_pull is not None:
            await self._offset_pull.close()
        if self._peer_links is not None:
            self._peer_links.close()
        if not self._embedded:
            await self._registration.stop()
        await self._timers.stop()
        await self._transactions.stop()
        try:
            self._save_services()
        except TidemqError:
            log.exception("could not save the timer and transaction state")
        await self._gateway.close()
        self._release_lock()
        log.info("broker %s stopped", self.config.broker_name)

    async def check_password(self, user: str, password: str, host: str) -> bool:
        """Whether `password` is `user`'s (the HTTP listener's login; see
        `Authenticator.check_password`)."""
        return await self._auth.check_password(user, password, host)

    def set_schema_check(self, check: SchemaCheck | None) -> None:
        """The schema registry's check for topics with schema.validation=true: the node
        that runs the registry beside this broker sets it once both serve."""
        self._data.schema_check = check

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # ------------------------------------------------------------------ timers, transactions

    def _topic_has_queue(self, topic: str, queue: int) -> bool:
        try:
            self._topics.get(topic)
        except TopicNotFound:
            return False
        return queue in self._topics.hosted(topic)

    def _static_writable(self, topic: str, queue: int) -> bool | None:
        """None for a queue of an ordinary topic; for a static queue, whether this broker
        holds its write end (the timer service delivers there only then)."""
        if not self._topics.is_static(topic):
            return None
        try:
            return self._gateway.store.static_writable(topic, queue)
        except (TopicNotFound, QueueNotFound):
            return False

    def _hosted_queues(self, topic: str) -> list[int]:
        """The queues pop consumers of `topic` read here: a static topic's, every queue
        with a link here (each broker pops its own links; on a FIFO topic, a link only
        once the links before it are finished, `static_pop`)."""
        self._topics.get(topic)  # TopicNotFound for an unknown topic
        return self._topics.hosted(topic)

    def _pop_limit(self, group: str, topic: str, queue: int) -> int | None:
        # The static service is made after the pop service, which calls this later.
        return self._static.fifo.limit(group, topic, queue)

    def _logical_offset(self, topic: str, queue: int, offset: int) -> int:
        # The static service is made after the pop service, which calls this later.
        return self._static.logical_offset(topic, queue, offset)

    async def _pop_receive(self, req: PopReceiveRequest) -> tuple[PopReceiveResponse, bytes]:
        fifo = self._static.fifo
        fifo.note(req.group, req.fifo_finished)
        response, body = await self._pop.receive(req)
        response, body = rebase_popped(response, body, self._static.view)
        topics = [s.topic for s in req.subscriptions]
        response.fifo_finished = fifo.reports(req.group, topics, self._pop.finished_below)
        return response, body

    async def _ensure_topic(self, topic: str) -> None:
        """Create an internal per-group topic (%DLQ%<group>) on first use."""
        try:
            self._topics.get(topic)
        except TopicNotFound:
            with contextlib.suppress(TopicAlreadyExists):
                await self._topics.create(topic, 1, hosted=[0])

    async def _start_services(self, store: MessageStore) -> None:
        self._rebuild_services(store)
        self._book = OffsetBook(self._gateway)
        await self._book.start()
        self._tables = MemberTables(self._gateway)
        await self._tables.start()
        self._start_security(store)
        await self._transactions.start()
        self._timers.start()

    def _rebuild_services(self, store: MessageStore) -> None:
        """Before serving: internal topics exist, and the timer and transaction services are
        rebuilt from their saved state, their topics and one scan of the log written since
        (see `system_topics`). Blocking, like the store's own recovery."""
        ensure_internal_topics(store)
        timer_state = store.metadata.service_state("timer")
        txn_state = store.metadata.service_state("transactions")
        pop_state = store.metadata.service_state("pop")
        position = min(
            TimerService.scan_position(timer_state),
            TransactionService.scan_position(txn_state),
            PopService.scan_position(pop_state),
        )
        moved = list(scan_moved(store, position))
        self._timers.rebuild(store, timer_state, moved)
        self._transactions.rebuild(store, txn_state, moved)
        self._pop.rebuild(store, pop_state, moved)
        store.pin_log("services", position)

    def _save_services(self) -> None:
        """Save the services' state, then let retention drop what they no longer need."""
        store = self._gateway.store
        position = store.flushed_position
        timer_state = self._timers.save_state(position)
        txn_state = self._transactions.save_state(position)
        pop_state, pop_offset, pop_position = self._pop.save_state(position)
        store.metadata.save_service_state(
            {"timer": timer_state, "transactions": txn_state, "pop": pop_state}
        )
        store.trim_queue(POP_TOPIC, 0, pop_offset)
        # Each service's scan position is at or before `position` (moves in flight).
        scan = min(
            TimerService.scan_position(timer_state),
            TransactionService.scan_position(txn_state),
            pop_position,
        )
        store.pin_log("services", scan)
        half_low, op_low = self._transactions.low_watermarks
        trims = [
            (TIMER_TOPIC, 0, self._timers.low_watermark),
            (HALF_TOPIC, 0, half_low),
            (OP_TOPIC, 0, op_low),
            (POP_TOPIC, 0, pop_offset),
        ]
        for topic, queue, offset in trims[:3]:
            store.trim_queue(topic, queue, offset)
        if self._replica is not None:  # a replica group's followers keep the same
            self._replica.services_saved(
                {"timer": timer_state, "transactions": txn_state, "pop": pop_state},
                position=position,
                scan_position=scan,
                trims=trims,
            )

    async def _save_services_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.service_checkpoint_interval_ms / 1000)
            try:
                self._save_services()
            except DiskFull:
                pass  # the store logs a full disk once, when it starts and when it ends
            except Exception:
                log.exception("saving the timer and transaction state failed")

    # ------------------------------------------------------------------ registration

    async def _cluster_queue_counts(self, topics: list[str]) -> dict[str, int]:
        if self.nameserver is not None:
            return {r.topic: r.queues for r in self.nameserver.routes(topics)}
        return await self._registration.queue_counts(topics)

    def _finders(self) -> tuple[KeyQueryHandler, OriginLookup]:
        """What finds messages by key, and delayed or transactional ones by id."""
        return (
            KeyQueryHandler(self._gateway, self._topics, self._static),
            OriginLookup(self._gateway, self._timers, self._transactions),
        )

    def metrics(self, *, per_queue: bool = False) -> MetricsSnapshot:
        """Counters and gauges for the HTTP listener's /metrics (on the broker's loop);
        `per_queue` (`http.metrics_per_queue`): also lag and end offset per queue."""
        store = self._gateway.store
        topics = self._topics.names()
        groups = sorted(set(store.groups()) | set(self._coordinator.groups()))
        txns = self._transactions.status()
        traffic = self._data.traffic
        pop = pop_totals(self._pop, topics)
        by_queue: dict[tuple[str, str, int], int] | None = None
        ends: dict[tuple[str, int], int] | None = None
        omitted = 0
        if per_queue:
            by_queue = queue_lag(store, self._topics, self._static.view)
            ends, omitted = queue_ends(store, self._topics, self._static.view)
        now_ms = self._clock.now_ms()
        return MetricsSnapshot(
            traffic={
                name: dataclasses.replace(counts)
                for name, counts in traffic.topics.items()
                if name in topics
            },
            groups=groups,
            lag=consumer_lag(store, self._topics, self._static.view),
            half_messages=sum(t.messages for t in txns.open),
            transactions_committed=txns.committed,
            transactions_rolled_back=txns.rolled_back,
            timer_pending={t.topic: t.pending_messages for t in self._timers.status().topics},
            log_bytes=store.end_position - store.log.start_position,
            request_times={kind: d.copy() for kind, d in self.request_times.kinds.items()},
            pop_in_flight=pop.in_flight,
            pop_dead_lettered=pop.dead_lettered,
            disk=disk_usage(self.config.store.data_dir),
            queue_lag=by_queue,
            queue_end=ends,
            queues_omitted=omitted,
            lag_latency_ms=consumer_lag_latency(store, self._topics, self._static.view, now_ms),
            reserve_time_ms=reserve_time_ms(store, now_ms),
            fsync=self._gateway.fsync_times().copy(),
            group_commit=self._gateway.group_commit_bytes.copy(),
            message_sizes={kind: d.copy() for kind, d in traffic.sizes.items()},
            txn_messages_committed=_existing(self._transactions.messages_committed, topics),
            txn_messages_rolled_back=_existing(self._transactions.messages_rolled_back, topics),
            pop_leases=pop.leases,
            pop_retried=pop.retried,
            topic_number=len(topics),
            replica=None if self._replica is None else self._replica.metrics(),
            **self._tier_metrics(),
        )

    def _tier_metrics(self) -> dict[str, Any]:
        tier = self.tier
        if tier is None:
            return {}
        return {
            "tier_backlog": tier_backlog(self._gateway.store, self._topics),
            "tier_uploaded_bytes": tier.stats.uploaded_bytes,
            "tier_errors": tier.stats.errors,
        }

    def _topic_changed(self, name: str | None) -> None:
        self._registrations.journal.touch(name)
        if self.nameserver is not None:
            self._register_local()
        else:
            self._registration.changed()

    async def _register_now(self) -> None:
        """Register in full now (a static topic's chains changed: not a delta's business),
        returning once the name servers have it, and once the chains are in the group's
        log (`member_tables`)."""
        await self._tables.publish()
        self._registrations.journal.touch(None)
        await self._register_changes()

    async def _register_changes(self) -> None:
        """Send the name servers what changed (a topic created, altered or deleted),
        returning once they have it."""
        if self.nameserver is not None:
            self._register_local()
        else:
            await self._registration.register_once()

    def _register_local(self) -> None:
        assert self.nameserver is not None
        assert self._ns_handlers is not None
        self._registrations.register_local(
            self.nameserver, self.config.broker_name, self.address, created_ms=self._created_ms
        )
        # The embedded name server serves this broker alone: its tables are the cluster's.
        holder = self._ns_handlers.security
        version = self._security.version()
        holder.report(self.config.broker_name, version, 0)
        if version > holder.held:
            holder.offer(self._security.snapshot())

    def _security_changed(self) -> None:
        """Users or ACL entries changed here: tell the name servers now (ADR 15)."""
        if self.nameserver is not None:
            self._register_local()
        else:
            self._registration.changed()

    async def _sweep(self) -> None:
        interval = self.config.broker_heartbeat_interval_ms / 1000
        since_beat = 0.0
        while True:
            await asyncio.sleep(_SWEEP_INTERVAL_S)
            self._coordinator.expire()
            if self.nameserver is not None:
                since_beat += _SWEEP_INTERVAL_S
                if since_beat >= interval:
                    since_beat = 0.0
                    self._register_local()
                self.nameserver.expire()

    async def _retention(self) -> None:
        while True:
            await asyncio.sleep(_RETENTION_INTERVAL_S)
            try:
                deleted = await self._gateway.call(lambda s: s.enforce_retention())
                if deleted:
                    log.info("retention deleted %d commit-log segments", deleted)
                await self._static.prune_expired()
            except Exception:
                log.exception("retention failed")

    # ------------------------------------------------------------------ dispatch

    def _handler_table(self) -> dict[RequestCode, Handler]:
        d, a, g = self._data, self._admin, self._groups

        def plain(fn: Callable[[Any], Awaitable[Any]]) -> Handler:
            async def run(header: Any, body: bytes | memoryview) -> Any:
                return await fn(header)

            return run

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
            RequestCode.STATUS: plain(lambda _: self._status()),
            RequestCode.JOIN_GROUP: plain(g.join),
            RequestCode.HEARTBEAT: plain(g.heartbeat),
            RequestCode.LEAVE_GROUP: plain(g.leave),
            RequestCode.COMMIT_OFFSETS: plain(g.commit),
            RequestCode.FETCH_OFFSETS: plain(g.fetch_offsets),
            RequestCode.LIST_GROUPS: plain(g.list_groups),
            RequestCode.DESCRIBE_GROUP: plain(g.describe),
            RequestCode.RESET_OFFSETS: plain(g.reset),
            RequestCode.CANCEL_DELAYED: plain(self._special.cancel_delayed),
            RequestCode.TIMER_STATUS: plain(self._special.timer_status),
            RequestCode.BEGIN_TXN: plain(self._special.begin),
            RequestCode.END_TXN: plain(self._special.end),
            RequestCode.SINK_MARKER: plain(self._special.sink_marker),
            RequestCode.TXN_STATUS: plain(self._special.txn_status),
            RequestCode.POP_RECEIVE: plain(self._pop_receive),
            RequestCode.POP_ACK: plain(lambda r: self._pop.ack(r.group, r.handles)),
            RequestCode.POP_CHANGE_INVISIBLE: plain(
                lambda r: self._pop.change_invisible(r.group, r.handle, r.invisible_ms)
            ),
            RequestCode.POP_NACK: plain(self._pop_nack),
            RequestCode.POP_STATUS: plain(lambda r: _pop_status(self._pop.status(r.group))),
            RequestCode.POP_RESUME: plain(
                lambda r: self._pop.resume(r.group, r.message_id, r.action)
            ),
            RequestCode.KV_GET: plain(self._compaction.kv_get),
            RequestCode.QUERY_MESSAGES: plain(self._key_query.query),
            RequestCode.COMPACT: plain(self._compaction.compact),
            RequestCode.STATIC_OPEN: plain(self._static.open),
            RequestCode.STATIC_SEAL: plain(self._static.seal),
            RequestCode.STATIC_UPDATE: plain(self._static.update),
            RequestCode.STATIC_TIMERS_TAKE: plain(self._static.take_timers),
            RequestCode.STATIC_TIMERS_ADOPT: plain(self._static.adopt_timers),
            RequestCode.STATIC_TIMERS_HANDED: plain(self._static.timers_handed),
            RequestCode.TIER_STATUS: plain(self._tier_status),
            RequestCode.TIER_FILES: plain(self._tier_files),
            RequestCode.TIER_OFFLOAD: plain(self._tier_offload),
            RequestCode.ELECT_LEADER: plain(self._elect_leader),
            RequestCode.REPLICA_FETCH: plain(self._replica_fetch),
            RequestCode.REPLICA_FILE: plain(self._replica_fetch),
        }

    async def _elect_leader(self, req: ElectLeaderRequest) -> ElectLeaderResponse:
        if self._replica is None:
            raise InvalidRequest("ELECT_LEADER goes to a replica group's leader")
        return await self._replica.elect(req)

    async def _replica_fetch(self, _: object) -> None:
        raise InvalidRequest(
            "REPLICA_FETCH and REPLICA_FILE go to a replica group member's replication listener "
            "(replication.port), not to its client listener"
        )

    async def _status(self) -> StatusResponse:
        """The admin handler's status, with the connection limits and their usage."""
        status = await self._admin.status()
        server_limits, usage = self._server.status()
        limits = {key: getattr(self.config, key) for key in _STATUS_LIMITS}
        # As enforced (at most max_connections).
        limits["max_connections_per_address"] = server_limits["max_connections_per_address"]
        traffic = self._data.traffic.topics.values()
        total, free = disk_usage(self.config.store.data_dir)
        return msgspec.structs.replace(
            status,
            limits=limits,
            usage=usage,
            messages_in=sum(t.messages_in for t in traffic),
            messages_out=sum(t.messages_out for t in traffic),
            bytes_in=sum(t.bytes_in for t in traffic),
            bytes_out=sum(t.bytes_out for t in traffic),
            disk_total_bytes=total,
            disk_free_bytes=free,
            replication=None if self._replica is None else self._replica.status(),
        )

    async def _pop_nack(self, req: PopNackRequest) -> Empty:
        await self._pop.nack(
            req.group,
            req.handle,
            req.delay_ms,
            release=req.release,
            reason=req.reason,
            max_attempts=req.max_attempts,
            on_exhausted=req.on_exhausted,
        )
        return Empty()

    async def _dispatch(self, frame: Frame, conn: ServerConnection) -> tuple[Any, bytes]:
        auth = self._auth
        if auth.enabled and conn.principal is None:
            # Before login only SASL_HANDSHAKE and SASL_AUTHENTICATE are served.
            return await auth.before_login(frame, conn), b""
        code, header = decode_request(frame)
        if is_peer(conn.principal):
            # Another broker, logged in with the cluster secret: one request, no ACLs.
            return await self._groups.fetch_offsets(check_peer_request(code, header)), b""
        authz = self._authz
        if authz.enabled:
            authz.check(code, header, conn.principal, conn.host)
            if code is RequestCode.CANCEL_DELAYED:
                self._authorize_cancel(header.message_id, conn)
        if code in AUTH_CODES:
            return await auth.after_login(code, header, conn), b""
        if code in ACL_CODES:
            return await self._acl_request(code, header), b""
        principal = conn.principal
        if authz.enabled and code is RequestCode.GET_ROUTES:
            header.known = authz.route_token(header.known, principal, conn.host)
        if (
            principal is not None
            and code is RequestCode.PRODUCE
            and header.producer_id >= 0
            and not self._producer_owners.known(header.producer_id, principal)
        ):
            await self._producer_owners.check(header.producer_id, principal)
        started = time.perf_counter()
        try:
            answer, body = await self._serve(code, header, frame, conn)
        finally:
            self.request_times.observe(code.name, time.perf_counter() - started)
        if principal is not None and code is RequestCode.INIT_PRODUCER:
            await self._producer_owners.issued(answer.producer_id, principal)
        if authz.enabled and code in FILTERED_CODES:
            answer = authz.filter(code, header, answer, principal, conn.host)
            if code is RequestCode.GET_ROUTES:
                answer.generation = authz.route_token(answer.generation, principal, conn.host)
        return answer, body

    def _answer_now(self, frame: Frame, conn: ServerConnection) -> ProduceResponse | None:
        """A request answered from the protocol callback, with no task, when it needs no
        waiting (`DataHandlers.produce_now`): a PRODUCE, with no authentication and no
        ACLs to check (those go through `_dispatch`). None: `_dispatch` serves it."""
        if (
            frame.code != RequestCode.PRODUCE
            or self._auth.enabled
            or self._authz.enabled
            or not self._gateway.appends_at_once
        ):
            return None
        started = time.perf_counter()
        _, header = decode_request(frame)
        answer = self._data.produce_now(header, frame.body)
        if answer is not None:
            self.request_times.observe("PRODUCE", time.perf_counter() - started)
        return answer

    def _authorize_cancel(self, message_id: str, conn: ServerConnection) -> None:
        """WRITE on the topic of the delayed message a cancel names (an id unknown here is
        answered UnknownMessage by the cancel itself)."""
        topic = self._timers.topic_of(message_id)
        if topic is not None:
            self._authz.check_cancel(conn.principal, conn.host, topic)

    async def _acl_request(self, code: RequestCode, header: Any) -> Any:
        """ACL_CREATE / ACL_DELETE / ACL_LIST (authorized like any request above; with
        authorization off, anyone logged in, or anyone, may prepare entries)."""
        authz = self._authz
        if code is RequestCode.ACL_LIST:
            return authz.listed(header)
        if code is RequestCode.ACL_CREATE:
            return await self._gateway.call(lambda _: authz.create(header))
        return await self._gateway.call(lambda _: authz.delete(header))

    async def _serve(
        self, code: RequestCode, header: Any, frame: Frame, conn: ServerConnection
    ) -> tuple[Any, bytes]:
        if code in NAMESERVER_CODES:
            if self._ns_handlers is None:
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
            return self._ns_handlers.handle(code, header), b""
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
                self._authz.check_read(code, conn.principal, conn.host, answer.topic)
            return answer, body
        result = await self._handlers[code](header, frame.body)
        if isinstance(result, tuple):
            return result
        return result, b""


#: Name-server requests an embedded name server never takes from a connection.
_SELF_REGISTERED = frozenset(
    {
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.SECURITY_PUSH,
        RequestCode.SECURITY_PULL,
    }
)

#: The limits the STATUS answer reports, by their config key (`broker.<key>`).
_STATUS_LIMITS = (
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


def server_limits(cfg: BrokerConfig) -> ServerLimits:
    return ServerLimits(
        max_frame_bytes=cfg.max_frame_bytes,
        max_in_flight=cfg.max_in_flight_requests,
        max_connections=cfg.max_connections,
        max_connections_per_address=min(cfg.max_connections_per_address, cfg.max_connections),
        frame_read_timeout_ms=cfg.frame_read_timeout_ms,
        idle_timeout_ms=cfg.connection_idle_timeout_ms,
        login_timeout_ms=cfg.login_timeout_ms,
        write_stall_timeout_ms=cfg.write_stall_timeout_ms,
        write_buffer_high_bytes=cfg.write_buffer_high_bytes,
        max_response_bytes=cfg.max_response_bytes,
        max_response_bytes_per_connection=cfg.max_response_bytes_per_connection,
        max_response_bytes_per_address=cfg.max_response_bytes_per_address,
        max_inbound_bytes=cfg.max_inbound_bytes,
        requests_per_turn=cfg.requests_per_turn,
    )


def _created_ms(store: MessageStore) -> int:
    """When this broker's data directory was first used (epoch ms), saved on first start:
    the name servers make the oldest live broker the security writer when the role is
    free (ADR 15, ADR 20)."""
    saved = store.metadata.service_state(_CREATED_KEY)
    if saved is not None and len(saved) == 8:
        return int.from_bytes(saved, "big")
    created = time.time_ns() // 1_000_000
    store.metadata.save_service_state({_CREATED_KEY: created.to_bytes(8, "big")})
    return created


async def _pop_status(queues: list[PopQueueStatus]) -> PopStatusResponse:
    return PopStatusResponse(queues=queues)


def _existing(counts: Mapping[str, int], topics: Collection[str]) -> dict[str, int]:
    """The counts of the topics that still exist (a deleted topic's series end)."""
    return {topic: n for topic, n in counts.items() if topic in topics}
