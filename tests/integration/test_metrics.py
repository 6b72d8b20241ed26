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
        assert m[("rocketmq_topic_number", ())] == 1
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
        after = _scrape(server.http_address)
        assert after[("tidemq_transactions_rolled_back_total", ())] == 1
        assert after[("rocketmq_half_messages", ())] == 0


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
