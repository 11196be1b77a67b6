"""The audit log's records (pure): shape, validation, encoding, decoding.

The audit log says *that* something happened to an agent's memory (a
compaction, a prune, an erasure, a reload), never *what* the memory held. So a
record is built only from a fixed set of fields per event, and every value is
a number, a bool, or a short "word" (a model name, an archive file name, a
reason keyword, a hex digest): no spaces, no free text, bounded length. A
caller that tries to put anything else in gets a ValueError at once (a
programming error, caught by the tests), not a line with content on disk.

On disk it is JSON lines, one record per line, each carrying the format
version ``v``: a newer release reads every older version (``_UPGRADES``), and
a reader meeting a newer version counts the line as unreadable and says so
instead of guessing. A line is at most :data:`MAX_RECORD_BYTES`, so it goes to
the file in one ``write()`` on an ``O_APPEND`` descriptor and concurrent
appenders (daemon and CLI) never interleave.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

AUDIT_FORMAT_VERSION = 1
# Well under a page: one write() of a whole record, never split.
MAX_RECORD_BYTES = 4096
MAX_WORD = 200
MAX_WORDS = 64

FieldValue = int | bool | str | tuple[str, ...] | None


class AuditEvent(StrEnum):
    COMPACTION = "compaction"
    PRUNE = "prune"
    ERASURE = "erasure"  # `memd forget AGENT`: the whole memory
    ERASE_MATCH = "erase_match"  # `memd forget AGENT --match`: matching entries
    CONFIG_RELOAD = "config_reload"
    REKEY = "rekey"  # `memd archive rekey`: an agent's data key re-wrapped


class Kind(StrEnum):
    COUNT = "count"  # a non-negative int
    FLAG = "flag"  # a bool
    WORD = "word"  # a short token: model name, archive name, reason keyword
    WORDS = "words"  # a short list of words
    DIGEST = "digest"  # lowercase hex (a keyed hash, never the hashed text)


# Fields every event may carry, then each event's own. A key not listed is refused.
_COMMON: dict[str, Kind] = {"trigger": Kind.WORD}
_FIELDS: dict[AuditEvent, dict[str, Kind]] = {
    AuditEvent.COMPACTION: {
        "model": Kind.WORD,
        "remote": Kind.FLAG,
        "redactions": Kind.COUNT,  # secrets the summarizer was not sent
        "reply_redactions": Kind.COUNT,  # secrets its reply held, replaced before writing
        "tokens_before": Kind.COUNT,
        "tokens_after": Kind.COUNT,
        "archive": Kind.WORD,
        "calls": Kind.COUNT,
        "partial": Kind.FLAG,
    },
    AuditEvent.PRUNE: {
        "archives": Kind.COUNT,
        "bytes": Kind.COUNT,
        "reasons": Kind.WORDS,
        "names": Kind.WORDS,
        "kept": Kind.COUNT,
        "dry_run": Kind.FLAG,
        "index_rows": Kind.COUNT,
    },
    AuditEvent.ERASURE: {
        "files": Kind.COUNT,
        "archives": Kind.COUNT,
        "bytes": Kind.COUNT,
        "ledger_rows": Kind.COUNT,
        "index_rows": Kind.COUNT,
        "shredded": Kind.FLAG,
        "tombstone": Kind.FLAG,
    },
    AuditEvent.ERASE_MATCH: {
        "entries": Kind.COUNT,
        "files": Kind.COUNT,
        "archives": Kind.COUNT,
        "summary_lines": Kind.COUNT,
        "pinned_lines": Kind.COUNT,
        "index_rows": Kind.COUNT,
        "pattern_hash": Kind.DIGEST,
        # An erasure a crash left committed, finished by recovery (which knows
        # neither the pattern nor what it matched: no counts, no hash).
        "recovered": Kind.FLAG,
    },
    AuditEvent.CONFIG_RELOAD: {
        "ok": Kind.FLAG,
        "changed": Kind.WORDS,
        "errors": Kind.COUNT,
        # When the daemon began this reload, before reading the file
        # (CLOCK_MONOTONIC, ns; absent in records of an older memd): `memd
        # reload` tells the reload that answers its SIGHUP by it.
        "started_ns": Kind.COUNT,
    },
    # Key ids are truncated hashes of the keys (memd.archive_crypto), never key bytes.
    AuditEvent.REKEY: {
        "old_key_id": Kind.DIGEST,
        "new_key_id": Kind.DIGEST,
    },
}

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]*")
_DIGEST = re.compile(r"[0-9a-f]{8,128}")
_ACTORS = frozenset({"daemon", "cli"})


def as_word(text: str) -> str:
    """``text`` made a valid word (a model name a provider returned, say): never refused."""
    cleaned = re.sub(r"[^A-Za-z0-9._:/@+=-]", "_", text)[:MAX_WORD]
    if not cleaned or not cleaned[0].isalnum():
        cleaned = f"x{cleaned}"[:MAX_WORD]
    return cleaned


def allowed_fields(event: AuditEvent) -> Mapping[str, Kind]:
    return {**_COMMON, **_FIELDS[event]}


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audit line. ``ts`` is seconds since the epoch (UTC on disk)."""

    event: str
    ts: float
    actor: str
    pid: int
    uid: int
    agent: str | None = None
    fields: Mapping[str, FieldValue] = field(default_factory=dict)
    version: int = AUDIT_FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "v": self.version,
            "ts": iso_utc(self.ts),
            "event": self.event,
            "agent": self.agent,
            "actor": self.actor,
            "pid": self.pid,
            "uid": self.uid,
        }
        for key, value in self.fields.items():
            data[key] = list(value) if isinstance(value, tuple) else value
        return data


