"""The sync `Producer.send` fast path: one message sent and answered on the caller's thread.

Handing every sync send to the client loop's thread and back costs about as much CPU as
the rest of the send (two wake-ups and a cross-thread future: docs/design/performance.md,
issue 15). When nothing of this producer is on its way, a sync `send` instead writes the
request on a blocking socket of its own and reads the answer there, as redis-py does.

* Order: a send takes this path only when every earlier send of the producer has been
  answered (`track` counts what the loop holds; a blocking send is over when it returns),
  its topic's route is known and trusted, and nothing waits for that topic's route. So
  nothing of the same producer can be between it and the broker; a later send, on either
  path, starts after it ended.
* Idempotence: the links use a producer id of their own per broker (the loop's senders
  number their batches under theirs), with their own sequence per queue. The broker keeps
  both apart; per queue, only one of the two has a batch on its way at any time.
* Failure: a lost connection or a timeout after the write leaves the outcome unknown, and
  a retriable refusal is retried: either way the message goes to the queue's loop sender
  with the stamp (producer id, epoch, sequence) it was written with, so a resend of a
  message that was in fact stored gets its first offset back instead of a second copy. A
  refusal for good raises, as the loop's sender would. The link is closed after any
  failure and its producer id is not used again. Failing to connect or to get a producer
  id sends the message the loop's way, which reconnects, retries or reports.
* Bounds: every socket read and write is limited by the request timeout (at most the
  delivery timeout), kernel-side (`SO_RCVTIMEO`, `SO_SNDTIMEO`): one syscall per read.
* Not used with TLS or a login (the loop's connections do those), `linger_ms`, `acks=0`,
  nor for delayed sends; nor while another thread is in a blocking send of this producer
  (that thread's send and this one are concurrent: either order is right).
"""

from __future__ import annotations

import concurrent.futures
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

from tidemq.client._loop import in_client_thread
from tidemq.client.queue_sender import Stamp
from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.errors import TidemqError
from tidemq.core.message import Receipt
from tidemq.net.client import split_address
from tidemq.protocol.codec import decode_response, encode_request
from tidemq.protocol.commands import (
    InitProducerRequest,
    InitProducerResponse,
    ProduceRequest,
    ProduceResponse,
)
from tidemq.protocol.frame import Frame, FrameDecoder, FrameKind

if TYPE_CHECKING:
    from tidemq.client.producer import AsyncProducer

__all__ = ["BlockingSends"]

_READ_BYTES = 65536
#: A request whose body is smaller is joined and written with one `send`; a larger one is
#: written as it is (`sendmsg`), not copied.
_JOIN_BELOW = 65536
#: A link unused for this long is checked (one peek) before a send: the broker closes
#: idle connections, and writing into a closed one makes the outcome unknown.
_IDLE_CHECK_S = 1.0
_TIMEVAL = struct.Struct("@ll")


class _Unknown(Exception):
    """The request may have been written: its outcome is unknown."""


