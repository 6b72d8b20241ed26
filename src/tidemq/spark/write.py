"""DataFrame rows to tidemq: Arrow record batches grouped per (topic, queue) and sent with
`send_batch`, so that each Arrow batch becomes a few end-to-end batches. No pyspark here.

Columns (others are ignored, as Kafka's sink ignores them): ``value`` (binary or string,
required; null is a tombstone), ``key`` (binary or string), ``topic`` (string; the
``topic`` option overrides it), ``partition`` (int: the queue), ``headers``
(array<struct<key: string, value: binary or string>>), ``tag`` (string).

Queue choice per row, as the producer's: ``partition`` when not null, else the key's hash
over the topic's queues (`RouteTable.select_queue`), else one round-robin queue per topic
for the whole Arrow batch (Kafka's sticky partitioner: unkeyed rows stay together).
Rows keep their order within a queue. `send_batch` takes one headers mapping per batch,
so rows with headers are cut into runs of equal headers.

Target topics: `check_target_topic` runs on the driver when a write starts (the data
source's `writer()` / `streamWriter()`): a `topic` option naming a topic that does not
exist fails the query there, naming it, unless `createTopic=true` (then it is created).
Topics that come from the `topic` column are only known row by row: a missing one fails
the task that meets it (with the same message), or is created by it with `createTopic`.

`write_batches` sends non-transactionally: a Spark task retried after a failure sends its
rows again (at least once). The exactly-once streaming sink is `tidemq.spark.sink`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from tidemq.client.admin import AsyncAdmin
from tidemq.client.cluster import ClusterClient
from tidemq.client.producer import AsyncProducer
from tidemq.core.errors import TopicAlreadyExists, TopicNotFound
from tidemq.spark._runtime import runtime
from tidemq.spark.options import OptionError, WriteOptions
from tidemq.spark.value_encode import encode_value_column as encode
from tidemq.spark.value_encode import resolve_write_format

__all__ = [
    "WRITE_COLUMNS",
    "SendGroup",
    "WriteResult",
    "check_target_topic",
    "check_write_columns",
    "ensure_topics",
    "group_rows",
    "routes_for_batch",
    "with_value_format",
    "write_batches",
]

#: Column name -> what it may hold (for messages); `value` is required.
WRITE_COLUMNS: Final = {
    "value": "binary or string",
    "key": "binary or string",
    "topic": "string",
    "partition": "int",
    "headers": "array<struct<key: string, value: binary or string>>",
    "tag": "string",
}
#: Targets for one end-to-end batch: well under the broker's 4 MiB max_message_bytes and
#: the producer's own batch defaults.
MAX_GROUP_MESSAGES: Final = 4096
MAX_GROUP_BYTES: Final = 1 << 20
#: Per-message overhead counted against MAX_GROUP_BYTES (offsets, timestamp, bitmaps).
_MESSAGE_OVERHEAD: Final = 24
#: Arrow batches whose sends may be in flight at once per task.
_IN_FLIGHT_BATCHES: Final = 4


class Routes(Protocol):
    """What grouping needs of the client's route table."""

    def queue_count(self, topic: str) -> int: ...

    def select_queue(self, topic: str, key: bytes | None, round_robin_counter: int) -> int: ...


@dataclass(slots=True)
class SendGroup:
    """One `send_batch` call."""

    topic: str
    queue: int
    values: list[bytes | None]
    keys: list[bytes | None] | None = None
    tags: list[str | None] | None = None
    headers: dict[str, bytes] | None = None


@dataclass(slots=True)
class WriteResult:
    rows: int = 0
    batches: int = 0
    #: (topic, queue) -> rows sent there
    per_queue: dict[tuple[str, int], int] = field(default_factory=dict)


def _is_binary_or_string(t: Any) -> bool:
    return bool(
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    )


