"""The compaction transaction (DESIGN.md §2): archive, summarize, re-seed, drain.

Shape (logrotate ``create`` mode, not ``copytruncate``):

1. take the agent's lock (held for the whole job; it serializes compactors,
   never writers) and finish or roll back any crashed job from its journal;
2. snapshot MEMORY.md: (dev, ino), a size N at an entry boundary, sha256 of
   bytes 0..N; the newest whole turns within ``keep_recent_tokens`` (K..N) stay
   verbatim, so 0..K is compacted;
3. summarize 0..K (the slow part; writers keep appending meanwhile); a
   summarizer out of calls stops earlier and K moves back with it;
4. re-check that 0..N is unchanged (else start over, a bounded number of times);
5. write the archive of 0..K: temp in ``.memd/`` + fsync, journal, ``link()``
   to a name that does not exist yet, fsync the archive dir;
6. hard-link the old inode as ``.memd/drain.md``; pick M ≥ N at an entry
   boundary; write header + summary block + bytes K..M to a temp, give it the
   old file's mode and owner, fsync, journal (old and new inode numbers),
   ``os.replace`` over MEMORY.md, fsync the dir: this is the commit point;
7. drain: bytes a late writer appended to the old inode past M are appended to
   the new file (journaled by offset, idempotent) until the old inode has been
   quiet for ``drain_quiet_s`` (bounded by ``drain_max_s``); drop the link;
8. apply the retention limits (never to the new archive) and let the lock go.

The transaction calls no one back: what it committed and what retention
deleted come back in its :class:`CompactionOutcome` (``archive``, ``pruned``),
and the caller hands them on (the recall index, the archive figures) once the
lock is let go.

Recovery reads the journal and decides by inode numbers, never by guessing:
before the replace it rolls back (removes the archive it had linked, by
inode), after it rolls forward (finishes the drain). A journal with no readable
record is decided from the files (:func:`_recover_unreadable`); a first build's
plain-JSON ``journal.json`` is read (:func:`_legacy_journal`).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from memd.agentdir import AgentDir
from memd.archive_crypto import (
    ENCRYPTED_SUFFIX,
    PLAIN_SUFFIX,
    DataKey,
    MasterKey,
    agent_data_key,
    read_master_key,
    seal_archive,
)
from memd.core.audit import AuditEvent
from memd.core.carried_lines import CarriedLine
from memd.core.carry import CarryMaterial, carry_material
from memd.core.config import AgentPolicy, MemdConfig
from memd.core.memfile import (
    BLOCK_TERMINATOR,
    HeaderSegment,
    MemoryDocument,
    parse,
    render_clean_summary_block,
    render_header,
    sanitize_summary,
)
from memd.core.ownership import ArchiveAccess, archive_access, archive_acl, widens_archive_dir
from memd.core.pins import Pin
from memd.core.plan import (
    IDLE_PHASE,
    RecoveryAction,
    has_compactable,
    kept_tail,
    known_consistent,
    landed_prefix,
    lone_summary,
    may_exceed_cap,
    nothing_to_compact_reason,
    recovery_action,
    summarized_to,
    summary_does_not_shrink,
    summary_over_budget,
    summary_over_cap,
)
from memd.core.privacy import Privacy, Redactor
from memd.core.retention import NO_LIMITS, ArchiveInfo, RetentionLimits, plan_prune
from memd.core.summary import Summarizer, SummaryRequest, SummaryResult
from memd.core.summary_block import (
    ComposedSummary,
    archive_note,
    compose_summary,
    material_of,
    version_line,
)
from memd.core.summary_plan import BudgetError, degenerate_floor
from memd.core.tokens import (
    JUNCTION_CUT_ENCODINGS,
    CountState,
    count_at_least,
    last_safe_boundary,
)
from memd.counting import WINDOW_BYTES, TrackedCount, count_data, count_fd
from memd.errors import (
    CommittedUnfinished,
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
    create_file_at,
    has_acl,
    iter_range,
    link_unique_at,
    read_acl,
    read_range,
    read_to_end,
    set_acl,
    share_with_group,
)
from memd.redaction_key import process_key
from memd.retention import PruneResult, list_archives, local_utc_offset, prune_locked
from memd.rewrite import ERASE_PHASE, MANIFEST_NAME, apply_staged, remove_staging
from memd.summarizers import BUILTIN_MODEL
from memd.workspace import (
    ARCHIVE_TEMP,
    DRAIN_NAME,
    JOURNAL_NAME,
    LEGACY_JOURNAL_NAME,
    NEW_MEMORY_TEMP,
    AgentPaths,
)

_NEWEST_ARCHIVE = "history_9999-12-31_23-59-59_999999.md"
# What the block's text leaves spare under the bytes it replaces (memd.core.summary_block
# compose_summary's max_bytes): the sanitizer's quoting of a line or two.
_SHRINK_SPARE_BYTES = 32
_TEMP_NAMES = (ARCHIVE_TEMP, NEW_MEMORY_TEMP, DRAIN_NAME)

# 2: the archive may hold only bytes 0..kept_from (K ≤ N) of the snapshot;
# recovery reads both versions alike (it works from inodes and drain offsets).
JOURNAL_VERSION = 2
# An erase-by-pattern's journal (phase "erasing", memd.rewrite) says 3: a memd
# from before erase-by-pattern refuses it rather than take it for a compaction
# and archive the erased file. This release reads up to it.
ERASE_JOURNAL_VERSION = 3
_NEWEST_READABLE = ERASE_JOURNAL_VERSION
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
ByteCounter = Callable[[bytes], int]
# The snapshot is hashed in pieces of this size: a prefix digest re-hashes less
# than one.
_HASH_CHUNK = 1 << 20


def archive_key_file(config: MemdConfig) -> Path | None:
    """The master key file archives are sealed with (None: archives are not encrypted)."""
    privacy = config.privacy
    if privacy.encrypt_archives and privacy.key_file:
        return Path(privacy.key_file).expanduser()
    return None


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
    # Model calls this compaction may make (what a spending cap leaves); None:
    # the summarizer's own [summarizer] max_calls.
    max_calls: int | None = None
    # The newest whole turns up to this many tokens stay verbatim after the
    # summary block (archived at a later compaction); 0 keeps none.
    keep_recent_tokens: int = 0
    # The count of entries side by side is the sum of their counts (a newline then
    # "#" is a pre-token boundary: core.tokens.is_junction_cut, cl100k_base and
    # o200k_base): the turns kept verbatim are then not tokenized a second time
    # for the new file's count.
    entries_add_up: bool = False
    # [privacy] encrypt_archives: the master key file (read at each job, so a
    # rotated key file is picked up without a restart); None writes plain archives.
    key_file: Path | None = None
    # Applied under the lock once the new archive is committed (it is never deleted);
    # what it deleted is in the outcome (``pruned``), for the caller to hand on.
    retention: RetentionLimits = NO_LIMITS
    # The workspace's redaction key and [privacy] settings (None: a per-process
    # key): what a remote summarizer is sent, and the scan of every reply.
    privacy: Privacy | None = None
    # The workspace's audit log: an erasure a crash left, finished by this job's
    # recovery, is recorded there (None: not recorded).
    audit: AuditSink | None = None

    @classmethod
    def from_config(
        cls,
        config: MemdConfig,
        policy: AgentPolicy | None = None,
        *,
        agent: str = "",
        redaction_key: bytes | None = None,
    ) -> CompactionOptions:
        summarizer = config.summarizer
        summary_cap = summarizer.summary_tokens or summarizer.max_tokens
        pinned = summarizer.pinned_tokens or DEFAULT_PINNED_TOKENS
        # Without an agent there is no threshold to take a share of.
        recent = max(0, summarizer.keep_recent_tokens)
        if policy is not None:
            # Budgets scale with the agent's threshold and leave room under
            # the low-water mark, or a compaction could never end below it.
            try:
                budgets = policy.budgets()
            except BudgetError as exc:
                raise ConfigError(f"agent {agent!r}: {exc}") from None
            summary_cap, pinned = budgets.summary_tokens, budgets.pinned_tokens
            recent = budgets.recent_tokens
        return cls(
            entries_add_up=config.tokenizer.encoding in JUNCTION_CUT_ENCODINGS,
            key_file=archive_key_file(config),
            lock_wait_s=config.compaction.lock_wait_s,
            drain_quiet_s=config.compaction.drain_quiet_s,
            drain_max_s=config.compaction.drain_max_s,
            max_restarts=config.compaction.max_restarts,
            summary_max_tokens=summary_cap,
            pinned_tokens=pinned,
            keep_recent_tokens=recent,
            instructions=(
                policy.summary_instructions
                if policy is not None
                else config.summarizer.summary_instructions
            ),
            retention=policy.retention if policy is not None else config.retention.limits(),
            privacy=Privacy(redaction_key or process_key(), config.privacy),
        )


@dataclass(frozen=True, slots=True)
class ThresholdCheck:
    """The caller's reason to compact: its incremental count of MEMORY.md and the
    threshold. Once locked, the transaction extends that count (only bytes
    appended since are read; a replaced file is counted again) and gives up with
    :class:`UnderThreshold` when another compactor already did the work."""

    counted: TrackedCount | None
    threshold_tokens: int


def check_still_over(
    where: AgentDir | AgentPaths, check: ThresholdCheck, count_bytes: ByteCounter
) -> TrackedCount | None:
    """Raise :class:`UnderThreshold` when MEMORY.md is under ``check``'s threshold now.

    Returns the count it made (None when there is no file or it cannot be
    counted: the snapshot then reports why).
    """
    if isinstance(where, AgentPaths):
        try:
            opened = AgentDir.open(where, create_private=False)
        except (OSError, MemdError):
            return None
        with opened:
            return check_still_over(opened, check, count_bytes)
    pinned = where
    paths = pinned.paths
    counted: TrackedCount | None = None
    try:
        fd = pinned.open_memory(os.O_RDONLY)
    except FileNotFoundError:
        fd, tokens = -1, 0
    except (OSError, MemdError):
        return None
    if fd >= 0:
        try:
            counted = count_fd(fd, paths.memory, check.counted, count_bytes)[0]
            tokens = counted.tokens
        except (OSError, MemdError, ValueError):
            return None
        finally:
            os.close(fd)
    if tokens < check.threshold_tokens:
        raise UnderThreshold(
            f"agent {paths.agent!r}: under threshold once locked "
            f"({tokens} < {check.threshold_tokens} tokens)"
        )
    return counted


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
    # What the compaction itself produced from its snapshot (header + summary
    # + the snapshot's bytes it carried), apart from appends that arrived
    # while it ran: only the former says whether compaction can shrink the file.
    tokens_produced: int | None
    cost_usd: float | None
    duration_s: float
    llm_duration_s: float
    pinned: int = 0  # facts in the new block's pinned section
    evicted: int = 0  # facts that left the pinned section for its budget (still archived)
    # Decisions, open tasks, errors and people the reply dropped, carried verbatim.
    carried: int = 0
    partial: bool = False  # the summarizer covered only the oldest part; the rest stays raw
    calls: int = 1  # summarizer model calls
    # What writers appended while the job ran (carried into the new file past
    # what the compaction produced): shown apart, so a ledger row never reads
    # as if compaction grew the file.
    tokens_appended: int | None = None
    pruned: PruneResult | None = None  # the retention pass after the commit, if any ran
    prune_error: str | None = None  # why it failed (the compaction itself stands)
    redacted: int = 0  # secrets replaced by placeholders in what the summarizer was sent
    reply_redacted: int = 0  # secrets the summary itself held, replaced before writing
    # The new MEMORY.md's count as the job left it (the kept turns' tokens reused,
    # not tokenized again): the caller extends it instead of counting the new file
    # from scratch. None when the job could not make it (see _new_file_count).
    counted: TrackedCount | None = None


class ProvidedSummary:
    """A summarizer that returns fixed text (``compact-now --summary``)."""

    def __init__(self, text: str) -> None:
        self._text = text

    @property
    def model(self) -> str:
        return "provided"

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        # The operator's own text, not made from the material: the reply scan's
        # patterns apply to it, the search of a 200 MB snapshot for values not.
        return SummaryResult(text=self._text, model="provided", given_as_written=False)


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
    mtime_ns: int
    acl: bytes | None = None  # its POSIX access ACL (None: mode bits only)


def _read_hashing(fd: int) -> tuple[bytes, list[tuple[int, Any]]]:
    """The file's bytes and the sha256 state at the end of each chunk, so the digest
    of any prefix hashes only the bytes past the last state before it (no second
    pass over the snapshot).

    Read in one piece of the size ``fstat`` gives (then whatever was appended
    meanwhile): the snapshot is held once, never as chunks plus their join.
    """
    data = _read_whole(fd, os.fstat(fd).st_size)
    digest = hashlib.sha256()
    states: list[tuple[int, Any]] = [(0, digest.copy())]
    view = memoryview(data)
    for offset in range(0, len(data), _HASH_CHUNK):
        end = min(len(data), offset + _HASH_CHUNK)
        digest.update(view[offset:end])
        states.append((end, digest.copy()))
    return data, states


def _prefix_digest(data: bytes, states: list[tuple[int, Any]], length: int) -> str:
    at = bisect.bisect_right([offset for offset, _ in states], length) - 1
    offset, state = states[at]
    digest = state.copy()
    digest.update(memoryview(data)[offset:length])
    return str(digest.hexdigest())


def _same_prefix(fd: int, data: bytes, length: int) -> bool:
    """Whether the file's first ``length`` bytes are still ``data[:length]``.

    Compared with the snapshot's own bytes (a memcmp per chunk, no copy),
    not hashed again: equal bytes is what a matching digest stands for, at a
    quarter of the cost of a second sha256 pass over the snapshot.
    """
    offset = 0
    for chunk in iter_range(fd, 0, length):
        if not data.startswith(chunk, offset):
            return False
        offset += len(chunk)
    return offset == length


def _still_holds(fd: int, data: bytes, boundary: int, tail: bytes) -> bool:
    """Whether the open file's bytes 0..N are still ``data[:N]`` and N.. start with
    ``tail``: every byte a new MEMORY.md is about to carry of it. The size is looked
    at again after the compare, so a truncate while it ran is seen."""
    length = boundary + len(tail)
    if os.fstat(fd).st_size < length or not _same_prefix(fd, data, boundary):
        return False
    if tail and read_range(fd, boundary, length) != tail:
        return False
    return os.fstat(fd).st_size >= length


def snapshot_tokens(
    data: bytes,
    dev: int,
    ino: int,
    counted: TrackedCount | None,
    count_bytes: ByteCounter,
) -> int:
    """Tokens of a snapshot: the caller's incremental count (made under the lock)
    extended over the bytes appended since, never a recount of the whole file."""
    return count_data(data, dev, ino, 0, counted, count_bytes)[0].tokens


def snapshot_count(
    snap: _Snapshot,
    counted: TrackedCount | None,
    count_bytes: ByteCounter | None,
    *,
    afresh: bool = False,
) -> TrackedCount | None:
    """The caller's count (made under the lock) extended over what the snapshot holds
    past it; None when there is none, or it is of another file (nothing is counted
    from scratch here, unless ``afresh``).

    ``afresh``: the transaction saw the file change under it (it started over), so
    the count made before says nothing of these bytes: the snapshot is counted from
    scratch (no marks). Otherwise the count is trusted as the daemon's own is, on
    its inode, size and the window before its safe offset
    (:func:`memd.counting.count_data`): a rewrite that keeps all three (same size,
    in place, before the window) between that count and the snapshot goes unseen,
    and the job's token figures and the new file's count are then those of the
    bytes as counted (the daemon's incremental count has the same blind spot).
    """
    if counted is None or count_bytes is None:
        return None
    if afresh:
        return count_data(snap.data, snap.dev, snap.ino, snap.mtime_ns, None, count_bytes)[0]
    state = counted.state
    if (state.dev, state.ino) != (snap.dev, snap.ino) or snap.size < state.size:
        return None
    return count_data(snap.data, snap.dev, snap.ino, snap.mtime_ns, counted, count_bytes)[0]


# Past this many bytes from the count's nearest exact point, the end of the
# snapshot's last complete entry is not worth counting up to for the known counts.
_KNOWN_GAP_BYTES = 1 << 20


def known_suffixes(
    count: TrackedCount | None, data: bytes, end: int, count_bytes: ByteCounter
) -> list[tuple[int, int]]:
    """``(offset, tokens of data[offset:end])`` at the exact points of ``count``, a
    count of ``data`` (its marks and its safe offset, and 0), for
    :func:`memd.core.plan.kept_tail`; empty when there are none to trust (no count,
    an estimated one, or one of other bytes). ``end`` is a segment boundary.

    Each point's tokens are the total less those before it: points are where
    counts add up. When ``end`` is not the end of ``data`` (a partial entry after
    it), the total up to ``end`` is counted from the nearest point before it.
    Points that contradict each other (:func:`memd.core.plan.known_consistent`)
    give none.
    """
    if count is None or count.state.estimated or count.size != len(data):
        return []
    state = count.state
    marks = count.marks
    points = sorted(
        {(0, 0), (state.safe_offset, state.safe_tokens), *zip(marks[::2], marks[1::2], strict=True)}
    )
    if end == len(data):
        total = state.tokens
    else:
        offset, tokens = max(point for point in points if point[0] <= end)
        if end - offset > _KNOWN_GAP_BYTES:
            return []
        total = tokens + count_bytes(data[offset:end])
    known = [(offset, total - tokens) for offset, tokens in points if offset <= end]
    # Marks that contradict the count (a damaged state DB row) decide nothing: not
    # the kept tail, nor the new file's count built from the same points.
    return known if known_consistent(known, end) else []


class _Journal:
    """The job's record in ``.memd/journal``: merged fields, written durably."""

    def __init__(
        self,
        pinned: AgentDir,
        payload: dict[str, Any] | None = None,
        version: int = JOURNAL_VERSION,
    ) -> None:
        self._store = SlotJournal(pinned.paths.journal, dir_fd=pinned.private_fd)
        self.payload: dict[str, Any] = dict(payload or {})
        self.version = version

    def write(self, **changes: Any) -> None:
        self.payload.update(changes)
        self.payload["version"] = self.version
        self._store.write(self.payload)

    def clear(self) -> None:
        self.payload = {"phase": IDLE_PHASE}
        self._store.write(self.payload)


def read_memory(paths: AgentPaths) -> bytes:
    """MEMORY.md's bytes, read as the transaction reads them (contained per agent,
    never through a swapped link, never blocking on a FIFO); for previews."""
    try:
        pinned = AgentDir.open(paths, create_private=False)
    except WorkspaceError as exc:
        raise CompactionAborted(str(exc)) from None
    with pinned:
        try:
            fd = pinned.open_memory(os.O_RDONLY)
        except WorkspaceError as exc:
            raise CompactionAborted(str(exc)) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CompactionAborted(
                    f"agent {paths.agent!r}: MEMORY.md is not a regular file (a FIFO, device "
                    "or folder); refusing it"
                )
            return read_to_end(fd)
        finally:
            os.close(fd)


def lines_the_scan_keeps(lines: Sequence[CarriedLine], scan: Redactor) -> tuple[CarriedLine, ...]:
    """The carried lines in which the reply's ``scan`` finds nothing to redact
    (as :func:`pins_the_scan_keeps`: a line is kept whole or not at all; one
    holding a credential is no candidate at all)."""
    if not (scan.pii or scan.patterns):
        return tuple(lines)
    return tuple(line for line in lines if not scan.spans(line.text))


def pins_naming_no_credential(pins: Sequence[Pin], carry: CarryMaterial | None) -> tuple[Pin, ...]:
    """The ``pins`` holding none of the credential values the turns' context gave
    away: one said bare in another turn ("rotate the secret key 3fa9…") is pinned
    from there, and no reply scan of a model sent placeholders looks for it
    (r11carry). ``carry`` None (the builtin summarizer): the pins as given."""
    if carry is None or not carry.credentials:
        return tuple(pins)
    return tuple(pin for pin in pins if not carry.names_a_credential(pin.text))


def pins_the_scan_keeps(pins: Sequence[Pin], scan: Redactor) -> tuple[Pin, ...]:
    """The pins in which the reply's ``scan`` finds nothing to redact.

    Credentials are never pinned, but e-mail addresses are, and so is what an
    operator's ``[privacy] patterns`` name: where the scan redacts them (personal
    data redacted on the way out, or ``redact_pii = true``), such a pin is left
    out rather than written as a placeholder, which names nothing, is never kept
    by a later reply and would be carried on as a marked line. The turn it came
    from is in the archive.
    """
    if not (scan.pii or scan.patterns):
        return tuple(pins)
    return tuple(pin for pin in pins if not scan.spans(pin.text))


def _now_local_iso() -> str:
    # Swarms writes naive local time; so does memd, to match the file.
    return datetime.now().isoformat()  # noqa: DTZ005


def _archive_stem() -> str:
    return "history_" + datetime.now().strftime("%Y-%m-%d_%H-%M-%S")  # noqa: DTZ005


def _free_archive_name(archive_fd: int, stem: str, suffix: str) -> str:
    """The first of ``stem{suffix}``, ``stem_1{suffix}``, … not taken (plain or encrypted).

    An encrypted archive is sealed with its final name, so the name is chosen
    before the link (the agent's lock keeps other compactors away; a name taken
    meanwhile by anyone else makes the link fail and the job roll back).
    """
    attempt = 0
    while True:
        base = stem if attempt == 0 else f"{stem}_{attempt}"
        taken = False
        for candidate in (base + PLAIN_SUFFIX, base + ENCRYPTED_SUFFIX):
            try:
                os.stat(candidate, dir_fd=archive_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            taken = True
        if not taken:
            return base + suffix
        attempt += 1


class _Transaction:
    def __init__(
        self,
        pinned: AgentDir,
        summarizer: Summarizer,
        options: CompactionOptions,
        count_bytes: ByteCounter | None,
        checkpoint: Checkpoint,
    ) -> None:
        self.pinned = pinned
        self.paths = pinned.paths
        self.agent = pinned.paths.agent
        self.summarizer = summarizer
        self.options = options
        self.count_bytes = count_bytes
        self.checkpoint = checkpoint
        self.journal = _Journal(pinned)
        self.archive: Path | None = None
        self.archive_ino: int | None = None
        self.created_archive_dir = False
        # The archive folder's (mode, group) before this job widened it (an
        # older memd's private one): put back on rollback.
        self.widened_archive_dir: tuple[int, int] | None = None
        self.committed = False
        self.swapping = False  # the "swapping" journal is written: recovery can finish the swap
        self.old_id: tuple[int, int] = (-1, -1)
        # The new MEMORY.md, open from its creation on: the drain appends
        # through this fd, never through a path an agent could redirect.
        self.new_fd = -1
        self.new_size = -1
        self.produced = b""  # header + summary + what the snapshot held past N
        self.produced_head = 0  # of which the header and the summary block
        self.produced_kept = 0  # and then the turns kept verbatim
        self.privacy = options.privacy or Privacy(process_key())
        self.reply_redacted = 0
        # What the summaries of this transaction spent on the model (every
        # summary: a rewrite during one makes the next start over), for the
        # caller's spending caps; the cost as far as it was priced.
        self.model_calls = 0
        self.model_cost_usd = 0.0
        self.master: MasterKey | None = None
        self.data_key: DataKey | None = None
        if options.key_file is not None:
            # Before the summarizer is paid: a missing or wrong key fails at once.
            self.master = read_master_key(options.key_file)
            self.data_key = agent_data_key(pinned, self.master, create=False)

    @property
    def archive_suffix(self) -> str:
        return ENCRYPTED_SUFFIX if self.master is not None else PLAIN_SUFFIX

    # -- snapshot -------------------------------------------------------------
    def _open_memory(self) -> int:
        fd = self.pinned.open_memory(os.O_RDONLY)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CompactionAborted(
                f"agent {self.agent!r}: MEMORY.md is not a regular file (a FIFO, device or "
                "folder); refusing it"
            )
        return fd

    def take_snapshot(self) -> _Snapshot:
        try:
            fd = self._open_memory()
        except FileNotFoundError:
            raise NothingToCompact(
                f"agent {self.agent!r}: no MEMORY.md to compact",
                reason="nothing to compact: no MEMORY.md",
            ) from None
        try:
            st = os.fstat(fd)
            acl = read_acl(fd)
            data, states = _read_hashing(fd)
        finally:
            os.close(fd)
        document = parse(data)
        boundary = document.boundary
        digest = _prefix_digest(data, states, boundary)
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
            mtime_ns=st.st_mtime_ns,
            acl=acl,
        )

    def prefix_unchanged(self, snap: _Snapshot) -> bool:
        try:
            fd = self._open_memory()
        except FileNotFoundError:
            return False
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (snap.dev, snap.ino) or st.st_size < snap.boundary:
                return False
            return _same_prefix(fd, snap.data, snap.boundary)
        finally:
            os.close(fd)

    def known_suffixes(
        self, snap: _Snapshot, snap_count: TrackedCount | None
    ) -> list[tuple[int, int]]:
        """The snapshot count's exact points, for the kept-tail walk: only when entries
        add up (every entry start is then a cut where counts add up too)."""
        if self.count_bytes is None or not self.options.entries_add_up:
            return []
        return known_suffixes(snap_count, snap.data, snap.boundary, self.count_bytes)

    def count_text(self, text: str) -> int:
        if self.count_bytes is not None:
            return self.count_bytes(text.encode("utf-8", "surrogateescape"))
        return max(1, len(text) // 4)  # no tokenizer given (tests): a rough estimate

    def count_block(self, block: bytes) -> int:
        if self.count_bytes is not None:
            return self.count_bytes(block)
        return max(1, len(block) // 4)  # as count_text

    @property
    def summary_cap(self) -> int:
        """The most a summary block may hold (its markup allowed beside it)."""
        return self.options.summary_max_tokens + self.options.pinned_tokens

    def replaces_lone_summary(self, prefix: MemoryDocument, manual: bool) -> bool:
        """Whether ``prefix``, with nothing to compact otherwise (no raw entry since its
        summary block), is compacted all the same: its block is replaced by an
        operator's ``--summary``, or re-summarized when it is over the cap a new
        block is held to (one within it stays: no compaction loop)."""
        if manual:
            return lone_summary(prefix) is not None
        return summary_over_budget(prefix, self.summary_cap, self.count_block) is not None

    def cut_of(self, snap: _Snapshot, result: SummaryResult, kept_from: int) -> int:
        """K: where the summarized part ends (where the kept tail starts, unless the
        summarizer stopped earlier)."""
        until = summarized_to(kept_from, result.summarized_until)
        if until == kept_from:
            return kept_from
        # ``until`` must end a segment: the newest one ending by it ends there.
        newest = next(iter(snap.document.segments_reversed(until)), None) if until > 0 else None
        if newest is None or newest.start + len(newest.raw) != until:
            raise SummarizerError(
                f"agent {self.agent!r}: summarizer stopped at byte {until}, which is not the "
                "end of an entry"
            )
        return until

    def compose(
        self,
        snap: _Snapshot,
        result: SummaryResult,
        manual: bool,
        cut: int,
        input_tokens: int | None = None,
    ) -> tuple[ComposedSummary, int]:
        """The block text: the reply, the pins it does not keep itself, provenance.

        Returns it with the number of earlier archives the provenance line names.
        A reply too short to summarize its input is refused ("ok" is not a
        summary of 30,000 tokens); an operator's ``--summary`` is used as given.
        """
        prefix = snap.document.prefix(cut)
        # The builtin summarizer is extractive: a short result means little
        # worth keeping, not a broken model (and it is the fallback when a
        # model keeps failing, so refusing it would let memory grow unbounded).
        # Token rules need the tokenizer (like the cap check); the daemon and
        # compact-now always pass one.
        judge = not manual and self.count_bytes is not None and result.model != BUILTIN_MODEL
        # The input's size when the caller knows it (the tokens of bytes 0..cut,
        # from its incremental count): the turns are not tokenized again.
        known = input_tokens
        counting = self.count_text if judge and known is None else None
        material = material_of(prefix, counting)
        # Every reply is scanned before it is written, local models and an
        # operator's --summary included, and the pinned facts with it: a
        # credential never lands in MEMORY.md (an echoed one, or one a local
        # model copied). The patterns run on the block only: cheap at any size.
        scan = self.privacy.for_reply(pii=result.redacted_pii)
        # And any credential value of the summarized material the reply repeats,
        # however it is formatted there (`…`, **…**, a table): models write
        # Markdown. Only for a summarizer given the material as written (a local
        # model): the material is scanned for them, ~3 MB/s; one that saw
        # placeholders cannot repeat a value.
        material_secrets = scan.values_in_document(prefix) if result.given_as_written else ()
        scrubbed = scan.redact(result.text.strip(), material_secrets)
        self.reply_redacted = scrubbed.count
        body = scrubbed.text
        if judge and self.count_bytes is not None:
            input_tokens = material.input_tokens if known is None else known
            if result.read_tokens is not None:
                # What the model was sent (the turns cut to fit its window).
                input_tokens = min(input_tokens, result.read_tokens)
            floor = degenerate_floor(input_tokens, self.options.summary_max_tokens)
            # Counted only as far as it takes to reach the floor (exact under it).
            reply = body.encode("utf-8", "surrogateescape")
            reply_tokens = count_at_least(reply, floor, self.count_bytes)
            if reply_tokens < floor:
                raise SummarizerError(
                    f"agent {self.agent!r}: summarizer reply refused as degenerate "
                    f"({reply_tokens} tokens for {input_tokens} tokens of input); "
                    "nothing changed"
                )
        new_name = _archive_stem() + self.archive_suffix
        earlier = self._earlier_kept(material.earlier_archives, cut)
        # What a model's reply (or an operator's) dropped of the decisions, open
        # tasks, errors and people is carried verbatim; the builtin summary keeps
        # those itself, in its own sections.
        carry = carry_material(prefix) if result.model != BUILTIN_MODEL else None
        composed = compose_summary(
            body,
            pins_naming_no_credential(pins_the_scan_keeps(material.pins, scan), carry),
            pinned_tokens=self.options.pinned_tokens,
            count_text=self.count_text,
            # Same length as the final name: the size checks see the real block.
            archive="archive/" + new_name,
            earlier_archives=earlier,
            note=archive_note(self.options.retention),
            carried=lines_the_scan_keeps(carry.lines, scan) if carry is not None else (),
            carried_done=carry.done if carry is not None else frozenset(),
            block_tokens=self.summary_cap,
            max_bytes=self._shrinking_text_bytes(snap, cut) if not manual else None,
        )
        pinned = scan.redact(composed.text, material_secrets)
        if pinned.count:
            self.reply_redacted += pinned.count
            composed = dataclasses.replace(composed, text=pinned.text)
        return composed, earlier

    def _shrinking_text_bytes(self, snap: _Snapshot, cut: int) -> int | None:
        """The most bytes the block's text may take for the block to shrink the
        file (:meth:`check_summary_size`); None when that is not required."""
        if not self.options.require_shrink:
            return None
        header = snap.document.header
        replaced = cut - (len(header.raw) if header is not None else 0)
        framing = len(render_clean_summary_block("", _now_local_iso(), "v")) - 1
        # The sanitizer may quote a line or two ("> "): a little to spare.
        return replaced - framing - _SHRINK_SPARE_BYTES

    def _earlier_kept(self, earlier: int, size: int) -> int:
        """How many earlier archives the provenance line may name: with retention,
        no more than the policy keeps beside the new archive (pruned right after)."""
        limits = self.options.retention
        if not limits.active:
            return earlier
        try:
            existing = list_archives(self.pinned)
        except OSError:
            return earlier
        # The new archive's final name may differ (a same-second ``_N``): stand
        # in with one that sorts after every real archive.
        stand_in = ArchiveInfo(_NEWEST_ARCHIVE, size, time.time())
        plan = plan_prune(
            [*existing, stand_in],
            limits,
            time.time(),
            protect=(_NEWEST_ARCHIVE,),
            local_offset=local_utc_offset,
        )
        return min(earlier, len(plan.keep) - 1)

    def summarize(self, snap: _Snapshot, kept_from: int) -> tuple[SummaryResult, float]:
        # The snapshot is already parsed; its segments before K are the prefix's.
        prefix_doc = snap.document.prefix(kept_from)
        request = SummaryRequest(
            agent=self.agent,
            document=prefix_doc,
            max_tokens=self.options.summary_max_tokens,
            instructions=self.options.instructions,
            max_calls=self.options.max_calls,
            privacy=self.privacy,
        )
        started = time.monotonic()
        try:
            result = self.summarizer.summarize(request)
        except MemdError as exc:
            self.model_calls += exc.model_calls or 0
            self.model_cost_usd += exc.model_cost_usd or 0.0
            raise
        except Exception as exc:  # a summarizer bug must not take the daemon down
            raise SummarizerError(
                f"agent {self.agent!r}: summarizer failed: {type(exc).__name__}: {exc}"
            ) from exc
        elapsed = time.monotonic() - started
        self.model_calls += result.calls
        self.model_cost_usd += result.cost_usd or 0.0
        text = (result.text or "").strip()
        if not text:
            raise SummarizerError(f"agent {self.agent!r}: summarizer returned an empty summary")
        return result, elapsed

    def check_summary_size(
        self, block: bytes, snap: _Snapshot, manual: bool, cut: int, resummarized: bool = False
    ) -> None:
        """Refuse summaries that are over the cap or would not shrink the file
        (only the small summary is tokenized). ``resummarized``: the block replaces
        a summary block alone over the cap, which it must end within (held to it
        even without a tokenizer: the next run would otherwise take it again)."""
        if manual:
            return
        cap = self.summary_cap
        if (self.count_bytes is not None or resummarized) and may_exceed_cap(block, cap):
            too_long = summary_over_cap(self.count_block(block), cap)
            if too_long is not None:
                if resummarized:
                    too_long += " (a re-summary of the summary block alone, itself over it)"
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
        archive_fd, self.created_archive_dir = self.pinned.archive_fd(create=True)
        if self.created_archive_dir:
            share_with_group(archive_fd, access.dir_mode, access.gid)
        else:
            self.widened_archive_dir = widen_private_archive_dir(self.pinned, archive_fd, access)
        private_fd = self.pinned.private_fd
        plaintext = memoryview(snap.data)[:cut]  # written from the snapshot, not a copy
        name = ""
        content: bytes | memoryview
        if self.master is None:
            content = plaintext
        else:
            # Sealed in memory, with its final name: no plaintext reaches the temp.
            data_key = self.data_key or agent_data_key(self.pinned, self.master, create=True)
            assert data_key is not None
            name = _free_archive_name(archive_fd, _archive_stem(), ENCRYPTED_SUFFIX)
            content = seal_archive(data_key, name, snap.data[:cut])
        fd = create_file_at(private_fd, ARCHIVE_TEMP, [content])
        try:
            # Not .memd/'s default ACL (inherited): whom MEMORY.md's own let read.
            set_acl(fd, archive_acl(snap.acl, access))
            share_with_group(fd, access.file_mode, access.gid)
            st = os.fstat(fd)
        finally:
            os.close(fd)
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
        if name:
            os.link(
                ARCHIVE_TEMP,
                name,
                src_dir_fd=private_fd,
                dst_dir_fd=archive_fd,
                follow_symlinks=False,
            )
        else:
            name = link_unique_at(private_fd, ARCHIVE_TEMP, archive_fd, _archive_stem())
        self.archive = self.paths.archive_dir / name
        os.fsync(archive_fd)
        self.checkpoint("archive-linked")

    def swap(self, snap: _Snapshot, summary: bytes, cut: int) -> tuple[int, int]:
        """Write and install the new MEMORY.md; returns (M, new inode).

        Every step names files only inside pinned folders: the hard link and
        the replace hit MEMORY.md's inode in the folder resolved at the start,
        whatever an agent renamed or symlinked since.
        """
        pinned = self.pinned
        private_fd = pinned.private_fd
        pinned.unlink_private(DRAIN_NAME)
        # No fsync of .memd/ here: if this link is lost in a crash, the job
        # had not committed yet and recovery rolls it back without it.
        os.link(
            pinned.memory_name,
            DRAIN_NAME,
            src_dir_fd=pinned.memory_dir_fd,
            dst_dir_fd=private_fd,
            follow_symlinks=False,
        )
        self.checkpoint("drain-linked")
        # Open until the replace: the last check of the old file's bytes reads
        # through it, so it sees the inode the replace takes away, whatever an
        # agent does to the name meanwhile.
        drain_fd = pinned.open_private(DRAIN_NAME, os.O_RDONLY)
        try:
            return self._write_and_replace(snap, summary, cut, drain_fd)
        finally:
            os.close(drain_fd)

    def _write_and_replace(
        self, snap: _Snapshot, summary: bytes, cut: int, drain_fd: int
    ) -> tuple[int, int]:
        pinned = self.pinned
        private_fd = pinned.private_fd
        st = os.fstat(drain_fd)
        if (st.st_dev, st.st_ino) != (snap.dev, snap.ino):
            raise CompactionAborted(
                f"agent {self.agent!r}: MEMORY.md was replaced during compaction"
            )
        tail = read_range(drain_fd, snap.boundary, st.st_size)
        # Copy only whole entries now; the drain copies the rest, so a new
        # writer's entry can never land in the middle of a half-copied one.
        copy_until = snap.boundary + parse(tail).boundary
        header = snap.document.header
        conversation = header.conversation if isinstance(header, HeaderSegment) else self.agent
        new_header = render_header(conversation, _now_local_iso())
        from_snapshot = max(0, min(copy_until, snap.size) - snap.boundary)
        # Everything the job made from its snapshot: the raw bytes it kept
        # (cut..N, and what the snapshot held past N) included.
        self.produced = new_header + summary + snap.data[cut : snap.boundary] + tail[:from_snapshot]
        self.produced_head = len(new_header) + len(summary)
        self.produced_kept = snap.boundary - cut
        self.new_fd = create_file_at(
            private_fd,
            NEW_MEMORY_TEMP,
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
        new_st = os.fstat(self.new_fd)
        self.new_size = new_st.st_size  # where memd's own bytes end (the drain's start)
        keep_owner(self.new_fd, snap.st_mode, snap.st_uid, snap.st_gid, self.agent, snap.acl)
        self.checkpoint("new-written")
        self.journal.write(
            phase="swapping",
            archive=str(self.archive),
            copied_to=copy_until,
            new_dev=new_st.st_dev,
            new_ino=new_st.st_ino,
        )
        self.old_id = (snap.dev, snap.ino)  # the file the swap replaces (see _swapped)
        self.swapping = True  # from here on the swap may have happened
        self.checkpoint("journal-swapping")
        # The last check before the commit (DESIGN §2: re-check the prefix): the
        # old file must still hold every byte the new one carries (0..N, as the
        # summary and the archive read them, and N..copy_until), or a rewrite in
        # place (an editor, an agent's "reset memory" with open("w")) made after
        # the check right after the summary would be in neither file. Changed:
        # the job rolls back (nothing changed; the next one starts afresh).
        # What remains: a rewrite that lands after this compare has read the
        # bytes it changes and before the rename below (the compare's own
        # microseconds per MiB, then one system call) is not seen; the rename
        # cannot be made conditional on the old file's content.
        if not _still_holds(drain_fd, snap.data, snap.boundary, tail[: copy_until - snap.boundary]):
            raise CompactionAborted(
                f"agent {self.agent!r}: MEMORY.md was rewritten in place during compaction "
                "(after its summary); rolled back, nothing changed"
            )
        os.replace(
            NEW_MEMORY_TEMP,
            pinned.memory_name,
            src_dir_fd=private_fd,
            dst_dir_fd=pinned.memory_dir_fd,
        )
        os.fsync(pinned.memory_dir_fd)
        self.committed = True
        self.checkpoint("replaced")
        return copy_until, new_st.st_ino

    def _swapped(self) -> bool:
        """Whether the swap may have happened, decided by inode with recovery's rule:
        once the "swapping" journal is written, only MEMORY.md still being the old
        file proves it did not. ``committed`` is set only once the replace and its
        folder's fsync have both returned: a Ctrl-C raised as the replace returns,
        or a failed fsync, reaches the rollback after the swap, which would then
        delete the archive and the old file's last link, every summarized turn
        with them. MEMORY.md the new file, replaced again by the agent right after
        the swap, gone, or not to be looked at: all left to recovery, which keeps
        the old file as an archive where MEMORY.md is neither."""
        if not self.swapping:
            return False
        try:
            current = self.pinned.stat_memory()
        except OSError:
            return True
        return current is None or (current.st_dev, current.st_ino) != self.old_id

    def close(self) -> None:
        if self.new_fd >= 0:
            os.close(self.new_fd)
            self.new_fd = -1
        self.produced = b""  # header + summary + what the snapshot held past N

    def rollback(self) -> None:
        """Undo the job, unless its swap happened: then it is committed (see
        :meth:`_swapped`) and the "swapping" journal lets recovery finish it."""
        if self._swapped():
            self.committed = True
            return
        _rollback_files(self.pinned, self.archive_ino)
        if self.created_archive_dir:
            # Failure changes nothing: not even an empty archive folder.
            self.pinned.remove_created_archive_dir()
        elif self.widened_archive_dir is not None:
            mode, gid = self.widened_archive_dir
            archive_fd, _created = self.pinned.archive_fd(create=False)
            if archive_fd >= 0:
                with contextlib.suppress(OSError):
                    share_with_group(archive_fd, mode, gid)


def widen_private_archive_dir(
    pinned: AgentDir, archive_fd: int, access: ArchiveAccess
) -> tuple[int, int] | None:
    """Give an archive folder an older memd left private a fresh one's mode and
    group when ``access`` shares archives (:func:`widens_archive_dir`); the
    folder's (mode, group) before, or None when left as it was. Never a folder
    an archive/ symlink leads to (another folder of the agent's, memd's own
    .memd/): its mode is not the archive folder's to set."""
    st = os.fstat(archive_fd)
    mode = stat.S_IMODE(st.st_mode)
    if not widens_archive_dir(access, mode, st.st_uid, os.geteuid(), has_acl(archive_fd)):
        return None
    if not pinned.is_archive_dir_itself(archive_fd):
        return None
    share_with_group(archive_fd, access.dir_mode, access.gid)
    return mode, st.st_gid


def _rollback_files(pinned: AgentDir, archive_ino: int | None) -> None:
    """Undo an uncommitted job: its archive (found by inode), temps, link; idle journal."""
    if archive_ino is not None:
        _remove_archive_by_inode(pinned, archive_ino)
    for leftover in _TEMP_NAMES:
        pinned.unlink_private(leftover)
    if pinned.private_exists(JOURNAL_NAME):
        _Journal(pinned).clear()


def _remove_archive_by_inode(pinned: AgentDir, inode: int) -> None:
    archive_fd, _created = pinned.archive_fd(create=False)
    if archive_fd < 0:
        return
    removed = False
    with os.scandir(archive_fd) as entries:
        for entry in entries:
            try:
                if entry.inode() == inode and entry.is_file(follow_symlinks=False):
                    os.unlink(entry.name, dir_fd=archive_fd)
                    removed = True
            except FileNotFoundError:
                continue
    if removed:
        os.fsync(archive_fd)


def _drain(
    pinned: AgentDir,
    journal: _Journal,
    new_fd: int,
    copied_to: int,
    quiet_s: float,
    max_s: float,
    poll_s: float,
    checkpoint: Checkpoint,
    own_end: int = -1,
) -> None:
    """Move bytes appended to the old inode past ``copied_to`` into the new file.

    Only while the new file ends where an entry may start (:func:`_at_entry_end`;
    ``own_end``: its size as memd made it, an end whatever its last bytes are): an
    agent writing a turn to the new file in more than one ``write`` (a header,
    then the text; a shell appending line by line) is waited for, so a late turn
    never lands inside it. Within the drain's bounds (twice ``max_s`` plus
    ``quiet_s`` from its start); past them the late turns go in at once: a turn
    still half-written then is most likely a writer that died mid-turn, and
    holding the late turns back would keep the job (and every later one of the
    agent, whose recovery drains first) from finishing. They then follow the torn
    turn, which was torn already (README, the compaction's step 7).

    Each chunk is journaled as pending (range + hash) before it is appended,
    so a crash mid-append is resolved on recovery by looking for the chunk.
    Appends go through ``new_fd``, the new file's own fd (opened when it was
    created, or checked by inode on recovery): never through a path, which an
    agent could point elsewhere between two chunks.
    """
    try:
        fd = pinned.open_private(DRAIN_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return
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
                overdue = now - started >= 2 * max_s + quiet_s
                if take > 0 and not overdue and not _at_entry_end(new_fd, own_end):
                    # An agent is mid-turn in the new file: wait for its end.
                    # What remains: a turn it starts between this look and the
                    # append below (one system call apart) is not waited for.
                    time.sleep(poll_s)
                    continue
                if take > 0:
                    piece = chunk[:take]
                    pending_at = os.fstat(new_fd).st_size
                    journal.write(
                        phase="draining",
                        copied_to=copied_to,
                        pending_to=copied_to + take,
                        pending_sha256=hashlib.sha256(piece).hexdigest(),
                        # Where the new file ended before this append: on
                        # recovery the chunk can only be found past it.
                        pending_at=pending_at,
                    )
                    try:
                        _append(new_fd, piece)
                    except ShortWrite as short:
                        # What stayed in the new file is copied (never appended
                        # twice); an undone piece is not: the next run appends it whole.
                        journal.write(
                            phase="draining", copied_to=copied_to + short.written, pending_to=None
                        )
                        if short.written:
                            raise OSError(
                                short.errno,
                                f"{describe_error(short, with_file=False)} part-way through "
                                f"a late turn, and an agent appended to MEMORY.md before memd "
                                f"could undo it: the turn's first {short.written} bytes stay "
                                "there, split from the rest by the agent's append (no byte "
                                "lost or doubled; the rest follows when the drain finishes)",
                            ) from short
                        raise
                    copied_to += take
                    journal.write(phase="draining", copied_to=copied_to, pending_to=None)
                    # Memd's own end (the piece's last bytes may be a torn turn's,
                    # on the final pass) unless an agent appended right after it.
                    landed_end = pending_at + take
                    own_end = landed_end if os.fstat(new_fd).st_size == landed_end else -1
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


def _at_entry_end(fd: int, own_end: int) -> bool:
    """Whether the new file (``fd``) ends where an entry may start: after an entry's
    terminator (``\n\n---\n\n``, CRLF alike, empty lines after it too), or where
    memd's own last write left it (``own_end``, -1: unknown). A terminator's first
    half (``---\n``) is no end: its writer is mid-write."""
    size = os.fstat(fd).st_size
    if size == own_end:
        return True
    look = 4 * len(BLOCK_TERMINATOR)
    tail = os.pread(fd, look, max(0, size - look)).replace(b"\r\n", b"\n")
    body = tail.rstrip(b"\n")
    return body.endswith(BLOCK_TERMINATOR[:-2]) and len(tail) - len(body) >= 2


def _append(fd: int, data: bytes) -> None:
    """Append ``data`` (whole late turns, or the final pass's rest) durably to the new
    file's O_APPEND fd, which live agents append to too: whole, or not at all
    whenever memd can make it so.

    One ``write`` for the piece: two would let an agent's append land between
    them, inside a turn. A write that lands only part of it (ENOSPC, a quota, a
    file size limit) is undone with ``ftruncate`` to the size before it, but only
    when the file is exactly that size plus what landed: no agent appended since,
    so the cut takes nothing but memd's own bytes. Then :class:`ShortWrite` says
    0 landed and the caller retries the whole piece later. Otherwise what landed
    stays (cutting there would cut the agent's turn after it): ShortWrite says how
    much, the caller journals it as copied (never a byte twice) and reports the
    split turn.

    The size check and the truncate are two calls: no call truncates only at a
    given size. An agent's append landing in the microseconds between them would
    be cut; it would need the very room this write just failed to find, freed in
    that instant (the README says so under the compaction's steps).
    """
    before = os.fstat(fd).st_size
    try:
        landed = os.write(fd, data)
    except OSError as exc:
        raise ShortWrite(exc, 0) from exc  # a failed write() lands nothing
    if landed < len(data):
        undone = landed > 0 and os.fstat(fd).st_size == before + landed
        if undone:
            os.ftruncate(fd, before)
            os.fsync(fd)
        reason = (
            f"short write ({landed} of {len(data)} bytes{', undone' if undone else ''}: "
            "no space left on the device, or a quota or file size limit reached)"
        )
        raise ShortWrite(OSError(errno.ENOSPC, reason), 0 if undone else landed)
    os.fsync(fd)


def _finish(pinned: AgentDir, checkpoint: Checkpoint) -> None:
    # Order matters: the journal goes idle last, so a crash in between leaves
    # a committed journal whose drain has nothing left to move (idempotent).
    # The archive temp goes before the drain link: with no journal to read,
    # recovery takes a temp still linked into archive/ without a drain link for
    # a job that had not swapped yet (see _recover_unreadable).
    for leftover in (ARCHIVE_TEMP, DRAIN_NAME, NEW_MEMORY_TEMP):
        pinned.unlink_private(leftover)
    remove_staging(pinned)
    _Journal(pinned).clear()
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
    archive dir are as they were. On success the outcome names the archive
    committed and what retention pruned, for the caller to hand on.
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
    try:
        pinned = AgentDir.open(paths)
    except WorkspaceError as exc:
        raise CompactionAborted(str(exc)) from None
    with pinned:
        lock = AgentLock(paths.lock, paths.agent, dir_fd=pinned.private_fd)
        with lock.held(opts.lock_wait_s):
            hook("locked")
            return _compact_locked(
                pinned,
                summarizer,
                opts,
                count_bytes,
                hook,
                threshold,
                manual,
                measure_tokens,
                started,
            )


def _compact_locked(
    pinned: AgentDir,
    summarizer: Summarizer,
    opts: CompactionOptions,
    count_bytes: ByteCounter | None,
    hook: Checkpoint,
    threshold: ThresholdCheck | None,
    manual: bool,
    measure_tokens: bool,
    started: float,
) -> CompactionOutcome:
    paths = pinned.paths
    try:
        pinned.pin_memory()
        # A symlinked archive/ is refused now, before a summary is paid for.
        pinned.archive_fd(create=False)
    except WorkspaceError as exc:
        raise CompactionAborted(str(exc)) from None
    counted: TrackedCount | None = None
    if threshold is not None and count_bytes is not None:
        # The lock may have been held by another compactor (compact-now, a
        # second daemon) that just did the work: check before summarizing.
        counted = check_still_over(pinned, threshold, count_bytes)
    _recover_locked(
        pinned,
        quiet_s=opts.drain_quiet_s,
        max_s=opts.drain_max_s,
        key_file=opts.key_file,
        audit=opts.audit,
    )
    txn = _Transaction(pinned, summarizer, opts, count_bytes, hook)
    try:
        restarts = 0
        while True:
            snap = txn.take_snapshot()
            snap_count = snapshot_count(snap, counted, count_bytes, afresh=restarts > 0)
            known = txn.known_suffixes(snap, snap_count)
            # The newest turns stay verbatim (an operator's --summary replaces
            # everything, as given): bytes 0..K are compacted, K..N carried.
            kept_from, kept_tokens = (
                (snap.boundary, 0)
                if manual
                else kept_tail(
                    snap.document, snap.boundary, opts.keep_recent_tokens, txn.count_text, known
                )
            )
            prefix = snap.document.prefix(kept_from)
            # A summary block alone (no raw entry since it) is compacted only when
            # an operator's --summary replaces it or it is over its budget.
            resummarized = not has_compactable(prefix)
            if resummarized and not txn.replaces_lone_summary(prefix, manual):
                kept = (
                    f" beyond the newest {opts.keep_recent_tokens:,} tokens kept verbatim"
                    if kept_from < snap.boundary
                    else ""
                )
                reason = nothing_to_compact_reason(snap.document, kept)
                raise NothingToCompact(f"agent {paths.agent!r}: {reason}", reason=reason)
            result, llm_s = txn.summarize(snap, kept_from)
            hook("summarized")
            if txn.prefix_unchanged(snap):
                break
            restarts += 1
            if restarts > opts.max_restarts:
                raise CompactionAborted(
                    f"agent {paths.agent!r}: MEMORY.md was rewritten during compaction "
                    f"{restarts} times; giving up"
                )
        cut = txn.cut_of(snap, result, kept_from)
        tokens_before = None
        if snap_count is not None:
            tokens_before = snap_count.tokens
        elif count_bytes is not None and measure_tokens:
            tokens_before = snapshot_tokens(snap.data, snap.dev, snap.ino, counted, count_bytes)
        composed, earlier = txn.compose(
            snap,
            result,
            manual,
            cut,
            _summarized_tokens(snap, cut, kept_from, tokens_before, known, kept_tokens),
        )
        stamp = _now_local_iso()
        # The last line names the archive: checked with a stand-in name of the
        # same length, written with the final one; the rest is sanitized once.
        head, _newline, stand_in = composed.text.rpartition("\n")
        clean = sanitize_summary(head)
        txn.check_summary_size(
            render_clean_summary_block(clean, stamp, stand_in), snap, manual, cut, resummarized
        )
        try:
            txn.write_archive(snap, cut)
            assert txn.archive is not None
            provenance = version_line(f"archive/{txn.archive.name}", earlier)
            block = render_clean_summary_block(clean, stamp, provenance)
            copied_to, _new_ino = txn.swap(snap, block, cut)
        except BaseException as exc:
            if not txn.committed:
                txn.rollback()
                if txn.committed and isinstance(exc, OSError):
                    # Who finishes it is the caller's to say (the daemon's runner,
                    # compact-now's retry): not part of what happened.
                    raise CommittedUnfinished(
                        f"agent {paths.agent!r}: compaction committed ({txn.archive}) but "
                        f"did not finish: {describe_error(exc)}"
                    ) from exc
                if isinstance(exc, OSError):
                    raise CompactionAborted(
                        f"agent {paths.agent!r}: compaction rolled back: {describe_error(exc)}"
                    ) from exc
            raise
        # The "swapping" journal (new inode, copied_to) already lets recovery
        # roll forward; the drain journals again only if it moves bytes.
        hook("journal-draining")
        try:
            _drain(
                pinned,
                txn.journal,
                txn.new_fd,
                copied_to,
                opts.drain_quiet_s,
                opts.drain_max_s,
                opts.drain_poll_s,
                hook,
                own_end=txn.new_size,
            )
            _finish(pinned, hook)
        except OSError as exc:
            # Past the commit point nothing can be rolled back; the journal
            # keeps the drain offsets and the next run finishes it.
            raise CommittedUnfinished(
                f"agent {paths.agent!r}: compaction committed ({txn.archive}) but moving "
                f"late appends failed: {describe_error(exc)}"
            ) from exc
        assert txn.archive is not None
        pruned, prune_error = _prune_after_commit(pinned, opts, txn.archive.name)
        tokens_after = tokens_produced = tokens_appended = None
        new_count: TrackedCount | None = None
        if count_bytes is not None and measure_tokens:
            tokens_produced, head_tokens = _produced_tokens(
                txn, count_bytes, opts, cut, kept_from, kept_tokens
            )
            with contextlib.suppress(OSError):
                now_bytes = read_to_end(txn.new_fd)
                new_st = os.fstat(txn.new_fd)
                if head_tokens is not None and known:
                    new_count = _new_file_count(
                        NewFile(now_bytes, new_st.st_dev, new_st.st_ino, new_st.st_mtime_ns),
                        txn.produced_head,
                        head_tokens,
                        Kept(kept_from, snap.boundary, kept_tokens, known),
                        count_bytes,
                    )
                if now_bytes == txn.produced:
                    # Nothing was appended while the job ran: the same bytes.
                    tokens_after, tokens_appended = tokens_produced, 0
                else:
                    tokens_after = count_bytes(now_bytes) if new_count is None else new_count.tokens
                    tokens_appended = count_bytes(now_bytes[len(txn.produced) :])
        assert txn.archive is not None
        return CompactionOutcome(
            archive=txn.archive,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            tokens_produced=tokens_produced,
            model=result.model,
            # Every summary's, when the file was rewritten during one.
            cost_usd=None if result.cost_usd is None else txn.model_cost_usd,
            duration_s=time.monotonic() - started,
            llm_duration_s=llm_s,
            pinned=composed.pinned,
            evicted=composed.evicted,
            carried=composed.carried,
            # Short of what was meant to be summarized (the newest turns kept verbatim
            # by design are no shortfall): the summarizer stopped at its call budget.
            partial=cut < kept_from,
            calls=txn.model_calls,
            tokens_appended=tokens_appended,
            pruned=pruned,
            prune_error=prune_error,
            redacted=result.redacted,
            reply_redacted=txn.reply_redacted,
            counted=new_count,
        )
    except MemdError as exc:
        # A failure after (or during) a summary carries what it spent.
        exc.model_calls = txn.model_calls
        exc.model_cost_usd = txn.model_cost_usd
        raise
    except OSError as exc:
        # Said as compact_agent says it, with what was spent.
        aborted = CompactionAborted(f"agent {paths.agent!r}: {describe_error(exc)}")
        aborted.model_calls = txn.model_calls
        aborted.model_cost_usd = txn.model_cost_usd
        raise aborted from exc
    finally:
        txn.close()


def _summarized_tokens(
    snap: _Snapshot,
    cut: int,
    kept_from: int,
    snapshot_tokens: int | None,
    known: Sequence[tuple[int, int]],
    kept_tokens: int,
) -> int | None:
    """The tokens of the part summarized (snapshot bytes 0..cut) when the count tells
    them: the snapshot's when all of it was; else, from the count's exact points
    (the first is offset 0: the tokens up to N), those up to N less the kept
    turns' (K is an entry start: counts add up there) when the summary reaches K.
    None: the summary material counts its turns."""
    if cut == snap.size:
        return snapshot_tokens
    if known and known[0][0] == 0 and cut == kept_from:
        return known[0][1] - kept_tokens
    return None


def _produced_tokens(
    txn: _Transaction,
    count_bytes: ByteCounter,
    opts: CompactionOptions,
    cut: int,
    kept_from: int,
    kept_tokens: int,
) -> tuple[int, int | None]:
    """Tokens of what the job produced: header + summary block + the kept turns + what
    the snapshot held past N. The kept turns' tokens are the ones the kept-tail walk
    counted, when entries add up (every piece here starts an entry after a newline).
    Also the header and summary block's own tokens (None when not counted apart)."""
    produced = txn.produced
    kept_end = txn.produced_head + txn.produced_kept
    past = produced[kept_end:]
    if not opts.entries_add_up or cut != kept_from or (past and not past.startswith(b"#")):
        # (Bytes past N that start no entry: the sum would not be exact there.)
        return count_bytes(produced), None
    head = count_bytes(produced[: txn.produced_head])
    return head + kept_tokens + (count_bytes(past) if past else 0), head


@dataclass(frozen=True, slots=True)
class NewFile:
    """The new MEMORY.md as the job left it (read back after the drain)."""

    data: bytes
    dev: int
    ino: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class Kept:
    """The turns the job kept verbatim: snapshot bytes ``start``..``end`` (K..N), their
    tokens, and the snapshot count's exact points (``(offset, tokens of offset..N)``)."""

    start: int
    end: int
    tokens: int
    known: Sequence[tuple[int, int]]


def _new_file_count(
    new: NewFile, head_size: int, head_tokens: int, kept: Kept, count_bytes: ByteCounter
) -> TrackedCount:
    """The new file's count, from what the job knows of it: header + summary block
    (``head_size`` bytes, ``head_tokens``), the kept turns, then what the snapshot
    held past N and the late appends. Only for encodings where entries add up.

    The new file's bytes from ``head_size`` on are the snapshot's from K on, so the
    snapshot count's exact points inside the kept turns hold in it too (moved by
    ``head_size - K``; a point is a safe boundary or a junction cut, both decided
    by the bytes around it, and the byte before K and before the head's end are
    both a newline): the count resumes from the newest of them, tokenizing only
    what follows it (the old count's unsettled tail and the appends), and keeps the
    ones before it as its marks. Without such a point it resumes where the kept
    turns start (a junction cut: an entry starts there), or, with nothing after
    the head, from the head's last safe boundary; else (bytes after the head that
    start no entry) it counts the new file from scratch.
    """
    shift = head_size - kept.start
    marks: list[int] = []
    for offset, tokens in kept.known:
        # Points at N or past it are left out: the bytes after N are the live file's.
        if kept.start <= offset < kept.end:
            marks += [offset + shift, head_tokens + kept.tokens - tokens]
    if not new.data.endswith(b"\n", 0, head_size):  # (a summary block always does)
        return count_data(new.data, new.dev, new.ino, new.mtime_ns, None, count_bytes)[0]
    if marks:
        resume_at, resume_tokens = marks[-2], marks[-1]
    elif new.data[head_size : head_size + 1] == b"#":
        resume_at, resume_tokens = head_size, head_tokens
    elif len(new.data) == head_size and (cut := last_safe_boundary(new.data)) > 0:
        # Nothing after the head: its last safe boundary, the head's tokens less
        # those of the few bytes after it.
        resume_at, resume_tokens = cut, head_tokens - count_bytes(new.data[cut:])
    else:
        return count_data(new.data, new.dev, new.ino, new.mtime_ns, None, count_bytes)[0]
    seed = TrackedCount(
        CountState(new.dev, new.ino, resume_at, resume_at, resume_tokens, 0),
        new.mtime_ns,
        max(0, resume_at - WINDOW_BYTES),
        None,  # trusted: these bytes were just written
        marks=tuple(marks),
    )
    return count_data(new.data, new.dev, new.ino, new.mtime_ns, seed, count_bytes)[0]


def _prune_after_commit(
    pinned: AgentDir, opts: CompactionOptions, archive_name: str
) -> tuple[PruneResult | None, str | None]:
    """Retention right after the commit, still under the lock; never the new archive."""
    if not opts.retention.active:
        return None, None
    try:
        pruned = prune_locked(pinned, opts.retention, time.time(), protect=(archive_name,))
    except OSError as exc:
        return None, describe_error(exc)
    return pruned, None


def prune_agent(
    paths: AgentPaths,
    limits: RetentionLimits,
    *,
    now: float | None = None,
    dry_run: bool = False,
    lock_wait_s: float = 300.0,
    quiet_s: float = 1.0,
    max_s: float = 10.0,
    key_file: Path | None = None,
    audit: AuditSink | None = None,
) -> PruneResult:
    """Apply ``limits`` to the agent's archives now (``memd prune``, the daemon's daily pass).

    Takes the agent's compaction lock (serialized with any compaction) and first
    finishes or rolls back a crashed compaction, so a journal never names an
    archive this deleted. A dry run reads only: no lock, nothing created.
    The caller hands on what was deleted (the recall index drops it) after the
    lock is let go.
    """
    when = time.time() if now is None else now
    with AgentDir.open(paths, create_private=not dry_run) as pinned:
        if dry_run:
            return prune_locked(pinned, limits, when, dry_run=True)
        lock = AgentLock(paths.lock, paths.agent, dir_fd=pinned.private_fd)
        with lock.held(lock_wait_s):
            pinned.pin_memory()
            _recover_locked(pinned, quiet_s=quiet_s, max_s=max_s, key_file=key_file, audit=audit)
            return prune_locked(pinned, limits, when)


def recover_agent(
    paths: AgentPaths,
    wait_s: float = 0.0,
    quiet_s: float = 1.0,
    max_s: float = 10.0,
    *,
    key_file: Path | None = None,
    busy_raises: bool = False,
    audit: AuditSink | None = None,
) -> str | None:
    """Finish or roll back a crashed (or committed but unfinished) compaction of
    ``paths.agent``.

    ``key_file`` (encryption at rest): the master key, for the one case where
    recovery writes an archive itself (MEMORY.md replaced while memd was down).
    ``audit``: where an erasure it finishes is recorded (:func:`finished_an_erasure`).

    Returns a description of what was done, or None when there was nothing to
    do (or another process holds the lock and is doing it; with ``busy_raises``
    that is :class:`LockTimeout` instead, for a caller that must know the job
    was finished: every holder of the lock finishes it first, but may not have
    yet).
    """
    if not paths.private_dir.is_dir():
        return None
    with AgentDir.open(paths, create_private=False) as pinned:
        if pinned.private_fd < 0:
            return None
        lock = AgentLock(paths.lock, paths.agent, dir_fd=pinned.private_fd)
        try:
            lock.acquire(wait_s)
        except MemdError:
            if busy_raises:
                raise
            return None
        try:
            pinned.pin_memory()
            return _recover_locked(
                pinned, quiet_s=quiet_s, max_s=max_s, key_file=key_file, audit=audit
            )
        finally:
            lock.release()


def journal_unfinished(paths: AgentPaths) -> bool:
    """Whether the agent's compaction journal holds a job (any phase but idle): a
    compaction or erasure that crashed, is at work, or committed and did not
    finish. Reads the journal only (no lock, nothing created: a compactor at
    work shows too, its caller tells them apart by trying the lock); no
    ``.memd/`` or no journal is idle, a journal whose records are all damaged is
    a job (recovery's reading, :func:`_recover_locked`). OSError when it cannot
    be read (the caller judges)."""
    journal = SlotJournal(paths.journal)
    payload = journal.read()
    if payload is None:
        if journal.exists():
            return True  # damaged: recovery decides from the files (_recover_unreadable)
        # A first build's journal, left behind: recovery reads it.
        return (paths.private_dir / LEGACY_JOURNAL_NAME).exists()
    return payload.get("phase") != IDLE_PHASE


class AuditSink(Protocol):
    """Where recovery records an erasure it finished (:class:`memd.audit.AuditLog`)."""

    def record(
        self, event: AuditEvent | str, agent: str | None = None, **fields: object
    ) -> bool: ...


def record_recovered_erasure(audit: AuditSink, agent: str) -> bool:
    """The record of an erase-by-pattern (``memd forget AGENT --match``) that a
    crash left committed and recovery finished: the event a finished erasure
    writes, marked ``recovered``, with nothing recovery cannot know (no counts,
    never the pattern or what it matched)."""
    return audit.record(AuditEvent.ERASE_MATCH, agent, recovered=True)


# How recovery's description of a job it finished begins when the job was an
# erase-by-pattern (`memd forget AGENT --match`), committed before the crash.
ERASE_FINISHED = "finished an interrupted erasure"


def finished_an_erasure(done: str | None) -> bool:
    """Whether recovery's description ``done`` says it finished an erasure."""
    return done is not None and done.startswith(ERASE_FINISHED)


def _recover_locked(
    pinned: AgentDir,
    quiet_s: float,
    max_s: float,
    key_file: Path | None = None,
    audit: AuditSink | None = None,
) -> str | None:
    done = _recover_job(pinned, quiet_s, max_s, key_file)
    if audit is not None and finished_an_erasure(done):
        # As the erasure itself would have, had it not been cut short.
        record_recovered_erasure(audit, pinned.paths.agent)
    return done


def _recover_job(
    pinned: AgentDir, quiet_s: float, max_s: float, key_file: Path | None
) -> str | None:
    legacy = _legacy_journal(pinned)
    if legacy is not None:
        payload = legacy
    elif pinned.private_exists(JOURNAL_NAME):
        journal_file = SlotJournal(pinned.paths.journal, dir_fd=pinned.private_fd)
        read = journal_file.read()
        if read is None:
            return _recover_unreadable(pinned, quiet_s, max_s, key_file)
        payload = read
    else:
        payload = {"phase": IDLE_PHASE}
    phase = payload.get("phase")
    if phase == IDLE_PHASE:
        # No job in flight: any temp or link is from a job that never reached
        # its first journal write, so nothing outside .memd/ was touched.
        leftovers = [name for name in _TEMP_NAMES if pinned.unlink_private(name)]
        # An erase-by-pattern's staging that never reached its journal write.
        stale = len(leftovers) + remove_staging(pinned)
        return f"removed {stale} stale temp file(s)" if stale else None
    version = payload.get("version", 1)
    if isinstance(version, int) and version > _NEWEST_READABLE:
        raise CompactionAborted(
            f"agent {pinned.paths.agent!r}: the compaction journal has format {version}, "
            f"newer than this memd reads ({_NEWEST_READABLE}); finish it with the newer memd"
        )
    journal = _Journal(pinned, payload, version if isinstance(version, int) else JOURNAL_VERSION)
    old_id = (payload.get("old_dev"), payload.get("old_ino"))
    new_id = (payload.get("new_dev"), payload.get("new_ino"))
    if phase == ERASE_PHASE:
        # An erase-by-pattern committed (its journal says so): finish its
        # archive renames and its MEMORY.md swap; the drain below finishes it.
        apply_staged(pinned)
        if payload.get("new_ino") is None:
            _finish(pinned, _no_checkpoint)
            return f"{ERASE_FINISHED} (archives rewritten)"
        _replace_with_staged_memory(pinned, old_id, new_id)
        phase = "swapping"
    current = pinned.stat_memory()
    current_id = (current.st_dev, current.st_ino) if current is not None else None
    archive_ino = payload.get("archive_ino")

    action = recovery_action(phase, current_id, old_id, new_id)
    if action is RecoveryAction.ROLL_BACK:
        # Crashed before the replace: MEMORY.md still holds everything.
        _rollback_files(pinned, archive_ino if isinstance(archive_ino, int) else None)
        return f"rolled back an interrupted compaction (phase {phase})"
    if action is RecoveryAction.ROLL_FORWARD:
        new_fd = pinned.open_memory(os.O_RDWR | os.O_APPEND)
        try:
            st = os.fstat(new_fd)
            if (st.st_dev, st.st_ino) != new_id or not stat.S_ISREG(st.st_mode):
                raise CompactionAborted(
                    f"agent {pinned.paths.agent!r}: MEMORY.md changed during recovery; retry"
                )
            copied_to = int(payload.get("copied_to", 0))
            pending_to = payload.get("pending_to")
            if isinstance(pending_to, int):
                copied_to = _resolve_pending(pinned, new_fd, copied_to, pending_to, payload)
                journal.write(phase="draining", copied_to=copied_to, pending_to=None)
            _drain(pinned, journal, new_fd, copied_to, quiet_s, max_s, 0.05, _no_checkpoint)
        finally:
            os.close(new_fd)
        _finish(pinned, _no_checkpoint)
        job = ERASE_FINISHED if payload.get("erase") else "finished an interrupted compaction"
        return f"{job} (drained the old file)"
    # MEMORY.md is neither the old nor the new inode: someone replaced (or
    # removed) it while memd was down. Keep every byte, each once: the old
    # inode's whole content becomes the archive, in place of this job's
    # archive (which holds its first N bytes only). Not after an erasure: the
    # old inode holds what was erased.
    if payload.get("erase"):
        _finish(pinned, _no_checkpoint)
        return f"{ERASE_FINISHED}: MEMORY.md was replaced meanwhile; dropped the old file"
    if pinned.private_exists(DRAIN_NAME):
        if isinstance(archive_ino, int):
            _remove_archive_by_inode(pinned, archive_ino)
        archive_fd, _created = pinned.archive_fd(create=True)
        master = None if key_file is None else read_master_key(key_file)
        _archive_drain(pinned, archive_fd, master, journal)
        os.fsync(archive_fd)
    _finish(pinned, _no_checkpoint)
    return (
        "MEMORY.md was replaced by another program during an interrupted compaction; "
        "kept the old file as an archive"
    )


def _legacy_journal(pinned: AgentDir) -> dict[str, Any] | None:
    """The job a first build's plain-JSON journal (``.memd/journal.json``, format 1)
    records, moved into the slot journal; None when there is none to take.

    Moved first (the slot journal written durably, then the old file removed), so
    the job is recovered like any other. Once the slot journal exists, a memd that
    writes it has run a job on this agent since the old file was left: that file
    is stale (or was moved already) and is only removed. An old file that cannot be
    read is a damaged journal: the files decide (:func:`_recover_unreadable`)."""
    if not pinned.private_exists(LEGACY_JOURNAL_NAME):
        return None
    payload: dict[str, Any] | None = None
    if not pinned.private_exists(JOURNAL_NAME):
        fd = pinned.open_private(LEGACY_JOURNAL_NAME, os.O_RDONLY)
        try:
            raw = read_to_end(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(ValueError):
            loaded = json.loads(raw)
            if isinstance(loaded, dict) and isinstance(loaded.get("phase"), str):
                payload = loaded
        if payload is not None:
            SlotJournal(pinned.paths.journal, dir_fd=pinned.private_fd).write(payload)
        else:
            # Damaged: an empty slot journal stands for it (read as damaged, so this
            # recovery and any after a crash in it decide from the files).
            os.close(pinned.open_private(JOURNAL_NAME, os.O_WRONLY | os.O_CREAT))
    for name in (LEGACY_JOURNAL_NAME, LEGACY_JOURNAL_NAME + ".tmp"):
        pinned.unlink_private(name)
    os.fsync(pinned.private_fd)
    return payload


def _recover_unreadable(
    pinned: AgentDir, quiet_s: float, max_s: float, key_file: Path | None
) -> str | None:
    """Recovery when no journal record can be read (both slots damaged: a power
    loss on a file system that does not order data). Decided from the files, never
    by taking the job for rolled back:

    * ``.memd/drain.md`` is not MEMORY.md's inode (or MEMORY.md is gone): the swap
      happened (or another program replaced MEMORY.md). The drain offsets are lost,
      so the old file is kept whole as an archive, in place of the job's own
      archive when the archive temp still names it: late turns in it stay, the
      turns kept verbatim may then be in MEMORY.md as well (doubled, never lost);
    * else MEMORY.md is the file the job started from and holds every turn: the
      job's archive (the archive temp's inode, while it is linked into archive/;
      :func:`_finish` unlinks the temp before the drain link) and its temps go.
    """
    journal_name = f".memd/{JOURNAL_NAME}"
    # An erase-by-pattern's manifest: the job was an erasure, whose archives are
    # staged beside it. Whatever is decided below may keep what it was to erase
    # (the old file whole, or its staging rolled back), so the operator is told
    # to run it again: the next run erases it where it is.
    erasing = pinned.private_exists(MANIFEST_NAME)
    rerun = (
        "; an erasure (memd forget --match) was under way and what it was to erase may "
        "still be there: run the same memd forget --match again"
        if erasing
        else ""
    )
    current = pinned.stat_memory()
    current_id = (current.st_dev, current.st_ino) if current is not None else None
    drain = _stat_private(pinned, DRAIN_NAME)
    temp = _stat_private(pinned, ARCHIVE_TEMP)
    archive_ino = temp.st_ino if temp is not None and temp.st_nlink > 1 else None
    if drain is not None and current_id != (drain.st_dev, drain.st_ino):
        # Journaled as a job whose MEMORY.md is neither the old nor the new file:
        # the recovery below (and any after a crash in it) keeps the old file.
        _Journal(pinned).write(
            phase="swapping",
            old_dev=drain.st_dev,
            old_ino=drain.st_ino,
            new_dev=None,
            new_ino=None,
            archive_ino=archive_ino,
        )
        _recover_locked(pinned, quiet_s, max_s, key_file)
        return (
            f"the compaction journal {journal_name} was unreadable and MEMORY.md had been "
            "swapped: kept the old file whole as an archive (late turns included)" + rerun
        )
    _rollback_files(pinned, archive_ino)
    remove_staging(pinned)
    return (
        f"the compaction journal {journal_name} was unreadable; MEMORY.md had not been "
        "swapped and holds every turn: removed the job's archive and temp files" + rerun
    )


def _stat_private(pinned: AgentDir, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=pinned.private_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _archive_drain(
    pinned: AgentDir, archive_fd: int, master: MasterKey | None, journal: _Journal
) -> None:
    """Keep the old inode's whole content as an archive: a copy (sealed when
    ``master``), made with an archive's mode and group, never a link to the old
    inode itself. That inode is the agent's file: its owner and mode (group-
    writable, say), and any writer still holding it open would go on appending
    to an archive."""
    fd = pinned.open_private(DRAIN_NAME, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        access = archive_access(st.st_mode, st.st_gid)
        acl = archive_acl(read_acl(fd), access)
        widen_private_archive_dir(pinned, archive_fd, access)
        if master is None:
            name = _free_archive_name(archive_fd, _archive_stem(), PLAIN_SUFFIX)
            # Streamed in bounded pieces (iter_range's 1 MiB): the old file may be
            # far larger than memory allows twice (reading it whole, then writing
            # it, held it once as chunks and once joined). A failure part-way (ENOSPC)
            # removes the temp: the next recovery copies from byte 0 again into a
            # fresh one, and the link below is made only from a whole copy.
            temp = create_file_at(pinned.private_fd, ARCHIVE_TEMP, iter_range(fd, 0))
        else:
            # The sealed format is one AEAD message (as the compaction's own archive):
            # the plaintext is held once (one read of the size fstat gives, no join).
            data_key = agent_data_key(pinned, master, create=True)
            assert data_key is not None
            name = _free_archive_name(archive_fd, _archive_stem(), ENCRYPTED_SUFFIX)
            data = _read_whole(fd, st.st_size)
            temp = create_file_at(
                pinned.private_fd, ARCHIVE_TEMP, [seal_archive(data_key, name, data)]
            )
            del data
    finally:
        os.close(fd)
    try:
        set_acl(temp, acl)
        share_with_group(temp, access.file_mode, access.gid)
        copy_ino = os.fstat(temp).st_ino
    finally:
        os.close(temp)
    # Journaled first: a crash after the link and a second recovery remove this
    # link by inode before making it again (never archived twice).
    journal.write(archive_ino=copy_ino)
    os.link(
        ARCHIVE_TEMP,
        name,
        src_dir_fd=pinned.private_fd,
        dst_dir_fd=archive_fd,
        follow_symlinks=False,
    )
    pinned.unlink_private(ARCHIVE_TEMP)


def _read_whole(fd: int, size: int) -> bytes:
    """The file's bytes in one piece: one read of ``size`` (what ``fstat`` gave), then
    whatever was appended since (or a short read left), in chunks: the whole is
    held once, never as chunks plus their join."""
    data = os.pread(fd, size, 0) if size else b""
    rest = b"".join(iter_range(fd, len(data)))
    return data + rest if rest else data


def _replace_with_staged_memory(pinned: AgentDir, old_id: object, new_id: object) -> None:
    """Recovery of a committed erase that crashed before its MEMORY.md replace."""
    current = pinned.stat_memory()
    if current is None or (current.st_dev, current.st_ino) != old_id:
        return
    try:
        staged = os.stat(NEW_MEMORY_TEMP, dir_fd=pinned.private_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if (staged.st_dev, staged.st_ino) != new_id:
        return
    os.replace(
        NEW_MEMORY_TEMP,
        pinned.memory_name,
        src_dir_fd=pinned.private_fd,
        dst_dir_fd=pinned.memory_dir_fd,
    )
    os.fsync(pinned.memory_dir_fd)


def keep_owner(fd: int, mode: int, uid: int, gid: int, agent: str, acl: bytes | None) -> None:
    """Give a new MEMORY.md (through its fd) the old one's mode, POSIX ACL (``acl``;
    None: none), owner and group.

    Agents may run under other UIDs: the re-seeded file must stay appendable by
    them. Through the fd: the temp's name is in memd's folder, but an fd cannot
    be redirected at all. The ACL replaces the one the temp inherited from
    ``.memd/``'s default ACL: a user the agent took off MEMORY.md's ACL stays off.
    """
    set_acl(fd, acl)
    os.fchmod(fd, stat.S_IMODE(mode))
    if (uid, gid) == (os.geteuid(), os.getegid()):
        return
    try:
        os.fchown(fd, uid, gid)
    except PermissionError:
        with contextlib.suppress(PermissionError):
            os.fchown(fd, -1, gid)
        if uid != os.geteuid() and not (mode & stat.S_IWGRP):
            raise CompactionAborted(
                f"agent {agent!r}: cannot give the new MEMORY.md its owner uid {uid} "
                "(run memd as that user or make the file group-writable); nothing changed"
            ) from None


def _resolve_pending(
    pinned: AgentDir, new_fd: int, copied_to: int, pending_to: int, payload: dict[str, Any]
) -> int:
    """How much of the journaled chunk reached the new file before the crash.

    The chunk was appended (O_APPEND) at or after ``pending_at``, the new
    file's size journaled just before; writers may have appended after it.
    Returns the old-inode offset the drain continues from.
    """
    try:
        fd = pinned.open_private(DRAIN_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return copied_to
    try:
        chunk = read_range(fd, copied_to, pending_to)
    finally:
        os.close(fd)
    if not chunk or hashlib.sha256(chunk).hexdigest() != payload.get("pending_sha256"):
        return copied_to
    # Format 1 journals (the first builds) did not record where the new file
    # ended: the chunk is looked for from its start (it holds dated turns, found
    # only where they were appended).
    pending_at = payload.get("pending_at", 0)
    if not isinstance(pending_at, int):
        return copied_to
    after = read_range(new_fd, pending_at, os.fstat(new_fd).st_size)
    return copied_to + landed_prefix(after, chunk)


__all__ = [
    "CHECKPOINTS",
    "ERASE_FINISHED",
    "PRE_COMMIT_CHECKPOINTS",
    "AuditSink",
    "CompactionOptions",
    "CompactionOutcome",
    "ProvidedSummary",
    "ThresholdCheck",
    "check_still_over",
    "compact_agent",
    "finished_an_erasure",
    "journal_unfinished",
    "read_memory",
    "record_recovered_erasure",
    "recover_agent",
]
