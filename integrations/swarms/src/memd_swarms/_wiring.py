"""What ``attach`` does to a Swarms agent: deliver the MEMORY.md preload, follow re-seeds.

Swarms 16.0.3 loads MEMORY.md into the agent's conversation as one row with role
``"System"`` and ``Conversation.to_messages`` drops such rows, so the memory
never reaches the model. The wiring here replaces that row with one in chat form
(role ``"system"``), which ``to_messages`` passes through as given, and before
each ``run`` checks whether MEMORY.md is still the file it loaded: when memd has
re-seeded it (a new inode), the conversation is rebuilt from the new file;
so it is when the file was rewritten in place (the same inode no longer
starts with the bytes loaded from it: the agent's own edit).

A re-seed is not the end of memd's compaction: a turn the agent appended to the
old file just before the swap is moved into the new one by memd's drain a
little later. The wiring keeps a read-only descriptor on the file it loaded
(and opens memd's drain link, the file memd is draining after two re-seeds), so
after a swap it can wait (at most ``DRAIN_WAIT_S``) until the old file is let
go (its link count is 0) or its last turn is in the new file (each look stats
the files and reads one only when it changed since the last). Nothing is ever
taken from an old file: besides late turns it holds what memd removed from the
new one on purpose (summarized, or erased by ``memd forget --match``), and
the two cannot be told apart. When the drain does not finish in time, the run
goes on from the new file, and the first run after memd lets the old file go
is rebuilt again, from the file that now holds the late turns.

MEMORY.md is loaded only when it is a regular file inside the agent's folder
(a symlink is followed only there, as memd does, DESIGN §1), opened without
blocking (a FIFO would wait for a writer); otherwise the agent runs on with
the conversation it has, as Swarms alone would, and a warning says so once.

memd compacts when its count of MEMORY.md crosses the agent's threshold, and the
compaction takes time (the summarizer's call, memd's least interval between two
compactions): an agent that writes turns faster than that would keep sending
the turns piled up since, over the threshold. So before each run the wiring
asks memd (its socket's "status" request) where the file stands, and while
memd's count is over the threshold with a compaction coming (or may be, with
bytes memd has not counted yet), the run waits (at most ``HOLD_S``) for the
re-seed and starts from the new file. A compaction is coming while memd's job
is idle (memd's least interval between two compactions reads as idle),
pending or running, and in a cooldown memd ends with a compaction (another
process held the agent's lock, a compaction ended above the low-water mark,
a spending cap) when it says the cooldown ends within the wait's bound. The
same holds before each model request of a run after its first (``max_loops``
over 1, a tool loop: the run's own turns grow the file), and a re-seed then
is followed as at a run's start, the run's task and its turns memd kept
verbatim going on as turns. Without an answer from memd (not running, no socket; a memd that
does not answer is asked once per run, an answer this cannot read counts as
none) nothing is held back. When a model call fails after such a re-seed,
Swarms cuts the history back to where the attempt began (for its fallback
model); the wiring puts back the rows the re-seed left before the run's own
(the new preload), which that cut counts by a row number from before it.

A run can end with a tool call whose results the model has not read yet (Swarms
keeps them in the call's row; a failed tool adds a ``Tool Executor`` row). A
rebuild keeps that open exchange, in order, after the memory rows, so the next
request still answers the call and already carries the new memory; when memd
kept those turns verbatim at the file's end, the preload leaves them out.

Nothing here writes to MEMORY.md: the preload row is put into the history
directly, the way Swarms puts its own, never through ``Conversation.add``.
Swarms' own appends pass through a hook (``_append_to_memory_md``) that
records each (a file whose bytes after the loaded ones are not those appends
was rewritten, or written by another hand) and quotes a line of a turn's text
that reads as an entry header (``> ### …``, as memd quotes them in its
summaries), which memd would take for another turn's start.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import os
import re
import stat
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeGuard

log = logging.getLogger("memd_swarms")

#: Swarms' own wording for the preload (conversation.py, ``_preload_memory_md``),
#: kept so the model sees the same thing whether Swarms or memd_swarms loaded it.
PRELOAD_PREAMBLE = (
    "[Persistent Memory — MEMORY.md]\n"
    "The following is this conversation's persistent memory from prior sessions. "
    "Use it to continue context coherently.\n\n"
)
PRELOAD_MARKER = PRELOAD_PREAMBLE.split("\n", 1)[0]
#: Marks the row memd_swarms put into the history (ignored by ``to_messages``).
ROW_TAG = "memd_swarms"
#: Roles Swarms records for tool bookkeeping rather than for a speaker.
TOOL_EXECUTOR_ROLE = "Tool Executor"
#: Rows that answer a tool call rather than speak.
RESULT_ROLES = (TOOL_EXECUTOR_ROLE, "tool")

FileIdentity = tuple[int, int]  # (st_dev, st_ino): a re-seed is a new inode
#: memd's hard link to the old file while it drains it into the new one, beside
#: MEMORY.md (memd's ``.memd/drain.md``; a compaction's and an erasure's alike).
DRAIN_LINK = os.path.join(".memd", "drain.md")

#: After a re-seed, how long ``run`` waits at most for memd's drain of the old
#: file, and how often it looks (memd's drain moves a late turn within ~50 ms
#: and lets the old file go ``drain_quiet_s`` after its last write, 1 s by default).
DRAIN_WAIT_S = 2.0
DRAIN_POLL_S = 0.02

#: Before a run, how long it waits at most for memd's compaction while memd's
#: count of MEMORY.md is over the threshold (a summarizer's call can take a
#: while; Swarms' own in-process compression blocks the run for it too), how
#: often it looks at the file, and how often it asks memd again meanwhile.
HOLD_S = 60.0
HOLD_POLL_S = 0.02
STATUS_EVERY_S = 0.1
#: Job states in which memd compacts a file over its threshold without more
#: appends (``memd status``' names): waiting is worth it only then.
COMPACTING_STATES = frozenset({"idle", "pending", "running"})

#: An entry header as Swarms and memd write it: ``### {role} — {ISO timestamp}``.
_ENTRY_HEADER = re.compile(rb"(?m)^### ([^\r\n]*) \xe2\x80\x94 ([^\r\n \t]+)[ \t]*\r?\n\r?\n")
#: A line that reads as one, whatever follows it (what ``quote_headers`` quotes).
_HEADER_LINE = re.compile(rb"(?m)^### ([^\r\n]*) \xe2\x80\x94 ([^\r\n \t]+)[ \t]*\r?$")
#: A terminator and any empty lines, at the end of what comes before an entry.
_CLOSED_BEFORE = re.compile(rb"\r?\n\r?\n---\r?\n\r?\n(?:\r?\n)*\Z")


#: What an operator should know when memd leaves a file over its threshold, by
#: the state memd names (``memd status --json``'s): the line says why, not only
#: the state's name (an agent memd never compacts grows past the model's window).
_STATE_WHY: dict[str, str] = {
    "disabled": (
        ": context_compression = false for this agent in memd's config, so memd never "
        "compacts it and each request grows until it passes the model's window"
    ),
    "error": ": memd's compactions of it fail; `memd status` and memd's log say why",
    "breaker_open": (
        ": memd stopped trying after repeated failures; `memd status` says when it tries again"
    ),
}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """MEMORY.md as read once: its identity, its bytes and the descriptor they came
    through (None, b"" and None when it is missing). The caller owns ``fd``."""

    identity: FileIdentity | None
    data: bytes
    fd: int | None = None


def read_all(fd: int) -> bytes:
    """The file's bytes from offset 0 (``pread``: the descriptor's offset is left alone)."""
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def memory_target(path: str) -> str:
    """The path MEMORY.md resolves to. A symlink is followed only inside the agent's
    own folder (DESIGN §1, as memd follows it); one that leaves it is refused (OSError)."""
    folder = os.path.realpath(os.path.dirname(path) or ".")
    target = os.path.realpath(path)
    if target == folder or os.path.commonpath((folder, target)) != folder:
        raise OSError(errno.EXDEV, "a symlink out of the agent's own folder", path)
    return target


def open_regular(path: str) -> int | None:
    """A read-only descriptor on the regular file at ``path`` (None when it is
    missing). Never follows a last symlink (``path`` is resolved already) and never
    blocks (a FIFO there would wait for a writer); anything but a regular file
    is refused (OSError)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_memory(path: str) -> Snapshot:
    """Open and read MEMORY.md through one descriptor, so the identity and the bytes
    agree; the descriptor stays open (read-only) for the caller. OSError when
    MEMORY.md is not a regular file inside the agent's folder, or cannot be read."""
    fd = open_regular(memory_target(path))
    if fd is None:
        return Snapshot(None, b"")
    try:
        data = read_all(fd)
    except BaseException:
        os.close(fd)
        raise
    return Snapshot(_identity(fd), data, fd)