def _check_value(event: AuditEvent, key: str, kind: Kind, value: object) -> FieldValue:
    where = f"audit {event.value}.{key}"
    if value is None:
        return None
    if kind is Kind.FLAG:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected a bool, got {type(value).__name__}")
        return value
    if kind is Kind.COUNT:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where}: expected a non-negative int")
        return value
    if kind is Kind.DIGEST:
        if not isinstance(value, str) or not _DIGEST.fullmatch(value):
            raise ValueError(f"{where}: expected a lowercase hex digest")
        return value
    if kind is Kind.WORD:
        return _check_word(where, value)
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"{where}: expected a list of words")
    if len(value) > MAX_WORDS:
        raise ValueError(f"{where}: more than {MAX_WORDS} words")
    return tuple(_check_word(where, item) for item in value)


def _check_word(where: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_WORD or not _WORD.fullmatch(value):
        # The value is not echoed: it may be exactly what must not be logged.
        raise ValueError(f"{where}: expected a short word (no spaces or free text)")
    return value


def make_record(
    event: AuditEvent | str,
    *,
    ts: float,
    actor: str,
    pid: int,
    uid: int,
    agent: str | None = None,
    fields: Mapping[str, object] | None = None,
) -> AuditRecord:
    """A validated record; ValueError names the event and key at fault."""
    kind_of = AuditEvent(event)
    if actor not in _ACTORS:
        raise ValueError(f"audit actor must be one of {sorted(_ACTORS)}")
    if agent is not None and (not agent or "\n" in agent or len(agent) > 255):
        raise ValueError("audit agent: expected an agent name")
    allowed = allowed_fields(kind_of)
    checked: dict[str, FieldValue] = {}
    for key, value in (fields or {}).items():
        kind = allowed.get(key)
        if kind is None:
            raise ValueError(f"audit {kind_of.value}: field {key!r} is not an audit field")
        checked[key] = _check_value(kind_of, key, kind, value)
    return AuditRecord(
        event=kind_of.value, ts=ts, actor=actor, pid=pid, uid=uid, agent=agent, fields=checked
    )


def encode(record: AuditRecord) -> bytes:
    """One line (``\\n``-terminated), at most :data:`MAX_RECORD_BYTES`."""
    line = json.dumps(record.to_json(), ensure_ascii=True, separators=(",", ":")) + "\n"
    data = line.encode("ascii")
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"audit {record.event}: record over {MAX_RECORD_BYTES} bytes")
    return data


