"""Push consumption (asyncio): `PushConsumer` receives for you and calls a handler per
message, with bounded concurrency, retries with backoff, and dead letters.

    async def handle(msg: ReceivedMessage) -> None:
        ...  # return: done (acknowledged); raise: retried later

    async with PushConsumer(bootstrap, "billing", {"orders": "paid"}, handle,
                            max_concurrency=16, retry_policy=RetryPolicy.exponential()):
        ...

It is built on pop consumption (`SimpleConsumer`): a loop leases at most as many messages
as there are free handler slots, so never more than `max_concurrency` handlers run and no
message waits leased while nobody works on it. Each handler's outcome decides the lease:

* it returns: the message is acknowledged;
* it raises, or runs longer than `handler_timeout`: the message is nacked with
  `delay = retry_policy.delay(attempt)` and the error as the reason. The broker counts the
  attempt and delivers the message again after the delay, with `delivery_attempt` + 1:
  on a plain topic through the group's retry topic `%RETRY%<group>`, on a FIFO topic in
  place. The nack of the `max_attempts`-th delivery moves it to `%DLQ%<group>` at once,
  with its origin topic, queue, offset, id, attempts and this last error in `tidemq.dlq.*`
  headers;
* it runs longer than the invisible duration: the lease is extended (change of invisible
  duration) before it runs out, for as long as the handler runs, so a slow handler is not
  raced by a second delivery.

Retries go through `%RETRY%<group>` as in RocketMQ, with one difference: RocketMQ copies
the failed message to the retry topic and then acks the original, and a crash between the
two delivers it twice. Here the copy is a single timer record that also finishes the
original lease (docs/adr/0007-retries-through-a-retry-topic-in-one-write.md), so there is
no such window. The message keeps its id, topic, queue and offset on every delivery (the
copy's `tidemq.retry.*` headers carry them), and the backoff may be any number of seconds
(no fixed delay levels) up to the broker's longest invisible duration (12 h by default).

A plain (non-async) handler runs on a worker thread of the consumer's own pool (sized to
`max_concurrency`); a coroutine function runs on the event loop. A timed-out async handler
is cancelled; a timed-out plain handler cannot be stopped, so its thread runs on while the
message is retried: make handlers idempotent (every message queue delivers at least once).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from tidemq.client import checks
from tidemq.client.cluster import ClientConfig
from tidemq.client.simple_consumer import (
    MAX_INVISIBLE_S,
    AsyncReceivedMessage,
    AsyncSimpleConsumer,
    Filter,
)
from tidemq.core.errors import TidemqError

__all__ = [
    "DEFAULT_RETRY_POLICY",
    "AsyncPushConsumer",
    "Handler",
    "HandlerTimeout",
    "RetryPolicy",
]

log = logging.getLogger(__name__)

#: A handler: a coroutine function (awaited on the loop) or a plain function (run on a
#: worker thread). What it returns is ignored; raising means "retry".
Handler = Callable[[AsyncReceivedMessage[Any]], Awaitable[object] | object]

#: RocketMQ's retry schedule for concurrent consumption (delay levels 3 to 18), seconds.
_ROCKETMQ_SCHEDULE: Final = (
    10.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 420.0, 480.0, 540.0, 600.0,
    1200.0, 1800.0, 3600.0, 7200.0,
)  # fmt: skip
#: Messages asked for in one receive, at most.
_MAX_BATCH: Final = 32
#: A failure's reason (recorded in the DLQ's tidemq.dlq.error header) is cut to this.
_REASON_CHARS: Final = 240
#: Bounds of one receive's wait on the broker: not 0, which would poll in a tight loop.
_MIN_AWAIT_S: Final = 0.05
_MAX_AWAIT_S: Final = 30.0
#: A handler timeout shorter than this is a unit mistake (milliseconds meant).
_MIN_HANDLER_TIMEOUT_S: Final = 0.001
#: Backoff after a failed receive (broker down, topic missing), doubling up to the max.
_RECEIVE_BACKOFF_S: Final = (0.1, 5.0)


def _check_delay(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    value = float(value)
    if math.isnan(value) or not 0.0 <= value <= MAX_INVISIBLE_S:
        raise ValueError(f"{what} must be 0 to {MAX_INVISIBLE_S:g} seconds, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long a failed message waits before its next delivery.

    `delay(attempt)` takes the delivery attempt that just failed (1 for the first) and
    returns seconds. Delays are at most 12 h (43200 s), the broker's longest lease. Make
    one with:

    * `RetryPolicy.default()`: RocketMQ's schedule 10 s, 30 s, 1 m, 2 m, 3 m, ... 10 m,
      20 m, 30 m, 1 h, 2 h, then 2 h for every later attempt;
    * `RetryPolicy.exponential(initial=5.0, multiplier=2.0, maximum=7200.0)`:
      initial * multiplier ** (attempt - 1), capped at `maximum`;
    * `RetryPolicy.fixed(seconds)`: the same delay every time;
    * `RetryPolicy.schedule([d1, d2, ...])`: d1 after the first failure, d2 after the
      second, ..., and the last one after every later failure.
    """

    #: A schedule (fixed: one delay); empty for an exponential policy.
    delays: tuple[float, ...] = ()
    initial: float = 0.0
    multiplier: float = 1.0
    maximum: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "delays", tuple(self.delays))
        if self.delays:
            for i, d in enumerate(self.delays):
                _check_delay(d, f"delays[{i}]")
            return
        initial = _check_delay(self.initial, "initial")
        maximum = _check_delay(self.maximum, "maximum")
        if initial <= 0:
            raise ValueError(f"initial must be > 0 seconds, got {initial!r}")
        multiplier = self.multiplier
        if isinstance(multiplier, bool) or not isinstance(multiplier, int | float):
            raise TypeError(f"multiplier must be a number, got {multiplier!r}")
        if math.isnan(multiplier) or not 1.0 <= multiplier <= 1000.0:
            raise ValueError(f"multiplier must be 1 to 1000, got {multiplier!r}")
        if maximum < initial:
            raise ValueError(f"maximum ({maximum:g} s) must be >= initial ({initial:g} s)")

    @classmethod
    def default(cls) -> RetryPolicy:
        """RocketMQ's schedule: 10 s, 30 s, 1 m, 2 m, 3 m, 4 m, 5 m, 6 m, 7 m, 8 m, 9 m,
        10 m, 20 m, 30 m, 1 h, 2 h (then 2 h)."""
        return cls(delays=_ROCKETMQ_SCHEDULE)

    @classmethod
    def exponential(
        cls, initial: float = 5.0, multiplier: float = 2.0, maximum: float = 7200.0
    ) -> RetryPolicy:
        """initial * multiplier ** (attempt - 1) seconds, at most `maximum`."""
        return cls(
            initial=_check_delay(initial, "initial"),
            multiplier=multiplier,
            maximum=_check_delay(maximum, "maximum"),
        )

    @classmethod
    def fixed(cls, seconds: float) -> RetryPolicy:
        """The same delay after every failure."""
        return cls(delays=(_check_delay(seconds, "seconds"),))

    @classmethod
    def schedule(cls, delays: Iterable[float]) -> RetryPolicy:
        """delays[0] after the first failure, delays[1] after the second, ...; the last
        one after every later failure."""
        if isinstance(delays, str | bytes) or not isinstance(delays, Iterable):
            raise TypeError(f"delays must be a sequence of seconds, got {delays!r}")
        checked = tuple(_check_delay(d, f"delays[{i}]") for i, d in enumerate(delays))
        if not checked:
            raise ValueError("delays must not be empty")
        return cls(delays=checked)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after delivery attempt `attempt` (1-based) failed."""
        if isinstance(attempt, bool) or not isinstance(attempt, int):
            raise TypeError(f"attempt must be an int, got {attempt!r}")
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        if self.delays:
            return self.delays[min(attempt, len(self.delays)) - 1]
        steps = attempt - 1
        if self.multiplier == 1.0:
            return self.initial
        # Past the cap, the cap; without computing a power that would overflow.
        if steps * math.log(self.multiplier) >= math.log(self.maximum / self.initial):
            return self.maximum
        return min(self.maximum, self.initial * self.multiplier**steps)

    def __repr__(self) -> str:
        if self.delays == _ROCKETMQ_SCHEDULE:
            return "RetryPolicy.default()"
        if len(self.delays) == 1:
            return f"RetryPolicy.fixed({self.delays[0]:g})"
        if self.delays:
            return f"RetryPolicy.schedule([{', '.join(f'{d:g}' for d in self.delays)}])"
        return (
            f"RetryPolicy.exponential(initial={self.initial:g}, "
            f"multiplier={self.multiplier:g}, maximum={self.maximum:g})"
        )


DEFAULT_RETRY_POLICY: Final = RetryPolicy.default()


class HandlerTimeout(TimeoutError):
    """A handler ran longer than the push consumer's `handler_timeout`."""


