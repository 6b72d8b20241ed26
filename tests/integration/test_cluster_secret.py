"""Authenticated cluster membership (issue 16): a name server that knows the cluster
secret takes registrations only from brokers that sign them with it. A forged
registration (the route hijack of the issue: another address for a known broker name) and
a forged unregistration are refused; a broker with the wrong secret never enters the
routes; the right one does, and leaves them when it stops."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.integration.conftest import broker_config
from typer.testing import CliRunner

from tidemq.broker.broker import Broker
from tidemq.cli.main import app
from tidemq.client.cluster import ClusterClient
from tidemq.cluster.membership import registration_fields, sign
from tidemq.cluster.service import NameServerService
from tidemq.core.errors import AuthenticationFailed, ConfigError
from tidemq.net.client import ClientConnection
from tidemq.protocol.commands import (
    Empty,
    RegisterBrokerRequest,
    RegisterBrokerResponse,
    UnregisterBrokerRequest,
)

if TYPE_CHECKING:
    from tests.integration.conftest import Loop

pytestmark = pytest.mark.timeout(60)

SECRET = "a-cluster-secret-of-some-length"


async def _brokers(bootstrap: str) -> dict[str, str]:
    client = ClusterClient(bootstrap)
    try:
        return dict((await client.refresh_routes(force=True)).brokers)
    finally:
        await client.close()


async def _refused(bootstrap: str, request: RegisterBrokerRequest | UnregisterBrokerRequest) -> str:
    conn = await ClientConnection.open(bootstrap, max_frame_bytes=1 << 20)
    try:
        expected = RegisterBrokerResponse if isinstance(request, RegisterBrokerRequest) else Empty
        with pytest.raises(AuthenticationFailed) as refused:
            await conn.request(request, expected, timeout_s=10)
        return str(refused.value)
    finally:
        conn.close()


def test_only_brokers_with_the_secret_register(loop: Loop, tmp_path: Path) -> None:
    ns = NameServerService(port=0, cluster_secret=SECRET)
    bootstrap = loop.run(ns.start())
    good = Broker(
        broker_config(tmp_path / "good", broker_name="good", name_servers=(bootstrap,)),
        cluster_secret=SECRET,
    )
    bad = Broker(
        broker_config(tmp_path / "bad", broker_name="bad", name_servers=(bootstrap,)),
        cluster_secret="not-the-cluster-secret-at-all",
    )
    try:
        good_address = loop.run(good.start())
        loop.run(bad.start())
        assert loop.run(_brokers(bootstrap)) == {"good": good_address}

        hijack = RegisterBrokerRequest(broker_name="good", address="127.0.0.1:1", topics=[])
        assert "sign their registration" in loop.run(_refused(bootstrap, hijack))
        wrong_key = b"x" * 32
        hijack.signed_ms, hijack.signature = sign(
            wrong_key, "REGISTER_BROKER", registration_fields(hijack), now_ms=ns._clock.now_ms()
        )
        assert "bad signature" in loop.run(_refused(bootstrap, hijack))
        # A signed registration replayed with another address: the signature no longer fits.
        key = SECRET.encode()
        signed = RegisterBrokerRequest(broker_name="good", address=good_address, topics=[])
        signed.signed_ms, signed.signature = sign(
            key, "REGISTER_BROKER", registration_fields(signed), now_ms=ns._clock.now_ms()
        )
        signed.address = "127.0.0.1:1"
        assert "bad signature" in loop.run(_refused(bootstrap, signed))
        stale = RegisterBrokerRequest(broker_name="good", address=good_address, topics=[])
        stale.signed_ms, stale.signature = sign(
            key, "REGISTER_BROKER", registration_fields(stale), now_ms=ns._clock.now_ms() - 600_000
        )
        assert "away from this name server's clock" in loop.run(_refused(bootstrap, stale))
        assert "sign their registration" in loop.run(
            _refused(bootstrap, UnregisterBrokerRequest(broker_name="good"))
        )
        assert loop.run(_brokers(bootstrap)) == {"good": good_address}

        loop.run(good.stop())  # its signed unregistration is taken
        assert loop.run(_brokers(bootstrap)) == {}
    finally:
        for broker in (good, bad):
            if hasattr(broker, "_server"):
                loop.run(broker.stop())
        loop.run(ns.stop())


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        NameServerService(port=0, cluster_secret="short")


def test_cli_refuses_a_short_secret_before_starting() -> None:
    for command in (["namesrv", "--port", "0"], ["broker", "--port", "0"]):
        result = CliRunner().invoke(app, command, env={"TIDEMQ_CLUSTER_SECRET": "short"})
        assert result.exit_code == 2, result.output
        assert "TIDEMQ_CLUSTER_SECRET must be at least 16 bytes" in result.output
