"""Stat polling (``--poll``): one thread notices agent folders and MEMORY.md changes by ``stat``.

For NFS/CIFS and Docker Desktop mounts, where inotify sees nothing. memd needs
to know only which names came and went in ``agents/`` and that an agent's
MEMORY.md (or its descriptor) changed, so a pass is one ``stat`` per agent;
a directory snapshot per folder (watchdog's ``PollingObserver``) would list
and stat every file in it, with one thread per folder.

What keeps a pass cheap at 10,000 agents (figures in the README):

* each MEMORY.md is stat'ed relative to a pinned ``agents/`` fd (two path
  components to resolve, not the whole workspace path; on NFS fewer
  directories to revalidate), and its signature is ``(inode, size, mtime)``
  in a plain list per agent;
* ``agents/`` is listed only when its own stat moved, and on every pass for
  :data:`SETTLE_S` after that: timestamps are coarse (a clock tick; 1-2 s on
  some filesystems), so a second folder made in the same tick as the first
  leaves the stat as it was;
* a file seen missing is probed with ``access`` (no exception object per
  agent per pass), and the descriptor only every :data:`DESCRIPTOR_EVERY` passes.

A file that cannot be stat'ed (gone, a symlink loop, ``ESTALE``) counts as
missing for that agent alone: the pass goes on for every other agent, and the
daemon's count of it reports the problem. Changes are collected under the lock
and reported after it is released. :meth:`StatPoller.poll_once` is one pass
(tests call it directly, with a made-up clock).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from memd.core.descriptor import DESCRIPTOR_NAME
from memd.logs import get_logger
from memd.workspace import MEMORY_FILE

_log = get_logger("memd.poller")

# The descriptor changes rarely: stat'ed on every few passes only (the
# daemon's reconcile rescan is the backstop).
DESCRIPTOR_EVERY = 5
# How long agents/ is listed on every pass after its stat last moved.
SETTLE_S = 2.0

# (inode, size, mtime_ns) of a file, or None when it is missing.
Signature = tuple[int, int, int] | None

_MEMORY_NAME = os.fsencode(MEMORY_FILE)
_DESCRIPTOR_NAME = os.fsencode(DESCRIPTOR_NAME)


def _signature(name: bytes, dir_fd: int | None, seen: Signature | bool) -> Signature:
    """The file's signature; a file seen missing (None) is probed with ``access`` first."""
    if seen is None and not os.access(name, os.F_OK, dir_fd=dir_fd):
        return None
    try:
        st = os.stat(name, dir_fd=dir_fd)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class _Agent:
    """One watched agent folder: the names a pass stats and what it saw last."""

    __slots__ = ("descriptor", "descriptor_seen", "folder", "key", "memory", "memory_seen")

    def __init__(self, key: str, folder: bytes) -> None:
        self.key = key
        self.folder = folder
        self.memory = self.descriptor = b""
        self.memory_seen: Signature = None
        self.descriptor_seen: Signature = None

    def name(self, root: bytes | None) -> None:
        """Stat relative to the pinned ``agents/`` (``root``) when the folder is in it."""
        folder = self.folder
        if root is not None:
            parent, name = os.path.split(folder)
            if parent == root and name:
                folder = name
        self.memory = os.path.join(folder, _MEMORY_NAME)
        self.descriptor = os.path.join(folder, _DESCRIPTOR_NAME)


