"""The offset book: committed offsets are records of a compact internal topic, and the
metadata table is only a view of it that catches up before each lookup. Whatever the view
misses (a crash between the append and the view's update, a follower's copy of the
leader's records, a compaction, a rebuild) comes back from the topic; a deleted topic's
offsets do not."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

from tidemq.broker.offset_book import OFFSETS_TOPIC, OffsetBook
from tidemq.broker.store_gateway import StoreGateway
from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.message_store import MessageStore

_encode = msgspec.msgpack.encode


def _with_book(data_dir: Path, body: Callable[[MessageStore, OffsetBook], Awaitable[None]]) -> None:
    async def main() -> None:
        store = MessageStore.open(StoreConfig(data_dir=data_dir, flush_mode=FlushMode.SYNC))
        gateway = StoreGateway(store, asyncio.get_running_loop(), lambda _: None)
        try:
            if not any(t.name == "t" for t in store.topics()):
                store.create_topic("t", 4)
            book = OffsetBook(gateway)
            await book.start()
            await body(store, book)
        finally:
            await gateway.close()
            store.close()

    asyncio.run(main())


def test_commits_are_records_of_the_topic_and_survive_a_lost_view(tmp_path: Path) -> None:
    async def commit(store: MessageStore, book: OffsetBook) -> None:
        await book.commit("g", {("t", 0): 5, ("t", 1): 7})
        await book.commit("g", {("t", 0): 9})
        await book.commit("h", {("t", 3): 1})
        assert await book.committed("g") == {("t", 0): 9, ("t", 1): 7}
        assert await book.groups() == ["g", "h"]
        assert store.queue_bounds(OFFSETS_TOPIC, 0)[1] == 4  # one message per queue
        store.metadata.clear_offsets_view()  # as if the view had never been kept

    async def look(_store: MessageStore, book: OffsetBook) -> None:
        assert await book.committed("g") == {("t", 0): 9, ("t", 1): 7}
        assert await book.committed("h") == {("t", 3): 1}

    _with_book(tmp_path, commit)
    _with_book(tmp_path, look)


def test_records_the_view_has_not_taken_are_applied_before_a_lookup(tmp_path: Path) -> None:
    """A crash between the append and the view's update, or a follower that copied its
    leader's records: the records are in the topic, the view is behind."""

    async def body(store: MessageStore, book: OffsetBook) -> None:
        await book.commit("g", {("t", 0): 1})
        topic_id = store.topic("t").id
        message = MessageRecord(_encode((topic_id, 42, 0)), _encode(("g", "t", 0)))
        store.append(OFFSETS_TOPIC, 0, encode_batch([message]))
        book.catch_up()
        # Not durable yet, so not visible: the view cannot take it...
        assert store.committed_offsets("g") == {("t", 0): 1}
        # ... and a lookup waits until it is, rather than answer an older offset.
        assert await book.committed("g") == {("t", 0): 42}
        assert store.flushed_position == store.end_position

    _with_book(tmp_path, body)


def test_a_view_ahead_of_its_topic_is_rebuilt(tmp_path: Path) -> None:
    """An unclean election can cut records the view had taken: it is rebuilt."""

    async def body(store: MessageStore, book: OffsetBook) -> None:
        await book.commit("g", {("t", 0): 3})
        store.metadata.apply_offsets([("g", "t", 1, 99, 0)], 50)  # records no longer there
        assert await book.committed("g") == {("t", 0): 3}
        assert store.metadata.offsets_applied() == 1

    _with_book(tmp_path, body)


def test_a_deleted_topic_offsets_do_not_come_back(tmp_path: Path) -> None:
    async def body(store: MessageStore, book: OffsetBook) -> None:
        await book.commit("g", {("t", 0): 3, ("u", 0): 4})  # u: not hosted here
        store.delete_topic("t")
        store.create_topic("t", 4)
        assert await book.committed("g") == {("u", 0): 4}
        store.metadata.clear_offsets_view()
        assert await book.committed("g") == {("u", 0): 4}
        await book.commit("g", {("t", 0): 1})
        assert await book.committed("g") == {("t", 0): 1, ("u", 0): 4}

    _with_book(tmp_path, body)


def test_compaction_keeps_the_newest_offset_of_each_queue(tmp_path: Path) -> None:
    async def body(store: MessageStore, book: OffsetBook) -> None:
        for i in range(1, 201):
            await book.commit("g", {("t", i % 4): i})
        store.flush()
        store.compact(OFFSETS_TOPIC, 0)
        assert store.compacted.get((store.topic(OFFSETS_TOPIC).id, 0)) is not None
        store.metadata.clear_offsets_view()
        assert await book.committed("g") == {
            ("t", 0): 200,
            ("t", 1): 197,
            ("t", 2): 198,
            ("t", 3): 199,
        }

    _with_book(tmp_path, body)


def test_offsets_kept_before_the_book_move_into_the_topic_once(tmp_path: Path) -> None:
    """A data directory of a version that kept offsets in the table only."""
    store = MessageStore.open(StoreConfig(data_dir=tmp_path, flush_mode=FlushMode.SYNC))
    store.create_topic("t", 4)
    store.commit_offsets("g", {("t", 0): 11, ("t", 2): 12})
    store.close()

    async def first(store: MessageStore, book: OffsetBook) -> None:
        assert await book.committed("g") == {("t", 0): 11, ("t", 2): 12}
        assert store.queue_bounds(OFFSETS_TOPIC, 0)[1] == 2
        store.metadata.clear_offsets_view()
        assert await book.committed("g") == {("t", 0): 11, ("t", 2): 12}

    async def again(store: MessageStore, book: OffsetBook) -> None:
        assert store.queue_bounds(OFFSETS_TOPIC, 0)[1] == 2  # not written twice
        assert await book.committed("g") == {("t", 0): 11, ("t", 2): 12}

    _with_book(tmp_path, first)
    _with_book(tmp_path, again)


def test_adopted_offsets_never_overwrite_a_commit_made_here(tmp_path: Path) -> None:
    """Offsets pulled from other brokers (a group that moved here) fill only the queues
    the group has nothing for here, counting a commit still on its way to the disk."""

    async def body(store: MessageStore, book: OffsetBook) -> None:
        await book.commit("g", {("t", 0): 5})
        local = asyncio.create_task(book.commit("g", {("t", 1): 42}))
        # One turn of the loop (the task was scheduled first): the commit is appended
        # and waits for its flush.
        turn = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(turn.set_result, None)
        await turn
        assert store.queue_bounds(OFFSETS_TOPIC, 0)[1] == 2
        adopted = await book.adopt("g", {("t", 0): 1, ("t", 1): 2, ("t", 2): 3})
        await local
        assert adopted == {("t", 2): 3}
        assert await book.committed("g") == {("t", 0): 5, ("t", 1): 42, ("t", 2): 3}

    _with_book(tmp_path, body)
