"""A replica group member in a process of its own, held in the middle of its first
start-over, for a test to kill -9 there (tests/integration/test_replication_start_over.py).

    python -m tests.support.start_over_member DATA_DIR NAME PORT BOOTSTRAP ETCD STEP

Runs a `ReplicaNode` with the tests' member config and that test's store settings; its
fault switch holds the start-over before STEP (a step name of `store.start_over`) until
the process is killed. It never leaves on its own.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from tests.integration.test_replication_start_over import BROKER
from tests.support.replica_group import member_config

from tidemq.broker.replica_node import ReplicaNode
from tidemq.testing.replication import ReplicaFaultSwitch


async def _main(argv: list[str]) -> None:
    data_dir, name, port, bootstrap, etcd, step = argv
    faults = ReplicaFaultSwitch()
    faults.hold_start_over_at = step
    config = member_config(
        Path(data_dir), name, etcd.split(","), bootstrap, dict(BROKER), port=int(port)
    )
    node = ReplicaNode(config, faults=faults)
    await node.start()
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(_main(sys.argv[1:]))
