"""`GET /metrics` on a `tidemq server`'s HTTP listener: Prometheus text that
`prometheus_client.parser` reads, with values that match the traffic the test made."""

from __future__ import annotations

import shutil
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.server_process import server_process

import tidemq

pytestmark = pytest.mark.timeout(120)

TOPIC = "metered"
N = 120


def _scrape(http: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_match_the_traffic(tmp_path: Path) -> None:
    began = time.time()
    with server_process(tmp_path) as server:
        b = server.address
        with tidemq.Admin(b) as admin:
            admin.create_topic(TOPIC, 2)
            admin.create_topic("idle", 1)  # counted, with no traffic series
        with tidemq.Producer(b) as producer:
            for i in range(N):
                producer.send(TOPIC, b"%03d" % i + b"x" * 97, key=b"k%d" % i)
            producer.send(TOPIC, b"later", queue=0, delay=3600.0)
        with tidemq.TransactionProducer(b, "g-tx") as txns:
            txn = txns.begin()
            txn.send(TOPIC, b"half", queue=1)
            with tidemq.StreamConsumer(b, start="earliest") as consumer:
                consumer.assign([(TOPIC, 0), (TOPIC, 1)])
                got = 0
                for _ in range(100):
                    got += len(consumer.poll(500))
                    if got >= N:
                        break
            assert got == N
            with tidemq.GroupConsumer(
                b, "g-metered", [TOPIC], start="earliest", auto_commit=False
            ) as group:
                read = 0
                for _ in range(100):
                    read += len(group.poll(500))
                    if read:
                        break
                # Lag counts the queues with a committed offset (as Kafka's tools do).
                group.commit({(TOPIC, 0): 5, (TOPIC, 1): 5})
            with tidemq.SimpleConsumer(
                b, "g-pop", {TOPIC: "*"}, max_attempts=1, await_duration=1.0
            ) as pop:
                leased = pop.receive(3)
                assert len(leased) == 3
                leased[0].nack()  # its one attempt: to the dead-letter topic
                m = _scrape(server.http_address)
            txn.rollback()
        t = (("topic", TOPIC),)
        assert m[("rocketmq_messages_in_total", t)] == N + 2  # the delayed and the half
        assert m[("rocketmq_throughput_in_total", t)] > N * 100
        # Sent to consumers: the group's consumer fetches ahead of what it polled.
        assert N + read <= m[("rocketmq_messages_out_total", t)] <= 2 * N
        assert m[("rocketmq_throughput_out_total", t)] > (N + read) * 100
        # Its two, and the pop group's retry and dead-letter topics (as in RocketMQ).
        assert m[("rocketmq_topic_number", ())] == 4
        assert ("rocketmq_messages_in_total", (("topic", "idle"),)) not in m
        assert m[("rocketmq_consumer_group_number", ())] >= 1
        lag = (("consumer_group", "g-metered"), ("topic", TOPIC))
        assert m[("rocketmq_consumer_lag_messages", lag)] == N - 10
        # How long ago its oldest unconsumed message (offset 5) was stored: since the test
        # began at most; and the log's oldest record, the first one this test sent.
        assert 0 <= m[("rocketmq_consumer_lag_latency", lag)] <= 1000 * (time.time() - began) + 1
        reserve = m[("rocketmq_storage_message_reserve_time", ())]
        assert (
            m[("rocketmq_consumer_lag_latency", lag)] <= reserve <= 1000 * (time.time() - began) + 1
        )
        assert m[("rocketmq_half_messages", ())] == 1
        assert m[("tidemq_timer_pending_messages", t)] == 1
        assert m[("tidemq_commit_log_bytes", ())] > N * 100
        # The server flushes every produce (sync mode): each made some bytes durable.
        syncs = m[("tidemq_fsync_duration_seconds_count", ())]
        assert syncs >= 1
        # (A sync timed on the flusher thread may not have reported to the loop yet.)
        assert syncs - 1 <= m[("tidemq_group_commit_bytes_count", ())] <= syncs
        assert m[("tidemq_group_commit_bytes_sum", ())] <= m[("tidemq_commit_log_bytes", ())]
        assert m[("tidemq_group_commit_bytes_sum", ())] > N * 100
        assert not any(dict(labels).get("queue_id") for _, labels in m)  # per topic only
        disk = shutil.disk_usage(tmp_path)
        assert m[("tidemq_disk_total_bytes", ())] == disk.total
        assert 0 < m[("tidemq_disk_free_bytes", ())] <= disk.total
        by_pop = (("consumer_group", "g-pop"), ("topic", TOPIC))
        assert m[("rocketmq_consumer_inflight_messages", by_pop)] == 2
        assert m[("rocketmq_send_to_dlq_messages_total", by_pop)] == 1
        produce = (("kind", "PRODUCE"),)
        assert m[("tidemq_request_duration_seconds_count", produce)] >= N + 1
        inf = (("kind", "PRODUCE"), ("le", "+Inf"))
        assert (
            m[("tidemq_request_duration_seconds_bucket", inf)]
            == m[("tidemq_request_duration_seconds_count", produce)]
        )
        assert 0 < m[("tidemq_request_duration_seconds_sum", produce)] < 60
        # Message sizes, by kind: every send above was a batch of one message.
        normal, delay = (("message_type", "normal"),), (("message_type", "delay"),)
        assert m[("rocketmq_message_size_count", normal)] == N
        assert m[("rocketmq_message_size_count", delay)] == 1
        assert m[("rocketmq_message_size_count", (("message_type", "transaction"),))] == 1
        assert N * 100 < m[("rocketmq_message_size_sum", normal)] < N * 512
        assert m[("rocketmq_message_size_bucket", (("le", "+Inf"), *normal))] == N
        assert m[("rocketmq_message_size_bucket", (("le", "128.0"), *normal))] == 0
        assert m[("rocketmq_message_size_bucket", (("le", "512.0"), *normal))] == N
        invisible = (by_pop[0], ("state", "invisible"), by_pop[1])  # labels sorted
        assert m[("tidemq_pop_leases", invisible)] == 2
        assert m[("tidemq_pop_leases", (by_pop[0], ("state", "suspended"), by_pop[1]))] == 0
        assert m[("tidemq_pop_retried_messages_total", by_pop)] == 0
        assert not any(name.startswith("tidemq_tier_") for name, _ in m)  # not configured
        with tidemq.TransactionProducer(b, "g-tx") as txns:
            txn = txns.begin()
            txn.send(TOPIC, b"one", queue=0)
            txn.send(TOPIC, b"two", queue=1)
            txn.commit()
        after = _scrape(server.http_address)
        assert after[("tidemq_transactions_rolled_back_total", ())] == 1
        assert after[("tidemq_transactions_committed_total", ())] == 1
        assert after[("rocketmq_half_messages", ())] == 0
        assert after[("rocketmq_commit_messages_total", t)] == 2
        assert after[("rocketmq_rollback_messages_total", t)] == 1


def test_tier_backlog(tmp_path: Path) -> None:
    """With tiered storage configured, each tiered topic's messages not yet offloaded
    (nothing is offloaded here: files close at 64 MiB or after an hour)."""
    settings = [
        "--http-port",
        "0",
        "--set",
        f"tiered.url=file://{tmp_path / 'bucket'}",
        "--set",
        "tiered.file_max_age_ms=3600000",
    ]
    with server_process(tmp_path, settings) as server:
        with tidemq.Admin(server.address) as admin:
            admin.create_topic(TOPIC, 2, config={"remote.storage.enable": "true"})
            admin.create_topic("local-only", 1)
        with tidemq.Producer(server.address) as producer:
            for i in range(7):
                producer.send(TOPIC, b"v", queue=i % 2)
            producer.send("local-only", b"v")
        m = _scrape(server.http_address)
    assert m[("tidemq_tier_backlog_messages", (("topic", TOPIC),))] == 7
    assert ("tidemq_tier_backlog_messages", (("topic", "local-only"),)) not in m
    assert m[("tidemq_tier_uploaded_bytes_total", ())] == 0
    assert m[("tidemq_tier_errors_total", ())] == 0


def test_per_queue_series_are_opt_in(tmp_path: Path) -> None:
    """`http.metrics_per_queue`: lag and end offsets per queue (label `queue_id`), in place
    of the per-topic lag; off by default (see the test above: no queue_id anywhere)."""
    settings = ["--http-port", "0", "--set", "http.metrics_per_queue=true"]
    with server_process(tmp_path, settings) as server:
        b = server.address
        with tidemq.Admin(b) as admin:
            admin.create_topic(TOPIC, 3)
        with tidemq.Producer(b) as producer:
            for queue, count in enumerate((4, 0, 7)):
                for _ in range(count):
                    producer.send(TOPIC, b"v", queue=queue)
        with tidemq.Admin(b) as admin:
            admin.reset_offsets("g-q", TOPIC, to="offset", value=1, execute=True)
        m = _scrape(server.http_address)
    ends = {
        labels: value
        for (name, labels), value in m.items()
        if name == "tidemq_queue_end_offset" and ("topic", TOPIC) in labels
    }
    assert ends == {
        (("queue_id", str(q)), ("topic", TOPIC)): float(n) for q, n in enumerate((4, 0, 7))
    }
    lag = {
        labels: value
        for (name, labels), value in m.items()
        if name == "rocketmq_consumer_lag_messages"
    }
    group_topic = (("consumer_group", "g-q"),)
    # Committed at offset 1 (an empty queue's offset is clamped to its end, 0).
    assert lag == {
        (*group_topic, ("queue_id", str(q)), ("topic", TOPIC)): float(n)
        for q, n in enumerate((3, 0, 6))
    }
    assert m[("tidemq_metrics_queues_omitted", ())] == 0


def test_fifo_pop_leases_by_state(tmp_path: Path) -> None:
    """A FIFO topic's messages are sized as `fifo`; its pop leases are `invisible` for each
    message group's first message and `held` for those waiting behind it."""
    with server_process(tmp_path) as server:
        b = server.address
        with tidemq.Admin(b) as admin:
            admin.create_topic("ordered", 1, message_type="FIFO")
        with tidemq.Producer(b) as producer:
            for value, key in ((b"a0", b"a"), (b"a1", b"a"), (b"a2", b"a"), (b"b0", b"b")):
                producer.send("ordered", value, key=key, queue=0)
        with tidemq.SimpleConsumer(b, "g-fifo", {"ordered": "*"}, await_duration=1.0) as pop:
            got = pop.receive(10)
            assert sorted(m.value or b"" for m in got) == [b"a0", b"b0"]
            m = _scrape(server.http_address)
    assert m[("rocketmq_message_size_count", (("message_type", "fifo"),))] == 4
    group, topic = ("consumer_group", "g-fifo"), ("topic", "ordered")
    assert m[("tidemq_pop_leases", (group, ("state", "invisible"), topic))] == 2
    assert m[("tidemq_pop_leases", (group, ("state", "held"), topic))] == 2
    assert m[("rocketmq_consumer_inflight_messages", (group, topic))] == 2
