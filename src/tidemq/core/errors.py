"""The one error table: every failure tidemq reports has a code, an exception class and a
retriability flag. The wire protocol carries the code; clients rebuild the exception with
`for_code()`. Expected outcomes (no new messages, offset out of range on a poll) are results,
not exceptions."""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import ClassVar, TypeVar

__all__ = [
    "AlreadyDelivered",
    "AuthenticationFailed",
    "AuthorizationFailed",
    "BatchTooLarge",
    "BrokerNotAvailable",
    "ConfigError",
    "CorruptRecordError",
    "DataLost",
    "DelayTooLong",
    "DeserializationFailed",
    "DiskFull",
    "ErrorCode",
    "EtcdUnavailable",
    "FencedProducer",
    "InvalidBatch",
    "InvalidRequest",
    "InvalidTopicName",
    "LeaderFenced",
    "MessageTypeMismatch",
    "NotCoordinator",
    "NotEnoughReplicas",
    "NotLeader",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "QueueMoved",
    "QueueNotFound",
    "RequestTimeout",
    "SchemaValidationFailed",
    "StaleGeneration",
    "StorageFailure",
    "StoreClosed",
    "TidemqError",
    "TierUnavailable",
    "TopicAlreadyExists",
    "TopicNotFound",
    "TransactionStateError",
    "UnknownMember",
    "UnknownMessage",
    "UnknownTransaction",
    "Unsupported",
    "WriterFenced",
    "for_code",
]


class ErrorCode(IntEnum):
    UNKNOWN = 1
    INVALID_BATCH = 2
    BATCH_TOO_LARGE = 3
    TOPIC_NOT_FOUND = 4
    QUEUE_NOT_FOUND = 5
    TOPIC_ALREADY_EXISTS = 6
    INVALID_TOPIC_NAME = 7
    CONFIG_ERROR = 8
    OFFSET_OUT_OF_RANGE = 9
    CORRUPT_RECORD = 10
    DISK_FULL = 11
    STORAGE_FAILURE = 12
    OUT_OF_ORDER_SEQUENCE = 13
    FENCED_PRODUCER = 14
    STORE_CLOSED = 15
    STALE_GENERATION = 16
    UNKNOWN_MEMBER = 17
    NOT_COORDINATOR = 18
    INVALID_REQUEST = 19
    REQUEST_TIMEOUT = 20
    BROKER_NOT_AVAILABLE = 21
    UNSUPPORTED = 22
    MESSAGE_TYPE_MISMATCH = 23
    DELAY_TOO_LONG = 24
    UNKNOWN_MESSAGE = 25
    ALREADY_DELIVERED = 26
    UNKNOWN_TRANSACTION = 27
    TRANSACTION_STATE = 28
    AUTHENTICATION_FAILED = 29
    AUTHORIZATION_FAILED = 30
    QUEUE_MOVED = 31
    SCHEMA_VALIDATION_FAILED = 32
    TIER_UNAVAILABLE = 33
    DATA_LOST = 34
    NOT_LEADER = 35
    LEADER_FENCED = 36
    ETCD_UNAVAILABLE = 37
    NOT_ENOUGH_REPLICAS = 38
    WRITER_FENCED = 39
    CHANGE_UNCONFIRMED = 40


class TidemqError(Exception):
    """Base of every tidemq error. `code` goes on the wire; `retriable` tells a client whether
    the same request may succeed later without change."""

    code: ClassVar[ErrorCode] = ErrorCode.UNKNOWN
    retriable: ClassVar[bool] = False


_BY_CODE: dict[ErrorCode, type[TidemqError]] = {ErrorCode.UNKNOWN: TidemqError}
_E = TypeVar("_E", bound=type[TidemqError])


def _error(code: ErrorCode, *, retriable: bool = False) -> Callable[[_E], _E]:
    def register(cls: _E) -> _E:
        assert code not in _BY_CODE, f"error code {code!r} registered twice"
        cls.code = code
        cls.retriable = retriable
        _BY_CODE[code] = cls
        return cls

    return register


def for_code(code: int) -> type[TidemqError]:
    """The exception class for a wire error code (unknown codes map to TidemqError)."""
    try:
        return _BY_CODE[ErrorCode(code)]
    except ValueError:
        return TidemqError


@_error(ErrorCode.INVALID_BATCH)
class InvalidBatch(TidemqError):
    """A batch that is malformed: bad CRC, bad offsets, wrong counts, bad field sizes."""


@_error(ErrorCode.BATCH_TOO_LARGE)
class BatchTooLarge(TidemqError):
    """A batch larger than the configured or format limit."""


@_error(ErrorCode.TOPIC_NOT_FOUND)
class TopicNotFound(TidemqError):
    pass


