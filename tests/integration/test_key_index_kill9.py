"""kill -9 of a real `tidemq server` while keyed messages are produced: after every
restart each acknowledged message is found by each of its keys (`key` and `keys`), so
the key index is re-derived from the commit log past the last checkpoint.

Small key-index files (`store.key_index_entries_per_file`) make the server seal files
during the run, so kills land before, during and after seals. The seed is printed;
TIDEMQ_KILL9_SEED replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import threading
from collections import defaultdict
from typing import TYPE_CHECKING

import pytest
from tests.support.killable_server import KillableServer

from tidemq import aio
from tidemq.client.cluster import ClientConfig
from tidemq.core.errors import TidemqError

if TYPE_CHECKING:
    from pathlib import Path

    from tests.integration.conftest import Loop

pytestmark = pytest.mark.timeout(240)

TOPIC = "keys-kill9"
QUEUES = 3
CYCLES = 3
#: Messages produced per cycle at most (keeps each key under the query limit of 1,000).
CYCLE_MESSAGES = 6_000
K_KEYS, B_KEYS = 211, 97
REPLY_TIMEOUT_S = 10


def _start(data_dir: Path) -> KillableServer:
    return KillableServer(data_dir, "--set", "store.key_index_entries_per_file=2048")


async def _produce_until_killed(
    server: KillableServer, rng: random.Random, model: dict[str, set[str]], seq: list[int]
) -> None:
    proc = server.proc
    killer = threading.Timer(rng.uniform(0.2, 1.5), proc.send_signal, (signal.SIGKILL,))
    producer = aio.Producer(
        server.address, linger_ms=2, client_config=ClientConfig(retries=0, request_timeout_ms=5000)
    )
    killer.start()
    produced = 0
    try:
        while proc.poll() is None and produced < CYCLE_MESSAGES:
            n = rng.randint(1, 40)
            first = seq[0]
            seq[0] += n
            produced += n
            try:
                if rng.random() < 0.5:
                    keys = [f"k{(first + i) % K_KEYS}".encode() for i in range(n)]
                    receipts = await asyncio.wait_for(
                        producer.send_batch(
                            TOPIC, [b"m%d" % (first + i) for i in range(n)], keys=keys
                        ),
                        REPLY_TIMEOUT_S,
                    )
                    for receipt, key in zip(receipts, keys, strict=True):
                        model[key.decode()].add(receipt.message_id)
                    continue
                sends = [
                    producer.send(
                        TOPIC,
                        b"m%d" % (first + i),
                        key=f"k{(first + i) % K_KEYS}".encode(),
                        keys=[f"b{(first + i) % B_KEYS}"],
                    )
                    for i in range(n)
                ]
                done = await asyncio.wait_for(
                    asyncio.gather(*sends, return_exceptions=True), REPLY_TIMEOUT_S
                )
                for i, outcome in enumerate(done):
                    if not isinstance(outcome, BaseException):
                        model[f"k{(first + i) % K_KEYS}"].add(outcome.message_id)
                        model[f"b{(first + i) % B_KEYS}"].add(outcome.message_id)
            except (TidemqError, TimeoutError):
                break  # the server died mid-request: not acknowledged
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        with contextlib.suppress(TidemqError, TimeoutError):
            await asyncio.wait_for(producer.close(), timeout=10)


async def _verify(address: str, model: dict[str, set[str]], where: str) -> None:
    async with aio.Admin(address) as admin:
        for key, acked in sorted(model.items()):
            found = await admin.query_messages(TOPIC, key, limit=1_000)
            ids = {m.message_id for m in found}
            missing = acked - ids
            assert not missing, f"{where}: key {key}: {len(missing)} acked messages not found"
            assert all(key in ((m.key or b"").decode(), *m.keys) for m in found), where


def test_kill9_key_index_is_rebuilt_for_every_acknowledged_message(
    tmp_path: Path, loop: Loop
) -> None:
    seed = int(os.environ.get("TIDEMQ_KILL9_SEED", random.randrange(1 << 32)))
    print(f"key index kill9: seed {seed} (rerun with TIDEMQ_KILL9_SEED={seed})")
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    model: dict[str, set[str]] = defaultdict(set)
    seq = [0]
    server = _start(data_dir)
    try:

        async def create() -> None:
            async with aio.Admin(server.address) as admin:
                await admin.create_topic(TOPIC, QUEUES)

        loop.run(create())
    finally:
        server.reap()
    for cycle in range(CYCLES):
        where = f"seed={seed} cycle={cycle}"
        server = _start(data_dir)
        try:
            loop.run(_verify(server.address, model, where), timeout_s=120)
            loop.run(_produce_until_killed(server, rng, model, seq), timeout_s=120)
        finally:
            server.reap()
    server = _start(data_dir)
    where = f"seed={seed} final"
    try:
        loop.run(_verify(server.address, model, where), timeout_s=120)
        assert sum(len(v) for v in model.values()) > 0
        # The run went through seals of key-index files, not only the open one.
        assert list((data_dir / "keyindex").glob("*.kix")), where
    finally:
        server.stop()
