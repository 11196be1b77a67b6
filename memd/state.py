"""The state DB: per-agent counts, the compaction ledger and the daemon's heartbeat.

One SQLite file per workspace in memd's state dir. The daemon writes it; the
CLI (``memd status``, ``history``, ``health``, ``forget``) reads it from other
processes, which is why it runs in WAL mode (readers never block the writer)
with a busy timeout.

The DB is a cache and a log, never the source of truth for memory: a corrupt
or unreadable file is moved aside to ``*.corrupt-<ts>`` and rebuilt empty, and
a state dir that cannot be used at all degrades to an in-memory DB. Either way
memd keeps running and says so (``StateStore.warnings`` and the log).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeGuard, TypeVar

from memd.core.jobs import AgentJob, StoredJobState, stored_state
from memd.errors import MemdError, describe_error
from memd.fsutil import ensure_private_dir
from memd.workspace import ArchiveStats, FolderFacts

if TYPE_CHECKING:
    # Imported where used: `memd status` on a 30,000-agent fleet reads this
    # module and pays for every import in its start-up time.
    from memd.core.erasure import Tombstone
    from memd.core.tokens import CountState
    from memd.counting import TrackedCount


class Outcome(Protocol):
    """What the ledger keeps of a committed compaction (``CompactionOutcome``)."""

    @property
    def archive(self) -> Path: ...
    @property
    def tokens_before(self) -> int | None: ...
    @property
    def tokens_after(self) -> int | None: ...
    @property
    def model(self) -> str: ...
    @property
    def cost_usd(self) -> float | None: ...
    @property
    def tokens_produced(self) -> int | None: ...
    @property
    def tokens_appended(self) -> int | None: ...
    @property
    def pinned(self) -> int: ...
    @property
    def evicted(self) -> int: ...
    @property
    def calls(self) -> int: ...


# 5: the ledger says what a compaction produced apart from what writers appended
# meanwhile, whether the builtin summarizer stood in for a failing model, the
# pinned facts kept and evicted, the model calls made; the spending table.
# 6: the daemon keeps how many archives are encrypted at rest (status shows
# them without listing the folder).
# 7: the agent folder as last listed.
# The count's marks (memd.counting.TrackedCount.marks) live in a side table,
# count_marks, that needs no new version: an older memd (schema 7) opens a DB that
# has it, never reads it, and its writes to ``agents`` drop the marks they make
# stale (the table's triggers). Dev builds of 2026-12-02 (48ea21b) kept them in an
# ``agents.marks`` column and called that schema 8; such a DB is brought back to 7
# (:func:`_undo_dev_schema_8`). The next real bump takes 9, never 8.
SCHEMA_VERSION = 7
# Versions that were only ever that dev layout (see above), not a newer memd's.
_DEV_SCHEMA_8 = 8
BUSY_TIMEOUT_S = 5.0
# Ledger rows kept per agent; older ones are pruned on insert so the DB stays small.
LEDGER_KEEP_PER_AGENT = 1000

Trigger = Literal["daemon", "compact-now"]

_log = logging.getLogger("memd.state")
_T = TypeVar("_T")

# SQLite primary result codes that mean "this file is not a (sound) database".
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26

# Schema 7's agents table, column for column: what an older memd reads (a test keeps it).
_AGENTS_TABLE = """
CREATE TABLE IF NOT EXISTS agents (
    agent TEXT PRIMARY KEY,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    size INTEGER NOT NULL,
    safe_offset INTEGER NOT NULL,
    safe_tokens INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    threshold_tokens INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    state TEXT NOT NULL,
    last_error TEXT,
    last_compaction_at REAL,
    consecutive_failures INTEGER NOT NULL,
    next_attempt_at REAL,
    mtime_ns INTEGER NOT NULL DEFAULT 0,
    encoding TEXT NOT NULL DEFAULT '',
    window_start INTEGER NOT NULL DEFAULT 0,
    window_digest BLOB,
    archives INTEGER,
    archive_bytes INTEGER,
    archive_mtime_ns INTEGER NOT NULL DEFAULT 0,
    window_source TEXT NOT NULL DEFAULT '',
    reserved_tokens INTEGER NOT NULL DEFAULT 0,
    estimated INTEGER NOT NULL DEFAULT 0,
    encrypted_archives INTEGER NOT NULL DEFAULT 0,
    folder_ino INTEGER NOT NULL DEFAULT 0,
    folder_ctime_ns INTEGER NOT NULL DEFAULT 0,
    folder_entries INTEGER NOT NULL DEFAULT 0
)"""
_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);"""
    + _AGENTS_TABLE
    + """;
CREATE TABLE IF NOT EXISTS ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    started_at REAL NOT NULL,
    duration_s REAL NOT NULL,
    archive TEXT,
    tokens_before INTEGER,
    tokens_after INTEGER,
    model TEXT,
    cost_usd REAL,
    error TEXT,
    trigger TEXT NOT NULL,
    tokens_produced INTEGER,
    tokens_appended INTEGER,
    fallback INTEGER NOT NULL DEFAULT 0,
    pinned INTEGER,
    evicted INTEGER,
    calls INTEGER
);
CREATE INDEX IF NOT EXISTS ledger_by_agent ON ledger (agent, id);
CREATE TABLE IF NOT EXISTS spending (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    calls_last_hour INTEGER NOT NULL,
    usd_last_day REAL NOT NULL,
    held_reason TEXT,
    held_until REAL,
    ts REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS file_counts (
    agent TEXT PRIMARY KEY,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    encoding TEXT NOT NULL,
    tokens INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS state_meta (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS erasures (
    agent_key TEXT PRIMARY KEY,
    erased_at_ns INTEGER NOT NULL,
    survivor_dev INTEGER NOT NULL DEFAULT 0,
    survivor_ino INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS count_marks (
    agent TEXT PRIMARY KEY,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    marks BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS heartbeat (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    healthy INTEGER NOT NULL,
    detail TEXT NOT NULL,
    agents INTEGER NOT NULL,
    ts REAL NOT NULL
);
"""
)


# Each older schema's step to the next version (run in order, in one transaction):
# a DB an older memd wrote keeps its rows. Columns are only ever appended, with
# defaults, so the fresh-DB layout above and a migrated one are the same.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 1 -> 2 (the first memd's DB): what a restart checks before it reuses a
    # stored count (the file's mtime, the count's encoding, its window). A row
    # without them is counted again from its file, never trusted.
    1: (
        "ALTER TABLE agents ADD COLUMN mtime_ns INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE agents ADD COLUMN encoding TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE agents ADD COLUMN window_start INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE agents ADD COLUMN window_digest BLOB",
    ),
    # 2 -> 3: what `memd status` needs from the daemon without touching the
    # agent's folder: archive count and bytes (NULL: not surveyed yet), where the
    # window came from, the tokens reserved beside memory, an estimated count.
    2: (
        "ALTER TABLE agents ADD COLUMN archives INTEGER",
        "ALTER TABLE agents ADD COLUMN archive_bytes INTEGER",
        "ALTER TABLE agents ADD COLUMN archive_mtime_ns INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE agents ADD COLUMN window_source TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE agents ADD COLUMN reserved_tokens INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE agents ADD COLUMN estimated INTEGER NOT NULL DEFAULT 0",
    ),
    # 3 -> 4: `memd forget`'s tombstones (a salted hash of the agent's name, never
    # the name) and the salt.
    3: (
        "CREATE TABLE IF NOT EXISTS state_meta (key TEXT PRIMARY KEY, value BLOB NOT NULL)",
        "CREATE TABLE IF NOT EXISTS erasures (agent_key TEXT PRIMARY KEY,"
        " erased_at_ns INTEGER NOT NULL, survivor_dev INTEGER NOT NULL DEFAULT 0,"
        " survivor_ino INTEGER NOT NULL DEFAULT 0)",
    ),
    # 4 -> 5: the ledger says what a compaction produced apart from appends made
    # meanwhile, the builtin fallback, pins kept and evicted, model calls (NULL in
    # older rows: unknown). The spending table is new, made by the schema above.
    4: (
        "ALTER TABLE ledger ADD COLUMN tokens_produced INTEGER",
        "ALTER TABLE ledger ADD COLUMN tokens_appended INTEGER",
        "ALTER TABLE ledger ADD COLUMN fallback INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE ledger ADD COLUMN pinned INTEGER",
        "ALTER TABLE ledger ADD COLUMN evicted INTEGER",
        "ALTER TABLE ledger ADD COLUMN calls INTEGER",
    ),
    # 5 -> 6: how many of the surveyed archives are encrypted at rest (status
    # shows them, and recall off, without listing the folder).
    5: ("ALTER TABLE agents ADD COLUMN encrypted_archives INTEGER NOT NULL DEFAULT 0",),
    # 6 -> 7: the agent folder as the daemon last listed it (memd.workspace.FolderFacts),
    # so a restart stats each folder instead of reading it (0: not known, list it).
    6: (
        "ALTER TABLE agents ADD COLUMN folder_ino INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE agents ADD COLUMN folder_ctime_ns INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE agents ADD COLUMN folder_entries INTEGER NOT NULL DEFAULT 0",
    ),
}

