"""Pull on miss (ADR 17): a broker that has never held a group's offsets takes, per queue,
the newest committed offset the other brokers hold, once per group per run; never over
offsets committed here; skipping brokers that fail or do not answer in time. On a real
store behind a real gateway; the other brokers are plain functions."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import pytest

from tidemq.broker.offset_book import OffsetBook
from tidemq.broker.offset_pull import HeldOffset, OffsetPull, newest_offsets
from tidemq.broker.peer_links import check_peer_request, is_peer, others
from tidemq.broker.store_gateway import StoreGateway
from tidemq.core.errors import AuthorizationFailed, BrokerNotAvailable
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import FetchOffsetsRequest, ListGroupsRequest
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import MessageStore

#: Long enough never to fire in a test that expects answers, short for the one that waits.
TIMEOUT_MS = 10_000


def _qo(queue: int, offset: int, at_ms: int) -> HeldOffset:
    return HeldOffset("t", queue, offset, at_ms)


class Peers:
    """The other brokers: name -> their answers, each a list of offsets or an error.
    `asked` counts the requests; `release` holds every answer until set."""

    def __init__(self, answers: Mapping[str, list[HeldOffset] | Exception]) -> None:
        self.answers = dict(answers)
        self.asked: list[tuple[str, str]] = []
        self.called = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()
        self.list_error: Exception | None = None

    async def live(self) -> Mapping[str, str]:
        if self.list_error is not None:
            raise self.list_error
        return {name: f"{name}:1" for name in self.answers}

    async def offsets(self, address: str, group: str) -> list[HeldOffset]:
        self.asked.append((address, group))
        self.called.set()
        await self.release.wait()
        answer = self.answers[address.removesuffix(":1")]
        if isinstance(answer, Exception):
            raise answer
        return answer


async def _pull(
    tmp_path: Path, peers: Peers, timeout_ms: int = TIMEOUT_MS
) -> tuple[MessageStore, StoreGateway, OffsetPull, OffsetBook]:
    store = MessageStore.open(StoreConfig(data_dir=tmp_path))
    store.create_topic("t", 3)
    gateway = StoreGateway(store, asyncio.get_running_loop(), lambda _: None)
    book = OffsetBook(gateway)
    await book.start()
    pull = OffsetPull(
        book, peers=peers.live, peer_offsets=peers.offsets, request_timeout_ms=timeout_ms
    )
    return store, gateway, pull, book


def test_newest_offsets_take_the_last_commit_of_each_queue() -> None:
    answers = [
        [_qo(0, 10, 1_000), _qo(1, 7, 3_000)],
        [_qo(0, 12, 2_000), _qo(1, 9, 1_000), _qo(2, 4, 1_000)],
        [_qo(2, 3, 1_000)],  # the same time as the other's: the smaller offset
    ]
    assert newest_offsets(answers) == {("t", 0): 12, ("t", 1): 7, ("t", 2): 3}
    assert newest_offsets([]) == {}


def test_a_group_new_here_takes_the_newest_offsets_once(tmp_path: Path) -> None:
    async def main() -> None:
        peers = Peers({"a": [_qo(0, 10, 1_000), _qo(1, 5, 5_000)], "b": [_qo(0, 20, 2_000)]})
        store, gateway, pull, _book = await _pull(tmp_path, peers)
        await pull.ensure("g")
        assert store.committed_offsets("g") == {("t", 0): 20, ("t", 1): 5}
        assert sorted(peers.asked) == [("a:1", "g"), ("b:1", "g")]
        # Settled: not asked again.
        await pull.ensure("g")
        assert len(peers.asked) == 2
        await gateway.close()

    asyncio.run(main())


def test_a_group_with_offsets_here_is_never_pulled(tmp_path: Path) -> None:
    async def main() -> None:
        peers = Peers({"a": [_qo(0, 99, 9_000)]})
        store, gateway, pull, book = await _pull(tmp_path, peers)
        await book.commit("g", {("t", 0): 3})
        await pull.ensure("g")
        assert peers.asked == []
        assert store.committed_offsets("g") == {("t", 0): 3}
        await gateway.close()

    asyncio.run(main())


def test_concurrent_requests_share_one_pull_and_local_commits_win(tmp_path: Path) -> None:
    async def main() -> None:
        peers = Peers({"a": [_qo(0, 10, 1_000), _qo(1, 10, 1_000)]})
        peers.release.clear()
        store, gateway, pull, book = await _pull(tmp_path, peers)
        first = asyncio.create_task(pull.ensure("g"))
        second = asyncio.create_task(pull.ensure("g"))
        await peers.called.wait()  # the pull is out, held before its answer
        # A commit made here while the pull is out is newer than anything pulled.
        await book.commit("g", {("t", 1): 42})
        peers.release.set()
        await asyncio.gather(first, second)
        assert peers.asked == [("a:1", "g")]
        assert store.committed_offsets("g") == {("t", 0): 10, ("t", 1): 42}
        await gateway.close()

    asyncio.run(main())


def test_failing_and_silent_brokers_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        silent = asyncio.Event()  # never set: that broker never answers

        class Mixed(Peers):
            async def offsets(self, address: str, group: str) -> list[HeldOffset]:
                if address == "silent:1":
                    await silent.wait()
                return await super().offsets(address, group)

        peers = Mixed(
            {
                "a": [_qo(0, 10, 1_000)],
                "down": BrokerNotAvailable("connection refused"),
                "silent": [_qo(0, 99, 9_000)],
            }
        )
        store, gateway, pull, _book = await _pull(tmp_path, peers, timeout_ms=100)
        await pull.ensure("g")
        assert store.committed_offsets("g") == {("t", 0): 10}
        await gateway.close()

    asyncio.run(main())
    skipped = " ".join(r.getMessage() for r in caplog.records)
    assert "broker down (down:1)" in skipped
    assert "broker silent (silent:1)" in skipped


def test_without_the_broker_list_nothing_is_pulled_and_nothing_raised(tmp_path: Path) -> None:
    async def main() -> None:
        peers = Peers({"a": [_qo(0, 10, 1_000)]})
        peers.list_error = BrokerNotAvailable("no name server answered")
        store, gateway, pull, _book = await _pull(tmp_path, peers)
        await pull.ensure("g")
        assert store.committed_offsets("g") == {}
        assert peers.asked == []
        await gateway.close()

    asyncio.run(main())


def test_a_brokers_login_may_only_fetch_offsets_from_the_store() -> None:
    request = FetchOffsetsRequest(group="g", local_only=True)
    assert check_peer_request(RequestCode.FETCH_OFFSETS, request) is request
    with pytest.raises(AuthorizationFailed):
        check_peer_request(RequestCode.FETCH_OFFSETS, FetchOffsetsRequest(group="g"))
    with pytest.raises(AuthorizationFailed):
        check_peer_request(RequestCode.LIST_GROUPS, ListGroupsRequest())
    assert is_peer("Broker:b1")
    assert not is_peer("User:alice")
    assert not is_peer(None)


def test_others_leaves_this_broker_out() -> None:
    live = {"a": "h:1", "b": "h:2", "c": "h:3"}
    assert others(live, "b", "h:2") == {"a": "h:1", "c": "h:3"}
    # Registered under its name with another address (a restart): still itself.
    assert others(live, "a", "h:9") == {"b": "h:2", "c": "h:3"}