@_error(ErrorCode.QUEUE_NOT_FOUND)
class QueueNotFound(TidemqError):
    pass


@_error(ErrorCode.TOPIC_ALREADY_EXISTS)
class TopicAlreadyExists(TidemqError):
    pass


@_error(ErrorCode.INVALID_TOPIC_NAME)
class InvalidTopicName(TidemqError, ValueError):
    """A topic name outside the rule of `tidemq.core.names`. Also a ValueError: the client
    raises it at the call for a bad argument, like any other bad value."""


@_error(ErrorCode.CONFIG_ERROR)
class ConfigError(TidemqError):
    """An invalid configuration value; the message names the key."""


@_error(ErrorCode.OFFSET_OUT_OF_RANGE)
class OffsetOutOfRange(TidemqError):
    """An offset outside a queue's stored range: a commit past the queue's end (like
    Kafka's OFFSET_OUT_OF_RANGE), or a consumer position with nowhere to reset to."""


@_error(ErrorCode.CORRUPT_RECORD)
class CorruptRecordError(TidemqError):
    """Bytes on disk or on the wire fail their checksum or structure checks."""


@_error(ErrorCode.DISK_FULL, retriable=True)
class DiskFull(TidemqError):
    """The disk is above its usage watermark or returned ENOSPC; nothing was written.
    Appends resume once space returns."""


@_error(ErrorCode.STORAGE_FAILURE)
class StorageFailure(TidemqError):
    """An I/O error that makes durability unknowable (an fsync failed). The store fences
    itself: every later append and flush fails until it is reopened."""


@_error(ErrorCode.OUT_OF_ORDER_SEQUENCE)
class OutOfOrderSequence(TidemqError):
    """An idempotent producer skipped or reused a sequence number."""


@_error(ErrorCode.FENCED_PRODUCER)
class FencedProducer(TidemqError):
    """A producer epoch older than the newest one seen for that producer id."""


@_error(ErrorCode.STORE_CLOSED)
class StoreClosed(TidemqError):
    pass


@_error(ErrorCode.STALE_GENERATION)
class StaleGeneration(TidemqError):
    """A consumer-group request from a generation that is no longer current: the member
    must take its new assignment (heartbeat) before committing."""


@_error(ErrorCode.UNKNOWN_MEMBER)
class UnknownMember(TidemqError):
    """The member is not (or no longer) in the group: it must join again."""


@_error(ErrorCode.NOT_COORDINATOR, retriable=True)
class NotCoordinator(TidemqError):
    """This broker does not coordinate that group; refresh routes and retry."""


@_error(ErrorCode.INVALID_REQUEST)
class InvalidRequest(TidemqError):
    """A request whose fields are out of range or inconsistent; the message names them."""


@_error(ErrorCode.REQUEST_TIMEOUT, retriable=True)
class RequestTimeout(TidemqError):
    """No answer in time. For a send the outcome is unknown; idempotence makes a retry safe."""


@_error(ErrorCode.BROKER_NOT_AVAILABLE, retriable=True)
class BrokerNotAvailable(TidemqError):
    """No connection to the broker (refused, reset, or shutting down)."""


@_error(ErrorCode.UNSUPPORTED)
class Unsupported(TidemqError):
    """The request is valid but this broker does not support it."""


@_error(ErrorCode.MESSAGE_TYPE_MISMATCH)
class MessageTypeMismatch(InvalidRequest):
    """The topic declares a `message.type` that this message is not (a delayed message to a
    NORMAL topic, a plain one to a TRANSACTION topic, ...)."""


@_error(ErrorCode.DELAY_TOO_LONG)
class DelayTooLong(InvalidRequest):
    """The delivery time is further ahead than the broker's maximum delay. Refused, never
    clamped."""


@_error(ErrorCode.UNKNOWN_MESSAGE)
class UnknownMessage(TidemqError):
    """No message with that id is known to this broker (for cancel: never scheduled here,
    or its schedule was removed)."""


@_error(ErrorCode.ALREADY_DELIVERED)
class AlreadyDelivered(TidemqError):
    """A cancel came after the timer delivered the message (or after an earlier cancel)."""


@_error(ErrorCode.UNKNOWN_TRANSACTION)
class UnknownTransaction(TidemqError):
    """The broker has no transaction with that id: never begun here, or begun before a
    restart without sending anything (begin again), or finished long ago."""


@_error(ErrorCode.TRANSACTION_STATE)
class TransactionStateError(TidemqError):
    """The transaction cannot do that in its state: commit after rollback, rollback after
    commit, a send after the end."""


@_error(ErrorCode.AUTHENTICATION_FAILED)
class AuthenticationFailed(TidemqError):
    """The broker requires authentication (SCRAM-SHA-256) and this connection has not
    passed it: a wrong user name or password (the message never says which), or a request
    sent before authenticating. The broker closes the connection after the answer."""


