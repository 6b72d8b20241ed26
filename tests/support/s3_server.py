"""A real S3 API server for tests: moto's server (`moto[server]`) on a free port of
127.0.0.1, in a thread of the test process, with one bucket created, stopped at the end.
moto's state belongs to the process: each server starts by resetting it."""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from moto.server import ThreadedMotoServer

from tidemq.tiered.config import TieredConfig

__all__ = ["S3Server", "s3_server"]

BUCKET = "tidemq-tier"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str

    def tiered(self, *, prefix: str = "cluster-1", **overrides: Any) -> TieredConfig:
        """A [tiered] section pointing at this server (any credentials: moto takes them)."""
        return TieredConfig(
            url=f"s3://{self.bucket}/{prefix}",
            endpoint=self.endpoint,
            access_key_id="test",
            secret_access_key="test",
            **overrides,
        )


@contextlib.contextmanager
def s3_server(port: int = 0) -> Iterator[S3Server]:
    """`port`: 0 for any free one, or one a test chose (to bring a "down" store up)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        # moto keeps its buckets per process, not per server: start from none.
        reset = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(reset, timeout=10) as answer:
            assert answer.status == 200
        request = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        yield S3Server(endpoint, BUCKET)
    finally:
        server.stop()
