"""The data source's options, parsed and checked once. Pure Python: no pyspark, no I/O.

Names follow Spark's Kafka source (`spark-sql-kafka-0-10`). Spark hands the options over
as a case-insensitive dict with lower-cased keys; these functions accept any mapping and
look names up case-insensitively (without replacing the caller's mapping). Every error is
an `OptionError` (a ValueError) whose message names the option.

Reading:

====================== ================================================================
``bootstrap``          name server ``host:port`` (aliases ``tidemq.bootstrap.servers``,
                       ``kafka.bootstrap.servers``); required
``subscribe``          comma-separated topics          } exactly one
``subscribePattern``   regex over topic names (full)   } of these
``assign``             JSON ``{"orders": [0, 1]}``     } three
``startingOffsets``    ``earliest`` | ``latest`` | JSON ``{"orders": {"0": 23, "1": -2}}``
                       (-2 earliest, -1 latest); default latest (streams), earliest (batch)
``endingOffsets``      batch only: ``latest`` (default) | JSON (-1 latest)
``startingTimestamp``  ms since the epoch: each queue starts at its first message whose
                       timestamp is at or after it (takes precedence over
                       ``startingOffsetsByTimestamp``, JSON ``{"orders": {"0": ms}}``,
                       which takes precedence over ``startingOffsets``)
``endingTimestamp``    batch only: the same for the end (exclusive), over
                       ``endingOffsetsByTimestamp`` over ``endingOffsets``
``maxOffsetsPerTrigger`` rows per micro-batch, split over the queues in proportion
                       to what each has to read (alias ``maxRecordsPerBatch``)
``minOffsetsPerTrigger`` streams: a micro-batch waits for this many new offsets, at
                       most ``maxTriggerDelay`` (default 15m) after the last one
                       (`trigger_limits`)
``failOnDataLoss``     ``true`` (default): offsets removed by retention fail the query
``includeHeaders``     ``false`` (default): add the ``headers`` column
``minPartitions``      split queue ranges until there are at least this many partitions
                       (default: a range far above the mean is cut to about the mean's
                       size, `planning.AUTO_SPLIT_MIN_OFFSETS` at least; 1: no split)
``fetchMaxBytes``      bytes per fetch request (default 8 MiB)
``readFromTier``       ``auto`` (default): offloaded ranges of ordinary topics are read
                       from the tier's Parquet files by the executors (the broker lists
                       them); ``never``: everything through the broker
``tidemq.tier.*``      ``endpoint``, ``region``, ``accessKeyId``, ``secretAccessKey``: how
                       executors reach an S3 tier (default: the AWS credential chain)
====================== ================================================================

Writing: ``bootstrap`` as above, ``topic`` (overrides the ``topic`` column),
``createTopic`` (``false`` by default: a missing topic fails the query when it starts;
``true`` creates it, with ``createTopic.queues`` queues, default 8).

Connecting, for reads and writes (the client's `ClientConfig`, with a ``tidemq.`` prefix):
``tidemq.username`` and ``tidemq.password`` (SCRAM login; Spark's default
``spark.redaction.regex`` hides the password in its UI and logs), ``tidemq.tls``
(``true``: TLS, verified against the system's CAs), ``tidemq.tls.caFile``,
``tidemq.tls.certFile``, ``tidemq.tls.keyFile`` (PEM files, which must exist at the same
path wherever the driver and the executors run; any of them implies TLS).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from tidemq.client.cluster import ClientConfig
from tidemq.core import limits
from tidemq.net.tls import client_context
from tidemq.spark.trigger_limits import DEFAULT_MAX_TRIGGER_DELAY_MS, TriggerLimits, trigger_limits
from tidemq.spark.value_format import ValueFormat

__all__ = [
    "CLIENT_OPTIONS",
    "EARLIEST",
    "LATEST",
    "READ_OPTIONS",
    "TIER_OPTIONS",
    "WRITE_OPTIONS",
    "Assign",
    "ClientOptions",
    "OffsetSpec",
    "OptionError",
    "ReadOptions",
    "Subscribe",
    "SubscribePattern",
    "Subscription",
    "TierAccess",
    "WriteOptions",
    "check_known",
    "include_headers",
    "parse_read_options",
    "parse_write_options",
]

#: In offsets JSON, as in Kafka's: -2 is the queue's earliest offset, -1 its latest.
EARLIEST: Final = -2
LATEST: Final = -1

BOOTSTRAP_NAMES: Final = ("bootstrap", "tidemq.bootstrap.servers", "kafka.bootstrap.servers")
DEFAULT_FETCH_MAX_BYTES: Final = 8 << 20
#: Queues of a topic the writer creates (`createTopic=true`), as `Admin.create_topic`'s.
DEFAULT_CREATE_QUEUES: Final = 8
# Kafka source options tidemq does not implement yet: refused rather than ignored, so that
# nobody believes they took effect.
_UNSUPPORTED: Final = (
    "startingOffsetsByTimestampStrategy",
    "groupIdPrefix",
    "kafka.group.id",
)
_TOPIC: Final = re.compile(limits.TOPIC_NAME_PATTERN)
#: Every option the source reads (Spark hands them over lower-cased; these are the names
#: users write, for messages and "did you mean").
#: Options of the connection itself, for reads and writes.
CLIENT_OPTIONS: Final = (
    "tidemq.username",
    "tidemq.password",
    "tidemq.tls",
    "tidemq.tls.caFile",
    "tidemq.tls.certFile",
    "tidemq.tls.keyFile",
)
#: How executors reach the tier's object store (`spark.tier_files`).
TIER_OPTIONS: Final = (
    "tidemq.tier.endpoint",
    "tidemq.tier.region",
    "tidemq.tier.accessKeyId",
    "tidemq.tier.secretAccessKey",
)
READ_OPTIONS: Final = (
    *BOOTSTRAP_NAMES,
    *CLIENT_OPTIONS,
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
    "maxOffsetsPerTrigger",
    "maxRecordsPerBatch",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "failOnDataLoss",
    "includeHeaders",
    "minPartitions",
    "fetchMaxBytes",
    "readFromTier",
    *TIER_OPTIONS,
    # valueFormat=avro|json|protobuf (tidemq.spark.value_format)
    "valueFormat",
    "schemaRegistry",
    "subject",
    "schemaVersion",
    "protobufMessage",
    "schemaRegistry.username",
    "schemaRegistry.password",
    "schemaRegistry.caFile",
)
WRITE_OPTIONS: Final = (
    *BOOTSTRAP_NAMES,
    *CLIENT_OPTIONS,
    "topic",
    "createTopic",
    "createTopic.queues",
    "valueFormat",
    "schemaRegistry",
    "subject",
    "schemaVersion",
    "protobufMessage",
    "schemaRegistry.username",
    "schemaRegistry.password",
    "schemaRegistry.caFile",
)
#: Kafka client options users carry over, and what to do instead in tidemq.
_KAFKA_INSTEAD: Final = {
    "kafka.group.id": "none: the query's checkpoint keeps its offsets",
    "kafka.security.protocol": "'tidemq.tls' (and 'tidemq.username'/'tidemq.password')",
    "kafka.sasl.mechanism": "'tidemq.username' and 'tidemq.password' (SCRAM-SHA-256)",
    "kafka.sasl.jaas.config": "'tidemq.username' and 'tidemq.password'",
    "kafka.ssl.truststore.location": "'tidemq.tls.caFile' (PEM)",
    "kafka.ssl.keystore.location": "'tidemq.tls.certFile' and 'tidemq.tls.keyFile' (PEM)",
    "kafka.max.poll.records": "'maxOffsetsPerTrigger'",
    "kafka.fetch.max.bytes": "'fetchMaxBytes'",
    "kafka.max.partition.fetch.bytes": "'fetchMaxBytes'",
    "kafka.auto.offset.reset": "'startingOffsets'",
}


class OptionError(ValueError):
    """A data source option is missing, misspelt or has a bad value."""


@dataclass(frozen=True, slots=True)
class Subscribe:
    topics: tuple[str, ...]

    def matches(self, topic: str) -> bool:
        return topic in self.topics


@dataclass(frozen=True, slots=True)
class SubscribePattern:
    pattern: str

    def matches(self, topic: str) -> bool:
        return re.fullmatch(self.pattern, topic) is not None


@dataclass(frozen=True, slots=True)
class Assign:
    #: (topic, sorted queue ids), sorted by topic.
    queues: tuple[tuple[str, tuple[int, ...]], ...]

    def matches(self, topic: str) -> bool:
        return any(t == topic for t, _ in self.queues)


Subscription = Subscribe | SubscribePattern | Assign


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where reading starts or ends: every queue's earliest or latest offset, or given
    offsets per queue (EARLIEST / LATEST allowed as values), or a timestamp for every
    queue, or timestamps per queue (each queue at its first message at or after its
    time; queues left out at the default)."""

    kind: Literal["earliest", "latest", "offsets", "timestamp", "timestamps"]
    #: kind "offsets": topic -> queue -> offset (or EARLIEST / LATEST); kind "timestamps":
    #: topic -> queue -> milliseconds since the epoch (`...OffsetsByTimestamp`)
    offsets: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    #: kind "timestamp": milliseconds since the epoch
    timestamp_ms: int = 0

    def as_dict(self) -> dict[tuple[str, int], int]:
        return {(t, q): o for t, queues in self.offsets for q, o in queues}


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """How the connector's clients connect (hashable: one shared client per setting)."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def client_config(self) -> ClientConfig:
        """The client's config (the TLS context made here, in the calling process: an
        SSLContext does not travel to executors, its file names do)."""
        context = None
        if self.tls:
            context = client_context(
                ca_file=self.ca_file, cert_file=self.cert_file, key_file=self.key_file
            )
        return ClientConfig(ssl_context=context, username=self.username, password=self.password)

    def source_options(self) -> dict[str, str]:
        """The `tidemq.*` options of the source and the sinks that give this setting."""
        out: dict[str, str] = {}
        if self.username is not None and self.password is not None:
            out["tidemq.username"], out["tidemq.password"] = self.username, self.password
        if self.tls:
            out["tidemq.tls"] = "true"
        for name, value in (
            ("caFile", self.ca_file), ("certFile", self.cert_file), ("keyFile", self.key_file),
        ):  # fmt: skip
            if value is not None:
                out[f"tidemq.tls.{name}"] = value
        return out


@dataclass(frozen=True, slots=True)
class TierAccess:
    """How executors reach the tier's object store (S3 settings; none for a directory,
    or to use the AWS defaults: environment, credential files, instance role)."""

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    bootstrap: str
    subscription: Subscription
    starting: OffsetSpec
    #: Batch queries only; streams have no end.
    ending: OffsetSpec | None
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    include_headers: bool
    min_partitions: int | None
    fetch_max_bytes: int
    client: ClientOptions = ClientOptions()
    #: Offloaded ranges of ordinary topics read from the tier's files (`readFromTier`).
    read_from_tier: bool = True
    tier: TierAccess = TierAccess()
    #: Streams: a micro-batch waits for this many new offsets (`minOffsetsPerTrigger`),
    #: at most `max_trigger_delay_ms` after the last one (`trigger_limits`).
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS

    def trigger_limits(self) -> TriggerLimits:
        """The read limits the options give (Spark may ask for less: everything)."""
        return TriggerLimits(
            self.min_offsets_per_trigger, self.max_offsets_per_trigger, self.max_trigger_delay_ms
        )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    bootstrap: str
    #: Overrides the DataFrame's `topic` column when set.
    topic: str | None
    #: Create a missing target topic (with `create_queues` queues) instead of failing.
    create_topic: bool = False
    create_queues: int = DEFAULT_CREATE_QUEUES
    client: ClientOptions = ClientOptions()
    #: A struct `value` column encoded as Avro or JSON (`spark.value_encode`), resolved on
    #: the driver when the write starts; None: the column is binary or string.
    value_format: ValueFormat | None = None


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def check_known(opts: Mapping[str, str], known: Collection[str], what: str) -> None:
    """Refuse an option that `what` does not read (an unknown name would otherwise be
    ignored, and the user would believe it took effect): the error names it, with the
    closest known names, or, for a Kafka client option (`kafka.*`), what to use instead."""
    by_lower = {name.lower(): name for name in known}
    for key in sorted(opts):
        name = key.lower()
        if name in by_lower:
            continue
        if name.startswith("kafka."):
            instead = _KAFKA_INSTEAD.get(name, "see the options of the tidemq connector")
            raise OptionError(
                f"option {key!r} is a Kafka client option; tidemq does not use them "
                f"(instead: {instead})"
            )
        close = difflib.get_close_matches(name, by_lower, n=3, cutoff=0.75)
        hint = (
            f"; did you mean {' or '.join(repr(by_lower[c]) for c in close)}?"
            if close
            else f"; known: {', '.join(sorted(set(known)))}"
        )
        raise OptionError(f"unknown option {key!r} for {what}{hint}")


def _get(opts: dict[str, str], name: str) -> str | None:
    return opts.get(name.lower())


def _bootstrap(opts: dict[str, str]) -> str:
    given = {name: opts[name.lower()] for name in BOOTSTRAP_NAMES if name.lower() in opts}
    if not given:
        raise OptionError(
            "option 'bootstrap' is required: the name server's host:port "
            "(aliases 'tidemq.bootstrap.servers', 'kafka.bootstrap.servers')"
        )
    values = {v.strip() for v in given.values()}
    if len(values) > 1:
        raise OptionError(f"options {', '.join(repr(n) for n in given)} disagree: {given}")
    value = values.pop()
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        name = next(iter(given))
        raise OptionError(f"option {name!r} must be host:port, got {value!r}")
    return value


def _client(opts: dict[str, str]) -> ClientOptions:
    username = _get(opts, "tidemq.username")
    password = _get(opts, "tidemq.password")
    if (username is None) != (password is None):
        raise OptionError("options 'tidemq.username' and 'tidemq.password' go together")
    files = {name: _get(opts, f"tidemq.tls.{name}") for name in ("caFile", "certFile", "keyFile")}
    if (files["certFile"] is None) != (files["keyFile"] is None):
        raise OptionError("options 'tidemq.tls.certFile' and 'tidemq.tls.keyFile' go together")
    tls = _bool("tidemq.tls", _get(opts, "tidemq.tls"), any(f is not None for f in files.values()))
    if not tls and any(f is not None for f in files.values()):
        raise OptionError("option 'tidemq.tls' is false but a 'tidemq.tls.*' file is given")
    return ClientOptions(
        username=username,
        password=password,
        tls=tls,
        ca_file=files["caFile"],
        cert_file=files["certFile"],
        key_file=files["keyFile"],
    )


def _topic_name(option: str, name: str) -> str:
    if not _TOPIC.match(name):
        raise OptionError(f"option {option!r}: {name!r} is not a valid topic name")
    return name


def _json(option: str, text: str) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise OptionError(f"option {option!r} is not valid JSON ({exc}): {text!r}") from None


def _int(option: str, text: str, *, minimum: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"option {option!r} must be an integer, got {text!r}") from None
    if value < minimum:
        raise OptionError(f"option {option!r} must be >= {minimum}, got {value}")
    return value


def _bool(option: str, text: str | None, default: bool) -> bool:
    if text is None:
        return default
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option {option!r} must be true or false, got {text!r}")
    return value == "true"


def _subscription(opts: dict[str, str]) -> Subscription:
    given = [n for n in ("subscribe", "subscribePattern", "assign") if _get(opts, n) is not None]
    if len(given) != 1:
        found = f"got {', '.join(repr(n) for n in given)}" if given else "got none"
        raise OptionError(
            f"give exactly one of the options 'subscribe', 'subscribePattern', 'assign' ({found})"
        )
    name = given[0]
    text = _get(opts, name)
    assert text is not None
    if name == "subscribe":
        topics = [t.strip() for t in text.split(",") if t.strip()]
        if not topics:
            raise OptionError("option 'subscribe' names no topic")
        return Subscribe(tuple(sorted({_topic_name(name, t) for t in topics})))
    if name == "subscribePattern":
        try:
            re.compile(text)
        except re.error as exc:
            raise OptionError(f"option 'subscribePattern' is not a valid regex: {exc}") from None
        return SubscribePattern(text)
    raw = _json(name, text)
    if not isinstance(raw, dict) or not raw:
        example = '{"orders": [0, 1]}'
        raise OptionError(f"option 'assign' must be a JSON object like {example}, got {text!r}")
    queues: list[tuple[str, tuple[int, ...]]] = []
    for topic, ids in sorted(raw.items()):
        _topic_name(name, topic)
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(q, int) and not isinstance(q, bool) and q >= 0 for q in ids)
        ):
            raise OptionError(
                f"option 'assign': topic {topic!r} needs a non-empty list of queue ids >= 0, "
                f"got {ids!r}"
            )
        queues.append((topic, tuple(sorted(set(ids)))))
    return Assign(tuple(queues))


def _offset_spec(option: str, text: str, *, ending: bool) -> OffsetSpec:
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        if ending and word == "earliest":
            raise OptionError(f"option {option!r} cannot be 'earliest'")
        return OffsetSpec("earliest" if word == "earliest" else "latest")
    raw = _json(option, text)
    example = '{"orders": {"0": 23, "1": -2}}'
    if not isinstance(raw, dict):
        raise OptionError(
            f"option {option!r} must be 'earliest', 'latest' or JSON like {example}, got {text!r}"
        )
    offsets: list[tuple[str, tuple[tuple[int, int], ...]]] = []
    for topic, per_queue in sorted(raw.items()):
        _topic_name(option, topic)
        if not isinstance(per_queue, dict):
            raise OptionError(f"option {option!r}: topic {topic!r} needs an object like {example}")
        pairs: list[tuple[int, int]] = []
        for q, offset in per_queue.items():
            if not (isinstance(q, str) and q.isdigit()):
                raise OptionError(f"option {option!r}: queue id {q!r} of {topic!r} is not >= 0")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise OptionError(
                    f"option {option!r}: offset {offset!r} of {topic}/{q} must be an offset "
                    ">= 0, -2 (earliest) or -1 (latest)"
                )
            if ending and offset == EARLIEST:
                raise OptionError(f"option {option!r}: {topic}/{q} cannot end at -2 (earliest)")
            pairs.append((int(q), offset))
        offsets.append((topic, tuple(sorted(pairs))))
    return OffsetSpec("offsets", tuple(offsets))


def _check_spec_topics(option: str, spec: OffsetSpec, subscription: Subscription) -> None:
    for topic, queues in spec.offsets:
        if not subscription.matches(topic):
            raise OptionError(f"option {option!r} names topic {topic!r}, which is not subscribed")
        if isinstance(subscription, Assign):
            assigned = dict(subscription.queues)[topic]
            extra = sorted(q for q, _ in queues if q not in assigned)
            if extra:
                raise OptionError(
                    f"option {option!r} names queues {extra} of {topic!r}, which are not assigned"
                )


def _starting(opts: dict[str, str], subscription: Subscription, *, streaming: bool) -> OffsetSpec:
    text = _get(opts, "startingOffsets")
    if text is None:
        starting = OffsetSpec("latest" if streaming else "earliest")
    else:
        starting = _offset_spec("startingOffsets", text, ending=False)
        _check_spec_topics("startingOffsets", starting, subscription)
    if not streaming and (
        starting.kind == "latest" or any(o == LATEST for o in starting.as_dict().values())
    ):
        raise OptionError(
            "option 'startingOffsets' cannot be latest (-1) for a batch query: it would read "
            "nothing"
        )
    # Kafka's rule: startingTimestamp, then startingOffsetsByTimestamp, then
    # startingOffsets.
    return _by_time(opts, subscription, "starting") or starting


def _by_time(opts: dict[str, str], subscription: Subscription, end: str) -> OffsetSpec | None:
    """`<end>Timestamp` (every queue) or `<end>OffsetsByTimestamp` (JSON per queue), the
    first given in that order; None if neither is."""
    ts_text = _get(opts, f"{end}Timestamp")
    if ts_text is not None:
        return OffsetSpec("timestamp", timestamp_ms=_int(f"{end}Timestamp", ts_text, minimum=0))
    option = f"{end}OffsetsByTimestamp"
    text = _get(opts, option)
    if text is None:
        return None
    raw = _json(option, text)
    example = '{"orders": {"0": 1700000000000}}'
    if not isinstance(raw, dict) or not raw:
        raise OptionError(f"option {option!r} must be JSON like {example}, got {text!r}")
    per_topic: list[tuple[str, tuple[tuple[int, int], ...]]] = []
    for topic, per_queue in sorted(raw.items()):
        _topic_name(option, topic)
        if not isinstance(per_queue, dict) or not per_queue:
            raise OptionError(f"option {option!r}: topic {topic!r} needs an object like {example}")
        pairs = []
        for q, ts in per_queue.items():
            if not (isinstance(q, str) and q.isdigit()):
                raise OptionError(f"option {option!r}: queue id {q!r} of {topic!r} is not >= 0")
            if not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
                raise OptionError(
                    f"option {option!r}: timestamp {ts!r} of {topic}/{q} must be milliseconds "
                    "since the epoch, >= 0"
                )
            pairs.append((int(q), ts))
        per_topic.append((topic, tuple(sorted(pairs))))
    spec = OffsetSpec("timestamps", tuple(per_topic))
    _check_spec_topics(option, spec, subscription)
    return spec


def _ending(
    opts: dict[str, str], subscription: Subscription, *, streaming: bool
) -> OffsetSpec | None:
    text = _get(opts, "endingOffsets")
    if streaming:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if _get(opts, name) is not None:
                raise OptionError(f"option {name!r} is for batch queries only")
        return None
    by_time = _by_time(opts, subscription, "ending")
    if by_time is not None:
        return by_time
    if text is None:
        return OffsetSpec("latest")
    ending = _offset_spec("endingOffsets", text, ending=True)
    _check_spec_topics("endingOffsets", ending, subscription)
    return ending


def _read_limit(opts: dict[str, str]) -> int | None:
    limit: int | None = None
    for name in ("maxOffsetsPerTrigger", "maxRecordsPerBatch"):
        text = _get(opts, name)
        if text is not None:
            value = _int(name, text, minimum=1)
            if limit is not None and value != limit:
                raise OptionError(
                    "options 'maxOffsetsPerTrigger' and 'maxRecordsPerBatch' are aliases and "
                    f"disagree ({limit} != {value})"
                )
            limit = value
    return limit


def _trigger_limits(opts: dict[str, str], *, streaming: bool) -> TriggerLimits:
    min_text = _get(opts, "minOffsetsPerTrigger")
    delay_text = _get(opts, "maxTriggerDelay")
    if not streaming:
        for name, text in (("minOffsetsPerTrigger", min_text), ("maxTriggerDelay", delay_text)):
            if text is not None:
                raise OptionError(f"option {name!r} is for streaming queries only")
    minimum = None if min_text is None else _int("minOffsetsPerTrigger", min_text, minimum=1)
    try:
        return trigger_limits(minimum, _read_limit(opts), delay_text)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check and parse the options of a batch (`streaming=False`) or streaming read."""
    opts = _lower(options)
    for name in _UNSUPPORTED:
        if name.lower() in opts:
            raise OptionError(f"option {name!r} is not supported by the tidemq source yet")
    check_known(opts, READ_OPTIONS, "the tidemq source")
    bootstrap = _bootstrap(opts)
    subscription = _subscription(opts)
    min_text = _get(opts, "minPartitions")
    fetch_text = _get(opts, "fetchMaxBytes")
    trigger = _trigger_limits(opts, streaming=streaming)
    return ReadOptions(
        bootstrap=bootstrap,
        subscription=subscription,
        starting=_starting(opts, subscription, streaming=streaming),
        ending=_ending(opts, subscription, streaming=streaming),
        max_offsets_per_trigger=trigger.max_offsets,
        min_offsets_per_trigger=trigger.min_offsets,
        max_trigger_delay_ms=trigger.max_trigger_delay_ms,
        fail_on_data_loss=_bool("failOnDataLoss", _get(opts, "failOnDataLoss"), True),
        include_headers=_bool("includeHeaders", _get(opts, "includeHeaders"), False),
        min_partitions=None if min_text is None else _int("minPartitions", min_text, minimum=1),
        fetch_max_bytes=(
            DEFAULT_FETCH_MAX_BYTES
            if fetch_text is None
            else _int("fetchMaxBytes", fetch_text, minimum=1024)
        ),
        client=_client(opts),
        read_from_tier=_read_from_tier(opts),
        tier=TierAccess(
            endpoint=_get(opts, "tidemq.tier.endpoint"),
            region=_get(opts, "tidemq.tier.region"),
            access_key_id=_get(opts, "tidemq.tier.accessKeyId"),
            secret_access_key=_get(opts, "tidemq.tier.secretAccessKey"),
        ),
    )


