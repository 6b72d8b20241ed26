"""History straight from the tier: an executor reads the offloaded part of its offset range
from the object store's Parquet files, asking the broker only for the list of files.

A tier file's first columns are the source's (`core.arrow.source_schema` with headers;
`tiered/parquet_rows.py` writes them with the same function that decodes fetched
records), so its rows for offsets [lo, hi) are the rows a fetch of that range gives: the
read selects those columns, picks the row groups by their `offset` statistics, cuts them to the
offsets and casts to the source's Arrow schema. The hot tail (past the last file) comes
from the broker as before.

Used for ordinary topics when the option `readFromTier` is `auto` (the default); static
topics' files are in each broker's physical offsets and are read through the brokers. A
file that cannot be read (missing credentials, deleted by retention meanwhile) makes the
rest of the range come from the broker, which answers what it holds (the data-loss rules
apply there), with a warning in the executor's log.

S3: `tidemq.tier.endpoint` (``http://host:port`` for MinIO or any S3 API),
`tidemq.tier.region`, `tidemq.tier.accessKeyId` and `tidemq.tier.secretAccessKey`; without
them pyarrow's default AWS credential chain (environment, files, instance role) applies.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Final
from urllib.parse import urlsplit

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tidemq.client.cluster import ClusterClient
from tidemq.core.arrow import source_schema
from tidemq.protocol.tier_messages import TierFile, TierFilesRequest, TierFilesResponse
from tidemq.spark.options import ReadOptions, TierAccess
from tidemq.spark.planning import OffsetRange
from tidemq.spark.retry import retrying

__all__ = ["filesystem", "offloaded_files", "read_file_range", "read_offloaded"]

log = logging.getLogger(__name__)

#: Rows per record batch handed to Spark (a row group is cut into batches of this).
_MAX_BATCH_ROWS: Final = 65_536


def filesystem(access: TierAccess, url: str) -> tuple[Any, str]:
    """The pyarrow file system and the path in it of a tier file's URL."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return pafs.LocalFileSystem(), parts.path
    if parts.scheme != "s3":
        raise ValueError(f"tier file URL {url!r}: only file:// and s3:// are read")
    kwargs: dict[str, Any] = {}
    if access.endpoint:
        endpoint = urlsplit(access.endpoint)
        kwargs["endpoint_override"] = endpoint.netloc or access.endpoint
        kwargs["scheme"] = endpoint.scheme or "https"
    if access.region or access.endpoint:
        # A region given up front: without one pyarrow may ask the EC2 metadata service
        # (seconds of timeouts off AWS); an S3 API of one's own takes any.
        kwargs["region"] = access.region or "us-east-1"
    if access.access_key_id:
        kwargs["access_key"] = access.access_key_id
        kwargs["secret_key"] = access.secret_access_key or ""
    return pafs.S3FileSystem(**kwargs), f"{parts.netloc}{parts.path}"


def read_file_range(
    access: TierAccess, url: str, lo: int, hi: int, *, include_headers: bool
) -> Iterator[Any]:
    """The rows of tier file `url` at offsets [lo, hi), in offset order, as
    `pa.RecordBatch`es of the source's schema."""
    schema = source_schema(include_headers)
    fs, path = filesystem(access, url)
    with fs.open_input_file(path) as raw:
        pf = pq.ParquetFile(raw)
        column = pf.schema_arrow.get_field_index("offset")
        for g in range(pf.num_row_groups):
            stats = pf.metadata.row_group(g).column(column).statistics
            if stats is not None and stats.has_min_max and (stats.max < lo or stats.min >= hi):
                continue
            table = pf.read_row_group(g, columns=schema.names)
            inside = stats is not None and stats.has_min_max and lo <= stats.min <= stats.max < hi
            if not inside:
                # Offsets ascend within a file (one row per message): cut, not filter.
                offsets = table.column("offset").to_numpy()
                first, last = np.searchsorted(offsets, [lo, hi])
                table = table.slice(int(first), int(last - first))
            table = table.cast(schema)
            for batch in table.to_batches(max_chunksize=_MAX_BATCH_ROWS):
                if batch.num_rows:
                    yield batch


async def offloaded_files(cluster: ClusterClient, r: OffsetRange, start: int) -> list[TierFile]:
    """The tier files of the queue holding offsets in [start, r.end), in offset order
    (none for a static topic, or a broker without tiered storage)."""
    routes = await cluster.refresh_routes()
    if routes.is_static(r.topic):
        return []
    request = TierFilesRequest(topic=r.topic, queue=r.queue, start=start, end=r.end)

    async def once() -> TierFilesResponse:
        address = await cluster.broker_for(r.topic, r.queue)
        return await cluster.call(address, request, TierFilesResponse)

    answer = await retrying(cluster, once)
    return sorted(answer.files, key=lambda f: f.start)


def read_offloaded(
    files: list[TierFile], options: ReadOptions, r: OffsetRange, start: int
) -> Iterator[tuple[list[Any], int]]:
    """Per file holding the range from `start` on, contiguously: its record batches and
    the position after them. Stops at a gap or at a file that cannot be read (logged):
    the broker reads the rest."""
    position = start
    for f in files:
        if f.start > position or position >= r.end:
            return  # a gap (retention meanwhile): the broker decides what is there
        hi = min(f.end, r.end)
        try:
            # Whole files only: a failure half-way yields nothing the broker repeats.
            batches = list(
                read_file_range(
                    options.tier, f.url, position, hi, include_headers=options.include_headers
                )
            )
        except (OSError, ValueError) as exc:
            log.warning(
                "tidemq: reading %s from the tier failed (%s); offsets from %d of %s/%d are "
                "read through the broker",
                f.url,
                exc,
                position,
                r.topic,
                r.queue,
            )
            return
        position = hi
        yield batches, position
