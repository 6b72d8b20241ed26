"""db-sync without a JVM: the change-event generator and format, the reference state, and
the apply step on real SQLite files (and on PostgreSQL when one can be started here)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import socket
import sqlite3
import subprocess
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tidemq.spark.pipelines.changes import (
    MAX_EVENT_BYTES,
    STATUSES,
    TABLES,
    ChangeEvent,
    Op,
    Row,
    State,
    expected_state,
    generate_changes,
    parse_change,
)
from tidemq.spark.pipelines.db_sync import (
    ApplyError,
    ApplyResult,
    SourceRecord,
    apply_records,
    close_engines,
    describe_target,
    prepare_targets,
    shard_urls,
)

QUEUES = 4


def _records(events: Sequence[ChangeEvent], topic: str = "changes") -> list[SourceRecord]:
    """The events as a topic of QUEUES queues holds them: an order's events in one queue,
    in order (the test's own key -> queue rule), offsets from 0 per queue."""
    next_offset: Counter[int] = Counter()
    out = []
    for e in events:
        q = e.order_id % QUEUES
        out.append(SourceRecord(topic, q, next_offset[q], e.to_json()))
        next_offset[q] += 1
    return out


def _per_queue(records: Sequence[SourceRecord]) -> dict[int, list[SourceRecord]]:
    out: dict[int, list[SourceRecord]] = defaultdict(list)
    for r in records:
        out[r.queue].append(r)
    return out


def _read_sqlite(path: Path) -> dict[str, dict[tuple[Any, ...], Row]]:
    """A shard's target tables, read with the standard library (not with the code under
    test), keyed like expected_state."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        out: dict[str, dict[tuple[Any, ...], Row]] = {}
        for name, spec in TABLES.items():
            rows = [dict(r) for r in conn.execute(f"SELECT * FROM {name}")]
            out[name] = {tuple(r[c] for c in spec.pk): r for r in rows}
        return out
    finally:
        conn.close()


def _applied_sqlite(path: Path) -> dict[tuple[str, int], int]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT topic, queue, next_offset FROM tidemq_applied").fetchall()
        return {(t, q): n for t, q, n in rows}
    finally:
        conn.close()


def _state(root: Path, shards: int) -> State:
    return {s: _read_sqlite(root / f"shard_{s}.db") for s in range(shards)}


def _target(root: Path) -> str:
    return f"sqlite:///{root}/shard_{{shard}}.db"


def _event(op: Op, order_id: int, seller: int, status: str = "created", ts: int = 1) -> bytes:
    row: Row = {
        "order_id": order_id,
        "buyer_id": 7,
        "seller_id": seller,
        "status": status,
        "amount_cents": 100,
        "updated_ms": ts,
    }
    pk = {"order_id": order_id}
    return ChangeEvent(op, "orders", pk, order_id, row, ts).to_json()


# ------------------------------------------------------------------ the generator


def test_generator_is_deterministic_per_seed() -> None:
    a = generate_changes(50, seed=7)
    assert a == generate_changes(50, seed=7)
    assert a != generate_changes(50, seed=8)
    assert [e.ts for e in a] == sorted(e.ts for e in a)
    assert {e.order_id for e in a} == set(range(1, 51))
    later = generate_changes(10, seed=7, first_order_id=1000)
    assert {e.order_id for e in later} == set(range(1000, 1010))
    assert generate_changes(0, seed=1) == []
    with pytest.raises(ValueError, match="orders must be"):
        generate_changes(-1, seed=1)


def test_generated_life_cycles_are_consistent() -> None:
    events = generate_changes(400, seed=3)
    ops = Counter((e.op, e.table) for e in events)
    for op in ("insert", "update", "delete"):
        for table in TABLES:
            assert ops[(op, table)] > 0, (op, table)
    rows: dict[tuple[str, tuple[Any, ...]], Row] = {}
    last_ts: dict[int, int] = {}
    parties: dict[int, tuple[int, int]] = {}
    closed: set[int] = set()
    for e in events:
        assert parse_change(e.to_json()) == e  # the JSON round-trips
        assert e.key == str(e.order_id).encode()
        assert e.ts > last_ts.get(e.order_id, 0)  # an order's events in order
        last_ts[e.order_id] = e.ts
        assert e.order_id not in closed  # nothing after an order's delete
        # buyer and seller never change within an order
        who = (int(e.row["buyer_id"]), int(e.row["seller_id"]))
        assert parties.setdefault(e.order_id, who) == who
        key = (e.table, e.pk_values)
        if e.op == "insert":
            assert key not in rows
            assert e.table == "order_items" or e.row["status"] == "created"
            rows[key] = e.row
        elif e.op == "update":
            assert key in rows
            assert e.row["updated_ms"] == e.ts
            rows[key] = e.row
        else:
            assert rows.pop(key) == e.row  # the before image is the last image
            if e.table == "orders":
                closed.add(e.order_id)
                assert not [k for k in rows if k[0] == "order_items" and k[1][0] == e.order_id]
        if e.table == "orders" and e.op == "update":
            lines = [r for k, r in rows.items() if k[0] == "order_items" and k[1][0] == e.order_id]
            assert e.row["amount_cents"] == sum(
                int(r["qty"]) * int(r["price_cents"]) for r in lines
            )
            assert e.row["status"] in STATUSES


# ------------------------------------------------------------------ the format


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "tombstone"),
        (b"\xff", "not UTF-8 JSON"),
        (b"{", "not UTF-8 JSON"),
        (b"[1]", "must be a JSON object"),
        (b'{"op": "insert"}', "missing ['table', 'pk', 'order_id', 'row', 'ts']"),
        (b" " * (MAX_EVENT_BYTES + 1), "over the 65536 limit"),
    ],
)
def test_parse_change_refuses_what_is_not_an_event(value: bytes | None, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_change(value)


def _doc(**changes: Any) -> dict[str, Any]:
    row = {
        "order_id": 5,
        "line_no": 1,
        "buyer_id": 2,
        "seller_id": 3,
        "sku": "sku-1",
        "qty": 1,
        "price_cents": 10,
        "updated_ms": 9,
    }
    doc: dict[str, Any] = {
        "op": "update",
        "table": "order_items",
        "pk": {"order_id": 5, "line_no": 1},
        "order_id": 5,
        "row": row,
        "ts": 9,
    }
    for k, v in changes.items():
        if k.startswith("row_"):
            if v is None:
                del row[k[4:]]
            else:
                row[k[4:]] = v
        else:
            doc[k] = v
    return doc


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"op": "upsert"}, "'op' must be one of insert, update, delete, got 'upsert'"),
        ({"table": "users"}, "unknown table 'users' (known: orders, order_items)"),
        ({"extra": 1}, "unknown ['extra']"),
        ({"order_id": "5"}, "'order_id' must be an integer"),
        ({"order_id": 6}, "'order_id' is 6 but the row's order_id is 5"),
        ({"ts": -1}, "'ts' must be ms since the epoch"),
        ({"pk": {"order_id": 5}}, "'pk' of table 'order_items' must be an object of"),
        ({"pk": {"order_id": 5, "line_no": 2}}, "pk line_no=2 but the row has 1"),
        ({"row": [1]}, "'row' must be an object"),
        ({"row_qty": None}, "missing ['qty']"),
        ({"row_color": "red"}, "unknown ['color']"),
        ({"row_qty": "1"}, "row column 'qty' must be an integer, got '1'"),
        ({"row_qty": True}, "row column 'qty' must be an integer, got True"),
        ({"row_sku": "x" * 65}, "row column 'sku' must be a text of at most 64"),
    ],
)
def test_parse_change_names_what_is_wrong(changes: dict[str, Any], message: str) -> None:
    assert parse_change(json.dumps(_doc()).encode()).pk_values == (5, 1)
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_change(json.dumps(_doc(**changes)).encode())


# ------------------------------------------------------------------ the reference


def test_expected_state_applies_in_order_and_shards_by_seller() -> None:
    events = [
        parse_change(_event("insert", 1, seller=4)),
        parse_change(_event("insert", 2, seller=5)),
        parse_change(_event("update", 1, seller=4, status="paid", ts=2)),
        parse_change(_event("delete", 2, seller=5, ts=3)),
        parse_change(_event("delete", 3, seller=5, ts=4)),  # a missing row stays missing
        parse_change(_event("update", 9, seller=6, status="paid", ts=5)),  # upsert
    ]
    state = expected_state(events, 2)
    assert set(state) == {0, 1}
    assert state[1]["order_items"] == {}
    assert {k: r["status"] for k, r in state[0]["orders"].items()} == {(1,): "paid", (9,): "paid"}
    assert state[1]["orders"] == {}
    by_buyer = expected_state(events, 2, shard_column="buyer_id")  # buyer 7: shard 1
    assert set(by_buyer[1]["orders"]) == {(1,), (9,)}
    with pytest.raises(ValueError, match="cannot shard by 'status'"):
        expected_state(events, 2, shard_column="status")
    with pytest.raises(ValueError, match="shards must be"):
        expected_state(events, 0)


# ------------------------------------------------------------------ targets


def test_shard_urls_and_target_errors(tmp_path: Path) -> None:
    assert shard_urls("sqlite:////d/s_{shard}.db", 2) == [
        "sqlite:////d/s_0.db",
        "sqlite:////d/s_1.db",
    ]
    assert shard_urls("sqlite:////d/one.db", 1) == ["sqlite:////d/one.db"]
    with pytest.raises(ValueError, match=r"no \{shard\} placeholder"):
        shard_urls("sqlite:////d/one.db", 2)
    with pytest.raises(ValueError, match="shards must be"):
        shard_urls("sqlite:////d/s_{shard}.db", 0)
    with pytest.raises(ValueError, match="bad target URL"):
        shard_urls("not a url {shard}", 2)
    shown = describe_target("postgresql://u:secret@h/db_{shard}")
    assert shown == "postgresql://u:***@h/db_{shard}"
    # The driver creates every shard's tables (and the SQLite file's directory).
    urls = prepare_targets(f"sqlite:///{tmp_path}/new/dir/s_{{shard}}.db", 2)
    assert len(urls) == 2
    for s in range(2):
        engine = sa.create_engine(urls[s])
        try:
            tables = sa.inspect(engine).get_table_names()
        finally:
            engine.dispose()
        assert sorted(tables) == ["order_items", "orders", "tidemq_applied"]


# ------------------------------------------------------------------ applying


def test_apply_matches_the_reference_and_a_replay_changes_nothing(tmp_path: Path) -> None:
    events = generate_changes(200, seed=11)
    records = _records(events)
    target = _target(tmp_path)
    applied = ApplyResult()
    for chunk in _per_queue(records).values():  # one task per queue, as Spark runs it
        done = apply_records(chunk, target=target, shards=3)
        applied.applied += done.applied
        applied.skipped += done.skipped
    assert (applied.applied, applied.skipped) == (len(records), 0)
    assert _state(tmp_path, 3) == expected_state(events, 3)
    ends = {("changes", q): len(rs) for q, rs in _per_queue(records).items()}
    for s in range(3):  # every shard knows every queue's position
        assert _applied_sqlite(tmp_path / f"shard_{s}.db") == ends

    # The same records again, as one task: all skipped, nothing changed.
    again = apply_records(records, target=target, shards=3)
    assert (again.applied, again.skipped) == (0, len(records))
    assert _state(tmp_path, 3) == expected_state(events, 3)
    for s in range(3):
        assert _applied_sqlite(tmp_path / f"shard_{s}.db") == ends


def test_partial_replay_applies_only_the_new_part(tmp_path: Path) -> None:
    events = generate_changes(60, seed=5)
    queue = [r for r in _records(events) if r.queue == 1]
    mine = [e for e in events if e.order_id % QUEUES == 1]
    target = _target(tmp_path)
    first = apply_records(queue[:30], target=target, shards=2)
    assert first.applied == 30
    assert _state(tmp_path, 2) == expected_state(mine[:30], 2)
    # A retried task that read further: 10 already there, 20 new.
    second = apply_records(queue[20:50], target=target, shards=2)
    assert (second.applied, second.skipped) == (20, 10)
    assert _state(tmp_path, 2) == expected_state(mine[:50], 2)
    assert _applied_sqlite(tmp_path / "shard_0.db") == {("changes", 1): 50}


def test_events_of_a_row_apply_in_offset_order(tmp_path: Path) -> None:
    target = _target(tmp_path)
    values = [
        _event("insert", 1, seller=2, ts=1),
        _event("update", 1, seller=2, status="paid", ts=2),
        _event("delete", 1, seller=2, ts=3),
        _event("insert", 2, seller=2, ts=4),
        _event("delete", 2, seller=2, ts=5),
        _event("insert", 2, seller=2, status="paid", ts=6),  # back again
        _event("delete", 3, seller=2, ts=7),  # never there: nothing to do
    ]
    records = [SourceRecord("t", 0, i, v) for i, v in enumerate(values)]
    result = apply_records(records, target=target, shards=1)
    assert result.applied == 7
    orders = _read_sqlite(tmp_path / "shard_0.db")["orders"]
    assert list(orders) == [(2,)]
    assert orders[(2,)]["status"] == "paid"
    assert orders[(2,)]["updated_ms"] == 6
    # Offsets out of order are a caller's bug, refused before anything is written.
    with pytest.raises(ValueError, match="out of offset order: 3 after 5"):
        apply_records(
            [SourceRecord("u", 0, 5, values[0]), SourceRecord("u", 0, 3, values[1])],
            target=target,
            shards=1,
        )


def test_two_shards_get_their_own_rows(tmp_path: Path) -> None:
    target = _target(tmp_path)
    values = [_event("insert", 1, seller=10), _event("insert", 2, seller=11)]
    apply_records([SourceRecord("t", 0, 0, values[0])], target=target, shards=2)
    # shard 1 has no event yet, but knows how far the queue was read
    assert _read_sqlite(tmp_path / "shard_1.db")["orders"] == {}
    assert _applied_sqlite(tmp_path / "shard_1.db") == {("t", 0): 1}
    apply_records([SourceRecord("t", 0, 1, values[1])], target=target, shards=2)
    assert list(_read_sqlite(tmp_path / "shard_0.db")["orders"]) == [(1,)]
    assert list(_read_sqlite(tmp_path / "shard_1.db")["orders"]) == [(2,)]
    assert _applied_sqlite(tmp_path / "shard_0.db") == {("t", 0): 2}
    # By buyer instead (7 % 2 = 1): both rows in shard 1 of another target.
    other = tmp_path / "by-buyer"
    records = [SourceRecord("t", 0, i, v) for i, v in enumerate(values)]
    apply_records(records, target=_target(other), shards=2, shard_column="buyer_id")
    assert list(_read_sqlite(other / "shard_1.db")["orders"]) == [(1,), (2,)]


def test_a_bad_event_fails_naming_where_it_is_and_applies_nothing(tmp_path: Path) -> None:
    target = _target(tmp_path)
    records = [
        SourceRecord("t", 3, 40, _event("insert", 1, seller=2)),
        SourceRecord("t", 3, 41, b'{"op": "merge"}'),
    ]
    with pytest.raises(ApplyError) as info:
        apply_records(records, target=target, shards=1)
    message = str(info.value)
    assert "topic 't' queue 3 offset 41" in message
    assert "missing ['table'" in message
    assert not (tmp_path / "shard_0.db").exists()  # parsed before any database is touched


def test_a_gap_in_a_queue_fails(tmp_path: Path) -> None:
    target = _target(tmp_path)
    apply_records([SourceRecord("t", 0, 0, _event("insert", 1, seller=1))], target=target, shards=1)
    with pytest.raises(ApplyError, match=r"has applied up to offset 1, but this batch starts at 5"):
        apply_records(
            [SourceRecord("t", 0, 5, _event("insert", 2, seller=1))], target=target, shards=1
        )
    assert list(_read_sqlite(tmp_path / "shard_0.db")["orders"]) == [(1,)]


def test_a_row_the_database_refuses_fails_naming_the_event(tmp_path: Path) -> None:
    target = _target(tmp_path)
    prepare_targets(target, 1)
    conn = sqlite3.connect(tmp_path / "shard_0.db")
    conn.execute(
        "CREATE TRIGGER no_big BEFORE INSERT ON orders WHEN NEW.amount_cents > 50 "
        "BEGIN SELECT RAISE(ABORT, 'too big'); END"
    )
    conn.commit()
    conn.close()
    with pytest.raises(ApplyError) as info:
        apply_records(
            [SourceRecord("t", 2, 8, _event("insert", 1, seller=1))], target=target, shards=1
        )
    assert "topic 't' queue 2 offset 8: the insert of orders {'order_id': 1} failed" in str(
        info.value
    )
    assert "too big" in str(info.value)
    assert _applied_sqlite(tmp_path / "shard_0.db") == {}  # rolled back with the rows


# ------------------------------------------------------------------ PostgreSQL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pg_bin(name: str) -> str | None:
    """A PostgreSQL server program: on PATH, or where Debian installs it (not on PATH)."""
    found = shutil.which(name)
    if found is not None:
        return found
    versions = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    return str(versions[-1]) if versions else None


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL server on 127.0.0.1 with databases shard_0 and shard_1; its
    URL template. Skipped where PostgreSQL's binaries or psycopg are missing."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL (initdb, pg_ctl) is not installed")
    psycopg = pytest.importorskip("psycopg")
    run_as: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="tidemq-pg-"))
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user")
        run_as = ["runuser", "-u", "postgres", "--"]
        os.chown(base, user.pw_uid, user.pw_gid)
    data, port = base / "data", _free_port()
    env = {**os.environ, "LC_ALL": "C"}
    try:
        subprocess.run(
            [*run_as, initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
             "--locale=C", "--no-sync"],
            check=True, capture_output=True, env=env, timeout=120,
        )  # fmt: skip
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            [*run_as, pg_ctl, "-D", str(data), "-o", options, "-l", str(base / "log"), "-w",
             "start"],
            check=True, capture_output=True, env=env, timeout=120,
        )  # fmt: skip
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True
        ) as conn:
            for s in range(2):
                conn.execute(f"CREATE DATABASE shard_{s}")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/shard_{{shard}}"
    finally:
        close_engines()
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [*run_as, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"],
                check=False, capture_output=True, timeout=120,
            )  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)


def _read_postgres(url: str) -> dict[str, dict[tuple[Any, ...], Row]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            out: dict[str, dict[tuple[Any, ...], Row]] = {}
            for name, spec in TABLES.items():
                rows = [dict(r._mapping) for r in conn.execute(sa.text(f"SELECT * FROM {name}"))]
                out[name] = {tuple(r[c] for c in spec.pk): r for r in rows}
            return out
    finally:
        engine.dispose()


def test_apply_on_postgresql(postgres: str) -> None:
    events = generate_changes(80, seed=2)
    records = _records(events, topic="pg")
    for chunk in _per_queue(records).values():
        apply_records(chunk, target=postgres, shards=2)
    urls = shard_urls(postgres, 2)
    expected = expected_state(events, 2)
    assert {s: _read_postgres(urls[s]) for s in range(2)} == expected
    again = apply_records(records, target=postgres, shards=2)
    assert (again.applied, again.skipped) == (0, len(records))
    assert {s: _read_postgres(urls[s]) for s in range(2)} == expected
