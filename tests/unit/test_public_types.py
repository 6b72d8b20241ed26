"""The public API (`tidemq`, `tidemq.aio`) speaks in client types: no parameter, return
value, property or field of anything they export names a `tidemq.protocol` type, so a
change of the wire format cannot change the API (`tidemq.client.results` converts)."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tidemq
from tidemq import aio
from tidemq.client import results
from tidemq.protocol import commands, tier_messages

FACES = [tidemq, aio]


def _wire_types_in(annotation: object, seen: set[int] | None = None) -> Iterator[str]:
    """Names of the `tidemq.protocol` types an annotation mentions, through unions,
    generics (`list[...]`, `Sequence[...]`, `Callable[..., ...]`), aliases and literals."""
    seen = set() if seen is None else seen
    if id(annotation) in seen:
        return
    seen.add(id(annotation))
    if isinstance(annotation, list | tuple):  # Callable's parameter list
        for item in annotation:
            yield from _wire_types_in(item, seen)
        return
    module = getattr(annotation, "__module__", "") or ""
    if isinstance(annotation, type) and module.startswith("tidemq.protocol"):
        yield f"{module}.{annotation.__qualname__}"
    value = getattr(annotation, "__value__", None)  # a `type X = ...` alias
    if value is not None:
        yield from _wire_types_in(value, seen)
    supertype = getattr(annotation, "__supertype__", None)  # a NewType
    if supertype is not None:
        yield from _wire_types_in(supertype, seen)
    origin = typing.get_origin(annotation)
    if origin is not None and origin is not typing.Literal:
        yield from _wire_types_in(origin, seen)
    if origin is not typing.Literal:
        for arg in typing.get_args(annotation):
            yield from _wire_types_in(arg, seen)


def _callables_of(cls: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The public methods and properties of `cls` defined in tidemq (in its MRO), and
    `__init__`."""
    done: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("tidemq"):
            continue
        for name, raw in vars(klass).items():
            if name in done or (name.startswith("_") and name != "__init__"):
                continue
            done.add(name)
            if isinstance(raw, property):
                if raw.fget is not None:
                    yield name, raw.fget
            elif isinstance(raw, staticmethod | classmethod):
                yield name, raw.__func__
            elif inspect.isfunction(raw):
                yield name, raw


def _hints(obj: object) -> dict[str, Any]:
    return typing.get_type_hints(obj)


def _exports() -> Iterator[tuple[str, object]]:
    for face in FACES:
        for name in face.__all__:
            yield f"{face.__name__}.{name}", getattr(face, name)


def _problems(qualname: str, obj: object) -> Iterator[str]:
    if isinstance(obj, type):
        if obj.__module__.startswith("tidemq.protocol"):
            yield f"{qualname} is a protocol type"
        if obj.__module__.startswith("tidemq"):
            for field, hint in _hints(obj).items():
                for wire in _wire_types_in(hint):
                    yield f"{qualname}.{field}: {wire}"
        for name, func in _callables_of(obj):
            for param, hint in _hints(func).items():
                for wire in _wire_types_in(hint):
                    yield f"{qualname}.{name} ({param}): {wire}"
    elif isinstance(obj, types.FunctionType):
        for param, hint in _hints(obj).items():
            for wire in _wire_types_in(hint):
                yield f"{qualname} ({param}): {wire}"


_EXPORTS = list(_exports())


# Ids from the names only: an object's repr holds its address, which differs between
# pytest-xdist workers (they must collect the same ids).
@pytest.mark.parametrize(("qualname", "obj"), _EXPORTS, ids=[name for name, _ in _EXPORTS])
def test_no_public_signature_names_a_protocol_type(qualname: str, obj: object) -> None:
    assert list(_problems(qualname, obj)) == []


def test_the_walk_sees_protocol_types_where_they_are() -> None:
    """The check itself: it finds wire types nested in unions and generics."""

    class Leaky:
        def describe(self) -> list[commands.TopicInfoMsg] | None:
            raise NotImplementedError

        def status(self, x: dict[str, tuple[commands.QueueOffset, ...]]) -> int:
            raise NotImplementedError

        @property
        def last(self) -> commands.StatusResponse:
            raise NotImplementedError

    Leaky.__module__ = "tidemq.example"
    found = list(_problems("Leaky", Leaky))
    assert len(found) == 3, found
    assert list(_wire_types_in(Callable[[commands.Empty], None])) == [
        "tidemq.protocol.commands.Empty"
    ]


def test_every_result_type_is_exported_by_both_faces_and_frozen() -> None:
    for name in results.__all__:
        if name.endswith("_from_wire"):
            continue
        cls = getattr(results, name)
        assert dataclasses.is_dataclass(cls), name
        assert vars(cls)["__dataclass_params__"].frozen, name
        assert "__slots__" in vars(cls), name
        for face in FACES:
            assert getattr(face, name) is cls, f"{face.__name__}.{name}"
            assert name in face.__all__, f"{face.__name__}.__all__ lacks {name}"


def test_every_wire_struct_converts_to_its_result() -> None:
    """A field added to a wire message and to its result, or dropped from one, shows up
    here: each result holds exactly its message's fields (converted)."""
    pairs = {
        commands.QueueInfo: results.QueueInfo,
        commands.TopicInfoMsg: results.TopicInfo,
        commands.GroupMember: results.MemberInfo,
        commands.GroupOffset: results.QueueLag,
        commands.DescribeGroupResponse: results.GroupDescription,
        commands.QueueOffset: results.CommittedOffset,
        commands.BrokerStatus: results.BrokerInfo,
        commands.StatusResponse: results.BrokerStatus,
        commands.ReplicationStatus: results.Replication,
        commands.ReplicaFollowerStatus: results.ReplicaFollower,
        commands.CancelDelayedResponse: results.CancelResult,
        commands.TimerTopicStatus: results.TimerTopicStatus,
        commands.TimerStatusResponse: results.TimerStatus,
        commands.OpenTxnInfo: results.OpenTransaction,
        commands.DiscardedTxnInfo: results.DiscardedTransaction,
        commands.TxnStatusResponse: results.TransactionStatus,
        commands.PopSuspended: results.SuspendedMessage,
        commands.PopQueueStatus: results.PopStatus,
        commands.PopResumeResponse: results.ResumeResult,
        commands.UserEntry: results.UserInfo,
        tier_messages.TierStatusResponse: results.TierStatus,
        tier_messages.TierQueueStatus: results.TierQueueStatus,
        tier_messages.TierFile: results.TierFile,
    }
    for wire, result in pairs.items():
        wire_fields = set(wire.__struct_fields__)
        result_fields = {f.name for f in dataclasses.fields(result)}
        assert wire_fields == result_fields, result.__name__


def test_a_described_group_converts_deeply() -> None:
    msg = commands.DescribeGroupResponse(
        group="g",
        generation=3,
        members=[commands.GroupMember(member_id="m", client_id="c", assignment=[("t", 0)])],
        offsets=[commands.GroupOffset(topic="t", queue=0, committed=-1, max_offset=5, lag=5)],
    )
    described = results.group_description_from_wire(msg)
    assert described == results.GroupDescription(
        group="g",
        generation=3,
        members=(results.MemberInfo(member_id="m", client_id="c", assignment=(("t", 0),)),),
        offsets=(results.QueueLag(topic="t", queue=0, committed=-1, max_offset=5, lag=5),),
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        described.generation = 4  # type: ignore[misc]
    msg.members.clear()  # the result shares nothing mutable with the message
    assert len(described.members) == 1
