"""Broker-side schema validation (topic config schema.validation=true) on a real
`tidemq server`: values framed with a schema id registered under `<topic>-value` pass,
including what confluent-kafka's AvroSerializer writes; an unregistered id, a value not
in the wire format, or one registered under another subject is refused, naming the
message; topics without the setting take anything; a broker without the registry refuses
rather than let values through unchecked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from tests.support.server_process import server_process

import tidemq
from tidemq import aio
from tidemq.core.errors import ConfigError, SchemaValidationFailed, Unsupported
from tidemq.schema.wire import frame

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop

pytestmark = pytest.mark.timeout(120)

POINT = {
    "type": "record",
    "name": "Point",
    "fields": [{"name": "x", "type": "long"}, {"name": "y", "type": "long"}],
}


def test_a_validated_topic_takes_only_registered_schemas(tmp_path: Path) -> None:
    with server_process(tmp_path, ["--http-port", "0"]) as server:
        url = f"http://{server.http_address}"
        with tidemq.Admin(server.address) as admin:
            admin.create_topic("points", 1, config={"schema.validation": "true"})
            admin.create_topic("loose", 1)
            admin.create_topic("other", 1)
            with pytest.raises(ConfigError, match=r"schema\.validation must be true or false"):
                admin.create_topic("typo", 1, config={"schema.validation": "yes"})
        registry = tidemq.SchemaRegistry(url)
        points_id = registry.register("points-value", POINT, "AVRO")
        other_id = registry.register("other-value", {**POINT, "name": "Other"}, "AVRO")
        with SchemaRegistryClient({"url": url}) as client:
            confluent = AvroSerializer(client, json.dumps(POINT))
            written = confluent(
                {"x": 1, "y": 2}, SerializationContext("points", MessageField.VALUE)
            )
        assert written is not None
        with tidemq.Producer(server.address) as producer:
            producer.send("points", written)
            producer.send_batch("points", [frame(points_id, b"\x02\x04")] * 3)
            with pytest.raises(SchemaValidationFailed, match=r"message 2 .* schema id 999"):
                producer.send_batch(
                    "points", [frame(points_id, b"\x02\x04")] * 2 + [frame(999, b"")]
                )
            with pytest.raises(
                SchemaValidationFailed, match="not registered under subject 'points-value'"
            ):
                producer.send("points", frame(other_id, b"\x02\x04"))
            with pytest.raises(SchemaValidationFailed, match=r"message 0 .* magic byte"):
                producer.send("points", b"plain bytes")
            producer.send("loose", b"plain bytes")  # no validation: anything goes
        # A schema registered just now (the broker's registry reads it on a miss).
        z = {"name": "z", "type": "long", "default": 0}
        newer = registry.register("points-value", {**POINT, "fields": [*POINT["fields"], z]})
        with tidemq.Producer(server.address) as producer:
            producer.send("points", frame(newer, b"\x02\x04\x00"))
        with tidemq.StreamConsumer(server.address, start="earliest") as consumer:
            consumer.assign([("points", 0)])
            got: list[tidemq.Message] = []
            for _ in range(50):
                got += consumer.poll(timeout_ms=100)
                if len(got) >= 5:
                    break
        assert len(got) == 5  # the refused batches left nothing behind


def test_a_broker_without_the_registry_refuses_validated_topics(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic("points", 1, config={"schema.validation": "true"})
        async with aio.Producer(broker.address) as producer:
            with pytest.raises(Unsupported, match="without the schema registry"):
                await producer.send("points", frame(1, b""))

    loop.run(main())