def current_identity(path: str) -> FileIdentity | None:
    """MEMORY.md's identity now (None: missing); OSError as for ``open_memory``."""
    try:
        info = os.stat(memory_target(path), follow_symlinks=False)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


def entries(data: bytes) -> list[bytes]:
    """The entry blocks of a MEMORY.md's bytes, in order (the file header left out).

    A line counts as an entry header as memd counts it: ``### {role} — {time}``
    with a role and an ISO-8601 time, then a blank line; after the first, only
    where a terminator (``---`` between blank lines) closes the entry before it,
    so a header line inside a turn's text (a tool's output, a quoted
    transcript) is no new entry.
    """
    starts: list[int] = []
    for match in _ENTRY_HEADER.finditer(data):
        if not (match.group(1).strip() and _is_timestamp(match.group(2))):
            continue
        start = match.start()
        if starts and not _CLOSED_BEFORE.search(data, max(0, start - 256), start):
            continue
        starts.append(start)
    ends = [*starts[1:], len(data)] if starts else []  # a file of no entry: its header only
    return [data[start:end] for start, end in zip(starts, ends, strict=True)]


def quote_headers(text: bytes) -> bytes:
    """``text`` with each line that reads as an entry header quoted with ``> ``, as
    memd quotes such lines in its summaries: a turn's text holding one (a tool's
    output that prints a transcript, a pasted MEMORY.md) would otherwise be cut
    in two by memd where a ``---`` line comes before it, the rest taken for a
    turn of the role that line names."""
    if b"### " not in text:
        return text
    return _HEADER_LINE.sub(
        lambda match: (
            b"> " + match.group(0)
            if match.group(1).strip() and _is_timestamp(match.group(2))
            else match.group(0)
        ),
        text,
    )


def _is_timestamp(raw: bytes) -> bool:
    try:
        datetime.fromisoformat(raw.decode("ascii"))
    except ValueError:
        return False
    return len(raw) <= 64


def drained(old: bytes, new: bytes) -> bool:
    """True when the old file's last turn is already in the new file (kept by the
    compaction or moved there by its drain): nothing of it is still to come."""
    blocks = entries(old)
    return not blocks or blocks[-1] in new


def _version(info: os.stat_result) -> tuple[int, int, int]:
    """What changes when a file's bytes do (memd's drain appends; a rewrite in place
    changes the times): a file whose version is the same need not be read again."""
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _written(row: dict[str, Any]) -> bytes | None:
    """The entry block's role and text as Swarms wrote ``row`` into MEMORY.md
    (``Conversation._append_to_memory_md``), None for a row it does not write."""
    content = row.get("content")
    if content is None:
        return None
    text = (content if isinstance(content, str) else str(content)).strip()
    if not text:
        return None
    return f"{row.get('role')}\n".encode() + quote_headers(text.encode())


def _block_text(block: bytes) -> bytes:
    """An entry block's role and text, in the form ``_written`` gives (its header
    lines quoted either way: a turn Swarms wrote before it was attached has
    them as they were)."""
    match = _ENTRY_HEADER.match(block)
    assert match is not None  # entries() cut the block at such a header
    body = block[match.end() :].rstrip()
    if body.endswith(b"---"):
        body = body[:-3]
    return match.group(1) + b"\n" + quote_headers(body.strip())


