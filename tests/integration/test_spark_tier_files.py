"""The Spark source's executors read offloaded ranges straight from the tier's Parquet
files (`spark.tier_files`), with a directory and with an S3 API (moto's server): the
same Arrow rows as through the broker, for ranges that start and end inside files and
cross into the local tail; the broker serves no offloaded read meanwhile; a tier the
executor cannot reach falls back to the broker. No Spark here: `read_range` is what a
Spark task runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from tests.support.s3_server import s3_server

import tidemq
from tidemq.spark.fetch import read_range
from tidemq.spark.options import parse_read_options
from tidemq.spark.planning import OffsetRange
from tidemq.tiered.config import TieredConfig

if TYPE_CHECKING:
    from tests.integration.conftest import ThreadedBroker

    StartSync = Callable[..., ThreadedBroker]

pytestmark = pytest.mark.timeout(120)

TOPIC = "history"
SMALL: dict[str, Any] = {
    "file_bytes": 6 * 1024,
    "row_group_bytes": 2 * 1024,
    "check_interval_ms": 3_600_000,  # offload only when the test says
}
#: Local copies go once offloaded: the broker can serve those offsets from the tier only.
OFFLOADED = {"remote.storage.enable": "true", "local.retention.ms": "0"}


def _fill(address: str, batches: int, start: int = 0) -> None:
    with tidemq.Producer(address) as producer:
        for b in range(start, start + batches):
            n = 20 + b % 7
            producer.send_batch(
                TOPIC,
                [f"v{b}-{i}-".encode() * (1 + i % 5) if i % 9 else None for i in range(n)],
                keys=[b"k%d" % i if i % 3 else None for i in range(n)],
                tags=["paid" if i % 2 else None for i in range(n)],
                headers={"src": b"web"} if b % 3 == 0 else None,
                queue=b % 2,
            )


def _read(address: str, r: OffsetRange, **extra: str) -> Any:
    options = parse_read_options(
        {"bootstrap": address, "subscribe": TOPIC, "includeHeaders": "true", **extra},
        streaming=False,
    )
    batches = list(read_range(options, r))
    return pa.Table.from_batches(batches) if batches else None


def _remote_reads(address: str) -> int:
    with tidemq.Admin(address) as admin:
        return sum(s.remote_reads for s in admin.tier_status())


@pytest.fixture(params=["dir", "s3"])
def tiered_broker(
    request: pytest.FixtureRequest, start_sync_broker: StartSync, tmp_path: Path
) -> Iterator[tuple[str, dict[str, str]]]:
    """A broker's address (its tier a directory or S3), and the source's options that
    reach that tier."""
    if request.param == "dir":
        (tmp_path / "tier").mkdir()
        tiered = TieredConfig(url=f"file://{tmp_path}/tier", **SMALL)
        yield start_sync_broker(tiered=tiered).address, {}
        return
    with s3_server() as s3:
        access = {
            "tidemq.tier.endpoint": s3.endpoint,
            "tidemq.tier.region": "us-east-1",
            "tidemq.tier.accessKeyId": "test",
            "tidemq.tier.secretAccessKey": "test",
        }
        yield start_sync_broker(tiered=s3.tiered(**SMALL)).address, access


def test_offloaded_ranges_are_read_from_the_files_as_from_the_broker(
    tiered_broker: tuple[str, dict[str, str]],
) -> None:
    address, access = tiered_broker
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 2, config=OFFLOADED)
        _fill(address, 40)
        (status,) = admin.tier_offload(TOPIC)
        _fill(address, 6, start=40)  # a local tail past the files
        ends = {q.queue: q.max_offset for q in admin.describe_topic(TOPIC).queue_info}
        files = admin.tier_files(TOPIC, queue=0)
    assert len(files) > 2
    remote_end = {q.queue: q.remote_end for q in status.queues}
    mid = files[1].start + 3  # inside a file
    ranges = [
        OffsetRange(TOPIC, 0, 0, ends[0]),  # all of it: files, then the local tail
        OffsetRange(TOPIC, 0, mid, files[2].end - 2),  # starts and ends inside files
        OffsetRange(TOPIC, 1, remote_end[1] - 5, ends[1]),  # across the boundary
        OffsetRange(TOPIC, 1, remote_end[1], ends[1]),  # local only
    ]
    before = _remote_reads(address)
    direct = [_read(address, r, **access) for r in ranges]
    assert _remote_reads(address) == before  # nothing offloaded was read by the broker
    through = [_read(address, r, readFromTier="never") for r in ranges]
    assert _remote_reads(address) > before
    for r, a, b in zip(ranges, direct, through, strict=True):
        assert a.schema == b.schema
        assert a.equals(b), r
        assert a.column("offset").to_pylist() == list(range(r.start, r.end))


def test_a_tier_the_executor_cannot_reach_falls_back_to_the_broker(
    start_sync_broker: StartSync,
) -> None:
    with s3_server() as s3:
        address = start_sync_broker(tiered=s3.tiered(**SMALL)).address
        with tidemq.Admin(address) as admin:
            admin.create_topic(TOPIC, 2, config=OFFLOADED)
            _fill(address, 20)
            admin.tier_offload(TOPIC)
            end = admin.describe_topic(TOPIC).queue_info[0].max_offset
        r = OffsetRange(TOPIC, 0, 0, end)
        before = _remote_reads(address)
        # A port where nothing listens: the executor's read fails, the broker serves.
        wrong = {"tidemq.tier.endpoint": "http://127.0.0.1:9", "tidemq.tier.region": "x"}
        got = _read(address, r, **wrong)
        assert _remote_reads(address) > before
        assert got.equals(_read(address, r, readFromTier="never"))


def test_read_from_tier_option_is_checked() -> None:
    with pytest.raises(ValueError, match="readFromTier"):
        parse_read_options(
            {"bootstrap": "127.0.0.1:1", "subscribe": TOPIC, "readFromTier": "sometimes"},
            streaming=False,
        )


def test_a_topic_that_is_not_offloaded_has_no_files_and_keeps_its_bounds(
    start_sync_broker: StartSync, tmp_path: Path
) -> None:
    """Listing files of a topic without remote.storage.enable (what every Spark task asks
    first) made a remote range at its start and a manifest in the bucket: a compacted
    queue then refused reads below its first kept message as lost."""
    (tmp_path / "tier").mkdir()
    tiered = TieredConfig(url=f"file://{tmp_path}/tier", **SMALL)
    address = start_sync_broker(tiered=tiered).address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 2)
        _fill(address, 4)
        before = admin.describe_topic(TOPIC).queue_info
        assert admin.tier_files(TOPIC) == []
        assert admin.describe_topic(TOPIC).queue_info == before
    assert not list((tmp_path / "tier").rglob("*.json"))
    r = OffsetRange(TOPIC, 0, 0, before[0].max_offset)
    assert _read(address, r).num_rows == before[0].max_offset