# The count_marks row goes with its agents row whoever writes it: a row inserted
# (a new agent, or an older memd's INSERT OR REPLACE, whose count the marks may
# not fit) or deleted (an older memd's `forget` too). This memd's own upsert of an
# existing row is an UPDATE: no trigger, nothing added to a live flush. Made after
# the tables (and after a migration that rebuilds ``agents``, which drops them).
_TRIGGERS = (
    "CREATE TRIGGER IF NOT EXISTS count_marks_on_insert AFTER INSERT ON agents"
    " BEGIN DELETE FROM count_marks WHERE agent = new.agent; END",
    "CREATE TRIGGER IF NOT EXISTS count_marks_on_delete AFTER DELETE ON agents"
    " BEGIN DELETE FROM count_marks WHERE agent = old.agent; END",
)
# What an up-to-date DB holds beside its version (checked on every open, cheaply).
_ADDED_OBJECTS = ("count_marks", "count_marks_on_insert", "count_marks_on_delete")

_UP_TO_DATE = (
    "SELECT (SELECT version FROM schema_version),"  # noqa: S608  (constants)
    f" (SELECT count(*) FROM sqlite_master WHERE name IN {_ADDED_OBJECTS!r})"
)

# Tables with an ``agent`` column: what an erasure clears (here and in corrupt copies).
_AGENT_TABLES = ("agents", "ledger", "file_counts", "count_marks")


# `memd status` straight from the DB. "Needs attention" first: failing, over
# its threshold, compacting, estimated; then by how full, then by name.
StatusSort = Literal["attention", "name", "tokens", "used", "archives"]
_FAILING = "state IN ('error', 'breaker_open')"
_COMPACTING = "state IN ('running', 'pending')"
_USED = "(tokens * 1.0 / max(threshold_tokens, 1))"
# Over its threshold, compared as integers only: SQLite orders any TEXT after every
# number, so a damaged row's TEXT tokens would count as over (and rank first).
_OVER = (
    "(typeof(tokens) = 'integer' AND typeof(threshold_tokens) = 'integer'"
    " AND threshold_tokens > 0 AND tokens >= threshold_tokens)"
)
_ATTENTION = (
    f"CASE WHEN {_FAILING} THEN 0 WHEN {_OVER}"
    f" THEN 1 WHEN {_COMPACTING} THEN 2 WHEN estimated != 0 THEN 3 ELSE 4 END"
)
_STATUS_ORDER: dict[StatusSort, str] = {
    "attention": f"{_ATTENTION}, {_USED} DESC, agent",
    "name": "agent",
    "tokens": "tokens DESC, agent",
    "used": f"{_USED} DESC, agent",
    "archives": "archives DESC, archive_bytes DESC, agent",
}
# Whether the agent's latest successful compaction used the builtin fallback
# (one indexed lookup in the ledger per row, in SQLite).
_LAST_FALLBACK = (
    "coalesce((SELECT fallback FROM ledger WHERE ledger.agent = agents.agent"
    " AND ledger.error IS NULL ORDER BY ledger.id DESC LIMIT 1), 0)"
)
# The `memd status --json` object (keys in their documented order), built in
# SQLite: at 30,000 agents Python's per-row JSON would be most of the time.
_STATUS_JSON = (
    "'agent', agent, 'tokens', tokens, 'threshold_tokens', threshold_tokens,"
    " 'percent_used', round(100.0 * tokens / max(1, threshold_tokens), 1),"
    " 'archives', archives,"
    " 'last_compaction_at', CASE WHEN last_compaction_at IS NULL THEN NULL ELSE"
    " strftime('%Y-%m-%dT%H:%M:%S+00:00', CAST(last_compaction_at AS INTEGER), 'unixepoch') END,"
    " 'last_error', last_error, 'state', state, 'source', 'daemon',"
    " 'window_source', window_source, 'reserved_tokens', reserved_tokens,"
    " 'encrypted_archives', encrypted_archives,"
    " 'recall', CASE WHEN encrypted_archives > 0 OR ? THEN 'off' ELSE 'on' END,"
    f" 'last_compaction_fallback', json(CASE WHEN {_LAST_FALLBACK} THEN 'true' ELSE 'false' END),"
    " 'archive_bytes', archive_bytes,"
    " 'estimated', json(CASE WHEN estimated != 0 THEN 'true' ELSE 'false' END)"
)

_TOTALS = (
    "SELECT count(*), total(CASE WHEN typeof(tokens) = 'integer' THEN tokens END),"  # noqa: S608
    f" total({_OVER}), total({_FAILING}),"
    f" total({_COMPACTING}), total(estimated != 0), total(archives),"
    " total(archive_bytes) FROM agents"
)


class FleetTotals(NamedTuple):
    agents: int
    tokens: int
    over_threshold: int
    failing: int
    compacting: int
    estimated: int
    archives: int
    archive_bytes: int


class StatusRow(NamedTuple):
    """What `memd status` shows of one agent row (the columns, in this order)."""

    agent: str
    tokens: int
    threshold_tokens: int
    archives: int | None
    archive_bytes: int | None
    last_compaction_at: float | None
    last_error: str | None
    state: str
    window_source: str
    reserved_tokens: int
    encrypted_archives: int
    last_fallback: bool
    estimated: bool  # last: stored as 0/1


_STATUS_COLUMNS = ", ".join(
    _LAST_FALLBACK if name == "last_fallback" else name for name in StatusRow._fields
)


class StateError(MemdError, RuntimeError):
    """The state DB could not be read or written (e.g. locked past the busy timeout)."""


class NewerStateDB(StateError):
    """The state DB was written by a newer memd (a later schema): refused, never
    moved aside or rebuilt, so the newer memd finds it as it left it. Bad input
    (exit 2), as a bad config is: no retry mends it, so a service stops at once
    (RestartPreventExitStatus=2) instead of restarting every few seconds."""

    exit_code = 2

    def __init__(self, path: Path, version: int) -> None:
        super().__init__(
            f"state DB {path} is schema {version}, written by a newer memd; "
            f"this memd reads up to {SCHEMA_VERSION}"
        )
        self.version = version


class _CorruptDatabase(Exception):
    """Internal: the file exists but is not a usable memd state DB."""


class _NewerSchema(Exception):
    """Internal: the schema version is newer than this memd's (the path is added above)."""

    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


class AgentRecord(NamedTuple):
    """One agent's row. A named tuple, not a frozen dataclass: a restart reads every
    agent's, and one frozen dataclass of these 30 fields cost 3-4 us to build,
    its tuple 0.5 us. Every field but the last is a column of ``agents``; the
    last, the count's marks, is kept in ``count_marks``."""

    agent: str
    dev: int
    ino: int
    size: int
    safe_offset: int
    safe_tokens: int
    tokens: int
    threshold_tokens: int
    updated_at: float
    state: StoredJobState = "idle"
    last_error: str | None = None
    last_compaction_at: float | None = None
    consecutive_failures: int = 0
    next_attempt_at: float | None = None
    # What a restarted daemon checks before trusting ``tokens`` without
    # re-reading the file: same mtime, same encoding, same bytes before the
    # safe offset (digest of [window_start, safe_offset)).
    mtime_ns: int = 0
    encoding: str = ""
    window_start: int = 0
    window_digest: bytes | None = None
    # Schema 3: the agent's archive/ as the daemon last surveyed it (None: not
    # yet), and its window, so `memd status` never lists or resolves a folder.
    archives: int | None = None
    archive_bytes: int | None = None
    archive_mtime_ns: int = 0
    window_source: str = ""
    reserved_tokens: int = 0
    estimated: bool = False
    # Schema 5: how many of ``archives`` are encrypted at rest (``.md.enc``).
    encrypted_archives: int = 0
    # Schema 7: the agent folder as last listed (FolderFacts; ctime 0: unknown).
    folder_ino: int = 0
    folder_ctime_ns: int = 0
    folder_entries: int = 0
    # Not a column: the count's marks (TrackedCount.marks), kept in count_marks
    # beside the row and written only when they change; () when none (or none
    # that fit the count read back).
    marks: tuple[int, ...] = ()

    @classmethod
    def of(
        cls,
        agent: str,
        tracked: TrackedCount | None,
        job: AgentJob,
        *,
        threshold_tokens: int,
        count_error: str | None,
        encoding: str,
        now: float,
        archives: ArchiveStats | None = None,
        window_source: str = "",
        reserved_tokens: int = 0,
        estimated: bool = False,
        folder: FolderFacts | None = None,
    ) -> AgentRecord:
        """The row for an agent's count and job (a count error reads as the state "error")."""
        state = tracked.state if tracked is not None else None
        return cls(
            agent=agent,
            dev=state.dev if state else 0,
            ino=state.ino if state else 0,
            size=state.size if state else 0,
            safe_offset=state.safe_offset if state else 0,
            safe_tokens=state.safe_tokens if state else 0,
            tokens=tracked.tokens if tracked is not None else 0,
            threshold_tokens=threshold_tokens,
            updated_at=now,
            state=stored_state(job, count_failed=count_error is not None),
            last_error=count_error or job.last_error,
            last_compaction_at=job.last_compaction_at,
            consecutive_failures=job.consecutive_failures,
            next_attempt_at=job.next_attempt_at,
            mtime_ns=tracked.mtime_ns if tracked else 0,
            encoding=encoding,
            window_start=tracked.window_start if tracked else 0,
            window_digest=tracked.window_digest if tracked else None,
            archives=archives.count if archives else None,
            archive_bytes=archives.total_bytes if archives else None,
            archive_mtime_ns=archives.mtime_ns if archives else 0,
            window_source=window_source,
            reserved_tokens=reserved_tokens,
            estimated=estimated,
            encrypted_archives=archives.encrypted if archives else 0,
            folder_ino=folder.ino if folder else 0,
            folder_ctime_ns=folder.ctime_ns if folder else 0,
            folder_entries=folder.entries if folder else 0,
            marks=tracked.marks if tracked is not None else (),
        )

    @property
    def folder(self) -> FolderFacts | None:
        """The agent folder as the daemon last listed it (None: unknown)."""
        if not self.folder_ctime_ns:
            return None
        return FolderFacts(self.folder_ino, self.folder_ctime_ns, self.folder_entries)

    @property
    def archive_stats(self) -> ArchiveStats | None:
        """The surveyed archive/ (None when the daemon has not surveyed it yet)."""
        if self.archives is None:
            return None
        return ArchiveStats(
            self.archives, self.archive_bytes or 0, self.archive_mtime_ns, self.encrypted_archives
        )

    def to_tracked(self, current_size: int) -> TrackedCount:
        """The stored count as the counter tracks it, for a file now ``current_size``
        long; its window digest is verified by the next incremental count, so a file
        truncated and regrown past its old size is recounted."""
        CountState, TrackedCount = _count_types()  # noqa: N806 (the classes)
        count = CountState(
            dev=self.dev,
            ino=self.ino,
            size=self.size,
            safe_offset=self.safe_offset,
            safe_tokens=self.safe_tokens,
            tail_tokens=self.tokens - self.safe_tokens,
            estimated=self.estimated,
            # Whether the safe offset was a forced cut is not stored: an estimated
            # count goes on estimating up to the next safe cut (never below the truth).
            open_run=self.estimated,
        )
        mtime_ns = self.mtime_ns if current_size == self.size else 0
        return TrackedCount(
            count, mtime_ns, self.window_start, self.window_digest, marks=self.marks
        )


