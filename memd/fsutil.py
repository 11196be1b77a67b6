"""Files and locks: the durable-write and flock primitives the transaction is built from.

Everything that must survive a crash goes through ``create_file_at`` (create
exclusively in a pinned folder, write, fsync) followed by a rename or link and
an fsync of the folder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import pwd
import socket
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memd.errors import ConfigError, LockTimeout, NotARegularFile

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


# Missing parents of a folder memd makes: readable by all, writable by their
# owner only, whatever the umask (pathlib's parents=True makes them 0777 & ~umask).
PARENT_DIR_MODE = 0o755


def make_parents(directory: Path) -> None:
    """Make ``directory``'s missing ancestors, :data:`PARENT_DIR_MODE`, never more open."""
    missing = []
    parent = directory.parent
    while parent != parent.parent and not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, PARENT_DIR_MODE)


def ensure_private_dir(directory: Path, what: str = "state dir") -> None:
    """``directory`` made 0700 when missing (missing parents 0755, whatever the
    umask), then refused (ConfigError, one line naming the fix) when it is not
    memd's own: owned by another uid than memd's (or root's), or writable by
    its group or others. Another user who made memd's state dir first (a /tmp
    path, a parent made 0777) could read what memd writes there, or plant the
    files memd then writes every agent's text into."""
    if not directory.is_dir():
        make_parents(directory)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
            with contextlib.suppress(OSError):
                os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
    check_private(directory, what, folder=True)


def check_private(path: Path, what: str, *, folder: bool = False) -> None:
    """Refuse (ConfigError) ``path`` unless it belongs to memd's uid (or root) and
    no group or other may write it; a file of memd's that others may read is
    made 0600. Missing: nothing to say."""
    try:
        found = os.stat(path) if folder else os.lstat(path)
    except FileNotFoundError:
        return
    uid = os.geteuid()
    if found.st_uid not in (uid, 0) and not _root_trusts(path, found.st_uid, folder=folder):
        raise ConfigError(
            f"{what} {path} is owned by uid {found.st_uid}, not by memd's user (uid {uid}): "
            "another user could read or replace what memd keeps there; remove it and let "
            f"memd make it (or chown {uid} {path})"
        )
    if not folder and not stat.S_ISREG(found.st_mode):
        raise ConfigError(f"{what} {path} is not a regular file; remove it and let memd make it")
    mode = stat.S_IMODE(found.st_mode)
    if mode & 0o022:
        planted = "plant or replace files in it" if folder else "change it"
        raise ConfigError(
            f"{what} {path} has mode {mode:04o}: other users could {planted}; chmod go-w {path}"
        )
    if not folder and mode & 0o077:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.fchmod(fd, PRIVATE_FILE_MODE)
        finally:
            os.close(fd)


def _root_trusts(path: Path, owner: int, *, folder: bool) -> bool:
    """Root (a command beside the daemon: it then acts as the state dir's owner,
    :func:`as_owner_of`) takes memd's user's state dir when nobody but root or
    that user could have put it there: its parent is theirs and no group or
    other may write in it (``/var/lib/memd``, not a ``/tmp`` path). A file there
    may be that folder owner's."""
    if os.geteuid() != 0:
        return False
    try:
        parent = os.stat(path.parent)
    except OSError:
        return False
    if not folder:
        return parent.st_uid == owner
    return parent.st_uid in (0, owner) and not parent.st_mode & 0o022


ACL_ACCESS = "system.posix_acl_access"
ACL_DEFAULT = "system.posix_acl_default"
# No ACL on the file, or none on this filesystem (or no xattrs at all).
_NO_ACL = frozenset({errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP})


def read_acl(fd: int) -> bytes | None:
    """The file's POSIX access ACL (the kernel's xattr bytes); None when it has none."""
    try:
        return os.getxattr(fd, ACL_ACCESS)
    except OSError as exc:
        if exc.errno in _NO_ACL:
            return None
        raise


def has_acl(fd: int) -> bool:
    """Whether the file (a folder: or its default) carries a POSIX ACL."""
    for name in (ACL_ACCESS, ACL_DEFAULT):
        try:
            os.getxattr(fd, name)
        except OSError as exc:
            if exc.errno in _NO_ACL:
                continue
            raise
        return True
    return False


