"""One line out of the pages Spark and Py4J put in an exception (cli/pipeline_common.py)."""

from __future__ import annotations

from tidemq.cli.pipeline_common import spark_error_message

_FOREACH_BATCH = """[STREAM_FAILED] Query [id = 4d08, runId = b9e4] terminated with exception: \
[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach \
batch sink. Reason: An exception was raised by the Python Proxy. Return Message: Traceback (most \
recent call last):
  File "/usr/lib/python3.11/pathlib.py", line 1116, in mkdir
    os.mkdir(self, mode)
FileNotFoundError: [Errno 2] No such file or directory: '/proc/x/out'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/venv/site-packages/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  [Previous line repeated 1 more time]
  File "/usr/lib/python3.11/pathlib.py", line 1116, in mkdir
    os.mkdir(self, mode)
FileNotFoundError: [Errno 2] No such file or directory: '/proc/x'
 SQLSTATE: 39000 SQLSTATE: XXKST
=== Streaming Query ===
Identifier: tidemq-archive-4b56 [id = 4d08, runId = b9e4]
Current Committed Offsets: {}
"""

_WORKER = """[STREAM_FAILED] Query terminated with exception: Job aborted due to stage failure: \
Task 0 in stage 1.0 failed 1 times, most recent failure: Lost task 0.0 (TID 1) \
(127.0.0.1 executor driver): org.apache.spark.api.python.PythonException: Traceback (most \
recent call last):
  File "/src/tidemq/spark/pipelines/db_sync.py", line 80, in parse
    raise ChangeEventError(f"topic {topic!r} queue {queue} offset {offset}: not a change event")
tidemq.spark.pipelines.db_sync.ChangeEventError: topic 'cdc' queue 0 offset 20: not a change event

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(...)
"""

_JAVA = """An error occurred while calling o58.start.
: org.apache.spark.SparkException: Job aborted.
\tat org.apache.spark.sql.execution.X(X.scala:1)
Caused by: py4j.Py4JException: wrapper
Caused by: java.io.IOException: Mkdirs failed to create file:/proc/x
\tat org.apache.hadoop.fs.Y(Y.java:2)
"""


def test_a_python_error_in_a_batch_is_its_last_traceback_line() -> None:
    assert spark_error_message(_FOREACH_BATCH) == (
        "FileNotFoundError: [Errno 2] No such file or directory: '/proc/x'"
    )
    assert spark_error_message(_WORKER) == (
        "ChangeEventError: topic 'cdc' queue 0 offset 20: not a change event"
    )


def test_a_java_error_is_its_innermost_cause() -> None:
    assert spark_error_message(_JAVA) == "IOException: Mkdirs failed to create file:/proc/x"


def test_otherwise_the_first_line() -> None:
    assert spark_error_message("[UNRESOLVED_COLUMN] no such column `x`.\nmore") == (
        "[UNRESOLVED_COLUMN] no such column `x`."
    )
    assert spark_error_message("") == "failed"
