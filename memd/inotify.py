"""inotify(7), the three syscalls and the event layout (Linux).

The bindings are ctypes calls into the C library the interpreter already has
loaded (``CDLL(None)``: no library search, which would run ``ldconfig`` in a
subprocess). Reading and parsing are left to the caller
(:class:`memd.watcher.InotifyBackend`), which does both in one pass per read.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from pathlib import Path
from typing import Final

# linux/inotify.h (the same values on every architecture).
IN_MODIFY: Final = 0x00000002
IN_ATTRIB: Final = 0x00000004
IN_MOVED_FROM: Final = 0x00000040
IN_MOVED_TO: Final = 0x00000080
IN_CREATE: Final = 0x00000100
IN_DELETE: Final = 0x00000200
IN_DELETE_SELF: Final = 0x00000400
IN_MOVE_SELF: Final = 0x00000800
IN_Q_OVERFLOW: Final = 0x00004000
IN_IGNORED: Final = 0x00008000
IN_ONLYDIR: Final = 0x01000000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC

# struct inotify_event: wd, mask, cookie, len, then ``len`` bytes of name, NUL-padded.
EVENT: Final = struct.Struct("iIII")


def available() -> bool:
    """Whether this system has inotify (Linux with a C library that exports it)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return hasattr(_libc(), "inotify_init1")
    except OSError:
        return False


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _check(result: int) -> int:
    if result == -1:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


class Inotify:
    """One inotify instance: a non-blocking, close-on-exec fd (read it yourself)."""

    def __init__(self) -> None:
        self.fd: int = _check(_libc().inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))

    def add_watch(self, path: Path | str | bytes, mask: int) -> int:
        """The watch descriptor (the same one again for a folder already watched)."""
        return _check(_libc().inotify_add_watch(self.fd, os.fsencode(path), ctypes.c_uint32(mask)))

    def rm_watch(self, wd: int) -> None:
        _check(_libc().inotify_rm_watch(self.fd, wd))

    def close(self) -> None:
        """Closes the fd (the kernel drops every watch)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


__all__ = [
    "EVENT",
    "IN_ATTRIB",
    "IN_CREATE",
    "IN_DELETE",
    "IN_DELETE_SELF",
    "IN_IGNORED",
    "IN_MODIFY",
    "IN_MOVED_FROM",
    "IN_MOVED_TO",
    "IN_MOVE_SELF",
    "IN_ONLYDIR",
    "IN_Q_OVERFLOW",
    "Inotify",
    "available",
]
