"""The recall index: SQLite FTS5 over every raw entry of every archive (and the live file).

One DB per workspace in memd's state dir, beside the state DB
(``<digest>.recall.sqlite3``). It is derived data: the archives and MEMORY.md
are the truth, so an index that is missing, corrupt or from an older schema is
rebuilt from them, and :meth:`RecallIndex.sync_agent` repairs whatever a crash
between "archive written" and "archive indexed" left behind.

Tables (schema ``SCHEMA_VERSION``):

* ``agents``: one row per agent with rows: its number, and its own entry and
  token counts (what its searches rank with, see below);
* ``sources``: one row per indexed file (an archive, or ``MEMORY.md``) with
  the identity it had when indexed (dev, ino, size, mtime): a file whose
  identity changed (rewritten by ``forget --match``, replaced) is re-indexed;
* ``entries``: one row per raw entry: source, byte offset and length in that
  file, role, timestamp (as written, and as epoch seconds), and its length in
  tokens as FTS5 counted them. Its id is the agent's number shifted left by
  ``SEQ_BITS``, plus a sequence number: each agent's rows are one range of ids;
* ``entries_fts``: the entry text, FTS5 (porter stemming over unicode61),
  rowid = ``entries.id``.

Every agent's text is in the one FTS5 table (a table per agent makes SQLite's
schema grow with each: 10,000 agents took minutes to index, seconds to open),
but nothing an agent is told depends on another agent's rows: a search reads
only its agent's id range (FTS5 applies the rowid range inside the MATCH), and
ranks with BM25 computed here from that agent's own entry count, average
length and document frequencies, never with FTS5's ``bm25()``, whose
statistics are over the whole table (schema 1 used it: an agent's scores and
order told it which words other agents' memories held).

Erasure (:meth:`RecallIndex.erase_agent`) deletes the rows with
``secure_delete`` on, merges the FTS segments (deleted terms otherwise linger
in old segments), VACUUMs (no free page keeps old bytes) and truncates the WAL.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from memd.agentdir import AgentDir
from memd.archive_crypto import ENCRYPTED_SUFFIX
from memd.core.memfile import parse
from memd.core.recall import (
    MATCH_CLOSE,
    MATCH_OPEN,
    Highlighted,
    IndexedEntry,
    RecallQueryError,
    fts_expression,
    query_terms,
    raw_entries_for_index,
    split_highlight,
)
from memd.errors import MemdError, describe_error
from memd.fsutil import check_private, ensure_private_dir, read_to_end
from memd.workspace import MEMORY_FILE, AgentPaths, resolve_own

# 2: rows numbered per agent, an agents table with each agent's counts, the
# entries' token lengths (1 ranked with FTS5's bm25() over every agent's rows).
SCHEMA_VERSION = 2
BUSY_TIMEOUT_S = 10.0
LIVE_SOURCE = MEMORY_FILE
ARCHIVE_PREFIX = "history_"
ARCHIVE_SUFFIX = ".md"
MAX_LIMIT = 100
# A file larger than this is not indexed (its identity is, so it is not retried
# until it changes): reading and parsing it whole would cost the daemon
# gigabytes (a 200 MB single-line MEMORY.md), and compaction keeps live files
# far smaller than this.
MAX_INDEX_BYTES = 64 << 20

_log = logging.getLogger("memd.recall")
_T = TypeVar("_T")
# O_NONBLOCK: a FIFO an agent put where its MEMORY.md goes would block open()
# for good (a CLI hung, one of the daemon's recall client slots held forever);
# opened without waiting, it is refused by the S_ISREG check in _read_file.
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK

# How FTS5 splits and stems the entries' text (and _Matcher the matched words).
TOKENIZE = "porter unicode61 remove_diacritics 2"

_SCHEMA = (
    "CREATE TABLE recall_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE sources ("
    " id INTEGER PRIMARY KEY, agent TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL,"
    " dev INTEGER NOT NULL, ino INTEGER NOT NULL, size INTEGER NOT NULL,"
    " mtime_ns INTEGER NOT NULL, indexed_at REAL NOT NULL, UNIQUE (agent, name))",
    "CREATE TABLE agents ("
    " id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,"
    " entries INTEGER NOT NULL, tokens INTEGER NOT NULL)",
    "CREATE TABLE entries ("
    " id INTEGER PRIMARY KEY, source_id INTEGER NOT NULL,"
    " offset INTEGER NOT NULL, length INTEGER NOT NULL, role TEXT NOT NULL,"
    " ts TEXT NOT NULL, epoch REAL, words INTEGER NOT NULL)",
    "CREATE INDEX entries_by_source ON entries (source_id)",
    f"CREATE VIRTUAL TABLE entries_fts USING fts5(text, tokenize = '{TOKENIZE}')",
)


class RecallIndexError(MemdError, RuntimeError):
    """The recall index cannot be opened, read or written."""


class RecallSealed(MemdError, LookupError):
    """The agent's archives are encrypted at rest: it has no recall index."""

    exit_code = 3

    def __init__(self, agent: str) -> None:
        super().__init__(
            f"agent {agent!r}: recall is off: its archives are encrypted at rest "
            "([privacy] encrypt_archives) and a search index would keep their text in plain "
            f"on disk; read an archive with `memd archive cat {agent} NAME`"
        )


@dataclass(frozen=True, slots=True)
class RecallHit:
    """One matching raw entry (the JSON schema of ``memd recall --json``)."""

    agent: str
    source: str  # archive file name, or "MEMORY.md" for the live file
    offset: int
    length: int
    role: str
    timestamp: str
    score: float  # BM25 over the agent's own entries, negated: lower is better
    text: str
    matches: tuple[tuple[int, int], ...]  # [start, end) character spans in text

    def as_json(self) -> dict[str, object]:
        return {
            "agent": self.agent,
            "source": self.source,
            "live": self.source == LIVE_SOURCE,
            "offset": self.offset,
            "length": self.length,
            "role": self.role,
            "timestamp": self.timestamp,
            "score": round(self.score, 6),
            "text": self.text,
            "matches": [list(span) for span in self.matches],
        }


