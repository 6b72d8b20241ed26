"""The producer's accumulator: single sends to one queue, gathered into one batch.

Sends to a queue made in the same loop turn (or within `linger_ms`) are sealed into one
batch, up to `batch_bytes` / `batch_messages`, and handed to the queue's ordered sender.
Only the producer's event loop calls it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from tidemq.client.producer_config import ProducerConfig
from tidemq.client.queue_sender import Batch, QueueSender, ReceiptFuture, SenderContext
from tidemq.core.batch import MessageRecord, encode_batch

__all__ = ["Accumulator"]


@dataclass(slots=True)
class _Pending:
    records: list[MessageRecord] = field(default_factory=list)
    futures: list[ReceiptFuture] = field(default_factory=list)
    size: int = 0
    timer: asyncio.TimerHandle | asyncio.Handle | None = None


class Accumulator:
    """Messages waiting to be sealed into a batch, per (topic, queue)."""

    def __init__(
        self,
        config: ProducerConfig,
        context: SenderContext,
        sender_for: Callable[[str, int], QueueSender],
    ) -> None:
        self._config = config
        self._ctx = context
        self._sender_for = sender_for
        self._pending: dict[tuple[str, int], _Pending] = {}

    def holds(self, topic: str, queue: int) -> bool:
        """Whether messages for this queue wait here (a later send must go after them)."""
        return (topic, queue) in self._pending

    def add(self, topic: str, queue: int, record: MessageRecord, future: ReceiptFuture) -> None:
        """Add a message to its queue's batch (sealed this loop turn, after `linger_ms`,
        or when full)."""
        config = self._config
        size = _approx_size(record)
        pending = self._pending.get((topic, queue))
        if pending is not None and pending.size + size > config.max_request_bytes:
            # Together they might be too large to send: the accumulated batch goes first, so
            # that a message too large on its own fails alone (when its batch is encoded).
            self.seal(topic, queue)
        pending = self._pending.setdefault((topic, queue), _Pending())
        pending.records.append(record)
        pending.futures.append(future)
        pending.size += size
        if pending.size >= config.batch_bytes or len(pending.records) >= config.batch_messages:
            self.seal(topic, queue)
        elif pending.timer is None:
            loop = asyncio.get_running_loop()
            if config.linger_ms > 0:
                pending.timer = loop.call_later(config.linger_ms / 1000, self.seal, topic, queue)
            else:
                pending.timer = loop.call_soon(self.seal, topic, queue)

    def seal(self, topic: str, queue: int) -> None:
        """Encode the queue's messages as one batch and hand it to the queue's sender."""
        pending = self._pending.pop((topic, queue), None)
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        try:
            payload = encode_batch(
                pending.records,
                codec=self._config.codec,
                max_batch_bytes=self._config.max_request_bytes,
            )
        except Exception as exc:  # e.g. too large: these messages fail, nothing hangs
            for fut in pending.futures:
                if not fut.done():
                    fut.set_exception(exc)
            return
        batch = Batch(
            topic,
            queue,
            payload,
            len(pending.records),
            pending.futures,
            None,
            self._ctx.new_deadline(),
        )
        self._sender_for(topic, queue).add(batch)

    def seal_all(self) -> None:
        for topic, queue in list(self._pending):
            self.seal(topic, queue)


def _approx_size(record: MessageRecord) -> int:
    size = 24 + len(record.value or b"") + len(record.key or b"")
    if record.headers:
        size += sum(len(k) + len(v) + 8 for k, v in record.headers)
    return size
