"""kill -9 of a real `tidemq server` during production, with sync flush.

Each cycle starts the server on the same data directory, produces batches from this
process (recording every receipt the broker acknowledged), kills the server with SIGKILL
at a random moment, and restarts it. After every restart, every acknowledged message must
be there, in order, at its offset, with its bytes; the queue continues after them.
The seed is printed; TIDEMQ_KILL9_SEED replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tidemq import aio
from tidemq.client.cluster import ClientConfig
from tidemq.core.errors import TidemqError

TOPIC = "kill9"
QUEUES = 3
#: Kill cycles per run: a few on every `make test`, more under `make soak`. Every restart
#: reads back everything acknowledged so far, so a cycle gets longer as the queues grow
#: (3 s at first; 100 cycles did not finish in 21 minutes).
CYCLES = 8
SOAK_CYCLES = 40
#: Upper bound per cycle on average, so a hang cannot eat the CI budget.
CYCLE_TIME_LIMIT_S = 20


_DRAINS: dict[int, threading.Thread] = {}


def _reap(proc: subprocess.Popen[bytes]) -> int:
    """Kill the server if it still runs; wait for it and close its pipe."""
    if proc.poll() is None:
        proc.kill()
    code = proc.wait(30)
    drain = _DRAINS.pop(proc.pid, None)
    if drain is not None:
        drain.join(10)
    if proc.stderr is not None:
        proc.stderr.close()
    return code


def _start_server(data_dir: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemq.cli.main", "server", "--data-dir", str(data_dir),
         "--port", "0", "--flush", "sync", "--log-level", "warning", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline().decode(errors="replace")
        if not line:
            break
        lines.append(line)
        found = re.search(r"serving on (\S+:\d+)", line)
        if found:
            # Keep draining stderr so the server never blocks on a full pipe.
            drain = threading.Thread(target=proc.stderr.read, daemon=True)
            drain.start()
            _DRAINS[proc.pid] = drain
            return proc, found.group(1)
    _reap(proc)
    raise AssertionError(f"server did not start: {''.join(lines)}")


async def _produce_until_killed(
    address: str, proc: subprocess.Popen[bytes], rng: random.Random, cycle: int,
    acked: dict[int, dict[int, bytes]],
) -> None:  # fmt: skip
    kill_after = rng.uniform(0.2, 1.5)
    killer = threading.Timer(kill_after, proc.send_signal, (signal.SIGKILL,))
    # No retries: once the server is gone a send fails at once (its outcome unknown).
    producer = aio.Producer(
        address, linger_ms=1, client_config=ClientConfig(retries=0, request_timeout_ms=5000)
    )
    killer.start()
    seq = 0
    try:
        while proc.poll() is None:
            queue = rng.randrange(QUEUES)
            values = [f"{cycle}:{seq + i}".encode() for i in range(rng.randint(1, 40))]
            seq += len(values)
            try:
                receipts = await asyncio.wait_for(
                    producer.send_batch(TOPIC, values, queue=queue), timeout=10
                )
            except (TidemqError, TimeoutError):
                break  # the server died mid-request: the outcome is unknown, not acked
            for receipt, value in zip(receipts, values, strict=True):
                acked[queue][receipt.offset] = value
    finally:
        killer.join()
        proc.wait(30)
        with contextlib.suppress(TidemqError, TimeoutError):
            await asyncio.wait_for(producer.close(), timeout=10)


async def _verify(address: str, acked: dict[int, dict[int, bytes]], where: str) -> None:
    admin = aio.Admin(address)
    info = await admin.describe_topic(TOPIC)
    await admin.close()
    consumer = aio.StreamConsumer(address, start="earliest")
    consumer.assign([(TOPIC, q) for q in range(QUEUES)])
    ends = {qi.queue: qi.max_offset for qi in info.queue_info}
    got: dict[int, dict[int, bytes]] = {q: {} for q in range(QUEUES)}
    deadline = time.monotonic() + 60
    while any(len(got[q]) < ends[q] for q in range(QUEUES)):
        assert time.monotonic() < deadline, f"{where}: could not read back the queues"
        for m in await consumer.poll(timeout_ms=1000):
            assert m.value is not None
            got[m.queue][m.offset] = m.value
    await consumer.close()
    for q in range(QUEUES):
        assert sorted(got[q]) == list(range(ends[q])), f"{where}: queue {q} offsets not dense"
        for offset, value in acked[q].items():
            assert got[q].get(offset) == value, f"{where}: acked {q}/{offset} lost or changed"


async def _create_topic(address: str) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(TOPIC, QUEUES)


@pytest.mark.slow
def test_acknowledged_messages_survive_kill9_of_the_server(tmp_path: Path, soak: bool) -> None:
    seed = int(os.environ.get("TIDEMQ_KILL9_SEED", random.randrange(1 << 32)))
    print(f"server kill9: seed {seed} (rerun with TIDEMQ_KILL9_SEED={seed})")
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    acked: dict[int, dict[int, bytes]] = {q: {} for q in range(QUEUES)}
    started = time.monotonic()

    proc, address = _start_server(data_dir)
    try:
        asyncio.run(_create_topic(address))
    finally:
        _reap(proc)

    cycles = SOAK_CYCLES if soak else CYCLES
    time_limit_s = 60 + cycles * CYCLE_TIME_LIMIT_S
    total_acked = 0
    for cycle in range(cycles):
        assert time.monotonic() - started < time_limit_s, (
            f"seed {seed}: out of time before cycle {cycle} of {cycles} "
            f"({sum(len(v) for v in acked.values())} messages acknowledged)"
        )
        proc, address = _start_server(data_dir)
        try:
            where = f"seed={seed} cycle={cycle}"
            asyncio.run(_verify(address, acked, where))
            asyncio.run(_produce_until_killed(address, proc, rng, cycle, acked))
        finally:
            _reap(proc)
        total_acked = sum(len(v) for v in acked.values())
    print(f"server kill9: {cycles} cycles, {total_acked} messages acknowledged and kept")
    proc, address = _start_server(data_dir)
    try:
        asyncio.run(_verify(address, acked, f"seed={seed} final"))
    finally:
        proc.terminate()  # graceful: SIGTERM stops the server cleanly, exit status 0
        proc.wait(30)
        assert _reap(proc) == 0
    assert total_acked > 0
