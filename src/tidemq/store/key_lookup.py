"""Messages by key: the key index's candidates, each checked by reading its message.

An entry of the key index (`key_index.py`) only says where a message with a key of that
hash was. Each candidate, newest first, is read through the queue's ordinary read path:
a message that retention or compaction removed is not there any more, one whose key
differs (a hash collision) does not match, and a message held only in the object store
(tiered storage) is not looked for. What matches is returned as the whole stored record
with the indexes of its matching messages, as a filtered fetch answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidemq.core import limits
from tidemq.core.batch import binary_values, decode_columns, message_offsets
from tidemq.core.record import parse_header
from tidemq.store.format.key_entry import index_hash

if TYPE_CHECKING:
    from tidemq.store.message_store import MessageStore

__all__ = ["KeyMatches", "MatchedRecord", "find_by_key"]


@dataclass(slots=True)
class MatchedRecord:
    """A stored record holding matches: message i of it matches when i is in `indexes`."""

    queue: int
    record: bytes
    store_time_ms: int
    indexes: list[int] = field(default_factory=list)


@dataclass(slots=True)
class KeyMatches:
    records: list[MatchedRecord]
    #: Matching messages in `records`.
    count: int
    #: Candidates were left unexamined (the limit, the byte budget or the candidate
    #: bound stopped the search): older matches may exist.
    more: bool


@dataclass(slots=True)
class _Decoded:
    offsets: list[int]
    keys: list[bytes | None]
    key_lists: list[list[bytes]]


def _decode(record: bytes) -> _Decoded:
    header = parse_header(record)
    columns = decode_columns(memoryview(record)[header.payload_start :], verify_crc=False)
    offsets = message_offsets(columns, header.base_offset).tolist()
    bounds = columns.keys.list_offsets.tolist()
    items = binary_values(columns.keys.items) if bounds[-1] else []
    lists = [items[bounds[i] : bounds[i + 1]] for i in range(columns.count)]
    return _Decoded(offsets, binary_values(columns.key), lists)  # type: ignore[arg-type]


def find_by_key(
    store: MessageStore,
    topic: str,
    key: bytes,
    *,
    start_ms: int,
    end_ms: int,
    limit: int,
    max_bytes: int = limits.MAX_KEY_QUERY_BYTES,
) -> KeyMatches:
    """Up to `limit` stored messages of `topic` whose `key` or one of whose `keys` is `key`,
    stored in [start_ms, end_ms], newest first; at most `max_bytes` of records (at least
    one record when any matches)."""
    info = store.topic(topic)
    candidates = store.key_index.candidates(info.id, index_hash(key), start_ms, end_ms)
    last: list[tuple[MatchedRecord, _Decoded]] = []
    out: list[MatchedRecord] = []
    count = size = 0
    examined = 0
    seen: set[tuple[int, int]] = set()
    for entry in candidates.tolist():
        _hash, offset, _position, _time, _topic_id, queue = entry
        if (queue, offset) in seen:
            continue
        if count >= limit or examined >= limits.MAX_KEY_QUERY_CANDIDATES:
            return KeyMatches(out, count, more=True)
        seen.add((queue, offset))
        examined += 1
        found = _record_of(store, topic, queue, offset, last)
        if found is None:
            continue
        matched, decoded = found
        i = decoded.offsets.index(offset) if offset in decoded.offsets else -1
        if i < 0 or not (decoded.keys[i] == key or key in decoded.key_lists[i]):
            continue
        if not matched.indexes:
            if out and size + len(matched.record) > max_bytes:
                return KeyMatches(out, count, more=True)
            size += len(matched.record)
            out.append(matched)
        matched.indexes.append(i)
        count += 1
    return KeyMatches(out, count, more=False)


def _record_of(
    store: MessageStore,
    topic: str,
    queue: int,
    offset: int,
    last: list[tuple[MatchedRecord, _Decoded]],
) -> tuple[MatchedRecord, _Decoded] | None:
    """The stored record holding `offset` of the queue, decoded (None: not stored here
    now). The last one read is kept: candidates come newest first by log position, so
    the messages of one batch that share a key come one after another."""
    if last:
        matched, decoded = last[0]
        if matched.queue == queue and decoded.offsets[0] <= offset <= decoded.offsets[-1]:
            return last[0]
    result = store.read(topic, queue, offset, max_bytes=1)
    if not result.batches:
        return None  # removed (retention, compaction) or only in the object store
    batch = result.batches[0]
    found = (MatchedRecord(queue, batch.record, batch.store_time_ms), _decode(batch.record))
    last[:] = [found]
    return found
