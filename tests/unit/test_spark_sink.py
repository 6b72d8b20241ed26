"""The streaming sink's pure parts: options, and the driver's commit and abort decisions
over a fake transaction client. No JVM."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tidemq.client.transaction import TxnRef
from tidemq.core.errors import TidemqError, TransactionStateError
from tidemq.spark.options import OptionError
from tidemq.spark.sink import (
    SinkCommitMessage,
    discard,
    parse_sink_options,
    plan_abort,
    plan_commit,
    publish,
    sink_refs,
)

BOOT = {"bootstrap": "127.0.0.1:9876", "topic": "out"}


def test_sink_id_required_and_checked() -> None:
    with pytest.raises(OptionError, match="'sinkId' is required"):
        parse_sink_options(BOOT)
    with pytest.raises(OptionError, match="'sinkId' is required"):
        parse_sink_options({**BOOT, "sinkId": "  "})
    for bad in ("a b", "a/b", "x" * 201, "é"):
        with pytest.raises(OptionError, match="'sinkId' must be"):
            parse_sink_options({**BOOT, "sinkId": bad})
    # Spark hands options over with lower-cased keys.
    opts = parse_sink_options({"bootstrap": "h:1", "sinkid": " orders-copy.v2 "})
    assert opts.sink_id == "orders-copy.v2"
    assert opts.group == "spark-sink-orders-copy.v2"
    assert opts.write.bootstrap == "h:1"
    assert opts.write.topic is None
    assert opts.fail_after_rows is None
    with pytest.raises(OptionError, match="'bootstrap' is required"):
        parse_sink_options({"sinkId": "s"})


def test_testing_options() -> None:
    opts = parse_sink_options(
        {**BOOT, "sinkId": "s", "testing.failAfterRows": "3", "testing.failOnceFile": "/tmp/f"}
    )
    assert (opts.fail_after_rows, opts.fail_once_file) == (3, "/tmp/f")
    with pytest.raises(OptionError, match="needs 'testing\\.failOnceFile'"):
        parse_sink_options({**BOOT, "sinkId": "s", "testing.failAfterRows": "3"})
    with pytest.raises(OptionError, match="must be an integer"):
        parse_sink_options({**BOOT, "sinkId": "s", "testing.failAfterRows": "x"})


def test_plans() -> None:
    assert plan_commit(-1, 0) == "commit"
    assert plan_commit(4, 5) == "commit"
    assert plan_commit(5, 5) == "skip"
    assert plan_commit(6, 5) == "skip"
    assert plan_abort(-1, 0) == "rollback"
    assert plan_abort(5, 5) == "keep"
    assert plan_abort(4, 5) == "rollback"


class FakeClient:
    """Markers and transactions as a broker keeps them, with failures on demand."""

    def __init__(self, marker: int = -1) -> None:
        self.marker = marker
        self.committed: set[TxnRef] = set()
        self.rolled_back: set[TxnRef] = set()
        self.commit_calls = 0
        #: commit_many raises this many times; with `apply_then_fail`, after committing.
        self.fail_commits = 0
        self.apply_then_fail = False
        self.fail_rollback = False

    def sink_marker(self, sink_id: str) -> int:
        return self.marker

    def commit_many(self, refs: Sequence[TxnRef], *, sink_id: str, batch_id: int) -> object:
        self.commit_calls += 1
        if any(r in self.rolled_back for r in refs):
            raise TransactionStateError("cannot commit: it was rolled back")
        if self.fail_commits and not self.apply_then_fail:
            self.fail_commits -= 1
            raise TidemqError("broker unreachable")
        self.committed.update(refs)
        self.marker = batch_id
        if self.fail_commits:
            self.fail_commits -= 1
            raise TidemqError("connection lost before the answer")
        return []

    def rollback_many(self, refs: Sequence[TxnRef]) -> None:
        if self.fail_rollback:
            raise TidemqError("broker unreachable")
        if any(r in self.committed for r in refs):
            raise TransactionStateError("cannot roll back: it was committed")
        self.rolled_back.update(refs)


def _messages(batch_id: int, *ids: str) -> list[SinkCommitMessage | None]:
    return [SinkCommitMessage([("b1:1", i)], batch_id, 10, n) for n, i in enumerate(ids)]


def test_refs_skip_failed_tasks() -> None:
    msgs = [*_messages(0, "t2", "t1"), None, SinkCommitMessage([], 0, 0, 3)]
    assert sink_refs(msgs) == [("b1:1", "t1"), ("b1:1", "t2")]


def test_commit_publishes_with_marker() -> None:
    client = FakeClient(marker=2)
    assert publish(client, "s", _messages(3, "a", "b"), 3) == "committed"
    assert client.committed == {("b1:1", "a"), ("b1:1", "b")}
    assert client.marker == 3


def test_empty_batch_commits_marker() -> None:
    client = FakeClient()
    assert publish(client, "s", [SinkCommitMessage([], 0, 0, 0)], 0) == "committed"
    assert client.marker == 0


def test_replayed_batch_is_rolled_back() -> None:
    client = FakeClient(marker=3)
    assert publish(client, "s", _messages(3, "new"), 3) == "skipped"
    assert client.rolled_back == {("b1:1", "new")}
    assert client.committed == set()
    assert client.marker == 3
    # A rollback that fails is only logged: the broker rolls them back after its checks.
    client = FakeClient(marker=3)
    client.fail_rollback = True
    assert publish(client, "s", _messages(3, "new"), 3) == "skipped"


def test_commit_retries_and_is_idempotent() -> None:
    client = FakeClient()
    client.fail_commits, client.apply_then_fail = 1, True  # committed, answer lost
    assert publish(client, "s", _messages(0, "a"), 0, pause_s=0) == "committed"
    assert client.commit_calls == 2
    assert client.marker == 0
    client = FakeClient()
    client.fail_commits = 5
    with pytest.raises(TidemqError, match="unreachable"):
        publish(client, "s", _messages(0, "a"), 0, attempts=3, pause_s=0)
    assert client.commit_calls == 3


def test_commit_of_rolled_back_transaction_raises() -> None:
    client = FakeClient()
    client.rolled_back.add(("b1:1", "a"))
    with pytest.raises(TransactionStateError):
        publish(client, "s", _messages(0, "a", "b"), 0, pause_s=0)
    assert client.commit_calls == 1


def test_messages_of_another_batch_refused() -> None:
    with pytest.raises(TidemqError, match="a task of batch 4"):
        publish(FakeClient(), "s", _messages(4, "a"), 5)


def test_abort_rolls_back_unless_published() -> None:
    client = FakeClient(marker=1)
    msgs = [*_messages(2, "a"), None]  # one task failed
    assert discard(client, "s", msgs, 2) == "rolled back"
    assert client.rolled_back == {("b1:1", "a")}
    # Spark calls abort after a commit that raised, though the broker published it.
    client = FakeClient(marker=1)
    client.fail_commits = 3
    client.apply_then_fail = True
    with pytest.raises(TidemqError):
        publish(client, "s", _messages(2, "a"), 2, attempts=3, pause_s=0)
    assert discard(client, "s", _messages(2, "a"), 2) == "kept"
    assert client.committed == {("b1:1", "a")}
    assert client.rolled_back == set()
    assert discard(FakeClient(), "s", [None, None], 0) == "nothing"


def test_unknown_sink_options_are_errors() -> None:
    """The sink reads the writer's options, its own, and the query's checkpointLocation
    (which Spark passes on); any other name is an error, not silently ignored."""
    opts = parse_sink_options({**BOOT, "sinkId": "s", "checkpointLocation": "/tmp/cp"})
    assert opts.sink_id == "s"
    with pytest.raises(OptionError, match="did you mean 'sinkId'"):
        parse_sink_options({**BOOT, "sinkId": "s", "sinkIds": "t"})
