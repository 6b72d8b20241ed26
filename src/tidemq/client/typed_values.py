"""Consumers' `value_deserializer`: values turned into objects as messages are handed out.

`value_deserializer(data: bytes) -> object` is called once per message with a value
(tombstones stay None), e.g. `tidemq.AvroDeserializer(registry, Order)`. A message whose
value it cannot turn is not handed out as if it were fine: the consumer reports
`DeserializationFailed` naming it, and the messages of the other queues still arrive
(see each consumer for where it leaves the failed one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tidemq.core.errors import DeserializationFailed
from tidemq.core.message import Message

__all__ = ["ValueDeserializer", "deserialize_values"]

#: data -> value (any type; the consumer's type parameter).
ValueDeserializer = Callable[[bytes], Any]

M = TypeVar("M", bound=Message[Any])


def deserialize_values(
    messages: Sequence[M], deserializer: ValueDeserializer, *, per_queue: bool = True
) -> tuple[list[M], dict[tuple[str, int, int], DeserializationFailed]]:
    """The messages with their values deserialized, in order, and the failures by
    (topic, queue, offset). `per_queue` (streams): a queue's first failure ends it, its
    later messages are left out (they come again once the consumer is back at the failed
    one); else (leased messages) each message stands alone."""
    out: list[M] = []
    failed: dict[tuple[str, int, int], DeserializationFailed] = {}
    stopped: set[tuple[str, int]] = set()
    for m in messages:
        tq = (m.topic, m.queue)
        if tq in stopped:
            continue
        if m.value is None:
            out.append(m)
            continue
        raw = bytes(m.value)
        try:
            value = deserializer(raw)
        except Exception as exc:
            error = DeserializationFailed(
                f"the value_deserializer failed for {m.topic}/{m.queue}@{m.offset}: "
                f"{type(exc).__name__}: {exc}",
                topic=m.topic,
                queue=m.queue,
                offset=m.offset,
                value=raw,
            )
            error.__cause__ = exc
            failed[(m.topic, m.queue, m.offset)] = error
            if per_queue:
                stopped.add(tq)
            continue
        out.append(dataclasses.replace(m, value=value))
    return out, failed