@dataclass(slots=True)
class SyncReport:
    indexed: list[str]
    removed: list[str]
    entries: int = 0
    sealed: bool = False  # archives encrypted at rest: no rows kept for the agent

    def describe(self) -> str:
        if self.sealed:
            return "not indexed: archives encrypted at rest (recall is off for this agent)"
        return (
            f"indexed {len(self.indexed)} file(s) ({self.entries} entries), "
            f"dropped {len(self.removed)}"
        )


@dataclass(frozen=True, slots=True)
class _FileIdentity:
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, result: os.stat_result) -> _FileIdentity:
        return cls(result.st_dev, result.st_ino, result.st_size, result.st_mtime_ns)


def recall_db_path(state_dir: Path, workspace: Path) -> Path:
    from memd.state import state_db_path

    state_db = state_db_path(state_dir, workspace)
    return state_db.with_name(state_db.stem + ".recall.sqlite3")


def delete_corrupt_copies(index_path: Path) -> tuple[int, list[str]]:
    """Delete the copies of the index moved aside as corrupt, with their -wal/-shm.

    They hold the full text of every entry they indexed, and are derived data:
    an erasure (``forget``, ``forget --match``) or a prune that left them would
    keep what it deleted.  Returns how many copies went and a note per failure.
    """
    from memd.state import corrupt_copies

    deleted = 0
    notes: list[str] = []
    for copy in corrupt_copies(index_path):
        for name in (str(copy), f"{copy}-wal", f"{copy}-shm"):
            try:
                os.unlink(name)
            except FileNotFoundError:
                continue
            except OSError as exc:
                notes.append(f"corrupt copy {name} of the recall index not deleted: {exc}")
                continue
            if name == str(copy):
                deleted += 1
    return deleted, notes


def is_archive_name(name: str) -> bool:
    # Encrypted archives (.md.enc) are never indexed: see is_sealed().
    return name.startswith(ARCHIVE_PREFIX) and name.endswith(ARCHIVE_SUFFIX)


def is_sealed(paths: AgentPaths, encrypting: bool, folder: AgentDir | None = None) -> bool:
    """Whether the agent gets no recall index: archives encrypted at rest.

    With ``[privacy] encrypt_archives`` on, no agent is indexed, and an agent
    with any ``.md.enc`` archive is not either (encryption turned off later):
    an FTS index keeps its text in plain, live entries included, and those
    entries are the next encrypted archive. Rows the index held are dropped
    and scrubbed (:meth:`RecallIndex.sync_agent`). With ``folder`` (the agent's
    pinned folder) its archive folder is listed through that fd.
    """
    if encrypting:
        return True
    try:
        archive_dir = (
            resolve_own(paths, paths.archive_dir, "archive folder")
            if folder is None
            else _pinned_archive_dir(folder)
        )
        if archive_dir is None:
            return False
        with os.scandir(archive_dir) as listing:
            return any(
                entry.name.startswith(ARCHIVE_PREFIX) and entry.name.endswith(ENCRYPTED_SUFFIX)
                for entry in listing
            )
    except (FileNotFoundError, NotADirectoryError):
        return False


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    # Deleted rows are overwritten with zeros, not merely unlinked (erasure).
    conn.execute("PRAGMA secure_delete = ON")
    return conn


def _schema_version(conn: sqlite3.Connection) -> int | None:
    try:
        row = conn.execute("SELECT value FROM recall_meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError:
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        return None if tables == 0 else 0  # tables but no meta: an unversioned draft
    return int(row[0]) if row is not None else 0


def _drop_everything(conn: sqlite3.Connection) -> None:
    names = conn.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view')"
        " AND name NOT LIKE 'sqlite_%' AND name NOT LIKE 'entries_fts_%'"
    ).fetchall()
    for kind, name in names:
        conn.execute(f'DROP {kind.upper()} IF EXISTS "{name}"')


