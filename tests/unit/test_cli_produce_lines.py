"""`tidemq produce`'s engine (cli/produce_lines.py) against a fake producer: batches in
line order, a bounded number of sends outstanding, failures counted."""

from __future__ import annotations

import concurrent.futures
import io
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from tidemq.cli.produce_lines import (
    LineFormatError,
    ProduceFailed,
    Stats,
    read_lines,
    send_lines,
)
from tidemq.core.errors import TopicNotFound
from tidemq.core.message import Receipt


@dataclass
class FakeProducer:
    """Records every send; answers at once (or fails the sends listed in `fail_at`)."""

    fail_at: set[int] = field(default_factory=set)
    sends: list[tuple[str, list[bytes | None], list[bytes | None] | None, str | None]] = field(
        default_factory=list
    )
    offset: int = 0

    def _answer(self, n: int, queue: int | None) -> list[Receipt]:
        receipts = [Receipt("t", queue or 0, self.offset + i) for i in range(n)]
        self.offset += n
        return receipts

    def _future(self, value: object) -> concurrent.futures.Future[object]:
        future: concurrent.futures.Future[object] = concurrent.futures.Future()
        if len(self.sends) - 1 in self.fail_at:
            future.set_exception(TopicNotFound("topic 't' does not exist"))
        else:
            future.set_result(value)
        return future

    def send_async(
        self, topic: str, value: bytes | None, *, key: bytes | None, tag: str | None,
        queue: int | None,
    ) -> concurrent.futures.Future[Receipt]:  # fmt: skip
        self.sends.append((topic, [value], [key], tag))
        return self._future(self._answer(1, queue)[0])  # type: ignore[return-value]

    def send_batch_async(
        self, topic: str, values: Sequence[bytes | None], *,
        keys: Sequence[bytes | None] | None, tags: Sequence[str | None] | None,
        queue: int | None,
    ) -> concurrent.futures.Future[Sequence[Receipt]]:  # fmt: skip
        assert tags is None or len(tags) == len(values)
        if b"too large" in values:
            raise ValueError("refused before it left")
        self.sends.append((topic, list(values), None if keys is None else list(keys), None))
        return self._future(self._answer(len(values), queue))  # type: ignore[return-value]


def test_read_lines_strips_line_endings_and_yields_blocks() -> None:
    stream = io.BytesIO(b"a\nb\r\n\nlast")
    assert [line for block in read_lines(stream) for line in block] == [b"a", b"b", b"", b"last"]
    many = io.BytesIO(b"".join(b"%05d\n" % i for i in range(1000)))
    blocks = list(read_lines(many, hint_bytes=600))
    assert len(blocks) > 1
    assert [line for block in blocks for line in block] == [b"%05d" % i for i in range(1000)]
    empty = list(read_lines(io.BytesIO(b"\n" * 1000), hint_bytes=1 << 20, max_lines=300))
    assert [len(block) for block in empty] == [300, 300, 300, 100]


def test_lines_without_a_key_go_as_batches_in_order() -> None:
    producer = FakeProducer()
    receipts: list[Receipt] = []
    blocks = [[b"l1", b"l2"], [b"l3"]]
    stats = send_lines(producer, "t", blocks, key=b"k", tag="paid", on_receipts=receipts.extend)
    assert [s[1] for s in producer.sends] == [[b"l1", b"l2"], [b"l3"]]
    assert [s[2] for s in producer.sends] == [[b"k", b"k"], [b"k"]]
    assert [r.offset for r in receipts] == [0, 1, 2]
    assert (stats.sent, stats.acknowledged, stats.acknowledged_bytes) == (3, 3, 6 + 3)
    assert "produced 3 message(s), 9 bytes" in stats.summary()


def test_a_key_per_line_is_one_send_each() -> None:
    producer = FakeProducer()
    stats = send_lines(producer, "t", [[b"a:1", b"b:2:x"]], separator=b":")
    assert [(s[1], s[2]) for s in producer.sends] == [([b"1"], [b"a"]), ([b"2:x"], [b"b"])]
    assert stats.acknowledged == 2
    with pytest.raises(LineFormatError, match="line 3 has no key separator ':'"):
        send_lines(FakeProducer(), "t", [[b"a:1", b"b:2"], [b"none"]], separator=b":")


def test_keyed_lines_go_as_one_batch_per_queue_in_line_order() -> None:
    producer = FakeProducer()
    receipts: list[Receipt] = []
    queue_of = {b"a": 0, b"b": 1}.__getitem__
    stats = send_lines(
        producer, "t", [[b"a:1", b"b:2", b"a:3"], [b"b:4"]], separator=b":", queue_of=queue_of,
        on_receipts=receipts.extend,
    )  # fmt: skip
    assert [(s[1], s[2]) for s in producer.sends] == [
        ([b"1", b"3"], [b"a", b"a"]),
        ([b"2"], [b"b"]),
        ([b"4"], [b"b"]),
    ]
    # Line order: a:1 (queue 0), b:2 (queue 1), a:3 (queue 0), b:4 (queue 1).
    assert [r.queue for r in receipts] == [0, 1, 0, 1]
    assert (stats.acknowledged, stats.acknowledged_bytes) == (4, 8)

    sent_before = FakeProducer()
    with pytest.raises(LineFormatError, match="line 2 has no key separator"):
        send_lines(sent_before, "t", [[b"a:1", b"bad", b"a:3"]], separator=b":", queue_of=queue_of)
    assert [s[1] for s in sent_before.sends] == [[b"1"]]


def test_no_batch_sends_one_by_one() -> None:
    producer = FakeProducer()
    send_lines(producer, "t", [[b"x", b"y"]], one_by_one=True, window=0)
    assert [s[1] for s in producer.sends] == [[b"x"], [b"y"]]


def test_a_failed_send_stops_and_says_how_many_were_acknowledged() -> None:
    producer = FakeProducer(fail_at={1})
    with pytest.raises(ProduceFailed) as failed:
        send_lines(producer, "t", [[b"a"], [b"b"], [b"c"], [b"d"]], window=0)
    assert "does not exist" in str(failed.value)
    assert (failed.value.stats.sent, failed.value.stats.acknowledged) == (2, 1)


def test_progress_is_reported_per_block() -> None:
    seen: list[int] = []

    def progress(stats: Stats) -> None:
        seen.append(stats.sent)

    send_lines(FakeProducer(), "t", [[b"a"], [b"b", b"c"]], on_progress=progress)
    assert seen == [1, 3, 3]


def test_a_batch_refused_before_it_left_is_a_failed_send() -> None:
    with pytest.raises(ProduceFailed, match="refused before it left") as failed:
        send_lines(FakeProducer(), "t", [[b"a"], [b"too large", b"b"]], window=0)
    assert (failed.value.stats.sent, failed.value.stats.acknowledged) == (3, 1)
