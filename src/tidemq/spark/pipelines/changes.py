"""Change events (CDC) of an order store: the format, a generator, and the reference state.

The `db-sync` pipeline (`tidemq.spark.pipelines.db_sync`) replays these events into a
database sharded by another key; this module is pure Python plus the tidemq client (no
pyspark), so `tidemq pipeline generate-changes` works without the `spark` extra.

Event format: one message per change, its value UTF-8 JSON, its key `str(order_id)`, so
every event of an order lands in one queue, in the order it happened::

    {"op": "insert" | "update" | "delete",
     "table": "orders" | "order_items",
     "pk": {"order_id": 7} | {"order_id": 7, "line_no": 2},
     "order_id": 7,
     "row": {...every column of the table...},
     "ts": 1767225600000}

`row` is the whole row after the change (insert, update) or before it (delete: the
before image, so a consumer knows where the deleted row lives). `pk` repeats the row's
primary-key columns; `ts` is the change time in ms since the epoch. The tables:

* `orders`, primary key (`order_id`): `order_id`, `buyer_id`, `seller_id`, `status`,
  `amount_cents`, `updated_ms`.
* `order_items`, primary key (`order_id`, `line_no`): `order_id`, `line_no`,
  `buyer_id`, `seller_id`, `sku`, `qty`, `price_cents`, `updated_ms`.

Every row carries `buyer_id` and `seller_id`, and an order's buyer and seller never
change: the source store is sharded by buyer, the `db-sync` target by seller. The target
shard of a row is `row[shard_column] % shards` (`shard_column` defaults to `seller_id`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from tidemq.client.sync import Producer

__all__ = [
    "DEFAULT_SHARD_COLUMN",
    "DEFAULT_START_MS",
    "MAX_EVENT_BYTES",
    "MAX_GENERATED_ORDERS",
    "MAX_ITEMS_PER_ORDER",
    "MAX_SHARDS",
    "MAX_TEXT_CHARS",
    "OPS",
    "PRODUCE_CHUNK_EVENTS",
    "STATUSES",
    "TABLES",
    "ChangeEvent",
    "Op",
    "Row",
    "Scalar",
    "State",
    "TableSpec",
    "check_shard_column",
    "expected_state",
    "generate_changes",
    "parse_change",
    "produce_changes",
    "shard_of",
]

Op = Literal["insert", "update", "delete"]
OPS: Final = get_args(Op)
#: A column value: the tables hold integers and short texts only.
Scalar = int | str
Row = dict[str, Scalar]
#: shard -> table -> primary key (values in the table's key order) -> row.
State = dict[int, dict[str, dict[tuple[Scalar, ...], Row]]]

#: One event's JSON, at most: a generated one is about 250 bytes; anything near this
#: is not an event of these tables.
MAX_EVENT_BYTES: Final = 64 << 10
#: Texts (`status`, `sku`) at most this long: the target columns are VARCHAR of it.
MAX_TEXT_CHARS: Final = 64
#: Orders one `generate_changes` call makes at most: the events are built in memory
#: (about 10 per order).
MAX_GENERATED_ORDERS: Final = 1_000_000
#: Lines per generated order at most.
MAX_ITEMS_PER_ORDER: Final = 5
#: Target shards at most: each is a database with its own connection pool per process.
MAX_SHARDS: Final = 1024
#: Events `produce_changes` has in flight at once (then it waits for their receipts).
PRODUCE_CHUNK_EVENTS: Final = 4096
#: Where generated time starts (2026-01-01T00:00:00Z): fixed, so a seed fixes every event.
DEFAULT_START_MS: Final = 1_767_225_600_000
DEFAULT_SHARD_COLUMN: Final = "seller_id"
#: An order's life: created, then paid, shipped and delivered, or cancelled on the way.
STATUSES: Final = ("created", "paid", "shipped", "delivered", "cancelled")


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A table of the events: its columns (name -> Python type, in order) and its key."""

    name: str
    columns: Mapping[str, type]
    pk: tuple[str, ...]


