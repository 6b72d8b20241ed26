"""Avro schemas derived from Python types: dataclasses and `msgspec.Struct`s, by their
type hints, and turning Avro records back into those types.

| Python | Avro |
|---|---|
| `bool`, `int`, `float`, `str`, `bytes` | boolean, long, double, string, bytes |
| `X | None` (`Optional[X]`) | `["null", X]`, default null |
| `list[X]`, `tuple[X, ...]` | array |
| `dict[str, X]` | map |
| an `enum.Enum` of strings | enum (its values) |
| `datetime.datetime` (aware) | long, logicalType timestamp-millis |
| `datetime.date` | int, logicalType date |
| `decimal.Decimal` | not derived (say the schema yourself) |
| a nested dataclass or Struct | record |

A field with a default gets it as its Avro default (so adding one is a compatible change).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import types
import typing
from typing import Any, Final, Union

import msgspec

__all__ = ["avro_schema_of", "from_avro_record", "to_avro_record"]

_PRIMITIVES: Final[dict[type, str]] = {
    bool: "boolean",
    int: "long",
    float: "double",
    str: "string",
    bytes: "bytes",
}


@functools.lru_cache(maxsize=256)
def _fields(cls: type) -> list[tuple[str, Any, Any]]:
    """(name, type hint, default or dataclasses.MISSING) of a dataclass or Struct
    (cached: type hints are resolved once per class)."""
    hints = typing.get_type_hints(cls)
    if dataclasses.is_dataclass(cls):
        out = []
        for f in dataclasses.fields(cls):
            default: Any = dataclasses.MISSING
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            out.append((f.name, hints[f.name], default))
        return out
    if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        info = msgspec.structs.fields(cls)
        return [
            (
                f.name,
                hints[f.name],
                f.default
                if f.default is not msgspec.NODEFAULT
                else (
                    f.default_factory()
                    if f.default_factory is not msgspec.NODEFAULT
                    else dataclasses.MISSING
                ),
            )
            for f in info
        ]
    raise TypeError(f"{cls!r} is neither a dataclass nor a msgspec.Struct")


def avro_schema_of(cls: type, *, namespace: str | None = None) -> dict[str, Any]:
    """The Avro record schema of a dataclass or `msgspec.Struct` (TypeError naming the
    field whose type has no Avro equivalent)."""
    schema: dict[str, Any] = _record(cls, namespace, set())
    return schema


def _record(cls: type, namespace: str | None, seen: set[str]) -> Any:
    name = cls.__name__
    if name in seen:
        return name  # a named type used again (or recursively): by name
    seen.add(name)
    fields = []
    for field_name, hint, default in _fields(cls):
        try:
            avro_type = _avro_type(hint, namespace, seen)
        except TypeError as exc:
            raise TypeError(f"{name}.{field_name}: {exc}") from None
        field: dict[str, Any] = {"name": field_name, "type": avro_type}
        if default is not dataclasses.MISSING:
            field["default"] = _avro_default(default)
        fields.append(field)
    schema: dict[str, Any] = {"type": "record", "name": name, "fields": fields}
    if namespace:
        schema["namespace"] = namespace
    return schema


def _avro_type(hint: Any, namespace: str | None, seen: set[str]) -> Any:
    origin = typing.get_origin(hint)
    if origin is not None:
        return _generic_type(origin, typing.get_args(hint), namespace, seen)
    if hint in _PRIMITIVES:
        return _PRIMITIVES[hint]
    logical = _LOGICAL.get(hint)
    if logical is not None:
        return dict(logical)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if hint.__name__ in seen:
            return hint.__name__
        seen.add(hint.__name__)
        return {"type": "enum", "name": hint.__name__, "symbols": [str(m.value) for m in hint]}
    if _is_record(hint):
        return _record(hint, namespace, seen)
    raise TypeError(f"no Avro type for {hint!r}")


_LOGICAL: Final[dict[type, dict[str, str]]] = {
    datetime.datetime: {"type": "long", "logicalType": "timestamp-millis"},
    datetime.date: {"type": "int", "logicalType": "date"},
}


def _is_record(hint: Any) -> bool:
    return isinstance(hint, type) and (
        dataclasses.is_dataclass(hint) or issubclass(hint, msgspec.Struct)
    )


def _generic_type(origin: Any, args: tuple[Any, ...], namespace: str | None, seen: set[str]) -> Any:
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        inner = [_avro_type(a, namespace, seen) for a in members]
        return ["null", *inner] if len(members) < len(args) else inner
    if origin in (list, tuple) and args:
        return {"type": "array", "items": _avro_type(args[0], namespace, seen)}
    if origin is dict and args:
        if args[0] is not str:
            raise TypeError(f"Avro maps have string keys, not {args[0]!r}")
        return {"type": "map", "values": _avro_type(args[1], namespace, seen)}
    raise TypeError(f"no Avro type for {origin!r}{list(args)}")


def _avro_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bytes):
        return value.decode("latin-1")  # Avro's JSON encoding of bytes defaults
    if isinstance(value, list | tuple):
        return [_avro_default(v) for v in value]
    if isinstance(value, dict):
        return {k: _avro_default(v) for k, v in value.items()}
    return value


#: Values fastavro writes as they are (no conversion per value).
_AS_IS: Final = (*_PRIMITIVES, datetime.datetime, datetime.date, type(None))


def _plain(hint: Any) -> bool:
    if hint in _AS_IS:
        return True
    if typing.get_origin(hint) in (Union, types.UnionType):
        return all(a in _AS_IS for a in typing.get_args(hint))
    return False


_PLANS: dict[type, tuple[tuple[str, bool], ...]] = {}


def _plan(cls: type) -> tuple[tuple[str, bool], ...]:
    """Each field's name, and whether its values go to fastavro as they are (cached)."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = tuple((name, _plain(hint)) for name, hint, _ in _fields(cls))
    return plan


def to_avro_record(obj: Any) -> Any:
    """A dataclass or Struct (recursively) as the dict fastavro writes."""
    cls = type(obj)
    if dataclasses.is_dataclass(cls) or isinstance(obj, msgspec.Struct):
        return {
            name: value if plain else to_avro_record(value)
            for name, plain in _plan(cls)
            for value in (getattr(obj, name),)
        }
    if isinstance(obj, enum.Enum):
        return str(obj.value)
    if isinstance(obj, list | tuple):
        return [to_avro_record(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_avro_record(v) for k, v in obj.items()}
    return obj


def from_avro_record(cls: type, data: Any) -> Any:
    """`data` (as fastavro read it) as an instance of `cls`, recursively."""
    return _convert(cls, data)


def _convert(hint: Any, data: Any) -> Any:
    if data is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is not None:
        return _convert_generic(origin, args, data)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(data)
    if _is_record(hint):
        kwargs = {name: _convert(h, data.get(name)) for name, h, _ in _fields(hint) if name in data}
        return hint(**kwargs)
    return data


def _convert_generic(origin: Any, args: tuple[Any, ...], data: Any) -> Any:
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        return _convert(members[0], data) if len(members) == 1 else data
    if origin is list and args:
        return [_convert(args[0], v) for v in data]
    if origin is tuple and args:
        return tuple(_convert(args[0], v) for v in data)
    if origin is dict and args:
        return {k: _convert(args[1], v) for k, v in data.items()}
    return data