class _Link:
    """A blocking connection to one broker, with this producer's id there and the next
    sequence per queue. Used by one thread at a time (the sends' lock)."""

    def __init__(self, address: str, broker: str, sock: socket.socket, max_frame: int) -> None:
        self.address = address
        self.broker = broker
        self.sock = sock
        self.decoder = FrameDecoder(max_frame)
        self.corr = 0
        self.producer_id = -1
        self.epoch = -1
        self.sequences: dict[tuple[str, int], int] = {}
        #: When the last request was written (monotonic s).
        self.used = time.monotonic()

    def closed_by_peer(self) -> bool:
        """Whether the broker has closed the connection (its idle timeout, a restart):
        one non-blocking peek, so that a send after a pause does not write into a dead
        connection and end with an unknown outcome."""
        try:
            return not self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False  # open, nothing to read
        except OSError:
            return True

    def call(self, request: Any, body: bytes = b"", *, timeout_s: float) -> Frame:
        """Write a request, read its answer within `timeout_s` (each socket call is
        bounded by the link's SO_*TIMEO; this bounds an answer that trickles in). _Unknown
        for a lost connection or a timeout after (part of) the request may have been
        written."""
        self.corr = corr = (self.corr + 1) & 0x7FFFFFFF or 1
        buffers = encode_request(request, corr, body)
        sock = self.sock
        self.used = now = time.monotonic()
        deadline = now + timeout_s
        try:
            if len(body) < _JOIN_BELOW:
                # One small buffer: a plain send costs less than a vectored one.
                data = buffers[0] if len(buffers) == 1 else b"".join(buffers)
                sent, total = sock.send(data), len(data)
            else:
                sent, total = sock.sendmsg(buffers), sum(map(len, buffers))
            if sent < total:
                sock.sendall(b"".join(buffers)[sent:])
            while True:
                data = sock.recv(_READ_BYTES)
                if not data:
                    raise _Unknown(f"connection to {self.address} closed by the broker")
                for frame in self.decoder.feed(data):
                    if frame.kind is FrameKind.RESPONSE and frame.correlation_id == corr:
                        return frame
                    if frame.kind is FrameKind.RESPONSE and frame.correlation_id == 0:
                        return frame  # the broker refuses the connection (an error frame)
                # Part of an answer (rare: an answer is one small segment).
                if time.monotonic() > deadline:
                    raise _Unknown(f"no whole answer from {self.address} in {timeout_s:.3g} s")
        except TidemqError as exc:  # an undecodable stream
            raise _Unknown(str(exc)) from exc
        except BlockingIOError as exc:  # SO_RCVTIMEO / SO_SNDTIMEO ran out
            raise _Unknown(f"no answer from {self.address} in time") from exc
        except OSError as exc:
            raise _Unknown(f"connection to {self.address} lost: {exc}") from exc

    def close(self) -> None:
        self.sock.close()

    def __del__(self) -> None:
        # A producer never closed (a short script's) must not leave its socket to the
        # garbage collector, which warns about it.
        self.sock.close()


