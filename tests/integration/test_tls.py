"""TLS on the native listener (issue 16): a throwaway CA, server and client certificates
made with the `openssl` command line, an in-process broker on the test loop and one
`tidemq server` process; the asyncio, sync and CLI clients over TLS, and what is refused:
plaintext clients, clients without a certificate when one is required, TLS below 1.2."""

from __future__ import annotations

import logging
import re
import shutil
import ssl
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.support.server_process import server_process
from tests.support.tls_certs import Certs, make_certs
from typer.testing import CliRunner

import tidemq
import tidemq.aio
from tidemq.broker.broker import Broker, listener_ssl_context
from tidemq.broker.config import BrokerConfig
from tidemq.cli.main import app
from tidemq.client.cluster import ClientConfig
from tidemq.cluster.service import NameServerService
from tidemq.core.errors import BrokerNotAvailable, ConfigError
from tidemq.net.client import ClientConnection
from tidemq.net.server import Reply, ServerConnection, ServerLimits, TcpServer
from tidemq.net.tls import TlsClientAuth, server_context
from tidemq.protocol.frame import Frame
from tidemq.store.config import StoreConfig

if TYPE_CHECKING:
    from tests.integration.conftest import Loop, StartBroker

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

_SERVING = re.compile(r"^serving on (\S+:\d+)$", re.MULTILINE)