class UnreadableLine(ValueError):
    """A line that is not a record this release can read."""


class NewerFormat(UnreadableLine):
    def __init__(self, version: int) -> None:
        super().__init__(
            f"audit record format v{version} is newer than this memd reads "
            f"(v{AUDIT_FORMAT_VERSION}); upgrade memd to read it"
        )
        self.version = version


_HEAD_KEYS = frozenset({"v", "ts", "event", "agent", "actor", "pid", "uid"})


def _upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    return data


# Version → how to bring its JSON to the current shape (a chain, oldest first).
_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _upgrade_v1}


def decode(line: bytes) -> AuditRecord:
    """Parse one line (any older version included); UnreadableLine otherwise."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise UnreadableLine("not a JSON line") from None
    if not isinstance(data, dict):
        raise UnreadableLine("not a JSON object")
    version = data.get("v")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UnreadableLine("no format version")
    if version > AUDIT_FORMAT_VERSION:
        raise NewerFormat(version)
    for step in range(version, AUDIT_FORMAT_VERSION + 1):
        data = _UPGRADES[step](data)
    try:
        ts = parse_iso(str(data["ts"]))
        event = str(data["event"])
        actor = str(data["actor"])
        pid = int(data["pid"])
        uid = int(data["uid"])
    except (KeyError, TypeError, ValueError):
        raise UnreadableLine("missing or malformed head fields") from None
    agent = data.get("agent")
    if agent is not None and not isinstance(agent, str):
        raise UnreadableLine("malformed agent")
    extra: dict[str, FieldValue] = {}
    for key, value in data.items():
        if key in _HEAD_KEYS:
            continue
        # Lenient on what it shows (an event or field a later v1 writer added),
        # strict on the types (never a nested structure).
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            extra[key] = tuple(value)
        elif value is None or isinstance(value, (bool, int, str)):
            extra[key] = value
        else:
            raise UnreadableLine(f"malformed field {key!r}")
    return AuditRecord(
        event=event,
        ts=ts,
        actor=actor,
        pid=pid,
        uid=uid,
        agent=agent,
        fields=extra,
        version=AUDIT_FORMAT_VERSION,
    )


@dataclass(frozen=True, slots=True)
class AuditContents:
    """What a reader got out of a log: records in file order, and what it could not read."""

    records: tuple[AuditRecord, ...]
    unreadable: int = 0  # corrupt lines and a torn last line
    newer: int = 0  # lines in a format newer than this release

    def for_agent(self, agent: str | None) -> tuple[AuditRecord, ...]:
        if agent is None:
            return self.records
        return tuple(record for record in self.records if record.agent == agent)


def parse_log(data: bytes) -> AuditContents:
    """Every record in ``data``; a last line without its newline is torn, not read."""
    records: list[AuditRecord] = []
    unreadable = newer = 0
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the data ends with a newline
    if torn.strip():
        unreadable += 1
    for line in lines:
        if not line.strip():
            continue
        try:
            records.append(decode(line))
        except NewerFormat:
            newer += 1
        except UnreadableLine:
            unreadable += 1
    return AuditContents(tuple(records), unreadable, newer)


def iso_utc(ts: float) -> str:
    stamp = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return stamp.timestamp()


def describe_fields(record: AuditRecord) -> str:
    """``key=value`` pairs for a table cell (lists joined with commas)."""
    parts = []
    for key, value in record.fields.items():
        if value is None:
            continue
        if isinstance(value, tuple):
            shown = ",".join(value)
        elif isinstance(value, bool):
            shown = "yes" if value else "no"
        else:
            shown = str(value)
        parts.append(f"{key}={shown}")
    return " ".join(parts)


__all__ = [
    "AUDIT_FORMAT_VERSION",
    "MAX_RECORD_BYTES",
    "AuditContents",
    "AuditEvent",
    "AuditRecord",
    "FieldValue",
    "Kind",
    "NewerFormat",
    "UnreadableLine",
    "allowed_fields",
    "as_word",
    "decode",
    "describe_fields",
    "encode",
    "make_record",
    "parse_log",
]
