"""Per-queue manifests: which remote files hold which offsets, and the bucket's layout.

Layout under the tier's url (Hive-style, so Spark, DuckDB and pyarrow read the data files
directly; paths starting with `_` are ignored by all three)::

    topic=<t>/broker=<b>/queue=<q>/dt=YYYY-MM-DD/hour=HH/part-<q>-<start>-<end>.parquet
    _tidemq/manifests/broker=<b>/topic=<t>/queue=<q>.json

`dt` and `hour` are those (UTC) of the file's first store time; `start`..`end` is its
offset range, end exclusive (also in the file's metadata, `parquet_rows.py`).

A manifest is JSON (`QueueManifest`), replaced whole at each change (an object PUT is
atomic on S3 and on a local directory). It is the truth about the remote range: a file it
does not list is an orphan (an upload cut off by a crash) and is deleted; it lists a file
only once the file is verified, so readers never see a partial one. Files are contiguous:
each starts where the previous ends, the first at or below `log_start`.
"""

from __future__ import annotations

import bisect
from datetime import UTC, datetime

import msgspec

from tidemq.core.errors import CorruptRecordError

__all__ = [
    "MANIFEST_FORMAT",
    "QueueManifest",
    "RemoteFile",
    "data_file_path",
    "decode_manifest",
    "encode_manifest",
    "manifest_path",
    "queue_data_prefix",
]

MANIFEST_FORMAT = 1


class RemoteFile(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    path: str
    start: int
    end: int
    messages: int
    #: Bytes of the object, and of the records it holds as stored locally.
    size: int
    record_bytes: int
    md5: str
    sha256: str
    min_store_time_ms: int
    max_store_time_ms: int
    #: The first offset of each row group.
    row_groups: list[int]
    uploaded_ms: int


class QueueManifest(msgspec.Struct, forbid_unknown_fields=False):
    broker: str
    topic: str
    queue: int
    #: The topic's creation time: a topic deleted and created again under the same name
    #: is another topic, whose queues start from an empty manifest.
    topic_created_ms: int
    #: Offsets below this are gone (remote retention).
    log_start: int
    files: list[RemoteFile] = msgspec.field(default_factory=list)
    format: int = MANIFEST_FORMAT

    @property
    def end(self) -> int:
        """One past the last remote offset (log_start when no file is held)."""
        return self.files[-1].end if self.files else self.log_start

    def file_for(self, offset: int) -> RemoteFile | None:
        """The file holding `offset`, if any."""
        i = bisect.bisect_right([f.start for f in self.files], offset) - 1
        if i < 0 or offset >= self.files[i].end or offset < self.log_start:
            return None
        return self.files[i]

    def following(self, file: RemoteFile) -> RemoteFile | None:
        """The file after `file` (a sequential reader's next one)."""
        for f in self.files:
            if f.start == file.end:
                return f
        return None

    def check(self) -> None:
        if self.format != MANIFEST_FORMAT:
            raise CorruptRecordError(f"manifest format {self.format} is not {MANIFEST_FORMAT}")
        at = None
        for f in self.files:
            if not f.start < f.end or (at is not None and f.start != at):
                raise CorruptRecordError(
                    f"manifest of {self.topic}/{self.queue}: files not contiguous at {f.path}"
                )
            at = f.end
        if self.files and not self.files[0].start <= self.log_start <= self.files[-1].end:
            raise CorruptRecordError(
                f"manifest of {self.topic}/{self.queue}: log start {self.log_start} outside "
                "its files"
            )


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(QueueManifest)


def encode_manifest(manifest: QueueManifest) -> bytes:
    manifest.check()
    return _ENCODER.encode(manifest)


def decode_manifest(data: bytes) -> QueueManifest:
    try:
        manifest = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptRecordError(f"undecodable tier manifest: {exc}") from None
    manifest.check()
    return manifest


def queue_data_prefix(topic: str, broker: str, queue: int) -> str:
    return f"topic={topic}/broker={broker}/queue={queue}/"


def data_file_path(
    topic: str, broker: str, queue: int, *, start: int, end: int, store_time_ms: int
) -> str:
    when = datetime.fromtimestamp(store_time_ms / 1000, tz=UTC)
    return (
        f"{queue_data_prefix(topic, broker, queue)}dt={when:%Y-%m-%d}/hour={when:%H}/"
        f"part-{queue}-{start}-{end}.parquet"
    )


def manifest_path(broker: str, topic: str, queue: int) -> str:
    return f"_tidemq/manifests/broker={broker}/topic={topic}/queue={queue}.json"
