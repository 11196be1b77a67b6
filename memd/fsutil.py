"""Files and locks: the durable-write and flock primitives the transaction is built from.

Everything that must survive a crash goes through ``write_new_file`` (create
exclusively, write, fsync) followed by a rename or link and ``fsync_dir``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memd.errors import LockTimeout

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# memd's own files are never symlinks: refusing to follow one means a planted
# link cannot make memd write (or read) outside the workspace.
_PRIVATE_RW = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
_READ_CHUNK = 1 << 20


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` as 0700, or accept it if it is a real directory we own.

    A symlink, or a folder owned by another user (an agent could plant one,
    full of symlinks), is refused: memd writes its lock and journal in here.
    """
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE)
        fsync_dir(path.parent)
        return
    except FileExistsError:
        pass
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a real directory", str(path))
    if st.st_uid != os.geteuid():
        raise PermissionError(
            errno.EPERM, f"owned by uid {st.st_uid}, not memd's uid {os.geteuid()}", str(path)
        )
    if st.st_mode & 0o077:
        with contextlib.suppress(PermissionError):
            path.chmod(PRIVATE_DIR_MODE)


def ensure_dir_created(path: Path, mode: int = PRIVATE_DIR_MODE) -> bool:
    """Create ``path`` if missing (never touching an existing one); True if created.

    For the archive folder: agents may own it and read it, so an existing
    folder keeps its mode; only one memd creates is private.
    """
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        if not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path)) from None
        return False
    fsync_dir(path.parent)
    return True


def share_with_group(path: Path, mode: int, gid: int | None) -> None:
    """Give ``path`` exactly ``mode`` and, when set, group ``gid``.

    chmod is explicit because memd's umask (0077 under the shipped unit) masks
    the mode given at creation; chown comes first because it may clear setgid.
    A group memd may not give (not root, not a member) leaves ``path`` private:
    memd's own group must never gain what was meant for the agent's.
    """
    if gid is not None:
        try:
            os.chown(path, -1, gid)
        except PermissionError:
            mode &= 0o700
    os.chmod(path, mode)


class ShortWrite(OSError):
    """``write_all`` failed part-way (ENOSPC is often short): ``written`` bytes landed."""

    def __init__(self, error: OSError, written: int) -> None:
        super().__init__(error.errno, error.strerror, error.filename)
        self.written = written


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    written = 0
    try:
        while written < len(view):
            written += os.write(fd, view[written:])
    except OSError as exc:
        raise ShortWrite(exc, written) from exc


def write_new_file(
    path: Path, chunks: list[bytes], mode: int = PRIVATE_FILE_MODE
) -> os.stat_result:
    """Create ``path`` exclusively, write ``chunks``, fsync; returns its stat.

    A stale file at ``path`` (a temp left by a crash) is removed first.
    """
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        for chunk in chunks:
            write_all(fd, chunk)
        os.fsync(fd)
        return os.fstat(fd)
    except BaseException:
        os.close(fd)
        fd = -1
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    finally:
        if fd >= 0:
            os.close(fd)


def iter_range(fd: int, start: int, end: int | None = None) -> Iterator[bytes]:
    """Chunks of bytes ``[start, end)`` of an open file (``end`` None: to EOF)."""
    offset = start
    while end is None or offset < end:
        want = _READ_CHUNK if end is None else min(_READ_CHUNK, end - offset)
        chunk = os.pread(fd, want, offset)
        if not chunk:
            return
        yield chunk
        offset += len(chunk)


