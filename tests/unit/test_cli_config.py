"""The CLI's config loader: file < environment < --set < flags, types from the dataclasses,
and errors that name the key and where it came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.cli.config import (
    ConfigUsageError,
    env_layer,
    file_layer,
    load_broker_config,
    set_layer,
)
from tidemq.store.config import FlushMode


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tidemq.toml"
    path.write_text(text)
    return path


def test_defaults_without_any_source() -> None:
    cfg = load_broker_config()
    assert cfg.port == 10911
    assert cfg.store.data_dir == Path("data")
    assert cfg.store.flush_mode is FlushMode.SYNC


def test_file_sections_map_onto_both_dataclasses(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        """
[broker]
port = 9999
host = "0.0.0.0"
broker_name = "b1"
auto_create_topics = true
default_queues = 4
name_servers = ["10.0.0.1:9876", "10.0.0.2:9876"]

[store]
data_dir = "/var/lib/tidemq"
segment_size_bytes = 67108864
flush_mode = "async"
flush_interval_ms = 200
disk_reject_ratio = 0.8
""",
    )
    cfg = load_broker_config(config_file=path)
    assert (cfg.port, cfg.host, cfg.broker_name) == (9999, "0.0.0.0", "b1")
    assert cfg.auto_create_topics is True
    assert cfg.default_queues == 4
    assert cfg.name_servers == ("10.0.0.1:9876", "10.0.0.2:9876")
    assert cfg.store.data_dir == Path("/var/lib/tidemq")
    assert cfg.store.segment_size_bytes == 64 << 20
    assert cfg.store.flush_mode is FlushMode.ASYNC
    assert cfg.store.flush_interval_ms == 200
    assert cfg.store.disk_reject_ratio == 0.8


def test_precedence_defaults_file_env_set_flags(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[broker]\nport = 1001\nhost = 'file'\nbroker_name = 'file'\n")
    environ = {"TIDEMQ_BROKER__PORT": "1002", "TIDEMQ_BROKER__HOST": "env"}
    sets = ["broker.port=1003"]
    flags = {"broker": {"port": 1004, "host": None}}
    defaults = {"broker": {"port": 1000, "default_queues": 3}}

    def load(**kw: object) -> tuple[int, str, str, int]:
        cfg = load_broker_config(defaults=defaults, **kw)  # type: ignore[arg-type]
        return cfg.port, cfg.host, cfg.broker_name, cfg.default_queues

    assert load() == (1000, "127.0.0.1", "broker-0", 3)
    assert load(config_file=path) == (1001, "file", "file", 3)
    assert load(config_file=path, environ=environ) == (1002, "env", "file", 3)
    assert load(config_file=path, environ=environ, sets=sets) == (1003, "env", "file", 3)
    # A flag left unset (None) does not override anything.
    assert load(config_file=path, environ=environ, sets=sets, flags=flags) == (
        1004,
        "env",
        "file",
        3,
    )


def test_later_set_wins_and_values_are_typed() -> None:
    cfg = load_broker_config(
        sets=[
            "store.flush_mode=ASYNC",
            "store.flush_mode=sync",
            "broker.auto_create_topics=yes",
            "store.disk_reject_ratio=0.5",
            "broker.name_servers=a:1, b:2",
            "broker.advertised_address=",
            "store.segment_size_bytes=1_048_576",
        ]
    )
    assert cfg.store.flush_mode is FlushMode.SYNC
    assert cfg.auto_create_topics is True
    assert cfg.store.disk_reject_ratio == 0.5
    assert cfg.name_servers == ("a:1", "b:2")
    assert cfg.advertised_address is None
    assert cfg.store.segment_size_bytes == 1 << 20


def test_env_keys_are_case_insensitive_and_other_variables_ignored() -> None:
    layer = env_layer(
        {
            "TIDEMQ_STORE__FLUSH_MODE": "async",
            "tidemq_broker__default_queues": "2",
            "TIDEMQ_SOAK": "1",  # not a setting: no double underscore
            "HOME": "/root",
        }
    )
    assert layer.values == {
        "store": {"flush_mode": FlushMode.ASYNC},
        "broker": {"default_queues": 2},
    }


def test_kafka_and_rocketmq_aliases(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        '[broker]\n"num.partitions" = 6\nautoCreateTopicEnable = true\n'
        '[store]\n"log.dirs" = "/d"\nflushDiskType = "ASYNC_FLUSH"\n',
    )
    cfg = load_broker_config(config_file=path)
    assert cfg.default_queues == 6
    assert cfg.auto_create_topics is True
    assert cfg.store.data_dir == Path("/d")
    assert cfg.store.flush_mode is FlushMode.ASYNC


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("[broker]\nprot = 1\n", ["broker.prot", "did you mean broker.port"]),
        ("[brokr]\nport = 1\n", ["brokr", "did you mean broker"]),
        ("port = 1\n", ["'port'", "[broker]"]),
        ("[store]\nflush_mode = 'sometimes'\n", ["store.flush_mode", "sync or async"]),
        ("[broker]\nport = 'x'\n", ["broker.port", "integer"]),
        ("[broker]\nauto_create_topics = 'maybe'\n", ["broker.auto_create_topics"]),
        ("[broker]\nstore = 1\n", ["broker.store"]),
        ("[broker]\nport = 70000\n", ["broker.port", "0..65535", "tidemq.toml"]),
        ("[store]\nsegment_size_bytes = 12\n", ["store.segment_size_bytes"]),
        ("[broker]\nmessage.max.bytes = 1\n", ["broker.message", "quote"]),
        ("not toml [", ["invalid TOML"]),
    ],
)
def test_file_errors_name_the_key(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = _toml(tmp_path, text)
    with pytest.raises(ConfigUsageError) as info:
        load_broker_config(config_file=path)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigUsageError, match="does not exist"):
        file_layer(tmp_path / "nope.toml")


def test_env_and_set_errors_name_their_source() -> None:
    with pytest.raises(ConfigUsageError, match="TIDEMQ_STORE__FLUSH_MOD: unknown config key"):
        env_layer({"TIDEMQ_STORE__FLUSH_MOD": "async"})
    with pytest.raises(ConfigUsageError, match="TIDEMQ_STOR__FLUSH_MODE: unknown config section"):
        env_layer({"TIDEMQ_STOR__FLUSH_MODE": "async"})
    with pytest.raises(ConfigUsageError, match=r"--set broker\.port: broker\.port must be an"):
        set_layer(["broker.port=abc"])
    with pytest.raises(ConfigUsageError, match=r"section\.key=value"):
        set_layer(["port=1"])
    with pytest.raises(ConfigUsageError, match="TIDEMQ_STORE__SEGMENT_SIZE_BYTES"):
        load_broker_config(environ={"TIDEMQ_STORE__SEGMENT_SIZE_BYTES": "12"})


def test_alias_and_field_together_is_an_error() -> None:
    with pytest.raises(ConfigUsageError, match="given twice"):
        env_layer({"TIDEMQ_BROKER__PORT": "1", "TIDEMQ_BROKER__LISTENPORT": "2"})


def test_cross_field_checks_still_apply() -> None:
    with pytest.raises(ConfigUsageError, match="max_batch_bytes"):
        load_broker_config(sets=["broker.max_message_bytes=8388608"])


def test_stale_topic_ms_is_a_broker_key() -> None:
    """The name server's stale-topic time (issue 16) is configurable like the TTL, for
    `tidemq namesrv` and the embedded name server of `tidemq server`."""
    assert load_broker_config().stale_topic_ms == 600_000
    assert load_broker_config(sets=["broker.stale_topic_ms=5000"]).stale_topic_ms == 5000
    with pytest.raises(ConfigUsageError, match="stale_topic_ms must be >= 0"):
        load_broker_config(sets=["broker.stale_topic_ms=-1"])
