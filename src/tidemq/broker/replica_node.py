"""A broker as a member of a replica group (`tidemq broker --group NAME --etcd URL`,
docs/design/replication.md).

The member always runs its election (etcd) and its replication listener (REPLICA_FETCH,
on `replication.port`, published in etcd with the leader record). In between elections
it has one of two roles, one after the other, never both:

* **Follower.** It opens its store itself and copies the leader's log
  (`replica_follower.py`). It serves no client: clients reach the group through the
  name servers, where only the leader registers.
* **Leader.** Once elected it closes that store and runs a whole `Broker` on the same
  data directory, under the group's name (so message ids and routes do not change with
  the leader), with the leader's side of replication (`replica_leader.py`) holding every
  acknowledgement to the group's committed position. When it stops leading (lease lost,
  deposed) the broker stops, its waiting appends fail, and the member follows again,
  cutting whatever the new leader does not have.

A member outside the group's in-sync set does not campaign (unless
`replication.unclean_election`): it may lack acknowledged records.

What runs beside it (the HTTP listener, `tidemq.cli.replica_http`) learns of each new
broker through `on_broker`, and reads the member's figures in either role through
`replica_metrics()` (a follower's) or the broker's own `metrics()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from tidemq.broker.broker import Broker, server_limits
from tidemq.broker.config import BrokerConfig
from tidemq.broker.replica_follower import ReplicaFaults, ReplicaFollower
from tidemq.broker.replica_leader import ReplicaLeader
from tidemq.broker.replica_metrics import ReplicaMetrics, ReplicaRole
from tidemq.broker.thread_calls import finish_in_thread
from tidemq.cluster.election import Election, ElectionConfig, ElectionStatus
from tidemq.cluster.election_state import State
from tidemq.cluster.etcd_client import Delete, EtcdClient, Put, ValueIs
from tidemq.cluster.group_keys import GroupKeys, LeaderRecord
from tidemq.cluster.in_sync import read_in_sync, write_in_sync
from tidemq.cluster.membership import check_secret
from tidemq.cluster.security_link import check_cluster_login
from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import ConfigError, EtcdUnavailable, InvalidRequest, NotLeader, TidemqError
from tidemq.net.login import LoginGate
from tidemq.net.server import ServerConnection, TcpServer
from tidemq.net.tls import is_loopback
from tidemq.protocol.codec import decode_request
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.frame import Frame
from tidemq.store.epoch_file import EpochHistory
from tidemq.store.files import OsFileSystem
from tidemq.store.message_store import MessageStore

__all__ = ["ReplicaNode"]

log = logging.getLogger(__name__)

#: How long a role waits on the election between two looks (it wakes on every change).
_ROLE_WAIT_S: Final = 60.0
#: Pause before trying to lead again after a start as leader failed.
_LEAD_RETRY_S: Final = 1.0
#: How long a handover's preferred member has to take over before any member may.
HANDOVER_TTL_S: Final = 10


class ReplicaNode:
    def __init__(
        self,
        config: BrokerConfig,
        *,
        clock: Clock | None = None,
        cluster_secret: str | None = None,
        bootstrap_password: str | None = None,
        on_broker: Callable[[Broker], None] | None = None,
        faults: ReplicaFaults | None = None,
    ) -> None:
        """`bootstrap_password`: for each broker it runs as leader (`Broker`'s).
        `on_broker(broker)`: called with each broker as soon as it has started, before
        any other await (a member that leads, follows and leads again runs a new broker
        each time). `faults`: fault injection for tests (`tidemq.testing.replication`)."""
        rep = config.replication
        if not rep.enabled:
            raise ConfigError("a replica group member needs replication.group")
        if config.port == 0 and config.advertised_address is None:
            raise ConfigError(
                "a replica group member needs a fixed broker.port (or advertised_address): "
                "it is published in etcd before the member serves"
            )
        if config.store.flush_mode.value != "sync":
            raise ConfigError("replication needs store.flush_mode = sync (not built for async)")
        self.config = config
        self.member = config.broker_name
        self.address = config.advertised_address or f"{config.host}:{config.port}"
        self._clock = clock or SystemClock()
        self._secret = cluster_secret
        self._bootstrap_password = bootstrap_password
        self._on_broker = on_broker
        #: With a cluster secret, followers log in to the replication listener with it
        #: (the log holds every message: nobody else may read it).
        self._key = None if cluster_secret is None else check_secret(cluster_secret)
        self._faults = faults
        self.replication_address = ""
        self.broker: Broker | None = None
        self.follower: ReplicaFollower | None = None
        self.leader: ReplicaLeader | None = None
        self._store: MessageStore | None = None
        self._follow_task: asyncio.Task[None] | None = None
        self._roles_task: asyncio.Task[None] | None = None
        self._lock_fd: int | None = None
        self._etcd = EtcdClient(list(rep.etcd))
        self._server = TcpServer(
            self._dispatch, server_limits(config), auth_required=self._key is not None
        )
        self._gate = None if self._key is None else self._login_gate(self._key)
        data_dir = config.store.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self._history = EpochHistory(OsFileSystem(), data_dir)
        self.election: Election | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Join the group; returns the address clients dial while this member leads."""
        cfg = self.config
        host, port = await self._server.start(cfg.host, cfg.replication.port)
        self.replication_address = f"{host}:{port}"
        if self._key is None and not is_loopback(cfg.host):
            log.warning(
                "the replication listener on %s takes any connection (no cluster secret): "
                "anyone who reaches it can read every message; set TIDEMQ_CLUSTER_SECRET",
                self.replication_address,
            )
        await self._etcd.connect()
        self.election = Election(
            self._etcd,
            ElectionConfig(
                group=cfg.replication.group,
                member=self.member,
                address=self.address,
                replication_address=self.replication_address,
                lease_ttl_s=cfg.replication.lease_ttl_s,
                prefix=cfg.replication.etcd_prefix,
            ),
            clock=self._clock,
            faults=self._faults,
            eligible=self._eligible,
        )
        await self._follow()
        self.election.start()
        self._roles_task = asyncio.get_running_loop().create_task(self._roles())
        log.info(
            "member %s of group %s: replication on %s",
            self.member,
            cfg.replication.group,
            self.replication_address,
        )
        return self.address

    async def stop(self) -> None:
        """Leave the group: a leader resigns (so another member takes over at once) and
        stops its broker; a follower closes its store."""
        if self._roles_task is not None:
            self._roles_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._roles_task
        if self.election is not None:
            await self.election.resign()
        await self._stop_leading()
        await self._stop_following()
        await self._server.stop_accepting()
        await self._server.drain(1.0)
        await self._etcd.close()

    # ------------------------------------------------------------------ roles

    async def _roles(self) -> None:
        election = self.election
        assert election is not None
        while True:
            status = await _wait_for(election, lambda s: s.state in (State.LEADER, State.STOPPED))
            if status.state is State.STOPPED:
                return
            try:
                await self._lead(election)
            except Exception as exc:
                # A leader key nobody serves would keep the group leaderless: give it up
                # so another member can lead, and follow meanwhile.
                log.warning("member %s could not lead: %s", self.member, exc, exc_info=True)
                with contextlib.suppress(TidemqError):
                    await election.step_down()
                await asyncio.sleep(_LEAD_RETRY_S)
            finally:
                await self._stop_leading()
                await self._follow()

    async def _lead(self, election: Election) -> None:
        record = election.leader_record
        follower = self.follower
        committed = follower.committed if follower is not None else 0
        await self._stop_following()
        keys = election.keys
        found = await read_in_sync(self._etcd, keys)
        members = set(found.members if found is not None else ()) | {self.member}
        # The leader before lost its lease (dead, paused or cut off): it holds nothing of
        # this epoch, and left in the set it would hold every acknowledgement until the
        # lag limit. It rejoins once it has caught up, as any member does.
        if follower is not None and follower.last_leader not in ("", self.member):
            members.discard(follower.last_leader)
        await write_in_sync(self._etcd, keys, record, members)
        await self._clear_preferred(keys)

        async def write(chosen: list[str]) -> None:
            await write_in_sync(self._etcd, keys, record, chosen)

        self.leader = ReplicaLeader(
            self.config.replication,
            record=record,
            history=self._history,
            in_sync=tuple(sorted(members)),
            committed=committed,
            write_in_sync=write,
            is_leader=election.is_leader,
            clock=self._clock,
            hand_over=self._hand_over,
        )
        broker = Broker(
            replace(self.config, broker_name=self.config.replication.group),
            clock=self._clock,
            cluster_secret=self._secret,
            bootstrap_password=self._bootstrap_password,
            replica=self.leader,
        )
        await broker.start()
        self.broker = broker
        if self._on_broker is not None:
            self._on_broker(broker)
        log.info(
            "member %s leads group %s under epoch %d, serving on %s",
            self.member,
            self.config.replication.group,
            record.epoch,
            broker.address,
        )
        await _wait_for(election, lambda s: s.state is not State.LEADER)

    async def _stop_leading(self) -> None:
        # Both let go at once: while the replica leader closes (it refuses every append
        # from then on), this member no longer counts as running the group's broker,
        # which the next leader may already run.
        leader, self.leader = self.leader, None
        broker, self.broker = self.broker, None
        if leader is not None:
            await leader.close()
        if broker is not None:
            await broker.stop()

    async def _follow(self) -> None:
        if self._follow_task is not None:
            return
        self._lock()
        try:
            # A cancellation (the member is stopping) waits for the open and closes it.
            store = await finish_in_thread(
                lambda: MessageStore.open(self.config.store, clock=self._clock),
                discard=MessageStore.close,
            )
        except BaseException:
            self._unlock()
            raise
        self._store = store
        # Opening may have wiped an interrupted start-over, the epoch file with it.
        self._history = EpochHistory(OsFileSystem(), self.config.store.data_dir)
        self.follower = ReplicaFollower(
            self.config.replication,
            member=self.member,
            store=store,
            history=self._history,
            leader=self.leader_record,
            leader_changed=self._leader_changed,
            faults=self._faults,
            cluster_key=self._key,
            clock=self._clock,
            compaction_interval_ms=self.config.compaction_check_interval_ms,
        )
        self._follow_task = asyncio.get_running_loop().create_task(self.follower.run())

    async def _stop_following(self) -> None:
        task, self._follow_task = self._follow_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # The follower's store, not the one opened: a start-over replaces it.
        follower = self.follower
        store, self._store = self._store, None
        if follower is not None and store is not None:
            store = follower.store
        if store is not None:
            store.close()
        self._unlock()

    async def _hand_over(self, member: str) -> None:
        """Name `member` the next leader (a key on a short lease: no other member
        campaigns while it lasts) and step down."""
        election = self.election
        assert election is not None
        lease = await self._etcd.grant_lease(HANDOVER_TTL_S)
        await self._etcd.txn(
            compare=[], success=[Put(election.keys.preferred, member.encode(), lease.id)]
        )
        log.info("member %s hands group %s over to %s", self.member, election.keys.group, member)
        await election.step_down()

    async def _clear_preferred(self, keys: GroupKeys) -> None:
        """A handover to this member is done: let every member campaign again."""
        with contextlib.suppress(EtcdUnavailable):
            await self._etcd.txn(
                compare=[ValueIs(keys.preferred, self.member.encode())],
                success=[Delete(keys.preferred)],
            )

    def leader_record(self) -> LeaderRecord | None:
        """The group's leader as the election last saw it (None: none known)."""
        election = self.election
        return None if election is None else election.status.leader

    def replica_metrics(self) -> ReplicaMetrics:
        """The member's figures while no broker runs: a follower's, or, between two
        roles, its role and the leader's epoch alone. (Leading, they are part of
        `broker.metrics()`.)"""
        if self._follow_task is not None and self.follower is not None:
            return self.follower.metrics()
        leader = self.leader_record()
        return ReplicaMetrics(
            group=self.config.replication.group,
            member=self.member,
            role=ReplicaRole.NONE,
            epoch=0 if leader is None else leader.epoch,
        )

    async def _leader_changed(self, record: LeaderRecord) -> None:
        """Returns once the election names a leader other than `record` (or none)."""
        election = self.election
        assert election is not None
        await _wait_for(election, lambda s: s.leader != record)

    async def _eligible(self) -> bool:
        """In the group's in-sync set (or no set yet: a new group), or unclean election;
        never while starting over (its store is being replaced: nothing to lead with)."""
        follower = self.follower
        if follower is not None and follower.starting_over:
            return False
        if self.config.replication.unclean_election:
            return True
        election = self.election
        assert election is not None
        try:
            preferred = await self._etcd.get(election.keys.preferred)
            if preferred is not None and preferred.value != self.member.encode():
                return False  # a handover to another member is under way
            found = await read_in_sync(self._etcd, election.keys)
        except EtcdUnavailable:
            return False
        return found is None or self.member in found.members

    # ------------------------------------------------------------------ serving followers

    def _login_gate(self, key: bytes) -> LoginGate:
        clock = self._clock
        return LoginGate(
            lambda _: None,  # no users: members only
            mock_secret=os.urandom(32),
            clock=clock,
            what="replication listener",
            cluster_login=lambda message: check_cluster_login(key, message, clock),
        )

    async def _dispatch(self, frame: Frame, conn: ServerConnection) -> tuple[Any, bytes]:
        if self._gate is not None and conn.principal is None:
            return await self._gate.before_login(frame, conn), b""
        code, header = decode_request(frame)
        if code not in (RequestCode.REPLICA_FETCH, RequestCode.REPLICA_FILE):
            raise InvalidRequest(
                f"the replication listener serves REPLICA_FETCH and REPLICA_FILE, not {code.name}"
            )
        leader = self.leader
        if leader is None:
            raise NotLeader(
                f"member {self.member} of group {self.config.replication.group} does not lead",
                group=self.config.replication.group,
            )
        if code is RequestCode.REPLICA_FILE:
            return await leader.fetch_file(header)
        return await leader.fetch(header)

    # ------------------------------------------------------------------ the data directory

    def _lock(self) -> None:
        """One process per data directory (as `Broker` does while it runs)."""
        data_dir = self.config.store.data_dir
        fd = os.open(data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(f"data directory {data_dir} is in use by another process") from None
        self._lock_fd = fd

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)


async def _wait_for(
    election: Election, predicate: Callable[[ElectionStatus], bool]
) -> ElectionStatus:
    """The first election status that satisfies `predicate`, however long it takes (a
    member may lead or follow for months); woken by every change."""
    while True:
        with contextlib.suppress(TimeoutError):
            return await election.wait_for(predicate, timeout_s=_ROLE_WAIT_S)