class BlockingSends:
    """The blocking fast path of one sync producer (see the module's docstring)."""

    def __init__(self, producer: AsyncProducer) -> None:
        self._p = producer
        config = producer.config
        client = producer.cluster.config
        self._enabled = (
            config.linger_ms == 0
            and not config.acks_none
            and client.ssl_context is None
            and client.username is None
        )
        self._idempotent = config.idempotent
        self._timeout_s = min(client.request_timeout_ms / 1000, config.delivery_timeout_s)
        self._connect_s = min(client.connect_timeout_ms / 1000, self._timeout_s)
        self._max_frame = client.max_frame_bytes
        #: Held by the thread in a blocking send; others go the loop's way meanwhile.
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        #: Sends (and batches) handed to the loop and not answered yet.
        self._outstanding = 0
        self._links: dict[str, _Link] = {}
        #: Addresses not to try before a time (monotonic s): connecting failed.
        self._shunned: dict[str, float] = {}
        self._closed = False

    def track(self, future: concurrent.futures.Future[Any]) -> None:
        """A send handed to the loop: no blocking send until its future is done."""
        with self._count_lock:
            self._outstanding += 1
        future.add_done_callback(self._done)

    def _done(self, _: object) -> None:
        with self._count_lock:
            self._outstanding -= 1

    def send(
        self, topic: str, record: MessageRecord, key: bytes | None, queue: int | None
    ) -> Receipt | concurrent.futures.Future[Receipt] | None:
        """The receipt; or a future, for a message handed to the loop with its stamp after
        an unknown outcome (tracked already); or None: send it the loop's way."""
        if not self._enabled or self._outstanding or self._closed or in_client_thread():
            return None  # (on the client loop, the loop's way refuses the call)
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._outstanding or self._closed:  # handed over since the first look
                return None
            return self._send_locked(topic, record, key, queue)
        finally:
            self._lock.release()

    def _send_locked(
        self, topic: str, record: MessageRecord, key: bytes | None, queue: int | None
    ) -> Receipt | concurrent.futures.Future[Receipt] | None:
        target = self._p.direct_target(topic, key, queue)
        if target is None:
            return None
        q, address = target
        link = self._link(address)
        if link is None:
            return None
        config = self._p.config
        payload = encode_batch(
            [record], codec=config.codec, max_batch_bytes=config.max_request_bytes
        )
        seq = link.sequences.get((topic, q), 0) if self._idempotent else -1
        request = ProduceRequest(
            topic=topic, queue=q, producer_id=link.producer_id, epoch=link.epoch, base_sequence=seq
        )
        deadline = time.monotonic() + config.delivery_timeout_s
        try:
            response = decode_response(
                link.call(request, payload, timeout_s=self._timeout_s), ProduceResponse
            )
        except _Unknown:
            return self._hand_over(link, topic, q, payload, seq, deadline)
        except TidemqError as exc:
            if exc.retriable:
                # Refused for now (a sync flush that failed may have stored it, though):
                # the loop's sender retries it under the same stamp.
                return self._hand_over(link, topic, q, payload, seq, deadline)
            # Refused for good, as the loop's sender would report it; the link's
            # sequence has a gap now, so its producer id is not used again.
            self._drop(link)
            raise
        if self._idempotent:
            link.sequences[(topic, q)] = seq + 1
        return Receipt(topic, q, response.base_offset)

    def _hand_over(  # noqa: PLR0917
        self, link: _Link, topic: str, queue: int, payload: bytes, seq: int, deadline: float
    ) -> concurrent.futures.Future[Receipt]:
        """The message to the queue's loop sender, with the stamp it was written with."""
        self._drop(link)
        stamp = Stamp(link.address, link.broker, link.producer_id, link.epoch, seq)
        future: concurrent.futures.Future[Receipt] = concurrent.futures.Future()
        self.track(future)
        self._p.resend_stamped_threadsafe(future, topic, queue, payload, stamp, deadline)
        return future

    def _link(self, address: str) -> _Link | None:
        broker = self._p.broker_at(address)
        link = self._links.get(address)
        if link is not None and link.broker == broker:
            if time.monotonic() - link.used < _IDLE_CHECK_S or not link.closed_by_peer():
                return link
            self._drop(link)
            link = None
        if link is not None:  # another broker serves there now: start over
            self._drop(link)
        if self._shunned.get(address, 0.0) > time.monotonic():
            return None
        try:
            link = self._connect(address, broker)
        except (OSError, ValueError, _Unknown, TidemqError):
            # Unreachable (or no producer id): the loop's way finds out, reconnects and
            # reports; this path tries again a little later.
            self._shunned[address] = time.monotonic() + 1.0
            return None
        self._links[address] = link
        return link

    def _connect(self, address: str, broker: str) -> _Link:
        host, port = split_address(address)
        sock = socket.create_connection((host, port), timeout=self._connect_s)
        try:
            sock.settimeout(None)  # blocking; the kernel bounds each call (SO_*TIMEO)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            seconds = max(self._timeout_s, 0.001)
            timeval = _TIMEVAL.pack(int(seconds), int((seconds % 1) * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
            link = _Link(address, broker, sock, self._max_frame)
            if self._idempotent:
                answer = decode_response(
                    link.call(InitProducerRequest(), timeout_s=self._timeout_s),
                    InitProducerResponse,
                )
                link.producer_id, link.epoch = answer.producer_id, answer.epoch
        except BaseException:
            sock.close()
            raise
        return link

    def _drop(self, link: _Link) -> None:
        """Forget a link and its producer id: the next blocking send starts a fresh one
        (a sequence that may have a gap, or an unknown outcome, is never continued)."""
        if self._links.get(link.address) is link:
            del self._links[link.address]
        link.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for link in list(self._links.values()):
                self._drop(link)
