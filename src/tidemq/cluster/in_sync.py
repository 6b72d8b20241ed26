"""A replica group's in-sync set in etcd: the members that hold every acknowledged record.
Anyone reads it; only the group's current leader writes it, in one transaction that
compares the leader key with the writer's record (member and epoch) and the epoch key
with its epoch, so a deposed leader's write is refused, never applied late.

Built now: the record and its compare-and-swap. Not yet: who is in sync is decided by log
replication (not built), and `acks=all` will read this set (see docs/design/replication.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from tidemq.cluster.election import fenced_error
from tidemq.cluster.etcd_client import EtcdClient, Get, Put, ValueIs
from tidemq.cluster.group_keys import (
    GroupKeys,
    InSyncRecord,
    LeaderRecord,
    check_member,
    decode_in_sync,
    encode_epoch,
    encode_in_sync,
    encode_leader,
)
from tidemq.core.errors import InvalidRequest

__all__ = ["read_in_sync", "write_in_sync"]


async def read_in_sync(client: EtcdClient, keys: GroupKeys) -> InSyncRecord | None:
    """The group's in-sync set (None: never written)."""
    found = await client.get(keys.in_sync)
    return None if found is None else decode_in_sync(keys.in_sync, found.value)


async def write_in_sync(
    client: EtcdClient, keys: GroupKeys, leader: LeaderRecord, members: Iterable[str]
) -> InSyncRecord:
    """Set the in-sync set as the leader `leader`. The leader is always in its own set.
    `LeaderFenced` (naming etcd's current epoch) if `leader` no longer leads under its
    epoch; `EtcdUnavailable` if etcd does not answer in time."""
    chosen = tuple(sorted({check_member(m) for m in members}))
    if leader.member not in chosen:
        raise InvalidRequest(
            f"group {keys.group}: in-sync set {list(chosen)} lacks its leader {leader.member}"
        )
    record = InSyncRecord(leader.epoch, chosen)
    result = await client.txn(
        compare=[
            ValueIs(keys.leader, encode_leader(leader)),
            ValueIs(keys.epoch, encode_epoch(leader.epoch)),
        ],
        success=[Put(keys.in_sync, encode_in_sync(record))],
        failure=[Get(keys.leader), Get(keys.epoch)],
    )
    if not result.succeeded:
        raise fenced_error(
            keys,
            f"in-sync set from {leader.member} under stale epoch {leader.epoch} refused",
            *result.gets,
        )
    return record