def _reason(exc: BaseException) -> str:
    text = repr(exc)
    if len(text) > _REASON_CHARS:
        text = text[: _REASON_CHARS - 3] + "..."
    return text


def _is_async(handler: Callable[..., object]) -> bool:
    # A coroutine function, or an object whose __call__ is one.
    call = getattr(handler, "__call__", None)  # noqa: B004 - not a test of callability
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


class _Lease:
    """One message being handled: its newest handle, and when the lease runs out
    (local monotonic time, conservatively early)."""

    __slots__ = ("expires", "message")

    def __init__(self, message: AsyncReceivedMessage, expires: float) -> None:
        self.message = message
        self.expires = expires


class AsyncPushConsumer:
    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9876",
        group: str = "",
        subscriptions: Mapping[str, Filter] | None = None,
        handler: Handler | None = None,
        *,
        max_concurrency: int = 16,
        max_attempts: int = 16,
        on_exhausted: str = "dead-letter",
        retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
        invisible_duration: float = 60.0,
        handler_timeout: float | None = None,
        await_duration: float = 1.0,
        client_config: ClientConfig | None = None,
        value_deserializer: Callable[[bytes], Any] | None = None,
    ) -> None:
        """`subscriptions`: {topic: filter} (a tag expression or `Sql92(...)`).
        `max_concurrency`: handlers running at once, at most. `max_attempts`: deliveries
        before the dead-letter topic, or before the message is suspended with
        `on_exhausted="suspend"` (see `SimpleConsumer`). `invisible_duration`: each
        lease's length (seconds, 1 s to 12 h), extended while a handler runs longer.
        `handler_timeout`: seconds a handler may run before it counts as failed (None: no
        limit). `await_duration`: how long one receive waits on the broker for messages;
        `close` waits for the receive in flight, so this bounds how long closing takes.
        `value_deserializer`: the handler gets messages with deserialized values; one it
        cannot turn never reaches the handler (see `SimpleConsumer`)."""
        if handler is None or not callable(handler):
            raise TypeError("a PushConsumer needs a handler: a function of one message")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
            raise TypeError(f"max_concurrency must be an int, got {max_concurrency!r}")
        if not 1 <= max_concurrency <= 1024:
            raise ValueError(f"max_concurrency must be 1..1024, got {max_concurrency}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
            raise TypeError(f"max_attempts must be an int, got {max_attempts!r}")
        if not isinstance(retry_policy, RetryPolicy):
            raise TypeError(f"retry_policy must be a RetryPolicy, got {retry_policy!r}")
        if handler_timeout is not None:
            handler_timeout = checks.check_seconds(
                handler_timeout, "handler_timeout", minimum=_MIN_HANDLER_TIMEOUT_S
            )
        checks.check_seconds(
            await_duration, "await_duration", minimum=_MIN_AWAIT_S, maximum=_MAX_AWAIT_S
        )
        # Group, subscriptions, max_attempts and invisible_duration are checked by the
        # simple consumer (ValueError naming the argument).
        self._consumer: AsyncSimpleConsumer[Any] = AsyncSimpleConsumer(
            bootstrap,
            group,
            subscriptions,
            invisible_duration=invisible_duration,
            max_attempts=max_attempts,
            on_exhausted=on_exhausted,
            await_duration=await_duration,
            client_config=client_config,
            value_deserializer=value_deserializer,
        )
        self.group = group
        self._handler = handler
        self._async_handler = _is_async(handler)
        self._max = max_concurrency
        self._max_attempts = max_attempts
        self._on_exhausted = on_exhausted
        self._retry = retry_policy
        self._invisible_s = float(invisible_duration)
        self._timeout_s = None if handler_timeout is None else float(handler_timeout)
        self._running: set[asyncio.Task[None]] = set()
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closing = False
        self._closed = False

    @property
    def max_concurrency(self) -> int:
        return self._max

    @property
    def retry_policy(self) -> RetryPolicy:
        return self._retry

    @property
    def running(self) -> bool:
        """Started and not closing."""
        return self._loop_task is not None and not self._closing

    async def start(self) -> None:
        """Check the subscriptions against the cluster (TidemqError if no broker serves
        them), then receive and handle messages in the background until `close`."""
        if self._closing:
            raise TidemqError("the push consumer is closed")
        if self._loop_task is not None:
            return
        await self._consumer._brokers()
        self._wake = asyncio.Event()
        if not self._async_handler:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._max, thread_name_prefix=f"tidemq-push-{self.group}"
            )
        self._loop_task = asyncio.get_running_loop().create_task(
            self._receive_loop(), name=f"tidemq-push-{self.group}"
        )

    async def close(self) -> None:
        """Stop receiving, wait for the receive in flight (messages it brings are released,
        uncounted) and for the running handlers to finish and settle, then disconnect."""
        if self._closed:
            return
        self._closing = True
        if self._wake is not None:
            self._wake.set()
        try:
            if self._loop_task is not None:
                await self._loop_task
            while self._running:
                await asyncio.gather(*list(self._running), return_exceptions=True)
        finally:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=False)
            await self._consumer.close()

    async def __aenter__(self) -> AsyncPushConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ receiving

    async def _receive_loop(self) -> None:
        assert self._wake is not None
        backoff = _RECEIVE_BACKOFF_S[0]
        while not self._closing:
            free = self._max - len(self._running)
            if free <= 0:
                self._wake.clear()
                if len(self._running) >= self._max and not self._closing:
                    await self._wake.wait()
                continue
            try:
                batch = await self._consumer.receive(min(free, _MAX_BATCH))
            except Exception as exc:  # the loop must go on: log, back off, try again
                log.warning("push consumer %s: receive failed: %r", self.group, exc)
                await self._pause(backoff)
                backoff = min(backoff * 2, _RECEIVE_BACKOFF_S[1])
                continue
            backoff = _RECEIVE_BACKOFF_S[0]
            received = time.monotonic()
            if self._closing:
                await self._release(batch)
                break
            # With several brokers a receive may bring one message per broker, more than
            # asked for: the extra ones go back at once, uncounted.
            for msg in batch[:free]:
                task = asyncio.get_running_loop().create_task(self._process(msg, received))
                self._running.add(task)
                task.add_done_callback(self._done)
            await self._release(batch[free:])

    async def _pause(self, seconds: float) -> None:
        assert self._wake is not None
        self._wake.clear()
        if not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), seconds)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if self._wake is not None:
            self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("push consumer %s: %r", self.group, task.exception())

    async def _release(self, batch: list[AsyncReceivedMessage]) -> None:
        for msg in batch:
            try:
                await msg.release()
            except TidemqError as exc:
                log.warning("push consumer %s: release failed: %s", self.group, exc)

    # ------------------------------------------------------------------ handling

    async def _process(self, msg: AsyncReceivedMessage, received: float) -> None:
        wall_left = max(0.0, msg.invisible_until_ms / 1000 - time.time())
        lease = _Lease(msg, received + min(self._invisible_s, wall_left))
        finished = asyncio.Event()
        keeper = asyncio.get_running_loop().create_task(self._keep_lease(lease, finished))
        error: BaseException | None = None
        try:
            await self._run_handler(msg)
        except asyncio.CancelledError:
            finished.set()
            keeper.cancel()
            raise
        except Exception as exc:  # any failure of the handler means "retry"
            error = exc
        finally:
            finished.set()
        await keeper  # a change of invisible duration in flight ends first: newest handle
        await self._settle(lease.message, error)

    async def _run_handler(self, msg: AsyncReceivedMessage) -> None:
        if self._timeout_s is None:
            await self._call(msg)
            return
        try:
            async with asyncio.timeout(self._timeout_s) as scope:
                await self._call(msg)
        except TimeoutError:
            if scope.expired():
                raise HandlerTimeout(
                    f"handler ran longer than handler_timeout ({self._timeout_s:g} s)"
                ) from None
            raise

    async def _call(self, msg: AsyncReceivedMessage) -> None:
        if self._async_handler:
            result = self._handler(msg)
            assert inspect.isawaitable(result)
            await result
            return
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        await loop.run_in_executor(self._executor, functools.partial(ctx.run, self._handler, msg))

    async def _keep_lease(self, lease: _Lease, finished: asyncio.Event) -> None:
        """Extend the lease before it runs out, while the handler runs."""
        margin = min(self._invisible_s / 2, 10.0)
        while not finished.is_set():
            wait = lease.expires - margin - time.monotonic()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), wait)
                continue
            sent = time.monotonic()
            try:
                lease.message = await lease.message.change_invisible_duration(self._invisible_s)
            except TidemqError as exc:
                log.warning(
                    "push consumer %s: could not extend the lease of %s: %s",
                    self.group,
                    lease.message.message_id,
                    exc,
                )
                return
            lease.expires = sent + self._invisible_s

    async def _settle(self, msg: AsyncReceivedMessage, error: BaseException | None) -> None:
        try:
            if error is None:
                await msg.ack()
                return
            attempt = msg.delivery_attempt
            last = attempt >= self._max_attempts
            delay = 0.0 if last else self._retry.delay(attempt)
            log.info(
                "push consumer %s: %s failed (attempt %d of %d)%s: %s",
                self.group,
                msg.message_id,
                attempt,
                self._max_attempts,
                f" -> {self._on_exhausted}" if last else f", retry in {delay:g} s",
                _reason(error),
            )
            await msg.nack(delay=delay, reason=_reason(error))
        except TidemqError as exc:
            # A stale handle (the lease ran out and the message went elsewhere) or a broker
            # that is gone: the message comes back when its lease runs out.
            log.warning(
                "push consumer %s: could not %s %s: %s",
                self.group,
                "ack" if error is None else "nack",
                msg.message_id,
                exc,
            )