def kept_verbatim(data: bytes, rows: list[dict[str, Any]]) -> int:
    """How many of ``rows``' last rows memd kept verbatim at the end of ``data``: the
    most whose entry blocks, as Swarms wrote them, are the file's last ones (rows
    Swarms does not write go along with the rows around them)."""
    blocks = entries(data)
    for count in range(len(rows), 0, -1):
        if _written(rows[-count]) is None:
            continue
        written = [text for text in map(_written, rows[-count:]) if text is not None]
        if len(written) > len(blocks):
            continue
        if [_block_text(block) for block in blocks[-len(written) :]] == written:
            return count
    return 0


def _in_file(row: dict[str, Any], data: bytes) -> bool:
    """Whether ``row``, as Swarms wrote it, is one of ``data``'s entry blocks (a row
    Swarms does not write counts as there: there is nothing of it to keep)."""
    written = _written(row)
    return written is None or any(_block_text(block) == written for block in entries(data))


def without_rows(data: bytes, rows: list[dict[str, Any]]) -> bytes:
    """``data`` less its last entry blocks when they are ``rows`` as Swarms wrote them.

    A rebuild keeps the open tool exchange as rows; memd may have kept the same
    turns verbatim at the file's end (all of them, or the newest ones when its
    keep boundary fell inside the exchange), so they are cut from the preload.
    """
    written = [text for text in map(_written, rows) if text is not None]
    if not written:
        return data
    blocks = entries(data)
    for count in range(min(len(written), len(blocks)), 0, -1):
        tail = blocks[-count:]
        if [_block_text(block) for block in tail] == written[-count:]:
            return data[: len(data) - sum(map(len, tail))]
    return data


def preload_row(text: str) -> dict[str, Any] | None:
    """The history row carrying MEMORY.md to the model; None when it holds no entry yet.

    The same rule as Swarms': a file without an entry header (``### ``) is only
    a header and is not preloaded.
    """
    if "### " not in text:
        return None
    return {"role": "system", "content": PRELOAD_PREAMBLE + text, ROW_TAG: "preload"}


def static_prefix_length(conversation: Any) -> int:
    """How many leading rows are the agent's static context, re-sent on every request.

    ``Conversation`` starts its history with the system prompt (role System),
    then the rules and the custom rules prompt (role user), each only when set,
    and never writes them to MEMORY.md. Everything after them is in the file.
    """
    expected = [
        getattr(conversation, name, None)
        for name in ("system_prompt", "rules", "custom_rules_prompt")
    ]
    history: list[dict[str, Any]] = conversation.conversation_history
    count = 0
    for want in (value for value in expected if value is not None):
        if count < len(history) and history[count].get("content") == want:
            count += 1
        else:
            break
    return count


def open_tool_exchange(rows: list[dict[str, Any]]) -> int | None:
    """Where the model's open tool exchange starts in ``rows``, or None.

    Open: the last row that is not a tool result made tool calls, so the model
    has not answered their results yet. Swarms keeps a call and its results in
    one row (``tool_calls`` plus ``tool_results``); a failed tool adds a ``Tool
    Executor`` row after it; chat-form rows (``messages=``) carry the calls in
    ``metadata`` and the results as ``tool`` rows. The results are not in
    MEMORY.md, so a rebuild keeps these rows: dropping them would take the
    results from the model before it read them.
    """
    for index in range(len(rows) - 1, -1, -1):
        row = rows[index]
        if row.get("role") in RESULT_ROLES:
            continue
        metadata = row.get("metadata")
        calls = row.get("tool_calls") or (
            metadata.get("tool_calls") if isinstance(metadata, dict) else None
        )
        return index if calls else None
    return None


