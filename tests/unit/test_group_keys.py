"""Replica-group keys in etcd and their values: layout, round trips, refusals."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tidemq.cluster.etcd_client import grpc_target
from tidemq.cluster.group_keys import (
    CorruptMetadata,
    GroupKeys,
    InSyncRecord,
    LeaderRecord,
    decode_epoch,
    decode_in_sync,
    decode_leader,
    encode_epoch,
    encode_in_sync,
    encode_leader,
)
from tidemq.core.errors import ConfigError


def test_keys_follow_the_documented_layout() -> None:
    keys = GroupKeys("orders")
    assert keys.leader == b"/tidemq/groups/orders/leader"
    assert keys.epoch == b"/tidemq/groups/orders/epoch"
    assert keys.in_sync == b"/tidemq/groups/orders/in_sync"
    assert GroupKeys("g", prefix="/prod/a").leader == b"/prod/a/groups/g/leader"


@pytest.mark.parametrize("group", ["", "a/b", "..", "-rf", "x" * 200])
def test_a_group_name_outside_the_rule_is_refused(group: str) -> None:
    with pytest.raises(ConfigError, match="broker group name"):
        GroupKeys(group)


@pytest.mark.parametrize("prefix", ["tidemq", "/tidemq/", ""])
def test_a_prefix_must_start_and_not_end_with_a_slash(prefix: str) -> None:
    with pytest.raises(ConfigError, match="etcd prefix"):
        GroupKeys("g", prefix=prefix)


def test_values_are_readable_json_and_round_trip() -> None:
    leader = LeaderRecord(7, "b1", "127.0.0.1:10911")
    assert encode_leader(leader) == b'{"epoch":7,"member":"b1","address":"127.0.0.1:10911"}'
    assert decode_leader(b"k", encode_leader(leader)) == leader
    assert decode_epoch(b"k", encode_epoch(12)) == 12
    in_sync = InSyncRecord(7, ("b1", "b2"))
    assert encode_in_sync(in_sync) == b'{"epoch":7,"members":["b1","b2"]}'
    assert decode_in_sync(b"k", encode_in_sync(in_sync)) == in_sync


@pytest.mark.parametrize(
    ("decode", "value"),
    [
        (decode_leader, b"not json"),
        (decode_leader, b'{"epoch":0,"member":"b1","address":"a:1"}'),
        (decode_leader, b'{"epoch":1,"member":"b1"}'),
        (decode_leader, b'{"epoch":1,"member":"b1","address":"a:1","extra":1}'),
        (decode_epoch, b"0"),
        (decode_epoch, b'"3"'),
        (decode_in_sync, b'{"epoch":1,"members":["b2","b1"]}'),
        (decode_in_sync, b'{"epoch":1,"members":["b1","b1"]}'),
    ],
)
def test_a_value_tidemq_did_not_write_is_corrupt_metadata_naming_the_key(
    decode: Callable[[bytes, bytes], object], value: bytes
) -> None:
    with pytest.raises(CorruptMetadata, match="/tidemq/groups/g/x"):
        decode(b"/tidemq/groups/g/x", value)


def test_endpoints_become_one_grpc_target() -> None:
    assert grpc_target(["http://127.0.0.1:2379"]) == ("127.0.0.1", 2379)
    assert grpc_target(["http://etcd.local:2379"]) == ("etcd.local", 2379)
    host, port = grpc_target(["http://127.0.0.1:1", "http://127.0.0.2:2", "http://127.0.0.3:3"])
    assert f"{host}:{port}" == "ipv4:127.0.0.1:1,127.0.0.2:2,127.0.0.3:3"


@pytest.mark.parametrize(
    "endpoints",
    [[], ["127.0.0.1:2379"], ["https://127.0.0.1:2379"], ["http://127.0.0.1"],
     ["http://a.local:1", "http://b.local:2"]],
)  # fmt: skip
def test_bad_endpoints_are_config_errors(endpoints: list[str]) -> None:
    with pytest.raises(ConfigError, match="etcd"):
        grpc_target(endpoints)
