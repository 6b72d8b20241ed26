"""`finish_in_thread`: a cancelled caller waits for its thread's call to end, and what
the call opened meanwhile is discarded (closed), never left behind."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from tidemq.broker.thread_calls import finish_in_thread

#: Bound on every wait for the thread (the test fails rather than hang).
WAIT_S = 10.0


class Opened:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_result_is_returned() -> None:
    assert asyncio.run(finish_in_thread(lambda: 42)) == 42


def test_an_error_reaches_the_caller() -> None:
    def fail() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        asyncio.run(finish_in_thread(fail))


def _gated(
    result: Opened | BaseException,
) -> tuple[threading.Event, threading.Event, Callable[[], Opened]]:
    """A call that says it started, then waits for `release` and returns or raises."""
    started, release = threading.Event(), threading.Event()

    def call() -> Opened:
        started.set()
        assert release.wait(WAIT_S)
        if isinstance(result, BaseException):
            raise result
        return result

    return started, release, call


@pytest.mark.parametrize("outcome", ["opened", "failed"])
def test_a_cancelled_caller_waits_for_the_call_and_discards_its_result(outcome: str) -> None:
    opened = Opened()
    started, release, call = _gated(opened if outcome == "opened" else OSError("no"))

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(finish_in_thread(call, discard=Opened.close))
        assert await asyncio.to_thread(started.wait, WAIT_S)
        task.cancel()
        # The cancellation is held while the call runs (a bound, not a sleep: the task
        # cannot end before `release`, however long this waits).
        done, _ = await asyncio.wait([task], timeout=0.05)
        assert not done
        assert not opened.closed
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT_S)

    asyncio.run(main())
    assert opened.closed is (outcome == "opened")