def check_write_columns(types: dict[str, Any], *, encoded_value: bool = False) -> None:
    """Refuse a DataFrame the sink cannot write, naming the column. `types` maps column
    names to Arrow types. `encoded_value`: the value is a struct that a valueFormat
    encodes (checked by `value_encode.resolve_write_format`)."""
    if "value" not in types:
        raise ValueError(
            "a DataFrame written to tidemq needs a 'value' column (binary or string); "
            f"it has {sorted(types)}"
        )
    for name in ("key",) if encoded_value else ("value", "key"):
        if name in types and not _is_binary_or_string(types[name]):
            raise ValueError(f"column {name!r} must be binary or string, not {types[name]}")
    for name in ("topic", "tag"):
        if name in types and not (
            pa.types.is_string(types[name]) or pa.types.is_large_string(types[name])
        ):
            raise ValueError(f"column {name!r} must be a string, not {types[name]}")
    if "partition" in types and not pa.types.is_integer(types["partition"]):
        raise ValueError(f"column 'partition' must be an int, not {types['partition']}")
    if "headers" in types:
        t = types["headers"]
        ok = (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type)
        if ok:
            entry = t.value_type
            names = [entry.field(i).name for i in range(entry.num_fields)]
            ok = (
                names == ["key", "value"]
                and pa.types.is_string(entry.field("key").type)
                and _is_binary_or_string(entry.field("value").type)
            )
        if not ok:
            raise ValueError(
                "column 'headers' must be array<struct<key: string, value: binary>>, "
                f"not {types['headers']}"
            )


def _as_binary(column: Any) -> Any:
    if pa.types.is_binary(column.type):
        return column
    return pc.cast(column, pa.binary())


def _row_sizes(batch: Any) -> npt.NDArray[np.int64]:
    sizes = np.full(batch.num_rows, _MESSAGE_OVERHEAD, dtype=np.int64)
    for name in ("value", "key"):
        if name in batch.schema.names:
            lengths = pc.fill_null(pc.binary_length(batch.column(name)), 0)
            sizes += lengths.to_numpy(zero_copy_only=False).astype(np.int64)
    return sizes


