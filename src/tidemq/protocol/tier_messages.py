"""Tiered-storage requests (codes 120-129): the tier's status on a broker, and the
remote files of a topic's offset range. Appended to
`commands.REQUESTS`; fields only ever added at the end."""

from __future__ import annotations

from typing import Final

import msgspec

from tidemq.protocol.codes import RequestCode

__all__ = [
    "TIER_REQUESTS",
    "TierFile",
    "TierFilesRequest",
    "TierFilesResponse",
    "TierOffloadRequest",
    "TierQueueStatus",
    "TierStatusRequest",
    "TierStatusResponse",
]


class _Msg(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class TierStatusRequest(_Msg):
    #: One topic, or every offloaded topic of the broker ("").
    topic: str = ""


class TierQueueStatus(_Msg):
    topic: str
    queue: int
    #: Offsets [log_start, remote_end) are in the object store, [local_min, next_offset)
    #: on the broker's disk.
    log_start: int
    remote_end: int
    local_min: int
    next_offset: int
    files: int = 0
    #: Bytes of the remote files, and of records on disk not yet offloaded.
    remote_bytes: int = 0
    pending_bytes: int = 0
    last_upload_ms: int = 0
    #: The last failure ("" while the queue's uploads succeed), and when it retries.
    error: str = ""
    retry_in_ms: int = 0
    #: Offsets [lost_from, lost_to) that were offloaded and are gone from the store.
    lost_from: int = 0
    lost_to: int = 0


class TierStatusResponse(_Msg):
    enabled: bool = False
    url: str = ""
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    deleted_files: int = 0
    orphans_deleted: int = 0
    errors: int = 0
    remote_reads: int = 0
    cache_bytes: int = 0
    queues: list[TierQueueStatus] = msgspec.field(default_factory=list)
    #: The answering broker's name (the files it offloads are under broker=<name>).
    broker: str = ""


class TierFilesRequest(_Msg):
    topic: str
    #: One queue, or -1 for all the broker hosts.
    queue: int = -1
    #: Files holding any offset in [start, end) (end -1: no bound).
    start: int = 0
    end: int = -1


class TierFile(_Msg):
    queue: int
    #: The file's full URL (tiered.url joined with its path): what pyarrow, DuckDB or
    #: Spark open (with the store's credentials).
    url: str
    start: int
    end: int
    messages: int
    size: int
    min_store_time_ms: int
    max_store_time_ms: int


class TierFilesResponse(_Msg):
    files: list[TierFile] = msgspec.field(default_factory=list)


class TierOffloadRequest(_Msg):
    #: Upload every durable batch of this topic now, whatever its size and age; the
    #: answer is the broker's tier status for the topic, once done.
    topic: str


TIER_REQUESTS: Final[dict[RequestCode, tuple[type[msgspec.Struct], type[msgspec.Struct]]]] = {
    RequestCode.TIER_STATUS: (TierStatusRequest, TierStatusResponse),
    RequestCode.TIER_FILES: (TierFilesRequest, TierFilesResponse),
    RequestCode.TIER_OFFLOAD: (TierOffloadRequest, TierStatusResponse),
}
