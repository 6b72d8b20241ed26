"""`tidemq.spark.register` points local-mode Python workers at the driver's interpreter
when nobody chose one (no Spark here: a stand-in session; the real thing is
tests/spark/test_spark_python.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import pytest

import tidemq.spark
from tidemq.spark import use_this_python


@dataclass
class FakeConf:
    values: dict[str, str] = field(default_factory=dict)

    def get(self, key: str) -> str | None:
        return self.values.get(key)


@dataclass
class FakeContext:
    master: str = "local[*]"
    pythonExec: str = "python3"  # noqa: N815 - PySpark's name
    conf: FakeConf = field(default_factory=FakeConf)

    def getConf(self) -> FakeConf:  # noqa: N802 - PySpark's name
        return self.conf


@dataclass
class FakeSources:
    registered: list[type] = field(default_factory=list)

    def register(self, cls: type) -> None:
        self.registered.append(cls)


@dataclass
class FakeSession:
    sparkContext: FakeContext = field(default_factory=FakeContext)  # noqa: N815
    dataSource: FakeSources = field(default_factory=FakeSources)  # noqa: N815


class ConnectSession:
    @property
    def sparkContext(self) -> FakeContext:  # noqa: N802
        raise RuntimeError("[NOT_IMPLEMENTED] sparkContext() is not implemented.")


@pytest.fixture(autouse=True)
def no_pyspark_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)


def test_register_sets_the_workers_python_in_local_mode() -> None:
    session = FakeSession()
    tidemq.spark.register(session)
    assert session.sparkContext.pythonExec == sys.executable
    assert [c.__name__ for c in session.dataSource.registered] == ["TidemqDataSource"]


def test_a_chosen_python_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    by_hand = FakeSession(FakeContext(pythonExec="/opt/py/bin/python"))
    assert not use_this_python(by_hand)
    assert by_hand.sparkContext.pythonExec == "/opt/py/bin/python"
    by_conf = FakeSession(FakeContext(conf=FakeConf({"spark.pyspark.python": "/opt/py"})))
    assert not use_this_python(by_conf)
    assert by_conf.sparkContext.pythonExec == "python3"
    cluster = FakeSession(FakeContext(master="spark://h:7077"))
    assert not use_this_python(cluster)
    assert cluster.sparkContext.pythonExec == "python3"
    assert not use_this_python(ConnectSession())
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    env = FakeSession()
    assert not use_this_python(env)
    assert env.sparkContext.pythonExec == "python3"
