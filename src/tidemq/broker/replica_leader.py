"""The leader's side of a replica group: serve followers' REPLICA_FETCH, track how far
each is, keep the in-sync set in etcd, and hold every acknowledgement until the group has
committed it (docs/design/replication.md).

* **Committed position.** The smallest durable position among the in-sync members, the
  leader's own flushed position included; it only grows. The store gateway answers an
  append only once the committed position covers it (`acks=all`), and readers see only
  records before it (`MessageStore.commit_limit`), so no consumer reads a record that a
  failover could take back. With fewer than `min_insync_replicas` members in sync the
  committed position stands still and new appends are refused (`NotEnoughReplicas`).
* **In-sync set.** A follower whose fetches have not reached the leader's log end for
  `replica_lag_max_ms` leaves it; one that reaches the end joins again. Both go through
  etcd first (one transaction compared on this leader's epoch, `cluster/in_sync.py`) and
  take effect here only once written: the election takes the next leader from the set in
  etcd, so the set there must never claim a member that lacks committed records.
* **Fencing.** Nothing is acknowledged while `is_leader()` (the election's local lease
  check) says no; a deposed leader's waiting appends fail (`LeaderFenced`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from tidemq.broker.replica_handover import Handover
from tidemq.broker.replica_metrics import ReplicaMetrics, ReplicaRole
from tidemq.broker.replica_start_over import add_topic_table, file_answer, start_over_answer
from tidemq.broker.replication_config import ReplicationConfig
from tidemq.core.clock import Clock
from tidemq.core.errors import (
    EtcdUnavailable,
    InvalidRequest,
    LeaderFenced,
    NotEnoughReplicas,
    NotLeader,
    TidemqError,
)
from tidemq.net.tasks import cancel_and_wait, completes_when_cancelled
from tidemq.protocol.commands import ReplicaFollowerStatus, ReplicationStatus
from tidemq.protocol.replica_messages import (
    ElectLeaderRequest,
    ElectLeaderResponse,
    EpochStart,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ReplicaFileRequest,
    ReplicaFileResponse,
    ReplicaServiceState,
)
from tidemq.store.epoch_file import EpochHistory

if TYPE_CHECKING:
    from tidemq.broker.store_gateway import StoreGateway
    from tidemq.cluster.group_keys import LeaderRecord

__all__ = ["PRODUCER_ID_TERM_SHIFT", "ReplicaLeader"]

log = logging.getLogger(__name__)

#: How often the leader looks at its followers' lag and at waiting appends.
_CHECK_INTERVAL_MS: Final = 100
#: Term E hands out producer ids above E << this. A producer keeps its id across a
#: failover (its retries must dedupe at the next leader), and the next leader may never
#: have seen the ids this term gave out (an id reaches followers only in a record or with
#: the topic table), so each term takes its ids from a block of its own: 2^32 ids a term.
PRODUCER_ID_TERM_SHIFT: Final = 32


@dataclass(slots=True)
class _Follower:
    position: int = 0
    durable: int = 0
    #: The leader's log end when it last answered this follower.
    answered_end: int = 0
    #: Monotonic ms of the last fetch that reached the end of the previous answer: under
    #: a steady load the end moves on while the answer travels, so "reached the end as
    #: it was when last answered" is the test (Kafka's last-caught-up time).
    caught_up_ms: float = 0.0


class ReplicaLeader:
    """One term of leadership (one epoch): made when the member wins, dropped when it
    stops leading."""

    def __init__(
        self,
        config: ReplicationConfig,
        *,
        record: LeaderRecord,
        history: EpochHistory,
        in_sync: tuple[str, ...],
        committed: int,
        write_in_sync: Callable[[list[str]], Awaitable[None]],
        is_leader: Callable[[], bool],
        clock: Clock,
        hand_over: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """`hand_over(member)`: make `member` the next leader and step down (the node's
        part of `tidemq cluster elect`)."""
        self._config = config
        self._record = record
        self._history = history
        self._in_sync = set(in_sync) | {record.member}
        self._committed = committed
        self._write_in_sync = write_in_sync
        self._is_leader = is_leader
        self._clock = clock
        self._followers: dict[str, _Follower] = {}
        self._gateway: StoreGateway | None = None
        self._appended = asyncio.Event()
        self._started_ms = clock.monotonic_ms()
        self._task: asyncio.Task[None] | None = None
        #: The broker's latest saved service state, for followers (None: none yet).
        self._state: ReplicaServiceState | None = None
        self._handover = Handover(config.group, record.member, record.epoch, hand_over)
        #: Set at every follower report: a handover waits on it.
        self._reported = asyncio.Event()

    @property
    def epoch(self) -> int:
        return self._record.epoch

    @property
    def in_sync(self) -> tuple[str, ...]:
        return tuple(sorted(self._in_sync))

    @property
    def committed(self) -> int:
        return self._committed

    def status(self) -> ReplicationStatus:
        gateway = self._gateway
        end = gateway.store.end_position if gateway is not None else 0
        members = set(self._followers) | (self._in_sync - {self._record.member})
        return ReplicationStatus(
            group=self._config.group,
            member=self._record.member,
            epoch=self.epoch,
            committed=self._committed,
            log_end=end,
            min_insync_replicas=self._config.min_insync_replicas,
            in_sync=sorted(self._in_sync),
            followers=[
                ReplicaFollowerStatus(
                    member=m,
                    position=f.position if (f := self._followers.get(m)) else 0,
                    durable=f.durable if f else 0,
                    in_sync=m in self._in_sync,
                )
                for m in sorted(members)
            ],
        )

    def metrics(self) -> ReplicaMetrics:
        """This term's figures for `/metrics` (the broker's snapshot carries them)."""
        gateway = self._gateway
        assert gateway is not None, "metrics of a leader whose broker has not started"
        store = gateway.store
        end = store.end_position
        return ReplicaMetrics(
            group=self._config.group,
            member=self._record.member,
            role=ReplicaRole.LEADER,
            epoch=self.epoch,
            log_end=end,
            durable=store.flushed_position,
            committed=self._committed,
            lag_bytes=0,
            in_sync=self.in_sync,
            min_insync_replicas=self._config.min_insync_replicas,
            follower_lag={m: max(0, end - f.position) for m, f in self._followers.items()},
        )

    def follower_positions(self) -> dict[str, tuple[int, int]]:
        """(position, durable) of every follower that fetched this term."""
        return {m: (f.position, f.durable) for m, f in self._followers.items()}

    # ------------------------------------------------------------------ wiring

    def attach(self, gateway: StoreGateway) -> None:
        """Take over the gateway of the broker this member now runs (called as soon as
        its store is open, before any service appends): record where this epoch begins,
        and hold acknowledgements and reads to the committed position."""
        store = gateway.store
        self._history.begin(self._record.epoch, store.end_position)
        store.note_producer_id(self._record.epoch << PRODUCER_ID_TERM_SHIFT)
        self._committed = min(self._committed, store.end_position)
        store.commit_limit = self._committed
        gateway.commit = self._commit
        gateway.check_writable = self._check_writable
        gateway.appended = self._wake
        self._gateway = gateway
        self._task = asyncio.get_running_loop().create_task(self._maintain())

    @completes_when_cancelled
    async def close(self, error: TidemqError | None = None) -> None:
        """End the term: stop maintaining, fail the appends still waiting."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        gateway = self._gateway
        if gateway is not None:
            gateway.fail_all_waiting(error or self._fenced("it stopped leading"))
            gateway.commit = None
            gateway.check_writable = self._refuse
            gateway.appended = None
        self._wake()

    def services_saved(
        self,
        states: dict[str, bytes],
        *,
        position: int,
        scan_position: int,
        trims: list[tuple[str, int, int]],
    ) -> None:
        """The broker saved its services' state (`Broker._save_services`): followers get
        it with their next fetch."""
        version = 1 if self._state is None else self._state.version + 1
        self._state = ReplicaServiceState(
            version=version,
            position=position,
            scan_position=scan_position,
            states=dict(states),
            trims=list(trims),
        )

    def _refuse(self) -> None:
        raise self._fenced("it stopped leading")

    def _wake(self) -> None:
        self._appended.set()
        self._appended = asyncio.Event()

    def _fenced(self, why: str) -> LeaderFenced:
        return LeaderFenced(
            f"group {self._config.group}: member {self._record.member} no longer leads "
            f"epoch {self._record.epoch} ({why}); retry at the group's new leader",
            group=self._config.group,
            current_epoch=self._record.epoch,
        )

    # ------------------------------------------------------------------ acknowledging

    def _check_writable(self) -> None:
        if not self._is_leader():
            raise self._fenced("its lease is lost")
        self._handover.check_writable()
        if len(self._in_sync) < self._config.min_insync_replicas:
            raise NotEnoughReplicas(
                f"group {self._config.group}: {len(self._in_sync)} member(s) in sync "
                f"({', '.join(sorted(self._in_sync))}), min_insync_replicas is "
                f"{self._config.min_insync_replicas}; nothing was written"
            )

    def _commit(self, flushed: int) -> int:
        """The committed position, given the leader's flushed one (StoreGateway.commit)."""
        if not self._is_leader() or len(self._in_sync) < self._config.min_insync_replicas:
            return self._committed
        low = flushed
        for member in self._in_sync:
            if member != self._record.member:
                follower = self._followers.get(member)
                low = min(low, follower.durable if follower is not None else 0)
        self._committed = max(self._committed, low)
        return self._committed

    # ------------------------------------------------------------------ serving

    async def fetch(self, req: ReplicaFetchRequest) -> tuple[ReplicaFetchResponse, bytes]:
        gateway = self._gateway
        if gateway is None:
            raise NotLeader(f"group {self._config.group}: the leader is starting; retry")
        self._check_member(req.group, req.member, req.epoch)
        store = gateway.store
        diverged = self._divergence(req, store.end_position)
        if diverged is not None:
            return ReplicaFetchResponse(
                epoch=self.epoch, position=req.position, diverged_at=diverged
            ), b""
        follower = self._followers.setdefault(req.member, _Follower())
        follower.position, follower.durable = req.position, min(req.durable, req.position)
        self._reported.set()
        self._reported = asyncio.Event()
        if req.position < store.log.start_position:
            # Until it has caught up from the log start it is not in sync (dropped at
            # the next check if it was).
            follower.caught_up_ms = float("-inf")
            follower.answered_end = store.end_position
            answer = start_over_answer(
                store, req, epoch=self.epoch, committed=self._committed, history=self._history
            )
            return answer, b""
        if req.position >= follower.answered_end:
            follower.caught_up_ms = self._clock.monotonic_ms()
        if req.position >= store.end_position and req.max_wait_ms > 0:
            gateway.commit_advanced()
            waited = self._appended.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    waited, min(req.max_wait_ms, self._config.fetch_wait_ms) / 1000
                )
        gateway.commit_advanced()
        chunk = store.replica.read_chunk(
            req.position,
            min(req.max_bytes, self._config.fetch_max_bytes),
            limit=store.end_position,
        )
        follower.answered_end = store.end_position
        answer = ReplicaFetchResponse(
            epoch=self.epoch,
            position=chunk.position,
            records=chunk.records,
            leader_end=store.end_position,
            log_start=store.log.start_position,
            committed=self._committed,
            epochs=[EpochStart(e.epoch, e.start_position) for e in self._history.entries],
            topics_version=store.topics_version,
        )
        if self._state is not None and req.state_version != self._state.version:
            answer.state = self._state
        if req.topics_version != store.topics_version:
            add_topic_table(answer, store)
        return answer, chunk.data

    async def fetch_file(self, req: ReplicaFileRequest) -> tuple[ReplicaFileResponse, bytes]:
        """Bytes of one of this store's compacted log files, for a follower starting over."""
        gateway = self._gateway
        if gateway is None:
            raise NotLeader(f"group {self._config.group}: the leader is starting; retry")
        self._check_member(req.group, req.member, req.epoch)
        return file_answer(gateway.store, req, self._config.fetch_max_bytes)

    async def elect(self, req: ElectLeaderRequest) -> ElectLeaderResponse:
        """Hand leadership to `req.member` without losing anything acknowledged
        (`replica_handover.py`)."""
        gateway = self._gateway
        if gateway is None:
            raise InvalidRequest(f"group {self._config.group}: the leader is starting")

        def behind(member: str) -> bool:
            f = self._followers.get(member)
            return f is None or f.durable < gateway.store.end_position

        return await self._handover.run(
            req, in_sync=self._in_sync, behind=behind, reported=lambda: self._reported
        )

    def _check_member(self, group: str, member: str, epoch: int) -> None:
        if group != self._config.group:
            raise InvalidRequest(
                f"a replication request for group {group!r} reached a member of "
                f"{self._config.group!r}"
            )
        if member == self._record.member:
            raise InvalidRequest(f"member {member!r} is this group's leader")
        if not self._is_leader():
            raise self._fenced("its lease is lost")
        if epoch != self.epoch:
            raise NotLeader(
                f"group {self._config.group}: the follower asked under epoch {epoch}, "
                f"this leader holds epoch {self.epoch}; read the leader from etcd again",
                group=self._config.group,
                current_epoch=self.epoch,
            )

    def _divergence(self, req: ReplicaFetchRequest, end: int) -> int | None:
        """Where the follower's log stops agreeing with this one (None: it agrees up to
        its end). Both agree up to the end, here, of the newest epoch they share."""
        if req.last_epoch < 0:
            if req.position == 0:
                return None
            raise InvalidRequest(
                f"member {req.member!r} has {req.position} bytes of log but no epoch "
                "history: data from outside the group cannot be replicated over; empty its "
                "data directory to join"
            )
        _, agreed_end = self._history.end_of(req.last_epoch, end)
        if agreed_end < req.position:
            return agreed_end
        return None

    # ------------------------------------------------------------------ maintenance

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(_CHECK_INTERVAL_MS / 1000)
            try:
                await self._check_once()
            except (EtcdUnavailable, LeaderFenced) as exc:
                log.warning("group %s: in-sync set not updated: %s", self._config.group, exc)
            except Exception:
                log.exception("group %s: replication maintenance failed", self._config.group)

    async def _check_once(self) -> None:
        gateway = self._gateway
        assert gateway is not None
        if not self._is_leader():
            gateway.fail_all_waiting(self._fenced("its lease is lost"))
            return
        now = self._clock.monotonic_ms()
        lag_max = self._config.replica_lag_max_ms
        lagging = {
            m for m in self._in_sync - {self._record.member} if now - self._caught_up(m) > lag_max
        }
        joining = {
            m
            for m, f in self._followers.items()
            if m not in self._in_sync
            and now - f.caught_up_ms <= lag_max / 2
            and f.durable >= self._committed
        }
        if lagging or joining:
            members = (self._in_sync - lagging) | joining
            await self._write_in_sync(sorted(members))
            log.info(
                "group %s epoch %d: in-sync set %s (left: %s, joined: %s)",
                self._config.group,
                self.epoch,
                sorted(members),
                sorted(lagging),
                sorted(joining),
            )
            self._in_sync = members
            gateway.commit_advanced()
        gateway.fail_waiting_since(
            time.monotonic() - self._config.ack_timeout_ms / 1000,
            NotEnoughReplicas(
                f"group {self._config.group}: not committed within ack_timeout_ms "
                f"({self._config.ack_timeout_ms}); in sync: {sorted(self._in_sync)}"
            ),
        )

    def _caught_up(self, member: str) -> float:
        follower = self._followers.get(member)
        # A member not heard from this term counts from the term's start.
        return follower.caught_up_ms if follower is not None else self._started_ms
