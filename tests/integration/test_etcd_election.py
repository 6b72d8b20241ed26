"""Leader election, fencing and the in-sync set of replica groups against real etcd
processes (tests/support/etcd_server.py): one member, or a cluster of three.

Nothing sleeps to pass: each test waits on an election's status changes (`wait_for`) with
a bound. Lease expiry is etcd's own time, so leases are 2 s (etcd's minimum) and the
bounds are a few leases.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import pytest
from tests.support.etcd_server import EtcdCluster, etcd_cluster3, etcd_single

from tidemq.cluster.election import Campaign, Election, ElectionConfig, ElectionStatus
from tidemq.cluster.election_state import State
from tidemq.cluster.etcd_client import ETCD_REQUEST_TIMEOUT_MS, Delete, EtcdClient
from tidemq.cluster.group_keys import GroupKeys, InSyncRecord
from tidemq.cluster.in_sync import read_in_sync, write_in_sync
from tidemq.core.clock import SystemClock
from tidemq.core.errors import EtcdUnavailable, InvalidRequest, LeaderFenced, NotLeader
from tidemq.testing.election import ElectionFaultSwitch

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

__all__ = ["etcd_cluster3", "etcd_single"]  # fixtures, used by name below

pytestmark = pytest.mark.timeout(120)

GROUP = "orders"
TTL_S = 2
#: Bound on one election outcome: a lease to expire (2 s) and a campaign, with room for
#: a loaded two-core machine.
ELECTION_TIMEOUT_S = 20.0


class Member:
    """One broker of GROUP: its own etcd connection and its election (a new one after
    `rejoin`)."""

    def __init__(self, name: str, client: EtcdClient, config: ElectionConfig) -> None:
        self.name, self.client, self.config = name, client, config
        self.faults = ElectionFaultSwitch()
        self.election = Election(client, config, clock=SystemClock(), faults=self.faults)

    @property
    def status(self) -> ElectionStatus:
        return self.election.status

    def rejoin(self) -> None:
        """Campaign again with a new election (after `resign`), as a restarted broker."""
        assert self.status.state is State.STOPPED
        self.faults = ElectionFaultSwitch()
        self.election = Election(self.client, self.config, clock=SystemClock(), faults=self.faults)
        self.election.start()


@asynccontextmanager
async def members(endpoints: Sequence[str], count: int) -> AsyncIterator[list[Member]]:
    """`count` members of GROUP, each with its own etcd connection, all campaigning."""
    started: list[Member] = []
    try:
        for i in range(count):
            client = EtcdClient(endpoints)
            await client.connect()
            config = ElectionConfig(
                group=GROUP, member=f"b{i}", address=f"127.0.0.1:{10_000 + i}", lease_ttl_s=TTL_S
            )
            started.append(Member(f"b{i}", client, config))
        for member in started:
            member.election.start()
        yield started
    finally:
        for member in started:
            await member.election.stop()
            await member.client.close()


async def next_leader(group: Sequence[Member], *, after_epoch: int = 0) -> Member:
    """The member that leads under an epoch above `after_epoch`, once every member of
    `group` sees it as the leader."""

    def won(status: ElectionStatus) -> bool:
        return status.state is State.LEADER and status.epoch > after_epoch

    waits = {
        asyncio.create_task(m.election.wait_for(won, timeout_s=ELECTION_TIMEOUT_S)): m
        for m in group
    }
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    finished = done.pop()
    finished.result()  # a TimeoutError fails the test here
    winner = waits[finished]
    record = winner.status.leader
    for m in group:
        await m.election.wait_for(lambda s: s.leader == record, timeout_s=ELECTION_TIMEOUT_S)
    return winner


def test_exactly_one_of_three_members_leads_with_epoch_one(
    loop: Loop, etcd_cluster3: EtcdCluster
) -> None:
    async def scenario() -> None:
        async with members(etcd_cluster3.endpoints, 3) as group:
            leader = await next_leader(group)
            assert [m.status.state for m in group].count(State.LEADER) == 1
            assert leader.status.epoch == 1
            assert leader.status.leader is not None
            assert leader.status.leader.member == leader.name
            assert leader.election.is_leader()
            await leader.election.confirm(1)
            for other in group:
                if other is not leader:
                    assert other.status.state is State.FOLLOWER
                    with pytest.raises(NotLeader, match="current epoch is 1"):
                        await other.election.confirm(1)

    loop.run(scenario())


def test_each_resign_hands_leadership_to_another_member_under_the_next_epoch(
    loop: Loop, etcd_cluster3: EtcdCluster
) -> None:
    async def scenario() -> None:
        async with members(etcd_cluster3.endpoints, 3) as group:
            remaining = list(group)
            epochs = []
            leader = await next_leader(remaining)
            epochs.append(leader.status.epoch)
            for _ in range(2):
                await leader.election.resign()
                assert leader.status.state is State.STOPPED
                remaining.remove(leader)
                leader = await next_leader(remaining, after_epoch=epochs[-1])
                epochs.append(leader.status.epoch)
            assert epochs == [1, 2, 3]

    loop.run(scenario())


def test_under_churn_every_epoch_has_one_leader_and_epochs_go_up_by_one(
    loop: Loop, etcd_single: EtcdCluster
) -> None:
    async def scenario() -> None:
        async with members(etcd_single.endpoints, 3) as group:
            history: list[tuple[int, str]] = []
            for _ in range(6):
                leader = await next_leader(group, after_epoch=history[-1][0] if history else 0)
                assert [m.status.state for m in group].count(State.LEADER) == 1
                history.append((leader.status.epoch, leader.name))
                await leader.election.resign()
                leader.rejoin()  # campaigns again, against the other two
            assert [epoch for epoch, _ in history] == [1, 2, 3, 4, 5, 6]

    loop.run(scenario())


def test_leader_cut_off_from_its_lease_loses_the_key_after_the_ttl_and_is_fenced(
    loop: Loop, etcd_single: EtcdCluster
) -> None:
    async def scenario() -> None:
        async with members(etcd_single.endpoints, 3) as group:
            old = await next_leader(group)
            old_epoch = old.status.epoch
            old.faults.pause_keepalive()
            old.faults.hold_campaigns()
            paused_at = time.monotonic()
            others = [m for m in group if m is not old]
            new = await next_leader(others, after_epoch=old_epoch)
            # etcd expired the lease: not before its TTL less one keep-alive interval.
            assert time.monotonic() - paused_at >= TTL_S * 2 / 3 - 0.1
            assert old.status.state is State.FOLLOWER
            assert not old.election.is_leader()
            assert new.status.epoch == old_epoch + 1
            await new.election.confirm(new.status.epoch)
            with pytest.raises(
                LeaderFenced, match=f"current epoch is {new.status.epoch}"
            ) as fenced:
                await old.election.confirm(old_epoch)
            assert fenced.value.current_epoch == new.status.epoch

    loop.run(scenario())


def test_in_sync_set_is_written_by_the_leader_and_refused_under_a_stale_epoch(
    loop: Loop, etcd_single: EtcdCluster
) -> None:
    async def scenario() -> None:
        keys = GroupKeys(GROUP)
        async with members(etcd_single.endpoints, 2) as group:
            old = await next_leader(group)
            old_record = old.election.leader_record
            other = next(m for m in group if m is not old)
            assert await read_in_sync(other.client, keys) is None
            written = await write_in_sync(old.client, keys, old_record, [other.name, old.name])
            assert written == InSyncRecord(old_record.epoch, tuple(sorted([old.name, other.name])))
            assert await read_in_sync(other.client, keys) == written
            with pytest.raises(InvalidRequest, match="lacks its leader"):
                await write_in_sync(old.client, keys, old_record, [other.name])

            await old.election.resign()
            new = await next_leader([other], after_epoch=old_record.epoch)
            with pytest.raises(LeaderFenced, match=f"current epoch is {new.status.epoch}"):
                await write_in_sync(old.client, keys, old_record, [old.name])
            assert await read_in_sync(new.client, keys) == written  # refused: unchanged
            shrunk = await write_in_sync(new.client, keys, new.election.leader_record, [new.name])
            assert shrunk == InSyncRecord(new.status.epoch, (new.name,))

    loop.run(scenario())


def test_etcd_killed_fails_calls_within_the_timeout_and_the_election_resumes_on_restart(
    loop: Loop, etcd_single: EtcdCluster
) -> None:
    (etcd,) = etcd_single.members

    async def scenario() -> None:
        async with members(etcd_single.endpoints, 2) as group:
            leader = await next_leader(group)
            epoch = leader.status.epoch
            etcd.kill()
            started = time.monotonic()
            with pytest.raises(EtcdUnavailable, match="etcd transaction"):
                await leader.election.confirm(epoch)
            assert time.monotonic() - started < ETCD_REQUEST_TIMEOUT_MS / 1000 + 1.0
            # Unable to keep its lease alive, the leader stops leading by its own clock.
            await leader.election.wait_for(
                lambda s: s.state is not State.LEADER, timeout_s=ELECTION_TIMEOUT_S
            )
            assert not leader.election.is_leader()

            etcd.start()
            await asyncio.to_thread(etcd_single.wait_ready)
            new = await next_leader(group, after_epoch=epoch)
            assert new.status.epoch == epoch + 1
            await new.election.confirm(new.status.epoch)

    loop.run(scenario())


def test_a_stopped_etcd_fails_calls_within_the_timeout_instead_of_hanging(
    loop: Loop, etcd_single: EtcdCluster
) -> None:
    (etcd,) = etcd_single.members

    async def scenario() -> None:
        async with members(etcd_single.endpoints, 1) as (only,):
            await next_leader([only])
            etcd.pause()  # SIGSTOP: connections stay open, nothing answers
            try:
                started = time.monotonic()
                with pytest.raises(EtcdUnavailable, match="no answer"):
                    await only.election.confirm(1)
                assert time.monotonic() - started < ETCD_REQUEST_TIMEOUT_MS / 1000 + 1.0
                # Its lease cannot be kept alive: the member stops leading by its clock.
                await only.election.wait_for(
                    lambda s: s.state is not State.LEADER, timeout_s=ELECTION_TIMEOUT_S
                )
            finally:
                etcd.resume()
            # The same connection works again once etcd does: elected under epoch 2.
            await next_leader([only], after_epoch=1)
            assert only.status.epoch == 2
            await only.election.confirm(2)

    loop.run(scenario())


def test_the_election_goes_on_when_the_etcd_member_first_in_the_endpoints_dies(
    loop: Loop, etcd_cluster3: EtcdCluster
) -> None:
    async def scenario() -> None:
        async with members(etcd_cluster3.endpoints, 2) as group:
            leader = await next_leader(group)
            epoch = leader.status.epoch
            etcd_cluster3.members[0].kill()
            await leader.election.resign()
            other = next(m for m in group if m is not leader)
            # While etcd elects its own leader, keep-alives may fail for longer than a
            # 2 s lease: the winner may then lose its lease and win again, each time
            # under a new epoch. What must hold: a leader under a later epoch whose
            # confirm succeeds, and epochs that only grow.
            for _ in range(5):
                new = await next_leader([other], after_epoch=epoch)
                assert new.status.epoch > epoch
                epoch = new.status.epoch
                try:
                    await new.election.confirm(epoch)
                    return
                except LeaderFenced:
                    continue
            raise AssertionError("no leader kept its epoch after five elections")

    loop.run(scenario())


@pytest.mark.parametrize("epoch_before", [0, 1])
def test_a_campaign_built_on_a_stale_epoch_is_refused_even_with_no_leader(
    loop: Loop, etcd_single: EtcdCluster, epoch_before: int
) -> None:
    # The race the epoch compare closes: X reads epoch E; Y wins E+1 and its key is gone
    # again (resigned or expired) before X's transaction runs. The leader key is absent,
    # but X must not win E+1 a second time.
    keys = GroupKeys(GROUP)

    async def win(client: EtcdClient, member: str) -> int:
        campaign = Campaign.after(keys, await client.get(keys.epoch), member, "127.0.0.1:1", 0)
        result = await client.txn(campaign.compare, campaign.success, campaign.failure)
        assert result.succeeded
        await client.txn([], [Delete(keys.leader)])  # leaves: no leader again
        return campaign.record.epoch

    async def scenario() -> None:
        client = EtcdClient(etcd_single.endpoints)
        await client.connect()
        try:
            for _ in range(epoch_before):
                await win(client, "b9")
            stale = Campaign.after(keys, await client.get(keys.epoch), "b0", "127.0.0.1:1", 0)
            assert await win(client, "b1") == epoch_before + 1
            result = await client.txn(stale.compare, stale.success, stale.failure)
            assert not result.succeeded
            assert result.gets == (None,)  # refused with no leader: by the epoch compare
            found = await client.get(keys.epoch)
            assert found is not None
            assert found.value == str(epoch_before + 1).encode()
        finally:
            await client.close()

    loop.run(scenario())
