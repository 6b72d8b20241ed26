"""The object store behind the tier: a local directory or any S3 API, one small interface.

Built on `obstore` (Rust's `object_store` crate; ADR 0011): one API for S3 and local
directories, no botocore, and calls that release the GIL, so the tier service runs them
on worker threads without slowing the event loop. Methods are synchronous; the callers
(`tidemq.broker.tier_service`) run them with `asyncio.to_thread`.

Every failure becomes one of two errors with a one-line message naming the operation
and the object: `ObjectMissing` (the object does not exist) or `TierUnavailable`
(anything else: refused, timed out, a 5xx). obstore's own retries are bounded
(`_MAX_RETRIES`, `request_timeout_ms`) so that a store that is down fails a call in
seconds; the tier service backs off and tries again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final
from urllib.parse import urlsplit

import obstore
from obstore.store import LocalStore, S3Store

from tidemq.core.errors import TierUnavailable
from tidemq.tiered.config import TieredConfig

__all__ = ["ObjectInfo", "ObjectMissing", "ObjectStore", "verify_upload"]

#: Retries of one request inside obstore before the call fails (then the tier service
#: backs off): enough for a dropped connection, not enough to hang on a dead store.
_MAX_RETRIES: Final = 2


class ObjectMissing(TierUnavailable):
    """The object does not exist in the store."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    path: str
    size: int
    #: The store's entity tag: an S3 single-part upload's is the MD5 of its bytes.
    etag: str | None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


class ObjectStore:
    """Objects under one location (`tiered.url`), by relative path."""

    def __init__(self, config: TieredConfig) -> None:
        self.url = config.url
        parts = urlsplit(config.url)
        timeout = f"{config.request_timeout_ms}ms"
        retry: Any = {
            "max_retries": _MAX_RETRIES,
            "retry_timeout": timedelta(milliseconds=config.request_timeout_ms * (_MAX_RETRIES + 1)),
        }
        self._store: Any
        if parts.scheme == "file":
            self._store = LocalStore(parts.path, mkdir=True)
        else:
            kwargs: dict[str, Any] = {"region": config.region}
            if config.endpoint:
                kwargs["endpoint"] = config.endpoint
            if config.access_key_id:
                kwargs["access_key_id"] = config.access_key_id
                kwargs["secret_access_key"] = config.secret_access_key
            self._store = S3Store(
                parts.netloc,
                prefix=parts.path.strip("/") or None,
                client_options={
                    "timeout": timeout,
                    "connect_timeout": timeout,
                    "allow_http": config.endpoint.startswith("http://"),
                },
                retry_config=retry,
                **kwargs,
            )

    def _fail(self, op: str, path: str, exc: Exception) -> TierUnavailable:
        message = f"object store {self.url}: {op} {path} failed: {_one_line(exc)}"
        if isinstance(exc, FileNotFoundError):
            return ObjectMissing(message)
        return TierUnavailable(message)

    def put(self, path: str, data: bytes) -> str | None:
        """Write an object whole (replacing one of the same path); its entity tag."""
        try:
            result = obstore.put(self._store, path, data)
        except Exception as exc:
            raise self._fail("put", path, exc) from None
        etag = result.get("e_tag")
        return None if etag is None else str(etag)

    def head(self, path: str) -> ObjectInfo:
        try:
            meta = obstore.head(self._store, path)
        except Exception as exc:
            raise self._fail("head", path, exc) from None
        return ObjectInfo(path, int(meta["size"]), meta.get("e_tag"))

    def get(self, path: str) -> bytes:
        try:
            return bytes(obstore.get(self._store, path).bytes())
        except Exception as exc:
            raise self._fail("get", path, exc) from None

    def get_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object."""
        if end <= start:
            return b""
        try:
            return bytes(obstore.get_range(self._store, path, start=start, end=end))
        except Exception as exc:
            raise self._fail("get", f"{path} bytes {start}..{end}", exc) from None

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose path starts with `prefix` (a directory: end it with '/')."""
        try:
            found: list[ObjectInfo] = []
            for chunk in obstore.list(self._store, prefix.rstrip("/") or None):
                found.extend(
                    ObjectInfo(str(m["path"]), int(m["size"]), m.get("e_tag")) for m in chunk
                )
        except Exception as exc:
            raise self._fail("list", prefix, exc) from None
        return [o for o in found if o.path.startswith(prefix)]

    def delete(self, path: str) -> None:
        """Delete an object; one already gone is no error (deletes are retried)."""
        try:
            obstore.delete(self._store, path)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise self._fail("delete", path, exc) from None


def verify_upload(store: ObjectStore, path: str, data: bytes, etag: str | None) -> None:
    """Check that the object at `path` holds exactly `data`, before anything relies on it.

    The size always comes from the store (HEAD). The content: an entity tag that is an
    MD5 (S3's, for a single-part upload) is compared with the MD5 of `data`, which costs
    no second transfer; any other tag (a local directory's is inode and time) means the
    object is read back and compared byte for byte. Raises TierUnavailable on a mismatch.
    """
    info = store.head(path)
    if info.size != len(data):
        raise TierUnavailable(
            f"object store {store.url}: {path} holds {info.size} bytes after upload, "
            f"expected {len(data)}"
        )
    tag = (etag or info.etag or "").strip('"')
    if len(tag) == 32 and all(c in "0123456789abcdef" for c in tag):
        if tag != hashlib.md5(data, usedforsecurity=False).hexdigest():
            raise TierUnavailable(f"object store {store.url}: {path} fails its MD5 check")
        return
    if store.get(path) != data:
        raise TierUnavailable(f"object store {store.url}: {path} reads back different bytes")
