"""Exact, incremental token counts of one MEMORY.md (the file-reading half).

The pure arithmetic is :mod:`memd.core.tokens`; this module decides, from
``fstat`` and a few bytes, whether a file only grew since the last count
(tokenize just the appended bytes plus the old unsafe tail) or must be counted
again from scratch: a different inode (replaced by rename), a smaller size
(truncated), or a changed prefix. Checking the whole prefix would cost as much
as counting it, so we keep a digest of the window of bytes just before the
safe offset: an in-place rewrite of the file's recent part changes it, and the
size/inode checks catch the rest of the ways files are normally rewritten.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from memd.core.tokens import CountBytes, CountState, extend_count, full_count
from memd.errors import NotARegularFile
from memd.fsutil import read_range

WINDOW_BYTES = 4096


class CountKind(StrEnum):
    UNCHANGED = "unchanged"
    APPENDED = "appended"
    RECOUNTED = "recounted"


@dataclass(frozen=True, slots=True)
class TrackedCount:
    state: CountState
    mtime_ns: int
    window_start: int
    # Digest of file[window_start:state.safe_offset]; None when restored from
    # the state DB (trusted once, then verified from the next count on).
    window_digest: bytes | None

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


def _track(state: CountState, mtime_ns: int, data: bytes, data_start: int) -> TrackedCount:
    """Build the tracked count; ``data`` holds the file from ``data_start`` to its size."""
    window_start = max(data_start, state.safe_offset - WINDOW_BYTES)
    window = memoryview(data)[window_start - data_start : state.safe_offset - data_start]
    return TrackedCount(state, mtime_ns, window_start, _digest(window))


def count_file(
    path: Path, previous: TrackedCount | None, count_bytes: CountBytes
) -> tuple[TrackedCount, CountKind]:
    """Count ``path`` exactly, reusing ``previous`` when the file only grew.

    Raises FileNotFoundError, PermissionError and other OSErrors from opening
    or reading, and NotARegularFile.
    """
    # O_NONBLOCK: a FIFO named MEMORY.md must not hang the counting thread.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        return count_fd(fd, path, previous, count_bytes)
    finally:
        os.close(fd)


def count_fd(
    fd: int, path: Path, previous: TrackedCount | None, count_bytes: CountBytes
) -> tuple[TrackedCount, CountKind]:
    """:func:`count_file` on a file already open (``path`` only names it in errors)."""
    for _attempt in range(3):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(f"{path} is not a regular file")
        result = _count_open(fd, info, previous, count_bytes)
        if result is not None:
            return result
        previous = None  # it shrank under us: count from scratch
    raise OSError(f"{path} kept shrinking while being counted")


def _count_open(
    fd: int, info: os.stat_result, previous: TrackedCount | None, count_bytes: CountBytes
) -> tuple[TrackedCount, CountKind] | None:
    size = info.st_size
    if previous is not None:
        old = previous.state
        same_file = (old.dev, old.ino) == (info.st_dev, info.st_ino)
        # Same size is not trusted on mtime alone (timestamps are coarse): the
        # window and the tail are re-read, which costs a few KB.
        if same_file and size >= old.size:
            data = _read_exact(fd, previous.window_start, size)
            if data is None:
                return None
            cut = old.safe_offset - previous.window_start
            window_ok = previous.window_digest is None or (
                _digest(memoryview(data)[:cut]) == previous.window_digest
            )
            if window_ok:
                state = extend_count(old, count_bytes, data[cut:], size)
                kind = CountKind.UNCHANGED if state == old else CountKind.APPENDED
                return _track(state, info.st_mtime_ns, data, previous.window_start), kind
    data = _read_exact(fd, 0, size)
    if data is None:
        return None
    state = full_count(count_bytes, data, info.st_dev, info.st_ino)
    return _track(state, info.st_mtime_ns, data, 0), CountKind.RECOUNTED


__all__ = ["WINDOW_BYTES", "CountKind", "NotARegularFile", "TrackedCount", "count_fd", "count_file"]
