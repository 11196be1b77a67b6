"""Exact, incremental token counts of one MEMORY.md (the file-reading half).

The pure arithmetic is :mod:`memd.core.tokens`; this module decides, from
``fstat`` and a few bytes, whether a file only grew since the last count
(tokenize just the appended bytes plus the old unsafe tail) or must be counted
again from scratch: a different inode (replaced by rename), a smaller size
(truncated), or a changed prefix. Checking the whole prefix would cost as much
as counting it, so we keep a digest of the window of bytes just before the
safe offset: an in-place rewrite of the file's recent part changes it, and the
size/inode checks catch the rest of the ways files are normally rewritten. A
rewrite that keeps the inode and the size and leaves that window alone is not
seen: the count (and a compaction's figures made from it, and the count it
hands on, :func:`memd.compaction.snapshot_count`) is then the old bytes' until
the file is replaced.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import stat
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from memd.core.tokens import (
    DEFAULT_MAX_PIECE_BYTES,
    ENTRY_TERMINATOR,
    KEEP_TAIL_MAX_BYTES,
    CountBytes,
    CountState,
    PieceCounter,
    is_junction_cut,
)
from memd.errors import MemdError, NotARegularFile, describe_error
from memd.fsutil import iter_range, read_range

WINDOW_BYTES = 4096
# A count keeps exact points ("marks") so a compaction can take the tokens of the
# file's newest turns as the total less a mark's, instead of tokenizing them
# (memd.core.plan.kept_tail): one at most every 1/2**MARK_SHIFT of the count and
# never closer than MARK_MIN_TOKENS; only those in the newest half of the count are
# kept, so a file holds at most ~2**MARK_SHIFT of them, a small one none.
MARK_MIN_TOKENS = 4096
MARK_SHIFT = 7
# An append this close to the last count is read in one go (window, old tail
# and new bytes); larger stretches are read and fed block by block.
ONE_READ_BYTES = 1 << 20


class CountKind(StrEnum):
    UNCHANGED = "unchanged"
    APPENDED = "appended"
    RECOUNTED = "recounted"


@dataclass(frozen=True, slots=True)
class TrackedCount:
    state: CountState
    mtime_ns: int
    window_start: int
    # Digest of file[window_start:state.safe_offset]; None for a count a
    # compaction seeds from the file it has just written (trusted once, then
    # verified from the next count on). A count restored from the state DB has
    # one: a row without it is counted again (memd.core.plan.stored_count_trust).
    window_digest: bytes | None
    # Digest of the unsettled tail, file[state.safe_offset:state.size]: when it
    # is unchanged, its tokens are reused instead of tokenizing it again. A
    # cache hint, not part of the count (the state DB does not keep it).
    tail_digest: bytes | None = field(default=None, compare=False)
    # Marks: flat (offset, tokens) pairs, oldest first, each the exact count of
    # file[:offset] at an offset where counts add up (the state's safe offset at
    # some earlier count: a safe boundary, or a junction cut followed by "#"), so
    # the bytes from there to the end count state.tokens - tokens. A cache hint,
    # not part of the count; the state DB keeps them beside the count's row
    # (memd.state's count_marks), and a restored count keeps only those that fit
    # it (:func:`fitting_marks`).
    marks: tuple[int, ...] = field(default=(), compare=False)

    @property
    def tokens(self) -> int:
        return self.state.tokens

    @property
    def size(self) -> int:
        return self.state.size


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _read_exact(fd: int, start: int, end: int) -> bytes | None:
    """Bytes ``start..end`` or None when the file got shorter while reading."""
    data = read_range(fd, start, end)
    return data if len(data) == end - start else None


def _feed(fd: int, counter: PieceCounter, start: int, end: int) -> bool:
    """Feed bytes ``start..end`` block by block; False when the file got shorter."""
    seen = start
    for block in iter_range(fd, start, end):
        counter.feed(block)
        seen += len(block)
    return seen == end


def _track(
    state: CountState, mtime_ns: int, counter: PieceCounter, marks: tuple[int, ...] = ()
) -> TrackedCount:
    window_start = state.safe_offset - len(counter.recent)
    return TrackedCount(
        state,
        mtime_ns,
        window_start,
        _digest(counter.recent),
        _digest(counter.tail),
        _marks_after(state, marks),
    )


def _marks_after(state: CountState, marks: tuple[int, ...]) -> tuple[int, ...]:
    """The marks of a new count: a mark at its safe offset when the last is far enough;
    none once the count is estimated (its total less a mark would be a bound, not
    the tokens after the mark)."""
    if state.estimated:
        return ()
    tokens = state.safe_tokens
    if tokens - (marks[-1] if marks else 0) >= max(MARK_MIN_TOKENS, tokens >> MARK_SHIFT):
        return with_mark(marks, state)
    return marks


def with_mark(marks: tuple[int, ...], state: CountState) -> tuple[int, ...]:
    """``marks`` with the state's safe offset added, less those before the newest
    half of its count (an estimated count marks nothing: its tokens are a bound)."""
    if state.estimated:
        return ()
    keep_from = state.safe_tokens // 2
    first = 0
    while first < len(marks) and marks[first + 1] < keep_from:
        first += 2
    return (*marks[first:], state.safe_offset, state.safe_tokens)


def fitting_marks(marks: Sequence[int], state: CountState) -> tuple[int, ...]:
    """The marks (flat ``(offset, tokens)`` pairs) that can be ``state``'s own: whole
    pairs, offsets and tokens strictly increasing, each past 0 and at most the
    state's safe offset and safe tokens; none for an estimated count. Pairs that
    do not fit are dropped (a damaged or hand-edited state DB row), without an
    error: marks are a cache hint. Marks that fit but are off by a few tokens
    cannot be told apart from true ones without tokenizing: they are trusted as
    the restored count itself is."""
    if state.estimated or len(marks) % 2:
        return ()
    kept: list[int] = []
    last_offset = last_tokens = 0
    for offset, tokens in zip(marks[::2], marks[1::2], strict=True):
        if last_offset < offset <= state.safe_offset and last_tokens < tokens <= state.safe_tokens:
            kept += (offset, tokens)
            last_offset, last_tokens = offset, tokens
    return tuple(kept)


def count_file(
    path: Path,
    previous: TrackedCount | None,
    count_bytes: CountBytes,
    *,
    max_piece_bytes: int = DEFAULT_MAX_PIECE_BYTES,
    junction_cut: bool = False,
) -> tuple[TrackedCount, CountKind]:
    """Count ``path`` exactly, reusing ``previous`` when the file only grew.

    The file is read in blocks and counted in pieces of at most
    ``max_piece_bytes`` (see :class:`memd.core.tokens.PieceCounter`): memory
    stays bounded whatever the file's size or line length. Raises
    FileNotFoundError, PermissionError and other OSErrors from opening or
    reading, and NotARegularFile.
    """
    # O_NONBLOCK: a FIFO named MEMORY.md must not hang the counting thread.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        return count_fd(
            fd,
            path,
            previous,
            count_bytes,
            max_piece_bytes=max_piece_bytes,
            junction_cut=junction_cut,
        )
    finally:
        os.close(fd)


def count_fd(
    fd: int,
    path: Path,
    previous: TrackedCount | None,
    count_bytes: CountBytes,
    *,
    max_piece_bytes: int = DEFAULT_MAX_PIECE_BYTES,
    junction_cut: bool = False,
) -> tuple[TrackedCount, CountKind]:
    """:func:`count_file` on a file already open (``path`` only names it in errors)."""
    for _attempt in range(3):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(f"{path} is not a regular file")
        result = _count_open(fd, info, previous, count_bytes, max_piece_bytes, junction_cut)
        if result is not None:
            return result
        previous = None  # it shrank under us: count from scratch
    raise OSError(f"{path} kept shrinking while being counted")


def _count_open(
    fd: int,
    info: os.stat_result,
    previous: TrackedCount | None,
    count_bytes: CountBytes,
    max_piece_bytes: int,
    junction_cut: bool = False,
) -> tuple[TrackedCount, CountKind] | None:
    size = info.st_size
    if previous is not None:
        old = previous.state
        same_file = (old.dev, old.ino) == (info.st_dev, info.st_ino)
        # Same size is not trusted on mtime alone (timestamps are coarse): the
        # window and the tail are re-read, which costs a few KB.
        if same_file and size >= old.size:
            rest: bytes | None = None
            if size - previous.window_start <= ONE_READ_BYTES:
                # The usual append: window, old tail and new bytes in one read.
                data = _read_exact(fd, previous.window_start, size)
                if data is None:
                    return None
                split = old.safe_offset - previous.window_start
                window, rest = data[:split], data[split:]
            else:
                window_read = _read_exact(fd, previous.window_start, old.safe_offset)
                if window_read is None:
                    return None
                window = window_read
            if previous.window_digest is None or _digest(window) == previous.window_digest:
                return _extend_open(
                    fd, info, previous, window, count_bytes, max_piece_bytes, junction_cut, rest
                )
    return _recount_open(fd, info, count_bytes, max_piece_bytes)


def _recount_open(
    fd: int, info: os.stat_result, count_bytes: CountBytes, max_piece_bytes: int
) -> tuple[TrackedCount, CountKind] | None:
    counter = PieceCounter(count_bytes, max_piece_bytes=max_piece_bytes, window_bytes=WINDOW_BYTES)
    if not _feed(fd, counter, 0, info.st_size):
        return None
    state = counter.finish(info.st_dev, info.st_ino)
    return _track(state, info.st_mtime_ns, counter), CountKind.RECOUNTED


def _extend_open(
    fd: int,
    info: os.stat_result,
    previous: TrackedCount,
    window: bytes,
    count_bytes: CountBytes,
    max_piece_bytes: int,
    junction_cut: bool,
    rest: bytes | None = None,
) -> tuple[TrackedCount, CountKind] | None:
    """Count from ``previous`` on: the old tail and the appended bytes (``rest``,
    the file from the old safe offset to ``info.st_size``, when already read).

    With the old tail's digest, the tail is not tokenized again when it is
    unchanged and nothing was appended, or when the old end is a junction cut
    (:func:`memd.core.tokens.is_junction_cut`): its tokens settle as they are.
    A tail rewritten in place is counted from scratch (the old end may have
    been a junction cut that only held for the bytes it had after it).
    """
    old = previous.state
    size = info.st_size
    start, recent = old, window
    if previous.tail_digest is not None and old.size > old.safe_offset and not old.open_run:
        if rest is not None:
            data: bytes | None = rest[: min(size, old.size + 1) - old.safe_offset]
        else:
            data = _read_exact(fd, old.safe_offset, min(size, old.size + 1))
        if data is None:
            return None
        tail = data[: old.size - old.safe_offset]
        if _digest(tail) != previous.tail_digest:
            return _recount_open(fd, info, count_bytes, max_piece_bytes)
        if size == old.size:
            unchanged = TrackedCount(
                old,
                info.st_mtime_ns,
                previous.window_start,
                previous.window_digest,
                previous.tail_digest,
                previous.marks,
            )
            return unchanged, CountKind.UNCHANGED
        if junction_cut and is_junction_cut(tail, data[len(tail) :]):
            if rest is not None:
                appended = rest[len(tail) :]
                if len(appended) <= min(KEEP_TAIL_MAX_BYTES, max_piece_bytes) and appended.endswith(
                    ENTRY_TERMINATOR
                ):
                    return _settle_and_keep(previous, info, window + tail, appended, count_bytes)
            # (Built directly: dataclasses.replace costs several µs per count.)
            start = CountState(
                dev=old.dev,
                ino=old.ino,
                size=old.size,
                safe_offset=old.size,
                safe_tokens=old.tokens,
                tail_tokens=0,
                estimated=old.estimated,
                open_run=old.open_run,
            )
            recent = (window + tail)[-WINDOW_BYTES:]
    counter = PieceCounter.resume(
        start,
        count_bytes,
        max_piece_bytes=max_piece_bytes,
        window_bytes=WINDOW_BYTES,
        recent=recent,
        keep_entry_tail=start is not old,  # settled at a junction cut
    )
    if rest is not None:
        counter.feed(rest[start.safe_offset - old.safe_offset :])
    elif not _feed(fd, counter, start.safe_offset, size):
        return None
    state = counter.finish(old.dev, old.ino)
    kind = CountKind.UNCHANGED if state == old else CountKind.APPENDED
    return _track(state, info.st_mtime_ns, counter, previous.marks), kind


def _settle_and_keep(
    previous: TrackedCount,
    info: os.stat_result,
    settled: bytes,
    appended: bytes,
    count_bytes: CountBytes,
) -> tuple[TrackedCount, CountKind]:
    """The usual append, without a :class:`PieceCounter`: the old tail settles at a
    junction cut with the tokens it has, and ``appended`` (whole entries, read
    already) is the new tail, tokenized once. ``settled`` ends at the old end (the
    window and the old tail, both verified). What the counter would do with the
    same bytes (``resume`` at the junction with ``keep_entry_tail``, ``feed``,
    ``finish``), without its objects: the per-append path of the daemon."""
    old = previous.state
    state = CountState(
        dev=old.dev,
        ino=old.ino,
        size=info.st_size,
        safe_offset=old.size,
        safe_tokens=old.tokens,
        tail_tokens=count_bytes(appended),
        estimated=old.estimated,
        open_run=False,
    )
    recent = settled[-WINDOW_BYTES:]
    tracked = TrackedCount(
        state,
        info.st_mtime_ns,
        old.size - len(recent),
        _digest(recent),
        _digest(appended),
        _marks_after(state, previous.marks),
    )
    return tracked, CountKind.APPENDED


# --------------------------------------------------------------- many files

# (tracked, kind, failure reason); tracked None with no failure = no such file.
CountResult = tuple["TrackedCount | None", CountKind, "str | None"]


class Stopping(Protocol):
    """What a long count looks at between results: the daemon's exit state (a flag
    a signal handler sets), read, never called back."""

    @property
    def should_exit(self) -> bool: ...


class _NeverStops:
    should_exit = False


_NEVER = _NeverStops()

# Below this many bytes to count, forking workers costs more than it saves.
POOL_MIN_BYTES = 4 << 20
# How often a wait for the pool's results looks at ``stop``.
_STOP_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class CountJob:
    path: str
    previous: TrackedCount | None = None


def count_one(job: CountJob, count_bytes: CountBytes, max_piece_bytes: int) -> CountResult:
    """Count one file; failures come back as one line of text (never raised)."""
    try:
        tracked, kind = count_file(
            Path(job.path), job.previous, count_bytes, max_piece_bytes=max_piece_bytes
        )
    except FileNotFoundError:
        return None, CountKind.RECOUNTED, None
    except (OSError, MemdError, ValueError) as exc:
        return None, CountKind.RECOUNTED, describe_error(exc)
    return tracked, kind, None


# What the forked workers count with: set in the parent just before the fork
# and inherited (the loaded encoding is never pickled or loaded again).
_WORKER_COUNTER: list[tuple[CountBytes, int]] = []


def _count_batch(batch: list[tuple[int, CountJob]]) -> list[tuple[int, CountResult]]:
    count_bytes, max_piece = _WORKER_COUNTER[0]
    return [(index, count_one(job, count_bytes, max_piece)) for index, job in batch]


def worker_count(files: int) -> int:
    """How many workers count ``files`` files at once: one per core, never more
    than there are files, at least one."""
    return max(1, min(files, os.cpu_count() or 1))


def pool_workers(paths: Sequence[str]) -> int:
    """Forked workers to count ``paths`` with (1: count in this process), as the
    daemon's start-up and ``memd status`` both decide it."""
    workers = worker_count(len(paths))
    return workers if pool_worth_it(paths, workers) else 1


