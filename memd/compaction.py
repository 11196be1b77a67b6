"""The compaction transaction (DESIGN.md §2): archive, summarize, re-seed, drain.

Shape (logrotate ``create`` mode, not ``copytruncate``):

1. take the agent's lock (held for the whole job; it serializes compactors,
   never writers) and finish or roll back any crashed job from its journal;
2. snapshot MEMORY.md: (dev, ino), a size N at an entry boundary, sha256 of
   bytes 0..N;
3. summarize 0..N (the slow part; writers keep appending meanwhile);
4. re-check that 0..N is unchanged (else start over, a bounded number of times);
5. write the archive: temp in ``.memd/`` + fsync, journal, ``link()`` to a name
   that does not exist yet, fsync the archive dir;
6. hard-link the old inode as ``.memd/drain.md``; pick M ≥ N at an entry
   boundary; write header + summary block + bytes N..M to a temp, give it the
   old file's mode and owner, fsync, journal (old and new inode numbers),
   ``os.replace`` over MEMORY.md, fsync the dir: this is the commit point;
7. drain: bytes a late writer appended to the old inode past M are appended to
   the new file (journaled by offset, idempotent) until the old inode has been
   quiet for ``drain_quiet_s`` (bounded by ``drain_max_s``); drop the link.

Recovery reads the journal and decides by inode numbers, never by guessing:
before the replace it rolls back (removes the archive it had linked, by
inode), after it rolls forward (finishes the drain).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from memd.core.config import AgentPolicy, MemdConfig
from memd.core.memfile import (
    HeaderSegment,
    MemoryDocument,
    parse,
    render_header,
    render_summary_block,
)
from memd.core.ownership import archive_access
from memd.core.plan import (
    CORRUPT_PHASE,
    IDLE_PHASE,
    RecoveryAction,
    has_compactable,
    landed_prefix,
    recovery_action,
    summary_does_not_shrink,
    summary_over_cap,
)
from memd.core.summary import Summarizer, SummaryRequest, SummaryResult
from memd.core.summary_block import (
    ComposedSummary,
    compose_summary,
    material_of,
    version_line,
)
from memd.core.summary_plan import BudgetError, is_degenerate, summary_budgets
from memd.counting import TrackedCount, count_file
from memd.errors import (
    CompactionAborted,
    ConfigError,
    MemdError,
    NothingToCompact,
    SummarizerError,
    UnderThreshold,
    WorkspaceError,
    describe_error,
)
from memd.fsutil import (
    AgentLock,
    ShortWrite,
    SlotJournal,
    ensure_dir_created,
    ensure_private_dir,
    fsync_dir,
    link_unique,
    read_range,
    read_to_end,
    sha256_prefix,
    share_with_group,
    unlink_quiet,
    write_all,
    write_new_file,
)
from memd.summarizers import BUILTIN_MODEL
from memd.workspace import AgentPaths, contained_path

# 2: the archive may hold only bytes 0..kept_from (K ≤ N) of the snapshot;
# recovery reads both versions alike (it works from inodes and drain offsets).
JOURNAL_VERSION = 2
# Without an agent policy (tests, tools): the pinned section's budget.
DEFAULT_PINNED_TOKENS = 1000

# Named points between durable steps; tests crash the process at each one.
CHECKPOINTS = (
    "locked",
    "summarized",
    "archive-written",
    "journal-archiving",
    "archive-linked",
    "drain-linked",
    "new-written",
    "journal-swapping",
    "replaced",
    "journal-draining",
    "drained",
    "cleaned",
)

# Raising at one of these rolls the job back; from "replaced" on it is committed.
PRE_COMMIT_CHECKPOINTS = frozenset(CHECKPOINTS[: CHECKPOINTS.index("replaced")])

Checkpoint = Callable[[str], None]
# The drain link is a hard link memd made; a symlink there was planted.
_READ_PRIVATE = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
ByteCounter = Callable[[bytes], int]
# Called with the committed archive, still under the agent's lock (the recall
# index). It reports its own failures: a crash or error here only leaves the
# archive unindexed until the next start re-syncs it.
ArchiveHook = Callable[[AgentPaths, Path], None]


def _no_checkpoint(_name: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class CompactionOptions:
    lock_wait_s: float = 300.0
    drain_quiet_s: float = 1.0
    drain_max_s: float = 10.0
    drain_poll_s: float = 0.05
    max_restarts: int = 3
    summary_max_tokens: int = 4000
    pinned_tokens: int = DEFAULT_PINNED_TOKENS
    instructions: str = ""
    # The daemon needs a compaction to shrink the file (else it would loop);
    # an operator's explicit compact-now may re-seed even a small file.
    require_shrink: bool = True
    on_archived: ArchiveHook | None = None

    @classmethod
    def from_config(
        cls, config: MemdConfig, policy: AgentPolicy | None = None
    ) -> CompactionOptions:
        summarizer = config.summarizer
        summary_cap = summarizer.summary_tokens or summarizer.max_tokens
        pinned = summarizer.pinned_tokens or DEFAULT_PINNED_TOKENS
        if policy is not None:
            # Budgets scale with the agent's threshold and leave room under
            # the low-water mark, or a compaction could never end below it.
            try:
                budgets = summary_budgets(
                    policy.threshold_tokens,
                    policy.low_water_tokens,
                    summary_tokens=summarizer.summary_tokens,
                    pinned_tokens=summarizer.pinned_tokens,
                )
            except BudgetError as exc:
                raise ConfigError(f"agent {policy.agent!r}: {exc}") from None
            summary_cap, pinned = budgets.summary_tokens, budgets.pinned_tokens
        return cls(
            lock_wait_s=config.compaction.lock_wait_s,
            drain_quiet_s=config.compaction.drain_quiet_s,
            drain_max_s=config.compaction.drain_max_s,
            max_restarts=config.compaction.max_restarts,
            summary_max_tokens=summary_cap,
            pinned_tokens=pinned,
            instructions=(
                policy.summary_instructions
                if policy is not None
                else config.summarizer.summary_instructions
            ),
        )


@dataclass(frozen=True, slots=True)
class ThresholdCheck:
    """The caller's reason to compact: its incremental count of MEMORY.md and the
    threshold. Once locked, the transaction extends that count (only bytes
    appended since are read; a replaced file is counted again) and gives up with
    :class:`UnderThreshold` when another compactor already did the work."""

    counted: TrackedCount | None
    threshold_tokens: int


def check_still_over(paths: AgentPaths, check: ThresholdCheck, count_bytes: ByteCounter) -> None:
    """Raise :class:`UnderThreshold` when MEMORY.md is under ``check``'s threshold now.

    A file that cannot be counted is left to the snapshot, which reports why.
    """
    try:
        tracked, _kind = count_file(_memory_target_of(paths), check.counted, count_bytes)
        tokens = tracked.tokens
    except FileNotFoundError:
        tokens = 0
    except (OSError, MemdError, ValueError):
        return
    if tokens < check.threshold_tokens:
        raise UnderThreshold(
            f"agent {paths.agent!r}: under threshold once locked "
            f"({tokens} < {check.threshold_tokens} tokens)"
        )


def _guarded_checkpoints(agent: str, hook: Checkpoint, abort: threading.Event | None) -> Checkpoint:
    """``hook`` at each named point, and a forced exit (``abort`` set) honoured at every
    point before the commit: the job rolls back there, never half-applied."""
    if abort is None:
        return hook

    def at(name: str) -> None:
        if abort.is_set() and name in PRE_COMMIT_CHECKPOINTS:
            raise CompactionAborted(
                f"agent {agent!r}: shutdown forced; aborted before commit (at {name})"
            )
        hook(name)

    return at


@dataclass(frozen=True, slots=True)
class CompactionOutcome:
    archive: Path
    tokens_before: int | None
    tokens_after: int | None
    model: str
    cost_usd: float | None
    duration_s: float
    llm_duration_s: float
    drained_bytes: int
    restarts: int = 0
    pinned: int = 0  # facts in the new block's pinned section
    evicted: int = 0  # facts that left the pinned section for its budget (still archived)
    partial: bool = False  # the summarizer covered only the oldest part; the rest stays raw
    calls: int = 1  # summarizer model calls


class ProvidedSummary:
    """A summarizer that returns fixed text (``compact-now --summary``)."""

    def __init__(self, text: str) -> None:
        self._text = text

    @property
    def model(self) -> str:
        return "provided"

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(text=self._text, model="provided")


@dataclass(slots=True)
class _Snapshot:
    dev: int
    ino: int
    size: int  # bytes read
    boundary: int  # N
    digest: str
    data: bytes
    document: MemoryDocument
    st_mode: int
    st_uid: int
    st_gid: int


class _Journal:
    """The job's record in ``.memd/journal``: merged fields, written durably."""

    def __init__(self, paths: AgentPaths, payload: dict[str, Any] | None = None) -> None:
        self._store = SlotJournal(paths.journal)
        self.payload: dict[str, Any] = dict(payload or {})

    def write(self, **changes: Any) -> None:
        self.payload.update(changes)
        self.payload["version"] = JOURNAL_VERSION
        self._store.write(self.payload)

    def clear(self) -> None:
        self.payload = {"phase": IDLE_PHASE}
        self._store.write(self.payload)


