"""Server configuration: one TOML file, environment overrides, `--set`, then flags.

Precedence, lowest first: the dataclass defaults, the command's own defaults (`tidemq
server` listens on 9876), the file (`--config tidemq.toml`), `TIDEMQ_<SECTION>__<KEY>`
environment variables, `--set section.key=value`, and the command's explicit flags.

Sections map onto the frozen config dataclasses: `[broker]` onto `BrokerConfig`, `[store]`
onto `StoreConfig`; keys are their field names (Kafka and RocketMQ spellings are accepted
as aliases where the meaning and unit are the same). Values are converted by the field's
type: int, float, bool, str, Path, enums (by value), `tuple[str, ...]` (a TOML array or a
comma list) and optional fields (an empty string means None). Every problem is a
`ConfigUsageError` naming the key and where it came from.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import tomllib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tidemq.broker.config import BrokerConfig
from tidemq.broker.replication_config import ReplicationConfig
from tidemq.core.errors import ConfigError
from tidemq.http.config import HttpConfig
from tidemq.store.config import StoreConfig
from tidemq.tiered.config import TieredConfig

__all__ = [
    "ENV_PREFIX",
    "SECTIONS",
    "ConfigUsageError",
    "Layer",
    "build_config",
    "convert",
    "env_layer",
    "file_layer",
    "known_keys",
    "load_broker_config",
    "load_configs",
    "merge_layers",
    "set_layer",
    "values_layer",
]

ENV_PREFIX: Final = "TIDEMQ_"

#: Section name -> the dataclass it builds.
SECTIONS: Final[dict[str, type[Any]]] = {
    "broker": BrokerConfig,
    "store": StoreConfig,
    "http": HttpConfig,
    "tiered": TieredConfig,
    "replication": ReplicationConfig,
}

#: Fields that are not settable keys (the nested store config is its own section).
_NOT_KEYS: Final = {("broker", "store"), ("broker", "tiered"), ("broker", "replication")}

#: Kafka and RocketMQ spellings of keys, only where the meaning and unit are the same.
#: (RocketMQ's fileReservedTime is in hours and its disk ratios are percentages: not aliased.)
ALIASES: Final[dict[str, dict[str, str]]] = {
    "broker": {
        "namesrvaddr": "name_servers",
        "auto.create.topics.enable": "auto_create_topics",
        "autocreatetopicenable": "auto_create_topics",
        "num.partitions": "default_queues",
        "defaulttopicqueuenums": "default_queues",
        "message.max.bytes": "max_message_bytes",
        "maxmessagesize": "max_message_bytes",
        "brokername": "broker_name",
        "listenport": "port",
        "max.connections": "max_connections",
        "max.connections.per.ip": "max_connections_per_address",
        "connections.max.idle.ms": "connection_idle_timeout_ms",
    },
    "store": {
        "log.dirs": "data_dir",
        "log.dir": "data_dir",
        "storepathrootdir": "data_dir",
        "log.segment.bytes": "segment_size_bytes",
        "mappedfilesizecommitlog": "segment_size_bytes",
        "log.flush.interval.ms": "flush_interval_ms",
        "flushintervalcommitlog": "flush_interval_ms",
        "flushdisktype": "flush_mode",
        "log.retention.ms": "retention_ms",
        "log.retention.bytes": "retention_bytes",
    },
}

#: RocketMQ's flushDiskType values, accepted for store.flush_mode.
_ENUM_ALIASES: Final[dict[str, str]] = {"sync_flush": "sync", "async_flush": "async"}

_TRUE: Final = frozenset({"true", "yes", "on", "1"})
_FALSE: Final = frozenset({"false", "no", "off", "0"})


class ConfigUsageError(ConfigError):
    """A configuration the user wrote is wrong: the CLI reports it and exits with 2."""


@dataclass(frozen=True, slots=True)
class Layer:
    """One source of settings, already converted to the fields' types."""

    #: Where the values came from, for messages ("tidemq.toml", "environment", "--set").
    source: str
    #: section -> field name -> value
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: "section.key" -> exactly where (the file, the variable, the option)
    origins: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------ keys and types