def pool_worth_it(paths: Iterable[str], workers: int, *, min_bytes: int = POOL_MIN_BYTES) -> bool:
    """Whether forking ``workers`` pays off: several cores, no other thread (fork
    is only safe then), and megabytes to count (a stat per file, stopping early)."""
    if workers < 2 or threading.active_count() > 1:
        return False
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += os.stat(path).st_size
        if total >= min_bytes:
            return True
    return False


def count_many(
    jobs: Sequence[CountJob],
    count_bytes: CountBytes,
    *,
    max_piece_bytes: int = DEFAULT_MAX_PIECE_BYTES,
    workers: int = 1,
    stop: Stopping = _NEVER,
) -> Iterator[tuple[int, CountResult]]:
    """``(index into jobs, result)`` for each job, in the order they finish.

    With ``workers > 1`` the files are counted in a pool of forked processes
    (the caller checked :func:`pool_worth_it`: no other thread may exist), so
    every core tokenizes; else one by one here. ``stop.should_exit`` is looked at
    between results: when it turns true the workers are killed and the iteration ends
    (SIGTERM must not wait for a big file). A worker that dies (the OOM killer)
    does not raise: the files it had not finished come back as failures, to be
    counted again later.
    """
    if workers < 2:
        for index, job in enumerate(jobs):
            if stop.should_exit:
                return
            yield index, count_one(job, count_bytes, max_piece_bytes)
        return
    yield from _count_forked(jobs, count_bytes, max_piece_bytes, workers, stop)


