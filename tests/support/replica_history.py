"""The checker of a replica group's history under faults (Jepsen-style): what a test's
clients were told and saw, against what every member holds at the end.

A history is plain data, recorded by the test:

* `attempted`: every value a producer tried to send (unique values);
* `acked`: every acknowledged send, in acknowledgement order, with the (queue, offset)
  its receipt named;
* `reads`: every message a consumer read, in the order it read them;
* `replicas`: each member's messages per queue at the end, as (offset, value) pairs in
  offset order (read from its store after it stopped: `stored_messages`);
* `leaders`: (epoch, member) for each term a member said it began
  (`member M leads group G under epoch E` in its log);
* `committed`: the group's committed position, sampled in time order;
* `group_reads`: every message a consumer group's member read (a group may read a
  message again after a failover or a rebalance: only where it was read is checked);
* `group_offsets`: the consumer group's committed offsets per queue, sampled in time
  order;
* `reads_complete`: the consumer read until it had passed every acknowledged message.

`violations(history)` returns what breaks the promise, one line each (empty: none):
every acknowledged message is present exactly once, at the offset its receipt named, in
per-queue send order; no value that was never sent; the same records at the same
offsets on every member; every message a consumer read is there at the offset it was
read at, and a consumer's offsets per queue only move forward, one at a time (with
`reads_complete`, it read every acknowledged message); no two members lead the same
epoch; the committed position never goes backwards; every message a group member read is
there at the offset it was read at, and the group's committed offsets never go
backwards.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tidemq.broker.config import BrokerConfig
from tidemq.core.message import messages_from_records
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import MessageStore

__all__ = ["Ack", "History", "QueueLog", "Read", "stored_messages", "violations"]

#: Violations listed per kind before the rest are counted only.
_SHOWN = 5


@dataclass(frozen=True)
class Ack:
    queue: int
    offset: int
    value: bytes


@dataclass(frozen=True)
class Read:
    queue: int
    offset: int
    value: bytes


QueueLog = list[tuple[int, bytes]]


@dataclass
class History:
    attempted: set[bytes] = field(default_factory=set)
    acked: list[Ack] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    replicas: dict[str, dict[int, QueueLog]] = field(default_factory=dict)
    leaders: list[tuple[int, str]] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    group_reads: list[Read] = field(default_factory=list)
    group_offsets: list[dict[int, int]] = field(default_factory=list)
    #: The consumer read on until it had passed every acknowledged message: each one
    #: must be among its reads.
    reads_complete: bool = False


def violations(history: History) -> list[str]:
    found: list[str] = []
    found += _replicas_differ(history.replicas)
    if history.replicas:
        final = next(iter(history.replicas.values()))
        found += _exactly_once(final, history.attempted)
        found += _acked_in_place(final, history.acked)
        found += _reads_hold(final, history.reads)
        found += _reads_hold(final, history.group_reads, "group member read, later lost")
    if history.reads_complete:
        found += _acked_read(history.acked, history.reads)
    found += _reads_advance(history.reads)
    found += _one_leader_per_epoch(history.leaders)
    found += _committed_grows(history.committed)
    found += _group_offsets_grow(history.group_offsets)
    return found


def _capped(kind: str, items: Sequence[str]) -> list[str]:
    shown = [f"{kind}: {item}" for item in items[:_SHOWN]]
    if len(items) > _SHOWN:
        shown.append(f"{kind}: ... and {len(items) - _SHOWN} more")
    return shown


def _replicas_differ(replicas: dict[str, dict[int, QueueLog]]) -> list[str]:
    if not replicas:
        return []
    (first, logs), *others = replicas.items()
    out = []
    for member, theirs in others:
        for queue in sorted(set(logs) | set(theirs)):
            a, b = logs.get(queue, []), theirs.get(queue, [])
            if a != b:
                at = next((x for x, y in zip(a, b, strict=False) if x != y), None)
                where = f"first difference {at}" if at else f"{len(a)} vs {len(b)} messages"
                out.append(f"queue {queue}: {first} and {member} differ ({where})")
    return _capped("replicas differ", out)


def _exactly_once(final: dict[int, QueueLog], attempted: set[bytes]) -> list[str]:
    twice, unexpected, offsets = [], [], []
    for queue, log in sorted(final.items()):
        counts = Counter(value for _, value in log)
        twice += [f"queue {queue}: {v!r} x{n}" for v, n in counts.items() if n > 1]
        unexpected += [f"queue {queue}: {v!r}" for v in counts if v not in attempted]
        numbers = [offset for offset, _ in log]
        if numbers and numbers != list(range(numbers[0], numbers[0] + len(numbers))):
            offsets.append(f"queue {queue}: offsets not contiguous")
    return (
        _capped("duplicated", twice)
        + _capped("never sent", unexpected)
        + _capped("offset holes", offsets)
    )


def _acked_in_place(final: dict[int, QueueLog], acked: list[Ack]) -> list[str]:
    at = {(queue, offset): value for queue, log in final.items() for offset, value in log}
    where = {value: (queue, offset) for queue, log in final.items() for offset, value in log}
    lost, moved, order = [], [], []
    last: dict[int, int] = {}
    for ack in acked:
        if at.get((ack.queue, ack.offset)) != ack.value:
            if ack.value in where:
                moved.append(f"{ack.value!r} acked at {ack.queue}/{ack.offset}, stored at "
                             f"{where[ack.value][0]}/{where[ack.value][1]}")  # fmt: skip
            else:
                lost.append(f"{ack.value!r} acked at {ack.queue}/{ack.offset}")
        if ack.offset <= last.get(ack.queue, -1):
            order.append(f"queue {ack.queue}: {ack.value!r} acked at {ack.offset} after "
                         f"{last[ack.queue]}")  # fmt: skip
        last[ack.queue] = max(ack.offset, last.get(ack.queue, -1))
    return _capped("lost", lost) + _capped("moved", moved) + _capped("out of order", order)


def _reads_hold(
    final: dict[int, QueueLog], reads: list[Read], kind: str = "read, later lost"
) -> list[str]:
    at = {(queue, offset): value for queue, log in final.items() for offset, value in log}
    bad = [
        f"{r.value!r} read at {r.queue}/{r.offset}, now {at.get((r.queue, r.offset))!r}"
        for r in reads
        if at.get((r.queue, r.offset)) != r.value
    ]
    return _capped(kind, bad)


def _acked_read(acked: list[Ack], reads: list[Read]) -> list[str]:
    seen = {(r.queue, r.offset, r.value) for r in reads}
    bad = [
        f"{a.value!r} at {a.queue}/{a.offset}"
        for a in acked
        if (a.queue, a.offset, a.value) not in seen
    ]
    return _capped("acknowledged, never read", bad)


def _reads_advance(reads: list[Read]) -> list[str]:
    last: dict[int, int] = {}
    bad = []
    for r in reads:
        before = last.get(r.queue)
        if before is not None and r.offset != before + 1:
            bad.append(f"queue {r.queue}: read {r.offset} after {before}")
        last[r.queue] = r.offset
    return _capped("consumer offsets jumped", bad)


def _one_leader_per_epoch(leaders: list[tuple[int, str]]) -> list[str]:
    members: dict[int, set[str]] = defaultdict(set)
    for epoch, member in leaders:
        members[epoch].add(member)
    bad = [f"epoch {e}: {sorted(m)}" for e, m in sorted(members.items()) if len(m) > 1]
    return _capped("two leaders in one epoch", bad)


def _committed_grows(samples: list[int]) -> list[str]:
    bad = [f"{a} then {b}" for a, b in itertools.pairwise(samples) if b < a]
    return _capped("committed position went back", bad)


def _group_offsets_grow(samples: list[dict[int, int]]) -> list[str]:
    bad = [
        f"queue {queue}: {before[queue]} then {offset}"
        for before, after in itertools.pairwise(samples)
        for queue, offset in sorted(after.items())
        if offset < before.get(queue, -1)
    ]
    return _capped("group offsets went back", bad)


def stored_messages(data_dir: Path, topic: str, queues: int) -> dict[int, QueueLog]:
    """Every message of `topic`'s queues in a stopped member's store, in offset order."""
    store = MessageStore.open(BrokerConfig(store=StoreConfig(data_dir=data_dir)).store)
    try:
        out: dict[int, QueueLog] = {}
        for queue in range(queues):
            low, high = store.queue_bounds(topic, queue)
            log: QueueLog = []
            offset = low
            while offset < high:
                got = store.read(topic, queue, offset, max_bytes=1 << 20)
                records = [b.record for b in got.batches]
                messages = messages_from_records(
                    topic, queue, b"".join(records), [len(r) for r in records], offset
                )
                log += [(m.offset, m.value or b"") for m in messages]
                offset = got.next_offset
            out[queue] = log
        return out
    finally:
        store.close()
