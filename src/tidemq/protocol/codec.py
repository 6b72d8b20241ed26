"""Commands to frames and back. Pure: no sockets, no event loop.

Errors are turned "remote" at this one input point: bytes that do not decode as the
command their code names raise RemoteProtocolError; an error response becomes the
exception class its code names in the error table (`tidemq.core.errors.for_code`).
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import msgspec

from tidemq.core.errors import TidemqError, for_code
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import REQUESTS, ErrorResponse
from tidemq.protocol.frame import (
    Frame,
    FrameFlags,
    FrameKind,
    LocalProtocolError,
    RemoteProtocolError,
    encode_frame,
)

__all__ = [
    "decode_request",
    "decode_response",
    "encode_error",
    "encode_request",
    "encode_response",
    "encode_server_error",
    "encode_server_request",
    "encode_server_response",
    "error_from_frame",
]

_ENCODER: Final = msgspec.msgpack.Encoder()
_CODE_OF: Final = {req: code for code, (req, _) in REQUESTS.items()}
_REQ_DECODERS: Final = {code: msgspec.msgpack.Decoder(req) for code, (req, _) in REQUESTS.items()}
_RESP_DECODERS: Final = {
    code: msgspec.msgpack.Decoder(resp) for code, (_, resp) in REQUESTS.items()
}
_ERROR_DECODER: Final = msgspec.msgpack.Decoder(ErrorResponse)
#: Error messages are for people; bound them so an error cannot become a large frame.
_MESSAGE_MAX_CHARS: Final = 1000

T = TypeVar("T")


def encode_request(
    request: msgspec.Struct,
    correlation_id: int,
    body: bytes | memoryview = b"",
    *,
    oneway: bool = False,
) -> list[bytes | memoryview]:
    code = _CODE_OF.get(type(request))  # type: ignore[arg-type]
    if code is None:
        raise LocalProtocolError(f"{type(request).__name__} is not a request")
    kind = FrameKind.ONEWAY if oneway else FrameKind.REQUEST
    return encode_frame(kind, code, correlation_id, _ENCODER.encode(request), body)


def encode_server_request(request: msgspec.Struct, correlation_id: int) -> list[bytes | memoryview]:
    """A request the server sends to a client (transaction check-back). Correlation ids of
    server requests are a space of their own, separate from the client's."""
    code = _CODE_OF.get(type(request))  # type: ignore[arg-type]
    if code is None:
        raise LocalProtocolError(f"{type(request).__name__} is not a request")
    return encode_frame(FrameKind.SERVER_REQUEST, code, correlation_id, _ENCODER.encode(request))


def encode_server_response(
    code: int, correlation_id: int, response: msgspec.Struct
) -> list[bytes | memoryview]:
    return encode_frame(FrameKind.SERVER_RESPONSE, code, correlation_id, _ENCODER.encode(response))


def encode_server_error(
    code: int, correlation_id: int, error: TidemqError
) -> list[bytes | memoryview]:
    message = str(error)[:_MESSAGE_MAX_CHARS]
    header = _ENCODER.encode(ErrorResponse(code=int(error.code), message=message))
    return encode_frame(
        FrameKind.SERVER_RESPONSE, code, correlation_id, header, flags=FrameFlags.ERROR
    )


def decode_request(frame: Frame) -> tuple[RequestCode, Any]:
    """The request's code and header. Unknown codes and undecodable headers raise
    RemoteProtocolError (the caller answers with an error and may keep the connection)."""
    try:
        code = RequestCode(frame.code)
    except ValueError:
        raise RemoteProtocolError(f"unknown request code {frame.code}") from None
    try:
        return code, _REQ_DECODERS[code].decode(frame.header)
    # msgspec reports a str that is not valid UTF-8 as UnicodeDecodeError, not DecodeError.
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise RemoteProtocolError(f"bad {code.name} request header: {exc}") from None


def encode_response(
    code: int, correlation_id: int, response: msgspec.Struct, body: bytes | memoryview = b""
) -> list[bytes | memoryview]:
    return encode_frame(FrameKind.RESPONSE, code, correlation_id, _ENCODER.encode(response), body)


def encode_error(code: int, correlation_id: int, error: TidemqError) -> list[bytes | memoryview]:
    message = str(error)[:_MESSAGE_MAX_CHARS]
    header = _ENCODER.encode(ErrorResponse(code=int(error.code), message=message))
    return encode_frame(FrameKind.RESPONSE, code, correlation_id, header, flags=FrameFlags.ERROR)


def error_from_frame(frame: Frame) -> TidemqError:
    try:
        err = _ERROR_DECODER.decode(frame.header)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        return RemoteProtocolError(f"undecodable error response: {exc}")
    return for_code(err.code)(err.message)


def decode_response(frame: Frame, expected: type[T]) -> T:
    """The response header, or raise the error the broker answered with."""
    if frame.is_error:
        raise error_from_frame(frame)
    try:
        decoder = _RESP_DECODERS[RequestCode(frame.code)]
        result = decoder.decode(frame.header)
    except (ValueError, KeyError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RemoteProtocolError(f"bad response for code {frame.code}: {exc}") from None
    if not isinstance(result, expected):
        raise RemoteProtocolError(
            f"response for code {frame.code} is {type(result).__name__}, "
            f"expected {expected.__name__}"
        )
    return result
