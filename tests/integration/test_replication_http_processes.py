"""`tidemq broker --group NAME --etcd URL --http-port 0`: each member process prints its
`http on HOST:PORT` line and answers `/metrics` with its role, and the schema registry
registers through either member (the CLI's wiring of `ReplicaHttpNode`; the behaviour is
tested in-process by `test_replication_http.py`)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.etcd_server import EtcdCluster, etcd_single
from tests.support.server_process import START_TIMEOUT_S, ServerProcess

import tidemq

__all__ = ["etcd_single"]  # a fixture, used by name below

pytestmark = pytest.mark.timeout(120)

POINT = {"type": "record", "name": "Point", "fields": [{"name": "x", "type": "long"}]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _process(args: list[str], log: Path) -> Iterator[ServerProcess]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemq.cli.main", *args, "--log-level", "warning"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    server = ServerProcess(proc, log)
    try:
        server.wait_serving(START_TIMEOUT_S)
        yield server
    finally:
        server.stop()


def _roles(http: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        s.labels["role"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tidemq_replica_role"
    }


def test_member_processes_serve_metrics_and_the_registry(
    tmp_path: Path, etcd_single: EtcdCluster
) -> None:
    with contextlib.ExitStack() as stack:
        ns = stack.enter_context(
            _process(["namesrv", "--port", str(_free_port())], tmp_path / "ns.log")
        )
        members = [
            stack.enter_context(
                _process(
                    [
                        "broker", "--broker-name", name, "--data-dir", str(tmp_path / name),
                        "--port", str(_free_port()), "--namesrv", ns.address,
                        "--group", "g1", "--etcd", ",".join(etcd_single.endpoints),
                        "--http-port", "0",
                    ],
                    tmp_path / f"{name}.log",
                )
            )
            for name in ("m0", "m1")
        ]  # fmt: skip
        assert all(m.http_address for m in members)
        # Each member answers with exactly one role; roles settle with the election.
        roles = [_roles(m.http_address) for m in members]
        assert all(sorted(r.values()) == [0, 0, 1] for r in roles), roles
        ids = {
            tidemq.SchemaRegistry(f"http://{m.http_address}").register("points-value", POINT)
            for m in members
        }
        assert len(ids) == 1
        roles = [_roles(m.http_address) for m in members]
        assert sorted(next(k for k, v in r.items() if v == 1) for r in roles) == [
            "follower",
            "leader",
        ]
        for m in members:
            assert "not built" not in m.log.read_text()