def set_acl(fd: int, acl: bytes | None) -> None:
    """Give the file exactly ``acl`` (None: none, mode bits only). A file memd
    creates inherits its folder's default ACL; this replaces what it inherited,
    so nobody the source's ACL left out reads the copy (its mode follows the
    ACL's owner, mask and other entries)."""
    try:
        if acl is None:
            os.removexattr(fd, ACL_ACCESS)
        else:
            os.setxattr(fd, ACL_ACCESS, acl)
    except OSError as exc:
        if exc.errno not in _NO_ACL:
            raise


def share_with_group(target: Path | int, mode: int, gid: int | None) -> None:
    """Give ``target`` (a path, or an open fd) exactly ``mode`` and, when set, group ``gid``.

    chmod is explicit because memd's umask (0077 under the shipped unit) masks
    the mode given at creation; chown comes first because it may clear setgid.
    A group memd may not give (not root, not a member) leaves ``target`` private:
    memd's own group must never gain what was meant for the agent's.
    """
    if gid is not None:
        try:
            if isinstance(target, int):
                os.fchown(target, -1, gid)
            else:
                os.chown(target, -1, gid)
        except PermissionError:
            mode &= 0o700
    if isinstance(target, int):
        os.fchmod(target, mode)
    else:
        os.chmod(target, mode)


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


def create_file_at(
    dir_fd: int, name: str, chunks: Iterable[bytes | memoryview], mode: int = PRIVATE_FILE_MODE
) -> int:
    """Create ``name`` in the folder ``dir_fd`` exclusively, write, fsync; returns the open fd.

    ``chunks`` is consumed once, piece by piece: a generator (:func:`iter_range`
    of another file) streams a copy in bounded memory. A failure part-way
    removes the file, so a retry starts from an empty one (never a byte twice).

    The fd is open for reading and appending, so the caller keeps working on
    this inode whatever later happens to the name. A stale file (a temp left by
    a crash) is removed first; a symlink there is removed, never followed.
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    try:
        for chunk in chunks:
            write_all(fd, chunk)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    return fd


def link_unique_at(
    src_dir_fd: int, src_name: str, dst_dir_fd: int, stem: str, suffix: str = ".md"
) -> str:
    """Hard-link ``src_name`` as ``stem{suffix}``, else ``stem_1{suffix}``, ``stem_2``, …

    ``link()`` fails when the name exists, so an existing file is never
    overwritten, even by a racing process. Returns the name made in ``dst_dir_fd``."""
    attempt = 0
    while True:
        name = f"{stem}{suffix}" if attempt == 0 else f"{stem}_{attempt}{suffix}"
        try:
            os.link(
                src_name,
                name,
                src_dir_fd=src_dir_fd,
                dst_dir_fd=dst_dir_fd,
                follow_symlinks=False,
            )
        except FileExistsError:
            attempt += 1
            continue
        return name


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
    if end <= start:
        return b""
    # Usually one pread returns it all (the daemon's per-append read): no generator.
    first = os.pread(fd, end - start, start)
    if len(first) == end - start or not first:
        return first
    return first + b"".join(iter_range(fd, start + len(first), end))


def read_to_end(fd: int) -> bytes:
    return b"".join(iter_range(fd, 0))


# The lock file's content names its holder (format 1): written by whoever takes
# the lock, read only by whoever finds it held, so a timeout can say who holds it.
# An empty file (memd before format 1) or an unknown format names no one.
LOCK_HOLDER_FORMAT = "memd-lock-holder 1"
_HOLDER_MAX_BYTES = 512


def _holder_command() -> str:
    """What this process is, as an operator would name it: ``memd run``,
    ``memd compact-now``; another program by its file name."""
    argv = sys.argv
    program = os.path.basename(argv[0]) if argv and argv[0] else "python"
    if (
        program in {"memd", "__main__.py", "-m", "-c"}
        and len(argv) > 1
        and not argv[1].startswith("-")
    ):
        program = f"memd {argv[1]}"
    elif program in {"__main__.py", "-m", "-c"}:
        program = "memd"
    return "".join(ch if ch.isprintable() else "?" for ch in program)[:80]


def _this_host() -> str:
    host = "".join(ch if ch.isprintable() and ch != " " else "?" for ch in socket.gethostname())
    return host[:64]


def holder_record(now: float | None = None) -> bytes:
    """This process as the lock's holder: pid, host, command and since when (UTC)."""
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    fields = f"pid={os.getpid()}\nhost={_this_host()}\ncommand={_holder_command()}\nsince={since}\n"
    return f"{LOCK_HOLDER_FORMAT}\n{fields}".encode()