TABLES: Final[Mapping[str, TableSpec]] = {
    "orders": TableSpec(
        "orders",
        {
            "order_id": int,
            "buyer_id": int,
            "seller_id": int,
            "status": str,
            "amount_cents": int,
            "updated_ms": int,
        },
        ("order_id",),
    ),
    "order_items": TableSpec(
        "order_items",
        {
            "order_id": int,
            "line_no": int,
            "buyer_id": int,
            "seller_id": int,
            "sku": str,
            "qty": int,
            "price_cents": int,
            "updated_ms": int,
        },
        ("order_id", "line_no"),
    ),
}
_FIELDS: Final = ("op", "table", "pk", "order_id", "row", "ts")


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One change of one row (see the module docstring for the fields)."""

    op: Op
    table: str
    pk: dict[str, int]
    order_id: int
    row: Row
    ts: int

    @property
    def key(self) -> bytes:
        """The message key: every event of an order goes to one queue, in order."""
        return str(self.order_id).encode()

    @property
    def pk_values(self) -> tuple[Scalar, ...]:
        """The primary key's values, in the table's key order."""
        return tuple(self.pk[c] for c in TABLES[self.table].pk)

    def to_json(self) -> bytes:
        """The message value (UTF-8 JSON, fields in the documented order)."""
        doc = {
            "op": self.op,
            "table": self.table,
            "pk": self.pk,
            "order_id": self.order_id,
            "row": self.row,
            "ts": self.ts,
        }
        return json.dumps(doc, separators=(",", ":")).encode()


# ------------------------------------------------------------------ parsing


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_row(spec: TableSpec, row: object) -> Row:
    if not isinstance(row, dict):
        raise ValueError(f"'row' must be an object, got {type(row).__name__}")
    missing = [c for c in spec.columns if c not in row]
    extra = sorted(set(row) - set(spec.columns))
    if missing or extra:
        raise ValueError(
            f"'row' of table {spec.name!r} must have exactly the columns "
            f"{', '.join(spec.columns)}: missing {missing or 'none'}, unknown {extra or 'none'}"
        )
    for column, kind in spec.columns.items():
        value = row[column]
        if kind is int and not _is_int(value):
            raise ValueError(f"row column {column!r} must be an integer, got {value!r}")
        if kind is str and not (isinstance(value, str) and len(value) <= MAX_TEXT_CHARS):
            raise ValueError(
                f"row column {column!r} must be a text of at most {MAX_TEXT_CHARS} "
                f"characters, got {value!r}"
            )
    return row


def _load(value: bytes | None) -> dict[str, Any]:
    """The value's JSON object, with exactly the event's fields."""
    if value is None:
        raise ValueError("the message has no value (a tombstone), not a change event")
    if len(value) > MAX_EVENT_BYTES:
        raise ValueError(f"the value has {len(value)} bytes, over the {MAX_EVENT_BYTES} limit")
    try:
        doc = json.loads(value.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the value is not UTF-8 JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"the value must be a JSON object, got {type(doc).__name__}")
    missing = [f for f in _FIELDS if f not in doc]
    extra = sorted(set(doc) - set(_FIELDS))
    if missing or extra:
        raise ValueError(
            f"an event has exactly the fields {', '.join(_FIELDS)}: "
            f"missing {missing or 'none'}, unknown {extra or 'none'}"
        )
    return doc


def parse_change(value: bytes | None) -> ChangeEvent:
    """An event from a message value; a ValueError says what is wrong with it."""
    doc = _load(value)
    op, table, pk, order_id, ts = doc["op"], doc["table"], doc["pk"], doc["order_id"], doc["ts"]
    if op not in OPS:
        raise ValueError(f"'op' must be one of {', '.join(OPS)}, got {op!r}")
    spec = TABLES.get(table) if isinstance(table, str) else None
    if spec is None:
        raise ValueError(f"unknown table {table!r} (known: {', '.join(TABLES)})")
    if not _is_int(order_id):
        raise ValueError(f"'order_id' must be an integer, got {order_id!r}")
    if not _is_int(ts) or ts < 0:
        raise ValueError(f"'ts' must be ms since the epoch (an integer >= 0), got {ts!r}")
    if not isinstance(pk, dict) or sorted(pk) != sorted(spec.pk):
        raise ValueError(f"'pk' of table {table!r} must be an object of {spec.pk}, got {pk!r}")
    row = _check_row(spec, doc["row"])
    for column in spec.pk:
        if pk[column] != row[column]:
            raise ValueError(f"pk {column}={pk[column]!r} but the row has {row[column]!r}")
    if row["order_id"] != order_id:
        raise ValueError(f"'order_id' is {order_id} but the row's order_id is {row['order_id']}")
    return ChangeEvent(op, table, {c: pk[c] for c in spec.pk}, order_id, row, ts)


def shard_of(row: Mapping[str, object], shards: int, shard_column: str) -> int:
    """The target shard of a row: `row[shard_column] % shards`."""
    value = row.get(shard_column)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"the sharding column {shard_column!r} must be an integer, got {value!r}")
    return value % shards


def check_shard_column(shard_column: str) -> None:
    """Every table must have the sharding column, as an integer."""
    for spec in TABLES.values():
        if spec.columns.get(shard_column) is not int:
            raise ValueError(
                f"cannot shard by {shard_column!r}: table {spec.name!r} has no integer "
                f"column of that name (its columns: {', '.join(spec.columns)})"
            )


# ------------------------------------------------------------------ the reference


def expected_state(
    events: Iterable[ChangeEvent], shards: int, *, shard_column: str = DEFAULT_SHARD_COLUMN
) -> State:
    """What the target holds after `events`, applied one by one in memory: an insert or
    an update sets the row, a delete removes it (a missing row stays missing). Every
    shard and table is present, possibly empty. The tests compare the databases to it."""
    if not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards must be 1..{MAX_SHARDS}, got {shards}")
    check_shard_column(shard_column)
    state: State = {s: {t: {} for t in TABLES} for s in range(shards)}
    for event in events:
        rows = state[shard_of(event.row, shards, shard_column)][event.table]
        if event.op == "delete":
            rows.pop(event.pk_values, None)
        else:
            rows[event.pk_values] = dict(event.row)
    return state


# ------------------------------------------------------------------ the generator


@dataclass(slots=True)
class _Order:
    """One order's life, written as events on its own clock."""

    rng: random.Random
    order: Row
    items: dict[int, Row]
    now: int
    events: list[ChangeEvent] = field(default_factory=list)

    def emit(self, op: Op, table: str, row: Row) -> None:
        self.now += self.rng.randint(1, 120_000)  # strictly increasing: the order's sequence
        if op != "delete":
            row["updated_ms"] = self.now
        pk = {c: int(row[c]) for c in TABLES[table].pk}
        self.events.append(ChangeEvent(op, table, pk, int(row["order_id"]), dict(row), self.now))

    def reprice(self) -> None:
        """The order's amount follows its lines."""
        total = sum(int(i["qty"]) * int(i["price_cents"]) for i in self.items.values())
        self.order["amount_cents"] = total
        self.emit("update", "orders", self.order)

    def set_status(self, status: str) -> None:
        self.order["status"] = status
        self.emit("update", "orders", self.order)