# count_marks.marks: a format byte, then the marks as little-endian signed 64-bit
# integers, (offset, tokens) pairs oldest first. Another format byte reads as none.
MARKS_FORMAT = 1
_MARKS_HEADER = bytes([MARKS_FORMAT])


def pack_marks(marks: tuple[int, ...]) -> bytes:
    """A count's marks as stored in count_marks."""
    return _MARKS_HEADER + struct.pack(f"<{len(marks)}q", *marks)


def unpack_marks(blob: object) -> tuple[int, ...] | None:
    """Stored marks back; None unless ``blob`` is a blob of this format holding one
    or more whole (offset, tokens) pairs (SQLite keeps any type in any column)."""
    if type(blob) is not bytes or len(blob) % 16 != 1 or len(blob) < 17:
        return None
    if blob[0] != MARKS_FORMAT:
        return None
    marks: tuple[int, ...] = struct.unpack_from(f"<{len(blob) // 8}q", blob, 1)
    return marks


# The columns of ``agents``: the record's fields but the last (its marks), in order
# (a test keeps them to schema 7's, which older memds read). Named, so a column
# order that differs (a migrated DB) never shifts a value into the wrong field.
AGENT_COLUMNS: tuple[str, ...] = AgentRecord._fields[:-1]
# Built from the field names (constants, never input). An upsert updates the row
# where it is (INSERT OR REPLACE deleted it and inserted it again under a new
# rowid: its old page, the table's last page and the primary key's index were all
# rewritten, each live flush about twice the pages).
# The last compaction's time only moves forward: a `memd compact-now` beside the
# daemon records its compaction in the row too (record_compaction), and the
# daemon's next flush, which knows only its own, must not take it back.
_LATEST_COMPACTION = (
    "last_compaction_at = CASE WHEN typeof(agents.last_compaction_at) NOT IN ('integer', 'real')"
    " OR excluded.last_compaction_at >= agents.last_compaction_at"
    " THEN excluded.last_compaction_at ELSE agents.last_compaction_at END"
)
_UPSERT_AGENT = (
    f"INSERT INTO agents ({', '.join(AGENT_COLUMNS)}) "  # noqa: S608
    f"VALUES ({', '.join('?' * len(AGENT_COLUMNS))}) ON CONFLICT(agent) DO UPDATE SET "
    + ", ".join(
        _LATEST_COMPACTION if column == "last_compaction_at" else f"{column} = excluded.{column}"
        for column in AGENT_COLUMNS[1:]
    )
)
# Each named agent's newest compaction that wrote an archive (its end), for those
# the ledger has one: a correlated lookup per name on ``ledger_by_agent``.
_LAST_COMPACTIONS = (
    "SELECT agent, ended FROM (SELECT wanted.value AS agent, (SELECT"
    " max(ledger.started_at + ledger.duration_s) FROM ledger WHERE ledger.agent ="
    " wanted.value AND ledger.error IS NULL AND ledger.archive IS NOT NULL) AS ended"
    " FROM json_each(?) AS wanted) WHERE ended IS NOT NULL"
)
# What each column may hold, as Python reads it. SQLite keeps any type in any
# column: a row holding anything else (a damaged or hand-edited DB) is not
# restored, its agent is counted from its file, so the restore never meets a
# wrongly typed value. Checked by each row's tuple of types, against those
# already found good (a few: which nullable columns are NULL); 0.7 us a row.
_COLUMN_TYPES: dict[str, tuple[type, ...]] = {column: (int,) for column in AGENT_COLUMNS} | {
    "agent": (str,),
    "updated_at": (float, int),
    "state": (str,),
    "last_error": (str, type(None)),
    "last_compaction_at": (float, int, type(None)),
    "next_attempt_at": (float, int, type(None)),
    "encoding": (str,),
    "window_digest": (bytes, type(None)),
    "archives": (int, type(None)),
    "archive_bytes": (int, type(None)),
    "window_source": (str,),
}
_GOOD_TYPES: set[tuple[type, ...]] = set()
# The row and its count's marks (only when stamped with the same file).
_SELECT_AGENTS = (
    f"SELECT {', '.join(f'agents.{column}' for column in AGENT_COLUMNS)},"  # noqa: S608
    " count_marks.marks FROM agents LEFT JOIN count_marks"
    " ON count_marks.agent = agents.agent AND count_marks.dev = agents.dev"
    " AND count_marks.ino = agents.ino"
)
_UPSERT_MARKS = (
    "INSERT INTO count_marks (agent, dev, ino, marks) VALUES (?, ?, ?, ?)"
    " ON CONFLICT(agent) DO UPDATE SET dev = excluded.dev, ino = excluded.ino,"
    " marks = excluded.marks"
)


class BadRow(NamedTuple):
    """A stored row left out of a read: the value in ``column`` is not of its type."""

    agent: str
    column: str
    value: object


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    agent: str
    started_at: float
    duration_s: float
    archive: str | None
    tokens_before: int | None
    tokens_after: int | None
    model: str | None
    cost_usd: float | None
    error: str | None
    trigger: Trigger
    # What the compaction produced from its snapshot (header + summary + the raw
    # bytes it carried) apart from what writers appended while it ran: before
    # minus produced is what it saved (rows of schema 2 have neither).
    tokens_produced: int | None = None
    tokens_appended: int | None = None
    fallback: bool = False  # the builtin summarizer stood in for a failing model
    pinned: int | None = None  # facts in the new block's pinned section
    evicted: int | None = None  # pinned facts aged out to the archives for the budget
    calls: int | None = None  # summarizer model calls

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def of(
        cls,
        agent: str,
        trigger: Trigger,
        *,
        started_at: float,
        duration_s: float,
        outcome: Outcome | None,
        error: str | None,
        model: str | None = None,
        fallback: bool = False,
    ) -> LedgerEntry:
        """The ledger row for one compaction attempt (``outcome`` None when it failed)."""
        if outcome is None:
            return cls(
                agent,
                started_at,
                duration_s,
                None,
                None,
                None,
                model,
                None,
                error,
                trigger,
                fallback=fallback,
            )
        return cls(
            agent=agent,
            started_at=started_at,
            duration_s=duration_s,
            archive=str(outcome.archive),
            tokens_before=outcome.tokens_before,
            tokens_after=outcome.tokens_after,
            model=outcome.model or model,
            cost_usd=outcome.cost_usd,
            error=error,
            trigger=trigger,
            tokens_produced=outcome.tokens_produced,
            tokens_appended=outcome.tokens_appended,
            fallback=fallback,
            pinned=outcome.pinned,
            evicted=outcome.evicted,
            calls=outcome.calls,
        )