def read_range(fd: int, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of an open file (short only at end of file)."""
    return b"".join(iter_range(fd, start, end))


def read_to_end(fd: int) -> bytes:
    return b"".join(iter_range(fd, 0))


def sha256_prefix(fd: int, length: int) -> str:
    """sha256 of the first ``length`` bytes; "" when the file is shorter."""
    digest = hashlib.sha256()
    seen = 0
    for chunk in iter_range(fd, 0, length):
        digest.update(chunk)
        seen += len(chunk)
    return digest.hexdigest() if seen == length else ""


def link_unique(source: Path, directory: Path, stem: str, suffix: str = ".md") -> Path:
    """Hard-link ``source`` as ``stem{suffix}``, else ``stem_1{suffix}``, ``stem_2``, …

    ``link()`` fails when the name exists, so an existing file is never
    overwritten, even by a racing process.
    """
    attempt = 0
    while True:
        name = f"{stem}{suffix}" if attempt == 0 else f"{stem}_{attempt}{suffix}"
        target = directory / name
        try:
            os.link(source, target)
        except FileExistsError:
            attempt += 1
            continue
        return target


class AgentLock:
    """The per-agent compaction lock: ``flock`` on a file that is never renamed.

    It serializes compactors (daemons, ``compact-now``, ``forget``) across
    processes; writers never take it.
    """

    def __init__(self, path: Path, agent: str) -> None:
        self.path = path
        self.agent = agent
        self._fd = -1

    def acquire(self, wait_s: float, poll_s: float = 0.05) -> None:
        fd = os.open(self.path, _PRIVATE_RW | os.O_CREAT, PRIVATE_FILE_MODE)
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise LockTimeout(
                        f"agent {self.agent!r}: another compaction holds its lock "
                        f"(waited {wait_s:g}s)"
                    ) from None
                time.sleep(poll_s)
                continue
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1

    @contextlib.contextmanager
    def held(self, wait_s: float) -> Iterator[None]:
        self.acquire(wait_s)
        try:
            yield
        finally:
            self.release()


def unlink_quiet(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


class SlotJournal:
    """A small durable record updated in place: two checksummed slots, A/B.

    Each write goes to the slot not holding the latest record, then
    ``fdatasync``: a torn write can only damage the slot being written, so
    the previous record stays readable. The file is created once and kept
    (like the lock), so an update costs one data sync and no directory sync.
    """

    SLOT_SIZE = 4096

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seq = -1

    def _open(self) -> int:
        try:
            return os.open(self.path, _PRIVATE_RW)
        except FileNotFoundError:
            fd = os.open(self.path, _PRIVATE_RW | os.O_CREAT, PRIVATE_FILE_MODE)
            os.fsync(fd)
            fsync_dir(self.path.parent)
            return fd

    @classmethod
    def _decode(cls, raw: bytes) -> tuple[int, dict[str, Any]] | None:
        text = raw.rstrip(b" \x00\n")
        if not text:
            return None
        try:
            record = json.loads(text)
            body = record["body"]
            canonical = json.dumps(body, sort_keys=True).encode()
            if hashlib.sha256(canonical).hexdigest() != record["sha256"]:
                return None
            return int(record["seq"]), dict(body)
        except (ValueError, KeyError, TypeError):
            return None

    def read(self) -> dict[str, Any] | None:
        """The latest intact record, or None when there is none."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            records = [
                decoded
                for slot in (0, 1)
                if (decoded := self._decode(os.pread(fd, self.SLOT_SIZE, slot * self.SLOT_SIZE)))
            ]
        finally:
            os.close(fd)
        if not records:
            return None
        seq, body = max(records, key=lambda record: record[0])
        self._seq = max(self._seq, seq)
        return body

    def write(self, body: dict[str, Any]) -> None:
        if self._seq < 0:
            self.read()
        seq = self._seq + 1
        canonical = json.dumps(body, sort_keys=True)
        record = json.dumps(
            {"seq": seq, "sha256": hashlib.sha256(canonical.encode()).hexdigest(), "body": body},
            sort_keys=True,
        ).encode()
        if len(record) >= self.SLOT_SIZE:
            raise ValueError(f"journal record too large ({len(record)} bytes)")
        fd = self._open()
        try:
            os.pwrite(fd, record.ljust(self.SLOT_SIZE, b" "), (seq % 2) * self.SLOT_SIZE)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        self._seq = seq