@_error(ErrorCode.AUTHORIZATION_FAILED)
class AuthorizationFailed(TidemqError):
    """The authenticated principal may not do this (managing users takes a super user)."""


@_error(ErrorCode.QUEUE_MOVED, retriable=True)
class QueueMoved(TidemqError):
    """A static topic's queue (or the offset asked for) is not on this broker, or not
    writable here any more: its write end moved, or is being switched to another broker.
    The client refreshes its routes and tries again."""


@_error(ErrorCode.SCHEMA_VALIDATION_FAILED)
class SchemaValidationFailed(InvalidRequest):
    """A topic with `schema.validation=true` refused a batch: a value not in Confluent's
    wire format, or with a schema id not registered under the topic's subject. The message
    names the message index and the id."""


@_error(ErrorCode.TIER_UNAVAILABLE, retriable=True)
class TierUnavailable(TidemqError):
    """The object store holding an offloaded range (tiered storage) could not be reached
    or answered with an error: the read may succeed later. The message names the store's
    answer."""


@_error(ErrorCode.DATA_LOST)
class DataLost(TidemqError):
    """Messages that were offloaded to the object store are gone from it (a file deleted
    behind the broker's back, or failing its checksum): readers are told, never handed an
    empty range. The message names the offsets and the file."""


@_error(ErrorCode.NOT_LEADER, retriable=True)
class NotLeader(TidemqError):
    """This broker does not lead its replica group: the request needs the group's leader.
    The message names the group and, when known, the current epoch and leader; a client
    refreshes its routes and retries there."""

    def __init__(self, message: str, *, group: str = "", current_epoch: int | None = None):
        super().__init__(message)
        self.group, self.current_epoch = group, current_epoch


@_error(ErrorCode.LEADER_FENCED, retriable=True)
class LeaderFenced(NotLeader):
    """A member that believed it led its group under some epoch found that etcd no longer
    holds it there (its lease expired while it was paused or cut off, or another member
    won a later epoch). It must not acknowledge anything more under that epoch. The
    message names etcd's current epoch and leader; retriable for a client, which retries
    at the new leader."""


@_error(ErrorCode.WRITER_FENCED, retriable=True)
class WriterFenced(NotCoordinator):
    """A change of users or ACL entries made (or tried) under a security writer's term
    that is not the newest: the broker's lease on the writer role ran out (it was paused
    or cut off from the name servers, and another broker may hold a newer term), or the
    tables it carries were written under a term older than the tables already held
    (docs/adr/0020). The message names both terms. Retriable for a client, which asks
    the name servers for the writer again and retries there."""


@_error(ErrorCode.CHANGE_UNCONFIRMED, retriable=True)
class ChangeUnconfirmed(TidemqError):
    """A change of users or ACL entries was made on the security writer, but a majority
    of the name servers did not confirm it under the writer's term in time (the writer
    was deposed meanwhile, or the name servers did not answer): it may yet reach every
    broker, or be dropped in favour of a newer writer's tables (docs/adr/0026). The
    message says why. Retriable: every change is idempotent (a user is set to the keys
    given, an entry added or removed), so the client sends the same request again."""


@_error(ErrorCode.NOT_ENOUGH_REPLICAS, retriable=True)
class NotEnoughReplicas(TidemqError):
    """The replica group has fewer members in sync than `min_insync_replicas`, or did
    not commit the write in time (`ack_timeout_ms`). Refused before the append: nothing
    was written. After it: the record is in the leader's log but not acknowledged; a
    retry of an idempotent producer's batch is answered from it (Kafka's
    NOT_ENOUGH_REPLICAS and NOT_ENOUGH_REPLICAS_AFTER_APPEND)."""


@_error(ErrorCode.ETCD_UNAVAILABLE, retriable=True)
class EtcdUnavailable(TidemqError):
    """etcd (the cluster metadata store of replica groups) did not answer in time or
    refused the connection. The message names the operation, the endpoints and etcd's
    answer. Leadership cannot be confirmed meanwhile, so a leader stops acknowledging."""


class DeserializationFailed(TidemqError):
    """A consumer's `value_deserializer` raised for a message (client side; never on the
    wire). `topic`, `queue`, `offset` name it and `value` holds its bytes; a stream, group
    or broadcast consumer stays at that message, so a poll raises again until a seek
    past it skips it."""

    def __init__(self, message: str, *, topic: str, queue: int, offset: int, value: bytes):
        super().__init__(message)
        self.topic, self.queue, self.offset, self.value = topic, queue, offset, value

    @property
    def position(self) -> tuple[str, int, int]:
        return (self.topic, self.queue, self.offset)
