"""The schema registry's state, rebuilt by applying the records of its log (the compact
topic `_schemas`), and the records each request would write. Pure: the service around it
does the I/O.

Records (key and value are JSON objects; a null value is a tombstone), after Confluent's
`_schemas` layout, with the schema id in the SCHEMA key:

    {"keytype": "SCHEMA", "subject": S, "version": V, "id": I, "hash": H}
        -> {"subject", "version", "id", "schemaType", "schema", "references", "deleted"}
    {"keytype": "CONFIG", "subject": S | null}  -> {"compatibilityLevel": LEVEL}
    {"keytype": "MODE", "subject": S | null}    -> {"mode": MODE}

The log is the order of truth. Several nodes may write at once, each with the state it
had: a SCHEMA record whose id already names another schema, whose schema already has
another id, or whose subject and version already hold another id, lost the race and is
ignored by every node alike (`apply` returns False); its writer sees that when it reads
its record back, removes it with a tombstone and tries again. Keys include the id and a
hash of the schema (H: the first 16 hex digits of SHA-256 over its type, identity and
references), so two different registrations never share a key and compaction never lets
a losing record replace a winning one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tidemq.schema.compatibility import compatibility_problems
from tidemq.schema.formats import ParsedSchema, parse_schema
from tidemq.schema.model import (
    Compatibility,
    ErrorCode,
    Mode,
    Reference,
    RegistryError,
    SchemaType,
)

__all__ = ["Record", "RegistryState", "VersionInfo"]

#: (key, value): the JSON text of a log record's key and value (None: a tombstone).
Record = tuple[bytes, bytes | None]

DEFAULT_COMPATIBILITY = Compatibility.BACKWARD


@dataclass(frozen=True, slots=True)
class VersionInfo:
    subject: str
    version: int
    schema_id: int
    schema: ParsedSchema
    deleted: bool


@dataclass(slots=True)
class _Stored:
    schema: ParsedSchema
    #: (subject, version) pairs that use it.
    users: set[tuple[str, int]] = field(default_factory=set)


def _key(**fields: Any) -> bytes:
    return json.dumps(fields, separators=(",", ":")).encode()


def _value(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


class RegistryState:
    def __init__(self) -> None:
        self._by_id: dict[int, _Stored] = {}
        self._ids: dict[tuple[str, str, tuple[Reference, ...]], int] = {}
        #: subject -> version -> (id, deleted)
        self._subjects: dict[str, dict[int, tuple[int, bool]]] = {}
        self._config: dict[str | None, Compatibility] = {}
        self._modes: dict[str | None, Mode] = {}
        self.max_id = 0

    # ------------------------------------------------------------------ applying the log

    def apply(self, key: bytes, value: bytes | None) -> bool:
        """Apply one record of the log; False when it lost a race (or is not ours)."""
        try:
            k = json.loads(key)
            v = None if value is None else json.loads(value)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return False
        keytype = k.get("keytype") if isinstance(k, dict) else None
        if keytype == "SCHEMA":
            return self._apply_schema(k, v)
        subject = k.get("subject")
        if keytype == "CONFIG":
            if v is None:
                self._config.pop(subject, None)
            else:
                self._config[subject] = Compatibility(v["compatibilityLevel"])
            return True
        if keytype == "MODE":
            if v is None:
                self._modes.pop(subject, None)
            else:
                self._modes[subject] = Mode(v["mode"])
            return True
        return False

    def _apply_schema(self, k: dict[str, Any], v: dict[str, Any] | None) -> bool:
        subject, version, schema_id = str(k["subject"]), int(k["version"]), int(k["id"])
        versions = self._subjects.setdefault(subject, {})
        if v is None:
            held_id = versions.get(version, (None,))[0]
            # Only the record this key names: a loser's tombstone leaves the winner alone.
            if held_id == schema_id and _digest(self._by_id[schema_id].schema) == k.get("hash"):
                del versions[version]
                self._release(schema_id, subject, version)
            if not versions:
                del self._subjects[subject]
            return True
        refs = tuple(Reference(r["name"], r["subject"], int(r["version"])) for r in v["references"])
        parsed = parse_schema(
            SchemaType(v.get("schemaType", "AVRO")), v["schema"], refs, self._resolve(refs)
        )
        identity = (parsed.schema_type.value, parsed.identity, refs)
        held = self._by_id.get(schema_id)
        taken = versions.get(version)
        other_id = self._ids.get(identity)
        if (
            (held is not None and self._identity(held.schema) != identity)
            or (taken is not None and taken[0] != schema_id)
            or (other_id is not None and other_id != schema_id)
        ):
            if not versions:
                del self._subjects[subject]
            return False  # lost a race: the earlier record holds the id or the version
        if held is None:
            held = self._by_id[schema_id] = _Stored(parsed)
            self._ids.setdefault(identity, schema_id)
        held.users.add((subject, version))
        versions[version] = (schema_id, bool(v.get("deleted", False)))
        self.max_id = max(self.max_id, schema_id)
        return True

    @staticmethod
    def _identity(parsed: ParsedSchema) -> tuple[str, str, tuple[Reference, ...]]:
        return parsed.schema_type.value, parsed.identity, parsed.references

    def _release(self, schema_id: int, subject: str, version: int) -> None:
        held = self._by_id.get(schema_id)
        if held is None:
            return
        held.users.discard((subject, version))
        if not held.users:
            del self._by_id[schema_id]
            identity = self._identity(held.schema)
            if self._ids.get(identity) == schema_id:
                del self._ids[identity]

    def _resolve(self, refs: Iterable[Reference]) -> tuple[ParsedSchema, ...]:
        out = []
        for ref in refs:
            info = self.version(ref.subject, ref.version, deleted=True)
            out.append(info.schema)
        return tuple(out)

    # ------------------------------------------------------------------ reading

    def subjects(self, *, deleted: bool = False) -> list[str]:
        return sorted(
            s
            for s, versions in self._subjects.items()
            if deleted or any(not d for _, d in versions.values())
        )

    def versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        versions = self._subject(subject, deleted=deleted)
        return sorted(v for v, (_, d) in versions.items() if deleted or not d)

    def registered_ids(self, subject: str) -> set[int]:
        """The schema ids of the subject's versions not deleted (none for an unknown one)."""
        return {i for i, deleted in self._subjects.get(subject, {}).values() if not deleted}

    def _subject(self, subject: str, *, deleted: bool) -> dict[int, tuple[int, bool]]:
        versions = self._subjects.get(subject)
        if not versions or (not deleted and all(d for _, d in versions.values())):
            raise RegistryError(ErrorCode.SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")
        return versions

    def version(self, subject: str, version: int | str, *, deleted: bool = False) -> VersionInfo:
        """A version of a subject; "latest" or -1 for the newest (not deleted)."""
        versions = self._subject(subject, deleted=deleted)
        live = sorted(v for v, (_, d) in versions.items() if deleted or not d)
        number = _version_number(version)
        if number == -1:
            if not live:
                raise RegistryError(ErrorCode.VERSION_NOT_FOUND, f"Version {version} not found.")
            number = live[-1]
        if number not in versions or (versions[number][1] and not deleted):
            raise RegistryError(ErrorCode.VERSION_NOT_FOUND, f"Version {version} not found.")
        schema_id, is_deleted = versions[number]
        return VersionInfo(subject, number, schema_id, self._by_id[schema_id].schema, is_deleted)

    def schema(self, schema_id: int) -> ParsedSchema:
        held = self._by_id.get(schema_id)
        if held is None:
            raise RegistryError(ErrorCode.SCHEMA_NOT_FOUND, f"Schema {schema_id} not found")
        return held.schema

    def uses(self, schema_id: int, *, deleted: bool = False) -> list[tuple[str, int]]:
        """(subject, version) pairs holding a schema id."""
        held = self._by_id.get(schema_id)
        if held is None:
            raise RegistryError(ErrorCode.SCHEMA_NOT_FOUND, f"Schema {schema_id} not found")
        return sorted((s, v) for s, v in held.users if deleted or not self._subjects[s][v][1])

    def find(self, subject: str, parsed: ParsedSchema, *, deleted: bool = False) -> VersionInfo:
        """The version of `subject` holding this schema (POST /subjects/{subject})."""
        versions = self._subject(subject, deleted=deleted)
        schema_id = self._ids.get(self._identity(parsed))
        for number in sorted(versions):
            held_id, is_deleted = versions[number]
            if held_id == schema_id and (deleted or not is_deleted):
                return self.version(subject, number, deleted=True)
        raise RegistryError(ErrorCode.SCHEMA_NOT_FOUND, "Schema not found")

    def referenced_by(self, subject: str, version: int) -> list[int]:
        """Ids of schemas whose references name this subject and version."""
        return sorted(
            i
            for i, held in self._by_id.items()
            if any(r.subject == subject and r.version == version for r in held.schema.references)
        )

    def compatibility(self, subject: str | None, *, default: bool = True) -> Compatibility:
        level = self._config.get(subject)
        if level is None and subject is not None and default:
            level = self._config.get(None)
        if level is None:
            if not default and subject is not None:
                raise RegistryError(
                    ErrorCode.SUBJECT_COMPATIBILITY_NOT_CONFIGURED,
                    f"Subject '{subject}' does not have subject-level compatibility configured",
                )
            return DEFAULT_COMPATIBILITY
        return level

    def mode(self, subject: str | None, *, default: bool = True) -> Mode:
        mode = self._modes.get(subject)
        if mode is None and subject is not None and default:
            mode = self._modes.get(None)
        if mode is None:
            if not default and subject is not None:
                raise RegistryError(
                    ErrorCode.SUBJECT_MODE_NOT_CONFIGURED,
                    f"Subject '{subject}' does not have subject-level mode configured",
                )
            return Mode.READWRITE
        return mode

    # ------------------------------------------------------------------ planning writes

    def parse(
        self, schema_type: SchemaType, text: str, references: Iterable[Reference]
    ) -> ParsedSchema:
        refs = tuple(references)
        try:
            resolved = self._resolve(refs)
        except RegistryError as exc:
            raise RegistryError(
                ErrorCode.INVALID_SCHEMA, f"a reference cannot be resolved: {exc.message}"
            ) from None
        return parse_schema(schema_type, text, refs, resolved)

    def plan_register(
        self, subject: str, parsed: ParsedSchema
    ) -> tuple[VersionInfo, Record | None]:
        """The version that registering `parsed` under `subject` gives, and the record to
        write (None: it is there already). RegistryError 409 when it is incompatible."""
        if self.mode(subject) in (Mode.READONLY, Mode.READONLY_OVERRIDE):
            raise RegistryError(
                ErrorCode.OPERATION_NOT_PERMITTED, f"Subject {subject} is in read-only mode"
            )
        try:
            return self.find(subject, parsed), None
        except RegistryError:
            pass
        versions = self._subjects.get(subject, {})
        earlier = [self._by_id[i].schema for v, (i, d) in sorted(versions.items()) if not d]
        problems = compatibility_problems(self.compatibility(subject), parsed, earlier)
        if problems:
            raise RegistryError(
                ErrorCode.INCOMPATIBLE_SCHEMA,
                "Schema being registered is incompatible with an earlier schema for subject "
                f'"{subject}", details: [{"; ".join(problems)}]',
            )
        schema_id = self._ids.get(self._identity(parsed)) or self.max_id + 1
        version = max(versions, default=0) + 1
        info = VersionInfo(subject, version, schema_id, parsed, False)
        return info, self.schema_record(info)

    @staticmethod
    def schema_record(info: VersionInfo, *, tombstone: bool = False) -> Record:
        parsed = info.schema
        key = _key(
            keytype="SCHEMA",
            subject=info.subject,
            version=info.version,
            id=info.schema_id,
            hash=_digest(parsed),
        )
        if tombstone:
            return key, None
        return key, _value(
            {
                "subject": info.subject,
                "version": info.version,
                "id": info.schema_id,
                "schemaType": parsed.schema_type.value,
                "schema": parsed.text,
                "references": [
                    {"name": r.name, "subject": r.subject, "version": r.version}
                    for r in parsed.references
                ],
                "deleted": info.deleted,
            }
        )

    def plan_delete_subject(
        self, subject: str, *, permanent: bool
    ) -> tuple[list[int], list[Record]]:
        versions = self._subject(subject, deleted=True)
        live = [v for v, (_, d) in versions.items() if not d]
        if not permanent and not live:
            raise RegistryError(
                ErrorCode.SUBJECT_SOFT_DELETED,
                f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently",
            )
        if permanent and live:
            raise RegistryError(
                ErrorCode.SUBJECT_NOT_SOFT_DELETED,
                f"Subject '{subject}' was not deleted first before being permanently deleted",
            )
        # A soft delete answers the versions it deletes now; a permanent one, all.
        numbers = sorted(versions) if permanent else sorted(live)
        records = []
        for number in numbers:
            self._check_not_referenced(subject, number)
            info = self.version(subject, number, deleted=True)
            records.append(self._deleted_record(info, permanent=permanent))
        return numbers, records

    def plan_delete_version(
        self, subject: str, version: int | str, *, permanent: bool
    ) -> tuple[int, Record]:
        info = self.version(subject, version, deleted=permanent)
        if not permanent and info.deleted:
            raise RegistryError(
                ErrorCode.VERSION_SOFT_DELETED,
                f"Subject '{subject}' Version {info.version} was soft deleted.Set "
                "permanent=true to delete permanently",
            )
        if permanent and not info.deleted:
            raise RegistryError(
                ErrorCode.VERSION_NOT_SOFT_DELETED,
                f"Subject '{subject}' Version {info.version} was not deleted first before "
                "being permanently deleted",
            )
        self._check_not_referenced(subject, info.version)
        return info.version, self._deleted_record(info, permanent=permanent)

    def _check_not_referenced(self, subject: str, version: int) -> None:
        users = self.referenced_by(subject, version)
        if users:
            raise RegistryError(
                ErrorCode.REFERENCE_EXISTS,
                f"One or more references exist to the schema {{subject={subject},"
                f"version={version}}} (schema ids {users})",
            )

    def _deleted_record(self, info: VersionInfo, *, permanent: bool) -> Record:
        if permanent:
            return self.schema_record(info, tombstone=True)
        return self.schema_record(
            VersionInfo(info.subject, info.version, info.schema_id, info.schema, True)
        )

    @staticmethod
    def config_record(subject: str | None, level: Compatibility | None) -> Record:
        key = _key(keytype="CONFIG", subject=subject)
        return key, None if level is None else _value({"compatibilityLevel": level.value})

    @staticmethod
    def mode_record(subject: str | None, mode: Mode | None) -> Record:
        key = _key(keytype="MODE", subject=subject)
        return key, None if mode is None else _value({"mode": mode.value})


def _digest(parsed: ParsedSchema) -> str:
    """The schema hash in SCHEMA keys."""
    refs = [[r.name, r.subject, r.version] for r in parsed.references]
    text = json.dumps([parsed.schema_type.value, parsed.identity, refs])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _version_number(version: int | str) -> int:
    if version == "latest":
        return -1
    try:
        number = int(version)
    except (TypeError, ValueError):
        number = 0
    if number == -1 or number >= 1:
        return number
    raise RegistryError(
        ErrorCode.INVALID_VERSION,
        f"The specified version '{version}' is not a valid version id. Allowed values are "
        'between [1, 2^31-1] and the string "latest"',
    )
