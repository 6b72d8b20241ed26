"""The compacted logs of a store's compact queues: reading them, switching generations,
and finding a key's latest message.

`MessageStore` owns one `CompactedQueues`; every call runs on the store's owner thread.
A queue with a compacted log serves offsets in [`start`, `end`) from it and the rest from
the commit log (its index's min offset is `end`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tidemq.core.batch import binary_values, decode_columns, message_offsets
from tidemq.core.errors import CorruptRecordError, InvalidBatch, StorageFailure
from tidemq.core.record import parse_header
from tidemq.store.compacted_log import CompactedLog, compacted_dir, file_name
from tidemq.store.files import FileSystem
from tidemq.store.format.compacted import key_hash
from tidemq.store.metadata import Metadata

__all__ = [
    "CompactedQueues",
    "FoundMessage",
    "message_in_record",
    "message_keys",
    "open_compacted_logs",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FoundMessage:
    """A key's latest message: its offset and value (None: a tombstone)."""

    offset: int
    value: bytes | None
    timestamp_ms: int


def open_compacted_logs(
    fs: FileSystem, meta: Metadata, queue_dirs: dict[tuple[int, int], Path]
) -> dict[tuple[int, int], CompactedLog]:
    """Recovery: open each queue's current generation and remove every other file of its
    compacted directory (a run that crashed before its switch, or an older generation
    whose removal the crash interrupted)."""
    saved = meta.compacted_logs()
    logs: dict[tuple[int, int], CompactedLog] = {}
    for key, directory in queue_dirs.items():
        where = compacted_dir(directory)
        current = saved.get(key)
        keep = file_name(current[0]) if current else None
        if fs.exists(where):
            removed = False
            for name in fs.listdir(where):
                if name != keep:
                    fs.remove(where / name)
                    removed = True
            if removed:
                fs.sync_dir(where)
        if current is not None:
            generation, start, end = current
            path = where / file_name(generation)
            if not fs.exists(path):
                raise CorruptRecordError(
                    f"compacted log generation {generation} of topic id {key[0]} queue "
                    f"{key[1]} is missing ({path})"
                )
            opened = CompactedLog.open(fs, path, generation=generation, start=start)
            if opened.end != end:
                opened.close()
                raise CorruptRecordError(f"compacted log {path} does not end where recorded")
            logs[key] = opened
    return logs


class CompactedQueues:
    def __init__(self, fs: FileSystem, meta: Metadata, logs: dict[tuple[int, int], CompactedLog]):
        self._fs = fs
        self._meta = meta
        self._logs = logs

    def get(self, key: tuple[int, int]) -> CompactedLog | None:
        return self._logs.get(key)

    def items(self) -> Iterable[tuple[tuple[int, int], CompactedLog]]:
        return self._logs.items()

    def switch(self, key: tuple[int, int], new: CompactedLog) -> None:
        """Make `new` the queue's compacted log (durably), then remove the old file."""
        self._meta.set_compacted_log(key[0], key[1], new.generation, new.start, new.end)
        old = self._logs.get(key)
        self._logs[key] = new
        if old is not None:
            old.close()
            self._fs.remove(old.path)
            self._fs.sync_dir(old.path.parent)

    def advance_start(self, key: tuple[int, int], start: int) -> None:
        """Retention (compact,delete): offsets below `start` are gone."""
        current = self._logs[key]
        if start > current.start:
            current.start = min(start, current.end)
            self._meta.set_compacted_log(
                key[0], key[1], current.generation, current.start, current.end
            )

    def drop(self, key: tuple[int, int]) -> None:
        """The topic is deleted (its directory goes with it)."""
        found = self._logs.pop(key, None)
        if found is not None:
            found.close()

    def close(self) -> None:
        for found in self._logs.values():
            found.close()
        self._logs.clear()

    @staticmethod
    def find(log_: CompactedLog, key: bytes) -> FoundMessage | None:
        """The latest message of `key` in a compacted log (None: not there): the key
        index names candidate offsets, the record confirms the key."""
        for offset in log_.candidates(key_hash(key)):
            found = _message_at(log_, offset, key)
            if found is not None:
                return found
        return None


def _message_at(log_: CompactedLog, offset: int, key: bytes) -> FoundMessage | None:
    entry = log_.entry_for(offset)
    if entry is None:
        return None
    record = log_.read(int(entry["position"]), int(entry["size"]))
    if parse_header(record).base_offset != int(entry["base_offset"]):
        raise StorageFailure(f"compacted log {log_.path} entry points at the wrong record")
    return message_in_record(record, offset, key)


def message_in_record(record: bytes, offset: int, key: bytes | None = None) -> FoundMessage | None:
    """The message at `offset` of a stored record (dense or compacted), decoded once;
    None when the record does not hold it, or (with `key`) holds another key there."""
    header = parse_header(record)
    columns = decode_columns(memoryview(record)[header.payload_start :])
    offsets = message_offsets(columns, header.base_offset).tolist()
    if offset not in offsets:
        return None
    i = offsets.index(offset)
    if key is not None and binary_values(columns.key)[i] != key:
        return None  # another key with the same hash
    value = binary_values(columns.value)[i]
    return FoundMessage(offset, value, int(columns.timestamps_ms[i]))


def message_keys(payload: bytes | memoryview, topic: str) -> list[bytes]:
    """The keys of a batch for a compact topic, where every message needs one
    (InvalidBatch naming the first message without)."""
    keys = binary_values(decode_columns(payload, verify_crc=False).key)
    if None in keys:
        raise InvalidBatch(
            f"topic {topic!r} is a compact topic (cleanup.policy compact): every message "
            f"needs a key, message {keys.index(None)} of the batch has none"
        )
    return keys  # type: ignore[return-value]  # no None left
