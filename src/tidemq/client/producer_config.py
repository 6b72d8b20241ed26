"""The producer's settings, checked once when the producer is built."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tidemq.core import limits
from tidemq.core.batch import Codec

__all__ = ["CODECS", "ProducerConfig"]

CODECS = {"none": Codec.NONE, "zstd": Codec.ZSTD, "lz4": Codec.LZ4}


@dataclass(frozen=True, kw_only=True, slots=True)
class ProducerConfig:
    """What `AsyncProducer(...)` takes, validated (each error names the argument)."""

    #: How long a send waits for more sends to the same queue before its batch leaves.
    linger_ms: float = 0
    #: A batch is sealed once its messages reach this many bytes (approximately)...
    batch_bytes: int = 1 << 20
    #: ... or this many messages.
    batch_messages: int = 4096
    #: Stamp batches with (producer id, epoch, sequence) so that retries never duplicate.
    idempotent: bool = True
    #: "all" (or -1): wait for the broker's answer; 0: fire and forget.
    acks: str | int = "all"
    compression: str = "none"
    max_in_flight_per_queue: int = 32
    #: The longest any send may take from the call to its receipt or error.
    delivery_timeout_ms: int = 120_000
    #: The largest encoded batch sent (keep it at or below the broker's frame limit).
    max_request_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        if self.acks not in ("all", -1, 0) or isinstance(self.acks, bool):
            raise ValueError(f"acks must be 'all', -1 or 0, got {self.acks!r}")
        if self.acks_none and self.idempotent:
            raise ValueError(
                "acks=0 gets no answers, so nothing can be retried or deduplicated: "
                "pass idempotent=False with it"
            )
        _check_int("max_request_bytes", self.max_request_bytes, 1, limits.MAX_BATCH_BYTES)
        _check_int("batch_bytes", self.batch_bytes, 1, None)
        _check_int("batch_messages", self.batch_messages, 1, limits.MAX_BATCH_MESSAGES)
        _check_int(
            "max_in_flight_per_queue",
            self.max_in_flight_per_queue,
            1,
            limits.MAX_IN_FLIGHT_PER_QUEUE,
        )
        _check_int("delivery_timeout_ms", self.delivery_timeout_ms, 1, None)
        if (
            isinstance(self.linger_ms, bool)
            or not isinstance(self.linger_ms, int | float)
            or not math.isfinite(self.linger_ms)
            or not 0 <= self.linger_ms <= limits.MAX_LINGER_MS
        ):
            raise ValueError(f"linger_ms must be 0..{limits.MAX_LINGER_MS}, got {self.linger_ms!r}")
        if not isinstance(self.idempotent, bool):
            raise TypeError(f"idempotent must be a bool, got {type(self.idempotent).__name__}")
        if self.compression not in CODECS:
            raise ValueError(
                f"compression must be one of {', '.join(CODECS)}, got {self.compression!r}"
            )

    @property
    def acks_none(self) -> bool:
        return self.acks == 0

    @property
    def codec(self) -> Codec:
        return CODECS[self.compression]

    @property
    def delivery_timeout_s(self) -> float:
        return self.delivery_timeout_ms / 1000


def _check_int(name: str, value: object, low: int, high: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")