def _contained(path: Path, paths: AgentPaths, what: str) -> Path:
    """``path`` with symlinks resolved, refused when it leaves the workspace.

    Checked again here, under the lock, because a link can change between
    ``agent_paths()`` and the moment memd reads or replaces the file.
    """
    try:
        return contained_path(path, paths.workspace, what)
    except WorkspaceError as exc:
        raise CompactionAborted(f"agent {paths.agent!r}: {exc}") from None


def memory_target(paths: AgentPaths) -> Path:
    """MEMORY.md with symlinks resolved, refused when it leaves the agent's folder."""
    return _memory_target_of(paths)


def _memory_target_of(paths: AgentPaths) -> Path:
    # A MEMORY.md symlink inside the workspace is compacted in place: the link
    # survives, its target is replaced.
    return _contained(paths.memory, paths, "MEMORY.md")


def _archive_dir_of(paths: AgentPaths) -> Path:
    return _contained(paths.archive_dir, paths, "archive folder")


def _now_local_iso() -> str:
    # Swarms writes naive local time; so does memd, to match the file.
    return datetime.now().isoformat()  # noqa: DTZ005


def _archive_stem() -> str:
    return "history_" + datetime.now().strftime("%Y-%m-%d_%H-%M-%S")  # noqa: DTZ005


