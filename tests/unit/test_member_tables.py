"""Tier ranges and static chains as records of `%SYS%TABLES` (`broker/member_tables.py`):
what a leader publishes reaches a follower's tables as far as the follower's committed
position goes, a cut suffix's rows are replaced by reading the topic again, a deleted
topic's rows are skipped, and each start writes every row (a directory from before the
topic, a change whose publish a crash cut off)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from tidemq.broker.member_tables import TABLES_TOPIC, MemberTables, catch_up
from tidemq.broker.store_gateway import StoreGateway
from tidemq.core.static_chain import Link, QueueChain
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.message_store import MessageStore
from tidemq.store.remote_ranges import RemoteRange
from tidemq.store.replica_log import LogChunk, TopicsBehind

CHAIN = QueueChain(
    queue=1,
    epoch=2,
    links=(
        Link(broker="other", logical_start=0, physical_start=0, physical_end=10),
        Link(broker="g1", logical_start=10, physical_start=0),
    ),
)


def _open(data_dir: Path) -> MessageStore:
    return MessageStore.open(StoreConfig(data_dir=data_dir, flush_mode=FlushMode.SYNC))


def _on_leader(
    data_dir: Path, body: Callable[[MessageStore, MemberTables], Awaitable[None]]
) -> None:
    async def main() -> None:
        store = _open(data_dir)
        gateway = StoreGateway(store, asyncio.get_running_loop(), lambda _: None)
        try:
            tables = MemberTables(gateway, replicated=True)
            await tables.start()
            await body(store, tables)
        finally:
            await gateway.close()
            store.close()

    asyncio.run(main())


def _copy(leader: MessageStore, follower: MessageStore) -> None:
    """What a follower's fetch rounds do with the leader's log: copy it by position."""
    while chunk := leader.replica.read_chunk(
        follower.end_position, 1 << 20, limit=leader.end_position
    ):
        if not chunk.data:
            follower.flush()
            return
        try:
            follower.replica.append_chunk(LogChunk(chunk.position, chunk.data, chunk.records))
        except TopicsBehind:
            follower.replica.mirror_topics(leader.topics(), leader.metadata.max_topic_id())


def _publish_some(root: Path) -> None:
    async def publish(store: MessageStore, tables: MemberTables) -> None:
        store.create_topic("t", 2)
        store.create_topic("s", 2)
        tid = store.topic("t").id
        store.remote.set((tid, 0), 0, 40)
        store.remote.set((tid, 1), 5, 9)
        store.set_static_chain("s", 1, CHAIN, writable=True)
        await tables.publish()
        store.remote.set((tid, 0), 10, 60)  # remote retention, then another upload
        await tables.publish()
        await tables.publish()  # nothing changed: nothing written
        assert store.queue_bounds(TABLES_TOPIC, 0)[1] == 4

    _on_leader(root / "leader", publish)


def test_a_follower_takes_the_leaders_rows_up_to_its_committed_position(tmp_path: Path) -> None:
    _publish_some(tmp_path)
    leader, follower = _open(tmp_path / "leader"), _open(tmp_path / "follower")
    try:
        _copy(leader, follower)
        tid = follower.topic("t").id
        follower.commit_limit = 0  # nothing committed yet: nothing applied
        catch_up(follower)
        assert follower.remote.get((tid, 0)) is None
        follower.commit_limit = follower.end_position
        assert catch_up(follower) == 4
        assert follower.remote.get((tid, 0)) == RemoteRange(10, 60)
        assert follower.remote.get((tid, 1)) == RemoteRange(5, 9)
        assert follower.static_chain("s", 1) == CHAIN
        assert follower.static_writable("s", 1)
        assert not follower.remote.changed
        assert not follower.static.changed
        assert catch_up(follower) == 0  # stands at the end
    finally:
        follower.close()
        leader.close()


def test_a_cut_below_where_the_tables_stand_reads_the_topic_again(tmp_path: Path) -> None:
    _publish_some(tmp_path)
    leader, follower = _open(tmp_path / "leader"), _open(tmp_path / "follower")
    try:
        _copy(leader, follower)
        catch_up(follower)
        tid = follower.topic("t").id
        follower.remote.set((tid, 1), 7, 8)  # as a record later cut had set it
        follower.metadata.set_tables_applied(99)  # past the topic's end: records were cut
        assert catch_up(follower) == 4
        assert follower.remote.get((tid, 1)) == RemoteRange(5, 9)
    finally:
        follower.close()
        leader.close()


def test_rows_of_a_deleted_topic_are_skipped(tmp_path: Path) -> None:
    _publish_some(tmp_path)
    leader, follower = _open(tmp_path / "leader"), _open(tmp_path / "follower")
    try:
        _copy(leader, follower)
        follower.delete_topic("t")
        assert catch_up(follower) == 1  # the chain only
        assert follower.static_chain("s", 1) == CHAIN
    finally:
        follower.close()
        leader.close()


def test_each_start_writes_every_row_also_from_a_directory_from_before_the_topic(
    tmp_path: Path,
) -> None:
    """A directory from before the topic has its rows in the tables only; a change made
    just before a crash may have missed its publish: each start writes every row."""
    store = _open(tmp_path / "old")
    store.create_topic("t", 1)
    key = (store.topic("t").id, 0)
    store.remote.set(key, 3, 30)
    store.close()
    ends = []

    async def check(store: MessageStore, _tables: MemberTables) -> None:
        assert store.remote.get(key) == RemoteRange(3, 30)
        end = store.queue_bounds(TABLES_TOPIC, 0)[1]
        assert store.metadata.tables_applied() == end
        ends.append(end)

    _on_leader(tmp_path / "old", check)
    _on_leader(tmp_path / "old", check)
    assert ends == [1, 2]
