"""Distinct integer types so that a queue offset is never passed where a log position belongs."""

from __future__ import annotations

from typing import NewType

__all__ = ["LogPosition", "QueueId", "QueueOffset", "TopicId"]

#: Byte position in a broker's commit log (monotone across segments).
LogPosition = NewType("LogPosition", int)
#: Dense per-queue message offset: 0, 1, 2, ...
QueueOffset = NewType("QueueOffset", int)
#: Queue number inside a topic.
QueueId = NewType("QueueId", int)
#: Topic id assigned by the broker's metadata; never reused after a delete.
TopicId = NewType("TopicId", int)