class _Transaction:
    def __init__(
        self,
        paths: AgentPaths,
        summarizer: Summarizer,
        options: CompactionOptions,
        count_bytes: ByteCounter | None,
        checkpoint: Checkpoint,
    ) -> None:
        self.paths = paths
        self.agent = paths.agent
        self.summarizer = summarizer
        self.options = options
        self.count_bytes = count_bytes
        self.checkpoint = checkpoint
        self.journal = _Journal(paths)
        self.memory = paths.memory
        self.archive: Path | None = None
        self.archive_ino: int | None = None
        self.created_archive_dir = False
        self.committed = False

    # -- snapshot -------------------------------------------------------------
    def _memory_target(self) -> Path:
        return _memory_target_of(self.paths)

    def take_snapshot(self) -> _Snapshot:
        target = self._memory_target()
        try:
            fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NothingToCompact(f"agent {self.agent!r}: no MEMORY.md to compact") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CompactionAborted(f"agent {self.agent!r}: MEMORY.md is not a regular file")
            data = read_to_end(fd)
        finally:
            os.close(fd)
        document = parse(data)
        boundary = document.boundary
        digest = hashlib.sha256(data[:boundary]).hexdigest()
        return _Snapshot(
            dev=st.st_dev,
            ino=st.st_ino,
            size=len(data),
            boundary=boundary,
            digest=digest,
            data=data,
            document=document,
            st_mode=st.st_mode,
            st_uid=st.st_uid,
            st_gid=st.st_gid,
        )

    def prefix_unchanged(self, snap: _Snapshot) -> bool:
        try:
            fd = os.open(self._memory_target(), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (snap.dev, snap.ino) or st.st_size < snap.boundary:
                return False
            return sha256_prefix(fd, snap.boundary) == snap.digest
        finally:
            os.close(fd)

    def _count_text(self, text: str) -> int:
        if self.count_bytes is not None:
            return self.count_bytes(text.encode("utf-8", "surrogateescape"))
        return max(1, len(text) // 4)  # no tokenizer given (tests): a rough estimate

    def cut_of(self, snap: _Snapshot, result: SummaryResult) -> int:
        """K: where the summarized part ends (N unless the summarizer stopped early)."""
        until = result.summarized_until
        if until is None or until >= snap.boundary:
            return snap.boundary
        ends = {s.start + len(s.raw) for s in snap.document.segments_before(snap.boundary)}
        if until <= 0 or until not in ends:
            raise SummarizerError(
                f"agent {self.agent!r}: summarizer stopped at byte {until}, which is not the "
                "end of an entry"
            )
        return until

    def compose(
        self, snap: _Snapshot, result: SummaryResult, manual: bool, cut: int
    ) -> tuple[ComposedSummary, int]:
        """The block text: the reply, the pins it does not keep itself, provenance.

        Returns it with the number of earlier archives the provenance line names.
        A reply too short to summarize its input is refused ("ok" is not a
        summary of 30,000 tokens); an operator's ``--summary`` is used as given.
        """
        prefix = MemoryDocument(segments=tuple(snap.document.segments_before(cut)), size=cut)
        material = material_of(prefix, self._count_text)
        body = result.text.strip()
        # Token rules need the tokenizer (like the cap check); the daemon and
        # compact-now always pass one.
        # The builtin summarizer is extractive: a short result means little
        # worth keeping, not a broken model (and it is the fallback when a
        # model keeps failing, so refusing it would let memory grow unbounded).
        if not manual and self.count_bytes is not None and result.model != BUILTIN_MODEL:
            reply_tokens = self._count_text(body)
            if is_degenerate(reply_tokens, material.input_tokens):
                raise SummarizerError(
                    f"agent {self.agent!r}: summarizer reply refused as degenerate "
                    f"({reply_tokens} tokens for {material.input_tokens} tokens of input); "
                    "nothing changed"
                )
        composed = compose_summary(
            body,
            material.pins,
            pinned_tokens=self.options.pinned_tokens,
            count_text=self._count_text,
            # Same length as the final name: the size checks see the real block.
            archive="archive/" + _archive_stem() + ".md",
            earlier_archives=material.earlier_archives,
        )
        return composed, material.earlier_archives

    def summarize(self, snap: _Snapshot) -> tuple[SummaryResult, float]:
        # The snapshot is already parsed; its segments before N are the prefix's.
        prefix_doc = MemoryDocument(
            segments=tuple(snap.document.segments_before(snap.boundary)), size=snap.boundary
        )
        request = SummaryRequest(
            agent=self.agent,
            document=prefix_doc,
            max_tokens=self.options.summary_max_tokens,
            instructions=self.options.instructions,
        )
        started = time.monotonic()
        try:
            result = self.summarizer.summarize(request)
        except MemdError:
            raise
        except Exception as exc:  # a summarizer bug must not take the daemon down
            raise SummarizerError(
                f"agent {self.agent!r}: summarizer failed: {type(exc).__name__}: {exc}"
            ) from exc
        elapsed = time.monotonic() - started
        text = (result.text or "").strip()
        if not text:
            raise SummarizerError(f"agent {self.agent!r}: summarizer returned an empty summary")
        return result, elapsed

    def check_summary_size(self, block: bytes, snap: _Snapshot, manual: bool, cut: int) -> None:
        """Refuse summaries that are over the cap or would not shrink the file
        (only the small summary is tokenized)."""
        if manual:
            return
        if self.count_bytes is not None:
            cap = self.options.summary_max_tokens + self.options.pinned_tokens
            too_long = summary_over_cap(self.count_bytes(block), cap)
            if too_long is not None:
                raise SummarizerError(f"agent {self.agent!r}: {too_long}")
        if not self.options.require_shrink:
            return
        header = snap.document.header
        replaced = cut - (len(header.raw) if header is not None else 0)
        no_shrink = summary_does_not_shrink(len(block), replaced)
        if no_shrink is not None:
            raise CompactionAborted(f"agent {self.agent!r}: {no_shrink}")

    # -- commit ---------------------------------------------------------------
    def write_archive(self, snap: _Snapshot, cut: int) -> None:
        # The agent may read (never change or delete) its own archives.
        access = archive_access(snap.st_mode, snap.st_gid)
        archive_dir = _archive_dir_of(self.paths)
        self.created_archive_dir = ensure_dir_created(archive_dir)
        if self.created_archive_dir:
            share_with_group(archive_dir, access.dir_mode, access.gid)
        temp = self.paths.archive_temp
        st = write_new_file(temp, [snap.data[:cut]])
        share_with_group(temp, access.file_mode, access.gid)
        self.checkpoint("archive-written")
        self.archive_ino = st.st_ino
        self.journal.write(
            phase="archiving",
            agent=self.agent,
            archive_dev=st.st_dev,
            archive_ino=st.st_ino,
            snapshot_size=snap.boundary,
            snapshot_sha256=snap.digest,
            kept_from=cut,
            old_dev=snap.dev,
            old_ino=snap.ino,
            started_at=time.time(),
        )
        self.checkpoint("journal-archiving")
        self.archive = link_unique(temp, archive_dir, _archive_stem())
        fsync_dir(archive_dir)
        self.checkpoint("archive-linked")

    def swap(self, snap: _Snapshot, summary: bytes, cut: int) -> tuple[int, int]:
        """Write and install the new MEMORY.md; returns (M, new inode)."""
        drain = self.paths.drain_link
        unlink_quiet(drain)
        target = self._memory_target()
        # No fsync of .memd/ here: if this link is lost in a crash, the job
        # had not committed yet and recovery rolls it back without it.
        os.link(target, drain, follow_symlinks=True)
        self.checkpoint("drain-linked")
        drain_fd = os.open(drain, _READ_PRIVATE)
        try:
            st = os.fstat(drain_fd)
            if (st.st_dev, st.st_ino) != (snap.dev, snap.ino):
                raise CompactionAborted(
                    f"agent {self.agent!r}: MEMORY.md was replaced during compaction"
                )
            tail = read_range(drain_fd, snap.boundary, st.st_size)
        finally:
            os.close(drain_fd)
        # Copy only whole entries now; the drain copies the rest, so a new
        # writer's entry can never land in the middle of a half-copied one.
        copy_until = snap.boundary + parse(tail).boundary
        header = snap.document.header
        conversation = header.conversation if isinstance(header, HeaderSegment) else self.agent
        new_header = render_header(conversation, _now_local_iso())
        temp = self.paths.new_memory_temp
        new_st = write_new_file(
            temp,
            # Bytes cut..N were not summarized (kept raw), then whatever
            # writers appended since the snapshot.
            [
                new_header,
                summary,
                snap.data[cut : snap.boundary],
                tail[: copy_until - snap.boundary],
            ],
            mode=stat.S_IMODE(snap.st_mode),
        )
        self._preserve_owner(temp, snap)
        self.checkpoint("new-written")
        self.journal.write(
            phase="swapping",
            archive=str(self.archive),
            copied_to=copy_until,
            new_dev=new_st.st_dev,
            new_ino=new_st.st_ino,
        )
        self.checkpoint("journal-swapping")
        os.replace(temp, target)
        fsync_dir(target.parent)
        self.committed = True
        self.checkpoint("replaced")
        return copy_until, new_st.st_ino

    def _preserve_owner(self, temp: Path, snap: _Snapshot) -> None:
        # Agents may run under other UIDs: the re-seeded file must stay
        # appendable by them, so it keeps the old owner, group and mode.
        os.chmod(temp, stat.S_IMODE(snap.st_mode))
        if (snap.st_uid, snap.st_gid) == (os.geteuid(), os.getegid()):
            return
        try:
            os.chown(temp, snap.st_uid, snap.st_gid)
        except PermissionError:
            with contextlib.suppress(PermissionError):
                os.chown(temp, -1, snap.st_gid)
            if snap.st_uid != os.geteuid() and not (snap.st_mode & stat.S_IWGRP):
                raise CompactionAborted(
                    f"agent {self.agent!r}: cannot give the new MEMORY.md its owner uid "
                    f"{snap.st_uid} (run memd as that user or make the file group-writable)"
                ) from None

    def rollback(self) -> None:
        _rollback_files(self.paths, self.archive_ino)
        if self.created_archive_dir:
            # Failure changes nothing: not even an empty archive folder.
            with contextlib.suppress(OSError):
                _archive_dir_of(self.paths).rmdir()


def _rollback_files(paths: AgentPaths, archive_ino: int | None) -> None:
    """Undo an uncommitted job: its archive (found by inode), temps, link; idle journal."""
    if archive_ino is not None:
        _remove_archive_by_inode(paths, archive_ino)
    for leftover in (paths.archive_temp, paths.new_memory_temp, paths.drain_link):
        unlink_quiet(leftover)
    if paths.journal.exists():
        _Journal(paths).clear()


def _remove_archive_by_inode(paths: AgentPaths, inode: int) -> None:
    archive_dir = _archive_dir_of(paths)
    try:
        entries = list(os.scandir(archive_dir))
    except FileNotFoundError:
        return
    removed = False
    for entry in entries:
        try:
            if entry.inode() == inode and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed = True
        except FileNotFoundError:
            continue
    if removed:
        fsync_dir(archive_dir)


def _drain(
    paths: AgentPaths,
    journal: _Journal,
    target: Path,
    copied_to: int,
    quiet_s: float,
    max_s: float,
    poll_s: float,
    checkpoint: Checkpoint,
) -> int:
    """Move bytes appended to the old inode past ``copied_to`` into the new file.

    Each chunk is journaled as pending (range + hash) before it is appended,
    so a crash mid-append is resolved on recovery by looking for the chunk.
    Returns the number of bytes moved.
    """
    try:
        fd = os.open(paths.drain_link, _READ_PRIVATE)
    except FileNotFoundError:
        return 0
    moved = 0
    try:
        started = last_change = time.monotonic()
        last_size = copied_to
        while True:
            size = os.fstat(fd).st_size
            now = time.monotonic()
            if size != last_size:
                last_change, last_size = now, size
            finishing = now - last_change >= quiet_s or now - started >= max_s
            if size > copied_to:
                chunk = read_range(fd, copied_to, size)
                # Whole entries only while writers may still be mid-entry; the
                # final pass takes whatever is left, so nothing stays behind.
                take = len(chunk) if finishing else parse(chunk).boundary
                if take > 0:
                    piece = chunk[:take]
                    journal.write(
                        phase="draining",
                        copied_to=copied_to,
                        pending_to=copied_to + take,
                        pending_sha256=hashlib.sha256(piece).hexdigest(),
                        # Where the new file ended before this append: on
                        # recovery the chunk can only be found past it.
                        pending_at=os.stat(target).st_size,
                    )
                    try:
                        _append(target, piece)
                    except ShortWrite as short:
                        journal.write(
                            phase="draining", copied_to=copied_to + short.written, pending_to=None
                        )
                        raise
                    copied_to += take
                    moved += take
                    journal.write(phase="draining", copied_to=copied_to, pending_to=None)
                    continue
            if finishing and size <= copied_to:
                break
            if now - started >= 2 * max_s + quiet_s:
                # A writer that never reopens the file would keep us here
                # forever; what it writes later is its own (documented) loss.
                break
            time.sleep(poll_s)
    finally:
        os.close(fd)
    checkpoint("drained")
    return moved


def _notify_archived(hook: ArchiveHook, paths: AgentPaths, archive: Path) -> None:
    # The hook logs its own failures; the job is committed whatever it does.
    with contextlib.suppress(Exception):
        hook(paths, archive)


def _append(target: Path, data: bytes) -> None:
    """Append ``data`` durably; a failed write says how much landed (ShortWrite)."""
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _finish(paths: AgentPaths, checkpoint: Checkpoint) -> None:
    # Order matters: the journal goes idle last, so a crash in between leaves
    # a committed journal whose drain has nothing left to move (idempotent).
    for leftover in (paths.drain_link, paths.archive_temp, paths.new_memory_temp):
        unlink_quiet(leftover)
    _Journal(paths).clear()
    checkpoint("cleaned")


def compact_agent(
    paths: AgentPaths,
    summarizer: Summarizer,
    options: CompactionOptions | None = None,
    *,
    count_bytes: ByteCounter | None = None,
    checkpoint: Checkpoint | None = None,
    abort: threading.Event | None = None,
    threshold: ThresholdCheck | None = None,
    manual: bool = False,
    measure_tokens: bool = True,
) -> CompactionOutcome:
    """Compact one agent's MEMORY.md; see the module docstring for the steps.

    ``checkpoint`` is called at each named point (the crash tests kill there);
    ``abort`` set means a forced exit: the job rolls back at its next point
    before the commit. With ``threshold`` (and ``count_bytes``) the job first
    checks, under the lock, that the file is still over it.

    Raises NothingToCompact, LockTimeout, SummarizerError or CompactionAborted
    (UnderThreshold among them); in every one of those cases MEMORY.md and the
    archive dir are as they were.
    """
    hook = _guarded_checkpoints(paths.agent, checkpoint or _no_checkpoint, abort)
    try:
        return _compact(
            paths, summarizer, options, count_bytes, hook, threshold, manual, measure_tokens
        )
    except MemdError:
        raise  # LockTimeout is also an OSError (TimeoutError); it speaks for itself
    except OSError as exc:
        raise CompactionAborted(f"agent {paths.agent!r}: {describe_error(exc)}") from exc


def _compact(
    paths: AgentPaths,
    summarizer: Summarizer,
    options: CompactionOptions | None,
    count_bytes: ByteCounter | None,
    hook: Checkpoint,
    threshold: ThresholdCheck | None,
    manual: bool,
    measure_tokens: bool,
) -> CompactionOutcome:
    opts = options or CompactionOptions()
    started = time.monotonic()
    ensure_private_dir(paths.private_dir)
    lock = AgentLock(paths.lock, paths.agent)
    with lock.held(opts.lock_wait_s):
        hook("locked")
        if threshold is not None and count_bytes is not None:
            # The lock may have been held by another compactor (compact-now, a
            # second daemon) that just did the work: check before summarizing.
            check_still_over(paths, threshold, count_bytes)
        _recover_locked(paths, quiet_s=opts.drain_quiet_s, max_s=opts.drain_max_s)
        txn = _Transaction(paths, summarizer, opts, count_bytes, hook)
        restarts = 0
        while True:
            snap = txn.take_snapshot()
            if not has_compactable(snap.document):
                raise NothingToCompact(
                    f"agent {paths.agent!r}: nothing to compact (no raw entries since the "
                    "last summary)"
                )
            result, llm_s = txn.summarize(snap)
            hook("summarized")
            if txn.prefix_unchanged(snap):
                break
            restarts += 1
            if restarts > opts.max_restarts:
                raise CompactionAborted(
                    f"agent {paths.agent!r}: MEMORY.md was rewritten during compaction "
                    f"{restarts} times; giving up"
                )
        cut = txn.cut_of(snap, result)
        composed, earlier = txn.compose(snap, result, manual, cut)
        stamp = _now_local_iso()
        txn.check_summary_size(render_summary_block(composed.text, stamp), snap, manual, cut)
        try:
            txn.write_archive(snap, cut)
            assert txn.archive is not None
            provenance = version_line(f"archive/{txn.archive.name}", earlier)
            head = composed.text.rpartition("\n")[0]
            text = f"{head}\n{provenance}" if head else provenance
            copied_to, _new_ino = txn.swap(snap, render_summary_block(text, stamp), cut)
        except BaseException as exc:
            if not txn.committed:
                txn.rollback()
                if isinstance(exc, OSError):
                    raise CompactionAborted(
                        f"agent {paths.agent!r}: compaction rolled back: {describe_error(exc)}"
                    ) from exc
            raise
        # The "swapping" journal (new inode, copied_to) already lets recovery
        # roll forward; the drain journals again only if it moves bytes.
        hook("journal-draining")
        try:
            drained = _drain(
                paths,
                txn.journal,
                txn._memory_target(),
                copied_to,
                opts.drain_quiet_s,
                opts.drain_max_s,
                opts.drain_poll_s,
                hook,
            )
            _finish(paths, hook)
            if opts.on_archived is not None and txn.archive is not None:
                _notify_archived(opts.on_archived, paths, txn.archive)
        except OSError as exc:
            # Past the commit point nothing can be rolled back; the journal
            # keeps the drain offsets and the next run finishes it.
            raise CompactionAborted(
                f"agent {paths.agent!r}: compaction committed ({txn.archive}) but moving "
                f"late appends failed: {describe_error(exc)}; the next run finishes it"
            ) from exc
        tokens_before = count_bytes(snap.data) if count_bytes and measure_tokens else None
        tokens_after = None
        if count_bytes is not None and measure_tokens:
            with contextlib.suppress(OSError):
                tokens_after = count_bytes(txn._memory_target().read_bytes())
        assert txn.archive is not None
        return CompactionOutcome(
            archive=txn.archive,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            model=result.model,
            cost_usd=result.cost_usd,
            duration_s=time.monotonic() - started,
            llm_duration_s=llm_s,
            drained_bytes=drained,
            restarts=restarts,
            pinned=composed.pinned,
            evicted=composed.evicted,
            partial=cut < snap.boundary,
            calls=result.calls,
        )


def recover_agent(
    paths: AgentPaths, wait_s: float = 0.0, quiet_s: float = 1.0, max_s: float = 10.0
) -> str | None:
    """Finish or roll back a crashed compaction of ``paths.agent``.

    Returns a description of what was done, or None when there was nothing to
    do (or another process holds the lock and is doing it).
    """
    if not paths.private_dir.is_dir():
        return None
    lock = AgentLock(paths.lock, paths.agent)
    try:
        lock.acquire(wait_s)
    except MemdError:
        return None
    try:
        return _recover_locked(paths, quiet_s=quiet_s, max_s=max_s)
    finally:
        lock.release()


def _recover_locked(paths: AgentPaths, quiet_s: float, max_s: float) -> str | None:
    if paths.journal.exists():
        payload = SlotJournal(paths.journal).read() or {"phase": CORRUPT_PHASE}
    else:
        payload = {"phase": IDLE_PHASE}
    phase = payload.get("phase")
    if phase == IDLE_PHASE:
        # No job in flight: any temp or link is from a job that never reached
        # its first journal write, so nothing outside .memd/ was touched.
        leftovers = [
            p
            for p in (paths.archive_temp, paths.new_memory_temp, paths.drain_link)
            if unlink_quiet(p)
        ]
        return f"removed {len(leftovers)} stale temp file(s)" if leftovers else None
    version = payload.get("version", 1)
    if isinstance(version, int) and version > JOURNAL_VERSION:
        raise CompactionAborted(
            f"agent {paths.agent!r}: the compaction journal has format {version}, newer than "
            f"this memd reads ({JOURNAL_VERSION}); finish it with the newer memd"
        )
    journal = _Journal(paths, payload)
    target = _memory_target_of(paths)
    try:
        current = os.stat(target)
        current_id: tuple[int, int] | None = (current.st_dev, current.st_ino)
    except FileNotFoundError:
        current_id = None
    old_id = (payload.get("old_dev"), payload.get("old_ino"))
    new_id = (payload.get("new_dev"), payload.get("new_ino"))
    archive_ino = payload.get("archive_ino")

    action = recovery_action(phase, current_id, old_id, new_id)
    if action is RecoveryAction.ROLL_BACK:
        # Crashed before the replace: MEMORY.md still holds everything.
        _rollback_files(paths, archive_ino if isinstance(archive_ino, int) else None)
        return f"rolled back an interrupted compaction (phase {phase})"
    if action is RecoveryAction.ROLL_FORWARD:
        copied_to = int(payload.get("copied_to", 0))
        pending_to = payload.get("pending_to")
        if isinstance(pending_to, int):
            copied_to = _resolve_pending(paths, target, copied_to, pending_to, payload)
            journal.write(phase="draining", copied_to=copied_to, pending_to=None)
        _drain(paths, journal, target, copied_to, quiet_s, max_s, 0.05, _no_checkpoint)
        _finish(paths, _no_checkpoint)
        return "finished an interrupted compaction (drained the old file)"
    # MEMORY.md is neither the old nor the new inode: someone replaced (or
    # removed) it while memd was down. Keep every byte, each once: the old
    # inode's whole content becomes the archive, in place of this job's
    # archive (which holds its first N bytes only).
    if paths.drain_link.exists():
        if isinstance(archive_ino, int):
            _remove_archive_by_inode(paths, archive_ino)
        archive_dir = _archive_dir_of(paths)
        ensure_dir_created(archive_dir)
        link_unique(paths.drain_link, archive_dir, _archive_stem())
        fsync_dir(archive_dir)
    _finish(paths, _no_checkpoint)
    return (
        "MEMORY.md was replaced by another program during an interrupted compaction; "
        "kept the old file as an archive"
    )


def _resolve_pending(
    paths: AgentPaths, target: Path, copied_to: int, pending_to: int, payload: dict[str, Any]
) -> int:
    """How much of the journaled chunk reached the new file before the crash.

    The chunk was appended (O_APPEND) at or after ``pending_at``, the new
    file's size journaled just before; writers may have appended after it.
    Returns the old-inode offset the drain continues from.
    """
    try:
        fd = os.open(paths.drain_link, _READ_PRIVATE)
    except FileNotFoundError:
        return copied_to
    try:
        chunk = read_range(fd, copied_to, pending_to)
    finally:
        os.close(fd)
    if not chunk or hashlib.sha256(chunk).hexdigest() != payload.get("pending_sha256"):
        return copied_to
    pending_at = payload.get("pending_at")
    if not isinstance(pending_at, int):
        return copied_to
    after = target.read_bytes()[pending_at:]
    return copied_to + landed_prefix(after, chunk)


__all__ = [
    "CHECKPOINTS",
    "PRE_COMMIT_CHECKPOINTS",
    "ArchiveHook",
    "CompactionOptions",
    "CompactionOutcome",
    "ProvidedSummary",
    "ThresholdCheck",
    "check_still_over",
    "compact_agent",
    "memory_target",
    "recover_agent",
]
