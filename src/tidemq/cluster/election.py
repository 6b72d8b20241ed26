"""Leader election of one replica group through etcd, with strictly increasing epochs and
a fencing check. One `Election` per member; its state machine is `election_state`.

How it works (keys in `group_keys`):

* **Campaign.** A member with no leader in sight grants itself a fresh lease
  (`lease_ttl_s`; revoked again if it loses, so followers hold none) and runs one
  transaction: *if* the leader key does not exist *and* the epoch key still holds the
  epoch it read (or is absent), *then* put the leader key (on its lease) with epoch E+1
  and put the epoch key to E+1. So two members can never win the same epoch, and the
  epoch grows by one at each election, even when a leader key expired without trace.
* **Keep-alive.** A background task refreshes the lease every third of its TTL. The
  member's own deadline is the time it *sent* the last successful refresh plus the TTL
  etcd granted: never later than etcd's own expiry. Past that deadline, or on a refresh
  that finds the lease gone, the leader is FENCED: it may have lost the key already.
* **Watch.** Followers watch the leader key (a watch bounded by `recheck_ms`, then a fresh
  read), so they learn of a new leader or of the key's deletion at once, and campaign when
  it is gone. The leader watches its own key: any change to it means it was deposed.
* **Fencing.** `confirm(epoch)` is one transaction that succeeds only if the leader key
  still holds exactly this member under this epoch; else `LeaderFenced` names etcd's
  current epoch. A leader calls it before acknowledging (reliability rule 6); a paused or
  cut-off leader therefore cannot acknowledge under an epoch it has lost.
* **Resign.** Delete the leader key only if it still holds this member's record (compare
  on the value, which contains the epoch), then revoke the lease.

An etcd failure never hangs a call (`EtcdClient` bounds each one); the background loop
waits `retry_backoff_ms` and tries again, as long as the election runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from tidemq.cluster.election_state import Event, State, next_state
from tidemq.cluster.etcd_client import (
    Compare,
    CreatedAt,
    Delete,
    EtcdClient,
    Get,
    KeyValue,
    Op,
    Put,
    ValueIs,
)
from tidemq.cluster.group_keys import (
    DEFAULT_PREFIX,
    GroupKeys,
    LeaderRecord,
    check_member,
    decode_epoch,
    decode_leader,
    encode_epoch,
    encode_leader,
)
from tidemq.cluster.lease_keeper import LeaseFaults, LeaseKeeper
from tidemq.core.clock import Clock
from tidemq.core.errors import ConfigError, EtcdUnavailable, LeaderFenced, NotLeader

__all__ = [
    "MAX_LEASE_TTL_S",
    "Campaign",
    "Election",
    "ElectionConfig",
    "ElectionFaults",
    "ElectionStatus",
    "fenced_error",
]

log = logging.getLogger(__name__)

#: Longest the election waits for a cancelled etcd call (a watch) to finish.
_CANCEL_WAIT_MS: Final = 1_000

#: A lease longer than this would leave a group without a leader for that long after a
#: crash; the issue's failover target is seconds.
MAX_LEASE_TTL_S: Final = 60


@dataclass(frozen=True, kw_only=True)
class ElectionConfig:
    #: The broker group's name (a user name: `tidemq.core.names`).
    group: str
    #: This member's id, unique in the group (`tidemq.core.names.MEMBER_PATTERN`).
    member: str
    #: Where this member serves (host:port), published while it leads.
    address: str
    #: Where it serves its followers (REPLICA_FETCH), published with it ("": none).
    replication_address: str = ""
    #: The leader's lease: how long a dead or cut-off leader keeps the group leaderless.
    #: etcd grants at least about 2 s whatever is asked.
    lease_ttl_s: int = 2
    prefix: str = DEFAULT_PREFIX
    #: Longest a member waits on a watch before it reads the leader key again: a bound on
    #: how long a lost watch (etcd restarted) can hide a change.
    recheck_ms: int = 2_000
    #: Pause after a failed etcd call before the next try.
    retry_backoff_ms: int = 200

    def __post_init__(self) -> None:
        GroupKeys(self.group, self.prefix)  # validates both
        check_member(self.member)
        if not 1 <= self.lease_ttl_s <= MAX_LEASE_TTL_S:
            raise ConfigError(f"lease_ttl_s {self.lease_ttl_s}: expected 1-{MAX_LEASE_TTL_S}")
        if self.recheck_ms < 10 or self.retry_backoff_ms < 10:
            raise ConfigError("recheck_ms and retry_backoff_ms must be at least 10 ms")


class ElectionFaults(LeaseFaults, Protocol):
    """Fault injection for tests (`tidemq.testing.election` ships one): production code
    passes none. `keepalive_paused` is asked before each lease keep-alive and revoke (a
    member cut off from etcd's lease service: its lease can only expire in etcd);
    `campaign_held` before each campaign."""

    def campaign_held(self) -> bool: ...


@dataclass(frozen=True)
class ElectionStatus:
    state: State
    #: This member's epoch while it leads or is fenced; 0 otherwise.
    epoch: int
    #: The leader this member last saw in etcd (itself when leading); None: no leader.
    leader: LeaderRecord | None
    #: How many transitions this member has made: waiters tell statuses apart by it.
    transitions: int = 0


def fenced_error(
    keys: GroupKeys, what: str, leader: KeyValue | None, epoch: KeyValue | None
) -> LeaderFenced:
    """`LeaderFenced` for `what` (the refused action), naming etcd's current epoch and
    leader from the reads `leader` and `epoch` of a failed transaction."""
    current = None if epoch is None else decode_epoch(keys.epoch, epoch.value)
    holder = None if leader is None else decode_leader(keys.leader, leader.value)
    who = "no leader" if holder is None else f"leader {holder.member} at {holder.address}"
    return LeaderFenced(
        f"group {keys.group}: {what}: etcd's current epoch is {current or 'none'} ({who})",
        group=keys.group,
        current_epoch=current,
    )


@dataclass(frozen=True)
class Campaign:
    """The one transaction that wins an election (see the module's docstring)."""

    record: LeaderRecord
    compare: list[Compare]
    success: list[Op]
    failure: list[Op]

    @classmethod
    def after(  # noqa: PLR0917 - the record's fields, in its order
        cls,
        keys: GroupKeys,
        epoch: KeyValue | None,
        member: str,
        address: str,
        lease_id: int,
        replication_address: str = "",
    ) -> Campaign:
        """The campaign for the epoch after `epoch` (the epoch key as read; None: absent):
        it wins only if there is no leader and the epoch key is still as read."""
        current = 0 if epoch is None else decode_epoch(keys.epoch, epoch.value)
        record = LeaderRecord(current + 1, member, address, replication_address)
        unchanged = CreatedAt(keys.epoch, 0) if epoch is None else ValueIs(keys.epoch, epoch.value)
        return cls(
            record,
            compare=[CreatedAt(keys.leader, 0), unchanged],
            success=[
                Put(keys.leader, encode_leader(record), lease_id),
                Put(keys.epoch, encode_epoch(record.epoch)),
            ],
            failure=[Get(keys.leader)],
        )


@dataclass
class _Leadership:
    """What a member holds while it leads (or was fenced, until it steps down)."""

    record: LeaderRecord
    #: The revision that created the leader key: changes to it come after this.
    revision: int


class Election:
    """One member's part in its group's election. Owned by one event loop: `start()`
    runs it in the background until `resign()` or `stop()`."""

    def __init__(
        self,
        client: EtcdClient,
        config: ElectionConfig,
        *,
        clock: Clock,
        faults: ElectionFaults | None = None,
        eligible: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """`eligible`: asked before each campaign; a member it says no to waits (a
        replica outside the group's in-sync set must not lead: it may lack acknowledged
        records)."""
        self._client = client
        self._eligible = eligible
        self._config = config
        self._keys = GroupKeys(config.group, config.prefix)
        self._clock = clock
        self._faults = faults
        self._state = State.FOLLOWER
        self._transitions = 0
        self._seen: LeaderRecord | None = None
        self._leadership: _Leadership | None = None
        self._keeper: LeaseKeeper | None = None
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._leftovers: set[asyncio.Task[Any]] = set()
        #: What ended the election if it failed (it is then STOPPED); None otherwise.
        self.failure: Exception | None = None

    # -- observing ---------------------------------------------------------------------

    @property
    def keys(self) -> GroupKeys:
        return self._keys

    @property
    def status(self) -> ElectionStatus:
        epoch = self._leadership.record.epoch if self._leadership else 0
        return ElectionStatus(self._state, epoch, self._seen, self._transitions)

    def is_leader(self) -> bool:
        """Leading, and the lease cannot have expired yet by this member's clock. A cheap
        local check; `confirm` asks etcd."""
        keeper = self._keeper
        return self._state is State.LEADER and keeper is not None and keeper.alive()

    async def wait_for(
        self, predicate: Callable[[ElectionStatus], bool], *, timeout_s: float
    ) -> ElectionStatus:
        """The first status that satisfies `predicate` (the current one, or one after a
        change); TimeoutError after `timeout_s`."""
        async with asyncio.timeout(timeout_s):
            while True:
                changed = self._changed
                status = self.status
                if predicate(status):
                    return status
                await changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _fire(self, event: Event) -> None:
        before = self._state
        self._state = next_state(before, event)
        self._transitions += 1
        log.info(
            "group %s member %s: %s -> %s (%s)",
            self._config.group,
            self._config.member,
            before.value,
            self._state.value,
            event.value,
        )
        self._notify()

    def _observe(self, leader: LeaderRecord | None) -> None:
        if leader != self._seen:
            self._seen = leader
            self._notify()

    # -- running -----------------------------------------------------------------------

    def start(self) -> None:
        assert self._task is None, "an election starts once"
        self._task = asyncio.create_task(self._run(), name=f"election-{self._config.group}")

    async def _run(self) -> None:
        steps = {State.FOLLOWER: self._follow, State.LEADER: self._lead, State.FENCED: self._fenced}
        while not self._stopping.is_set():
            try:
                await steps[self._state]()
            except EtcdUnavailable as error:
                log.warning(
                    "group %s member %s: %s", self._config.group, self._config.member, error
                )
                await self._pause(self._config.retry_backoff_ms)
            except Exception as error:
                # A bug or a corrupt value in etcd: never go on believing it leads.
                log.exception(
                    "group %s member %s: election failed", self._keys.group, self._config.member
                )
                self.failure = error
                self._leadership = None
                await self._abandon_lease()
                self._fire(Event.STOP)
                return

    async def _pause(self, ms: float) -> None:
        """Wait `ms`, or less if the election stops meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), ms / 1000)

    async def _follow(self) -> None:
        current = await self._client.get(self._keys.leader)
        if current is not None:
            self._observe(decode_leader(self._keys.leader, current.value))
            # Wait for the key to change (bounded: a watch lost with its connection must
            # not hide a deletion for long), then read it again.
            await self._client.watch_once(
                self._keys.leader,
                start_revision=current.mod_revision + 1,
                timeout_ms=self._config.recheck_ms,
            )
            return
        self._observe(None)
        held = self._faults is not None and self._faults.campaign_held()
        if held or (self._eligible is not None and not await self._eligible()):
            await self._pause(self._config.retry_backoff_ms)
            return
        self._fire(Event.CAMPAIGN)
        try:
            await self._campaign()
        except BaseException:
            # The transaction's outcome is unknown: give the lease up, and with it the
            # leader key if the transaction did put it.
            if self._state is State.CANDIDATE:
                self._fire(Event.LOST)
            await self._abandon_lease()
            raise

    async def _campaign(self) -> None:
        keeper = await self._new_lease()
        keys = self._keys
        found = await self._client.get(keys.epoch)
        config = self._config
        campaign = Campaign.after(
            keys, found, config.member, config.address, keeper.lease.id, config.replication_address
        )
        record = campaign.record
        result = await self._client.txn(campaign.compare, campaign.success, campaign.failure)
        if result.succeeded:
            self._leadership = _Leadership(record, result.revision)
            self._seen = record
            self._fire(Event.WON)
            return
        winner = result.gets[0]
        self._observe(None if winner is None else decode_leader(keys.leader, winner.value))
        self._fire(Event.LOST)
        await self._abandon_lease()

    async def _lead(self) -> None:
        leadership, keeper = self._leadership, self._keeper
        assert leadership is not None
        assert keeper is not None
        lost = asyncio.create_task(keeper.lost.wait())
        changed = asyncio.create_task(
            self._client.watch_once(
                self._keys.leader,
                start_revision=leadership.revision + 1,
                timeout_ms=self._config.recheck_ms,
            )
        )
        try:
            await asyncio.wait({lost, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await self._cancel(lost, changed)
        if keeper.lost.is_set():
            self._fire(Event.LEASE_LOST)
            return
        changed.result()  # raises EtcdUnavailable if the watch failed
        # A change, or a quiet watch that timed out: either way, ask etcd.
        current = await self._client.get(self._keys.leader)
        holder = None if current is None else decode_leader(self._keys.leader, current.value)
        if holder != leadership.record:
            self._observe(holder)
            self._fire(Event.DEPOSED)

    async def _cancel(self, *tasks: asyncio.Task[Any]) -> None:
        """Cancel `tasks` and wait for them a bounded time: a gRPC stream's clean-up on
        a dead connection must not keep the election from moving on. A task still
        running then is kept referenced until it ends."""
        for task in tasks:
            task.cancel()
        _, pending = await asyncio.wait(tasks, timeout=_CANCEL_WAIT_MS / 1000)
        for task in pending:
            self._leftovers.add(task)
            task.add_done_callback(self._leftovers.discard)

    async def _fenced(self) -> None:
        await self._abandon_lease()
        self._leadership = None
        self._fire(Event.STEPPED_DOWN)

    # -- the lease ---------------------------------------------------------------------

    async def _new_lease(self) -> LeaseKeeper:
        """A fresh lease for a campaign. Followers hold none: a lease kept through a long
        wait could be close to its deadline (after an etcd hiccup) just as it wins."""
        await self._abandon_lease()
        self._keeper = await LeaseKeeper.grant(
            self._client, self._config.lease_ttl_s, clock=self._clock, faults=self._faults
        )
        return self._keeper

    async def _abandon_lease(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            await keeper.abandon()

    # -- what a leader calls -----------------------------------------------------------

    async def confirm(self, epoch: int) -> None:
        """Succeeds only if etcd's leader key holds this member under `epoch` (one
        linearizable transaction comparing the whole record) and this member's lease
        cannot have expired yet. Else `LeaderFenced`, naming etcd's current epoch and
        leader; `EtcdUnavailable` if etcd does not answer in time. A leader calls this
        before it acknowledges anything under `epoch`."""
        keys = self._keys
        config = self._config
        claimed = LeaderRecord(epoch, config.member, config.address, config.replication_address)
        result = await self._client.txn(
            compare=[ValueIs(keys.leader, encode_leader(claimed))],
            success=[],
            failure=[Get(keys.leader), Get(keys.epoch)],
        )
        leadership = self._leadership
        ours = leadership is not None and leadership.record == claimed
        if not result.succeeded:
            if ours and self._state is State.LEADER:
                self._fire(Event.DEPOSED)
            raise fenced_error(
                keys, f"member {self._config.member} does not hold epoch {epoch}", *result.gets
            )
        if not (ours and self.is_leader()):
            # The key is this member's, but from a lease it no longer keeps alive (it was
            # fenced, or an earlier run of it left the key): etcd will expire it.
            raise LeaderFenced(
                f"group {keys.group}: member {self._config.member} cannot keep epoch {epoch}: "
                "its lease may have expired",
                group=keys.group,
                current_epoch=epoch,
            )

    @property
    def leader_record(self) -> LeaderRecord:
        """This member's record while it leads (for in-sync updates); NotLeader otherwise."""
        if self._leadership is None or self._state is not State.LEADER:
            raise NotLeader(
                f"group {self._keys.group}: member {self._config.member} does not lead",
                group=self._keys.group,
            )
        return self._leadership.record

    async def step_down(self) -> None:
        """Give leadership up and stay in the election (a handover): delete the leader
        key if it still holds this member's record; the leader's watch then sees it go
        (DEPOSED), and this member follows whoever etcd elects next. NotLeader if it
        does not lead."""
        record = self.leader_record
        await self._client.txn(
            compare=[ValueIs(self._keys.leader, encode_leader(record))],
            success=[Delete(self._keys.leader)],
        )

    async def resign(self) -> None:
        """Give leadership up and leave the election: delete the leader key only if it
        still holds this member's record, then revoke the lease. If etcd cannot be asked
        now, the member leaves all the same and its key expires with its lease."""
        await self._halt()
        if self._state is State.LEADER and self._leadership is not None:
            self._fire(Event.RESIGNED)
            record = encode_leader(self._leadership.record)
            try:
                await self._client.txn(
                    compare=[ValueIs(self._keys.leader, record)],
                    success=[Delete(self._keys.leader)],
                )
            except EtcdUnavailable as error:
                log.warning("group %s: resign left the key to expire: %s", self._keys.group, error)
        await self.stop()

    async def _halt(self) -> None:
        """Stop the background loop (not the lease)."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def stop(self) -> None:
        """End the election (revoking the lease, so a leader's key goes at once)."""
        await self._halt()
        await self._abandon_lease()
        self._leadership = None
        if self._state is not State.STOPPED:
            self._fire(Event.STOP)
