"""Child process of `test_store_kill9.py`: appends to a store until it is killed.

Run as ``python store_writer.py`` with one JSON line on stdin (EOF instead: exit at once).
The spec (built by `_config` and `_cycles` in the test) names the data directory, the
flush mode, the store settings, the topics, the cycle number, the seed, and optionally one
batch to re-send as an idempotent retry.

Protocol on stdout, one line per event, each written with one `os.write` (no Python
buffering, so a line the parent reads was really written before the kill):

``R``                                    the store is open, topics exist, the retry (if any)
                                         came back as a duplicate at its original offset
``A topic queue base count sha256 end``  an acknowledged batch (`end`: its end position in
                                         the log): in sync mode written only after `flush()`
                                         returned a position at or past `end`; in async mode
                                         once `append` returned

Every message value is `value_for(topic, queue, offset, tag)`, so the parent can check the
bytes of any recovered batch, acknowledged or not. Any surprise exits with status 3 and a
message on stderr; the parent expects death by SIGKILL and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from tidemq.core.batch import encode_values
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.message_store import MessageStore
from tidemq.store.producer_state import ProducerStamp

#: Topic whose batches carry a producer stamp (idempotent appends).
STAMPED_TOPIC = "beta"
#: Safety bound: a writer the parent forgot to kill stops by itself.
MAX_SECONDS = 30.0
MAX_BATCHES = 2_000_000


def value_for(topic: str, queue: int, offset: int, tag: str) -> bytes:
    """The value of the message at `offset`: self-describing, 0-89 filler bytes."""
    return f"{topic}:{queue}:{offset}:{tag}:".encode() + b"x" * (offset * 37 % 90)


def store_config(spec: dict[str, Any]) -> StoreConfig:
    return StoreConfig(
        data_dir=Path(spec["data_dir"]),
        flush_mode=FlushMode(spec["flush_mode"]),
        segment_size_bytes=int(spec["segment_size_bytes"]),
        index_entries_per_file=int(spec["index_entries_per_file"]),
        checkpoint_interval_ms=int(spec["checkpoint_interval_ms"]),
        flush_interval_ms=int(spec["flush_interval_ms"]),
    )


def _say(line: str) -> None:
    data = line.encode()
    while data:  # a pipe write of a few KiB is whole; loop for the rare large group
        data = data[os.write(1, data) :]


def _die(message: str) -> None:
    sys.stderr.write(f"store_writer: {message}\n")
    sys.stderr.flush()
    os._exit(3)


def _retry(store: MessageStore, retry: dict[str, Any]) -> None:
    """Re-send a batch stored before the crash; it must be recognised as a duplicate."""
    stamp = ProducerStamp(int(retry["producer_id"]), int(retry["epoch"]), int(retry["sequence"]))
    res = store.append(
        retry["topic"], int(retry["queue"]), bytes.fromhex(retry["payload"]), producer=stamp
    )
    if not res.duplicate or res.base_offset != int(retry["base_offset"]):
        _die(f"retry of {retry['topic']}/{retry['queue']}@{retry['base_offset']} gave {res}")


def run(spec: dict[str, Any]) -> None:
    cycle = int(spec["cycle"])
    rng = random.Random(f"{spec['seed']}:{cycle}")
    sync = spec["flush_mode"] == FlushMode.SYNC.value
    topics: list[tuple[str, int]] = [(str(t), int(n)) for t, n in spec["topics"]]
    store = MessageStore.open(store_config(spec))
    existing = {t.name for t in store.topics()}
    for name, queues in topics:
        if name not in existing:
            store.create_topic(name, queues)
    if spec.get("retry"):
        _retry(store, spec["retry"])
    producer_id = store.allocate_producer_id()
    sequences: dict[int, int] = {}
    next_offset = {(t, q): store.queue_bounds(t, q)[1] for t, n in topics for q in range(n)}
    _say("R\n")

    tag = f"c{cycle}"
    deadline = time.monotonic() + MAX_SECONDS
    appended = 0
    while appended < MAX_BATCHES and time.monotonic() < deadline:
        acks: list[str] = []
        group_end = 0
        for _ in range(rng.randint(1, 8)):
            topic, queues = rng.choice(topics)
            queue = rng.randrange(queues)
            count = rng.randint(1, 50)
            base = next_offset[(topic, queue)]
            payload = encode_values(
                [value_for(topic, queue, base + i, tag) for i in range(count)],
                timestamp_ms=time.time_ns() // 1_000_000,
            )
            stamp = None
            if topic == STAMPED_TOPIC:
                stamp = ProducerStamp(producer_id, 0, sequences.get(queue, 0))
                sequences[queue] = stamp.base_sequence + count
            res = store.append(topic, queue, payload, producer=stamp)
            if res.duplicate or res.base_offset != base or res.count != count:
                _die(f"append to {topic}/{queue} expected offset {base}, got {res}")
            next_offset[(topic, queue)] = base + count
            appended += 1
            group_end = max(group_end, res.end_position)
            sha = hashlib.sha256(payload).hexdigest()
            ack = f"A {topic} {queue} {base} {count} {sha} {res.end_position}\n"
            if sync:
                acks.append(ack)
            else:
                _say(ack)  # async: acknowledged once append returned
        if sync:
            flushed = store.flush()
            if flushed < group_end:
                _die(f"flush() returned {flushed}, before the group's end {group_end}")
            _say("".join(acks))
        store.tick()
        if rng.random() < 0.02:
            store.checkpoint()
    store.close()
    _die(f"not killed after {appended} batches")


if __name__ == "__main__":
    # The spec comes on stdin once the parent wants this writer to start: the parent
    # spawns the next writer early, so that its imports overlap the current cycle.
    line = sys.stdin.readline()
    if line.strip():  # EOF: a spare writer that was not needed
        run(json.loads(line))
