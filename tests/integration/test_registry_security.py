"""The HTTP listener of a broker with TLS and logins (issue 19): HTTPS with the broker's
certificate, HTTP Basic credentials of a broker user on every path, and the registry's
own client logging in over TLS. Confluent's SchemaRegistryClient (with
`basic.auth.user.info` and `ssl.ca.location`) and tidemq's client work; requests without
or with wrong credentials get 401; broker-side validation still works there."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from tests.support.tls_certs import Certs, make_certs

import tidemq
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.cli.node import Node
from tidemq.client.cluster import ClientConfig
from tidemq.core.errors import SchemaValidationFailed, TidemqError
from tidemq.http.config import HttpConfig
from tidemq.net.tls import TlsClientAuth
from tidemq.schema.wire import frame
from tidemq.store.config import StoreConfig

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
]

T = TypeVar("T")
USER, PASSWORD = "admin", "admin-secret"
POINT = {"type": "record", "name": "Point", "fields": [{"name": "x", "type": "long"}]}


@dataclass
class SecureNode:
    node: Node
    loop: asyncio.AbstractEventLoop
    address: str
    url: str
    certs: Certs

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureNode]:
    yield from _secure_node(tmp_path)


def _secure_node(tmp_path: Path, **overrides: Any) -> Iterator[SecureNode]:
    certs = make_certs(tmp_path)
    cfg = BrokerConfig(
        **overrides,
        port=0,
        store=StoreConfig(data_dir=tmp_path / "data"),
        tls_cert_file=certs.server_cert,
        tls_key_file=certs.server_key,
        tls_ca_file=certs.ca,
        tls_client_auth=TlsClientAuth.OPTIONAL,
        auth_enabled=True,
        bootstrap_user=USER,
    )
    broker = Broker(cfg, embedded_nameserver=True, bootstrap_password=PASSWORD)
    node = Node(broker, HttpConfig(port=0), registry_login=(USER, PASSWORD))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    env = SecureNode(node, loop, "", "", certs)
    try:
        env.address = env.run(node.start())
        assert node.listener is not None
        env.url = "https://" + node.listener.address
        yield env
    finally:
        env.run(node.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _status(url: str, context: ssl.SSLContext, auth: str | None = None) -> int:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_registry_serves_https_to_logged_in_users(secure: SecureNode) -> None:
    conf = {"url": secure.url, "ssl.ca.location": str(secure.certs.ca)}
    with SchemaRegistryClient({**conf, "basic.auth.user.info": f"{USER}:{PASSWORD}"}) as client:
        schema_id = client.register_schema("points-value", Schema(json.dumps(POINT), "AVRO"))
        assert json.loads(client.get_schema(schema_id).schema_str)["name"] == "Point"
    for user_info in (None, f"{USER}:wrong"):
        extra = {} if user_info is None else {"basic.auth.user.info": user_info}
        with SchemaRegistryClient({**conf, **extra}) as client:
            with pytest.raises(SchemaRegistryError) as refused:
                client.get_subjects()
            assert refused.value.http_status_code == 401
    context = ssl.create_default_context(cafile=str(secure.certs.ca))
    assert _status(secure.url + "/metrics", context) == 401  # every path needs a login
    registry = tidemq.SchemaRegistry(
        secure.url, username=USER, password=PASSWORD, ssl_context=context
    )
    assert registry.version("points-value")["name"] == "Point"
    with pytest.raises(TidemqError, match="cannot reach the schema registry"):
        tidemq.SchemaRegistry(secure.url.replace("https", "http")).version("points-value")

    # Broker-side validation on that broker, through a client with TLS and a login.
    config = ClientConfig(
        ssl_context=tidemq.client_tls(ca_file=secure.certs.ca), username=USER, password=PASSWORD
    )
    with tidemq.Admin(secure.address, client_config=config) as admin:
        admin.create_topic("points", 1, config={"schema.validation": "true"})
    with tidemq.Producer(secure.address, client_config=config) as producer:
        producer.send("points", frame(schema_id, b"\x02"))
        with pytest.raises(SchemaValidationFailed, match="schema id 77"):
            producer.send("points", frame(77, b"\x02"))


def test_the_spark_options_reach_a_registry_with_tls_and_logins(secure: SecureNode) -> None:
    """`schemaRegistry.username`, `.password`, `.caFile`: what the Spark source and sink
    resolve their schema with on the driver and read writers' schemas with on executors
    (`RegistryLogin`); half a login is refused."""
    from tidemq.spark.value_format import RegistryLogin, resolve_value_format  # noqa: PLC0415

    registry = tidemq.SchemaRegistry(
        secure.url,
        username=USER,
        password=PASSWORD,
        ssl_context=ssl.create_default_context(cafile=str(secure.certs.ca)),
    )
    schema_id = registry.register("spark-points-value", POINT)
    options = {
        "subscribe": "spark-points",
        "valueFormat": "avro",
        "schemaRegistry": secure.url,
        "schemaRegistry.username": USER,
        "schemaRegistry.password": PASSWORD,
        "schemaRegistry.caFile": str(secure.certs.ca),
    }
    found = resolve_value_format(options)
    assert found is not None
    assert json.loads(found.reader_schema)["name"] == "Point"
    assert "admin-secret" not in repr(found)
    assert found.registry().schema(schema_id)["name"] == "Point"  # as an executor does
    with pytest.raises(ValueError, match="go together"):
        RegistryLogin.of({"schemaregistry.username": USER})
    with pytest.raises(TidemqError, match="401"):
        resolve_value_format({**options, "schemaRegistry.password": "wrong"})


def _console(
    secure: SecureNode, path: str, user: str, password: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    context = ssl.create_default_context(cafile=str(secure.certs.ca))
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    headers = {"Authorization": f"Basic {token}"}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    request = urllib.request.Request(secure.url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def authorizing(tmp_path: Path) -> Iterator[SecureNode]:
    """A secure node that also checks ACLs (the bootstrap user is its super user)."""
    yield from _secure_node(tmp_path, authorization_enabled=True)


def test_the_console_acts_as_the_user_who_logged_in(authorizing: SecureNode) -> None:
    """Not as the listener's own (registry) user: the brokers' ACLs decide what each user
    sees and does through the console, as for that user's own clients."""
    secure = authorizing
    config = ClientConfig(
        ssl_context=tidemq.client_tls(ca_file=secure.certs.ca), username=USER, password=PASSWORD
    )
    with tidemq.Admin(secure.address, client_config=config) as admin:
        admin.create_topic("open-t", 1)
        admin.create_topic("secret-t", 1)
        admin.create_user("viewer", "viewer-secret-1")
        admin.create_acls(
            [
                tidemq.Acl(
                    principal="User:viewer",
                    resource_type="topic",
                    resource_name="open-",
                    pattern_type="prefixed",
                    operation="describe",
                )
            ]
        )
    status, page = _console(secure, "/api/topics", USER, PASSWORD)
    assert status == 200
    assert {"open-t", "secret-t"} <= {t["name"] for t in page["topics"]}
    status, page = _console(secure, "/api/topics", "viewer", "viewer-secret-1")
    assert (status, [t["name"] for t in page["topics"]]) == (200, ["open-t"])
    assert _console(secure, "/api/topics/open-t", "viewer", "viewer-secret-1")[0] == 200
    status, answer = _console(secure, "/api/topics/secret-t", "viewer", "viewer-secret-1")
    assert status == 403, answer  # refused by name, as one that does not exist would be
    # An action needs its rights too: the viewer may not reset a group's offsets.
    reset = {"topic": "open-t", "to": "earliest", "execute": True}
    status, answer = _console(secure, "/api/reset/g", "viewer", "viewer-secret-1", reset)
    assert status == 403, answer
    assert _console(secure, "/api/reset/g", USER, PASSWORD, reset)[0] == 200
    assert _console(secure, "/api/topics", "viewer", "wrong")[0] == 401
