"""A Spark Python worker that a test can kill with SIGKILL in the middle of a task.

Spark starts it in place of `pyspark.worker` (`spark.python.worker.module=spark_task_gate`,
with `spark.python.use.daemon=false`: the daemon only runs modules named `pyspark*`, and
without it each worker is a process of its own that the JVM started). It runs Spark's
worker unchanged, with one difference: the task's output stream is gated. When the
directory named by `TIDEMQ_TASK_GATE` holds a file `armed`, the first attempt (attempt 0)
of a task to write output claims it, atomically (`armed` renamed to
`claimed-<pid>-<task attempt id>`), and then waits before its first byte reaches the JVM:
the task has done its work (an archive task has staged its files) and Spark has not seen
its result. The test sees the claim, kills the process, writes `killed-<task attempt id>`
and arms the gate again. A task whose attempt was killed never claims again: not its
other Python workers (a task with a source read and `mapInArrow` runs two), whose
failure would be the same task failure, and not its retries, which are attempts > 0.
Spark runs the task again (the session needs `local[N,F]` with F > 1 failures allowed),
so the job always finishes. A worker not killed within `HOLD_S` goes on.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import IO, Any, Final

__all__ = ["ARMED", "CLAIMED_PREFIX", "GATE_ENV", "HOLD_S", "KILLED_PREFIX", "main"]

GATE_ENV: Final = "TIDEMQ_TASK_GATE"
ARMED: Final = "armed"
CLAIMED_PREFIX: Final = "claimed-"
KILLED_PREFIX: Final = "killed-"
#: How long a claiming worker waits for its kill before it goes on (the test then fails
#: on its kill count, not on a hang).
HOLD_S: Final = 120.0


class _GatedOutput:
    """The worker's output file: the first write of each task attempt passes the gate."""

    def __init__(self, out: IO[bytes], gate: Path) -> None:
        self._out = out
        self._gate = gate
        self._checked: int | None = None

    def _pass_gate(self) -> None:
        from pyspark import TaskContext  # noqa: PLC0415 - inside the worker

        context = TaskContext.get()
        if context is None or context.taskAttemptId() == self._checked:
            return
        task = self._checked = context.taskAttemptId()
        if context.attemptNumber() != 0 or (self._gate / f"{KILLED_PREFIX}{task}").exists():
            return
        claim = f"{CLAIMED_PREFIX}{os.getpid()}-{task}"
        try:
            os.rename(self._gate / ARMED, self._gate / claim)
        except FileNotFoundError:
            return  # not armed, or another task claimed it
        threading.Event().wait(HOLD_S)  # for the SIGKILL

    def write(self, data: Any) -> int:
        self._pass_gate()
        return self._out.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)


def main() -> None:
    from pyspark.worker import main as worker_main  # noqa: PLC0415 - Spark's worker
    from pyspark.worker_util import get_sock_file_to_executor  # noqa: PLC0415

    gate = Path(os.environ[GATE_ENV])
    with get_sock_file_to_executor() as sock_file:
        worker_main(sock_file, _GatedOutput(sock_file, gate))


if __name__ == "__main__":
    main()
