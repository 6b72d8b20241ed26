"""Durability against a real process crash: SIGKILL a writer, recover, check every ack.

Each cycle hands its spec to a fresh `store_writer.py` process (spawned during the cycle
before, so that its interpreter start-up overlaps), on the same data directory. It
recovers the store (left by the previous kill), appends batches of 1-50 messages to two
topics and five queues with small segments and index files (so both roll), checkpoints
now and then, and prints an ack line per batch: in sync mode only after `flush()` covered
it, in async mode once `append` returned. The parent kills it with SIGKILL after a random
0.05-0.5 s, then opens the store in-process and checks that

* every acknowledged batch is there with the same offsets and the same payload bytes;
* every batch recovered in an earlier cycle is still there, unchanged;
* each queue is dense (each batch starts where the one before ended), from offset 0;
* no record is torn (header CRC, payload CRC, size, offsets) and every message of a new
  batch holds exactly the value the writer derives from its offset;
* an append after recovery gets the queue's next offset;
* (in the next child) an idempotent retry of the last stamped batch is a duplicate.

kill -9 keeps the page cache, so async mode must lose nothing acknowledged either.

Most cycles check a copy of the crashed directory, so that the next child itself recovers
from the kill; every fourth cycle opens the real directory instead (recovery in this
process) and keeps its probe batches. Checks re-read each queue from the newest batch seen
before (this cycle's acks all lie past it), except every eighth cycle and a last check
after the final one, which re-read everything. Reproduce a failure with
TIDEMQ_KILL9_SEED=<seed>.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest

from tidemq.core.batch import decode_columns, encode_values
from tidemq.core.record import parse_header, verify_payload
from tidemq.store.checkpoint import read_checkpoint
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.files import OsFileSystem
from tidemq.store.message_store import MessageStore, ReadStatus

WRITER = Path(__file__).with_name("store_writer.py")
TOPICS = (("alpha", 3), ("beta", 2))
CYCLES = 22
#: Per variant: no cycle starts past this many seconds; fewer than MIN_CYCLES fails.
TIME_BUDGET_S = 36.0
MIN_CYCLES = 20
KILL_DELAY_S = (0.05, 0.5)
#: Bounds on waiting for a child: startup, and draining its pipe after the kill.
START_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 10.0
READ_MAX_BYTES = 1 << 20

Key = tuple[str, int]


def value_for(topic: str, queue: int, offset: int, tag: str) -> bytes:
    """Same as `store_writer.value_for` (the writer runs as a script, not imported)."""
    return f"{topic}:{queue}:{offset}:{tag}:".encode() + b"x" * (offset * 37 % 90)


@dataclass(frozen=True, slots=True)
class Batch:
    base_offset: int
    count: int
    sha: str  # sha256 of the batch payload


@dataclass(frozen=True, slots=True)
class Stamped:
    """The newest recovered batch carrying a producer stamp, for the retry check."""

    topic: str
    queue: int
    base_offset: int
    producer_id: int
    epoch: int
    sequence: int
    payload: bytes


@dataclass(slots=True)
class Verified:
    batches: dict[Key, list[Batch]]
    stamped: Stamped | None
    new_batches: int


def _config(data_dir: Path, mode: FlushMode) -> dict[str, Any]:
    # Async: a checkpoint flushes the log too, so both intervals are long enough that a
    # kill usually finds acknowledged batches that were never fdatasynced.
    sync = mode is FlushMode.SYNC
    return {
        "data_dir": str(data_dir),
        "flush_mode": mode.value,
        "segment_size_bytes": 256 << 10,
        "index_entries_per_file": 64,
        "checkpoint_interval_ms": 25 if sync else 150,
        "flush_interval_ms": 300,
        "topics": [list(t) for t in TOPICS],
    }


def _store_config(spec: dict[str, Any], data_dir: Path) -> StoreConfig:
    return StoreConfig(
        data_dir=data_dir,
        flush_mode=FlushMode(spec["flush_mode"]),
        segment_size_bytes=spec["segment_size_bytes"],
        index_entries_per_file=spec["index_entries_per_file"],
        checkpoint_interval_ms=spec["checkpoint_interval_ms"],
        flush_interval_ms=spec["flush_interval_ms"],
    )


# --------------------------------------------------------------------------- the child


@dataclass(slots=True)
class ChildRun:
    acks: dict[Key, list[Batch]]
    ack_ends: list[int]  # log end position of each acked batch
    ready: bool
    returncode: int
    stderr: str


def _lines(buf: bytearray) -> Iterator[str]:
    while (nl := buf.find(b"\n")) >= 0:
        line = buf[:nl].decode()
        del buf[: nl + 1]
        yield line


def _spawn_writer(err_path: Path) -> subprocess.Popen[bytes]:
    """Start a writer process. It imports tidemq, then waits for its spec on stdin, so the
    next cycle's interpreter start-up overlaps this cycle's run and checks."""
    with err_path.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, str(WRITER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )


def _dismiss(proc: subprocess.Popen[bytes]) -> None:
    """End a spare writer that never got a spec (EOF on stdin: it exits by itself)."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        proc.stdin.close()
        proc.wait(timeout=DRAIN_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    finally:
        proc.stdout.close()


def _run_child(
    proc: subprocess.Popen[bytes], spec: dict[str, Any], rng: random.Random, err_path: Path
) -> ChildRun:
    """Hand a spawned writer its spec, SIGKILL it a random delay after it is ready, and
    collect its acks."""
    acks: dict[Key, list[Batch]] = {}
    ack_ends: list[int] = []
    ready = False
    buf = bytearray()
    delay = rng.uniform(*KILL_DELAY_S)
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(spec).encode() + b"\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it died starting up: its exit status and stderr tell why
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    killed = False
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        eof = False
        while not eof:
            now = time.monotonic()
            if not killed and now >= deadline:
                proc.send_signal(signal.SIGKILL)
                killed = True
                deadline = now + DRAIN_TIMEOUT_S
            elif killed and now >= deadline:
                raise AssertionError("the killed writer's stdout did not reach EOF")
            if sel.select(timeout=max(0.0, deadline - now)):
                chunk = os.read(fd, 1 << 16)
                eof = not chunk
                buf += chunk
            for line in _lines(buf):
                if line == "R":
                    ready = True
                    if not killed:
                        deadline = time.monotonic() + delay
                elif line.startswith("A "):
                    _, topic, queue, base, count, sha, end = line.split()
                    key = (topic, int(queue))
                    acks.setdefault(key, []).append(Batch(int(base), int(count), sha))
                    ack_ends.append(int(end))
                else:
                    raise AssertionError(f"unexpected line from the writer: {line!r}")
        # A partial last line (killed mid-write) is an ack never sent: ignored.
        returncode = proc.wait(timeout=DRAIN_TIMEOUT_S)
    finally:
        sel.close()
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return ChildRun(acks, ack_ends, ready, returncode, err_path.read_text(errors="replace"))


# --------------------------------------------------------------------------- checking


def _read_queue(
    store: MessageStore, topic: str, queue: int, start: int
) -> Iterator[tuple[int, int, bytes]]:
    """(base offset, count, record) of every batch of a queue from offset `start`."""
    lo, hi = store.queue_bounds(topic, queue)
    assert lo == 0, f"{topic}/{queue} starts at {lo}: nothing may be trimmed"
    assert start <= hi, f"{topic}/{queue} ends at {hi}, before offset {start} seen earlier"
    offset = start
    while offset < hi:
        res = store.read(topic, queue, offset, max_bytes=READ_MAX_BYTES)
        assert res.status is ReadStatus.FOUND, f"{topic}/{queue}@{offset}: {res.status}"
        assert res.next_offset > offset
        for b in res.batches:
            yield b.base_offset, b.count, b.record
        offset = res.next_offset
    assert offset == hi


def _check_values(payload: bytes, topic: str, queue: int, base: int, where: str) -> None:
    """Every message holds the value the writer derives from its offset (and its tag)."""
    values = decode_columns(payload).value
    data = bytes(values.data)
    tag = data.split(b":", 4)[3].decode()
    expected = [value_for(topic, queue, base + j, tag) for j in range(len(values.offsets) - 1)]
    assert values.validity is None, f"{where}: a null value"
    assert data == b"".join(expected), f"{where}: values differ from what the writer appended"
    assert values.offsets.tolist() == list(accumulate(map(len, expected), initial=0)), where


def _verify(
    store: MessageStore,
    known: dict[Key, list[Batch]],
    acks: dict[Key, list[Batch]],
    cycle: int,
    *,
    full: bool,
) -> Verified:
    """Check the recovered store against what earlier cycles saw and this cycle's acks.

    `full`: re-read every batch; otherwise start at the newest batch seen before (this
    cycle's acks all lie past it, since earlier cycles' batches are all in `known`).
    """
    out: dict[Key, list[Batch]] = {}
    stamped: Stamped | None = None
    new_batches = 0
    assert store.flushed_position == store.end_position, "recovery leaves nothing unflushed"
    topic_ids = {t.name: t.id for t in store.topics()}
    for topic, queues in TOPICS:
        for queue in range(queues):
            key = (topic, queue)
            before = known.get(key, [])
            skip = 0 if full else max(len(before) - 1, 0)
            got: list[Batch] = before[:skip]
            expected_offset = before[skip].base_offset if skip else 0
            for base, count, record in _read_queue(store, topic, queue, expected_offset):
                where = f"{topic}/{queue}@{base} (cycle {cycle})"
                assert base == expected_offset, (
                    f"{where}: gap or overlap, expected {expected_offset}"
                )
                header = parse_header(record)
                assert len(record) == header.size, f"{where}: record of {len(record)} bytes"
                assert (header.base_offset, header.count) == (base, count), where
                assert (header.topic_id, header.queue_id) == (topic_ids[topic], queue), where
                verify_payload(header, record)  # payload CRC and count: nothing torn
                payload = record[header.payload_start : header.size]
                batch = Batch(base, count, hashlib.sha256(payload).hexdigest())
                i = len(got)
                if i < len(before):
                    assert batch == before[i], f"{where}: a batch recovered earlier changed"
                else:
                    new_batches += 1
                    _check_values(payload, topic, queue, base, where)
                if header.producer_id >= 0:
                    stamped = Stamped(
                        topic, queue, base, header.producer_id, header.producer_epoch,
                        header.base_sequence, payload,
                    )  # fmt: skip
                got.append(batch)
                expected_offset = base + count
            assert len(got) >= len(before), f"{topic}/{queue}: batches recovered earlier lost"
            by_base = {b.base_offset: b for b in got}
            for ack in acks.get(key, []):
                assert by_base.get(ack.base_offset) == ack, (
                    f"{topic}/{queue}: acknowledged batch {ack} lost or changed (cycle {cycle}); "
                    f"recovered queue ends at {expected_offset}"
                )
            out[key] = got
    return Verified(out, stamped, new_batches)


def _probe(store: MessageStore, verified: Verified, cycle: int) -> None:
    """An append after recovery continues each queue at its next offset."""
    for (topic, queue), batches in verified.batches.items():
        nxt = batches[-1].base_offset + batches[-1].count if batches else 0
        assert store.queue_bounds(topic, queue)[1] == nxt
        payload = encode_values(
            [value_for(topic, queue, nxt + j, f"p{cycle}") for j in range(3)],
            timestamp_ms=time.time_ns() // 1_000_000,
        )
        res = store.append(topic, queue, payload)
        assert (res.base_offset, res.count) == (nxt, 3), f"{topic}/{queue}: probe got {res}"
        batches.append(Batch(nxt, 3, hashlib.sha256(payload).hexdigest()))
    assert store.flush() >= store.end_position


@contextmanager
def _opened(config: StoreConfig) -> Iterator[MessageStore]:
    store = MessageStore.open(config)
    try:
        yield store
    finally:
        store.close()


# --------------------------------------------------------------------------- the test


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [FlushMode.SYNC, FlushMode.ASYNC], ids=["sync", "async"])
def test_acked_batches_survive_kill9(tmp_path: Path, mode: FlushMode) -> None:
    env_seed = os.environ.get("TIDEMQ_KILL9_SEED")
    seed = int(env_seed) if env_seed else random.randrange(1 << 32)
    print(f"kill9 {mode.value}: seed {seed} (rerun with TIDEMQ_KILL9_SEED={seed})")
    try:
        _cycles(tmp_path, mode, seed)
    except Exception as exc:
        exc.add_note(f"kill9 {mode.value}: rerun with TIDEMQ_KILL9_SEED={seed}")
        raise


