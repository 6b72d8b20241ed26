"""The registry's vocabulary: schema types, compatibility levels, modes, references, and
its errors with Confluent's error codes (clients branch on them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum

__all__ = [
    "Compatibility",
    "ErrorCode",
    "Mode",
    "Reference",
    "RegistryError",
    "SchemaType",
]


class SchemaType(StrEnum):
    AVRO = "AVRO"
    JSON = "JSON"
    PROTOBUF = "PROTOBUF"


class Compatibility(StrEnum):
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        """New readers must read data written with the old schemas."""
        return self.value.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        """Old readers must read data written with the new schema."""
        return self.value.startswith(("FORWARD", "FULL"))


class Mode(StrEnum):
    READWRITE = "READWRITE"
    READONLY = "READONLY"
    READONLY_OVERRIDE = "READONLY_OVERRIDE"
    IMPORT = "IMPORT"


class ErrorCode(IntEnum):
    """Confluent Schema Registry's error codes (the HTTP status is the first three
    digits, or the code itself when it has three)."""

    SUBJECT_NOT_FOUND = 40401
    VERSION_NOT_FOUND = 40402
    SCHEMA_NOT_FOUND = 40403
    SUBJECT_SOFT_DELETED = 40404
    SUBJECT_NOT_SOFT_DELETED = 40405
    VERSION_SOFT_DELETED = 40406
    VERSION_NOT_SOFT_DELETED = 40407
    SUBJECT_COMPATIBILITY_NOT_CONFIGURED = 40408
    SUBJECT_MODE_NOT_CONFIGURED = 40409
    INCOMPATIBLE_SCHEMA = 409
    INVALID_SCHEMA = 42201
    INVALID_VERSION = 42202
    INVALID_COMPATIBILITY_LEVEL = 42203
    INVALID_MODE = 42204
    OPERATION_NOT_PERMITTED = 42205
    REFERENCE_EXISTS = 42206
    STORE_ERROR = 50001
    OPERATION_TIMEOUT = 50002

    @property
    def http_status(self) -> int:
        return self.value if self.value < 1000 else self.value // 100


class RegistryError(Exception):
    """A request the registry refuses, with Confluent's error code and message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def body(self) -> dict[str, object]:
        return {"error_code": int(self.code), "message": self.message}


@dataclass(frozen=True, slots=True)
class Reference:
    """A schema that this one uses by `name` (Avro: a full type name; JSON: a $ref URL;
    Protobuf: an import path): version `version` of `subject`."""

    name: str
    subject: str
    version: int
