"""inotify(7) for the watcher: the instance and its watches through
``inotify_simple`` (a maintained ctypes wrapper of the three syscalls), and the
kernel's event layout, which :class:`memd.watcher.InotifyBackend` parses itself
in one pass per read: ``inotify_simple``'s own reader builds a named tuple and
decodes a name for every event, where the watcher only needs each batch's agents.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path
from typing import Final

import inotify_simple
from inotify_simple import flags

# linux/inotify.h, as inotify_simple spells them.
IN_MODIFY: Final = int(flags.MODIFY)
IN_ATTRIB: Final = int(flags.ATTRIB)
IN_MOVED_FROM: Final = int(flags.MOVED_FROM)
IN_MOVED_TO: Final = int(flags.MOVED_TO)
IN_CREATE: Final = int(flags.CREATE)
IN_DELETE: Final = int(flags.DELETE)
IN_DELETE_SELF: Final = int(flags.DELETE_SELF)
IN_MOVE_SELF: Final = int(flags.MOVE_SELF)
IN_Q_OVERFLOW: Final = int(flags.Q_OVERFLOW)
IN_IGNORED: Final = int(flags.IGNORED)
IN_ONLYDIR: Final = int(flags.ONLYDIR)

# struct inotify_event: wd, mask, cookie, len, then ``len`` bytes of name, NUL-padded.
EVENT: Final = struct.Struct("iIII")


def available() -> bool:
    """Whether this system has inotify (Linux)."""
    return sys.platform.startswith("linux")


class Inotify:
    """One inotify instance: a non-blocking, close-on-exec fd (read it yourself)."""

    def __init__(self) -> None:
        self._instance = inotify_simple.INotify(nonblocking=True)
        self.fd: int = self._instance.fileno()

    def add_watch(self, path: Path | str | bytes, mask: int) -> int:
        """The watch descriptor (the same one again for a folder already watched)."""
        return int(self._instance.add_watch(os.fsencode(path), mask))

    def rm_watch(self, wd: int) -> None:
        self._instance.rm_watch(wd)

    def close(self) -> None:
        """Closes the fd (the kernel drops every watch); twice is harmless."""
        self.fd = -1
        self._instance.close()


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