def _read_from_tier(opts: dict[str, str]) -> bool:
    text = (_get(opts, "readFromTier") or "auto").strip().lower()
    if text not in {"auto", "never"}:
        raise OptionError(f"option 'readFromTier' must be auto or never, got {text!r}")
    return text == "auto"


def parse_write_options(
    options: Mapping[str, str], *, also: Collection[str] = (), what: str = "the tidemq writer"
) -> WriteOptions:
    """`also`: the options a caller built on the writer reads besides (the streaming sink's)."""
    opts = _lower(options)
    check_known(opts, (*WRITE_OPTIONS, *also), what)
    topic = _get(opts, "topic")
    create = _bool("createTopic", _get(opts, "createTopic"), False)
    queues_text = _get(opts, "createTopic.queues")
    queues = DEFAULT_CREATE_QUEUES
    if queues_text is not None:
        if not create:
            raise OptionError("option 'createTopic.queues' needs the option createTopic=true")
        queues = _int("createTopic.queues", queues_text, minimum=1)
        if queues > limits.MAX_QUEUES_PER_TOPIC:
            raise OptionError(
                f"option 'createTopic.queues' must be <= {limits.MAX_QUEUES_PER_TOPIC}, "
                f"got {queues}"
            )
    return WriteOptions(
        bootstrap=_bootstrap(opts),
        topic=None if topic is None else _topic_name("topic", topic.strip()),
        create_topic=create,
        create_queues=queues,
        client=_client(opts),
    )


def include_headers(options: Mapping[str, str]) -> bool:
    """Only `includeHeaders`, for the schema (which Spark asks for before anything else)."""
    return _bool("includeHeaders", _get(_lower(options), "includeHeaders"), False)