@dataclass(frozen=True, slots=True)
class FileKey:
    """What a cached token count is valid for: this exact file version and encoding."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    encoding: str

    @classmethod
    def of(cls, result: os.stat_result, encoding: str) -> FileKey:
        return cls(result.st_dev, result.st_ino, result.st_size, result.st_mtime_ns, encoding)


class LedgerMark(NamedTuple):
    """How far a reader has followed the ledger (:meth:`StateStore.ledger_written_elsewhere`):
    the newest row it has seen, and the DB's ``PRAGMA data_version`` then, on the
    connection it was read on (each connection counts on its own: a reopen starts over)."""

    last_id: int
    data_version: int
    connection: int


@dataclass(frozen=True, slots=True)
class SpendingRecord:
    """The daemon's spending against ``[summarizer] max_calls_per_hour`` /
    ``max_usd_per_day``, and the hold a cap puts on compactions (if any)."""

    calls_last_hour: int
    usd_last_day: float
    held_reason: str | None
    held_until: float | None
    ts: float


# The heartbeat's detail after a clean stop: `memd health` says "stopped at …"
# rather than "no daemon has run".
STOPPED_DETAIL = "stopped"


# The daemon's last reload (``state_meta`` key ``last_reload``): what ``memd
# reload`` reads when the audit log has no answer for it (the daemon could not
# write the log: unwritable, full). A JSON object whose ``format`` says how to
# read it; state_meta is schema 4's, and an older memd reads only its own key
# there, so no schema version changes. A record in a later format than this
# memd's is not guessed at (StateError).
LAST_RELOAD_KEY = "last_reload"
LAST_RELOAD_FORMAT = 1


class ReloadOutcome(NamedTuple):
    """A reload as the daemon ``pid`` took it: begun at ``started_ns``
    (CLOCK_MONOTONIC), applied (``ok``) or refused with ``errors`` problems,
    the config sections it ``changed``, and why its audit record could not be
    written (``audit_error``; None: it was)."""

    pid: int
    started_ns: int
    ok: bool
    errors: int | None = None
    changed: tuple[str, ...] = ()
    audit_error: str | None = None

    def encode(self) -> bytes:
        return json.dumps(
            {
                "format": LAST_RELOAD_FORMAT,
                "pid": self.pid,
                "started_ns": self.started_ns,
                "ok": self.ok,
                "errors": self.errors,
                "changed": list(self.changed),
                "audit_error": self.audit_error,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, value: object) -> ReloadOutcome:
        """The record stored as ``value``; ValueError saying why it cannot be read."""
        try:
            data = json.loads(value if isinstance(value, bytes) else str(value))
        except (ValueError, TypeError):
            raise ValueError("not a JSON object") from None
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        version = data.get("format")
        if _is_int(version) and version > LAST_RELOAD_FORMAT:
            raise ValueError(
                f"written by a newer memd (format {version}; this memd reads {LAST_RELOAD_FORMAT})"
            )
        pid, started, ok = data.get("pid"), data.get("started_ns"), data.get("ok")
        errors, changed, audit_error = (
            data.get("errors"),
            data.get("changed", []),
            data.get("audit_error"),
        )
        if (
            version != LAST_RELOAD_FORMAT
            or not _is_int(pid)
            or not _is_int(started)
            or not isinstance(ok, bool)
            or not (errors is None or _is_int(errors))
            or not isinstance(changed, list)
            or not all(isinstance(name, str) for name in changed)
            or not (audit_error is None or isinstance(audit_error, str))
        ):
            raise ValueError(f"not a format {LAST_RELOAD_FORMAT} record")
        return cls(pid, started, ok, errors, tuple(changed), audit_error)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pid: int
    started_at: float
    healthy: bool
    detail: str
    agents: int
    ts: float

    def age(self, now: float) -> float:
        return now - self.ts

    def is_fresh(self, now: float, max_age_s: float) -> bool:
        # A heartbeat from the (slightly skewed) future still counts as fresh.
        return self.age(now) <= max_age_s

    def pid_alive(self) -> bool:
        return pid_alive(self.pid)

    @property
    def stopped(self) -> bool:
        """The daemon wrote this at a clean stop (``ts`` is when)."""
        return not self.healthy and self.detail == STOPPED_DETAIL


_PID_MAX = 2**31 - 1  # pid_t


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists (another user's process counts).
    No pid is past pid_t's range (``memd reload --pid 2147483648``, a heartbeat
    row holding one): os.kill's OverflowError was a traceback."""
    if pid <= 0 or pid > _PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_memd_daemon(pid: int) -> bool | None:
    """Whether ``pid`` is a running ``memd run``: False when no such process is
    alive or it is another program (a pid reused after a crash, ``memd mcp``,
    ``tail -f memd.log``), None when we cannot tell (its /proc is hidden from
    us: hidepid). Its arguments must hold ``run`` after one that names memd
    (``memd run``, ``python -m memd run``, ``/usr/bin/memd ... run``)."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    args = cmdline.split(b"\0")
    named = next((i for i, arg in enumerate(args) if b"memd" in arg), None)
    return named is not None and b"run" in args[named + 1 :]


def state_db_path(state_dir: Path, workspace: Path) -> Path:
    digest = hashlib.sha256(str(workspace.resolve()).encode("utf-8", "surrogateescape"))
    return state_dir / f"{digest.hexdigest()[:16]}.sqlite3"


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    if isinstance(exc, sqlite3.OperationalError):
        return False  # locked, I/O, read-only: not the file's content
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return True
    return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)


@contextlib.contextmanager
def _rebuild_lock(db_path: Path) -> Iterator[None]:
    """Serialize open/rebuild across processes, so two of them never both move a DB aside."""
    fd = os.open(f"{db_path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


class StateStore:
    """Thread-safe handle on one workspace's state DB (one connection behind a lock)."""

    def __init__(self, conn: sqlite3.Connection, path: Path | None, warnings: list[str]) -> None:
        self._conn = conn
        self._lock = threading.RLock()
        # limit_waits: from then on, how long (monotonic) an operation may wait
        # for another process's lock on the DB; None: BUSY_TIMEOUT_S each.
        self._waits_end: float | None = None
        self.path = path  # None when running on the in-memory fallback
        self.warnings = warnings
        # How the caller chose the state dir (printed by `memd status`/`health`).
        self.found_by = ""
        self._identity = _file_identity(path)
        # count_marks as this handle last read or wrote it: agent -> (dev, ino,
        # marks), a row that does not decode as _UNREADABLE; None: not read yet
        # (read on the first write, and again after the file changed under us).
        # A flush writes an agent's marks only when they differ from these.
        self._marks_stored: dict[str, tuple[int, int, tuple[int, ...]]] | None = None

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, state_dir: Path, workspace: Path) -> StateStore:
        """Open (creating, or rebuilding when corrupt) the DB for ``workspace``.

        Raises :class:`NewerStateDB` only: a DB a newer memd wrote is left as it is.
        """
        warnings: list[str] = []
        path = state_db_path(state_dir, workspace)
        try:
            _ensure_private_dir(state_dir)
            with _rebuild_lock(path):
                conn = _open_checked(path, warnings)
                store = cls(conn, path, warnings)  # records the file's identity under the lock
        except (OSError, sqlite3.Error) as exc:
            message = (
                f"state DB {path} is unusable ({describe_error(exc, with_file=False)}); "
                "using a temporary in-memory state (live figures and history unavailable)"
            )
            # Returned, not logged: the caller says it once (the CLI as
            # `memd: warning:`, the daemon in its log as `state database`).
            warnings.append(message)
            conn = _connect(":memory:")
            _create_schema(conn)
            return cls(conn, None, warnings)
        return store

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def limit_waits(self, seconds: float) -> None:
        """From now on, operations together wait at most ``seconds`` for a lock
        another process holds on the DB (each waits what is left, then fails as
        locked). A daemon stopping: the DB is a cache of what the files say, and
        a long ``sqlite3`` transaction held the stop ``BUSY_TIMEOUT_S`` per write
        (final flush, heartbeat, …: half a minute). An operation already waiting
        finishes its own wait."""
        self._waits_end = time.monotonic() + seconds

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --------------------------------------------------------------- internals

    def _run(self, operation: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._lock:
            if self.path is not None and _file_identity(self.path) != self._identity:
                self._reopen()
            if self._waits_end is not None:
                left_ms = max(0, int((self._waits_end - time.monotonic()) * 1000))
                self._conn.execute(f"PRAGMA busy_timeout = {left_ms}")
            try:
                return operation(self._conn)
            except sqlite3.DatabaseError as exc:
                if not _is_corruption(exc) or self.path is None:
                    raise StateError(f"state DB {self.path or ':memory:'}: {exc}") from None
                self._rebuild_after(exc)
            try:
                return operation(self._conn)
            except sqlite3.DatabaseError as exc:
                raise StateError(f"state DB {self.path}: {exc}") from None

    def _reopen(self) -> None:
        # The file at our path is no longer the one we opened: another process
        # moved a corrupt DB aside and rebuilt it, or someone deleted it. Follow
        # the path, or we would keep writing into a file nobody reads.
        assert self.path is not None
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
        try:
            _ensure_private_dir(self.path.parent)
            with _rebuild_lock(self.path):
                self._marks_stored = None
                self._conn = self._open_logged()
                self._identity = _file_identity(self.path)
        except (OSError, sqlite3.Error) as exc:
            self._conn = _connect(":memory:")
            _create_schema(self._conn)
            raise StateError(
                f"state DB {self.path}: cannot reopen: {describe_error(exc, with_file=False)}"
            ) from None

    def _rebuild_after(self, exc: sqlite3.DatabaseError) -> None:
        # Corruption noticed while running (the file was damaged under us).
        assert self.path is not None
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
        with _rebuild_lock(self.path):
            if _probe(self.path) is not None:
                moved = _move_aside(self.path)
                message = (
                    f"state DB {self.path} was corrupt ({exc}); moved to {moved.name}, rebuilt"
                )
                _log.warning(message)
                self.warnings.append(message)
            # else another process has rebuilt it already: just reopen.
            self._marks_stored = None
            self._conn = self._open_logged()
            self._identity = _file_identity(self.path)

    def _open_logged(self) -> sqlite3.Connection:
        # A reopen while running: no caller reads ``warnings`` any more, so a
        # rebuild it caused is logged here.
        assert self.path is not None
        before = len(self.warnings)
        conn = _open_checked(self.path, self.warnings)
        for message in self.warnings[before:]:
            _log.warning(message)
        return conn

    @contextlib.contextmanager
    def _write(self, conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front: no SQLITE_BUSY when a
        # read transaction would later need upgrading.
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # ------------------------------------------------------------------ agents

    def upsert_agents(self, records: Iterable[AgentRecord]) -> None:
        """Write the agents' rows, and their marks where they changed (a live flush
        of a growing file rewrites its row, its marks only when a mark is added)."""
        rows = list(records)

        def operation(conn: sqlite3.Connection) -> None:
            stored = self._stored_marks(conn)
            with self._write(conn):
                # An erased agent is not written back (a daemon's stale count);
                # the daemon lifts the tombstone when the agent writes again.
                erased = self._erased_among(conn, (row[0] for row in rows))
                # A record is its row but the last field (AGENT_COLUMNS).
                conn.executemany(_UPSERT_AGENT, [row[:-1] for row in rows if row[0] not in erased])
                changed: list[AgentRecord] = []
                for row in rows:
                    if row[0] in erased:
                        continue
                    before = stored.get(row[0])
                    if _marks_changed(before, row):
                        changed.append(row)
                    elif before is not None and before[2] is not row.marks:
                        # Equal: keep the count's own tuple, compared by identity next time.
                        stored[row[0]] = (before[0], before[1], row.marks)
                if changed:
                    conn.executemany(
                        "DELETE FROM count_marks WHERE agent = ?",
                        [(row.agent,) for row in changed if not row.marks],
                    )
                    conn.executemany(
                        _UPSERT_MARKS,
                        [
                            (row.agent, row.dev, row.ino, pack_marks(row.marks))
                            for row in changed
                            if row.marks
                        ],
                    )
            self._marks_gone(erased)  # `forget` deleted them
            for row in changed:
                if row.marks:
                    stored[row.agent] = (row.dev, row.ino, row.marks)
                else:
                    stored.pop(row.agent, None)

        self._run(operation)

    def _stored_marks(
        self, conn: sqlite3.Connection
    ) -> dict[str, tuple[int, int, tuple[int, ...]]]:
        """count_marks as it is (read once per file: this handle's writes keep it)."""
        if self._marks_stored is None:
            self._marks_stored = {
                agent: (dev, ino, unpack_marks(blob) or _UNREADABLE)
                for agent, dev, ino, blob in conn.execute(
                    "SELECT agent, dev, ino, marks FROM count_marks"
                )
            }
        return self._marks_stored

    def _marks_gone(self, names: Iterable[str]) -> None:
        """These agents have no count_marks row now."""
        with self._lock:
            stored = self._marks_stored
            if stored is not None:
                for name in names:
                    stored.pop(name, None)

    def get_agent(self, name: str) -> AgentRecord | None:
        """The agent's row (None: none, or one holding a value of the wrong type)."""

        def operation(conn: sqlite3.Connection) -> AgentRecord | None:
            row = conn.execute(f"{_SELECT_AGENTS} WHERE agents.agent = ?", (name,)).fetchone()
            return None if row is None else _agent_from_row(row, [])

        return self._run(operation)

    def agents(self, bad: list[BadRow] | None = None) -> list[AgentRecord]:
        """Every agent's row, by name. A row holding a value of the wrong type (a
        damaged or hand-edited DB) is left out, and added to ``bad`` when given."""
        skipped: list[BadRow] = [] if bad is None else bad
        start = len(skipped)

        def operation(conn: sqlite3.Connection) -> list[AgentRecord]:
            del skipped[start:]  # a retry after a rebuild starts again
            rows = conn.execute(f"{_SELECT_AGENTS} ORDER BY agents.agent").fetchall()
            records = [_agent_from_row(row, skipped) for row in rows]
            return [record for record in records if record is not None]

        return self._run(operation)

    def remove_agent(self, name: str) -> None:
        """Drop the agent's count record and marks (its ledger stays; see :meth:`forget_agent`)."""

        def operation(conn: sqlite3.Connection) -> None:
            with self._write(conn):
                conn.execute("DELETE FROM agents WHERE agent = ?", (name,))
                conn.execute("DELETE FROM count_marks WHERE agent = ?", (name,))
            self._marks_gone([name])

        self._run(operation)

    def forget_agent(
        self, name: str, *, erased_at_ns: int | None = None, survivor: tuple[int, int] = (0, 0)
    ) -> int:
        """Drop everything memd remembers about ``name``; returns the rows removed.

        With ``erased_at_ns`` (``memd forget``) a tombstone keeps a running
        daemon from writing the agent back (see :mod:`memd.core.erasure`), in the
        same transaction as the deletion; then the file is scrubbed (no copy of
        the rows stays in free pages or the WAL).
        """
        key = self.key_of(name) if erased_at_ns is not None else None

        def operation(conn: sqlite3.Connection) -> int:
            removed = 0
            with self._write(conn):
                for table in _AGENT_TABLES:
                    deleted = conn.execute(
                        f"DELETE FROM {table} WHERE agent = ?",  # noqa: S608  # a constant name
                        (name,),
                    ).rowcount
                    # What the report counts: the agent's record and its ledger rows.
                    removed += deleted if table in ("agents", "ledger") else 0
                if key is not None:
                    conn.execute(
                        "INSERT OR REPLACE INTO erasures VALUES (?,?,?,?)",
                        (key, erased_at_ns, survivor[0], survivor[1]),
                    )
            return int(removed)

        removed = self._run(operation)
        self._marks_gone([name])
        if erased_at_ns is not None:
            self.scrub()
        return removed

    def scrub(self) -> None:
        """Leave no deleted row readable in the file: VACUUM (no free page or cell
        keeps old bytes), and a TRUNCATE checkpoint (the WAL's old frames go)."""

        def operation(conn: sqlite3.Connection) -> None:
            if self.path is None:
                return
            _checkpoint_truncate(conn, self.path)
            conn.execute("VACUUM")
            _checkpoint_truncate(conn, self.path)

        self._run(operation)

    # --------------------------------------------------------------- erasures

    def _salt(self, conn: sqlite3.Connection) -> bytes:
        row = conn.execute("SELECT value FROM state_meta WHERE key = 'erasure_salt'").fetchone()
        if row is not None:
            return bytes(row[0])
        with self._write(conn):
            conn.execute(
                "INSERT OR IGNORE INTO state_meta VALUES ('erasure_salt', ?)", (os.urandom(32),)
            )
            row = conn.execute("SELECT value FROM state_meta WHERE key = 'erasure_salt'").fetchone()
        return bytes(row[0])

    def key_of(self, name: str) -> str:
        """How a tombstone names ``name`` (a salted hash, never the name)."""
        from memd.core.erasure import agent_key

        return agent_key(self._run(self._salt), name)

    def tombstones(self) -> dict[str, Tombstone]:
        """Every erasure still in force, by agent key."""

        def operation(conn: sqlite3.Connection) -> dict[str, Tombstone]:
            rows = conn.execute(
                "SELECT agent_key, erased_at_ns, survivor_dev, survivor_ino FROM erasures"
            ).fetchall()
            from memd.core.erasure import Tombstone

            return {row[0]: Tombstone(*row) for row in rows}

        return self._run(operation)

    def tombstoned(self, names: Iterable[str]) -> dict[str, Tombstone]:
        """The erasures in force for any of ``names``, by name (usually none: one query)."""
        stones = self.tombstones()
        if not stones:
            return {}
        from memd.core.erasure import agent_key

        salt = self._run(self._salt)
        found = {name: stones.get(agent_key(salt, name)) for name in names}
        erased = {name: stone for name, stone in found.items() if stone is not None}
        self._marks_gone(erased)  # `forget` deleted them
        return erased

    def lift_tombstone(self, stone: Tombstone) -> bool:
        """The agent wrote again: end this erasure (not a newer one made since)."""

        def operation(conn: sqlite3.Connection) -> bool:
            with self._write(conn):
                deleted = conn.execute(
                    "DELETE FROM erasures WHERE agent_key = ? AND erased_at_ns = ?",
                    (stone.key, stone.erased_at_ns),
                ).rowcount
            return bool(deleted)

        return self._run(operation)

    def _erased_among(self, conn: sqlite3.Connection, names: Iterable[str]) -> set[str]:
        """Which of ``names`` are erased. The caller holds the write transaction, so a
        ``forget`` cannot slip in between this check and its write."""
        keys = {row[0] for row in conn.execute("SELECT agent_key FROM erasures")}
        if not keys:
            return set()
        from memd.core.erasure import agent_key

        salt = self._salt(conn)  # exists: the keys were made with it
        return {name for name in set(names) if agent_key(salt, name) in keys}

    # ------------------------------------------------------------- count cache

    def cached_count(self, agent: str, key: FileKey) -> int | None:
        """A token count ``memd status`` saved for exactly this file version, if any."""

        def operation(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(
                "SELECT tokens FROM file_counts WHERE agent = ? AND dev = ? AND ino = ?"
                " AND size = ? AND mtime_ns = ? AND encoding = ?",
                (agent, key.dev, key.ino, key.size, key.mtime_ns, key.encoding),
            ).fetchone()
            return None if row is None else int(row[0])

        return self._run(operation)

    def save_counts(self, counts: Iterable[tuple[str, FileKey, int]]) -> None:
        """Remember exact counts so the next ``memd status`` without a daemon is cheap."""
        rows = [
            (agent, k.dev, k.ino, k.size, k.mtime_ns, k.encoding, tokens)
            for agent, k, tokens in counts
        ]

        def operation(conn: sqlite3.Connection) -> None:
            with self._write(conn):
                erased = self._erased_among(conn, (row[0] for row in rows))
                conn.executemany(
                    "INSERT OR REPLACE INTO file_counts VALUES (?,?,?,?,?,?,?)",
                    [row for row in rows if row[0] not in erased],
                )

        self._run(operation)

    # ------------------------------------------------------------------ ledger

    def record_compaction(self, entry: LedgerEntry) -> None:
        def operation(conn: sqlite3.Connection) -> None:
            with self._write(conn):
                if self._erased_among(conn, [entry.agent]):
                    return  # a compaction that ran into `memd forget`: nothing to log
                conn.execute(
                    _INSERT_LEDGER,
                    (
                        entry.agent,
                        entry.started_at,
                        entry.duration_s,
                        entry.archive,
                        entry.tokens_before,
                        entry.tokens_after,
                        entry.model,
                        entry.cost_usd,
                        entry.error,
                        entry.trigger,
                        entry.tokens_produced,
                        entry.tokens_appended,
                        int(entry.fallback),
                        entry.pinned,
                        entry.evicted,
                        entry.calls,
                    ),
                )
                if entry.error is None and entry.archive is not None:
                    # A compaction of another process (compact-now beside the daemon)
                    # is the agent's last one too: `memd status` reads it from the row.
                    ended = entry.started_at + entry.duration_s
                    conn.execute(
                        "UPDATE agents SET last_compaction_at = ? WHERE agent = ?"
                        " AND (last_compaction_at IS NULL OR last_compaction_at < ?)",
                        (ended, entry.agent, ended),
                    )
                conn.execute(
                    "DELETE FROM ledger WHERE agent = ? AND id <= ("
                    " SELECT id FROM ledger WHERE agent = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (entry.agent, entry.agent, LEDGER_KEEP_PER_AGENT),
                )

        self._run(operation)

    def last_compactions(self, agents: Iterable[str]) -> dict[str, float]:
        """When each of ``agents`` last compacted, as the ledger says (the end of its
        newest compaction that wrote an archive); an agent with none is left out.
        For agents with no row yet: a ``compact-now`` before any daemon ran had no
        row to put it in (:meth:`record_compaction`). One statement, an indexed
        lookup per agent inside SQLite (30,000 agents: ~10 ms)."""
        wanted = json.dumps(list(agents))

        def operation(conn: sqlite3.Connection) -> dict[str, float]:
            rows = conn.execute(_LAST_COMPACTIONS, (wanted,)).fetchall()
            return {
                str(agent): float(ended)
                for agent, ended in rows
                if isinstance(agent, str) and isinstance(ended, int | float)
            }

        return self._run(operation)

    def history(self, agent: str, limit: int = 50) -> list[LedgerEntry]:
        """The agent's compactions and failed attempts, newest first."""

        def operation(conn: sqlite3.Connection) -> list[LedgerEntry]:
            rows = conn.execute(
                _SELECT_LEDGER,
                (agent, _sql_limit(max(0, limit))),
            ).fetchall()
            return [_ledger_from_row(row) for row in rows]

        return self._run(operation)

    def ledger_mark(self) -> LedgerMark:
        """Where the ledger ends now: what :meth:`ledger_written_elsewhere` reads from."""

        def operation(conn: sqlite3.Connection) -> LedgerMark:
            version = int(conn.execute("PRAGMA data_version").fetchone()[0])
            last = conn.execute("SELECT coalesce(max(id), 0) FROM ledger").fetchone()[0]
            return LedgerMark(int(last), version, id(conn))

        return self._run(operation)

    def ledger_written_elsewhere(self, mark: LedgerMark) -> tuple[LedgerMark, list[str]]:
        """The agents of the ledger rows after ``mark`` that another process wrote
        (``memd compact-now`` beside the daemon: the trigger is not ``daemon``), once
        each, oldest first, and the new mark. Cheap when nothing was committed
        elsewhere: ``PRAGMA data_version`` moves only when another connection commits
        (this handle's own writes leave it), and then only the rows past the mark's
        id are read (ids are never reused: AUTOINCREMENT)."""

        def operation(conn: sqlite3.Connection) -> tuple[LedgerMark, list[str]]:
            version = int(conn.execute("PRAGMA data_version").fetchone()[0])
            if (version, id(conn)) == (mark.data_version, mark.connection):
                return mark, []
            # Another connection: the file was rebuilt or replaced (_reopen), its
            # ids start over; every row in it is newer than the mark.
            after = mark.last_id if id(conn) == mark.connection else 0
            rows = conn.execute(
                "SELECT id, agent, trigger FROM ledger WHERE id > ? ORDER BY id", (after,)
            ).fetchall()
            last = max([after, *(int(row[0]) for row in rows)])
            agents = {str(agent): None for _, agent, trigger in rows if trigger != "daemon"}
            return LedgerMark(last, version, id(conn)), list(agents)

        return self._run(operation)

    def spending_since(self, since: float) -> list[tuple[float, int, float]]:
        """(started_at, model calls, USD) of every ledger row since ``since``, any agent,
        oldest first: what a restarted daemon already spent inside its caps' windows."""

        def operation(conn: sqlite3.Connection) -> list[tuple[float, int, float]]:
            rows = conn.execute(
                "SELECT started_at, calls, cost_usd FROM ledger WHERE started_at >= ?"
                " AND model IS NOT NULL AND model NOT IN ('builtin', 'provided')"
                " ORDER BY started_at",
                (since,),
            ).fetchall()
            return [(float(at), int(calls or 0), float(usd or 0.0)) for at, calls, usd in rows]

        return self._run(operation)

    # ---------------------------------------------------------------- spending

    def write_spending(self, record: SpendingRecord) -> None:
        def operation(conn: sqlite3.Connection) -> None:
            with self._write(conn):
                conn.execute(
                    "INSERT OR REPLACE INTO spending VALUES (1,?,?,?,?,?)",
                    (
                        record.calls_last_hour,
                        record.usd_last_day,
                        record.held_reason,
                        record.held_until,
                        record.ts,
                    ),
                )

        self._run(operation)

    def read_spending(self) -> SpendingRecord | None:
        def operation(conn: sqlite3.Connection) -> SpendingRecord | None:
            row = conn.execute(
                "SELECT calls_last_hour, usd_last_day, held_reason, held_until, ts"
                " FROM spending WHERE id = 1"
            ).fetchone()
            return None if row is None else SpendingRecord(*row)

        return self._run(operation)

    # ------------------------------------------------------------ fleet status

    def agent_count(self) -> int:
        def operation(conn: sqlite3.Connection) -> int:
            return int(conn.execute("SELECT count(*) FROM agents").fetchone()[0])

        return self._run(operation)

    def fleet_totals(self) -> FleetTotals:
        """Totals over every agent row (one aggregate query: ``memd status`` at 30,000 agents)."""

        def operation(conn: sqlite3.Connection) -> FleetTotals:
            row = conn.execute(_TOTALS).fetchone()
            return FleetTotals(*(int(value or 0) for value in row))

        return self._run(operation)

    def fleet_rows(
        self, sort: StatusSort, limit: int | None, bad: list[BadRow] | None = None
    ) -> list[StatusRow]:
        """The agents' status rows, ``sort`` order, at most ``limit`` (the DB sorts and
        cuts). A row holding a value of the wrong type is left out (added to ``bad``)."""
        skipped: list[BadRow] = [] if bad is None else bad
        start = len(skipped)

        def operation(conn: sqlite3.Connection) -> list[StatusRow]:
            del skipped[start:]  # a retry after a rebuild starts again
            rows = conn.execute(
                f"SELECT {_STATUS_COLUMNS} FROM agents"  # noqa: S608
                f" ORDER BY {_STATUS_ORDER[sort]} LIMIT ?",
                (_sql_limit(limit),),
            ).fetchall()
            good = []
            for row in rows:
                types = tuple(map(type, row))
                if types not in _GOOD_STATUS_TYPES:
                    wrong = _wrong_value(_STATUS_CHECKED, row)
                    if wrong is not None:
                        skipped.append(wrong)
                        continue
                    _GOOD_STATUS_TYPES.add(types)
                good.append(StatusRow._make((*row[:-2], bool(row[-2]), bool(row[-1]))))
            return good

        return self._run(operation)

    def fleet_json(
        self,
        sort: StatusSort,
        limit: int | None,
        extra: Mapping[str, object],
        emit: Callable[[list[tuple[str, str, bool]]], None],
        *,
        encrypt_archives: bool = False,
    ) -> None:
        """Each row as its ``memd status --json`` object, built by SQLite, handed to
        ``emit`` in batches as read (a 30,000-agent fleet streams, never held whole).

        Each item is (JSON text, agent, archives unknown); ``extra`` adds constant
        keys at the end of every object; with ``encrypt_archives`` (the config's)
        recall is off for every agent.
        """
        constant = "".join(", ?, json(?)" for _ in extra)
        params: list[object] = [int(encrypt_archives)]
        for key, value in extra.items():
            params += [key, json.dumps(value)]
        query = (
            f"SELECT json_object({_STATUS_JSON}{constant}), agent, archives IS NULL"  # noqa: S608
            f" FROM agents ORDER BY {_STATUS_ORDER[sort]} LIMIT ?"
        )

        def operation(conn: sqlite3.Connection) -> None:
            cursor = conn.execute(query, (*params, _sql_limit(limit)))
            while batch := cursor.fetchmany(4096):
                emit(batch)

        self._run(operation)

    # --------------------------------------------------------------- heartbeat

    def write_heartbeat(
        self, pid: int, started_at: float, healthy: bool, detail: str, agents: int, ts: float
    ) -> None:
        def operation(conn: sqlite3.Connection) -> None:
            with self._write(conn):
                conn.execute(
                    "INSERT OR REPLACE INTO heartbeat VALUES (1,?,?,?,?,?,?)",
                    (pid, started_at, int(healthy), detail, agents, ts),
                )

        self._run(operation)

    def read_heartbeat(self) -> Heartbeat | None:
        def operation(conn: sqlite3.Connection) -> Heartbeat | None:
            row = conn.execute(
                "SELECT pid, started_at, healthy, detail, agents, ts FROM heartbeat WHERE id = 1"
            ).fetchone()
            if row is None:
                return None
            pid, started_at, healthy, detail, agents, ts = row
            return Heartbeat(pid, started_at, bool(healthy), detail, agents, ts)

        return self._run(operation)

    def write_last_reload(self, outcome: ReloadOutcome) -> None:
        """Keep ``outcome`` as the daemon's last reload (replacing the one before)."""

        def operation(conn: sqlite3.Connection) -> None:
            with self._write(conn):
                conn.execute(
                    "INSERT OR REPLACE INTO state_meta VALUES (?, ?)",
                    (LAST_RELOAD_KEY, outcome.encode()),
                )

        self._run(operation)

    def read_last_reload(self) -> ReloadOutcome | None:
        """The daemon's last reload; None when none is recorded (no reload since
        this memd, or only an older memd's daemon ran). A record that cannot be
        read (damaged, a newer memd's format) is a StateError saying why."""

        def operation(conn: sqlite3.Connection) -> object:
            row = conn.execute(
                "SELECT value FROM state_meta WHERE key = ?", (LAST_RELOAD_KEY,)
            ).fetchone()
            return None if row is None else row[0]

        value = self._run(operation)
        if value is None:
            return None
        try:
            return ReloadOutcome.decode(value)
        except ValueError as exc:
            raise StateError(
                f"state DB {self.path or ':memory:'}: last reload record: {exc}"
            ) from None

    def clear_heartbeat(self, pid: int, now: float | None = None) -> None:
        """Mark the heartbeat stopped if ``pid`` wrote it (a daemon's clean shutdown).

        The row stays, so `memd health` can say when the daemon stopped.
        """
        stopped_at = time.time() if now is None else now

        def operation(conn: sqlite3.Connection) -> None:
            with self._write(conn):
                conn.execute(
                    "UPDATE heartbeat SET healthy = 0, detail = ?, ts = ? WHERE id = 1 AND pid = ?",
                    (STOPPED_DETAIL, stopped_at, pid),
                )

        self._run(operation)


# ---------------------------------------------------------------------- helpers


# The columns in LedgerEntry's field order.
_INSERT_LEDGER = (
    "INSERT INTO ledger (agent, started_at, duration_s, archive, tokens_before, tokens_after,"
    " model, cost_usd, error, trigger, tokens_produced, tokens_appended, fallback, pinned,"
    " evicted, calls) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_SELECT_LEDGER = (
    "SELECT agent, started_at, duration_s, archive, tokens_before, tokens_after, model,"
    " cost_usd, error, trigger, tokens_produced, tokens_appended, fallback, pinned, evicted,"
    " calls FROM ledger WHERE agent = ? ORDER BY id DESC LIMIT ?"
)


def _sql_limit(limit: int | None) -> int:
    """``LIMIT ?``'s value: -1 (no limit) for None, and a count past SQLite's
    64-bit integers (``memd history -n 99999999999999999999999``) is every row,
    not sqlite3's OverflowError."""
    if limit is None:
        return -1
    return min(limit, _SQLITE_INT_MAX)


_SQLITE_INT_MAX = 2**63 - 1


def _ledger_from_row(row: tuple[Any, ...]) -> LedgerEntry:
    fields = list(row)
    fields[12] = bool(fields[12])  # fallback is stored as 0/1
    return LedgerEntry(*fields)


_ESTIMATED = AGENT_COLUMNS.index("estimated")


@functools.cache
def _count_types() -> tuple[type[CountState], type[TrackedCount]]:
    """The counter's types, imported on first use (see the imports at the top) and
    kept: two import statements per call cost more than the record they convert
    (a restart converts every agent's)."""
    from memd.core.tokens import CountState
    from memd.counting import TrackedCount

    return CountState, TrackedCount


_SAFE_OFFSET = AGENT_COLUMNS.index("safe_offset")
_SAFE_TOKENS = AGENT_COLUMNS.index("safe_tokens")
# A count_marks row that does not decode: never equal to a count's marks, so the
# agent's next write replaces it.
_UNREADABLE: tuple[int, ...] = (-1,)


# StatusRow's columns of ``agents`` (the last two are made 0/1 by the query), and
# the rows' tuples of types found good (as _GOOD_TYPES).
_STATUS_CHECKED = StatusRow._fields[:-2]
_GOOD_STATUS_TYPES: set[tuple[type, ...]] = set()


def _wrong_value(columns: Sequence[str], values: Sequence[object]) -> BadRow | None:
    """The first of ``values`` (``columns`` of agents, the agent's name first) not of
    its column's type, if any."""
    for column, value in zip(columns, values, strict=False):
        if type(value) not in _COLUMN_TYPES[column]:
            return BadRow(str(values[0]), column, value)
    return None


def _agent_from_row(row: tuple[object, ...], bad: list[BadRow]) -> AgentRecord | None:
    """The record of a row read by _SELECT_AGENTS; None (and the row in ``bad``)
    when a value is not of its column's type."""
    types = tuple(map(type, row))  # the marks' too: read as none when not a blob
    values = list(row)
    blob = values.pop()
    if types not in _GOOD_TYPES:
        wrong = _wrong_value(AGENT_COLUMNS, values)
        if wrong is not None:
            bad.append(wrong)
            return None
        _GOOD_TYPES.add(types)
    # Columns mirror the fields; `estimated` is stored as 0/1.
    values[_ESTIMATED] = estimated = bool(values[_ESTIMATED])
    # Marks that do not fit their count are dropped where the count is restored
    # (memd.counting.fitting_marks), the one reader that trusts them.
    marks = unpack_marks(blob) if blob is not None and not estimated else None
    values.append(() if marks is None else marks)
    return AgentRecord._make(values)


def _marks_changed(stored: tuple[int, int, tuple[int, ...]] | None, record: AgentRecord) -> bool:
    """Whether ``record``'s marks differ from count_marks' row ``stored`` (None: no row)."""
    marks = record.marks
    if stored is None:
        return bool(marks)
    dev, ino, before = stored
    return (before is not marks and before != marks) or dev != record.dev or ino != record.ino


def _file_identity(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        result = path.stat()
    except OSError:
        return None
    return result.st_dev, result.st_ino


def _ensure_private_dir(state_dir: Path) -> None:
    # Created 0700: the DB names agents and holds error texts; refused when
    # another uid owns it or may write in it (fsutil.ensure_private_dir).
    ensure_private_dir(state_dir)


def _connect(target: str) -> sqlite3.Connection:
    conn = sqlite3.connect(
        target, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    # Deleted rows are overwritten, not left in free space: an upsert replaces
    # a row (the old one would linger), and an erasure must leave no trace.
    conn.execute("PRAGMA secure_delete = ON")
    return conn


def _create_schema(conn: sqlite3.Connection) -> None:
    # Fast path without the write lock: an up-to-date DB needs nothing. A schema 7
    # DB an older memd made lacks count_marks and its triggers: added below.
    with contextlib.suppress(sqlite3.OperationalError):  # "no such table": a new file
        row = conn.execute(_UP_TO_DATE).fetchone()
        if row == (SCHEMA_VERSION, len(_ADDED_OBJECTS)):
            return
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = None
        with contextlib.suppress(sqlite3.OperationalError):  # "no such table": a new file
            row = conn.execute("SELECT version FROM schema_version").fetchone()
        version = None if row is None else row[0]
        if (
            isinstance(version, int)
            and version > SCHEMA_VERSION
            and (version != _DEV_SCHEMA_8 or not _is_dev_schema_8(conn))
        ):
            raise _NewerSchema(version)  # left as it is, for the newer memd that wrote it
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        if row is None:
            conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
        elif version == _DEV_SCHEMA_8:
            _undo_dev_schema_8(conn)
        elif version != SCHEMA_VERSION:
            _migrate(conn, version)
        for statement in _TRIGGERS:
            conn.execute(statement)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _migrate(conn: sqlite3.Connection, version: object) -> None:
    """Bring a DB an older memd wrote up to :data:`SCHEMA_VERSION`, rows kept
    (the caller holds the write transaction)."""
    if not isinstance(version, int) or version not in _MIGRATIONS:
        raise _CorruptDatabase(f"schema version {version}, expected {SCHEMA_VERSION}")
    while version < SCHEMA_VERSION:
        if version not in _MIGRATIONS:
            raise _CorruptDatabase(f"schema version {version}: no upgrade step")
        for statement in _MIGRATIONS[version]:
            conn.execute(statement)
        version += 1
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
    _log.info(f"state DB schema upgraded to version {SCHEMA_VERSION}")


def _agent_columns_of(conn: sqlite3.Connection) -> list[str]:
    return [row[1] for row in conn.execute("PRAGMA table_info(agents)")]


def _is_dev_schema_8(conn: sqlite3.Connection) -> bool:
    """Whether a DB that says schema 8 is the dev layout of 48ea21b: schema 7 with
    an ``agents.marks`` column appended, nothing else."""
    return _agent_columns_of(conn) == [*AGENT_COLUMNS, "marks"]


def _undo_dev_schema_8(conn: sqlite3.Connection) -> None:
    """Bring a dev schema 8 DB back to 7: each row's marks (raw pairs) into
    count_marks (this format), and ``agents`` rebuilt without the column, rows
    kept (the caller holds the write transaction: all of it or nothing)."""
    rows = conn.execute(
        "SELECT agent, dev, ino, marks FROM agents"
        " WHERE typeof(marks) = 'blob' AND length(marks) > 0 AND length(marks) % 16 = 0"
    ).fetchall()
    conn.executemany(
        _UPSERT_MARKS,
        [(agent, dev, ino, _MARKS_HEADER + bytes(blob)) for agent, dev, ino, blob in rows],
    )
    columns = ", ".join(AGENT_COLUMNS)
    conn.execute(_AGENTS_TABLE.replace("IF NOT EXISTS agents", "agents_7"))
    conn.execute(f"INSERT INTO agents_7 ({columns}) SELECT {columns} FROM agents")  # noqa: S608
    conn.execute("DROP TABLE agents")
    conn.execute("ALTER TABLE agents_7 RENAME TO agents")
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
    _log.info(
        f"state DB schema 8 (a development build's) brought back to {SCHEMA_VERSION},"
        f" the marks of {len(rows)} counts kept beside it"
    )


def _open_db(path: Path) -> sqlite3.Connection:
    """Open and verify ``path``; raises _CorruptDatabase when its content is bad."""
    if not path.exists():
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    conn = _connect(str(path))
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        check = conn.execute("PRAGMA quick_check(1)").fetchone()
        if check is None or check[0] != "ok":
            raise _CorruptDatabase(f"integrity check: {check[0] if check else 'no result'}")
        _create_schema(conn)
    except sqlite3.DatabaseError as exc:
        conn.close()
        if _is_corruption(exc):
            raise _CorruptDatabase(str(exc)) from None
        raise
    except _CorruptDatabase:
        conn.close()
        raise
    except _NewerSchema as exc:
        conn.close()
        raise NewerStateDB(path, exc.version) from None
    return conn


def _probe(path: Path) -> str | None:
    """None when ``path`` opens as a sound DB now, else why not."""
    try:
        _open_db(path).close()
    except _CorruptDatabase as exc:
        return str(exc)
    return None


def _open_checked(path: Path, warnings: list[str]) -> sqlite3.Connection:
    try:
        return _open_db(path)
    except _CorruptDatabase as exc:
        moved = _move_aside(path)
        message = f"state DB {path} was corrupt ({exc}); moved to {moved.name}, rebuilt"
        warnings.append(message)  # said by whoever reads ``warnings`` (see StateStore.open)
    return _open_db(path)


def _checkpoint_truncate(conn: sqlite3.Connection, path: Path) -> None:
    # A reader in another process (the daemon, `memd status`) can pin old WAL
    # frames for a moment: retry until the checkpoint completes.
    for _attempt in range(50):
        busy, _frames, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy == 0:
            return
        time.sleep(0.1)
    raise StateError(
        f"state DB {path}: another process kept the WAL busy; erased rows may stay in it "
        "until the next checkpoint"
    )


def corrupt_copies(path: Path) -> list[Path]:
    """The copies of a DB that was moved aside as corrupt (``<db>.corrupt-<ts>``)."""
    return sorted(
        p
        for p in path.parent.glob(f"{path.name}.corrupt-*")
        if not p.name.endswith(("-wal", "-shm"))
    )


def _remove_db_files(path: Path) -> None:
    for name in (str(path), f"{path}-wal", f"{path}-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _contains(path: Path, needle: bytes) -> bool:
    for name in (str(path), f"{path}-wal"):
        try:
            with open(name, "rb") as handle:
                if needle in handle.read():
                    return True
        except FileNotFoundError:
            continue
    return False


def erase_from_corrupt_copies(path: Path, agent: str) -> tuple[int, int]:
    """Clear ``agent``'s rows from every corrupt copy of the DB at ``path``.

    A copy that still opens is cleaned in place (rows deleted with secure_delete,
    VACUUM, WAL truncated); one that does not, or whose bytes still hold the
    name afterwards, is deleted with its WAL: it was only kept for inspection.
    Returns (copies cleaned, copies deleted).
    """
    cleaned = deleted = 0
    needle = agent.encode("utf-8", "surrogateescape")
    for copy in corrupt_copies(path):
        try:
            conn = _connect(str(copy))
            try:
                tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
                for table in _AGENT_TABLES:
                    if table in tables:
                        conn.execute(f"DELETE FROM {table} WHERE agent = ?", (agent,))  # noqa: S608
                conn.execute("VACUUM")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                conn.close()
            still_there = _contains(copy, needle)
        except (sqlite3.Error, OSError):
            still_there = True
        if still_there:
            _remove_db_files(copy)
            deleted += 1
        else:
            cleaned += 1
    return cleaned, deleted


def _move_aside(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    counter = 0
    while target.exists():
        counter += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}_{counter}")
    path.rename(target)
    # The WAL and shared-memory files belong to the old content: replaying
    # them onto a fresh DB would resurrect the corruption.
    for suffix in ("-wal", "-shm"):
        companion = Path(f"{path}{suffix}")
        try:
            companion.rename(Path(f"{target}{suffix}"))
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                with contextlib.suppress(OSError):
                    companion.unlink()
    return target


def __getattr__(name: str) -> Any:
    if name == "Tombstone":  # re-exported, imported on first use
        from memd.core.erasure import Tombstone

        return Tombstone
    raise AttributeError(name)


__all__ = [
    "LAST_RELOAD_FORMAT",
    "SCHEMA_VERSION",
    "STOPPED_DETAIL",
    "AgentRecord",
    "FileKey",
    "FleetTotals",
    "Heartbeat",
    "LedgerEntry",
    "LedgerMark",
    "ReloadOutcome",
    "SpendingRecord",
    "StateError",
    "StateStore",
    "StatusRow",
    "StatusSort",
    "Tombstone",
    "Trigger",
    "corrupt_copies",
    "erase_from_corrupt_copies",
    "is_memd_daemon",
    "pid_alive",
    "state_db_path",
]