def _fields(section: str) -> dict[str, Any]:
    """Field name -> resolved type for one section's dataclass."""
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if (section, f.name) not in _NOT_KEYS and f.init
    }


def known_keys() -> list[str]:
    return [f"{s}.{k}" for s in SECTIONS for k in _fields(s)]


def _section(name: str, source: str) -> str:
    section = name.strip().lower()
    if section not in SECTIONS:
        hint = _did_you_mean(section, list(SECTIONS))
        raise ConfigUsageError(
            f"{source}: unknown config section {name!r}{hint}; known: {', '.join(SECTIONS)}"
        )
    return section


def _key(section: str, name: str, source: str) -> str:
    """The field name for `name` in `section` (field names first, then aliases)."""
    fields = _fields(section)
    lowered = name.strip().lower()
    if lowered in fields:
        return lowered
    aliases = ALIASES.get(section, {})
    if lowered in aliases:
        return aliases[lowered]
    hint = _did_you_mean(f"{section}.{lowered}", [f"{section}.{k}" for k in fields])
    raise ConfigUsageError(f"{source}: unknown config key {section}.{name}{hint}")


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


class _Bad(Exception):
    """A value that does not fit its field; `expected` says what would."""

    def __init__(self, expected: str) -> None:
        self.expected = expected


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _Bad("true or false")


def _to_int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip(), 0)  # 4096, 0x1000, 1_000_000
        except ValueError:
            pass
    raise _Bad("an integer")


