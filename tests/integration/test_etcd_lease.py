"""`LeaseKeeper` against a real etcd: its deadline, refreshes, and etcd's own expiry of a
lease whose keep-alives stop (the fault hook of `tidemq.testing.election`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import pytest
from tests.support.etcd_server import EtcdCluster, etcd_single

from tidemq.cluster.etcd_client import EtcdClient, EventKind, Put, WatchEvent
from tidemq.cluster.lease_keeper import LeaseKeeper
from tidemq.core.clock import SystemClock
from tidemq.core.errors import EtcdUnavailable
from tidemq.testing.clock import ManualClock
from tidemq.testing.election import ElectionFaultSwitch

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

__all__ = ["etcd_single"]  # a fixture, used by name below

pytestmark = pytest.mark.timeout(60)

#: A key watched for its deletion when etcd expires the lease it is attached to.
KEY = b"/tidemq-test/lease"


def test_the_deadline_is_the_grant_request_time_plus_the_granted_ttl(
    loop: Loop, etcd_single: EtcdCluster
) -> None:
    async def scenario() -> None:
        client = EtcdClient(etcd_single.endpoints)
        await client.connect()
        clock = ManualClock()
        clock.advance(5_000)
        keeper = await LeaseKeeper.grant(client, 2, clock=clock)
        try:
            assert keeper.lease.ttl_s >= 2
            assert keeper.deadline_ms == 5_000 + keeper.lease.ttl_s * 1000
            assert keeper.alive()
            clock.advance(keeper.lease.ttl_s * 1000)  # no refresh answered on this clock
            assert not keeper.alive()
        finally:
            await keeper.abandon()
            await client.close()

    loop.run(scenario())


def test_a_kept_lease_outlives_its_ttl_and_a_paused_one_is_expired_by_etcd(
    loop: Loop, etcd_single: EtcdCluster
) -> None:
    async def scenario() -> None:
        client = EtcdClient(etcd_single.endpoints)
        await client.connect()
        faults = ElectionFaultSwitch()
        keeper = await LeaseKeeper.grant(client, 2, clock=SystemClock(), faults=faults)
        try:
            put = await client.txn([], [Put(KEY, b"x", keeper.lease.id)])
            # Kept alive: still there after more than one TTL of etcd's time.
            quiet = await client.watch_once(
                KEY, start_revision=put.revision + 1, timeout_ms=keeper.lease.ttl_s * 1500
            )
            assert quiet is None
            assert keeper.alive()
            faults.pause_keepalive()
            # Paused: etcd deletes the key when the lease expires, within a few TTLs.
            gone = await client.watch_once(
                KEY, start_revision=put.revision + 1, timeout_ms=keeper.lease.ttl_s * 3000
            )
            assert gone is not None
            assert gone.kind is EventKind.DELETE
            async with asyncio.timeout(5):  # its deadline passed before etcd's expiry
                await keeper.lost.wait()
            assert not keeper.alive()
            assert await client.keep_alive(keeper.lease.id) == 0
        finally:
            await keeper.abandon()
            await client.close()

    loop.run(scenario())


def test_a_watch_answered_late_after_a_stall_never_hands_out_another_keys_change(
    loop: Loop, etcd_single: EtcdCluster
) -> None:
    """aetcd pairs a "watch created" answer with whichever watch waits for one: after a
    watch of key A timed out on a paused etcd, etcd's late answer to it went to the
    next watch, of key B, which then returned A's change as B's (found by the partition
    test's pause-etcd fault)."""
    (etcd,) = etcd_single.members
    key_a, key_b = b"/tidemq-test/watch-a", b"/tidemq-test/watch-b"

    async def scenario() -> None:
        client = EtcdClient(etcd_single.endpoints, request_timeout_ms=500)
        await client.connect()
        try:
            start = (await client.txn([], [Put(key_a, b"0")])).revision + 1
            etcd.pause()
            try:
                # Nothing answers: "no change" or "no answer", by which bound ends first.
                with contextlib.suppress(EtcdUnavailable):
                    assert (
                        await client.watch_once(key_a, start_revision=start, timeout_ms=200) is None
                    )
                watch_b = asyncio.ensure_future(
                    client.watch_once(key_b, start_revision=start, timeout_ms=5_000)
                )
            finally:
                etcd.resume()
            await client.txn([], [Put(key_a, b"1")])
            # B's watch: its own answer, none, or "ask again"; never A's change.
            (got,) = await asyncio.gather(watch_b, return_exceptions=True)
            if isinstance(got, EtcdUnavailable):
                assert "ask again" in str(got) or "no answer" in str(got)
            else:
                assert got is None or (isinstance(got, WatchEvent) and got.kv.key == key_b)
            # Asked again, the watch of B sees B's change.
            await client.txn([], [Put(key_b, b"2")])
            event = await client.watch_once(key_b, start_revision=start, timeout_ms=5_000)
            assert event is not None
            assert (event.kind, event.kv.key, event.kv.value) == (EventKind.PUT, key_b, b"2")
        finally:
            await client.close()

    loop.run(scenario())