class StatPoller:
    """One thread; each pass stats each agent's MEMORY.md and, when it moved, lists ``agents/``.

    ``agents_changed(name)``: ``name`` came or went in ``agents/``, or None
    (``agents/`` itself went away or was replaced: rescan everything; a root
    that went away is no longer watched, so the watcher's next sync watches it
    again). ``memory_changed(key)``: the agent's MEMORY.md or descriptor
    changed. Neither is called with the poller's lock held; neither should raise.
    """

    def __init__(
        self,
        agents_changed: Callable[[str | None], None],
        memory_changed: Callable[[str], None],
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._agents_changed = agents_changed
        self._memory_changed = memory_changed
        self._interval_s = interval_s
        self._clock = clock
        self._agents: dict[str, _Agent] = {}
        self._root: bytes | None = None
        self._root_fd: int | None = None
        self._root_stat: tuple[int, int, int] | None = None
        self._root_names: frozenset[str] = frozenset()
        self._root_settle_until = 0.0
        self._passes = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="memd-poll", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._lock:
            self._agents.clear()
            self._unpin_root()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            try:
                self.poll_once()
            except Exception:  # a bug here must not end polling for every agent
                _log.exception("poll pass failed")

    # -------------------------------------------------------------- watches

    def watch_root(self, path: Path) -> None:
        """Watch ``agents/`` (its listing) and pin it for the agents' stats."""
        with self._lock:
            self._unpin_root()
            self._pin_root(os.fsencode(path))

    def unwatch_root(self) -> None:
        with self._lock:
            self._unpin_root()

    def root_watched(self) -> bool:
        with self._lock:
            return self._root is not None

    def watch(self, key: str, path: Path) -> None:
        """Watch one agent folder (what an inotify watch would refuse is refused)."""
        if not os.path.isdir(path):
            raise NotADirectoryError(2, "no such folder", str(path))
        agent = _Agent(key, os.fsencode(path))
        with self._lock:
            agent.name(self._root if self._root_fd is not None else None)
            agent.memory_seen = _signature(agent.memory, self._root_fd, False)
            agent.descriptor_seen = _signature(agent.descriptor, self._root_fd, False)
            self._agents[key] = agent

    def unwatch(self, key: str) -> None:
        with self._lock:
            self._agents.pop(key, None)

    def watched(self) -> set[str]:
        with self._lock:
            return set(self._agents)

    def _pin_root(self, root: bytes) -> None:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            names = frozenset(os.listdir(os.fsdecode(root)))
        except OSError:
            os.close(fd)
            raise
        self._root, self._root_fd = root, fd
        self._root_stat = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        self._root_names = names
        self._root_settle_until = self._clock() + SETTLE_S
        for agent in self._agents.values():
            agent.name(root)

    def _unpin_root(self) -> None:
        fd, self._root_fd = self._root_fd, None
        self._root = self._root_stat = None
        self._root_names = frozenset()
        if fd is not None:
            os.close(fd)
            for agent in self._agents.values():
                agent.name(None)

    # ---------------------------------------------------------------- a pass

    def poll_once(self) -> None:
        """One pass: report what changed since the previous one."""
        with self._lock:
            self._passes += 1
            root_gone, names = self._poll_root()
            memory, folders_gone = self._poll_agents(self._passes % DESCRIPTOR_EVERY == 0)
        if root_gone:
            self._agents_changed(None)
        for name in names:
            self._agents_changed(name)
        for key in folders_gone:
            self._agents_changed(key)
        for key in memory:
            self._memory_changed(key)

    def _poll_root(self) -> tuple[bool, list[str]]:
        """(agents/ went away or was replaced, the names that came or went in it)."""
        root = self._root
        if root is None:
            return False, []
        try:
            st = os.stat(root)  # the path, not the pinned fd: a replaced agents/ must show
        except OSError:
            self._unpin_root()
            return True, []
        stat = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        seen = self._root_stat
        now = self._clock()
        if seen is not None and stat[0] != seen[0]:
            self._unpin_root()
            with contextlib.suppress(OSError):  # else unwatched: the next sync tries again
                self._pin_root(root)
            return True, []
        if stat != seen:
            self._root_stat = stat
            self._root_settle_until = now + SETTLE_S
        elif now >= self._root_settle_until:
            return False, []
        try:
            names = frozenset(os.listdir(os.fsdecode(root)))
        except OSError:
            self._unpin_root()
            return True, []
        changes = sorted(names ^ self._root_names)
        self._root_names = names
        return False, changes

    def _poll_agents(self, with_descriptor: bool) -> tuple[list[str], list[str]]:
        """(agents whose MEMORY.md or descriptor changed, agents whose folder is gone)."""
        dir_fd = self._root_fd
        stat, access, exists = os.stat, os.access, os.F_OK
        memory: list[str] = []
        gone: list[str] = []
        for agent in self._agents.values():
            seen = agent.memory_seen
            if seen is None and not access(agent.memory, exists, dir_fd=dir_fd):
                continue  # still missing
            try:
                st = stat(agent.memory, dir_fd=dir_fd)
            except OSError:
                now: Signature = None
            else:
                now = (st.st_ino, st.st_size, st.st_mtime_ns)
            if now != seen:
                agent.memory_seen = now
                if now is None and not os.path.isdir(agent.folder):
                    gone.append(agent.key)
                else:
                    memory.append(agent.key)
        if with_descriptor:
            for agent in self._agents.values():
                now = _signature(agent.descriptor, dir_fd, agent.descriptor_seen)
                if now != agent.descriptor_seen:
                    agent.descriptor_seen = now
                    memory.append(agent.key)
        return memory, gone


__all__ = ["DESCRIPTOR_EVERY", "SETTLE_S", "Signature", "StatPoller"]
