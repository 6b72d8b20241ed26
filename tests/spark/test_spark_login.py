"""The connector against a broker that requires a login (issue 16): batch writes and
reads with `tidemq.username` / `tidemq.password`, on the driver and in the executors'
Python workers; without them the query fails with the broker's refusal, not a hang."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.dataset as ds
import pytest
from pyspark.sql import SparkSession
from tests.support.tls_certs import make_certs
from typer.testing import CliRunner

import tidemq
from tidemq.cli.main import app
from tidemq.client.cluster import ClientConfig

if TYPE_CHECKING:
    from tests.spark.conftest import ThreadedBroker

pytestmark = pytest.mark.spark

USER, PASSWORD = "etl", "etl-secret-1"


def test_batch_write_and_read_with_login(
    spark: SparkSession, make_broker: Callable[..., ThreadedBroker]
) -> None:
    broker = make_broker(auth_enabled=True, bootstrap_user=USER, bootstrap_password=PASSWORD)
    login = {"tidemq.username": USER, "tidemq.password": PASSWORD}
    bootstrap = broker.address
    config = ClientConfig(username=USER, password=PASSWORD)
    with tidemq.Admin(bootstrap, client_config=config) as admin:
        admin.create_topic("secure", 2)
    rows = spark.createDataFrame([(b"k%d" % i, b"v%d" % i) for i in range(20)], ["key", "value"])
    rows.write.format("tidemq").option("bootstrap", bootstrap).option("topic", "secure").options(
        **login
    ).mode("append").save()
    read = (
        spark.read.format("tidemq")
        .option("bootstrap", bootstrap)
        .option("subscribe", "secure")
        .options(**login)
        .load()
    )
    assert sorted(r.value for r in read.select("value").collect()) == sorted(
        b"v%d" % i for i in range(20)
    )
    anonymous = (
        spark.read.format("tidemq").option("bootstrap", bootstrap).option("subscribe", "secure")
    )
    with pytest.raises(Exception, match="authenticate first"):
        anonymous.load().count()


def test_pipelines_over_tls_with_login(
    spark: SparkSession,
    make_broker: Callable[..., ThreadedBroker],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pipeline commands take --tls-* like every client command, and the login from
    TIDEMQ_USERNAME / TIDEMQ_PASSWORD, for the driver's clients and the executors' (the
    source, and analytics' transactional producer of results)."""
    certs = make_certs(tmp_path)
    broker = make_broker(
        auth_enabled=True,
        bootstrap_user=USER,
        bootstrap_password=PASSWORD,
        tls_cert_file=certs.server_cert,
        tls_key_file=certs.server_key,
    )
    monkeypatch.setenv("TIDEMQ_USERNAME", USER)
    monkeypatch.setenv("TIDEMQ_PASSWORD", PASSWORD)
    common = ["--bootstrap", broker.address, "--tls-ca-file", str(certs.ca)]
    runner = CliRunner()

    def cli(*args: str) -> str:
        result = runner.invoke(app, ["pipeline", *args, *common])
        assert result.exit_code == 0, result.output
        return result.output

    # 20 users: 300 events span about an hour of event time, so the watermark that the first
    # batch (150 events) moves is past many minute windows whatever their alignment. With the
    # default 1,000 users they spanned 170 s, and about one run in ten had no window closed
    # by the first batch, so no results (found in CI).
    out = cli(
        "generate-events", "--topic", "clicks", "--count", "300", "--queues", "2", "--users", "20"
    )
    assert "sent 300 event(s)" in out
    archived = tmp_path / "archive"
    out = cli("archive", "--topic", "clicks", "--output", str(archived),
              "--checkpoint", str(tmp_path / "cp-archive"))  # fmt: skip
    assert "archived 300 message(s)" in out
    table = ds.dataset(archived, format="parquet", partitioning="hive").to_table()
    assert sorted(table["offset"].to_pylist()) == sorted(
        o for q in (0, 1) for o in range(sum(1 for p in table["partition"].to_pylist() if p == q))
    )
    out = cli(
        "analytics", "--topic", "clicks", "--output", str(tmp_path / "analytics"),
        "--checkpoint", str(tmp_path / "cp-analytics"), "--results-topic", "clicks-out",
        "--tumbling", "60", "--watermark", "30", "--max-offsets-per-trigger", "150",
    )  # fmt: skip
    assert "processed 300 event(s)" in out
    config = ClientConfig(
        username=USER, password=PASSWORD, ssl_context=tidemq.client_tls(ca_file=certs.ca)
    )
    with tidemq.Admin(broker.address, client_config=config) as admin:
        results = admin.describe_topic("clicks-out").queue_info
    # Results published over TLS, logged in.
    assert sum(q.max_offset for q in results) > 0, out

    monkeypatch.delenv("TIDEMQ_USERNAME")
    monkeypatch.delenv("TIDEMQ_PASSWORD")
    again = ["archive", "--topic", "clicks", "--output", str(archived)]
    again += ["--checkpoint", str(tmp_path / "cp2"), *common]
    refused = runner.invoke(app, ["pipeline", *again])
    assert refused.exit_code != 0
    assert "authenticate" in refused.output