def _count_forked(
    jobs: Sequence[CountJob],
    count_bytes: CountBytes,
    max_piece_bytes: int,
    workers: int,
    stop: Stopping,
) -> Iterator[tuple[int, CountResult]]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    indexed = list(enumerate(jobs))
    # Small batches (pickling 30,000 jobs one by one costs), but several per
    # worker so one big file does not hold a whole batch of small ones back.
    size = max(1, min(64, len(indexed) // (workers * 8)))
    batches = [indexed[start : start + size] for start in range(0, len(indexed), size)]
    count_bytes(b"")  # a lazily loaded encoding: loaded here once, not in every worker
    _WORKER_COUNTER[:] = [(count_bytes, max_piece_bytes)]
    # The workers collect cycles whatever the parent's collector is doing (the
    # daemon pauses it for its start-up pass, and a fork inherits that).
    pool = ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("fork"), initializer=gc.enable
    )
    complete = False
    try:
        pending: dict[Future[list[tuple[int, CountResult]]], list[tuple[int, CountJob]]] = {
            pool.submit(_count_batch, batch): batch for batch in batches
        }
        while pending:
            if stop.should_exit:
                return
            finished, _ = wait(pending, timeout=_STOP_POLL_S, return_when=FIRST_COMPLETED)
            for future in finished:
                batch = pending.pop(future)
                try:
                    results = future.result()
                except BrokenProcessPool:
                    failure = "a counting worker died (out of memory?); will retry"
                    results = [(i, (None, CountKind.RECOUNTED, failure)) for i, _ in batch]
                yield from results
        complete = True
    finally:
        if not complete:
            _kill_workers(pool)
        with contextlib.suppress(Exception):
            pool.shutdown(wait=True, cancel_futures=True)
        _WORKER_COUNTER.clear()


def _kill_workers(pool: Any) -> None:
    """Stop a pool's workers without waiting for the files they are counting
    (``ProcessPoolExecutor`` has no public way before Python 3.14)."""
    processes = getattr(pool, "_processes", None) or {}
    for process in list(processes.values()):
        with contextlib.suppress(Exception):
            process.terminate()


def count_data(
    data: bytes,
    dev: int,
    ino: int,
    mtime_ns: int,
    previous: TrackedCount | None,
    count_bytes: CountBytes,
    *,
    max_piece_bytes: int = DEFAULT_MAX_PIECE_BYTES,
) -> tuple[TrackedCount, CountKind]:
    """Count a file's bytes already read (a compaction's snapshot), exactly: from
    ``previous`` when ``data`` is the same inode, only grown past it, with the same
    window before its safe offset; from scratch otherwise."""
    if previous is not None:
        old = previous.state
        if (old.dev, old.ino) == (dev, ino) and len(data) >= old.size:
            window = data[previous.window_start : old.safe_offset]
            if previous.window_digest is None or _digest(window) == previous.window_digest:
                counter = PieceCounter.resume(
                    old,
                    count_bytes,
                    max_piece_bytes=max_piece_bytes,
                    window_bytes=WINDOW_BYTES,
                    recent=window,
                )
                counter.feed(data[old.safe_offset :])
                state = counter.finish(dev, ino)
                kind = CountKind.UNCHANGED if state == old else CountKind.APPENDED
                return _track(state, mtime_ns, counter, previous.marks), kind
    counter = PieceCounter(count_bytes, max_piece_bytes=max_piece_bytes, window_bytes=WINDOW_BYTES)
    counter.feed(data)
    return _track(counter.finish(dev, ino), mtime_ns, counter), CountKind.RECOUNTED


__all__ = [
    "MARK_MIN_TOKENS",
    "MARK_SHIFT",
    "POOL_MIN_BYTES",
    "WINDOW_BYTES",
    "CountJob",
    "CountKind",
    "CountResult",
    "NotARegularFile",
    "TrackedCount",
    "count_data",
    "count_fd",
    "count_file",
    "count_many",
    "count_one",
    "fitting_marks",
    "pool_workers",
    "pool_worth_it",
    "with_mark",
    "worker_count",
]