def _chunks(sizes: npt.NDArray[np.int64], lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """[i, j) row ranges covering [lo, hi), of at most MAX_GROUP_MESSAGES rows and
    MAX_GROUP_BYTES (a row larger than that goes alone)."""
    cum = np.cumsum(sizes)
    n = hi
    i = lo
    while i < n:
        before = int(cum[i - 1]) if i else 0
        j = int(np.searchsorted(cum, before + MAX_GROUP_BYTES, side="right"))
        j = min(max(j, i + 1), i + MAX_GROUP_MESSAGES, n)
        yield i, j
        i = j


def _queues(
    batch: Any, topics: list[str], topic_ids: npt.NDArray[np.int64], routes: Routes, counter: int
) -> npt.NDArray[np.int64]:
    n = batch.num_rows
    names = batch.schema.names
    queues = np.full(n, -1, dtype=np.int64)
    if "partition" in names:
        part = batch.column("partition")
        given = np.asarray(part.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        values = pc.fill_null(part, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        queues[given] = values[given]
        for t, topic in enumerate(topics):
            mine = given & (topic_ids == t)
            if mine.any():
                count = routes.queue_count(topic)
                bad = mine & ((values < 0) | (values >= count))
                if bad.any():
                    row = int(np.flatnonzero(bad)[0])
                    raise ValueError(
                        f"row {row}: partition {int(values[row])} does not exist in topic "
                        f"{topic!r}, which has {count} queues"
                    )
    todo = queues < 0
    if "key" in names and todo.any():
        keys = _as_binary(batch.column("key"))
        has_key = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        for row in np.flatnonzero(todo & has_key).tolist():
            key = keys[row].as_py()
            queues[row] = routes.select_queue(topics[topic_ids[row]], key, 0)
        todo &= ~has_key
    if todo.any():
        for t, topic in enumerate(topics):
            mine = todo & (topic_ids == t)
            if mine.any():
                queues[mine] = routes.select_queue(topic, None, counter + t)
    return queues


def _topics(batch: Any, topic: str | None) -> tuple[list[str], npt.NDArray[np.int64]]:
    """(distinct topics, per-row index into them)."""
    n = batch.num_rows
    if topic is not None:
        return [topic], np.zeros(n, dtype=np.int64)
    if "topic" not in batch.schema.names:
        raise ValueError("no topic: set the option 'topic' or give the DataFrame a 'topic' column")
    column = batch.column("topic")
    if column.null_count:
        row = int(np.flatnonzero(~column.is_valid().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"row {row} has a null topic: set the option 'topic' or fill the column")
    encoded = pc.dictionary_encode(column)
    topics = [str(t) for t in encoded.dictionary.to_pylist()]
    return topics, encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _header_dicts(column: Any) -> list[dict[str, bytes] | None]:
    out: list[dict[str, bytes] | None] = []
    for entries in column.to_pylist():
        if not entries:
            out.append(None)
            continue
        headers: dict[str, bytes] = {}
        for entry in entries:
            value = entry["value"]
            if value is None:
                value = b""
            elif isinstance(value, str):
                value = value.encode()
            headers[entry["key"]] = value
        out.append(headers)
    return out


def _runs(items: Sequence[object]) -> list[tuple[int, int]]:
    """[i, j) ranges of equal consecutive items."""
    out = []
    start = 0
    for i in range(1, len(items) + 1):
        if i == len(items) or items[i] != items[start]:
            out.append((start, i))
            start = i
    return out


def group_rows(
    batch: Any, *, topic: str | None, routes: Routes, counter: int = 0
) -> list[SendGroup]:
    """The `send_batch` calls that write `batch`'s rows: per (topic, queue) in first-row
    order, rows in their order, cut at MAX_GROUP_MESSAGES / MAX_GROUP_BYTES and where the
    headers change. `counter` picks the round-robin queue of unkeyed rows."""
    n = batch.num_rows
    if n == 0:
        return []
    names = batch.schema.names
    topics, topic_ids = _topics(batch, topic)
    queues = _queues(batch, topics, topic_ids, routes, counter)
    group_key = topic_ids * (1 << 32) + queues
    order = np.argsort(group_key, kind="stable")
    sorted_keys = group_key[order]
    cuts = np.flatnonzero(np.diff(sorted_keys)) + 1
    starts = np.concatenate(([0], cuts))
    # Groups in the order of their first row, so that output order follows input order.
    first_rows = [int(order[s]) for s in starts]
    segments = sorted(
        zip(first_rows, starts.tolist(), [*cuts.tolist(), n], strict=True), key=lambda x: x[0]
    )
    groups: list[SendGroup] = []
    for _, lo, hi in segments:
        idx = order[lo:hi]
        rows = batch if hi - lo == n else batch.take(pa.array(idx))
        t = topics[int(topic_ids[idx[0]])]
        q = int(queues[idx[0]])
        values = _as_binary(rows.column("value")).to_pylist()
        keys = _as_binary(rows.column("key")).to_pylist() if "key" in names else None
        if keys is not None and all(k is None for k in keys):
            keys = None
        tags = rows.column("tag").to_pylist() if "tag" in names else None
        if tags is not None and all(tg is None for tg in tags):
            tags = None
        sizes = _row_sizes(rows)
        headers: Sequence[dict[str, bytes] | None] = [None] * len(values)
        runs = [(0, len(values))]
        if "headers" in names:
            headers = _header_dicts(rows.column("headers"))
            runs = _runs(headers)
        for run_lo, run_hi in runs:
            for a, b in _chunks(sizes, run_lo, run_hi):
                groups.append(
                    SendGroup(
                        t,
                        q,
                        values[a:b],
                        None if keys is None else keys[a:b],
                        None if tags is None else tags[a:b],
                        headers[a],
                    )
                )
    return groups


def _missing_message(missing: Sequence[str], *, from_column: bool) -> str:
    names = ", ".join(repr(m) for m in missing)
    what = (
        f"topic {names} named by the DataFrame's 'topic' column"
        if from_column
        else f"the write's topic {names} (option 'topic')"
    )
    verb = "do" if from_column and len(missing) > 1 else "does"
    return (
        f"tidemq: {what} {verb} not exist. Create it first (tidemq topic create NAME "
        "--queues N, or Admin.create_topic), or set the option createTopic=true (with "
        "createTopic.queues, default 8) to have the writer create it"
    )


async def ensure_topics(
    cluster: ClusterClient, options: WriteOptions, topics: Sequence[str], *, from_column: bool
) -> Any:
    """The route table, with every topic of `topics` in it: missing topics are created
    when `options.create_topic`, else TopicNotFound names them."""
    routes = await cluster.refresh_routes(force=True)
    missing = sorted({t for t in topics if t not in routes})
    if not missing:
        return routes
    if not options.create_topic:
        raise TopicNotFound(_missing_message(missing, from_column=from_column))
    admin = AsyncAdmin(options.bootstrap, client_config=options.client.client_config())
    try:
        for name in missing:
            # TopicAlreadyExists: another task or writer created it meanwhile.
            with contextlib.suppress(TopicAlreadyExists):
                await admin.create_topic(name, options.create_queues)
    finally:
        await admin.close()
    return await cluster.refresh_routes(force=True)


def check_target_topic(options: WriteOptions) -> None:
    """Driver side, when a write starts: the `topic` option's topic exists (or is created
    with `createTopic=true`). Without the option nothing can be checked yet."""
    if options.topic is None:
        return
    rt = runtime()
    rt.run(
        ensure_topics(
            rt.cluster(options.bootstrap, options.client),
            options,
            [options.topic],
            from_column=False,
        )
    )


def routes_for_batch(
    cluster: ClusterClient, options: WriteOptions, batch: Any, *, counter: int
) -> tuple[Routes, list[SendGroup]]:
    """After `group_rows` met a topic missing from `stale` routes: look again (creating
    missing topics with `createTopic`) and group the batch with the new routes."""
    rt = runtime()
    topics, _ = _topics(batch, options.topic)
    routes: Routes = rt.run(
        ensure_topics(cluster, options, topics, from_column=options.topic is None)
    )
    return routes, group_rows(batch, topic=options.topic, routes=routes, counter=counter)


async def _producer(bootstrap: str, cluster: ClusterClient) -> AsyncProducer:
    """A producer on the runtime's loop, sharing the process's client (closing it leaves
    the client open)."""
    return AsyncProducer(bootstrap, cluster=cluster)


async def _send(producer: AsyncProducer, groups: Sequence[SendGroup]) -> list[int]:
    futures = []
    for g in groups:
        futures.append(
            await producer.send_batch_nowait(
                g.topic, g.values, keys=g.keys, tags=g.tags, headers=g.headers, queue=g.queue
            )
        )
    receipts = await asyncio.gather(*futures)
    return [len(r) for r in receipts]


def with_value_format(
    options: WriteOptions, raw: Mapping[str, str], types: dict[str, Any]
) -> WriteOptions:
    """`options` with the value format `raw` asks for, resolved (driver side), after the
    columns are checked: `types` maps column names to Arrow types."""
    lowered = {str(k).lower(): str(v) for k, v in raw.items() if v is not None}
    try:
        found = resolve_write_format(lowered, types.get("value"), options.topic)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    check_write_columns(types, encoded_value=found is not None)
    return dataclasses.replace(options, value_format=found)


def write_batches(
    options: WriteOptions, batches: Iterable[Any], *, counter: int = 0
) -> WriteResult:
    """Send every row of `batches` (Arrow record batches); returns what was sent. Raises the
    first send error (after the sends already in flight settle)."""
    rt = runtime()
    cluster = rt.cluster(options.bootstrap, options.client)
    producer = rt.run(_producer(options.bootstrap, cluster))
    result = WriteResult()
    in_flight: deque[tuple[list[SendGroup], concurrent.futures.Future[list[int]]]] = deque()

    def settle_one() -> None:
        groups, future = in_flight.popleft()
        for g, sent in zip(groups, future.result(), strict=True):
            result.rows += sent
            result.batches += 1
            result.per_queue[(g.topic, g.queue)] = (
                result.per_queue.get((g.topic, g.queue), 0) + sent
            )

    try:
        routes: Routes = rt.run(cluster.refresh_routes())
        for raw in batches:
            batch = raw if options.value_format is None else encode(raw, options.value_format)
            try:
                groups = group_rows(batch, topic=options.topic, routes=routes, counter=counter)
            except TopicNotFound:
                # Routes cached before the topic was created: look again, once.
                routes, groups = routes_for_batch(cluster, options, batch, counter=counter)
            counter += 1
            if groups:
                in_flight.append((groups, rt.submit(_send(producer, groups))))
            while len(in_flight) > _IN_FLIGHT_BATCHES:
                settle_one()
        while in_flight:
            settle_one()
    finally:
        for _, future in in_flight:
            concurrent.futures.wait([future])
        rt.run(producer.close())
    return result
