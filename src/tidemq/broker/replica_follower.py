"""The follower's side of a replica group: pull the leader's commit log by position,
append it at the same positions, flush, and report back (docs/design/replication.md).

One loop per follower, on the member's event loop, owning the member's store while the
member follows (nothing else touches it then). Each round is one REPLICA_FETCH carrying
this log's end and flushed position (the report the leader computes its committed
position and in-sync set from), answered with the records past that end, or, when the
two logs stopped agreeing, with the position to cut at (`ReplicaView.truncate`).

Failures never stop the loop: a leader that cannot be reached, answers NotLeader, or
is replaced in etcd is asked again (after `_RETRY_MS`) once the election names a leader.
A fetch waiting on a leader the election has replaced is given up at once: that leader
may never answer (cut off by a partition, or paused), and the next one needs this
member's reports to commit anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

from tidemq.broker.compaction_runner import CompactionRunner
from tidemq.broker.member_tables import catch_up
from tidemq.broker.metrics import disk_usage
from tidemq.broker.replica_metrics import ReplicaMetrics, ReplicaRole
from tidemq.broker.replica_start_over import StartOverFailed, restart_empty, start_over_at
from tidemq.broker.replication_config import ReplicationConfig
from tidemq.broker.service_state_cut import drop_states_past
from tidemq.broker.thread_calls import finish_in_thread
from tidemq.cluster.election import ElectionFaults
from tidemq.cluster.group_keys import LeaderRecord
from tidemq.cluster.security_link import cluster_login
from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import NotLeader, TidemqError
from tidemq.net.client import ClientConnection
from tidemq.net.tasks import cancel_and_wait
from tidemq.protocol.replica_messages import (
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ReplicaFileRequest,
    ReplicaServiceState,
    ReplicaTopic,
)
from tidemq.store.epoch_file import EpochEntry, EpochHistory
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import CleanupPolicy, MessageType, TopicInfo
from tidemq.store.replica_log import LogChunk, TopicsBehind

__all__ = ["ReplicaFaults", "ReplicaFollower"]

log = logging.getLogger(__name__)

#: Pause after a failed round before the next.
_RETRY_MS: Final = 200
#: Room for a frame's header on top of the largest chunk.
_FRAME_SLACK_BYTES: Final = 1 << 20
#: How often a follower applies retention to its own log (as a broker does).
_RETENTION_INTERVAL_S: Final = 60.0
#: The longest the login to the leader's replication listener may take.
_LOGIN_TIMEOUT_S: Final = 10.0
#: A fetch answer may take the leader's wait plus this.
_ANSWER_SLACK_S: Final = 10.0


class ReplicaFaults(ElectionFaults, Protocol):
    """Fault injection for tests (`tidemq.testing.replication` ships one): production
    code passes none. `fetch_held` is asked before each fetch round and again when its
    answer arrives (a follower cut off from its leader: an answer already on its way is
    lost too)."""

    def fetch_held(self) -> bool: ...

    def start_over_step(self, step: str) -> None:
        """Called (on a worker thread) before each step of a start-over
        (`store.start_over.start_over`): a test may hold it there, to kill the process."""


def apply_service_state(store: MessageStore, state: ReplicaServiceState) -> None:
    """Keep the leader's saved service state as this member's own (a promoted member's
    broker resumes its services from it), trim the internal queues as the leader did,
    and keep the log from where the services would rescan it."""
    store.metadata.save_service_state(state.states)
    for topic, queue, offset in state.trims:
        with contextlib.suppress(TidemqError):  # a topic not mirrored yet: next time
            store.trim_queue(topic, queue, offset)
    store.pin_log("services", state.scan_position)


def topic_info(t: ReplicaTopic) -> TopicInfo:
    return TopicInfo(
        id=t.id,
        name=t.name,
        queues=t.queues,
        message_type=MessageType(t.message_type),
        cleanup_policy=CleanupPolicy(t.cleanup_policy),
        retention_ms=t.retention_ms,
        retention_bytes=t.retention_bytes,
        config=dict(t.config),
        created_ms=t.created_ms,
    )


class ReplicaFollower:
    def __init__(
        self,
        config: ReplicationConfig,
        *,
        member: str,
        store: MessageStore,
        history: EpochHistory,
        leader: Callable[[], LeaderRecord | None],
        leader_changed: Callable[[LeaderRecord], Awaitable[None]] | None = None,
        faults: ReplicaFaults | None = None,
        cluster_key: bytes | None = None,
        clock: Clock | None = None,
        compaction_interval_ms: int = 15_000,
    ) -> None:
        """`leader()`: the leader the election names now. `leader_changed(record)`:
        returns once it names another than `record` (a fetch still waiting on `record`
        is then given up; without it, a fetch waits for its answer or its timeout).
        `cluster_key`: log in to the leader's replication listener with the cluster
        secret. `compaction_interval_ms`: how often the follower compacts its own copy
        of the compact topics (below the committed position), as a broker does."""
        self._config = config
        self._faults = faults
        self._key = cluster_key
        self._clock = clock or SystemClock()
        self._member = member
        self._store = store
        self._history = history
        self._leader = leader
        self._leader_changed = leader_changed
        #: The leader's committed position as last heard (a promoted member starts there).
        self.committed = 0
        #: Rounds answered, and truncations done (for tests and status).
        self.rounds = 0
        self.truncations = 0
        #: The member this one last followed ("" before any).
        self.last_leader = ""
        #: The leader's log end at its last answer, and when that came (monotonic ms);
        #: None before the first answer.
        self.leader_end: int | None = None
        self._answered_ms: float | None = None
        self._topics_version = -1
        self._state_version = -1
        #: The leader's service state received and not applied yet (its position is
        #: past this log's end or the committed position), and the version applied.
        self._pending_state: ReplicaServiceState | None = None
        self.state_applied = 0
        self._retention_due = time.monotonic() + _RETENTION_INTERVAL_S
        self._compaction = CompactionRunner(lambda: self._store, compaction_interval_ms)
        #: Starting over now (never elected meanwhile), and start-overs done.
        self.starting_over = False
        self.start_overs = 0

    @property
    def store(self) -> MessageStore:
        return self._store

    def metrics(self) -> ReplicaMetrics:
        """Its figures for the member's `/metrics` while it follows."""
        store = self._store
        leader = self._leader()
        # No leader now: the newest epoch its log holds.
        latest = leader or self._history.latest
        epoch = 0 if latest is None else latest.epoch
        end = store.end_position
        answered = self._answered_ms
        return ReplicaMetrics(
            group=self._config.group,
            member=self._member,
            role=ReplicaRole.FOLLOWER,
            epoch=epoch,
            log_end=end,
            durable=store.flushed_position,
            committed=self.committed,
            lag_bytes=None if self.leader_end is None else max(0, self.leader_end - end),
            fetch_age_s=(
                None if answered is None else (self._clock.monotonic_ms() - answered) / 1000
            ),
            fetch_rounds=self.rounds,
            truncations=self.truncations,
            log_bytes=end - store.log.start_position,
            disk=disk_usage(store.config.data_dir),
        )

    async def run(self) -> None:
        """Follow whichever member etcd names leader, until cancelled; meanwhile compact
        the committed part of the log."""
        compaction = asyncio.get_running_loop().create_task(self._compaction.run_forever())
        try:
            await self._follow_leaders()
        finally:
            await cancel_and_wait(compaction)
            await finish_in_thread(self._compaction.close)

    async def _follow_leaders(self) -> None:
        while True:
            leader = self._leader()
            if leader is None or leader.member == self._member or not leader.replication_address:
                await asyncio.sleep(_RETRY_MS / 1000)
                continue
            self.last_leader = leader.member
            try:
                await self._follow(leader)
            except TidemqError as exc:
                log.info(
                    "group %s member %s: following %s: %s",
                    self._config.group,
                    self._member,
                    leader.member,
                    exc,
                )
            await asyncio.sleep(_RETRY_MS / 1000)

    async def _follow(self, leader: LeaderRecord) -> None:
        conn = await ClientConnection.open(
            leader.replication_address,
            max_frame_bytes=self._config.fetch_max_bytes + _FRAME_SLACK_BYTES,
            connect_timeout_s=2.0,
        )
        self._topics_version = self._state_version = -1  # a new leader's are its own
        try:
            if self._key is not None:
                await cluster_login(conn, self._member, self._key, self._clock, _LOGIN_TIMEOUT_S)
            while self._leader() == leader:
                if self._faults is not None and self._faults.fetch_held():
                    await asyncio.sleep(_RETRY_MS / 1000)
                    continue
                await self._round(conn, leader)
        finally:
            conn.close()

    async def _round(self, conn: ClientConnection, leader: LeaderRecord) -> None:
        store, history = self._store, self._history
        latest = history.latest
        request = ReplicaFetchRequest(
            group=self._config.group,
            member=self._member,
            epoch=leader.epoch,
            position=store.end_position,
            durable=store.flushed_position,
            last_epoch=-1 if latest is None else latest.epoch,
            max_bytes=self._config.fetch_max_bytes,
            max_wait_ms=self._config.fetch_wait_ms,
            topics_version=self._topics_version,
            state_version=self._state_version,
        )
        answer, body = await self._ask(conn, request, leader)
        if self._faults is not None and self._faults.fetch_held():
            return  # cut off while the answer travelled: it never arrives
        self.rounds += 1
        self.leader_end = answer.leader_end
        self._answered_ms = self._clock.monotonic_ms()
        if 0 <= answer.diverged_at < store.log.start_position:
            log.warning(
                "group %s member %s: log differs from leader %s's from %d on, below this "
                "log's start %d (its retention deleted the cut point): starting over",
                self._config.group,
                self._member,
                leader.member,
                answer.diverged_at,
                store.log.start_position,
            )
            async with self._compaction.lock:
                self._store = await restart_empty(store, history, clock=self._clock)
            self.truncations += 1
            return
        if answer.diverged_at >= 0:
            log.warning(
                "group %s member %s: log differs from leader %s's from %d on (end %d): cut",
                self._config.group,
                self._member,
                leader.member,
                answer.diverged_at,
                store.end_position,
            )
            store.replica.truncate(answer.diverged_at)
            history.truncate_to(answer.diverged_at)
            dropped = drop_states_past(store, answer.diverged_at)
            if dropped:
                log.info("group %s member %s: saved states of %s were past the cut: dropped",
                         self._config.group, self._member, ", ".join(dropped))  # fmt: skip
            self.truncations += 1
            return
        if answer.topics is not None:
            store.replica.mirror_topics([topic_info(t) for t in answer.topics], answer.max_topic_id)
            store.metadata.note_producer_id(answer.last_producer_id)
            self._topics_version = answer.topics_version
        if answer.start_over is not None:
            await self._start_over(conn, answer, leader)
            return
        if body:
            try:
                store.replica.append_chunk(LogChunk(answer.position, body, answer.records))
            except TopicsBehind:
                self._topics_version = -1  # the next answer carries the table
                return
            # The fdatasync off the loop: the member's other tasks (the election's
            # keep-alives) must not wait for the disk. A cancellation (the member
            # stops following, then closes the store) waits for it to end.
            await finish_in_thread(store.flush)
        entries = [
            EpochEntry(e.epoch, e.start_position)
            for e in answer.epochs
            if e.start_position <= store.end_position
        ]
        if entries != history.entries:
            history.replace(entries)
        self.committed = max(self.committed, min(answer.committed, store.end_position))
        # What compaction may take: only records no election can cut.
        store.commit_limit = self.committed
        if answer.state is not None:
            self._pending_state = answer.state
            self._state_version = answer.state.version
        self._apply_state()
        # The leader's tier ranges and static chains, as far as committed: this member's
        # retention of offloaded topics follows the leader's remote ends.
        catch_up(store)
        if store.checkpoint_due():
            with contextlib.suppress(TidemqError):
                store.checkpoint()
        if time.monotonic() >= self._retention_due:
            self._retention_due = time.monotonic() + _RETENTION_INTERVAL_S
            # Topics' own limits, and the internal queues' trims mirrored from the
            # leader (a follower without them would keep every segment).
            with contextlib.suppress(TidemqError):
                store.enforce_retention()

    async def _start_over(
        self, conn: ClientConnection, answer: ReplicaFetchResponse, leader: LeaderRecord
    ) -> None:
        """This log ends below the leader's log start: start over there
        (`replica_start_over.start_over_at`). Not electable meanwhile."""
        assert answer.start_over is not None
        log.warning(
            "group %s member %s: log ends at %d, below leader %s's log start %d: starting "
            "over there",
            self._config.group,
            self._member,
            self._store.end_position,
            leader.member,
            answer.start_over.position,
        )
        base = ReplicaFileRequest(
            group=self._config.group,
            member=self._member,
            epoch=leader.epoch,
            topic_id=0,
            queue_id=0,
            generation=0,
            offset=0,
            max_bytes=self._config.fetch_max_bytes,
        )
        self.starting_over = True
        try:
            self._store, position = await start_over_at(
                conn,
                answer,
                base,
                self._store,
                self._history,
                lock=self._compaction.lock,
                clock=self._clock,
                step=None if self._faults is None else self._faults.start_over_step,
            )
        except StartOverFailed as failed:
            self._store = failed.store
            raise
        finally:
            self.starting_over = False
        self.start_overs += 1
        self.committed = min(self.committed, position)
        self._store.commit_limit = self.committed
        self._topics_version = self._state_version = -1  # the table and state again

    async def _ask(
        self, conn: ClientConnection, request: ReplicaFetchRequest, leader: LeaderRecord
    ) -> tuple[ReplicaFetchResponse, bytes]:
        """The leader's answer to `request`; NotLeader as soon as the election names
        another leader first (this one may never answer: partitioned, or paused)."""
        asked = asyncio.ensure_future(
            conn.request(
                request,
                ReplicaFetchResponse,
                timeout_s=self._config.fetch_wait_ms / 1000 + _ANSWER_SLACK_S,
            )
        )
        if self._leader_changed is None:
            return await asked
        moved = asyncio.ensure_future(self._leader_changed(leader))
        try:
            await asyncio.wait({asked, moved}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (asked, moved):
                task.cancel()
        if asked.done() and not asked.cancelled():
            return asked.result()
        raise NotLeader(
            f"group {self._config.group}: the election replaced {leader.member} (epoch "
            f"{leader.epoch}) while this member's fetch waited; following the next leader",
            group=self._config.group,
        )

    def _apply_state(self) -> None:
        """Apply the pending service state once it holds for this log: the log reaches
        its position, and so does the committed position (records past it could still
        be cut, and the state might count them)."""
        state = self._pending_state
        if state is None:
            return
        if state.position <= min(self._store.end_position, self.committed):
            apply_service_state(self._store, state)
            self.state_applied = state.version
            self._pending_state = None
