"""Reading agents' ``memd-agent.json`` (the shell around :mod:`memd.core.descriptor`).

The file is the agent's, so it is opened without following a symlink, must be a
regular file of bounded size, and a bad one costs only that agent its declared
window (memd falls back to its config), with one log line per version of the file.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from memd.core.descriptor import (
    DESCRIPTOR_NAME,
    MAX_BYTES,
    AgentWindow,
    DescriptorError,
    parse_descriptor,
)
from memd.errors import describe_error
from memd.logs import get_logger

_log = get_logger("memd.descriptor")

FileKey = tuple[int, int, int, int]  # dev, inode, size, mtime_ns


def read_window(
    agent_dir: Path, count_text: Callable[[str], int]
) -> tuple[FileKey | None, AgentWindow | None]:
    """(the file's identity, its window); (None, None) when the agent wrote none.

    Raises DescriptorError for a file memd will not use.
    """
    path = agent_dir / DESCRIPTOR_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DescriptorError(
                f"{DESCRIPTOR_NAME}: a symlink; memd does not follow it"
            ) from None
        raise DescriptorError(
            f"{DESCRIPTOR_NAME}: {describe_error(exc, with_file=False)}"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DescriptorError(f"{DESCRIPTOR_NAME}: not a regular file")
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if info.st_size > MAX_BYTES:
            raise DescriptorError(f"{DESCRIPTOR_NAME}: larger than {MAX_BYTES} bytes")
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    return key, parse_descriptor(data, count_text)


def declared_window(
    agent_dir: Path,
    count_text: Callable[[str], int],
    warn: Callable[[str], None] | None = None,
) -> AgentWindow | None:
    """The agent's window for a one-shot command (status, compact-now): None when
    it wrote no descriptor or one memd refuses (the daemon logs why; ``warn``,
    when given, is told why too)."""
    try:
        return read_window(agent_dir, count_text)[1]
    except DescriptorError as exc:
        if warn is not None:
            warn(str(exc))
        return None


def file_key(agent_dir: Path | str) -> FileKey | None:
    try:
        # A str join: this runs for every agent at start-up (pathlib costs more).
        info = os.lstat(f"{os.fspath(agent_dir)}/{DESCRIPTOR_NAME}")
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


class Descriptors:
    """Each agent's declared window, re-read only when its file changes."""

    def __init__(self, count_text: Callable[[str], int]) -> None:
        self._count_text = count_text
        self._seen: dict[str, tuple[FileKey | None, AgentWindow | None]] = {}
        self._lock = threading.Lock()

    def clear(self, count_text: Callable[[str], int] | None = None) -> None:
        """Forget every reading (a config reload); with ``count_text``, the reserved
        text is counted with it from now on (the reload's new tokenizer)."""
        with self._lock:
            self._seen.clear()
            if count_text is not None:
                self._count_text = count_text

    def changed(self, agent: str, agent_dir: Path | str) -> bool:
        """Has the agent's descriptor changed since ``window`` last read it?"""
        with self._lock:
            if agent not in self._seen:
                return file_key(agent_dir) is not None
            return self._seen[agent][0] != file_key(agent_dir)

    def absent(self, agent: str) -> None:
        """The caller just listed the agent's folder and saw no descriptor (no lstat).
        An agent never read needs nothing (no reading reads as none): the lock is
        taken only to drop an older reading (each agent at start-up: none)."""
        if agent in self._seen:
            with self._lock:
                self._seen[agent] = (None, None)

    def window(self, agent: str, agent_dir: Path) -> AgentWindow | None:
        """The agent's declared window (None: it wrote none, or one memd refuses)."""
        key = file_key(agent_dir)
        with self._lock:
            cached = self._seen.get(agent)
            if cached is not None and cached[0] == key:
                return cached[1]
            if key is None:  # no descriptor (most agents): nothing to open
                self._seen[agent] = (None, None)
                return None
            count_text = self._count_text
        try:
            read_key, window = read_window(agent_dir, count_text)
        except DescriptorError as exc:
            _log.warning("agent descriptor ignored", agent=agent, error=str(exc))
            read_key, window = key, None
        else:
            if window is not None:
                for clamp in window.clamped:
                    _log.warning("agent descriptor clamped", agent=agent, detail=clamp)
                _log.info(
                    "agent descriptor read",
                    agent=agent,
                    model=window.model,
                    context_length=window.context_length,
                    reserved_tokens=window.reserved_tokens,
                )
        with self._lock:
            self._seen[agent] = (read_key, window)
        return window

    def forget(self, agent: str) -> None:
        with self._lock:
            self._seen.pop(agent, None)