def _to_float(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise _Bad("a number")


def _to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise _Bad("a string")


def _to_path(value: Any) -> Path:
    if isinstance(value, (str, Path)) and str(value):
        return Path(value).expanduser()
    raise _Bad("a path")


def _to_strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise _Bad("a list of strings (a TOML array or a comma list)")


def _to_enum(value: Any, tp: type[enum.Enum]) -> enum.Enum:
    if isinstance(value, tp):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        text = _ENUM_ALIASES.get(text, text)
        for member in tp:
            if str(member.value).lower() == text:
                return member
    raise _Bad(" or ".join(str(m.value) for m in tp))


_SIMPLE: Final[dict[Any, Callable[[Any], Any]]] = {
    bool: _to_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
    Path: _to_path,
}


def _convert(value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):  # `X | None`: "" or None is None
        if value is None or value == "":
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(value, inner)
    if origin is tuple:
        return _to_strings(value)
    if tp in _SIMPLE:
        return _SIMPLE[tp](value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _to_enum(value, tp)
    raise _Bad(f"a {tp}")  # pragma: no cover - a field type this loader does not know


def convert(value: Any, tp: Any, key: str, source: str) -> Any:
    """`value` (from TOML, a string from env/--set, or a typed flag) as a `tp`."""
    try:
        return _convert(value, tp)
    except _Bad as bad:
        raise ConfigUsageError(f"{source}: {key} must be {bad.expected}, got {value!r}") from None


def _put(
    layer: Layer, section: str, key: str, value: Any, origin: str, *, repeat: bool = False
) -> None:
    """Convert and store one setting. Within one file or environment a key may appear
    once (a field and its alias together is a mistake); repeated `--set`s: the last wins."""
    field_name = _key(section, key, origin)
    tp = _fields(section)[field_name]
    name = f"{section}.{field_name}"
    values = layer.values.setdefault(section, {})
    if field_name in values and not repeat:
        raise ConfigUsageError(f"{origin}: {name} is given twice (as itself and an alias)")
    values[field_name] = convert(value, tp, name, origin)
    layer.origins[name] = origin


# ------------------------------------------------------------------ layers


def file_layer(path: Path) -> Layer:
    """Settings from a TOML file with `[broker]` and `[store]` tables."""
    source = str(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigUsageError(f"config file {source} does not exist") from None
    except OSError as exc:
        raise ConfigUsageError(f"cannot read config file {source}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigUsageError(f"{source}: invalid TOML: {exc}") from None
    return values_layer(data, source)


def values_layer(data: Mapping[str, Any], source: str) -> Layer:
    """Settings from a nested mapping: {"broker": {...}, "store": {...}}."""
    layer = Layer(source)
    for name, table in data.items():
        if not isinstance(table, Mapping):
            raise ConfigUsageError(
                f"{source}: top-level key {name!r}: put settings under [broker] or [store]"
            )
        section = _section(name, source)
        for key, value in table.items():
            if isinstance(value, Mapping):
                # `message.max.bytes = 1` in TOML is a nested table; the key must be quoted.
                raise ConfigUsageError(
                    f"{source}: unknown config key {section}.{key} (a table; quote dotted "
                    f'keys: "{key}.…" = value)'
                )
            _put(layer, section, str(key), value, source)
    return layer


def env_layer(environ: Mapping[str, str]) -> Layer:
    """`TIDEMQ_<SECTION>__<KEY>=value` variables (case-insensitive; other TIDEMQ_ variables
    without a double underscore are not settings and are ignored)."""
    layer = Layer("environment")
    for name in sorted(environ):
        if not name.upper().startswith(ENV_PREFIX) or "__" not in name:
            continue
        section_name, _, key = name[len(ENV_PREFIX) :].partition("__")
        section = _section(section_name, name)
        _put(layer, section, key, environ[name], name)
    return layer


def set_layer(items: Iterable[str]) -> Layer:
    """`--set section.key=value` options."""
    layer = Layer("--set")
    for item in items:
        name, sep, value = item.partition("=")
        section_name, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise ConfigUsageError(
                f"--set {item!r}: use section.key=value, e.g. store.flush_mode=async"
            )
        origin = f"--set {name.strip()}"
        _put(layer, _section(section_name, origin), key, value, origin, repeat=True)
    return layer


def merge_layers(layers: Iterable[Layer]) -> dict[str, dict[str, Any]]:
    """Later layers win, key by key."""
    merged: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for layer in layers:
        for section, values in layer.values.items():
            merged[section].update(values)
    return merged


def _origins(layers: Iterable[Layer]) -> dict[str, str]:
    """ "section.key" -> the source of the value that won."""
    found: dict[str, str] = {}
    for layer in layers:
        found.update(layer.origins)
    return found


def build_config(
    merged: Mapping[str, Mapping[str, Any]], origins: Mapping[str, str] | None = None
) -> BrokerConfig:
    """The frozen configs from merged, already converted values. The dataclasses check
    ranges; their errors name the key (and, given `origins`, where its value came from)
    and become ConfigUsageError."""
    try:
        store_values = dict(merged.get("store", {}))
        store_values.setdefault("data_dir", Path("data"))
        store = StoreConfig(**store_values)
        tiered = TieredConfig(**dict(merged.get("tiered", {})))
        replication = ReplicationConfig(**dict(merged.get("replication", {})))
        return BrokerConfig(
            **dict(merged.get("broker", {})), store=store, tiered=tiered, replication=replication
        )
    except ConfigUsageError:
        raise
    except ConfigError as exc:
        message = str(exc)
        sources = sorted(
            {src for key, src in (origins or {}).items() if key in message and src != "defaults"}
        )
        if sources:
            message += f" (set in {', '.join(sources)})"
        raise ConfigUsageError(message) from None


def load_broker_config(
    *,
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    sets: Iterable[str] = (),
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> BrokerConfig:
    """Defaults < file < environment < --set < flags. `flags` holds only the flags the user
    gave (None values are dropped), as typed values."""
    return load_configs(
        defaults=defaults, config_file=config_file, environ=environ, sets=sets, flags=flags
    )[0]


def load_configs(
    *,
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    sets: Iterable[str] = (),
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[BrokerConfig, HttpConfig]:
    """`load_broker_config`, and the `[http]` section's settings."""
    layers = []
    if defaults:
        layers.append(values_layer(defaults, "defaults"))
    if config_file is not None:
        layers.append(file_layer(config_file))
    if environ is not None:
        layers.append(env_layer(environ))
    layers.append(set_layer(sets))
    if flags:
        given = {s: {k: v for k, v in kv.items() if v is not None} for s, kv in flags.items()}
        layers.append(values_layer(given, "command-line flags"))
    merged, origins = merge_layers(layers), _origins(layers)
    broker = build_config(merged, origins)
    try:
        http = HttpConfig(**dict(merged.get("http", {})))
    except ConfigError as exc:
        raise ConfigUsageError(str(exc)) from None
    return broker, http
