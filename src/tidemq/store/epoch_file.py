"""The epoch file: at which log position each leader epoch of the replica group began.

A replica group's leaders take turns under increasing epochs (elected through etcd,
`tidemq.cluster.election`). Every member keeps the history of the epochs whose records
its log holds: the leader adds (E, its log end) when it starts leading under E, a
follower copies the leader's entries as its log reaches them. Two logs agree up to the
end of the last epoch they share, which is how a member that led (or followed) an
epoch the group has moved past finds what to cut: it asks the leader where that epoch
ends in the leader's log (`end_of`) and truncates there (RocketMQ's controller mode
keeps the same file; Kafka calls it the leader-epoch checkpoint).

File `epochs` in the data directory, little-endian:

```
 0        4         6          8
 +--------+---------+----------+
 |magic   |version  |reserved  |     magic "TQEP", version 1
 +--------+---------+----------+
 then per epoch, 24 bytes, epochs strictly increasing, start positions non-decreasing:
 0                8                 16        20         24
 +----------------+-----------------+---------+----------+
 |epoch u64       |start_position   |crc32c   |reserved  |   crc32c of bytes 0-15
 +----------------+-----------------+---------+----------+
```

Written whole (temp file, fsync, rename, fsync of the directory) at every change: the
file holds a few entries per election, so a rewrite costs one small write, and the name
always holds a whole, checked file. A damaged file is an error, never read as empty: an
empty history would let a member keep a suffix the group dropped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c

from tidemq.core.errors import CorruptRecordError
from tidemq.store.files import FileSystem

__all__ = ["EPOCH_FILE", "EpochEntry", "EpochHistory"]

EPOCH_FILE: Final = "epochs"
_HEAD = struct.Struct("<4sHH")
_ENTRY = struct.Struct("<QQII")
_MAGIC: Final = b"TQEP"
_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    #: The log position of the epoch's first record (the log's end when it began).
    start_position: int


def _encode(entries: list[EpochEntry]) -> bytes:
    out = [_HEAD.pack(_MAGIC, _VERSION, 0)]
    for e in entries:
        body = struct.pack("<QQ", e.epoch, e.start_position)
        out.append(body + struct.pack("<II", crc32c.crc32c(body), 0))
    return b"".join(out)


def _decode(data: bytes, path: Path) -> list[EpochEntry]:
    if len(data) < _HEAD.size or (len(data) - _HEAD.size) % _ENTRY.size:
        raise CorruptRecordError(f"epoch file {path} has a bad size ({len(data)} bytes)")
    magic, version, _ = _HEAD.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise CorruptRecordError(f"epoch file {path}: bad magic or version")
    entries: list[EpochEntry] = []
    for at in range(_HEAD.size, len(data), _ENTRY.size):
        epoch, start, crc, _ = _ENTRY.unpack_from(data, at)
        if crc != crc32c.crc32c(data[at : at + 16]):
            raise CorruptRecordError(f"epoch file {path}: entry at byte {at} fails its CRC")
        entry = EpochEntry(epoch, start)
        _check_order(entries[-1] if entries else None, entry, str(path))
        entries.append(entry)
    return entries


def _check_order(last: EpochEntry | None, entry: EpochEntry, where: str) -> None:
    if last is not None and (
        entry.epoch <= last.epoch or entry.start_position < last.start_position
    ):
        raise CorruptRecordError(
            f"{where}: epoch {entry.epoch} at {entry.start_position} does not follow "
            f"epoch {last.epoch} at {last.start_position}"
        )


class EpochHistory:
    """The epochs of one member's log, oldest first (single writer: the store's owner)."""

    def __init__(self, fs: FileSystem, directory: Path) -> None:
        self._fs = fs
        self._path = directory / EPOCH_FILE
        self._entries: list[EpochEntry] = []
        if fs.exists(self._path):
            self._entries = _decode(fs.read_bytes(self._path), self._path)

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    def begin(self, epoch: int, position: int) -> None:
        """Record that `epoch` begins at log position `position` (durable on return).
        Beginning the latest epoch again at the same position changes nothing; an older
        epoch, or a position before the latest epoch's start, is refused."""
        entry = EpochEntry(epoch, position)
        if entry == self.latest:
            return
        _check_order(self.latest, entry, "epoch history")
        self._write([*self._entries, entry])

    def end_of(self, epoch: int, log_end: int) -> tuple[int, int]:
        """Where this log's share of `epoch` ends, for a member whose latest epoch is
        `epoch`: (the largest epoch here that is at most `epoch`, the position where the
        epoch after it starts, or `log_end`). (-1, 0) when every epoch here is newer:
        nothing of that member's log is known to agree with this one."""
        found = -1
        for i, entry in enumerate(self._entries):
            if entry.epoch > epoch:
                return (found, entry.start_position) if found >= 0 else (-1, 0)
            found = self._entries[i].epoch
        return (found, log_end) if found >= 0 else (-1, 0)

    def truncate_to(self, position: int) -> None:
        """The log was cut at `position`: epochs that began past it are gone with their
        records (an epoch that began exactly there keeps its entry: it may still write)."""
        kept = [e for e in self._entries if e.start_position <= position]
        if len(kept) != len(self._entries):
            self._write(kept)

    def replace(self, entries: list[EpochEntry]) -> None:
        """Take a whole history (a member starting empty copies its leader's)."""
        for i, entry in enumerate(entries):
            _check_order(entries[i - 1] if i else None, entry, "epoch history")
        self._write(list(entries))

    def _write(self, entries: list[EpochEntry]) -> None:
        tmp = self._path.with_name(EPOCH_FILE + ".tmp")
        handle = self._fs.open(tmp, create=True)
        try:
            handle.truncate(0)
            handle.append((_encode(entries),))
            handle.sync()
        finally:
            handle.close()
        self._fs.replace(tmp, self._path)
        self._fs.sync_dir(self._path.parent)
        self._entries = entries