class RecallIndex:
    """Thread-safe handle on one workspace's recall index (one connection behind a lock)."""

    def __init__(self, conn: sqlite3.Connection, path: Path | None) -> None:
        self._conn = conn
        self._lock = threading.RLock()
        self.path = path
        self.notes: list[str] = []
        # [privacy] encrypt_archives: set by whoever opens the index from a config.
        self.encrypting = False
        self._sealed: set[str] = set()
        self._matcher = _Matcher()

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, state_dir: Path, workspace: Path) -> RecallIndex:
        """Open (creating, migrating or rebuilding) the index for ``workspace``."""
        path = recall_db_path(state_dir, workspace)
        # Every agent's text goes in there: never into a file or folder another
        # uid made or may write (ConfigError, one line).
        try:
            ensure_private_dir(state_dir)
            for name in (str(path), f"{path}-wal", f"{path}-shm"):
                check_private(Path(name), "recall index")
        except OSError as exc:
            # A state dir that is a file, one this uid cannot search...: the
            # OSError went past the daemon's "recall disabled" and ended it.
            raise RecallIndexError(
                f"recall index {path}: {describe_error(exc, with_file=False)}"
            ) from None
        try:
            if not path.exists():
                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
            conn = _connect(str(path))
        except (OSError, sqlite3.Error) as exc:
            raise RecallIndexError(f"recall index {path}: cannot open: {exc}") from None
        index = cls(conn, path)
        try:
            index._prepare()
        except sqlite3.DatabaseError as exc:
            conn.close()
            if isinstance(exc, sqlite3.OperationalError):
                raise RecallIndexError(f"recall index {path}: {exc}") from None
            index = cls._rebuilt_after_corruption(path, exc)
        return index

    @classmethod
    def _rebuilt_after_corruption(cls, path: Path, exc: sqlite3.DatabaseError) -> RecallIndex:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        moved = path.with_name(f"{path.name}.corrupt-{stamp}")
        path.rename(moved)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{path}{suffix}").rename(Path(f"{moved}{suffix}"))
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        index = cls(_connect(str(path)), path)
        index._prepare()
        note = f"recall index {path} was corrupt ({exc}); moved to {moved.name}, rebuilt empty"
        _log.warning(note)
        index.notes.append(note)
        return index

    def _prepare(self) -> None:
        conn = self._conn
        if self.path is not None:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
        version = _schema_version(conn)
        if version == SCHEMA_VERSION:
            return
        if version is not None and version > SCHEMA_VERSION:
            raise RecallIndexError(
                f"recall index {self.path} has schema version {version}, newer than this "
                f"memd understands ({SCHEMA_VERSION}); run the newer memd, or delete the file "
                "and run `memd recall --reindex`"
            )
        conn.execute("BEGIN IMMEDIATE")
        rebuilt = False
        try:
            if _schema_version(conn) != SCHEMA_VERSION:  # another process may have won
                if version is not None:
                    # Older schema: the index is derived data, so rebuild it
                    # (sync_agent re-reads every archive and MEMORY.md).
                    self.notes.append(
                        f"recall index {self.path}: schema version {version} replaced by "
                        f"{SCHEMA_VERSION}; archives are re-indexed"
                    )
                    _drop_everything(conn)
                    rebuilt = True
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO recall_meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if rebuilt:
            # The old rows' pages are free now: give them back (the file is
            # rewritten without them). Best effort: another process reading the
            # file only delays it to the next scrub.
            with contextlib.suppress(sqlite3.OperationalError):
                conn.execute("VACUUM")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            self._matcher.close()

    def __enter__(self) -> RecallIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --------------------------------------------------------------- internals

    def _run(self, operation: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._lock:
            try:
                return operation(self._conn)
            except sqlite3.Error as exc:
                raise RecallIndexError(f"recall index {self.path or ':memory:'}: {exc}") from None

    @contextlib.contextmanager
    def _write(self, conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _sources(self, agent: str) -> dict[str, tuple[int, _FileIdentity]]:
        def operation(conn: sqlite3.Connection) -> dict[str, tuple[int, _FileIdentity]]:
            rows = conn.execute(
                "SELECT name, id, dev, ino, size, mtime_ns FROM sources WHERE agent = ?", (agent,)
            ).fetchall()
            return {row[0]: (row[1], _FileIdentity(*row[2:])) for row in rows}

        return self._run(operation)

    def _replace_source(
        self,
        agent: str,
        name: str,
        kind: str,
        identity: _FileIdentity | None,
        entries: list[IndexedEntry],
        path: Path | None = None,
    ) -> None:
        """Swap the rows of one file in one transaction (``identity`` None: drop them).

        With ``path``, rows read from it are written only if the file is still
        the one that was read: the daemon syncs without the agent's lock, so a
        ``forget --match`` may rewrite the file (and re-index and scrub) between
        its read and this write, and the erased text must not come back; an
        archive changed after that check, before the commit, has its rows taken
        back (:meth:`_take_back_if_gone`).
        """

        def operation(conn: sqlite3.Connection) -> bool:
            with self._write(conn):
                if path is not None and identity is not None and _changed(path, identity):
                    return False  # whoever changed it indexes it (or the next sync does)
                _delete_sources(conn, "agent = ? AND name = ?", (agent, name))
                if identity is None:
                    _forget_if_empty(conn, agent)
                    return False
                source_id = conn.execute(
                    "INSERT INTO sources (agent, name, kind, dev, ino, size, mtime_ns,"
                    " indexed_at) VALUES (?,?,?,?,?,?,?,?)",
                    (
                        agent,
                        name,
                        kind,
                        identity.dev,
                        identity.ino,
                        identity.size,
                        identity.mtime_ns,
                        time.time(),
                    ),
                ).lastrowid
                if entries and source_id is not None:
                    _insert_entries(conn, agent, source_id, entries)
                _forget_if_empty(conn, agent)
                return True

        written = self._run(operation)
        if written and kind == "archive" and path is not None and identity is not None:
            self._take_back_if_gone(agent, name, identity, path)

    def _take_back_if_gone(
        self, agent: str, name: str, identity: _FileIdentity, path: Path
    ) -> None:
        """Rows just written for an archive that is no longer the file read: taken
        back (exactly those: rows a newer read wrote stay), and scrubbed.

        The check inside the write covers a change made before it; this one covers
        a change made after that check but before the commit. A prune in another
        process (``memd prune``, ``compact-now``) deletes the archive, then drops
        rows of archives no longer on disk: its read of the sources does not wait
        for this write (WAL), so it found none of these rows to drop. The live
        file is left alone: appends change it all the time, and nobody drops it.
        """
        if not _changed(path, identity):
            return

        def operation(conn: sqlite3.Connection) -> int:
            with self._write(conn):
                removed = _delete_sources(
                    conn,
                    "agent = ? AND name = ? AND dev = ? AND ino = ? AND size = ? AND mtime_ns = ?",
                    (agent, name, identity.dev, identity.ino, identity.size, identity.mtime_ns),
                )
                _forget_if_empty(conn, agent)
                return removed

        if self._run(operation):
            self.scrub()

    # ----------------------------------------------------------------- writing

    def index_file(self, agent: str, path: Path, *, kind: str = "archive") -> int:
        """(Re-)index one archive or the live file; returns its raw entries indexed."""
        read = _read_file(path)
        name = LIVE_SOURCE if kind == "live" else path.name
        if read is None:
            self._replace_source(agent, name, kind, None, [])
            return 0
        identity, data = read
        entries = raw_entries_for_index(parse(data))
        self._replace_source(agent, name, kind, identity, entries, path)
        return len(entries)

    def sync_agent(
        self,
        paths: AgentPaths,
        *,
        live: bool = True,
        scrub: bool = True,
        folder: AgentDir | None = None,
    ) -> SyncReport:
        """Make the index match the agent's files: new or changed archives in,
        vanished ones out, and (``live``) the current MEMORY.md.

        Everything is read through the agent's folder pinned once
        (:meth:`AgentDir.open_to_read`; ``folder`` when the caller pinned it
        already, as the recall socket does to judge the asker on it): an agent
        that renames its folder away and puts a symlink to another agent's in
        its place meanwhile gets nothing of that agent's indexed as its own.

        This is the repair after a crash between writing an archive and
        indexing it, and what ``--reindex`` runs after dropping the agent.
        Rows of a file found gone (pruned, forgotten, deleted by hand) are
        scrubbed from the index file (:meth:`scrub`) unless ``scrub`` is False:
        the caller then scrubs once, after a pass over many agents.
        """
        if folder is not None:
            return self._sync_pinned(paths, folder, live=live, scrub=scrub)
        try:
            pinned = AgentDir.open_to_read(paths)
        except FileNotFoundError:
            pinned = None  # no folder: nothing on disk (its rows go)
        try:
            return self._sync_pinned(paths, pinned, live=live, scrub=scrub)
        finally:
            if pinned is not None:
                pinned.close()

    def _sync_pinned(
        self, paths: AgentPaths, folder: AgentDir | None, *, live: bool, scrub: bool
    ) -> SyncReport:
        agent = paths.agent
        report = SyncReport(indexed=[], removed=[])
        if self.encrypting or (folder is not None and is_sealed(paths, False, folder)):
            return self._seal(agent, report)
        self._sealed.discard(agent)
        known = self._sources(agent)
        archive_dir = None if folder is None else _pinned_archive_dir(folder)
        on_disk = {} if archive_dir is None else _archives_on_disk(archive_dir)
        for name, identity in sorted(on_disk.items()):
            indexed = known.get(name)
            if archive_dir is None or (indexed is not None and indexed[1] == identity):
                continue
            report.entries += self.index_file(agent, archive_dir / name)
            report.indexed.append(name)
        for name in sorted(set(known) - set(on_disk) - {LIVE_SOURCE}):
            self._replace_source(agent, name, "archive", None, [])
            report.removed.append(name)
        live_path = None if folder is None or not live else _pinned_live_path(folder)
        if live and self._live_changed(live_path, known.get(LIVE_SOURCE)):
            live_entries = 0
            if live_path is not None:
                live_entries = self.index_file(agent, live_path, kind="live")
            else:
                self._replace_source(agent, LIVE_SOURCE, "live", None, [])
            if live_entries == 0 and LIVE_SOURCE in known and not _exists(live_path):
                report.removed.append(LIVE_SOURCE)
            else:
                report.entries += live_entries
                report.indexed.append(LIVE_SOURCE)
        if scrub and report.removed:
            self.scrub()
        return report

    def _seal(self, agent: str, report: SyncReport) -> SyncReport:
        """Drop (and scrub) every row of an agent whose archives are encrypted."""
        with self._lock:
            self._sealed.add(agent)
        report.sealed = True
        known = self._sources(agent)
        if known:
            self._drop_agent_rows(agent)
            self.scrub()
            report.removed = sorted(known)
        return report

    def _live_changed(self, live: Path | None, known: tuple[int, _FileIdentity] | None) -> bool:
        current: _FileIdentity | None = None
        if live is not None:
            with contextlib.suppress(FileNotFoundError):
                current = _FileIdentity.of(os.stat(live))
        return (known[1] if known else None) != current

    def reindex_agent(self, paths: AgentPaths) -> SyncReport:
        """Drop the agent's rows and index its archives and MEMORY.md afresh."""
        self._drop_agent_rows(paths.agent)
        return self.sync_agent(paths)

    def roles_if_absent(self, agent: str, role: str) -> list[str] | None:
        """None when ``agent`` has an entry of ``role`` (case-insensitive, as the
        search's filter); else the roles its entries have (a role filter that can
        match nothing is then said with them: roles are free text, the agent's
        name for its own turns in Swarms, so they cannot be a fixed choice)."""

        def operation(conn: sqlite3.Connection) -> list[str] | None:
            found = conn.execute(
                "SELECT 1 FROM sources s JOIN entries e ON e.source_id = s.id"
                " WHERE s.agent = ? AND e.role = ? COLLATE NOCASE LIMIT 1",
                (agent, role),
            ).fetchone()
            if found is not None:
                return None
            rows = conn.execute(
                "SELECT DISTINCT e.role FROM sources s JOIN entries e ON e.source_id = s.id"
                " WHERE s.agent = ? ORDER BY 1",
                (agent,),
            ).fetchall()
            return [row[0] for row in rows]

        return self._run(operation)

    def agents(self) -> list[str]:
        """Every agent the index holds anything of: rows, or only a name (an
        index written before empty agents lost their row in ``agents``)."""

        def operation(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT agent FROM sources UNION SELECT name FROM agents ORDER BY 1"
            ).fetchall()
            return [row[0] for row in rows]

        return self._run(operation)

    # ----------------------------------------------------------------- erasing

    def _drop_agent_rows(self, agent: str) -> int:
        def operation(conn: sqlite3.Connection) -> int:
            with self._write(conn):
                removed = _delete_sources(conn, "agent = ?", (agent,))
                # Its name and counts go too (a new agent of that name starts afresh).
                conn.execute("DELETE FROM agents WHERE name = ?", (agent,))
                return removed

        return self._run(operation)

    def erase_agent(self, agent: str) -> int:
        """Erase every row of ``agent`` so no trace of its text stays on disk.

        Returns the entries removed. Besides deleting (with secure_delete on),
        this merges the FTS5 segments (a deleted term stays in older segments
        until they merge), VACUUMs (rewrites the file without free pages) and
        truncates the WAL. Extension point for retention and erase-by-pattern.
        """
        removed = self._drop_agent_rows(agent)
        self.scrub()
        return removed

    def erase_agents(self, agents: Iterable[str]) -> int:
        """:meth:`erase_agent` for each of ``agents`` (removed from the workspace),
        with one scrub for all of them; returns the entries removed."""
        removed = sum(self._drop_agent_rows(agent) for agent in agents)
        self.scrub()
        return removed

    def scrub(self) -> None:
        """Make rows deleted so far unrecoverable from the file, its WAL and free pages.

        Run after any erasure (``erase_agent``; erase-by-pattern re-indexes the
        rewritten archives with ``sync_agent`` and then calls this).
        """

        def operation(conn: sqlite3.Connection) -> None:
            # A deleted term stays in older FTS5 segments until they merge.
            conn.execute("INSERT INTO entries_fts (entries_fts) VALUES ('optimize')")
            self._checkpoint_truncate(conn)
            conn.execute("VACUUM")
            self._checkpoint_truncate(conn)

        self._run(operation)

    def _checkpoint_truncate(self, conn: sqlite3.Connection) -> None:
        if self.path is None:
            return
        # A reader in another process can pin old WAL frames for a moment;
        # retry until the checkpoint completes, then say so if it never did.
        for _attempt in range(50):
            busy, _log_frames, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy == 0:
                return
            time.sleep(0.1)
        raise RecallIndexError(
            f"recall index {self.path}: another process kept the WAL busy; "
            "its erased pages may remain until the next checkpoint"
        )

    # ---------------------------------------------------------------- querying

    def search(
        self,
        agent: str,
        question: str,
        *,
        limit: int = 5,
        since_epoch: float | None = None,
        role: str | None = None,
    ) -> list[RecallHit]:
        """The agent's raw entries best matching ``question`` (plain text), best first.

        Ranked by BM25 over the OR of the question's words (so rare shared
        words weigh most), then the newest first among equal scores. Every
        figure the ranking uses is the agent's own (its entry count, average
        entry length, how many of its entries hold each word): other agents'
        rows change nothing in its scores, order or results. Entries sharing
        the question's rare words come first: when some of its words are
        common (in more than ``COMMON_TERM_SHARE`` of the agent's entries and
        more than ``COMMON_TERM_FLOOR``) and the others match, only the
        entries matching the others are returned (fewer than ``limit`` if that
        is all there is); the common words count only when nothing else
        matches, and then only among the newest ``COMMON_CANDIDATES`` entries
        holding them. Scoring every entry holding a common word is what makes
        a query slow on a large index (seconds at 1 GB), and such words barely
        move BM25 anyway.
        """
        if agent in self._sealed:
            raise RecallSealed(agent)
        if not 1 <= limit <= MAX_LIMIT:
            raise RecallQueryError(f"limit {limit} is out of range (1..{MAX_LIMIT})")
        terms = query_terms(question)
        filters = _Filters(since_epoch, role)

        def operation(conn: sqlite3.Connection) -> list[RecallHit]:
            # One read transaction: the counts, candidates and texts are one snapshot.
            conn.execute("BEGIN")
            try:
                ranker = _Ranker.of(conn, agent, filters, self._matcher)
                ranked = ranker.ranked(terms, limit) if ranker is not None else []
                return _hits(conn, self._matcher, agent, fts_expression(terms), ranked)
            finally:
                conn.execute("COMMIT")

        return self._run(operation)

    def stats(self) -> dict[str, int]:
        def operation(conn: sqlite3.Connection) -> dict[str, int]:
            sources = conn.execute("SELECT count(*) FROM sources").fetchone()[0]
            entries = conn.execute("SELECT count(*) FROM entries").fetchone()[0]
            return {"sources": int(sources), "entries": int(entries)}

        return self._run(operation)


@dataclass(frozen=True, slots=True)
class _Filters:
    since_epoch: float | None
    role: str | None


# A word in more than this share of the agent's entries is "common" (see search()).
COMMON_TERM_SHARE = 0.005
# ... but never below this many entries: on a small index every word is rare.
COMMON_TERM_FLOOR = 1000
# A question of common words only is ranked among the newest this many entries
# holding them (and passing the filters), not all of them (100,000s at 1 GB).
# Newest by id, the order they were indexed in: archives oldest first, then
# MEMORY.md (an archive rewritten by ``forget --match`` counts as new).
COMMON_CANDIDATES = 1000
# BM25's parameters, FTS5's own.
BM25_K1 = 1.2
BM25_B = 0.75
# A word held by at most this many of the agent's entries in the candidates'
# range has its counts read with highlight() (which reads those entries' text);
# above, they are worked out from FTS5's bm25() (which reads only the index).
HIGHLIGHT_TF_MAX = 64
# Those words are counted in one highlight() of each entry holding any of them
# (their matched words sorted out by _Matcher, about 40 µs a question), or with
# one highlight() per word when that re-reads at most this many tokens (about
# 40 ns each): no more than the matcher costs.
ONE_PASS_TOKENS = 1000
# Each agent's entry ids: (agent number << SEQ_BITS) | sequence number.
SEQ_BITS = 40
_SEQ_MASK = (1 << SEQ_BITS) - 1
MAX_AGENT_NUMBER = (1 << (63 - SEQ_BITS)) - 1
# FTS5's record of the table's row and token totals (its "averages" row).
_FTS_AVERAGES_ID = 1


def _varint(data: bytes, offset: int = 0) -> tuple[int, int]:
    """SQLite's (and FTS5's) varint at ``offset``: (value, offset after it)."""
    value = 0
    for index in range(offset, min(offset + 8, len(data))):
        byte = data[index]
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, index + 1
    if offset + 8 >= len(data):
        raise ValueError("truncated varint")
    return (value << 8) | data[offset + 8], offset + 9


def _agent_range(number: int) -> tuple[int, int]:
    low = number << SEQ_BITS
    return low, low | _SEQ_MASK


def _agent_number(conn: sqlite3.Connection, agent: str) -> int:
    """The agent's number, a new one (its row made) if it has none."""
    row = conn.execute("SELECT id FROM agents WHERE name = ?", (agent,)).fetchone()
    if row is not None:
        return int(row[0])
    number = int(conn.execute("SELECT coalesce(max(id), 0) + 1 FROM agents").fetchone()[0])
    if number > MAX_AGENT_NUMBER:  # the highest was taken: the lowest free one
        if conn.execute("SELECT 1 FROM agents WHERE id = 1").fetchone() is None:
            number = 1
        else:
            number = int(
                conn.execute(
                    "SELECT min(a.id) + 1 FROM agents a"
                    " WHERE NOT EXISTS (SELECT 1 FROM agents b WHERE b.id = a.id + 1)"
                ).fetchone()[0]
            )
        if number > MAX_AGENT_NUMBER:
            raise RecallIndexError(f"recall index: no agent number left for {agent!r}")
    conn.execute("INSERT INTO agents VALUES (?, ?, 0, 0)", (number, agent))
    return number


def _insert_entries(
    conn: sqlite3.Connection, agent: str, source_id: int, entries: list[IndexedEntry]
) -> None:
    """Write one file's entries in the agent's id range and count them in its totals."""
    number = _agent_number(conn, agent)
    low, high = _agent_range(number)
    newest = conn.execute(
        "SELECT max(id) FROM entries WHERE id BETWEEN ? AND ?", (low, high)
    ).fetchone()[0]
    first = low if newest is None else newest + 1
    last = first + len(entries) - 1
    if last > high:
        raise RecallIndexError(
            f"recall index: agent {agent!r} used up its entry numbers; "
            f"run `memd recall --reindex {agent}`"
        )
    conn.executemany(
        "INSERT INTO entries_fts (rowid, text) VALUES (?, ?)",
        ((first + index, entry.text) for index, entry in enumerate(entries)),
    )
    # The entries' lengths in tokens, as FTS5 counted them (its docsize rows).
    sizes = dict(
        conn.execute(
            "SELECT id, sz FROM entries_fts_docsize WHERE id BETWEEN ? AND ?", (first, last)
        ).fetchall()
    )
    words = [_varint(sizes[first + index])[0] for index in range(len(entries))]
    conn.executemany(
        "INSERT INTO entries (id, source_id, offset, length, role, ts, epoch, words)"
        " VALUES (?,?,?,?,?,?,?,?)",
        (
            (
                first + index,
                source_id,
                entry.offset,
                entry.length,
                entry.role,
                entry.timestamp,
                entry.epoch,
                words[index],
            )
            for index, entry in enumerate(entries)
        ),
    )
    conn.execute(
        "UPDATE agents SET entries = entries + ?, tokens = tokens + ? WHERE id = ?",
        (len(entries), sum(words), number),
    )


@dataclass(slots=True)
class _Candidate:
    epoch: float | None
    words: int
    counts: list[int]  # occurrences of each ranked term


class _Ranker:
    """BM25 over one agent's entries, from that agent's own figures only."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        number: int,
        entries: int,
        tokens: int,
        filters: _Filters,
        matcher: _Matcher,
    ) -> None:
        self.conn = conn
        self.matcher = matcher
        self.low, self.high = _agent_range(number)
        self.entries = entries
        self.average = tokens / entries if tokens > 0 else 1.0
        self.filters = filters
        self.cap = max(COMMON_TERM_FLOOR, int(entries * COMMON_TERM_SHARE))
        self._table_average: float | None = None

    @classmethod
    def of(
        cls, conn: sqlite3.Connection, agent: str, filters: _Filters, matcher: _Matcher
    ) -> _Ranker | None:
        row = conn.execute(
            "SELECT id, entries, tokens FROM agents WHERE name = ?", (agent,)
        ).fetchone()
        if row is None or row[1] <= 0:
            return None
        return cls(conn, int(row[0]), int(row[1]), int(row[2]), filters, matcher)

    def ranked(self, terms: list[str], limit: int) -> list[tuple[int, float]]:
        """(entry id, score) of the best ``limit`` entries, best first."""
        found = {term: self._count(term, self.cap + 1) for term in terms}
        rare = [term for term in terms if 0 < found[term] <= self.cap]
        ranked = self._rank(rare, found, limit, capped=False) if rare else []
        present = [term for term in terms if found[term] > 0]
        if not ranked and len(present) > len(rare):
            ranked = self._rank(present, found, limit, capped=True)
        return ranked

    def _count(self, term: str, at_most: int | None) -> int:
        """How many of the agent's entries hold ``term`` (counted up to ``at_most``)."""
        sql = "SELECT 1 FROM entries_fts WHERE entries_fts MATCH ? AND rowid BETWEEN ? AND ?"
        params: list[object] = [fts_expression([term]), self.low, self.high]
        if at_most is not None:
            sql += " LIMIT ?"
            params.append(at_most)
        return int(self.conn.execute(f"SELECT count(*) FROM ({sql})", params).fetchone()[0])  # noqa: S608

    def _rank(
        self, terms: list[str], found: dict[str, int], limit: int, *, capped: bool
    ) -> list[tuple[int, float]]:
        candidates = self._candidates(terms, capped=capped)
        if not candidates:
            return []
        first, last = min(candidates), max(candidates)
        # A term held by few of the agent's entries: counted in their text, all
        # such terms in one pass over each entry; by many: from FTS5's bm25().
        few = [position for position, term in enumerate(terms) if found[term] <= HIGHLIGHT_TF_MAX]
        # Small entries, no filter (the candidates are then every entry in the
        # range holding the terms): a pass per term re-reads fewer tokens than
        # asking the matcher costs. Otherwise one pass for all of them.
        rereads = (len(few) - 1) * sum(candidate.words for candidate in candidates.values())
        unfiltered = self.filters.since_epoch is None and not self.filters.role
        groups = [[p] for p in few] if unfiltered and rereads <= ONE_PASS_TOKENS else [few]
        for group in groups:
            if not group:
                continue
            highlighted = self._highlighted_counts([terms[p] for p in group], first, last)
            for entry_id, counts in highlighted:
                candidate = candidates.get(entry_id)
                if candidate is not None:
                    for position, count in zip(group, counts, strict=True):
                        candidate.counts[position] = count
        for position, term in enumerate(terms):
            if found[term] <= HIGHLIGHT_TF_MAX:
                continue
            for entry_id, count in self._bm25_counts(term, first, last):
                candidate = candidates.get(entry_id)
                if candidate is not None:
                    candidate.counts[position] = count
        weights = []
        for term in terms:
            held = found[term] if found[term] <= self.cap else self._count(term, None)
            weights.append(math.log(1 + (self.entries - held + 0.5) / (held + 0.5)))
        scored = []
        for entry_id, candidate in candidates.items():
            norm = BM25_K1 * (1 - BM25_B + BM25_B * candidate.words / self.average)
            score = 0.0
            for weight, count in zip(weights, candidate.counts, strict=True):
                if count:
                    score += weight * count * (BM25_K1 + 1) / (count + norm)
            epoch = candidate.epoch
            # Best score first, then the newest (a missing timestamp last), then
            # the later entry. Equal matches have bit-equal scores: one formula,
            # one order of terms.
            key = (-score, epoch is None, -(epoch or 0.0), -entry_id)
            scored.append((key, entry_id, -score))
        scored.sort()
        return [(entry_id, score) for _key, entry_id, score in scored[:limit]]

    def _candidates(self, terms: list[str], *, capped: bool) -> dict[int, _Candidate]:
        """The agent's entries holding any of ``terms`` and passing the filters
        (``capped``: the newest ``COMMON_CANDIDATES`` of them)."""
        clauses = ["entries_fts MATCH ?", "entries_fts.rowid BETWEEN ? AND ?"]
        params: list[object] = [fts_expression(terms), self.low, self.high]
        if self.filters.since_epoch is not None:
            clauses.append("e.epoch >= ?")
            params.append(self.filters.since_epoch)
        if self.filters.role:
            clauses.append("e.role = ? COLLATE NOCASE")
            params.append(self.filters.role)
        sql = (
            "SELECT e.id, e.epoch, e.words"  # noqa: S608  # values are bound
            # CROSS JOIN: FTS5 drives (the MATCH within the agent's range).
            " FROM entries_fts CROSS JOIN entries e ON e.id = entries_fts.rowid"
            f" WHERE {' AND '.join(clauses)}"
        )
        if capped:
            sql += " ORDER BY entries_fts.rowid DESC LIMIT ?"
            params.append(COMMON_CANDIDATES)
        width = len(terms)
        return {
            int(entry_id): _Candidate(epoch, int(words), [0] * width)
            for entry_id, epoch, words in self.conn.execute(sql, params)
        }

    def _highlighted_counts(
        self, terms: list[str], first: int, last: int
    ) -> list[tuple[int, list[int]]]:
        """(entry id, occurrences of each of ``terms``) for the entries in
        [first, last] holding any of them: one highlight() of each entry, however
        many terms (each entry's text is read once, not once per term).

        Each occurrence is one marked word in highlight()'s output (the stored
        text holds no mark: index_text); which terms a marked word is, the
        matcher says (FTS5 stems "filing" and "filed" alike). Only the marks
        and marked words are read: highlight() prints the text between two
        matches only up to a NUL byte, never a mark or a matched word."""
        rows = self.conn.execute(
            "SELECT rowid, highlight(entries_fts, 0, ?, ?)"
            " FROM entries_fts WHERE entries_fts MATCH ? AND rowid BETWEEN ? AND ?",
            (MATCH_OPEN, MATCH_CLOSE, fts_expression(terms), first, last),
        )
        marked = [(int(entry_id), _MARKED_WORD.findall(text or "")) for entry_id, text in rows]
        if len(terms) == 1:
            return [(entry_id, [len(words)]) for entry_id, words in marked]
        which = self.matcher.terms_of({word for _, words in marked for word in words}, terms)
        counted = []
        for entry_id, words in marked:
            counts = [0] * len(terms)
            for word in words:
                for position in which[word]:
                    counts[position] += 1
            counted.append((entry_id, counts))
        return counted

    def _bm25_counts(self, term: str, first: int, last: int) -> list[tuple[int, int]]:
        """Occurrences worked out from FTS5's bm25() of the one-word query, at two
        weights: bm25 = -idf·f·w·(k1+1) / (f·w + K) for f occurrences, weight w,
        K = k1·(1-b+b·D/avgdl) over the whole table; 1/bm25 is linear in 1/w, so
        two weights give idf and K/f, and the table's own totals give K. Only
        the index is read. A count that does not come out a whole number (an
        FTS5 whose bm25 differs) is read with highlight() instead."""
        average = self._whole_table_average()
        expression = fts_expression([term])
        rows = self.conn.execute(
            "SELECT entries_fts.rowid, bm25(entries_fts, 1.0), bm25(entries_fts, 2.0), e.words"
            " FROM entries_fts CROSS JOIN entries e ON e.id = entries_fts.rowid"
            " WHERE entries_fts MATCH ? AND entries_fts.rowid BETWEEN ? AND ?",
            (expression, first, last),
        ).fetchall()
        counts = []
        for entry_id, once, twice, words in rows:
            count = None
            if average is not None and once < 0 and twice < 0:
                inverse_once, inverse_twice = -1.0 / once, -1.0 / twice
                constant = inverse_once - inverse_twice  # K / (2.2·idf·f) / 2
                level = 2 * inverse_twice - inverse_once  # 1 / (2.2·idf)
                if constant > 0 and level > 0:
                    k = BM25_K1 * (1 - BM25_B + BM25_B * words / average)
                    solved = k * level / (2 * constant)
                    whole = round(solved)
                    if whole >= 1 and abs(solved - whole) <= 1e-6 * solved:
                        count = whole
            if count is None:
                count = self._highlighted_count(term, int(entry_id))
            counts.append((int(entry_id), count))
        return counts

    def _highlighted_count(self, term: str, entry_id: int) -> int:
        found = self._highlighted_counts([term], entry_id, entry_id)
        return found[0][1][0] if found else 0

    def _whole_table_average(self) -> float | None:
        """FTS5's average entry length over the whole table (its "averages" row),
        which its bm25() uses; None when it cannot be read."""
        if self._table_average is None:
            row = self.conn.execute(
                "SELECT block FROM entries_fts_data WHERE id = ?", (_FTS_AVERAGES_ID,)
            ).fetchone()
            try:
                rows, offset = _varint(bytes(row[0]))
                tokens, _ = _varint(bytes(row[0]), offset)
            except (TypeError, ValueError, IndexError):
                return None
            if rows <= 0:
                return None
            self._table_average = tokens / rows
        return self._table_average


# A word highlight() marked (index_text keeps the marks out of the stored text).
_MARKED_WORD = re.compile(f"{MATCH_OPEN}([^{MATCH_CLOSE}]*){MATCH_CLOSE}")


class _Matcher:
    """FTS5's tokenizer (TOKENIZE) on a private in-memory table: which of a
    question's terms a word matches, and the highlight of a text holding a NUL
    byte. What a search puts in it is never committed (rolled back when read),
    so it is empty between searches; its callers hold the index's lock."""

    def __init__(self) -> None:
        self._conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self._conn.execute(f"CREATE VIRTUAL TABLE words USING fts5(text, tokenize = '{TOKENIZE}')")

    def close(self) -> None:
        self._conn.close()

    @contextlib.contextmanager
    def _holding(self, texts: list[str]) -> Iterator[sqlite3.Connection]:
        # One transaction, rolled back: no segment is written (a commit per
        # search cost three times as much), and nothing stays.
        self._conn.execute("BEGIN")
        try:
            self._conn.executemany(
                "INSERT INTO words (rowid, text) VALUES (?, ?)", enumerate(texts)
            )
            yield self._conn
        finally:
            self._conn.execute("ROLLBACK")

    def terms_of(self, words: Iterable[str], terms: list[str]) -> dict[str, list[int]]:
        """For each of ``words``, the positions in ``terms`` of the terms it matches."""
        listed = sorted(words)
        which: dict[str, list[int]] = {word: [] for word in listed}
        with self._holding(listed) as conn:
            for position, term in enumerate(terms):
                for (row,) in conn.execute(
                    "SELECT rowid FROM words WHERE words MATCH ?", (fts_expression([term]),)
                ):
                    which[listed[row]].append(position)
        return which

    def highlight(self, text: str, expression: str) -> Highlighted:
        """``text`` with the matches of ``expression`` marked, as FTS5 marks the
        stored entry; a NUL byte (which FTS5 reads as a separator but cannot
        print) is read as the separator it is, and kept in the text."""
        with self._holding([text.replace("\x00", " ")]) as conn:
            row = conn.execute(
                "SELECT highlight(words, 0, ?, ?) FROM words WHERE words MATCH ?",
                (MATCH_OPEN, MATCH_CLOSE, expression),
            ).fetchone()
        spans = split_highlight(row[0]).spans if row is not None else ()
        return Highlighted(text, spans)


def _hits(
    conn: sqlite3.Connection,
    matcher: _Matcher,
    agent: str,
    expression: str,
    ranked: list[tuple[int, float]],
) -> list[RecallHit]:
    """The ranked entries with their whole text, the question's words highlighted."""
    hits = []
    for entry_id, score in ranked:
        row = conn.execute(
            "SELECT s.name, e.offset, e.length, e.role, e.ts, entries_fts.text,"
            " highlight(entries_fts, 0, ?, ?)"
            " FROM entries_fts JOIN entries e ON e.id = entries_fts.rowid"
            " JOIN sources s ON s.id = e.source_id"
            " WHERE entries_fts MATCH ? AND entries_fts.rowid = ?",
            (MATCH_OPEN, MATCH_CLOSE, expression, entry_id),
        ).fetchone()
        if row is None:
            continue
        name, offset, length, role, ts, text, marked = row
        # highlight() leaves out the text from a NUL byte to the next match.
        highlighted = (
            matcher.highlight(text, expression) if "\x00" in text else split_highlight(marked)
        )
        hits.append(
            RecallHit(
                agent=agent,
                source=name,
                offset=offset,
                length=length,
                role=role,
                timestamp=ts,
                score=score,
                text=highlighted.text,
                matches=highlighted.spans,
            )
        )
    return hits


def _delete_sources(conn: sqlite3.Connection, where: str, params: tuple[object, ...]) -> int:
    ids = [row[0] for row in conn.execute(f"SELECT id FROM sources WHERE {where}", params)]  # noqa: S608
    removed = 0
    for source_id in ids:
        entries, words = conn.execute(
            "SELECT count(*), coalesce(sum(words), 0) FROM entries WHERE source_id = ?",
            (source_id,),
        ).fetchone()
        conn.execute(
            "DELETE FROM entries_fts WHERE rowid IN (SELECT id FROM entries WHERE source_id = ?)",
            (source_id,),
        )
        removed += conn.execute("DELETE FROM entries WHERE source_id = ?", (source_id,)).rowcount
        conn.execute(
            "UPDATE agents SET entries = entries - ?, tokens = tokens - ?"
            " WHERE name = (SELECT agent FROM sources WHERE id = ?)",
            (entries, words, source_id),
        )
        conn.execute("DELETE FROM sources WHERE id = ?", (source_id,))
    return removed


def _forget_if_empty(conn: sqlite3.Connection, agent: str) -> None:
    """An agent left with no entry loses its row in ``agents`` (its name and
    counts): a removed agent leaves no name behind. Called once its rows are
    written, so re-indexing a file keeps the agent's number."""
    conn.execute("DELETE FROM agents WHERE name = ? AND entries <= 0", (agent,))


def _exists(path: Path | None) -> bool:
    if path is None:
        return False
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _pinned_live_path(folder: AgentDir) -> Path | None:
    """MEMORY.md as a path through the pinned folder's fd (``/proc/self/fd/N/NAME``:
    the kernel looks the name up in that very folder, wherever it is now).
    A MEMORY.md symlinked out of the agent's own folder is refused
    (WorkspaceError), as :func:`memd.workspace.agent_paths` refuses it."""
    try:
        folder.pin_memory()
    except FileNotFoundError:
        return None
    return Path(f"/proc/self/fd/{folder.memory_dir_fd}/{folder.memory_name}")


def _pinned_archive_dir(folder: AgentDir) -> Path | None:
    """The archive folder as a path through its pinned fd; None when there is none."""
    try:
        fd, _created = folder.archive_fd(create=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return None if fd < 0 else Path(f"/proc/self/fd/{fd}")


def _archives_on_disk(archive_dir: Path) -> dict[str, _FileIdentity]:
    try:
        entries = list(os.scandir(archive_dir))
    except FileNotFoundError:
        return {}
    found: dict[str, _FileIdentity] = {}
    for entry in entries:
        if not is_archive_name(entry.name):
            continue
        with contextlib.suppress(FileNotFoundError):
            result = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(result.st_mode):
                found[entry.name] = _FileIdentity.of(result)
    return found


def _changed(path: Path, read: _FileIdentity) -> bool:
    """True when ``path`` is no longer the file (or the content) that was read."""
    try:
        return _FileIdentity.of(os.stat(path)) != read
    except OSError:
        return True


def _read_file(path: Path) -> tuple[_FileIdentity, bytes] | None:
    """The file's identity and bytes, or None when it is gone or not a regular file."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink planted where memd wrote a file
            return None
        raise
    try:
        result = os.fstat(fd)
        if not stat.S_ISREG(result.st_mode):
            return None
        if result.st_size > MAX_INDEX_BYTES:
            _log.warning("%s is over %d MiB: not indexed for recall", path, MAX_INDEX_BYTES >> 20)
            return _FileIdentity.of(result), b""
        data = read_to_end(fd)
    finally:
        os.close(fd)
    return _FileIdentity.of(result), data


__all__ = [
    "LIVE_SOURCE",
    "MAX_LIMIT",
    "SCHEMA_VERSION",
    "SEQ_BITS",
    "RecallHit",
    "RecallIndex",
    "RecallIndexError",
    "RecallSealed",
    "SyncReport",
    "delete_corrupt_copies",
    "is_archive_name",
    "is_sealed",
    "recall_db_path",
]
