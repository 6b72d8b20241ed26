"""Headers of a message that a consumer's nack moved to its group's retry topic.

A retried message is a copy in `%RETRY%<group>` (the broker's pop service writes it, the
timer delivers it when its retry delay is over). Its headers say where it was first
stored, so consumers see the topic, queue, offset and id it had, and how many deliveries
it has had. A copy of a copy keeps the first location.

=========================  =================================================================
header                     value (UTF-8 text)
=========================  =================================================================
``tidemq.retry.topic``     topic where the message was first stored
``tidemq.retry.queue``     its queue there
``tidemq.retry.offset``    its offset there
``tidemq.retry.origin``    "queue:offset:topic" of the internal record its id comes from,
                           for a delayed or transactional message (absent otherwise)
``tidemq.retry.message_id`` its id (for people; the client computes it from the above)
``tidemq.retry.attempts``  deliveries before this copy was made
``tidemq.retry.error``     the reason the consumer gave with its last nack
=========================  =================================================================
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "RETRY_ATTEMPTS_HEADER",
    "RETRY_ERROR_HEADER",
    "RETRY_HEADER_PREFIX",
    "RETRY_ID_HEADER",
    "RETRY_OFFSET_HEADER",
    "RETRY_ORIGIN_HEADER",
    "RETRY_PREFIX",
    "RETRY_QUEUE_HEADER",
    "RETRY_TOPIC_HEADER",
    "format_retry_origin",
    "parse_retry_origin",
    "retry_topic",
]

RETRY_PREFIX: Final = "%RETRY%"
RETRY_HEADER_PREFIX: Final = "tidemq.retry."
RETRY_TOPIC_HEADER: Final = "tidemq.retry.topic"
RETRY_QUEUE_HEADER: Final = "tidemq.retry.queue"
RETRY_OFFSET_HEADER: Final = "tidemq.retry.offset"
RETRY_ORIGIN_HEADER: Final = "tidemq.retry.origin"
RETRY_ID_HEADER: Final = "tidemq.retry.message_id"
RETRY_ATTEMPTS_HEADER: Final = "tidemq.retry.attempts"
RETRY_ERROR_HEADER: Final = "tidemq.retry.error"


def retry_topic(group: str) -> str:
    return f"{RETRY_PREFIX}{group}"


def format_retry_origin(origin: tuple[str, int, int]) -> str:
    topic, queue, offset = origin
    return f"{queue}:{offset}:{topic}"  # the topic last: it is the part of any length


def parse_retry_origin(text: str | None) -> tuple[str, int, int] | None:
    """The `tidemq.retry.origin` header as (topic, queue, offset); None if absent or bad."""
    if not text:
        return None
    parts = text.split(":", 2)
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2]:
        return None
    return parts[2], int(parts[0]), int(parts[1])
