"""A client-side table of a compact topic: the latest value of every key, kept current as
messages arrive (Pulsar's TableView).

`AsyncTableView.start` reads every queue of the topic from its first offset up to the end
it had when `start` was called, so that the table is complete when `start` returns; a
background task then applies every new message. A tombstone (null value) removes its key.
Listeners are called with (key, value) for each change, value None for a removal, on the
event loop that runs the view (for `tidemq.TableView`, the client's background thread).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Final

from tidemq.client import checks
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.client.stream_consumer import AsyncStreamConsumer
from tidemq.core.errors import TidemqError
from tidemq.core.message import Message
from tidemq.net.tasks import cancel_and_wait, completes_when_cancelled

__all__ = ["AsyncTableView", "TableListener"]

log = logging.getLogger(__name__)

TableListener = Callable[[bytes, bytes | None], None]

#: How long one poll of the background task waits for new messages.
_POLL_MS: Final = 500
#: Longest `start` (and `refresh`) may go without reading anything before giving up.
_STALL_S: Final = 30.0


class AsyncTableView:
    def __init__(
        self,
        topic: str,
        bootstrap: str = "127.0.0.1:9876",
        *,
        client_config: ClientConfig | None = None,
    ) -> None:
        self.topic = checks.check_readable_topic(topic)
        self._cluster = ClusterClient(bootstrap, client_config)
        self._consumer = AsyncStreamConsumer(
            start="earliest", cluster=self._cluster, fetch_wait_ms=_POLL_MS
        )
        self._table: dict[bytes, bytes] = {}
        self._listeners: list[TableListener] = []
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def start(self) -> AsyncTableView:
        """Read the topic up to its current end, then follow it. Returns self."""
        routes = await self._cluster.topic_routes(self.topic)
        queues = list(range(routes.queue_count(self.topic)))
        self._consumer.assign([(self.topic, q) for q in queues])
        await self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._follow())
        return self

    async def refresh(self) -> None:
        """Apply every message stored before this call (read-your-writes: after a send
        returned, `refresh` makes the table show it)."""
        ends = {}
        for q in range(len(self._consumer.assignment())):
            bounds = await self._cluster.list_offsets(self.topic, q)
            if bounds.max_offset > bounds.min_offset:  # an empty queue has nothing to read
                ends[q] = bounds.max_offset
        loop = asyncio.get_running_loop()
        last_progress = loop.time()
        while True:
            behind = [
                q for q, end in ends.items() if (self._consumer.position(self.topic, q) or 0) < end
            ]
            if not behind:
                return
            async with self._lock:
                got = await self._consumer.poll(_POLL_MS)
                self._apply(got)
            if got:
                last_progress = loop.time()
            elif loop.time() - last_progress > _STALL_S:
                raise TidemqError(
                    f"table view of {self.topic!r}: no progress for {_STALL_S:.0f} s "
                    f"catching up with queues {behind}"
                )

    async def _follow(self) -> None:
        while not self._closed:
            try:
                async with self._lock:
                    self._apply(await self._consumer.poll(_POLL_MS))
            except asyncio.CancelledError:
                raise
            except TidemqError as exc:
                log.warning("table view of %r: %s (retrying)", self.topic, exc)
                await asyncio.sleep(1.0)

    def _apply(self, messages: list[Message]) -> None:
        for m in messages:
            if m.key is None:
                continue  # not a keyed message: no row
            if m.value is None:
                if self._table.pop(m.key, None) is None:
                    continue
            else:
                self._table[m.key] = m.value
            for listener in self._listeners:
                try:
                    listener(m.key, m.value)
                except Exception:
                    log.exception("a table view listener failed")

    def listen(self, listener: TableListener) -> None:
        """Call `listener(key, value)` for every change from now on (value None: the key
        was deleted)."""
        self._listeners.append(listener)

    def get(self, key: bytes) -> bytes | None:
        raw = checks.check_key(key)
        return None if raw is None else self._table.get(raw)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and key in self._table

    def __len__(self) -> int:
        return len(self._table)

    def __iter__(self) -> Iterator[bytes]:
        return iter(list(self._table))

    def snapshot(self) -> dict[bytes, bytes]:
        """A copy of the table now."""
        return dict(self._table)

    @completes_when_cancelled
    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            await cancel_and_wait(self._task)
        await self._consumer.close()
        await self._cluster.close()

    async def __aenter__(self) -> AsyncTableView:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