def _live(rng: random.Random, o: _Order) -> None:
    """Insert the order and its lines, then change them the way a shop does."""
    o.emit("insert", "orders", o.order)
    for item in o.items.values():
        o.emit("insert", "order_items", item)
    if rng.random() < 0.3:  # the buyer changes a quantity
        item = o.items[rng.choice(sorted(o.items))]
        item["qty"] = rng.randint(1, 9)
        o.emit("update", "order_items", item)
        o.reprice()
    if len(o.items) > 1 and rng.random() < 0.2:  # ... or drops a line
        gone = o.items.pop(rng.choice(sorted(o.items)))
        o.emit("delete", "order_items", gone)
        o.reprice()
    for status in STATUSES[1:4]:
        if rng.random() < 0.12:
            o.set_status("cancelled")
            if rng.random() < 0.5:  # purged: lines first, then the order
                for line in sorted(o.items):
                    o.emit("delete", "order_items", o.items.pop(line))
                o.emit("delete", "orders", o.order)
            return
        if rng.random() < 0.15:  # not there yet
            return
        o.set_status(status)


def generate_changes(
    orders: int,
    *,
    seed: int,
    first_order_id: int = 1,
    buyers: int = 500,
    sellers: int = 50,
    start_ms: int = DEFAULT_START_MS,
    spread_ms: int = 3_600_000,
) -> list[ChangeEvent]:
    """The change events of `orders` orders (ids from `first_order_id`), in time order.

    Deterministic: the same arguments give the same events. Each order starts at a random
    time within `spread_ms` of `start_ms` and lives on its own clock, so the events of
    different orders interleave while those of one order keep their order. An order gets
    1..MAX_ITEMS_PER_ORDER lines, a random buyer and seller (fixed for its life), maybe a
    quantity change or a dropped line (repriced each time), then moves through paid,
    shipped and delivered, or is cancelled on the way and sometimes deleted whole."""
    if not 0 <= orders <= MAX_GENERATED_ORDERS:
        raise ValueError(f"orders must be 0..{MAX_GENERATED_ORDERS}, got {orders}")
    if first_order_id < 0 or buyers < 1 or sellers < 1 or start_ms < 0 or spread_ms < 1:
        raise ValueError(
            "first_order_id and start_ms must be >= 0, buyers, sellers and spread_ms >= 1"
        )
    rng = random.Random(seed)
    lives: list[ChangeEvent] = []
    for order_id in range(first_order_id, first_order_id + orders):
        buyer, seller = rng.randint(1, buyers), rng.randint(1, sellers)
        items: dict[int, Row] = {}
        for line in range(1, rng.randint(1, MAX_ITEMS_PER_ORDER) + 1):
            items[line] = {
                "order_id": order_id,
                "line_no": line,
                "buyer_id": buyer,
                "seller_id": seller,
                "sku": f"sku-{rng.randint(1, 9999):04d}",
                "qty": rng.randint(1, 5),
                "price_cents": rng.randint(100, 50_000),
                "updated_ms": 0,
            }
        head: Row = {
            "order_id": order_id,
            "buyer_id": buyer,
            "seller_id": seller,
            "status": STATUSES[0],
            "amount_cents": sum(int(i["qty"]) * int(i["price_cents"]) for i in items.values()),
            "updated_ms": 0,
        }
        life = _Order(rng, head, items, start_ms + rng.randrange(spread_ms))
        _live(rng, life)
        lives.extend(life.events)
    # Stable sort: equal times keep generation order, and an order's times increase.
    lives.sort(key=lambda e: (e.ts, e.order_id))
    return lives