def _cycles(tmp_path: Path, mode: FlushMode, seed: int) -> None:
    rng = random.Random(seed)
    data = tmp_path / "store"
    spec = _config(data, mode)
    known: dict[Key, list[Batch]] = {}
    stamped: Stamped | None = None
    started = time.monotonic()
    total_acks = 0
    replayed_acks = 0  # acked past the checkpoint at the kill: recovery re-derived them
    cycle = 0
    spares = [_spawn_writer(tmp_path / "writer-0.err")]
    try:
        while cycle < CYCLES and time.monotonic() - started < TIME_BUDGET_S:
            spec["cycle"] = cycle
            spec["seed"] = seed
            spec["retry"] = None
            if stamped is not None:
                spec["retry"] = {
                    "topic": stamped.topic, "queue": stamped.queue,
                    "base_offset": stamped.base_offset, "producer_id": stamped.producer_id,
                    "epoch": stamped.epoch, "sequence": stamped.sequence,
                    "payload": stamped.payload.hex(),
                }  # fmt: skip
            proc = spares.pop()
            spares.append(_spawn_writer(tmp_path / f"writer-{cycle + 1}.err"))
            child = _run_child(proc, spec, rng, tmp_path / f"writer-{cycle}.err")
            assert child.returncode == -signal.SIGKILL, (
                f"cycle {cycle}: writer exited with {child.returncode}, not by SIGKILL:\n"
                f"{child.stderr}"
            )
            assert child.ready, f"cycle {cycle}: writer never became ready:\n{child.stderr}"
            total_acks += sum(len(v) for v in child.acks.values())
            cp = read_checkpoint(OsFileSystem(), data)
            replayed_acks += sum(end > (cp.indexed_position if cp else 0) for end in child.ack_ends)

            in_place = cycle % 4 == 3
            target = data if in_place else tmp_path / "copy"
            if not in_place:
                _snapshot(data, target)
            with _opened(_store_config(spec, target)) as store:
                full = cycle % 8 == 7
                verified = _verify(store, known, child.acks, cycle, full=full)
                stamped = verified.stamped or stamped
                _probe(store, verified, cycle)
            # The probe stays only when it went to the real directory.
            known = verified.batches if in_place else _without_probe(verified.batches)
            cycle += 1
    finally:
        for spare in spares:
            _dismiss(spare)
    # Last, everything from the start: every batch ever recovered (so every ack) is there.
    with _opened(_store_config(spec, data)) as store:
        final = _verify(store, known, {}, cycle, full=True)
    assert final.batches == known
    assert cycle >= MIN_CYCLES, f"only {cycle} cycles in {TIME_BUDGET_S} s: machine too slow?"
    assert replayed_acks > 0, f"no kill left an ack past a checkpoint ({total_acks} acks)"
    assert stamped is not None, "no stamped batch was ever recovered"
    for d in (data, tmp_path / "copy"):  # passed: tens of MB nobody will look at
        shutil.rmtree(d, ignore_errors=True)


def _snapshot(data: Path, target: Path) -> None:
    """Copy a (dead) store directory."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(data, target)


def _without_probe(batches: dict[Key, list[Batch]]) -> dict[Key, list[Batch]]:
    return {key: b[:-1] for key, b in batches.items()}
