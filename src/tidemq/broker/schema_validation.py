"""Broker-side schema validation: a topic with `schema.validation=true` accepts a batch
only if every value is in Confluent's wire format with a schema id registered under the
topic's subject (`<topic>-value`, the topic name strategy). Keys are not checked;
tombstones (no value) pass. Topics without the setting never reach this module.

The registry lives in the node's HTTP listener (it reads `_schemas` through the client),
above the broker's layer; the node hands the broker its check (`SchemaCheck`). A broker
running without the listener refuses sends to such topics rather than let them through
unchecked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tidemq.core.batch import binary_values, decode_columns
from tidemq.core.errors import RequestTimeout, SchemaValidationFailed, Unsupported
from tidemq.schema.model import RegistryError
from tidemq.schema.wire import WireFormatError, unframe

__all__ = ["SchemaCheck", "schema_ids", "subject_of", "validate_batch"]

#: (subject, schema ids) -> those of the ids not registered under the subject.
SchemaCheck = Callable[[str, set[int]], Awaitable[set[int]]]


def subject_of(topic: str) -> str:
    return f"{topic}-value"


def schema_ids(topic: str, payload: bytes | memoryview) -> dict[int, int]:
    """The schema ids of a batch's values, each with the index of its first message;
    SchemaValidationFailed for a value that is not framed with an id."""
    ids: dict[int, int] = {}
    for i, value in enumerate(binary_values(decode_columns(payload, verify_crc=False).value)):
        if value is None:
            continue  # a tombstone
        try:
            framed = unframe(value)
        except WireFormatError as exc:
            raise SchemaValidationFailed(
                f"message {i} of the batch to {topic!r} (schema.validation=true): {exc}"
            ) from None
        if framed.schema_id < 0:
            raise SchemaValidationFailed(
                f"message {i} of the batch to {topic!r} is framed with a schema GUID; this "
                "registry issues ids (magic byte 0 and a 4-byte id)"
            )
        ids.setdefault(framed.schema_id, i)
    return ids


async def validate_batch(
    topic: str, payload: bytes | memoryview, check: SchemaCheck | None
) -> None:
    """Refuse the batch unless every value names a schema registered for the topic."""
    ids = schema_ids(topic, payload)
    if not ids:
        return
    if check is None:
        raise Unsupported(
            f"topic {topic!r} has schema.validation=true, but this broker runs without the "
            "schema registry (its HTTP listener is off: http.port=-1), so it cannot check "
            "the values"
        )
    subject = subject_of(topic)
    try:
        unknown = await check(subject, set(ids))
    except RegistryError as exc:
        raise RequestTimeout(
            f"the schema registry could not check the batch to {topic!r}: {exc}"
        ) from None
    if unknown:
        first = min(unknown, key=ids.__getitem__)
        raise SchemaValidationFailed(
            f"message {ids[first]} of the batch to {topic!r} has schema id {first}, which is "
            f"not registered under subject {subject!r} (the topic has schema.validation=true)"
        )
