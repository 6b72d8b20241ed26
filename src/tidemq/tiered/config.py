"""TieredConfig: the `[tiered]` section (where sealed data goes, and how fast).

Off unless `url` is set. `file:///path` is a local directory (or a mounted volume);
`s3://bucket/prefix` any S3 API (AWS, MinIO, Ceph, moto) with `endpoint` for anything
but AWS. Credentials come from `access_key_id` / `secret_access_key` or, left empty, from
the usual AWS_* environment variables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from tidemq.core.errors import ConfigError

__all__ = ["TieredConfig"]

_MIB: Final = 1024 * 1024
_SCHEMES: Final = ("file", "s3")


@dataclass(frozen=True, kw_only=True)
class TieredConfig:
    #: Where offloaded data goes ("" = tiered storage off): file:///path or s3://bucket/prefix.
    url: str = ""
    #: The S3 endpoint (MinIO, Ceph, moto: http://host:port); empty for AWS itself.
    endpoint: str = ""
    region: str = "us-east-1"
    access_key_id: str = ""
    secret_access_key: str = field(default="", repr=False)
    #: How many files of different queues are uploaded at once.
    upload_concurrency: int = 2
    #: Bytes of remote row groups kept in memory for readers (least recently used go).
    cache_bytes: int = 256 * _MIB
    #: A queue's file is closed at this many record bytes (before compression)...
    file_bytes: int = 64 * _MIB
    #: ...or once its oldest batch is this old (a quiet queue is offloaded too).
    file_max_age_ms: int = 10 * 60 * 1000
    #: Row groups of at most this many bytes: the unit of a ranged read and of the cache.
    row_group_bytes: int = 4 * _MIB
    #: How often the tier service looks for ranges to offload and remote data to expire.
    check_interval_ms: int = 5_000
    #: One object-store request's limit (a store that hangs is an error, then a retry).
    request_timeout_ms: int = 30_000
    #: After a failed upload, wait this long before the next try, doubling up to the max.
    retry_backoff_ms: int = 1_000
    retry_backoff_max_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.url:
            scheme = urlsplit(self.url).scheme
            if scheme not in _SCHEMES:
                raise ConfigError(f"tiered.url must start with file:// or s3://, got {self.url!r}")
            if scheme == "s3" and not urlsplit(self.url).netloc:
                raise ConfigError(f"tiered.url names no bucket: {self.url!r}")
            if scheme == "file" and not urlsplit(self.url).path.startswith("/"):
                raise ConfigError(f"tiered.url needs an absolute path: {self.url!r}")
        for name in (
            "upload_concurrency",
            "cache_bytes",
            "file_bytes",
            "file_max_age_ms",
            "row_group_bytes",
            "check_interval_ms",
            "request_timeout_ms",
            "retry_backoff_ms",
            "retry_backoff_max_ms",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"tiered.{name} must be >= 1, got {getattr(self, name)}")
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ConfigError("tiered.retry_backoff_max_ms must be >= tiered.retry_backoff_ms")

    @property
    def enabled(self) -> bool:
        return bool(self.url)
