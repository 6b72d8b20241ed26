"""kill -9 of a real `tidemq server` with pending timers and open transactions.

Each cycle starts the server on the same data directory, schedules delayed messages
(due within two seconds) and runs transactions that it commits, rolls back, or leaves
undecided, then kills the server with SIGKILL at a random moment and restarts it. At the
end a producer with a checker answers for the undecided transactions, and the test checks:

* every acknowledged delayed message is delivered, once, and never before its due time
  (the store time of the delivered record is at or after the due time it carries);
* a cancelled one is never delivered;
* every transaction whose commit was acknowledged is visible, whole, once; one whose
  rollback was acknowledged never is; an undecided one ends as its checker says.

The seed is printed; TIDEMQ_KILL9_SEED replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from tests.integration.test_server_kill9 import _reap, _start_server

from tidemq import aio
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.core.batch import decode_messages
from tidemq.core.errors import TidemqError
from tidemq.core.message import iter_records
from tidemq.core.properties import decode_properties
from tidemq.core.record import HEADER, RecordFlags, parse_header
from tidemq.protocol.commands import FetchRequest, FetchResponse

TIMED, TXN = "timed", "txn"
QUEUES = 2
CYCLES = 8
TIME_LIMIT_S = 150
_NO_RETRY = ClientConfig(retries=0, request_timeout_ms=5000)
_SERVER_SETTINGS = (
    "--set", "broker.txn_check_delay_ms=300",
    "--set", "broker.txn_check_interval_ms=300",
    "--set", "broker.txn_max_checks=1000",
    "--set", "broker.service_checkpoint_interval_ms=200",
)  # fmt: skip


class Ledger:
    """What the broker acknowledged, and what must therefore be true at the end."""

    def __init__(self) -> None:
        self.delayed: dict[bytes, str] = {}  # value -> message id
        self.cancelled: set[bytes] = set()
        #: Cancels the kill interrupted: cancelled or delivered (once) are both correct.
        self.cancel_in_doubt: set[bytes] = set()
        self.committed: set[bytes] = set()
        self.rolled_back: set[bytes] = set()
        #: Undecided transactions: id -> (values, the checker's answer).
        self.undecided: dict[str, tuple[list[bytes], str]] = {}
        #: Commits or rollbacks the kill interrupted: either outcome is correct, but whole.
        self.in_doubt: list[list[bytes]] = []


async def _workload(
    address: str, proc: object, rng: random.Random, cycle: int, ledger: Ledger
) -> None:
    producer = aio.Producer(address, client_config=_NO_RETRY)
    txp = aio.TransactionProducer(address, "kill9-tx", client_config=_NO_RETRY)
    seq = 0
    try:
        while True:
            seq += 1
            value = f"{cycle}:{seq}".encode()
            try:
                if rng.random() < 0.5:
                    r = await producer.send(
                        TIMED, value, delay=rng.uniform(0, 2.0), queue=seq % QUEUES
                    )
                    ledger.delayed[value] = r.message_id
                    if rng.random() < 0.1:
                        ledger.cancel_in_doubt.add(value)
                        await producer.cancel(r.message_id)
                        ledger.cancel_in_doubt.discard(value)
                        ledger.cancelled.add(value)
                    continue
                tx = await txp.begin()
                values = [value + b"/%d" % i for i in range(rng.randint(1, 3))]
                for i, v in enumerate(values):
                    await tx.send(TXN, v, queue=i % QUEUES)
                fate = rng.choice(("commit", "rollback", "undecided"))
                if fate == "undecided":
                    ledger.undecided[tx.refs[0][1]] = (values, rng.choice(("commit", "rollback")))
                    continue
                ledger.in_doubt.append(values)
                if fate == "commit":
                    await tx.commit()
                    ledger.committed.update(values)
                else:
                    await tx.rollback()
                    ledger.rolled_back.update(values)
                ledger.in_doubt.pop()
            except (TidemqError, TimeoutError, OSError):
                return  # the server died: the last request's outcome is unknown
    finally:
        with contextlib.suppress(TidemqError, TimeoutError):
            await asyncio.wait_for(producer.close(), 10)
        with contextlib.suppress(TidemqError, TimeoutError):
            await asyncio.wait_for(txp.close(), 10)


async def _raw_records(address: str, topic: str) -> list[tuple[bytes, int, int]]:
    """(value, store time, due time or 0) of every message of `topic`, from raw fetches."""
    cluster = ClusterClient(address)
    out: list[tuple[bytes, int, int]] = []
    try:
        for q in range(QUEUES):
            offset = 0
            while True:
                req = FetchRequest(topic=topic, queue=q, offset=offset, max_bytes=1 << 20)
                resp, body = await cluster.request(address, req, FetchResponse)
                if not resp.record_sizes:
                    break
                for record in iter_records(body, resp.record_sizes):
                    header = parse_header(record)
                    due = 0
                    if header.flags & RecordFlags.FROM_TIMER:
                        due = decode_properties(record[HEADER.size : header.payload_start]).due
                    for m in decode_messages(record[header.payload_start :]):
                        out.append((m.value or b"", header.store_time_ms, due))
                offset = resp.next_offset
    finally:
        await cluster.close()
    return out


async def _final_check(address: str, ledger: Ledger, where: str) -> None:
    answers = {txn_id: answer for txn_id, (_, answer) in ledger.undecided.items()}

    def checker(check: aio.TransactionCheck) -> str:
        return answers.get(check.txn_id, "rollback")

    async with aio.TransactionProducer(address, "kill9-tx", checker=checker):
        expected_tx = set(ledger.committed)
        for values, answer in ledger.undecided.values():
            if answer == "commit":
                expected_tx.update(values)
        doubtful = {v for values in ledger.in_doubt for v in values}
        live = set(ledger.delayed) - ledger.cancelled - ledger.cancel_in_doubt
        deadline = time.monotonic() + 60
        while True:
            timed = await _raw_records(address, TIMED)
            txn = await _raw_records(address, TXN)
            got_timed = {v for v, _, _ in timed}
            got_tx = {v for v, _, _ in txn}
            if (live <= got_timed and expected_tx <= got_tx) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        await asyncio.sleep(1.0)  # anything extra (a duplicate, a cancelled one) shows now
        timed = await _raw_records(address, TIMED)
        txn = await _raw_records(address, TXN)
        async with aio.Admin(address) as admin:
            where += f" timers: {await admin.timer_status()}"
            # If something is missing: does the broker hold fewer records, or did the read
            # stop short?
            bounds = [
                (q.queue, q.min_offset, q.max_offset)
                for q in (await admin.describe_topic(TXN)).queue_info
            ]
            where += f" {TXN} queues (queue, min, max): {bounds}, read {len(txn)} messages"
    counts = Counter(v for v, _, _ in timed)
    assert live <= set(counts), f"{where}: delayed lost: {sorted(live - set(counts))[:5]}"
    assert not ledger.cancelled & set(counts), f"{where}: a cancelled message was delivered"
    assert max(counts.values(), default=1) == 1, (
        f"{where}: delivered twice: {counts.most_common(3)}"
    )
    early = [(v, store, due) for v, store, due in timed if store < due]
    assert not early, f"{where}: delivered early: {early[:3]}"
    tx_counts = Counter(v for v, _, _ in txn)
    assert expected_tx <= set(tx_counts), (
        f"{where}: committed lost: {sorted(expected_tx - set(tx_counts))[:5]}"
    )
    assert max(tx_counts.values(), default=1) == 1, f"{where}: published twice"
    assert not ledger.rolled_back & set(tx_counts), f"{where}: a rolled-back message is visible"
    for values, answer in ledger.undecided.values():
        if answer == "rollback":
            assert not set(values) & set(tx_counts), f"{where}: checker said rollback"
    for values in ledger.in_doubt:
        seen = set(values) & set(tx_counts)
        assert seen in (set(), set(values)), f"{where}: transaction half visible"
    unexpected = set(tx_counts) - expected_tx - doubtful
    assert not unexpected, f"{where}: visible but never committed: {sorted(unexpected)[:5]}"


@pytest.mark.slow
def test_timers_and_transactions_survive_kill9(tmp_path: Path) -> None:
    seed = int(os.environ.get("TIDEMQ_KILL9_SEED", random.randrange(1 << 32)))
    print(f"special kill9: seed {seed} (rerun with TIDEMQ_KILL9_SEED={seed})")
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    ledger = Ledger()
    started = time.monotonic()

    async def create(address: str) -> None:
        async with aio.Admin(address) as admin:
            await admin.create_topic(TIMED, QUEUES)
            await admin.create_topic(TXN, QUEUES)

    proc, address = _start_server(data_dir, *_SERVER_SETTINGS)
    try:
        asyncio.run(create(address))
    finally:
        _reap(proc)
    for cycle in range(CYCLES):
        assert time.monotonic() - started < TIME_LIMIT_S, f"seed {seed}: out of time"
        proc, address = _start_server(data_dir, *_SERVER_SETTINGS)
        killer = threading.Timer(rng.uniform(0.3, 1.5), proc.send_signal, (signal.SIGKILL,))
        killer.start()
        try:
            asyncio.run(_workload(address, proc, rng, cycle, ledger))
        finally:
            killer.join()
            _reap(proc)
    proc, address = _start_server(data_dir, *_SERVER_SETTINGS)
    try:
        asyncio.run(_final_check(address, ledger, f"seed={seed}"))
    finally:
        _reap(proc)
    assert ledger.delayed
    assert ledger.committed or ledger.undecided
