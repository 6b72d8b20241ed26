"""Stream access: assign queues, seek, poll. The Spark source and the group consumer use it.

Each assigned queue has at most one fetch in flight, which long-polls on the broker
(`fetch_wait_ms`), so `poll` returns as soon as any queue has data and costs nothing while
the stream is idle. Positions are the next offset to read. A seek while a fetch is in
flight discards that fetch's answer.

Every method names one queue the same way, by topic and queue id as two arguments:
`seek(topic, queue, offset)`, `position(topic, queue)`, `seek_to_beginning(topic, queue)`;
the `seek_to_*` methods also take a topic alone (all its assigned queues) or nothing (every
assigned queue). Only `assign` takes a list, of (topic, queue) pairs.

An explicit `seek` past a queue's end is the caller's mistake, not something to paper over:
the poll that finds it raises OffsetOutOfRange naming the queue and its range, and keeps
raising until that queue is sought again (other queues wait meanwhile, as in Kafka with
`auto.offset.reset=none`). A position below the queue's start (retention removed those
messages) moves to the start. Positions the consumer chose itself follow `start`.

With `value_deserializer`, messages come with their values deserialized (the consumer's
type parameter; tombstones stay None). A value it cannot turn raises
`DeserializationFailed` naming the message, at once if the poll has nothing else, else
from the next poll; the queue stays at that message, so polls raise again until
`seek(topic, queue, offset + 1)` skips it (Kafka's behaviour).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, cast

import numpy as np
from typing_extensions import TypeVar

from tidemq.client import checks
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.client.typed_values import deserialize_values
from tidemq.core import limits
from tidemq.core.batch import tag_bit
from tidemq.core.errors import DeserializationFailed, OffsetOutOfRange, TidemqError
from tidemq.core.filters import Sql92
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

__all__ = ["AsyncStreamConsumer", "D", "TopicQueue"]

TopicQueue = tuple[str, int]
T = TypeVar("T")
#: What the consumer's `value_deserializer` returns (bytes without one).
D = TypeVar("D", default=bytes)
#: Turns one fetch answer into what a poll returns (messages or batches).
_Decode = Callable[[TopicQueue, int, FetchResponse, bytes], list[T]]
_RESETS = ("earliest", "latest", "none")


@dataclass(slots=True)
class _Fetch:
    position: int
    epoch: int
    task: asyncio.Task[tuple[FetchResponse, bytes]]


class AsyncStreamConsumer(Generic[D]):
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
        value_deserializer: Callable[[bytes], D] | None = None,
    ) -> None:
        """`start`: where an assigned queue without a position begins, and where an
        out-of-range position is reset to ("earliest", "latest", or "none": raise).

        `value_deserializer(data) -> value`: messages come with it applied to their values
        (e.g. `tidemq.AvroDeserializer(registry, Order)`); see the module docstring for a
        value it cannot turn. `poll_batches` gives the stored bytes either way.

        `filter`: a tag expression ("a || b") or `Sql92("...")` over headers and the tag,
        evaluated on the broker (checked here first: FilterSyntaxError names the column).
        `tags` is the older set form of a tag filter."""
        if not isinstance(start, str) or start not in _RESETS:
            raise ValueError(f"start must be one of {', '.join(_RESETS)}, got {start!r}")
        self._max_bytes = checks.check_int(
            max_bytes_per_queue, "max_bytes_per_queue", minimum=1, maximum=limits.MAX_BATCH_BYTES
        )
        self._wait_ms = checks.check_timeout_ms(fetch_wait_ms, "fetch_wait_ms")
        self._tag_mask = 0
        self._tags: frozenset[str] | None = None
        if tags is not None:
            if isinstance(tags, str) or not isinstance(tags, Iterable):
                raise TypeError(f"tags must be a list of tags, not {type(tags).__name__}")
            checked = [checks.check_tag(t, f"tags[{i}]") for i, t in enumerate(tags)]
            if None in checked:
                raise TypeError(f"tags[{checked.index(None)}] must be a str, got None")
            self._tags = frozenset(t for t in checked if t is not None)
            for tag in self._tags:
                self._tag_mask |= tag_bit(tag)
        self._filter_kind, self._filter_expression = (
            ("", "") if filter is None else checks.check_filter(filter)
        )
        self._cluster = cluster or ClusterClient(bootstrap, client_config)
        self._own_cluster = cluster is None
        self._start = start
        self._positions: dict[TopicQueue, int | None] = {}
        #: Queues whose position came from `seek` and has not been fetched from yet: out
        #: of range, they raise instead of being reset.
        self._sought: set[TopicQueue] = set()
        #: Queues whose sought position was out of range, with the error; cleared by a seek.
        self._failed: dict[TopicQueue, OffsetOutOfRange] = {}
        self._epochs: dict[TopicQueue, int] = {}
        self._fetches: dict[TopicQueue, _Fetch] = {}
        self._closed = False
        if value_deserializer is not None and not callable(value_deserializer):
            raise TypeError(
                f"value_deserializer must be callable, got {type(value_deserializer).__name__}"
            )
        self._deserializer = value_deserializer
        #: Queues whose message at the position failed to deserialize, raised by the next
        #: poll; cleared by a seek.
        self._undecodable: dict[TopicQueue, DeserializationFailed] = {}

    @property
    def cluster(self) -> ClusterClient:
        return self._cluster

    # ------------------------------------------------------------------ assignment

    def assign(self, queues: Iterable[TopicQueue]) -> None:
        """Read exactly these queues, a list of (topic, queue) pairs (replacing the previous
        assignment)."""
        wanted = checks.check_topic_queues(queues)
        for tq in list(self._positions):
            if tq not in wanted:
                del self._positions[tq]
                self._sought.discard(tq)
                self._failed.pop(tq, None)
                self._undecodable.pop(tq, None)
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

    def _assigned(self, topic: object, queue: object) -> TopicQueue:
        if isinstance(topic, tuple | list):
            raise TypeError(
                "name a queue by topic and queue id as two arguments, e.g. "
                f"('orders', 0) -> 'orders', 0; got the pair {topic!r}"
            )
        checked = checks.check_queue(queue)
        if checked is None:
            raise TypeError("queue must be an int, got None")
        tq = (checks.check_readable_topic(topic), checked)
        if tq not in self._positions:
            raise ValueError(f"{tq[0]}/{tq[1]} is not assigned")
        return tq

    def seek(self, topic: str, queue: int, offset: int) -> None:
        """Read `topic`/`queue` from `offset` next. Past the queue's end, the next poll
        raises OffsetOutOfRange (see the module docstring)."""
        tq = self._assigned(topic, queue)
        self._set_position(tq, checks.check_offset(offset))
        self._sought.add(tq)

    def _set_position(self, tq: TopicQueue, offset: int) -> None:
        self._cancel(tq)
        self._positions[tq] = offset
        self._sought.discard(tq)
        self._failed.pop(tq, None)
        self._undecodable.pop(tq, None)

    def position(self, topic: str, queue: int) -> int | None:
        """The next offset to read from `topic`/`queue` (None: not decided yet)."""
        return self._positions[self._assigned(topic, queue)]

    async def _bounds(self, tq: TopicQueue, timestamp_ms: int | None = None) -> ListOffsetsResponse:
        return await self._cluster.list_offsets(tq[0], tq[1], timestamp_ms)

    def _named(self, topic: object, queue: object) -> list[TopicQueue]:
        """The assigned queues `seek_to_*` means: one, all of a topic, or all."""
        if topic is None:
            if queue is not None:
                raise TypeError("a queue id needs its topic: seek_to_...(topic, queue)")
            return list(self._positions)
        if queue is None:
            if isinstance(topic, tuple | list):
                self._assigned(topic, None)  # the TypeError for a pair
            name = checks.check_readable_topic(topic)
            found = [tq for tq in self._positions if tq[0] == name]
            if not found:
                raise ValueError(f"no queue of topic {name!r} is assigned")
            return found
        return [self._assigned(topic, queue)]

    async def seek_to_beginning(self, topic: str | None = None, queue: int | None = None) -> None:
        """Move `topic`/`queue` (or every assigned queue of `topic`, or every assigned
        queue) to its first stored offset."""
        for tq in self._named(topic, queue):
            self._set_position(tq, (await self._bounds(tq)).min_offset)

    async def seek_to_end(self, topic: str | None = None, queue: int | None = None) -> None:
        """Move `topic`/`queue` (or every assigned queue of `topic`, or every assigned
        queue) to its end: only messages stored from now on are read."""
        for tq in self._named(topic, queue):
            self._set_position(tq, (await self._bounds(tq)).max_offset)

    async def seek_to_time(
        self, timestamp: float | datetime, topic: str | None = None, queue: int | None = None
    ) -> None:
        """Move `topic`/`queue` (or every assigned queue of `topic`, or every assigned
        queue) to its first message whose timestamp is at or after `timestamp` (Kafka's
        offsetsForTimes): seconds since the epoch (a float) or an aware datetime. After
        the last message: the end."""
        if timestamp is None:
            raise TypeError("timestamp must be seconds since the epoch or a datetime, got None")
        at_ms = checks.timestamp_ms(timestamp)
        for tq in self._named(topic, queue):
            await self._seek_to_time_ms(at_ms, tq)

    async def _seek_to_time_ms(self, timestamp_ms: int, tq: TopicQueue) -> None:
        found = (await self._bounds(tq, timestamp_ms)).offset_for_time
        assert found is not None
        self._set_position(tq, found)

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
        address = await self._cluster.broker_for(*tq, position)
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

    async def poll(self, timeout_ms: int = 1000) -> list[Message[D | None]]:
        """Messages from any assigned queue, waiting up to `timeout_ms` for the first.
        Raises OffsetOutOfRange for a queue sought past its end, DeserializationFailed
        for a value the deserializer cannot turn (module docstring)."""
        timeout_ms = checks.check_timeout_ms(timeout_ms)
        if self._undecodable:
            tq = next(iter(self._undecodable))
            raise self._undecodable.pop(tq)
        messages = await self._poll(timeout_ms, self._messages)
        if self._deserializer is None:
            return cast("list[Message[D | None]]", messages)
        typed, failed = deserialize_values(messages, self._deserializer)
        for exc in failed.values():
            tq = (exc.topic, exc.queue)
            self._set_position(tq, exc.offset)  # back at it until a seek skips it
            self._undecodable[tq] = exc
        if failed and not typed:
            first = next(iter(failed.values()))
            raise self._undecodable.pop((first.topic, first.queue))
        return cast("list[Message[D | None]]", typed)

    async def poll_batches(self, timeout_ms: int = 1000) -> list[MessageBatch]:
        """What `poll` returns, column by column: one `MessageBatch` per stored batch,
        with no Python object per message (numpy offsets and memoryview slices into the
        received bytes). For bulk readers: counting, copying values into Arrow, pandas or
        numpy. Positions advance exactly as with `poll`."""
        return await self._poll(checks.check_timeout_ms(timeout_ms), self._batches)

    async def _poll(self, timeout_ms: int, decode: _Decode[T]) -> list[T]:
        if self._closed:
            raise RuntimeError("the consumer is closed")
        self._raise_failed()
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            for tq in list(self._positions):
                if tq not in self._fetches and tq not in self._failed:
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
            self._raise_failed()

    def _raise_failed(self) -> None:
        for exc in self._failed.values():
            raise exc

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
            self._sought.discard(tq)
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
        past_end = position > response.max_offset
        if self._start == "none" or (past_end and tq in self._sought):
            # Kept until a seek, raised by this poll (after the messages it collected from
            # other queues are returned) and by every later one.
            self._failed[tq] = OffsetOutOfRange(
                f"offset {position} of {tq[0]}/{tq[1]} is outside the queue's range "
                f"[{response.min_offset}, {response.max_offset}]: seek within it"
            )
            return True
        target = response.min_offset if self._start == "earliest" else response.max_offset
        # Below the retained range: skip to its start, whatever `start` says.
        if position < response.min_offset:
            target = response.min_offset
        self._positions[tq] = target
        self._sought.discard(tq)
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

    async def __aiter__(self) -> AsyncIterator[Message[D | None]]:
        while not self._closed:
            for message in await self.poll():
                yield message

    async def close(self) -> None:
        self._closed = True
        for tq in list(self._fetches):
            self._cancel(tq)
        if self._own_cluster:
            await self._cluster.close()
