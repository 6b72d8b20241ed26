"""Stream access: assign queues, seek, poll. The Spark source and the group consumer use it.

Each assigned queue has at most one fetch in flight, which long-polls on the broker
(`fetch_wait_ms`), so `poll` returns as soon as any queue has data and costs nothing while
the stream is idle. Positions are the next offset to read. A seek while a fetch is in
flight discards that fetch's answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.core.batch import tag_bit
from tidemq.core.errors import OffsetOutOfRange, TidemqError
from tidemq.core.filters import Sql92, subscription
from tidemq.core.message import (
    Message,
    MessageBatch,
    batches_from_records,
    messages_from_records,
)
from tidemq.protocol.commands import (
    FetchRequest,
    FetchResponse,
    ListOffsetsResponse,
)

__all__ = ["AsyncStreamConsumer", "TopicQueue"]

TopicQueue = tuple[str, int]
T = TypeVar("T")
#: Turns one fetch answer into what a poll returns (messages or batches).
_Decode = Callable[[TopicQueue, int, FetchResponse, bytes], list[T]]
_RESETS = ("earliest", "latest", "none")


@dataclass(slots=True)
class _Fetch:
    position: int
    epoch: int
    task: asyncio.Task[tuple[FetchResponse, bytes]]


class AsyncStreamConsumer:
    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9876",
        *,
        start: str = "latest",
        max_bytes_per_queue: int = 1 << 20,
        fetch_wait_ms: int = 500,
        tags: Iterable[str] | None = None,
        filter: str | Sql92 | None = None,
        client_config: ClientConfig | None = None,
        cluster: ClusterClient | None = None,
    ) -> None:
        """`start`: where an assigned queue without a position begins, and where an
        out-of-range position is reset to ("earliest", "latest", or "none": raise).

        `filter`: a tag expression ("a || b") or `Sql92("...")` over headers and the tag,
        evaluated on the broker (checked here first: FilterSyntaxError names the column).
        `tags` is the older set form of a tag filter."""
        if start not in _RESETS:
            raise ValueError(f"start must be one of {', '.join(_RESETS)}, got {start!r}")
        self._cluster = cluster or ClusterClient(bootstrap, client_config)
        self._own_cluster = cluster is None
        self._start = start
        self._max_bytes = max_bytes_per_queue
        self._wait_ms = fetch_wait_ms
        self._tag_mask = 0
        self._tags: frozenset[str] | None = None
        if tags is not None:
            self._tags = frozenset(tags)
            for tag in self._tags:
                self._tag_mask |= tag_bit(tag)
        self._filter_kind, self._filter_expression = (
            ("", "") if filter is None else subscription(filter)
        )
        self._positions: dict[TopicQueue, int | None] = {}
        self._epochs: dict[TopicQueue, int] = {}
        self._fetches: dict[TopicQueue, _Fetch] = {}
        self._closed = False

    @property
    def cluster(self) -> ClusterClient:
        return self._cluster

    # ------------------------------------------------------------------ assignment

    def assign(self, queues: Iterable[TopicQueue]) -> None:
        """Read exactly these queues (replacing the previous assignment)."""
        wanted = [(t, int(q)) for t, q in queues]
        for tq in list(self._positions):
            if tq not in wanted:
                del self._positions[tq]
                self._cancel(tq)
        for tq in wanted:
            self._positions.setdefault(tq, None)

    def assignment(self) -> list[TopicQueue]:
        return sorted(self._positions)

    def _cancel(self, tq: TopicQueue) -> None:
        self._epochs[tq] = self._epochs.get(tq, 0) + 1
        fetch = self._fetches.pop(tq, None)
        if fetch is not None:
            fetch.task.cancel()

    def seek(self, topic: str, queue: int, offset: int) -> None:
        tq = (topic, queue)
        if tq not in self._positions:
            raise ValueError(f"{topic}/{queue} is not assigned")
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self._cancel(tq)
        self._positions[tq] = offset

    def position(self, topic: str, queue: int) -> int | None:
        return self._positions[(topic, queue)]

    async def _bounds(self, tq: TopicQueue, timestamp_ms: int | None = None) -> ListOffsetsResponse:
        return await self._cluster.list_offsets(tq[0], tq[1], timestamp_ms)

    async def seek_to_beginning(self, *queues: TopicQueue) -> None:
        for tq in queues or tuple(self._positions):
            self.seek(*tq, (await self._bounds(tq)).min_offset)

    async def seek_to_end(self, *queues: TopicQueue) -> None:
        for tq in queues or tuple(self._positions):
            self.seek(*tq, (await self._bounds(tq)).max_offset)

    async def seek_to_time(self, timestamp_ms: int, *queues: TopicQueue) -> None:
        """Each queue to its first message stored at or after `timestamp_ms`."""
        for tq in queues or tuple(self._positions):
            found = (await self._bounds(tq, timestamp_ms)).offset_for_time
            assert found is not None
            self.seek(*tq, found)

    async def _resolve(self, tq: TopicQueue) -> int:
        position = self._positions[tq]
        if position is None:
            if self._start == "none":
                raise OffsetOutOfRange(f"{tq[0]}/{tq[1]} has no position; seek first")
            bounds = await self._bounds(tq)
            position = bounds.min_offset if self._start == "earliest" else bounds.max_offset
            self._positions[tq] = position
        return position

    # ------------------------------------------------------------------ polling

    async def _fetch(self, tq: TopicQueue, position: int) -> tuple[FetchResponse, bytes]:
        address = await self._cluster.broker_for(*tq)
        request = FetchRequest(
            topic=tq[0],
            queue=tq[1],
            offset=position,
            max_bytes=self._max_bytes,
            max_wait_ms=self._wait_ms,
            tag_mask=self._tag_mask,
            filter_kind=self._filter_kind,
            filter_expression=self._filter_expression,
        )
        timeout = self._cluster.config.request_timeout_ms + self._wait_ms
        return await self._cluster.request(address, request, FetchResponse, timeout_ms=timeout)

    async def poll(self, timeout_ms: int = 1000) -> list[Message]:
        """Messages from any assigned queue, waiting up to `timeout_ms` for the first."""
        return await self._poll(timeout_ms, self._messages)

    async def poll_batches(self, timeout_ms: int = 1000) -> list[MessageBatch]:
        """What `poll` returns, column by column: one `MessageBatch` per stored batch,
        with no Python object per message (numpy offsets and memoryview slices into the
        received bytes). For bulk readers: counting, copying values into Arrow, pandas or
        numpy. Positions advance exactly as with `poll`."""
        return await self._poll(timeout_ms, self._batches)

    async def _poll(self, timeout_ms: int, decode: _Decode[T]) -> list[T]:
        if self._closed:
            raise RuntimeError("the consumer is closed")
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            for tq in list(self._positions):
                if tq not in self._fetches:
                    self._start_fetch(tq, await self._resolve(tq))
            if not self._fetches:
                await asyncio.sleep(max(0.0, deadline - time.monotonic()))
                return []
            remaining = deadline - time.monotonic()
            done, _ = await asyncio.wait(
                [f.task for f in self._fetches.values()],
                timeout=max(0.0, remaining),
                return_when=asyncio.FIRST_COMPLETED,
            )
            items = self._collect(done, decode)
            if items or time.monotonic() >= deadline:
                return items

    def _collect(
        self, done: set[asyncio.Task[tuple[FetchResponse, bytes]]], decode: _Decode[T]
    ) -> list[T]:
        out: list[T] = []
        for tq, fetch in list(self._fetches.items()):
            if fetch.task not in done:
                continue
            del self._fetches[tq]
            if fetch.epoch != self._epochs.get(tq, 0) or tq not in self._positions:
                continue  # sought or unassigned meanwhile
            try:
                response, body = fetch.task.result()
            except TidemqError as exc:
                self._cluster.invalidate(exc)
                if not exc.retriable:
                    raise
                continue
            if self._out_of_range(tq, fetch.position, response):
                continue
            out.extend(decode(tq, fetch.position, response, body))
            position = self._positions[tq] = max(response.next_offset, fetch.position)
            if response.record_sizes and position < response.max_offset:
                # Prefetch: the queue held more than this answer, so its next fetch
                # travels (and is answered at once, never parked on the broker) while the
                # caller handles this one. At most one fetch per queue, so at most
                # max_bytes_per_queue waits here per queue; a seek cancels it.
                self._start_fetch(tq, position)
        return out

    def _start_fetch(self, tq: TopicQueue, position: int) -> None:
        task = asyncio.get_running_loop().create_task(self._fetch(tq, position))
        self._fetches[tq] = _Fetch(position, self._epochs.get(tq, 0), task)

    def _out_of_range(self, tq: TopicQueue, position: int, response: FetchResponse) -> bool:
        """Handle an out-of-range answer (reset per `start`, or raise); True if it was."""
        if response.status != "offset_out_of_range":
            return False
        if self._start == "none":
            raise OffsetOutOfRange(
                f"offset {position} of {tq[0]}/{tq[1]} is outside "
                f"[{response.min_offset}, {response.max_offset})"
            )
        target = response.min_offset if self._start == "earliest" else response.max_offset
        # Below the retained range: skip to its start, whatever `start` says.
        if position < response.min_offset:
            target = response.min_offset
        self._positions[tq] = target
        return True

    def _messages(
        self, tq: TopicQueue, position: int, response: FetchResponse, body: bytes
    ) -> list[Message]:
        messages = messages_from_records(
            tq[0], tq[1], body, response.record_sizes, position, masks=response.masks
        )
        if self._tags is not None:
            messages = [m for m in messages if m.tag in self._tags]
        return messages

    def _batches(
        self, tq: TopicQueue, position: int, response: FetchResponse, body: bytes
    ) -> list[MessageBatch]:
        batches = batches_from_records(
            tq[0], tq[1], body, response.record_sizes, position, masks=response.masks
        )
        if self._tags is None:
            return batches
        out = []
        for b in batches:  # the exact tag check behind the broker's summary bits
            tags = b.tags()
            keep = [i for i, tag in zip(b.indices.tolist(), tags, strict=True) if tag in self._tags]
            if keep:
                out.append(dataclasses.replace(b, indices=np.array(keep, dtype=np.int64)))
        return out

    async def __aiter__(self) -> AsyncIterator[Message]:
        while not self._closed:
            for message in await self.poll():
                yield message

    async def close(self) -> None:
        self._closed = True
        for tq in list(self._fetches):
            self._cancel(tq)
        if self._own_cluster:
            await self._cluster.close()
