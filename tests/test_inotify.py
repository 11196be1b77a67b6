from __future__ import annotations

import errno
import fcntl
import os
import select
from pathlib import Path

import pytest

from memd import inotify
from memd.inotify import EVENT, IN_CREATE, IN_MODIFY, Inotify

pytestmark = pytest.mark.skipif(not inotify.available(), reason="no inotify on this host")


def test_fd_is_non_blocking_and_not_inherited(tmp_path: Path) -> None:
    watcher = Inotify()
    try:
        assert fcntl.fcntl(watcher.fd, fcntl.F_GETFL) & os.O_NONBLOCK
        assert fcntl.fcntl(watcher.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        with pytest.raises(BlockingIOError):
            os.read(watcher.fd, 4096)  # nothing queued: never blocks the reader
    finally:
        watcher.close()
    watcher.close()  # twice is harmless


def test_watch_reports_events_in_the_kernel_layout(tmp_path: Path) -> None:
    watcher = Inotify()
    try:
        wd = watcher.add_watch(tmp_path, IN_CREATE | IN_MODIFY)
        assert watcher.add_watch(tmp_path, IN_CREATE | IN_MODIFY) == wd  # same folder, same wd
        (tmp_path / "MEMORY.md").write_bytes(b"x")
        assert select.select([watcher.fd], [], [], 5)[0]
        data = os.read(watcher.fd, 4096)
        got_wd, mask, _cookie, length = EVENT.unpack_from(data)
        name = data[EVENT.size : EVENT.size + length].rstrip(b"\0")
        assert (got_wd, name) == (wd, b"MEMORY.md")
        assert mask & IN_CREATE
        watcher.rm_watch(wd)
        with pytest.raises(OSError) as caught:
            watcher.rm_watch(wd)
        assert caught.value.errno == errno.EINVAL
    finally:
        watcher.close()


def test_missing_folder_is_an_oserror_naming_the_cause(tmp_path: Path) -> None:
    watcher = Inotify()
    try:
        with pytest.raises(FileNotFoundError):
            watcher.add_watch(tmp_path / "ghost", IN_CREATE)
    finally:
        watcher.close()
