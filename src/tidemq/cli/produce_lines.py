"""The engine of `tidemq produce`: lines of a stream to messages, many sends on their way at
once, receipts settled in line order.

Lines are read in blocks of about `BATCH_BYTES`. Three ways to send, all keeping each
queue's order (the producer keeps per-queue order, retries included):

* no key per line: a block goes as one `send_batch` (one record, one index entry): to
  `--queue`, else to the queue of `--key`, else to the next queue round robin, block after
  block (like Kafka's sticky partitioner);
* a key per line (`--key-separator`) and `queue_of`, the producer's own key hashing: a
  block goes as one `send_batch` per queue its keys map to, keys kept per message;
* `one_by_one` (`--no-batch`), or a key per line without `queue_of`: one `send_async` per
  line (the producer batches them per queue within its linger).

At most `window` blocks (or single sends) are outstanding; the oldest is settled before
another leaves. A failed send stops the reading; what is outstanding is settled to count
what was acknowledged, then `ProduceFailed` is raised.
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

from tidemq.core.errors import TidemqError
from tidemq.core.message import Receipt

__all__ = [
    "BATCH_BYTES",
    "BATCH_LINES",
    "BATCH_WINDOW",
    "SINGLE_WINDOW",
    "LineFormatError",
    "ProduceFailed",
    "Sender",
    "Stats",
    "read_lines",
    "send_lines",
]

#: Bytes of lines read at a time: a block, sent as one batch (or one per queue).
BATCH_BYTES = 256 << 10
#: Lines in a block at most (short lines): well under a batch's 65,536 messages.
BATCH_LINES = 16_384
#: Blocks outstanding at most: about 8 MiB of lines.
BATCH_WINDOW = 32
#: Single sends outstanding at most (`one_by_one` with batching on).
SINGLE_WINDOW = 10_000


class Sender(Protocol):
    """What of `tidemq.Producer` the engine uses."""

    def send_async(
        self, topic: str, value: bytes | None, *, key: bytes | None, tag: str | None,
        queue: int | None,
    ) -> concurrent.futures.Future[Receipt]: ...  # fmt: skip

    def send_batch_async(
        self, topic: str, values: Sequence[bytes | None], *,
        keys: Sequence[bytes | None] | None, tags: Sequence[str | None] | None,
        queue: int | None,
    ) -> concurrent.futures.Future[Sequence[Receipt]]: ...  # fmt: skip


class LineFormatError(ValueError):
    """A line without the key separator."""


class ProduceFailed(Exception):
    """A send failed; `stats` says how many messages were sent and acknowledged."""

    def __init__(self, error: BaseException, stats: Stats) -> None:
        super().__init__(str(error) or type(error).__name__)
        self.error = error
        self.stats = stats


@dataclass
class Stats:
    """Counts of one run: messages handed to the producer and acknowledged, and the bytes
    (keys and values) of the acknowledged ones."""

    sent: int = 0
    acknowledged: int = 0
    acknowledged_bytes: int = 0
    started_s: float = 0.0
    elapsed_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.acknowledged / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        return (
            f"produced {self.acknowledged} message(s), {self.acknowledged_bytes} bytes "
            f"in {self.elapsed_s:.2f} s ({self.rate:,.0f} msg/s)"
        )


def read_lines(
    stream: IO[bytes], hint_bytes: int = BATCH_BYTES, max_lines: int = BATCH_LINES
) -> Iterator[list[bytes]]:
    """Lines in blocks of about `hint_bytes` and at most `max_lines`, without their `\\n`
    or `\\r\\n`."""
    while block := stream.readlines(hint_bytes):
        lines = [line.removesuffix(b"\n").removesuffix(b"\r") for line in block]
        for start in range(0, len(lines), max_lines):
            yield lines[start : start + max_lines]


_Future = concurrent.futures.Future[Sequence[Receipt]] | concurrent.futures.Future[Receipt]


@dataclass(frozen=True)
class _Outstanding:
    """Sends of one block (or one line): their futures, and for a block split by queue,
    the line (0-based, within the block) of each receipt of each future."""

    futures: Sequence[_Future]
    sizes_bytes: list[int]
    lines: list[list[int]] | None = None


class _Run:
    """One `send_lines` call: the sends on their way, oldest first, and the counts."""

    def __init__(
        self,
        producer: Sender,
        topic: str,
        *,
        window: int,
        on_receipts: Callable[[Sequence[Receipt]], None] | None,
        stats: Stats,
    ) -> None:
        self.producer = producer
        self.topic = topic
        self.window = window
        self.on_receipts = on_receipts
        self.stats = stats
        self.outstanding: collections.deque[tuple[_Outstanding, list[int]]] = collections.deque()
        self.failure: BaseException | None = None

    def add(self, sent: _Outstanding, counts: list[int]) -> None:
        """`counts`: how many messages each of `sent.futures` carries."""
        self.outstanding.append((sent, counts))
        self.stats.sent += sum(counts)
        while len(self.outstanding) > self.window:
            self.settle_oldest()

    def settle_oldest(self) -> None:
        sent, counts = self.outstanding.popleft()
        answers: list[Sequence[Receipt] | None] = []
        for future, count, size in zip(sent.futures, counts, sent.sizes_bytes, strict=True):
            try:
                result = future.result()
            except (TidemqError, OSError, ValueError) as exc:
                if self.failure is None:
                    self.failure = exc
                answers.append(None)
                continue
            answers.append((result,) if isinstance(result, Receipt) else result)
            self.stats.acknowledged += count
            self.stats.acknowledged_bytes += size
        if self.on_receipts is None:
            return
        if sent.lines is None:
            for receipts in answers:
                if receipts is not None:
                    self.on_receipts(receipts)
            return
        # Back in line order: the block was split by queue.
        by_line: dict[int, Receipt] = {}
        for receipts, lines in zip(answers, sent.lines, strict=True):
            if receipts is not None:
                by_line.update(zip(lines, receipts, strict=True))
        self.on_receipts([by_line[i] for i in sorted(by_line)])

    def settle_all(self) -> None:
        while self.outstanding:
            self.settle_oldest()

    def send_one(self, value: bytes, key: bytes | None, tag: str | None, queue: int | None) -> None:
        future: _Future
        try:
            future = self.producer.send_async(self.topic, value, key=key, tag=tag, queue=queue)
        except (TidemqError, ValueError) as exc:  # refused before it left: a failed send
            future = _failed(exc)
        self.add(_Outstanding([future], [len(value) + len(key or b"")]), [1])

    def send_batch(
        self,
        values: list[bytes],
        keys: list[bytes] | None,
        tag: str | None,
        queue: int | None,
    ) -> concurrent.futures.Future[Sequence[Receipt]]:
        try:
            return self.producer.send_batch_async(
                self.topic,
                values,
                keys=keys,
                tags=None if tag is None else [tag] * len(values),
                queue=queue,
            )
        except (TidemqError, ValueError) as exc:  # refused before it left: a failed send
            return _failed(exc)


def _failed(error: Exception) -> concurrent.futures.Future[Sequence[Receipt]]:
    future: concurrent.futures.Future[Sequence[Receipt]] = concurrent.futures.Future()
    future.set_exception(error)
    return future


def _split(line: bytes, separator: bytes, number: int) -> tuple[bytes, bytes]:
    key, found, value = line.partition(separator)
    if not found:
        raise LineFormatError(f"line {number} has no key separator {separator.decode()!r}")
    return key, value


def _send_each(run: _Run, block: list[bytes], first_number: int, options: _Options) -> None:
    for number, line in enumerate(block, first_number):
        key, value = options.key, line
        if options.separator is not None:
            key, value = _split(line, options.separator, number)
        if options.encode is not None:
            value = options.encode(value, number)
        run.send_one(value, key, options.tag, options.queue)
        if run.failure is not None:
            return


def _send_block(run: _Run, block: list[bytes], first_number: int, options: _Options) -> None:
    if options.encode is not None:
        encode = options.encode
        block = [encode(value, number) for number, value in enumerate(block, first_number)]
    n = len(block)
    key = options.key
    future = run.send_batch(block, None if key is None else [key] * n, options.tag, options.queue)
    size = sum(map(len, block)) + (0 if key is None else len(key) * n)
    run.add(_Outstanding([future], [size]), [n])


def _send_by_queue(run: _Run, block: list[bytes], first_number: int, options: _Options) -> None:
    """Keyed lines of a block, one batch per queue their keys map to (`queue_of`), each in
    line order. A line without the separator fails after the lines before it are sent."""
    assert options.separator is not None
    assert options.queue_of is not None
    queue_of, separator = options.queue_of, options.separator
    groups: dict[int, tuple[list[bytes], list[bytes], list[int]]] = {}
    error: LineFormatError | None = None
    for index, line in enumerate(block):
        key, found, value = line.partition(separator)
        if not found:
            error = LineFormatError(
                f"line {first_number + index} has no key separator {separator.decode()!r}"
            )
            break
        if options.encode is not None:
            value = options.encode(value, first_number + index)
        queue = queue_of(key)
        group = groups.get(queue)
        if group is None:
            group = groups[queue] = ([], [], [])
        group[0].append(value)
        group[1].append(key)
        group[2].append(index)
    if groups:
        futures, sizes, counts, line_lists = [], [], [], []
        for queue, (values, keys, lines) in groups.items():
            futures.append(run.send_batch(values, keys, options.tag, queue))
            sizes.append(sum(map(len, values)) + sum(map(len, keys)))
            counts.append(len(values))
            line_lists.append(lines)
        run.add(_Outstanding(futures, sizes, line_lists), counts)
    if error is not None:
        raise error


@dataclass(frozen=True)
class _Options:
    key: bytes | None
    separator: bytes | None
    tag: str | None
    queue: int | None
    queue_of: Callable[[bytes], int] | None
    #: (value, line number) -> the bytes to send (LineFormatError naming the line).
    encode: Callable[[bytes, int], bytes] | None = None


def send_lines(
    producer: Sender,
    topic: str,
    blocks: Iterable[list[bytes]],
    *,
    key: bytes | None = None,
    separator: bytes | None = None,
    tag: str | None = None,
    queue: int | None = None,
    queue_of: Callable[[bytes], int] | None = None,
    encode: Callable[[bytes, int], bytes] | None = None,
    one_by_one: bool = False,
    window: int | None = None,
    on_receipts: Callable[[Sequence[Receipt]], None] | None = None,
    on_progress: Callable[[Stats], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Stats:
    """Send every line of `blocks`; return the counts once every send is acknowledged.

    Raises `LineFormatError` for a line without `separator` (after settling what was sent)
    and `ProduceFailed` when a send fails. `queue_of(key)`: the queue a key maps to (the
    producer's own hashing, `queue_for_key`); with it, keyed lines go as one batch per
    queue per block instead of one send each. `encode(value, line number)`: what to send
    for a line's value (a schema'd encoding). `one_by_one`: one `send_async` per line;
    `window` 0 waits for each receipt before the next send. `on_receipts` gets the
    receipts in line order."""
    stats = Stats(started_s=clock())
    if queue is not None:
        queue_of = lambda _key: queue  # noqa: E731 - every key to the one queue asked for
    options = _Options(key, separator, tag, queue, queue_of, encode)
    by_queue = separator is not None and options.queue_of is not None and not one_by_one
    per_line = not by_queue and (separator is not None or one_by_one)
    if window is None:
        window = SINGLE_WINDOW if per_line else BATCH_WINDOW
    run = _Run(producer, topic, window=window, on_receipts=on_receipts, stats=stats)
    number = 1
    try:
        for block in blocks:
            if by_queue:
                _send_by_queue(run, block, number, options)
            elif per_line:
                _send_each(run, block, number, options)
            else:
                _send_block(run, block, number, options)
            number += len(block)
            if run.failure is not None:
                break
            if on_progress is not None:
                stats.elapsed_s = clock() - stats.started_s
                on_progress(stats)
    finally:
        run.settle_all()
        stats.elapsed_s = clock() - stats.started_s
    if on_progress is not None:
        on_progress(stats)
    if run.failure is not None:
        raise ProduceFailed(run.failure, stats)
    return stats