@dataclass
class Wiring:
    """Per-agent state of an attached agent (stored on the agent as ``_memd_swarms``)."""

    conversation: Any
    memory_path: str
    static_rows: int
    loaded: FileIdentity | None = None
    rebuilds: int = 0
    # Rebuilds that waited for memd's drain, and for how long in all (seconds).
    drain_waits: int = 0
    drain_waited_s: float = 0.0
    # How often the drain checks after a re-seed read a file (a file is read
    # again only when it changed since the last look).
    drain_reads: int = 0
    warned_messages: bool = False
    # Appended to the preload (attach(recall=True) names the recall tool there).
    notice: str = ""
    lock: threading.RLock = field(default_factory=threading.RLock)
    # How long to wait for memd's drain after a re-seed, and the clock and sleep
    # it is measured with (tests pass their own).
    drain_wait_s: float = DRAIN_WAIT_S
    drain_poll_s: float = DRAIN_POLL_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    # memd's "status" answer for this agent (None: memd cannot say), how long a
    # run waits at most for memd's compaction, how often it looks meanwhile;
    # the runs that waited and how long in all; what it said once.
    status: Callable[[], dict[str, Any] | None] | None = None
    hold_s: float = HOLD_S
    hold_poll_s: float = HOLD_POLL_S
    status_every_s: float = STATUS_EVERY_S
    holds: int = 0
    held_s: float = 0.0
    # Of those, the waits before a model call inside a run (max_loops > 1, tool
    # loops), and the rebuilds there.
    call_holds: int = 0
    call_rebuilds: int = 0
    threshold: int | None = None
    # What was said once, by key; a file's is keyed by its number in ``loads``,
    # never by its inode: a replaced file's inode is free, and the next file
    # made may have it (a warning, and a wait, about a new file were skipped).
    said: set[str] = field(default_factory=set)
    # The files loaded so far: the loaded one's number (a load of the same file,
    # held open since its last load so its inode is not reused, keeps it).
    loads: int = 0
    # Where the running run's rows start in the history (None between runs), how
    # many model requests it has built, and how deep runs are nested (a tool that
    # runs the agent again).
    run_start: int | None = None
    run_calls: int = 0
    run_depth: int = 0
    # After a rebuild inside the running run: the rows before the run's own
    # (static rows, the preload, rows kept from before the run), which a failed
    # model attempt goes back to (see ``attempt_failed``).
    run_base: list[dict[str, Any]] | None = None
    # A status ask that went unanswered during the running run: not asked
    # again before the run ends (each ask may wait out the socket's timeout).
    run_unanswered: bool = False
    # The loaded file's size as read (memd's count up to that size is of the file
    # as memd left it, with its drain), and the file (its number in ``loads``)
    # memd's count said was over the threshold as loaded (see ``_cooldown_ends``).
    loaded_size: int = 0
    over_as_loaded: int | None = None
    # A digest of the loaded bytes, and the loaded file's version (size and times)
    # when they were last known to start it: a file rewritten in place (the same
    # inode: an agent's own edit, a tool's ``open(path, "w")``) is told from one
    # Swarms appended to (see ``_rewritten``).
    loaded_digest: bytes | None = None
    checked_version: tuple[int, int, int] | None = None
    # The loaded bytes and Swarms' appends after them as found whole at the last
    # look (their size and digest): a look reads them again and compares them
    # whole, and checks only the entries appended since one by one (a record
    # of every append since the load grew with each turn, and each look went
    # through all of them: 38 ms a request at 2,000 runs without a re-seed, 123 ms at 4,000).
    checked_size: int = 0
    checked_digest: bytes | None = None
    # What Swarms appended to the loaded file since the last look, entry by entry
    # (recorded by ``wrap_run``'s hook on ``_append_to_memory_md``; None: the
    # conversation has no such method and appends are told by their headers):
    # anything else after the loaded bytes was written by another hand (a
    # rewrite caught part-way when loaded, whose part ended at an entry's start;
    # another writer's turns), which the history does not hold.
    appended: list[AppendedEntry] | None = None
    # The loaded file had entries after its loaded bytes that Swarms did not
    # append when last looked at inside a run: followed at the next run's start.
    foreign_pending: bool = False
    # A read-only descriptor on the file the history was loaded from: after a
    # re-seed it tells whether memd's drain of that file is done.
    held: int | None = None
    # Descriptors on old files whose drain into MEMORY.md was not done when the
    # history was loaded (memd stopped mid-drain, or a drain longer than
    # ``drain_wait_s``): once memd lets one go, the next run rebuilds again.
    draining: list[int] = field(default_factory=list)
    # Every descriptor above, closed when the wiring goes (the list, not the
    # wiring, is what the finalizer keeps).
    _fds: list[int] = field(default_factory=list, repr=False)
    _closer: weakref.finalize | None = field(default=None, repr=False)  # type: ignore[type-arg]

    def rebuild(self) -> int:
        """Replace everything after the static rows with a preload of the current file.

        An open tool exchange (the model's tool calls and their results) stays
        after the preload, in order, and its rows are left out of the preload's
        text (memd may have kept them verbatim in the file). Inside a run (a
        re-seed between two of its model calls), so do the run's last rows
        memd kept verbatim at the file's end: its task and replies go on as
        turns after the memory, as they would in a run started from the new
        file, unless memd summarized them; the run's task (its first row) goes
        on as a turn even then, unless the file has it verbatim (the run's later
        requests answer it, and a summary need not name it). Returns the number
        of rows dropped. Every dropped row is in the file (verbatim, or in
        memd's summary of it), so nothing is sent twice. OSError (nothing changed) when MEMORY.md
        cannot be loaded.
        """
        with self.lock:
            snapshot, draining = self._load()
            history: list[dict[str, Any]] = self.conversation.conversation_history
            kept = history[: self.static_rows]
            tail = history[self.static_rows :]
            open_at = open_tool_exchange(tail)
            start = len(tail) if open_at is None else open_at
            before = len(tail)  # the tail's rows from before the run
            task: list[dict[str, Any]] = []
            if self.run_start is not None:
                before = max(0, self.run_start - self.static_rows)
                run = tail[before:]
                count = kept_verbatim(snapshot.data, run)
                # Swarms never sends a tool's result row (its text reaches the model
                # through the call's row): kept as a row without its call, whose
                # text memd summarized, it would be cut from the preload and the
                # result sent nowhere. It stays in the preload's text instead.
                while count and run[-count].get("role") in RESULT_ROLES:
                    count -= 1
                start = min(start, len(tail) - count)
                # The run's task is what its later requests answer: summarized by
                # memd (its keep-recent tail is a tenth of the threshold), it went
                # from them altogether, and a request could end with the memory
                # (no user row) or a tool's result for a question it no longer
                # held. It stays a row, after the memory, unless the file has it.
                if start > before and not _in_file(run[0], snapshot.data):
                    task = [run[0]]
            exchange = task + tail[start:]
            dropped = len(tail) - len(exchange)
            # Swarms reads it as UTF-8 too; a stray byte must not cost the agent its memory.
            text = without_rows(snapshot.data, exchange).decode("utf-8", "replace")
            row = preload_row(text)
            if row is not None:
                if self.notice:
                    row["content"] += "\n\n" + self.notice
                kept.append(row)
            if self.run_start is not None:
                self.run_base = kept + exchange[: max(0, before - start)]
                self.run_start = len(self.run_base)
            kept.extend(exchange)
            # In place: Agent._run holds no reference across runs, but callers may.
            history[:] = kept
            if hasattr(self.conversation, "_str_cache"):
                self.conversation._str_cache = None  # Swarms' cached rendering of the history
            if (
                self.held is None
                or snapshot.identity != self.loaded
                or not self._starts_as_loaded(snapshot.data)
            ):
                # Another file (or one not held: its inode may be reused; or the
                # same one rewritten in place).
                self.loads += 1
            self.loaded = snapshot.identity
            self.loaded_size = len(snapshot.data)
            self.loaded_digest = _digest(snapshot.data)
            self.checked_size, self.checked_digest = self.loaded_size, self.loaded_digest
            self.checked_version = None if snapshot.fd is None else _version(os.fstat(snapshot.fd))
            if self.appended is not None:
                self.appended = []
            self.foreign_pending = False
            self._keep(snapshot.fd, draining)
            self.said.discard("unreadable")
            return dropped

    def _load(self) -> tuple[Snapshot, list[int]]:
        """The current file (its descriptor open), and descriptors on the old files
        whose drain into it is not done yet (see ``draining``).

        When the file is not the one loaded before, memd's drain of the old one
        (or of the file in between, after two re-seeds: memd's drain link) may
        still be moving turns into it: wait for it, at most ``drain_wait_s``.
        Past that the new file is taken as it is; nothing is ever taken from an
        old file, which holds what memd removed from the new one on purpose
        (summarized, or erased by ``memd forget --match``) as well as late turns.
        """
        snapshot = open_memory(self.memory_path)
        fd = snapshot.fd
        if fd is None:
            return snapshot, []
        started = self.clock()
        polls = 0
        olds: list[int] = []
        new = snapshot.data
        try:
            olds = self._old_files(snapshot.identity)
            if not olds:
                return snapshot, []
            # Each look stats the files and reads one only when it changed since the
            # last (memd's drain appends; a wait is mostly looks at files at rest).
            seen = {fd: _version(os.fstat(fd))}
            new = read_all(fd)
            self.drain_reads += 1
            while True:
                olds = self._undrained(olds, new, seen)
                if not olds or self.clock() - started >= self.drain_wait_s:
                    break
                self.sleep(self.drain_poll_s)
                polls += 1
                version = _version(os.fstat(fd))
                if version != seen[fd]:
                    seen = {fd: version}  # every old file is read against the new bytes
                    new = read_all(fd)
                    self.drain_reads += 1
        except BaseException:
            os.close(fd)  # the old files' descriptors are the wiring's (closed by _keep or close)
            raise
        finally:
            if polls:
                self.drain_waits += 1
                self.drain_waited_s += self.clock() - started
        if olds:
            log.warning(
                "memd_swarms: MEMORY.md was re-seeded and memd has not finished moving the "
                "turns written to the old file after %.1f s; this run goes on without them "
                "and the next run after memd's drain is done sends them",
                self.drain_wait_s,
            )
        return Snapshot(snapshot.identity, new, fd), olds

    def _undrained(
        self, olds: list[int], new: bytes, seen: dict[int, tuple[int, int, int]]
    ) -> list[int]:
        """The old files whose drain into ``new`` is not done: memd has not let them
        go (link count 0) and their last turn is not in ``new`` yet. One that was
        read already against the same ``new`` (in ``seen``) is not read again
        until it changes."""
        left = []
        for old in olds:
            info = os.fstat(old)
            if info.st_nlink == 0:
                continue
            version = _version(info)
            if seen.get(old) == version:
                left.append(old)  # neither file changed: still not drained
                continue
            seen[old] = version
            self.drain_reads += 1
            if not drained(read_all(old), new):
                left.append(old)
        return left

    def _old_files(self, current: FileIdentity | None) -> list[int]:
        """Descriptors on the files memd may still drain into the current one: the one
        loaded before, those still draining, and memd's drain link (``.memd/drain.md``,
        opened here when it is none of those). Files let go already are left out."""
        olds: list[int] = []
        seen = {current}
        link = self._drain_link()
        for fd in [*self.draining, self.held, link]:
            if fd is None:
                continue
            info = os.fstat(fd)
            identity = (info.st_dev, info.st_ino)
            if identity in seen or info.st_nlink == 0:
                if fd == link:
                    os.close(fd)
                continue
            seen.add(identity)
            if fd == link:
                self._fds.append(fd)  # owned from here on, like the others
            olds.append(fd)
        return olds

    def _drain_link(self) -> int | None:
        """A descriptor on memd's drain link beside MEMORY.md (None when there is none,
        or it cannot be read: another uid's memd keeps ``.memd/`` to itself)."""
        try:
            folder = os.path.realpath(os.path.dirname(self.memory_path) or ".")
            target = os.path.realpath(os.path.join(folder, DRAIN_LINK))
            if os.path.commonpath((folder, target)) != folder:
                return None
            return open_regular(target)
        except OSError:
            return None

    def _keep(self, fd: int | None, draining: list[int]) -> None:
        """Hold ``fd`` (the loaded file's) and ``draining``; close every other descriptor."""
        keep = {fd, *draining}
        self._release([old for old in self._fds if old not in keep])
        self.held, self.draining = fd, list(draining)
        for new in (fd, *draining):
            if new is not None and new not in self._fds:
                self._fds.append(new)
        if self._closer is None and self._fds:
            self._closer = weakref.finalize(self, _close_all, self._fds)

    def _release(self, fds: list[int]) -> None:
        for fd in list(fds):
            if fd in self._fds:
                self._fds.remove(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        """Let the held descriptors go (the agent is done with memd)."""
        with self.lock:
            self._release(list(self._fds))
            self.held, self.draining = None, []

    def before_run(self, kwargs: dict[str, Any]) -> None:
        """Called at the start of every ``run``: follow a re-seed of MEMORY.md, and
        while memd's count of it is over the threshold, wait for the next one.
        A MEMORY.md that cannot be loaded leaves the conversation as it is."""
        with self.lock:
            if not self.run_depth:
                self.run_unanswered = False  # a new run asks memd again
            if kwargs.get("messages") and not self.warned_messages:
                self.warned_messages = True
                log.warning(
                    "memd_swarms: run(messages=...) writes those messages into MEMORY.md "
                    "and sends them instead of the agent's memory; pass earlier turns "
                    "through MEMORY.md (or the system prompt) instead"
                )
            try:
                self._follow()
                self._wait_under_threshold()
            except OSError as exc:
                self.refused(exc)

    def before_call(self) -> None:
        """Called before each model request a run builds after its first (``max_loops``
        over 1, a tool loop): the file grows with the run's own turns, so the same
        as before a run, with the run's rows that memd keeps verbatim kept as rows.
        The first request was seen to by ``before_run``."""
        with self.lock:
            holds, rebuilds = self.holds, self.rebuilds
            try:
                self._follow()
                self._wait_under_threshold()
            except OSError as exc:
                self.refused(exc)
            self.call_holds += self.holds - holds
            self.call_rebuilds += self.rebuilds - rebuilds

    def attempt_failed(self) -> None:
        """Called when a model attempt of a run (swarms' ``_run``) raised after a
        rebuild inside it. Swarms then cuts the history back to the row count it
        had when the attempt began, so that a fallback model starts clean; the
        rebuild moved the rows under that count (the preload among them), so
        the cut would take memd's memory with it, or leave the attempt's rows.
        The history goes back to the rows before the run's own, as rebuilt."""
        with self.lock:
            if self.run_base is None:
                return
            self.conversation.conversation_history[:] = self.run_base
            if hasattr(self.conversation, "_str_cache"):
                self.conversation._str_cache = None
            self.run_start = len(self.run_base)

    def refused(self, exc: OSError) -> None:
        """Say (once) that MEMORY.md cannot be loaded: the agent runs on as Swarms alone would."""
        self._say(
            "unreadable",
            "memd_swarms: %s: %s; the agent goes on with the conversation it has, without "
            "memd's re-seeds",
            exc.filename or self.memory_path,
            exc.strerror or exc,
        )

    def _follow(self) -> bool:
        """Rebuild from MEMORY.md when memd has re-seeded it, or has let go of an old
        file whose drain was not done at the last rebuild; True when it did."""
        finished = any(os.fstat(fd).st_nlink == 0 for fd in self.draining)
        change: str | None = None
        if not finished and current_identity(self.memory_path) == self.loaded:
            change = self._rewritten()
            if change is None:
                return False
            if change == APPENDED and self.run_depth:
                # Another writer's whole entries, between two model requests of a
                # run: a rebuild now would fold the run's own turns (the file has
                # them, not at its end) into the memory, and its requests would
                # no longer end with its task. The next run starts from the file.
                return False
        dropped = self.rebuild()
        self.rebuilds += 1
        log.info(
            "memd_swarms: MEMORY.md was %s; working context rebuilt from the file "
            "(%d rows replaced)",
            "drained by memd" if finished else change or "re-seeded",
            dropped,
        )
        return True

    def _rewritten(self) -> str | None:
        """How the loaded file (still MEMORY.md) changed other than by Swarms'
        appends: ``REWRITTEN`` when it no longer starts with the bytes loaded from
        it, or what follows them is not entries; ``APPENDED`` when entries Swarms
        did not append follow them; None when only Swarms' appends do. memd
        re-seeds a new file and Swarms appends, so the history held it all; an
        in-place rewrite (the agent editing its memory, a tool's
        ``open(path, "w")``) was never sent, and the rows the rewrite took out
        were sent with every request, over memd's count of the file, until
        memd's next compaction. Read only when the file changed since the last
        look."""
        if self.held is None or self.loaded_digest is None:
            return None
        version = _version(os.fstat(self.held))
        if version == self.checked_version:
            return APPENDED if self.foreign_pending else None
        known = _read_prefix(self.held, self.checked_size)
        if len(known) < self.checked_size or _digest(known) != self.checked_digest:
            return REWRITTEN  # the loaded bytes, or an append of Swarms' found since, changed
        if self.appended is None:
            if not _continues_with_an_entry(self.held, self.loaded_size, version[0]):
                # The loaded bytes are still its start, but what follows them is no
                # entry Swarms (or memd's drain) appends: the file was caught
                # mid-rewrite when loaded (a writer's open(path, "w") had truncated
                # it, to nothing or part-way) and has been written since.
                return REWRITTEN
            change = None
        else:
            # Entries after the loaded bytes that Swarms did not append: the file
            # was caught mid-rewrite when loaded, its part ending where an entry
            # starts (so what followed looked like Swarms' appends), or another
            # hand appended turns; or an append of Swarms' is not there.
            tail = _read_from(self.held, self.checked_size)
            change = _change_after(tail, self.appended)
            if change is None and tail:
                # All Swarms' own, whole: the next look compares them with the
                # loaded bytes, and checks only what is appended after them.
                digest = hashlib.blake2b(known, digest_size=16)
                digest.update(tail)
                self.checked_size += len(tail)
                self.checked_digest = digest.digest()
                self.appended = []
        self.checked_version = version
        self.foreign_pending = change == APPENDED
        return change

    def _starts_as_loaded(self, data: bytes) -> bool:
        """Whether ``data`` starts with the bytes the history was loaded from."""
        if self.loaded_digest is None:
            return True
        size = self.loaded_size
        return len(data) >= size and _digest(data[:size]) == self.loaded_digest

    def _wait_under_threshold(self) -> None:
        """Wait (at most ``hold_s``) while memd's count of MEMORY.md is over the
        threshold and memd is to compact it, following the re-seed when it comes."""
        if (
            self.status is None
            or self.hold_s <= 0
            or self.run_unanswered
            or f"timeout-{self.loads}" in self.said
        ):
            # No memd to ask, memd did not answer once already in this run, or it
            # did not compact this file in time once already.
            return
        started = self.clock()
        asked: float | None = None
        answer: dict[str, Any] | None = None
        polls = 0
        try:
            while True:
                if self._follow():
                    asked = None  # memd's answer was about the old file
                try:
                    info = os.stat(memory_target(self.memory_path))
                except FileNotFoundError:
                    return
                # Asked at every run: memd's threshold for the agent changes (it
                # reads memd-agent.json a little after attach, a reload).
                now = self.clock()
                if asked is None or now - asked >= self.status_every_s:
                    answer, asked = self._ask(), now
                left = self.hold_s - (now - started)
                if answer is None or not self._over(answer, info, left):
                    return
                if left <= 0:
                    self._say(
                        f"timeout-{self.loads}",
                        "memd_swarms: MEMORY.md is over memd's threshold and memd has not "
                        "compacted it within %.0f s; this run goes ahead over it",
                        self.hold_s,
                    )
                    return
                self.sleep(self.hold_poll_s)
                polls += 1
        finally:
            if polls:
                self.holds += 1
                self.held_s += self.clock() - started

    def _ask(self) -> dict[str, Any] | None:
        """memd's status answer (its threshold kept, for the report); None (said
        once) when memd cannot answer or its answer is not one this reads. A
        run that got no answer does not ask again (a memd stopped or stuck costs
        the socket's timeout at each ask)."""
        assert self.status is not None
        answer = self.status()
        if not _readable(answer):
            self.run_unanswered = True
            self._say(
                "no-status",
                "memd_swarms: memd's status is not available (is the daemon running, with "
                "its recall socket?); requests are not held to memd's threshold",
                level=logging.INFO,
            )
            return None
        self.said.discard("no-status")
        self.threshold = answer["threshold_tokens"]
        return answer

    def _over(self, answer: dict[str, Any], info: os.stat_result, left: float) -> bool:
        """Whether to wait: memd's count of this file is over the threshold and memd
        is to compact it (now, or when a cooldown ends within the ``left`` seconds
        of this hold), or bytes memd has not counted yet may take it over."""
        threshold: int = answer["threshold_tokens"]
        tokens, size = answer.get("tokens"), answer.get("size")
        if (
            (answer.get("dev"), answer.get("ino")) == self.loaded
            and _count(tokens)
            and _count(size)
            and size <= self.loaded_size
            and tokens >= threshold
        ):
            self.over_as_loaded = self.loads
        if info.st_size < threshold:
            return False  # a token is at least a byte
        state = answer.get("state")
        if state not in COMPACTING_STATES and not self._cooldown_ends(answer, left):
            if _count(answer.get("tokens")) and answer["tokens"] >= threshold:
                self._say(
                    f"state-{self.loads}",
                    "memd_swarms: MEMORY.md is over memd's threshold and memd is not "
                    "compacting it now (state %s%s); runs go ahead over it",
                    state,
                    _STATE_WHY.get(state, "") if isinstance(state, str) else "",
                )
            return False
        if (answer.get("dev"), answer.get("ino")) != (info.st_dev, info.st_ino):
            return True  # memd has not counted this file yet (it does at once)
        if not isinstance(tokens, int) or not isinstance(size, int):
            return False
        unseen = max(0, info.st_size - size)  # at most a token a byte
        return tokens + unseen >= threshold

    def _cooldown_ends(self, answer: dict[str, Any], left: float) -> bool:
        """Whether memd is cooling down and compacts the file again within ``left``
        seconds. memd cools down after a compaction that ended above its low-water
        mark (another writer's turns copied in while it ran), while another process holds the
        agent's lock, while a spending cap holds it back (``cooldown_left_s``;
        none after a compaction that found nothing to compact). Not when the file
        memd left was itself over the threshold: its next compaction would not
        bring it under either, and each run would wait out a cooldown for nothing."""
        remaining = answer.get("cooldown_left_s")
        if answer.get("state") != "cooldown" or isinstance(remaining, bool):
            return False
        if not isinstance(remaining, int | float) or not 0 <= remaining <= left:
            return False
        return self.over_as_loaded is None or self.over_as_loaded != self.loads

    def _say(self, key: str, message: str, *args: object, level: int = logging.WARNING) -> None:
        if key not in self.said:
            self.said.add(key)
            log.log(level, message, *args)


def _readable(answer: object) -> TypeGuard[dict[str, Any]]:
    """Whether a status answer is one this reads: a threshold, and a job state
    that is a name (an odd answer, a newer or a foreign daemon's, counts as none)."""
    if not isinstance(answer, dict) or not _count(answer.get("threshold_tokens")):
        return False
    state = answer.get("state")
    return state is None or isinstance(state, str)  # none: a daemon that does not say


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


# How far past the loaded bytes an appended entry's header line is looked for.
_HEADER_WINDOW = 4096


def _continues_with_an_entry(fd: int, loaded_size: int, size: int) -> bool:
    """Whether the file's bytes after the first ``loaded_size`` (its size now
    ``size``) begin with an entry header, as every append of Swarms' does; True
    when there are none."""
    if size <= loaded_size:
        return True
    head = os.pread(fd, min(_HEADER_WINDOW, size - loaded_size), loaded_size)
    return not head or _ENTRY_HEADER.match(head) is not None


#: How a loaded file changed other than by Swarms' appends (``Wiring._rewritten``).
REWRITTEN = "rewritten"
APPENDED = "appended to by another writer"
#: How Swarms closes each entry it appends.
_ENTRY_END = b"\n\n---\n\n"
#: A terminator, any empty lines, then a line opening with "### " (memd's rule: an
#: entry header counts where a terminator closes the entry before it).
_NEXT_ENTRY = re.compile(rb"\n\n---\n\n\n*(?=### )")


@dataclass(frozen=True, slots=True)
class AppendedEntry:
    """An entry Swarms appended to MEMORY.md: its header up to the timestamp
    (``### {role} — ``), and its text's length and digest."""

    opening: bytes
    size: int
    digest: bytes


def appended_entry(conversation: Any, role: Any, content: Any) -> AppendedEntry | None:
    """The entry ``Conversation._append_to_memory_md(role, content)`` writes, decided
    as swarms 16.0.3 decides it; None when it writes none (suppressed, no content,
    only whitespace; text it cannot encode fails its write too)."""
    if getattr(conversation, "_suppress_memory_md", False) or content is None:
        return None
    text = content if isinstance(content, str) else str(content)
    if not text.strip():
        return None
    try:
        opening = f"### {role} \u2014 ".encode()
        body = text.strip().encode()
    except UnicodeEncodeError:
        return None
    return AppendedEntry(opening, len(body), _digest(body))


def _with_headers_quoted(content: Any) -> Any:
    """What Swarms is to append for ``content``: the same, unless its text holds a
    line that reads as an entry header, then the text with those quoted."""
    if content is None:
        return content
    text = content if isinstance(content, str) else str(content)
    if "### " not in text:
        return content
    try:
        stripped = text.strip().encode()
    except UnicodeEncodeError:
        return content  # Swarms cannot write it either
    quoted = quote_headers(stripped)
    return content if quoted == stripped else quoted.decode()


def _appended_end(data: bytes, at: int, entry: AppendedEntry) -> int | None:
    """Where ``entry``, as Swarms wrote it, ends when it starts at ``at`` in ``data``
    (its text is compared whole, so a header line inside it is no entry's start)."""
    if not data.startswith(entry.opening, at):
        return None
    stamp_at = at + len(entry.opening)
    line_end = data.find(b"\n", stamp_at)
    if line_end <= stamp_at or not _is_timestamp(data[stamp_at:line_end]):
        return None
    body = line_end + 2
    end = body + entry.size
    if data[line_end:body] != b"\n\n" or not data.startswith(_ENTRY_END, end):
        return None
    if _digest(data[body:end]) != entry.digest:
        return None
    return end + len(_ENTRY_END)


def _ends_with(path: str, entry: AppendedEntry) -> bool:
    """Whether the file at ``path`` ends with ``entry``'s text and terminator: the
    append wrote it whole. False when it cannot tell (another writer appended
    after it: the entry then reads as theirs, which is followed at the next run)."""
    want = entry.size + len(_ENTRY_END)
    try:
        fd = open_regular(memory_target(path))
    except OSError:
        return False
    if fd is None:
        return False
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, want, size - want) if size >= want else b""
    except OSError:
        return False
    finally:
        os.close(fd)
    return (
        len(tail) == want
        and tail.endswith(_ENTRY_END)
        and _digest(tail[: entry.size]) == entry.digest
    )


