"""The connector against a broker that requires a login (issue 16): batch writes and
reads with `tidemq.username` / `tidemq.password`, on the driver and in the executors'
Python workers; without them the query fails with the broker's refusal, not a hang."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import SparkSession

import tidemq
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
