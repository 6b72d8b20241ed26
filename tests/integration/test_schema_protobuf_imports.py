"""Protobuf schemas that import other registered schemas (references), read and written
without generated classes: `tidemq produce|consume --value-format protobuf` build the
message types from the registry (the schema and, recursively, its references), for
schemas registered as `.proto` text over REST and by confluent-kafka's serializer."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from tests.integration.conftest import ThreadedBroker, broker_config
from tests.support.protobuf_invoice import invoice_class
from typer.testing import CliRunner

import tidemq
from tidemq.cli.main import app
from tidemq.http.listener import HttpListener
from tidemq.schema.wire import unframe

pytestmark = pytest.mark.timeout(120)

MONEY = (
    'syntax = "proto3";\npackage shop;\nmessage Money { int64 cents = 1; string currency = 2; }\n'
)
#: Imports shop/money.proto; `Money` resolves to shop.Money through the reference.
INVOICE = """syntax = "proto3";
package shop;
import "shop/money.proto";
message Invoice {
  int64 id = 1;
  Money total = 2;
  repeated Line lines = 3;
  message Line { string sku = 1; Money price = 2; }
}
"""
#: A third level: imports invoice.proto, which imports money.proto.
BATCH = """syntax = "proto3";
package billing;
import "shop/invoice.proto";
message Batch { string name = 1; repeated shop.Invoice invoices = 2; }
"""


class Node:
    def __init__(self, data: Path) -> None:
        self.broker = ThreadedBroker(broker_config(data))
        self.broker.start()
        self.http = HttpListener(self.broker.address, port=0)
        self.url = "http://" + self.broker.call(self.http.start())

    def stop(self) -> None:
        try:
            self.broker.call(self.http.stop())
        finally:
            self.broker.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "broker")
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture
def client(node: Node) -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient({"url": node.url}) as c:
        yield c


def _register_text(client: SchemaRegistryClient) -> tuple[int, int]:
    """money, invoice (importing money) and batch (importing invoice) as `.proto` text;
    the ids of invoice and batch."""
    client.register_schema("shop/money.proto", Schema(MONEY, "PROTOBUF"))
    money = SchemaReference("shop/money.proto", "shop/money.proto", 1)
    invoice = client.register_schema("shop/invoice.proto", Schema(INVOICE, "PROTOBUF", [money]))
    ref = SchemaReference("shop/invoice.proto", "shop/invoice.proto", 1)
    batch = client.register_schema("batches-value", Schema(BATCH, "PROTOBUF", [ref]))
    return invoice, batch


def _cli(*args: str, stdin: str | None = None) -> Any:
    return CliRunner().invoke(app, list(args), input=stdin)


def test_the_cli_reads_and_writes_protobuf_with_imports(
    node: Node, client: SchemaRegistryClient
) -> None:
    """A schema two references deep, registered as `.proto` text: the CLI writes JSON
    lines as its first message and reads them back, with no generated class."""
    _, batch_id = _register_text(client)
    b, url = node.broker.address, node.url
    assert _cli("topic", "create", "batches", "-n", b).exit_code == 0
    line = {
        "name": "may",
        "invoices": [{"id": "1", "total": {"cents": "1250", "currency": "EUR"},
                      "lines": [{"sku": "pen", "price": {"cents": "250"}}]}],
    }  # fmt: skip
    produced = _cli(
        "produce", "batches", "-n", b, "--value-format", "protobuf", "--registry", url,
        stdin=json.dumps(line) + "\n",
    )  # fmt: skip
    assert produced.exit_code == 0, produced.output
    consumed = _cli(
        "consume", "batches", "-n", b, "--from-beginning", "--max-messages", "1",
        "--value-format", "protobuf", "--registry", url,
    )  # fmt: skip
    assert consumed.exit_code == 0, consumed.output
    assert json.loads(consumed.stdout) == line
    with tidemq.StreamConsumer(b, start="earliest") as consumer:
        consumer.assign([("batches", 0)])
        got: list[tidemq.Message] = []
        for _ in range(50):
            got += consumer.poll(timeout_ms=100)
            if got:
                break
    assert got[0].value is not None
    assert unframe(got[0].value).schema_id == batch_id


def test_the_cli_reads_what_confluents_serializer_wrote_with_an_import(
    node: Node, client: SchemaRegistryClient
) -> None:
    """confluent-kafka's ProtobufSerializer registers the class's file and its import (as
    a reference); `tidemq consume` decodes its values from the registry alone. The text
    form registered first is the same schema: the serializer gets its id."""
    invoice_id, _ = _register_text(client)
    cls = invoice_class()
    ctx = SerializationContext("invoices", MessageField.VALUE)
    serialize = ProtobufSerializer(cls, client, {"use.deprecated.format": False})
    value = cls(id=7)
    value.total.cents = 990
    value.lines.add(sku="ink").price.cents = 990
    written = serialize(value, ctx)
    assert written is not None
    latest = client.get_latest_version("invoices-value")
    assert [(r.name, r.subject) for r in latest.schema.references or []] == [
        ("shop/money.proto", "shop/money.proto")
    ]
    assert unframe(written).schema_id == invoice_id  # text and serialized forms: one schema
    b = node.broker.address
    with tidemq.Admin(b) as admin:
        admin.create_topic("invoices", 1)
    with tidemq.Producer(b) as producer:
        producer.send("invoices", written)
    consumed = _cli(
        "consume", "invoices", "-n", b, "--from-beginning", "--max-messages", "1",
        "--value-format", "protobuf", "--registry", node.url,
    )  # fmt: skip
    assert consumed.exit_code == 0, consumed.output
    expected = {
        "id": "7",
        "total": {"cents": "990"},
        "lines": [{"sku": "ink", "price": {"cents": "990"}}],
    }
    assert json.loads(consumed.stdout) == expected
    # The web console decodes it too, from the registry's own state.
    page = f"{node.url}/api/messages?topic=invoices&queue=0&offset=0&limit=1"
    with urllib.request.urlopen(page, timeout=30) as answer:
        shown = json.loads(answer.read())
    assert shown[0]["value"]["decoded"] == expected


def test_a_reference_that_cannot_be_resolved_is_named(node: Node) -> None:
    """A value whose schema imports a file no reference names fails with the file's name
    (registered through tidemq's own client, which checks nothing on the way)."""
    registry = tidemq.SchemaRegistry(node.url)
    text = base64.b64encode(invoice_class().DESCRIPTOR.file.serialized_pb).decode()
    schema_id = registry.register_text("orphans-value", text, "PROTOBUF")
    b = node.broker.address
    with tidemq.Admin(b) as admin:
        admin.create_topic("orphans", 1)
    with tidemq.Producer(b) as producer:
        producer.send("orphans", b"\x00" + schema_id.to_bytes(4, "big") + b"\x00\x08\x01")
    consumed = _cli(
        "consume", "orphans", "-n", b, "--from-beginning", "--max-messages", "1",
        "--value-format", "protobuf", "--registry", node.url,
    )  # fmt: skip
    assert consumed.exit_code != 0
    assert "imports shop/money.proto, which none of the schema's references names" in (
        consumed.output
    )
