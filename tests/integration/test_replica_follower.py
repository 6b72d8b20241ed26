"""A follower's fetch loop against leaders that never answer (a partitioned or paused
leader keeps its sockets but says nothing): real sockets on 127.0.0.1, a real store, and
the election stood in for by a value the test changes (docs/design/replication.md)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from tests.integration.conftest import broker_config, wait_until

from tidemq.broker.replica_follower import ReplicaFollower
from tidemq.broker.replication_config import ReplicationConfig
from tidemq.cluster.group_keys import LeaderRecord
from tidemq.store.epoch_file import EpochHistory
from tidemq.store.files import OsFileSystem
from tidemq.store.message_store import MessageStore

if TYPE_CHECKING:
    from tests.integration.conftest import Loop


class SilentLeader:
    """A listener that takes connections and reads whatever comes, answering nothing."""

    def __init__(self) -> None:
        self.received = 0
        self.address = ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = f"{host}:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(1 << 16):
                self.received += len(chunk)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def test_a_fetch_waiting_on_a_replaced_leader_is_given_up_at_once(
    loop: Loop, tmp_path: Path
) -> None:
    """The follower's fetch waits on a leader that never answers; the election names
    another: the follower asks the new leader at once, not after its fetch's timeout
    (fetch_wait_ms plus 10 s). It waited the whole timeout, and the next leader, which
    needs this member's reports to commit, refused writes meanwhile."""

    async def run() -> None:
        old, new = SilentLeader(), SilentLeader()
        await old.start()
        await new.start()
        current = LeaderRecord(1, "m0", "127.0.0.1:1", old.address)
        changed = asyncio.Condition()

        async def leader_changed(record: LeaderRecord) -> None:
            async with changed:
                await changed.wait_for(lambda: current != record)

        config = ReplicationConfig(group="g1", etcd=("http://127.0.0.1:2379",))
        store = MessageStore.open(broker_config(tmp_path / "m1").store)
        follower = ReplicaFollower(
            config,
            member="m1",
            store=store,
            history=EpochHistory(OsFileSystem(), tmp_path / "m1"),
            leader=lambda: current,
            leader_changed=leader_changed,
        )
        task = asyncio.get_running_loop().create_task(follower.run())
        try:
            await wait_until(lambda: old.received > 0, what="a fetch sent to the old leader")
            async with changed:
                current = LeaderRecord(2, "m2", "127.0.0.1:1", new.address)
                changed.notify_all()
            await wait_until(
                lambda: new.received > 0, timeout_s=3.0, what="a fetch sent to the new leader"
            )
            assert follower.last_leader == "m2"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            store.close()
            await old.stop()
            await new.stop()

    loop.run(run(), timeout_s=60)
