"""A faulty HTTP proxy for tests: put it between tidemq and an S3 API server (moto) and
make the object store fail on demand.

The proxy listens on a free port of 127.0.0.1 and forwards every request to `upstream`
unchanged (method, path, headers with the proxy's Host, body), on threads. `mode` says
what happens to the next requests:

* ``PASS``: forwarded, answered as upstream answers.
* ``ERROR``: not forwarded; answered ``500 InternalError`` (S3's XML).
* ``HANG``: not answered until the mode changes or `hang_limit_s` passes (a store that
  stalls: the client's timeout must fire).
* ``REFUSE``: the connection is closed without an answer.
* ``LOSE_ACK``: forwarded (the store does it), then answered ``500`` (the client does not
  know it was done: a lost acknowledgement).

`requests` counts what reached the proxy, by method. Only for tests: nothing in tidemq
imports this module.
"""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import urlsplit

__all__ = ["FaultMode", "FaultyHttpProxy"]

_ERROR_BODY: Final = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>injected by FaultyHttpProxy</Message></Error>"
)
#: Headers that belong to one connection, not forwarded.
_HOP: Final = frozenset({"connection", "keep-alive", "transfer-encoding", "proxy-connection"})


class FaultMode(Enum):
    PASS = "pass"
    ERROR = "error"
    HANG = "hang"
    REFUSE = "refuse"
    LOSE_ACK = "lose_ack"


class FaultyHttpProxy:
    def __init__(self, upstream: str, *, hang_limit_s: float = 30.0) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.mode = FaultMode.PASS
        self._only: frozenset[str] | None = None
        self.requests: Counter[str] = Counter()
        self._hang_limit_s = hang_limit_s
        self._changed = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: tests read their own output

            def _handle(self) -> None:
                try:
                    proxy.handle(self)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up (its timeout)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def start(self) -> FaultyHttpProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.set_mode(FaultMode.PASS)  # release hanging requests
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def set_mode(self, mode: FaultMode, *, only: frozenset[str] | None = None) -> None:
        """`only`: the HTTP methods the fault applies to (others pass); None: all."""
        self.mode = mode
        self._only = only
        self._changed.set()
        self._changed = threading.Event()

    def __enter__(self) -> FaultyHttpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ one request

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        self.requests[req.command] += 1
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else b""
        mode = self.mode
        if self._only is not None and req.command not in self._only:
            mode = FaultMode.PASS
        if mode is FaultMode.HANG:
            self._changed.wait(self._hang_limit_s)
            mode = FaultMode.REFUSE if self.mode is FaultMode.HANG else FaultMode.PASS
        if mode is FaultMode.REFUSE:
            req.close_connection = True
            return
        if mode is FaultMode.ERROR:
            self._answer(req, 500, [("Content-Type", "application/xml")], _ERROR_BODY)
            return
        status, headers, data = self._forward(req, body)
        if mode is FaultMode.LOSE_ACK:
            self._answer(req, 500, [("Content-Type", "application/xml")], _ERROR_BODY)
            return
        self._answer(req, status, headers, data)

    def _forward(
        self, req: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self._upstream, timeout=60)
        try:
            headers = {k: v for k, v in req.headers.items() if k.lower() not in _HOP}
            conn.request(req.command, req.path, body=body or None, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            kept = [(k, v) for k, v in answer.getheaders() if k.lower() not in _HOP]
            return answer.status, kept, data
        finally:
            conn.close()

    @staticmethod
    def _answer(
        req: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]], data: bytes
    ) -> None:
        req.send_response(status)
        for k, v in headers:
            if k.lower() != "content-length":
                req.send_header(k, v)
        given = {k.lower(): v for k, v in headers}.get("content-length")
        # A HEAD answer tells the object's length without sending it.
        head = req.command == "HEAD" and given is not None
        req.send_header("Content-Length", given if head and given else str(len(data)))
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(data)