# ------------------------------------------------------------------ producing


def produce_changes(
    bootstrap: str,
    topic: str,
    events: Sequence[ChangeEvent],
    *,
    chunk_events: int = PRODUCE_CHUNK_EVENTS,
    **producer_options: Any,
) -> int:
    """Send `events` to `topic`, keyed by `str(order_id)`; returns how many were sent.

    Works through `chunk_events` events at a time: within a chunk, the events of one order
    go as one batch (`send_batch` sends a batch to its first key's queue), so they stay
    in order whatever order the batches reach the broker in; the next chunk starts once
    every batch of the previous one is acknowledged. Not transactional: after a failure,
    part of the events may have been sent. `producer_options` go to `Producer`."""
    if not 1 <= chunk_events <= PRODUCE_CHUNK_EVENTS:
        raise ValueError(f"chunk_events must be 1..{PRODUCE_CHUNK_EVENTS}, got {chunk_events}")
    sent = 0
    with Producer(bootstrap, **producer_options) as producer:
        for start in range(0, len(events), chunk_events):
            per_order: dict[int, list[ChangeEvent]] = {}
            for event in events[start : start + chunk_events]:
                per_order.setdefault(event.order_id, []).append(event)
            futures = [
                producer.send_batch_async(
                    topic, [e.to_json() for e in group], keys=[group[0].key] * len(group)
                )
                for group in per_order.values()
            ]
            for future in futures:
                sent += len(future.result())
    return sent