def _fail_fast(context: ssl.SSLContext | None = None) -> ClientConfig:
    """Refusals must be quick: no retries, short timeouts."""
    return ClientConfig(
        ssl_context=context, retries=0, connect_timeout_ms=3_000, request_timeout_ms=3_000
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _tls(certs: Certs, **overrides: object) -> dict[str, object]:
    return {"tls_cert_file": certs.server_cert, "tls_key_file": certs.server_key, **overrides}


def test_asyncio_clients_produce_and_consume_over_tls(
    loop: Loop, start_broker: StartBroker, certs: Certs
) -> None:
    env = start_broker(**_tls(certs))
    config = ClientConfig(ssl_context=tidemq.client_tls(ca_file=certs.ca))

    async def go() -> list[bytes | None]:
        async with tidemq.aio.Admin(env.address, client_config=config) as admin:
            await admin.create_topic("tls-aio", 1)
        async with tidemq.aio.Producer(env.address, client_config=config) as producer:
            for i in range(3):
                await producer.send("tls-aio", b"m%d" % i)
        consumer = tidemq.aio.StreamConsumer(env.address, start="earliest", client_config=config)
        try:
            consumer.assign([("tls-aio", 0)])
            seen: list[bytes | None] = []
            while len(seen) < 3:
                seen.extend(m.value for m in await consumer.poll(timeout_ms=500))
            return seen
        finally:
            await consumer.close()

    assert loop.run(go(), timeout_s=30) == [b"m0", b"m1", b"m2"]


def test_plaintext_client_is_refused_quickly(
    loop: Loop, start_broker: StartBroker, certs: Certs
) -> None:
    env = start_broker(**_tls(certs))

    async def go() -> None:
        async with tidemq.aio.Admin(env.address, client_config=_fail_fast()) as a:
            await a.list_topics()

    started = time.monotonic()
    with pytest.raises(BrokerNotAvailable):
        loop.run(go(), timeout_s=20)
    assert time.monotonic() - started < 10


def test_tls_client_against_a_plaintext_listener_fails_clearly(
    loop: Loop, start_broker: StartBroker, certs: Certs
) -> None:
    env = start_broker()
    ctx = tidemq.client_tls(ca_file=certs.ca)

    async def go() -> None:
        await ClientConnection.open(
            env.address, max_frame_bytes=1 << 20, connect_timeout_s=5, ssl_context=ctx
        )

    with pytest.raises(BrokerNotAvailable, match="cannot connect"):
        loop.run(go(), timeout_s=20)


def test_client_certificate_required_when_a_ca_is_set(
    loop: Loop, start_broker: StartBroker, certs: Certs
) -> None:
    env = start_broker(**_tls(certs, tls_ca_file=certs.ca))
    without = _fail_fast(tidemq.client_tls(ca_file=certs.ca))
    with_cert = ClientConfig(
        ssl_context=tidemq.client_tls(
            ca_file=certs.ca, cert_file=certs.client_cert, key_file=certs.client_key
        )
    )

    async def topics(config: ClientConfig) -> list[str]:
        async with tidemq.aio.Admin(env.address, client_config=config) as admin:
            return [t.name for t in await admin.list_topics()]

    with pytest.raises(BrokerNotAvailable):
        loop.run(topics(without), timeout_s=20)
    assert loop.run(topics(with_cert), timeout_s=20) == []


def test_tls_below_1_2_is_refused(loop: Loop, start_broker: StartBroker, certs: Certs) -> None:
    env = start_broker(**_tls(certs))
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(certs.ca)
    with warnings.catch_warnings():  # TLS 1.0/1.1 are deprecated: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    # Let this client offer TLS 1.1 at all (OpenSSL 3's default level forbids it), so
    # that it is the broker that says no.
    old.set_ciphers("DEFAULT:@SECLEVEL=0")

    async def go() -> None:
        await ClientConnection.open(
            env.address, max_frame_bytes=1 << 20, connect_timeout_s=5, ssl_context=old
        )

    with pytest.raises(BrokerNotAvailable, match="TLS handshake failed"):
        loop.run(go(), timeout_s=20)
    # TLS 1.2 itself is accepted
    tls12 = tidemq.client_tls(ca_file=certs.ca)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2

    async def talk() -> list[str]:
        config = ClientConfig(ssl_context=tls12)
        async with tidemq.aio.Admin(env.address, client_config=config) as admin:
            return [t.name for t in await admin.list_topics()]

    assert loop.run(talk(), timeout_s=20) == []


def test_standalone_name_server_and_registration_over_mutual_tls(
    loop: Loop, tmp_path: Path, certs: Certs
) -> None:
    """`tidemq namesrv` + `tidemq broker`: the broker registers over TLS, presenting its
    certificate to a name server that requires one; clients bootstrap from it over TLS."""
    ns = NameServerService(
        port=0,
        ssl_context=server_context(
            cert_file=certs.server_cert, key_file=certs.server_key, ca_file=certs.ca
        ),
    )
    bootstrap = loop.run(ns.start())
    config = BrokerConfig(
        port=0,
        store=StoreConfig(data_dir=tmp_path / "b"),
        shutdown_timeout_ms=5_000,
        name_servers=(bootstrap,),
        tls_cert_file=certs.server_cert,
        tls_key_file=certs.server_key,
        tls_ca_file=certs.ca,
    )
    broker = Broker(config)
    try:
        loop.run(broker.start())

        async def go() -> list[bytes | None]:
            await loop.wait_until(lambda: len(ns.nameserver.brokers()) == 1, what="registration")
            client = ClientConfig(
                ssl_context=tidemq.client_tls(
                    ca_file=certs.ca, cert_file=certs.client_cert, key_file=certs.client_key
                )
            )
            async with tidemq.aio.Admin(bootstrap, client_config=client) as admin:
                await admin.create_topic("tls-cluster", 1)
            async with tidemq.aio.Producer(bootstrap, client_config=client) as producer:
                await producer.send("tls-cluster", b"x")
            consumer = tidemq.aio.StreamConsumer(bootstrap, start="earliest", client_config=client)
            try:
                consumer.assign([("tls-cluster", 0)])
                seen: list[bytes | None] = []
                while not seen:
                    seen.extend(m.value for m in await consumer.poll(timeout_ms=500))
                return seen
            finally:
                await consumer.close()

        assert loop.run(go(), timeout_s=30) == [b"x"]
    finally:
        if hasattr(broker, "_server"):
            loop.run(broker.stop())
        loop.run(ns.stop())


def test_plaintext_listener_off_loopback_is_warned_about(
    loop: Loop, caplog: pytest.LogCaptureFixture
) -> None:
    async def listen(host: str) -> None:
        server = TcpServer(_never_called, ServerLimits(max_frame_bytes=1 << 16))
        await server.start(host, 0)
        await server.stop_accepting()
        await server.drain(0)

    with caplog.at_level(logging.WARNING, logger="tidemq.net.server"):
        loop.run(listen("127.0.0.1"))
        assert not caplog.records
        loop.run(listen("0.0.0.0"))
    assert "without TLS" in caplog.text
    assert "without authentication" in caplog.text  # nor auth_required: both said


async def _never_called(frame: Frame, conn: ServerConnection) -> Reply:
    raise AssertionError("no request expected")


def test_bad_tls_settings_name_the_key(tmp_path: Path, certs: Certs) -> None:
    store = StoreConfig(data_dir=tmp_path)
    missing = tmp_path / "missing.pem"
    with pytest.raises(ConfigError, match=r"broker\.tls_cert_file: .* does not exist"):
        listener_ssl_context(
            BrokerConfig(store=store, tls_cert_file=missing, tls_key_file=certs.server_key)
        )
    cert, key = certs.server_cert, certs.server_key
    with pytest.raises(ConfigError, match=r"broker\.tls_ca_file: .* does not exist"):
        listener_ssl_context(
            BrokerConfig(store=store, tls_ca_file=missing, tls_cert_file=cert, tls_key_file=key)
        )
    with pytest.raises(ConfigError, match=r"broker\.tls_key_file go together"):
        BrokerConfig(store=store, tls_cert_file=cert)
    with pytest.raises(ConfigError, match=r"tls_client_auth=required needs broker\.tls_ca_file"):
        BrokerConfig(
            store=store,
            tls_client_auth=TlsClientAuth.REQUIRED,
            tls_cert_file=cert,
            tls_key_file=key,
        )


@pytest.fixture(scope="module")
def tls_server(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`tidemq server` with TLS and optional client certificates, from --set keys."""
    base = tmp_path_factory.mktemp("tls-server")
    settings = [
        "--set", f"broker.tls_cert_file={certs.server_cert}",
        "--set", f"broker.tls_key_file={certs.server_key}",
        "--set", f"broker.tls_ca_file={certs.ca}",
        "--set", "broker.tls_client_auth=optional",
    ]  # fmt: skip
    with server_process(base, settings) as running:
        yield running.address


def test_sync_clients_against_a_tls_server_process(tls_server: str, certs: Certs) -> None:
    config = ClientConfig(ssl_context=tidemq.client_tls(ca_file=certs.ca))
    with tidemq.Admin(tls_server, client_config=config) as admin:
        admin.create_topic("tls-sync", 1)
    with tidemq.Producer(tls_server, client_config=config) as producer:
        producer.send("tls-sync", b"hello")
    # optional client auth: a client with a certificate is served too
    mutual = ClientConfig(
        ssl_context=tidemq.client_tls(
            ca_file=certs.ca, cert_file=certs.client_cert, key_file=certs.client_key
        )
    )
    with tidemq.StreamConsumer(tls_server, start="earliest", client_config=mutual) as consumer:
        consumer.assign([("tls-sync", 0)])
        seen: list[bytes | None] = []
        deadline = time.monotonic() + 15
        while not seen and time.monotonic() < deadline:
            seen.extend(m.value for m in consumer.poll(timeout_ms=500))
    assert seen == [b"hello"]


def test_cli_with_tls_flags(tls_server: str, certs: Certs) -> None:
    runner = CliRunner()
    tls = ["--bootstrap", tls_server, "--tls-ca-file", str(certs.ca)]
    created = runner.invoke(app, ["topic", "create", "tls-cli", "--queues", "1", *tls])
    assert created.exit_code == 0, created.output
    produced = runner.invoke(app, ["produce", "tls-cli", *tls], input="a\nb\n")
    assert produced.exit_code == 0, produced.output
    consumed = runner.invoke(
        app, ["consume", "tls-cli", "--from-beginning", "--max-messages", "2", *tls]
    )
    assert consumed.exit_code == 0, consumed.output
    assert consumed.stdout.split() == ["a", "b"]
    # without the flags: plaintext, refused with one error line, not a hang
    started = time.monotonic()
    plain = runner.invoke(app, ["topic", "list", "--bootstrap", tls_server])
    assert plain.exit_code == 1
    assert "error:" in plain.output
    assert time.monotonic() - started < 20
    # a missing CA file is a usage error naming the flag
    bad = runner.invoke(app, ["topic", "list", *tls[:2], "--tls-ca-file", "/nonexistent.pem"])
    assert bad.exit_code == 2
    assert "--tls-ca-file" in bad.output
