"""The pop lease table against a model, on a manual clock.

A hypothesis state machine drives a real broker (in process, over 127.0.0.1, with a
`ManualClock`) with random receives, acks, nacks, releases, changes of invisible duration,
clock moves and broker restarts, on a plain and on a FIFO topic. The model says, for every
message, whether it is deliverable now, leased (to which handle, until when) or finished,
and how many attempts it has had. Every answer is checked against it: a receive returns
exactly min(max, deliverable) messages, each deliverable, with the right attempt; FIFO
groups never have two messages out at once and come in order; handles are honoured only
while current; a message that used its attempts goes to the dead-letter topic instead.
On the plain topic a nack moves the message through the timer to `%RETRY%g`: the machine
waits for the timer to deliver what is due, then the message must come back with the same
id, topic and attempt count; a nack of its last attempt dead-letters (or suspends) it at
once.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.client.simple_consumer import AsyncReceivedMessage, AsyncSimpleConsumer
from tidemq.core.errors import InvalidRequest
from tidemq.store.config import StoreConfig
from tidemq.testing.clock import ManualClock

MAX_ATTEMPTS = 3
INVISIBLE_MS = 1_000


@dataclass
class _Msg:
    group: bytes
    attempts: int = 0
    deadline: int = 0  # deliverable when <= now and not leased-and-current
    leased: bool = False
    handle: str = ""
    done: bool = False
    dead: bool = False
    suspended: bool = False
    message_id: str = ""


class PopMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self._runner = asyncio.Runner()
        self.clock = ManualClock()
        self.config = BrokerConfig(
            port=0,
            store=StoreConfig(data_dir=Path(self._tmp.name)),
            service_checkpoint_interval_ms=3_600_000,  # replay of the op log does the work
        )
        self.broker: Broker | None = None
        self.consumer: AsyncSimpleConsumer | None = None
        self.msgs: dict[bytes, _Msg] = {}
        self.handles: list[AsyncReceivedMessage] = []
        self.fifo = False
        self.suspend = False

    def _run(self, coro: Any) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(30):
                return await coro

        return self._runner.run(bounded())

    def _start(self) -> None:
        self.broker = Broker(self.config, clock=self.clock, embedded_nameserver=True)
        address = self._run(self.broker.start())
        # Restarts reuse the port: handles received before a restart name this address.
        self.config = replace(self.config, port=int(address.rsplit(":", 1)[1]))
        self.consumer = AsyncSimpleConsumer(
            address,
            "g",
            {"t": "*"},
            await_duration=0.0,
            max_attempts=MAX_ATTEMPTS,
            on_exhausted="suspend" if self.suspend else "dead-letter",
        )

    def _stop(self) -> None:
        assert self.broker is not None
        assert self.consumer is not None
        self._run(self.consumer.close())
        self._run(self.broker.stop())

    @initialize(
        fifo=st.booleans(),
        suspend=st.booleans(),
        groups=st.lists(st.sampled_from([b"a", b"b", b"c"]), min_size=1, max_size=10),
    )
    def setup(self, fifo: bool, suspend: bool, groups: list[bytes]) -> None:
        self.fifo, self.suspend = fifo, suspend
        self._start()
        assert self.broker is not None

        async def produce() -> None:
            async with aio.Admin(self.broker.address) as admin:  # type: ignore[union-attr]
                await admin.create_topic("t", 1, message_type="FIFO" if fifo else "MIXED")
            async with aio.Producer(self.broker.address) as producer:  # type: ignore[union-attr]
                for i, g in enumerate(groups):
                    value = b"%s-%d" % (g, i)
                    await producer.send("t", value, key=g, queue=0)
                    self.msgs[value] = _Msg(g)

        self._run(produce())

    def teardown(self) -> None:
        if self.broker is not None:
            self._stop()
        self._runner.close()
        self._tmp.cleanup()

    # ------------------------------------------------------------------ model helpers

    def _deliverable(self) -> list[bytes]:
        now = self.clock.now_ms()
        out = []
        busy: set[bytes] = set()
        for value, m in self.msgs.items():  # in offset order (dict keeps insertion order)
            if m.done:
                continue
            first_of_group = m.group not in busy
            if self.fifo:
                busy.add(m.group)  # a suspended message holds its group too
                if not first_of_group:
                    continue
            if m.suspended:
                continue
            if m.deadline <= now and not (m.leased and m.deadline > now):
                out.append(value)
        return out

    def _wait_for_due_retries(self) -> None:
        """Nacked messages of the plain topic come back through the timer: wait until it
        has delivered every retry that is due (it runs on its own, in real time)."""
        assert self.broker is not None
        now = self.clock.now_ms()

        async def wait() -> None:
            async with aio.Admin(self.broker.address) as admin:  # type: ignore[union-attr]
                for _ in range(500):
                    status = await admin.timer_status()
                    if all(t.next_due_ms > now for t in status.topics):
                        return
                    await asyncio.sleep(0.01)
            raise AssertionError("the timer did not deliver the retries that are due")

        self._run(wait())

    def _expire_dead(self) -> None:
        """The broker dead-letters (or suspends), at a receive, expired messages out of
        attempts; a suspended message's handles are stale."""
        now = self.clock.now_ms()
        for m in self.msgs.values():
            if m.done or m.suspended or m.attempts < MAX_ATTEMPTS or m.deadline > now:
                continue
            m.leased, m.handle = False, ""
            if self.suspend:
                m.suspended = True
            else:
                m.done = m.dead = True

    # ------------------------------------------------------------------ rules

    @rule(n=st.integers(1, 5))
    def receive(self, n: int) -> None:
        assert self.consumer is not None
        self._wait_for_due_retries()
        self._expire_dead()
        deliverable = self._deliverable()
        got = self._run(self.consumer.receive(n, invisible_duration=INVISIBLE_MS / 1000))
        values = [m.value or b"" for m in got]
        assert len(values) == min(n, len(deliverable)), (values, deliverable)
        assert set(values) <= set(deliverable), (values, deliverable)
        if self.fifo:
            groups = [self.msgs[v].group for v in values]
            assert len(groups) == len(set(groups))
        now = self.clock.now_ms()
        for m in got:
            model = self.msgs[m.value or b""]
            model.attempts += 1
            assert m.delivery_attempt == model.attempts
            assert m.topic == "t"
            if model.message_id:  # a retried message keeps its id
                assert m.message_id == model.message_id
            model.leased, model.deadline, model.handle = True, now + INVISIBLE_MS, m.handle
            model.message_id = m.message_id
            self.handles.append(m)

    def _settle(self, msg: AsyncReceivedMessage, call: Any) -> bool:
        """Run `call`; True if the broker accepted it. The model says whether it should."""
        model = self.msgs[msg.value or b""]
        current = not model.done and model.handle == msg.handle
        try:
            self._run(call)
        except InvalidRequest:
            assert not current, f"refused a current handle for {msg.value!r}"
            return False
        assert current, f"accepted a stale handle for {msg.value!r}"
        return True

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        assert self.consumer is not None
        msg = data.draw(st.sampled_from(self.handles))
        if self._settle(msg, self.consumer.ack(msg)):
            model = self.msgs[msg.value or b""]
            model.done, model.leased = True, False

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), delay_ms=st.integers(0, 2_000), release=st.booleans())
    def nack(self, data: st.DataObject, delay_ms: int, release: bool) -> None:
        assert self.consumer is not None
        msg = data.draw(st.sampled_from(self.handles))
        call = (
            self.consumer.release(msg)
            if release
            else self.consumer.nack(msg, delay=delay_ms / 1000)
        )
        if self._settle(msg, call):
            model = self.msgs[msg.value or b""]
            model.leased, model.handle = False, ""  # the handle is stale from now on
            if not release and not self.fifo and model.attempts >= MAX_ATTEMPTS:
                # The last attempt: not retried, dead-lettered (or suspended) now.
                model.suspended = self.suspend
                model.done = model.dead = not self.suspend
                return
            model.deadline = self.clock.now_ms() + (0 if release else delay_ms)
            if release:
                model.attempts -= 1

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), seconds=st.integers(1, 3))
    def change(self, data: st.DataObject, seconds: int) -> None:
        assert self.consumer is not None
        msg = data.draw(st.sampled_from(self.handles))
        model = self.msgs[msg.value or b""]
        current = not model.done and model.handle == msg.handle
        try:
            new = self._run(self.consumer.change_invisible_duration(msg, float(seconds)))
        except InvalidRequest:
            assert not current
            return
        assert current
        model.handle, model.deadline = new.handle, self.clock.now_ms() + seconds * 1000
        self.handles.append(new)

    @rule(ms=st.sampled_from([0, 300, 999, 1_000, 1_500, 2_500]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        now = self.clock.now_ms()
        for m in self.msgs.values():
            if m.leased and m.deadline <= now:
                m.leased = False  # the lease ran out: deliverable again, handle kept

    @precondition(lambda self: any(m.message_id for m in self.msgs.values()))
    @rule(data=st.data(), dead_letter=st.booleans())
    def resume(self, data: st.DataObject, dead_letter: bool) -> None:
        """An operator resumes a message: accepted exactly when the model has it suspended,
        and the broker's list of suspended messages is the model's."""
        assert self.broker is not None
        value = data.draw(st.sampled_from([v for v, m in self.msgs.items() if m.message_id]))
        model = self.msgs[value]

        async def call() -> list[str]:
            async with aio.Admin(self.broker.address) as admin:  # type: ignore[union-attr]
                listed = [s.message_id for q in await admin.pop_status("g") for s in q.suspended]
                try:
                    await admin.resume(
                        "g", model.message_id, action="dead-letter" if dead_letter else "retry"
                    )
                except InvalidRequest:
                    assert not model.suspended, f"refused to resume suspended {value!r}"
                    return listed
                assert model.suspended, f"resumed {value!r}, which is not suspended"
                return listed

        listed = self._run(call())
        assert sorted(listed) == sorted(m.message_id for m in self.msgs.values() if m.suspended)
        if model.suspended:
            model.suspended = False
            if dead_letter:
                model.done = model.dead = True
            else:
                model.attempts, model.deadline = 0, 0

    @rule()
    def restart(self) -> None:
        self._stop()
        self._start()

    @invariant()
    def nothing_is_lost(self) -> None:
        # Every message is finished, leased, or waiting: none vanished from the model.
        assert all(m.done or m.attempts >= 0 for m in self.msgs.values())


PopMachine.TestCase.settings = settings(
    max_examples=10,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_pop_leases_follow_the_model = pytest.mark.timeout(300)(PopMachine.TestCase)