def _entry_at(data: bytes, at: int) -> bool:
    match = _ENTRY_HEADER.match(data, at)
    return match is not None and bool(match.group(1).strip()) and _is_timestamp(match.group(2))


def _next_entry(data: bytes, at: int) -> int:
    """Where the next entry after one starting at ``at`` starts (its end: ``len(data)``)."""
    for found in _NEXT_ENTRY.finditer(data, at):
        if _entry_at(data, found.end()):
            return found.end()
    return len(data)


def _change_after(tail: bytes, appended: list[AppendedEntry]) -> str | None:
    """How the bytes after the loaded ones (``tail``) differ from Swarms' own appends
    since the load, in order: None when they are exactly those, ``APPENDED``
    when whole entries of another writer's are among them, ``REWRITTEN`` when
    they are not entries or one of Swarms' is not there."""
    at, index, foreign = 0, 0, False
    while at < len(tail):
        end = _appended_end(tail, at, appended[index]) if index < len(appended) else None
        if end is not None:
            at, index = end, index + 1
            continue
        if not _entry_at(tail, at):
            return REWRITTEN
        foreign = True
        at = _next_entry(tail, at)
    if index < len(appended):
        return REWRITTEN
    return APPENDED if foreign else None


def _read_from(fd: int, offset: int) -> bytes:
    """The file's bytes from ``offset`` to its end."""
    chunks = []
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _read_prefix(fd: int, size: int) -> bytes:
    """Up to the first ``size`` bytes of the file (fewer when it is shorter)."""
    chunks = []
    offset = 0
    while offset < size and (chunk := os.pread(fd, min(1 << 20, size - offset), offset)):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _identity(fd: int) -> FileIdentity:
    info = os.fstat(fd)
    return (info.st_dev, info.st_ino)


