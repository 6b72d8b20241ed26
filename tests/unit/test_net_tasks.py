"""cancel_and_wait: a stopped task's cancellation is expected, the caller's own is not.

CI once saw a replication test take exactly its 120 s bound and pass: the producer's
`close()`, cancelled by the test's timeout, was awaiting its cancelled refresher inside
`suppress(CancelledError)`, which swallowed the cancellation meant for `close()` itself.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import TypeGuard

import pytest

from tidemq.net.tasks import cancel_and_wait, completes_when_cancelled

SRC = Path(__file__).resolve().parents[2] / "src" / "tidemq"


async def _forever() -> None:
    await asyncio.Event().wait()


async def _slow_to_stop(release: asyncio.Event, stopping: asyncio.Event) -> None:
    """A task that, cancelled, still needs `release` before it ends (a flush, a close)."""
    try:
        await asyncio.Event().wait()
    finally:
        stopping.set()
        await release.wait()


def test_the_stopped_tasks_cancellation_does_not_propagate() -> None:
    async def run() -> bool:
        task = asyncio.ensure_future(_forever())
        await asyncio.sleep(0)
        await cancel_and_wait(task, None)
        return task.cancelled()

    assert asyncio.run(run())


def test_the_callers_own_cancellation_propagates() -> None:
    async def run() -> None:
        release, stopping = asyncio.Event(), asyncio.Event()
        task = asyncio.ensure_future(_slow_to_stop(release, stopping))
        await asyncio.sleep(0)
        closer = asyncio.ensure_future(cancel_and_wait(task))
        await stopping.wait()  # the task is cancelled and still stopping: closer waits
        closer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closer
        release.set()
        await asyncio.wait([task])

    asyncio.run(run())


def test_a_timeout_around_it_fires() -> None:
    async def run() -> None:
        release, stopping = asyncio.Event(), asyncio.Event()
        task = asyncio.ensure_future(_slow_to_stop(release, stopping))
        await asyncio.sleep(0)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await cancel_and_wait(task)
        release.set()
        await asyncio.wait([task])

    asyncio.run(run())


def test_errors_propagate_after_every_task_ended_unless_ignored() -> None:
    async def fails() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise LookupError("on the way out")

    async def run() -> None:
        first, second = asyncio.ensure_future(fails()), asyncio.ensure_future(_forever())
        await asyncio.sleep(0)
        with pytest.raises(LookupError, match="on the way out"):
            await cancel_and_wait(first, second)
        assert second.cancelled()
        third = asyncio.ensure_future(fails())
        await asyncio.sleep(0)
        await cancel_and_wait(third, ignore=(LookupError,))

    asyncio.run(run())


def _suppresses_cancellation(node: ast.AST) -> TypeGuard[ast.Call]:
    if not isinstance(node, ast.Call) or not node.args:
        return False
    name = ast.unparse(node.func)
    return name.endswith("suppress") and any(
        ast.unparse(a).endswith("CancelledError") for a in node.args
    )


def test_no_module_suppresses_cancelled_error() -> None:
    """The whole class: `suppress(CancelledError)` cannot tell whose cancellation it
    swallows; `cancel_and_wait` (or `asyncio.wait`) can."""
    offenders = [
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path in sorted(SRC.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if _suppresses_cancellation(node)
    ]
    assert offenders == []


def test_cleanup_in_a_task_cancelled_earlier_still_waits() -> None:
    """A task that caught its cancellation and cleans up has cancelling() above zero;
    its waits must still wait (replica members stop their tasks so when stepping down)."""

    async def cleaner(done: list[bool]) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped = asyncio.ensure_future(_forever())
            await asyncio.sleep(0)
            await cancel_and_wait(stopped)
            done.append(stopped.cancelled())
            raise

    async def run() -> list[bool]:
        done: list[bool] = []
        task = asyncio.ensure_future(cleaner(done))
        await asyncio.sleep(0)
        await cancel_and_wait(task)
        return done

    assert asyncio.run(run()) == [True]


class _Resource:
    """A stop() with steps after its wait, like a member closing its store."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.release = asyncio.Event()
        self.closed = False

    @completes_when_cancelled
    async def stop(self, task: asyncio.Task[None]) -> str:
        self.stopping.set()
        await cancel_and_wait(task)
        self.closed = True
        return "stopped"


def test_a_cancelled_cleanup_runs_to_its_end_then_the_cancellation_propagates() -> None:
    async def run() -> bool:
        resource = _Resource()
        task = asyncio.ensure_future(_slow_to_stop(resource.release, asyncio.Event()))
        await asyncio.sleep(0)
        stopper = asyncio.ensure_future(resource.stop(task))
        await resource.stopping.wait()
        stopper.cancel()
        await asyncio.sleep(0)
        assert not stopper.done()  # still waiting for its body
        resource.release.set()
        with pytest.raises(asyncio.CancelledError):
            await stopper
        return resource.closed

    assert asyncio.run(run())


def test_an_uncancelled_cleanup_returns_its_result() -> None:
    async def run() -> str:
        task = asyncio.ensure_future(_forever())
        await asyncio.sleep(0)
        return await _Resource().stop(task)

    assert asyncio.run(run()) == "stopped"