def _holder_fields(record: bytes) -> dict[str, str] | None:
    lines = record.decode("utf-8", "replace").splitlines()
    if not lines or lines[0] != LOCK_HOLDER_FORMAT:
        return None
    fields = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    if not fields.get("pid", "").isdigit() or not fields.get("command"):
        return None
    return fields


def describe_holder(record: bytes) -> str | None:
    """``memd run, pid 41 on host h since 2026-12-03T06:40:01Z`` from a holder
    record; None when the record names no one (empty, an older memd, garbled)."""
    fields = _holder_fields(record)
    return None if fields is None else _described(fields)


def _described(fields: dict[str, str]) -> str:
    where = f" on host {fields['host']}" if fields.get("host") else ""
    since = f" since {fields['since']}" if fields.get("since") else ""
    return f"{fields['command']}, pid {fields['pid']}{where}{since}"


def _gone_from_this_host(fields: dict[str, str]) -> bool:
    """Whether the record's holder was on this host and runs no more: a holder
    killed before it let go left its record, and the lock is now held by one that
    wrote none (an older memd, a failed write). Naming the dead pid would send an
    operator to stop whatever has that pid now."""
    if fields.get("host") != _this_host():
        return False
    try:
        os.kill(int(fields["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):
        return False
    return False


class AgentLock:
    """The per-agent compaction lock: ``flock`` on a file that is never renamed.

    It serializes compactors (daemons, ``compact-now``, ``forget``) across
    processes; writers never take it. The holder writes who it is into the file
    (:func:`holder_record`), so that a process that finds the lock held can say
    who holds it: a `compact-now` stuck on a slow model, a second daemon.
    """

    def __init__(self, path: Path, agent: str, *, dir_fd: int | None = None) -> None:
        self.path = path
        self.agent = agent
        self._dir_fd = dir_fd
        self._fd = -1

    def acquire(self, wait_s: float, poll_s: float = 0.05) -> None:
        fd = _open_private(self.path, _PRIVATE_RW | os.O_CREAT, self._dir_fd)
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    held_by = f"{holder}; " if holder else ""
                    raise LockTimeout(
                        f"agent {self.agent!r}: another compaction holds its lock "
                        f"({held_by}waited {wait_s:g}s)"
                    ) from None
                time.sleep(poll_s)
                continue
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            _write_holder(fd)
            return

    def release(self) -> None:
        if self._fd >= 0:
            # The record goes with the hold: left behind, it would name this process
            # as the holder to whoever meets the lock held by one that writes none.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
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


def _write_holder(fd: int) -> None:
    # Best effort: who holds the lock is for the operator's messages; a full disk
    # must not stop the compaction that took it.
    # Emptied first: a write that fails must not leave an earlier holder's record.
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_record(), 0)


def _read_holder(fd: int) -> str | None:
    try:
        fields = _holder_fields(os.pread(fd, _HOLDER_MAX_BYTES, 0))
    except OSError:
        return None
    if fields is None or _gone_from_this_host(fields):
        return None
    return _described(fields)


def _open_private(path: Path, flags: int, dir_fd: int | None) -> int:
    """Open one of memd's own files: by name in a pinned folder when given one.

    Never a symlink, never blocking (a FIFO planted there must not hang memd),
    never anything but a regular file.
    """
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    if dir_fd is None:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    else:
        fd = os.open(path.name, flags, PRIVATE_FILE_MODE, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotARegularFile(f"{path} is not a regular file")
    return fd


class SlotJournal:
    """A small durable record updated in place: two checksummed slots, A/B.

    Each write goes to the slot not holding the latest record, then
    ``fdatasync``: a torn write can only damage the slot being written, so
    the previous record stays readable. The file is created once and kept
    (like the lock), so an update costs one data sync and no directory sync.
    """

    SLOT_SIZE = 4096

    def __init__(self, path: Path, *, dir_fd: int | None = None) -> None:
        self.path = path
        self._dir_fd = dir_fd
        self._seq = -1

    def exists(self) -> bool:
        try:
            fd = _open_private(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, self._dir_fd)
        except FileNotFoundError:
            return False
        os.close(fd)
        return True

    def _open(self) -> int:
        try:
            return _open_private(self.path, _PRIVATE_RW, self._dir_fd)
        except FileNotFoundError:
            fd = _open_private(self.path, _PRIVATE_RW | os.O_CREAT, self._dir_fd)
            os.fsync(fd)
            if self._dir_fd is None:
                fsync_dir(self.path.parent)
            else:
                os.fsync(self._dir_fd)
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
        except (ValueError, KeyError, TypeError, RecursionError):
            # RecursionError: a slot of "[" (4 KiB of nesting, written into an
            # agent's .memd/) went past recovery and the daemon never started.
            return None

    def read(self) -> dict[str, Any] | None:
        """The latest intact record, or None when there is none."""
        try:
            fd = _open_private(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, self._dir_fd)
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


def _unescape_mount(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as \\ooo octal.
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1 : index + 4].isdigit():
            out.append(chr(int(field[index + 1 : index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def mount_of(path: Path, mounts_text: str) -> tuple[str, str] | None:
    """(mount point, fs type) of the mount holding ``path`` (longest prefix wins)."""
    target = str(path)
    best: tuple[str, str] | None = None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point, fstype = _unescape_mount(fields[1]), fields[2]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        # Later lines win on equal length: they are mounted over earlier ones.
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fstype)
    return best


def filesystem_of(path: Path, mounts_file: Path = Path("/proc/self/mounts")) -> str | None:
    """The type of the filesystem holding ``path`` (``ext4``, ``nfs4``...), None if unknown."""
    try:
        found = mount_of(Path(os.path.realpath(path)), mounts_file.read_text(errors="replace"))
    except OSError:
        return None
    return None if found is None else found[1]


@contextlib.contextmanager
def as_owner_of(directory: Path) -> Iterator[None]:
    """Run as the owner of ``directory`` when root and it belongs to another user.

    A root CLI (compact-now, forget, status, doctor) opening the daemon's state DB
    must not leave a root-owned database, lock, ``-wal`` or ``-shm`` file there
    that the daemon's user then cannot open: files SQLite creates while the DB is
    opened belong to the state dir's owner. The effective ids are put back after.
    Here, not in the CLI, so that :mod:`memd.doctor` uses the same one.

    The supplementary groups are the owner's too (root's are put back after):
    in the systemd layout an agent's 0770 folder opens to memd only through
    the agent's group, of which memd is a member and root is not.
    """
    try:
        owner = os.stat(directory)
    except OSError:
        owner = None
    if os.geteuid() != 0 or owner is None or owner.st_uid == 0:
        yield
        return
    root_groups = os.getgroups()
    switched_groups = _set_groups_of(owner.st_uid, owner.st_gid)
    os.setegid(owner.st_gid)
    os.seteuid(owner.st_uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        if switched_groups:
            os.setgroups(root_groups)


def _set_groups_of(uid: int, gid: int) -> bool:
    """Take ``uid``'s supplementary groups (its user database entry's; only ``gid``
    when it has none there); False when they cannot be set (a user namespace
    that denies setgroups), leaving root's."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        groups = [gid]
    else:
        groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    try:
        os.setgroups(groups)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def as_invoking_user() -> Iterator[None]:
    """Undo :func:`as_owner_of` for a block: root's effective ids again, the
    owner's put back after (nothing to do when not inside a switch).

    For work inside a switch that touches none of the owner's files but loads
    code: a litellm summary imports its provider's modules at call time (about
    70 of them for an ``openai/`` model, others for other providers and for its
    error paths), and as the owner those fail where only root can read this
    Python (a venv under /root, a root ``pip install --user``). The ids are the
    process's, not the thread's: only for a block during which no other thread
    of this process writes files (``compact-now``'s summary).
    """
    uid, gid = os.geteuid(), os.getegid()
    if os.getuid() != 0 or uid == 0:
        yield
        return
    os.seteuid(0)
    os.setegid(0)
    try:
        yield
    finally:
        os.setegid(gid)  # while still root: the owner may not change it
        os.seteuid(uid)