def wrap_run(agent: Any, wiring: Wiring) -> None:
    """Make ``agent.run`` follow re-seeds first, and each model request after a run's
    first too (instance attributes over ``run`` and the conversation's ``to_messages``).

    swarms 16.0.3's ``Agent._run`` builds every request of its loop with
    ``short_memory.to_messages(name, start, prefix)`` right before the model call,
    so that is where a request after the first is held: when the run sends the
    whole history (``start`` 0, no prefix; ``run(messages=...)`` and the n
    samples of one run send their own rows, not the memory).
    """
    original: Callable[..., Any] = agent.run
    conversation = wiring.conversation
    build: Callable[..., Any] = conversation.to_messages
    attempt_run: Callable[..., Any] | None = getattr(agent, "_run", None)

    @functools.wraps(original)
    def run(*args: Any, **kwargs: Any) -> Any:
        wiring.before_run(kwargs)
        with wiring.lock:
            if not wiring.run_depth:  # a run inside a run (a tool's) goes on with it
                wiring.run_start = len(conversation.conversation_history)
                wiring.run_calls, wiring.run_base = 0, None
            wiring.run_depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            with wiring.lock:
                wiring.run_depth -= 1
                if not wiring.run_depth:
                    wiring.run_start, wiring.run_calls, wiring.run_base = None, 0, None
                    wiring.run_unanswered = False

    def attempt(*args: Any, **kwargs: Any) -> Any:
        # One model's attempt at the run (``run`` moves on to a fallback model
        # when it raises); a nested run's attempt is left as Swarms has it.
        with wiring.lock:
            outer, rebuilds = wiring.run_depth == 1, wiring.rebuilds
        assert attempt_run is not None
        try:
            return attempt_run(*args, **kwargs)
        except Exception:
            if outer and wiring.rebuilds != rebuilds:
                wiring.attempt_failed()
            raise

    @functools.wraps(build)
    def to_messages(agent_name: Any = None, start: int = 0, prefix: Any = ()) -> Any:
        if wiring.run_depth and start == 0 and not prefix:
            if wiring.run_calls:
                wiring.before_call()
            wiring.run_calls += 1
        return build(agent_name, start, prefix)

    append: Callable[..., Any] | None = getattr(conversation, "_append_to_memory_md", None)

    def append_to_memory(role: Any, content: Any, *args: Any, **kwargs: Any) -> Any:
        # Recorded under the wiring's lock, so a rebuild's read of the file and
        # its reset of the record fall before or after an append, never inside.
        assert append is not None
        with wiring.lock:
            content = _with_headers_quoted(content)
            entry = appended_entry(conversation, role, content)
            result = append(role, content, *args, **kwargs)
            # Swarms logs a failed write and goes on (a full disk): an entry
            # recorded but not in the file would read as a rewrite, and the
            # rebuild would drop the rows only the history holds.
            if (
                entry is not None
                and wiring.appended is not None
                and _ends_with(wiring.memory_path, entry)
            ):
                wiring.appended.append(entry)
            return result

    agent.run = run
    conversation.to_messages = to_messages
    if callable(append):
        conversation._append_to_memory_md = functools.wraps(append)(append_to_memory)
        with wiring.lock:
            wiring.appended = []
    if callable(attempt_run):
        agent._run = functools.wraps(attempt_run)(attempt)
