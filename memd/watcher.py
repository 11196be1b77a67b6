"""File-system watching with watchdog: ``agents/`` and each agent folder, never recursively.

Events are hints. The daemon's periodic reconcile rescan is the source of
truth, so a dropped event, an inotify queue overflow or a dead watcher thread
costs latency, never correctness. Every handler is wrapped: an exception is
logged and the watcher keeps running (watchdog would otherwise let it kill the
observer thread silently).

Backends, behind one swappable name (:func:`make_backend`):

* ``inotify`` (Linux default): :class:`InotifyBackend`, one inotify instance
  (:mod:`memd.inotify`) and one thread for any number of agents; each read's
  events are parsed in one pass and coalesced per agent (at fleet scale an
  event comes with every append, so the per-event cost is the daemon's
  per-append cost). watchdog's ``Observer`` starts one emitter thread (and one
  inotify instance) per watched folder, which does not scale to a large fleet
  (figures in the README's performance section), and its ``InotifyFD`` builds
  objects and takes locks per event.
* ``polling`` (``--poll``), for NFS/CIFS and Docker Desktop mounts where
  inotify sees nothing: :mod:`memd.poller`, one thread that stats each
  agent's MEMORY.md per pass. (watchdog's ``PollingObserver`` runs one emitter
  thread per folder and snapshots whole folders: 1,000 threads at 1,000 agents.)
* ``observer``: watchdog's platform ``Observer`` (portable fallback).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from watchdog.events import FileSystemEvent, FileSystemEventHandler

from memd.core.descriptor import DESCRIPTOR_NAME
from memd.errors import describe_error
from memd.inotify import (
    EVENT,
    IN_ATTRIB,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Inotify,
)
from memd.inotify import available as inotify_available
from memd.logs import get_logger
from memd.poller import StatPoller
from memd.workspace import AGENTS_DIR, MEMORY_FILE

BackendKind = Literal["inotify", "polling", "observer"]
ROOT_KEY = ""  # the agents/ folder itself; agent keys are valid agent names (never empty)

_log = get_logger("memd.watcher")


class WatchSink(Protocol):
    def agents_changed(self, name: str | None) -> None:
        """Something changed in ``agents/`` (``name``), or None: rescan everything."""

    def memory_changed(self, agent: str) -> None:
        """The agent's MEMORY.md was written, created, replaced or removed."""

    def descriptor_changed(self, agent: str) -> None:
        """The agent's memd-agent.json was written, created, replaced or removed
        (a backend that cannot tell the two files apart reports both)."""


class DirWatchBackend(Protocol):
    kind: BackendKind

    def open(self) -> bool:
        """Take what watches need, without a thread (start() may follow a fork);
        True when a watch added now is live: what happens until start() is
        reported once it runs (the kernel queues it)."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def is_alive(self) -> bool: ...

    def watch(self, key: str, path: Path | str) -> None: ...

    def unwatch(self, key: str) -> None: ...

    def watched(self) -> set[str]: ...


def _guarded(
    sink: WatchSink,
) -> tuple[Callable[[str | None], None], Callable[[str], None], Callable[[str], None]]:
    """The sink's methods, each logging (never raising) on failure."""

    def agents_changed(name: str | None) -> None:
        try:
            sink.agents_changed(name)
        except Exception:
            _log.exception("watch handler failed", name=name)

    def memory_changed(agent: str) -> None:
        try:
            sink.memory_changed(agent)
        except Exception:
            _log.exception("watch handler failed", agent=agent)

    def descriptor_changed(agent: str) -> None:
        try:
            sink.descriptor_changed(agent)
        except Exception:
            _log.exception("watch handler failed", agent=agent)

    return agents_changed, memory_changed, descriptor_changed


_SELF_GONE: Final = IN_DELETE_SELF | IN_MOVE_SELF
# Events in agents/ that change which folder (if any) an agent's name holds.
_ENTRY_MOVED: Final = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
_WATCH_MASK: Final = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CREATE
    | IN_DELETE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)

# After the first event of a quiet spell, the reader waits this long before
# reading: the events of many appends arrive in one read (and identical ones
# are merged by the kernel), so the thread wakes once per batch, not per write.
# Small next to the debounce (500 ms by default) it precedes.
READ_DELAY_S: Final = 0.02
_READ_BYTES: Final = 1 << 16


class InotifyBackend:
    """All folders on one inotify fd, read by one thread.

    Each read is parsed in one pass (``struct``, no per-event objects) and
    coalesced: an agent written many times in one batch is reported once,
    ``agents/`` names once each, and an overflow as one rescan.
    """

    kind: BackendKind = "inotify"

    def __init__(self, sink: WatchSink, read_delay_s: float = READ_DELAY_S) -> None:
        self._agents_changed, self._memory_changed, self._descriptor_changed = _guarded(sink)
        self._read_delay_s = read_delay_s
        self._inotify: Inotify | None = None
        self._wake: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # The reader thread and watched() both read the fd: one at a time, so
        # batches are dispatched in the kernel's order (reentrant: a sink may ask).
        self._read_lock = threading.RLock()
        self._wd_by_key: dict[str, int] = {}
        self._key_by_wd: dict[int, str] = {}
        self._path_by_key: dict[str, Path | str] = {}  # as watched: a moved folder is re-checked
        self._memory_name = os.fsencode(MEMORY_FILE)
        self._descriptor_name = os.fsencode(DESCRIPTOR_NAME)
        self._stopping = False

    def open(self) -> bool:
        if self._inotify is None:
            self._inotify = Inotify()  # private: restartable
        return True

    def start(self) -> None:
        self._stopping = False
        if self._inotify is None:
            self._inotify = Inotify()
        self._wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread = threading.Thread(
            target=self._run,
            args=(self._inotify, self._wake[0]),
            name="memd-inotify",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        thread, self._thread = self._thread, None
        wake, self._wake = self._wake, None
        inotify, self._inotify = self._inotify, None
        if wake is not None:
            with contextlib.suppress(OSError):
                os.write(wake[1], b"x")
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        if inotify is not None:
            with self._read_lock:  # not under a reader's feet
                inotify.close()  # drops every watch
        if wake is not None:
            for fd in wake:
                os.close(fd)
        with self._lock:
            self._wd_by_key.clear()
            self._key_by_wd.clear()
            self._path_by_key.clear()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def watch(self, key: str, path: Path | str) -> None:
        inotify = self._inotify
        if inotify is None:
            raise RuntimeError("watcher is not started")
        with self._lock:
            # Under the lock, as the reader's removal of stale watches is: a
            # descriptor the kernel hands back here cannot be removed by the reader
            # between the add and its mapping (the key would be left on a watch the
            # kernel no longer has, reporting nothing, never seen as lost).
            wd = inotify.add_watch(path, _WATCH_MASK)
            # inotify gave back a descriptor another key holds: that folder
            # was renamed to this path, so the old key is no longer watched
            # (a new folder under the old name needs a watch of its own).
            displaced = self._key_by_wd.get(wd)
            if displaced is not None and displaced != key:
                self._wd_by_key.pop(displaced, None)
            self._wd_by_key[key] = wd
            self._key_by_wd[wd] = key
            self._path_by_key[key] = path

    def unwatch(self, key: str) -> None:
        with self._lock:
            self._path_by_key.pop(key, None)
            wd = self._wd_by_key.pop(key, None)
            if wd is None:
                return
            if self._key_by_wd.get(wd) != key:
                return  # the descriptor now belongs to the folder's new name
            del self._key_by_wd[wd]
        inotify = self._inotify
        if inotify is not None:
            # EINVAL: the kernel dropped the watch already (folder deleted).
            with contextlib.suppress(OSError):
                inotify.rm_watch(wd)

    def descriptor_of(self, key: str) -> int | None:
        """The inotify watch descriptor of ``key`` (None: not watched)."""
        with self._lock:
            return self._wd_by_key.get(key)

    def watched(self) -> set[str]:
        """The watched keys, after every event the kernel has queued so far (a
        watch it dropped is not listed, whatever the reader thread's delay)."""
        inotify = self._inotify
        if inotify is not None:
            # A read error here is the reader thread's to die of (then restarted).
            with contextlib.suppress(OSError):
                self._read_queued(inotify)
        with self._lock:
            return set(self._wd_by_key)

    def _read_queued(self, inotify: Inotify) -> None:
        """Read and dispatch what is queued now (one reader at a time, in order)."""
        with self._read_lock:
            fd = inotify.fd
            if fd < 0:
                return  # closed by stop()
            chunks = []
            while True:  # until the queue is drained (the fd is non-blocking)
                try:
                    chunk = os.read(fd, _READ_BYTES)
                except BlockingIOError:
                    break
                except OSError:
                    if self._stopping:
                        return
                    raise
                if not chunk:
                    break
                chunks.append(chunk)
            if chunks:
                self.dispatch(b"".join(chunks))

    def _run(self, inotify: Inotify, wake: int) -> None:
        poller = select.poll()
        poller.register(inotify.fd, select.POLLIN)
        poller.register(wake, select.POLLIN)
        while not self._stopping:
            ready = poller.poll()
            if self._stopping or any(ready_fd == wake for ready_fd, _ in ready):
                return
            if self._read_delay_s > 0:
                time.sleep(self._read_delay_s)
            self._read_queued(inotify)

    def dispatch(self, data: bytes) -> None:
        """Report the events in ``data`` (what one or more reads returned), coalesced."""
        memory: dict[str, None] = {}  # ordered sets: reported in arrival order
        descriptors: dict[str, None] = {}
        names: dict[str | None, None] = {}
        gone: list[str] = []
        recheck: dict[str, None] = {}  # agents whose folder may have moved
        root_moved = False
        overflow = False
        unpack = EVENT.unpack_from
        header = EVENT.size
        memory_name, descriptor_name = self._memory_name, self._descriptor_name
        offset, end = 0, len(data)
        with self._lock:
            key_by_wd = self._key_by_wd
            while offset + header <= end:
                wd, mask, _cookie, length = unpack(data, offset)
                name = data[offset + header : offset + header + length].rstrip(b"\0")
                offset += header + length
                if mask & IN_Q_OVERFLOW:
                    overflow = True
                    continue
                key = key_by_wd.get(wd)
                if key is None:
                    continue
                if mask & IN_IGNORED:
                    # The watch is gone (folder deleted or replaced): forget it,
                    # and the agent set is looked at again.
                    del key_by_wd[wd]
                    if self._wd_by_key.get(key) == wd:
                        del self._wd_by_key[key]
                    gone.append(key)
                elif key == ROOT_KEY:
                    if mask & IN_MOVE_SELF:
                        root_moved = True
                        names[None] = None
                    elif mask & IN_DELETE_SELF:
                        names[None] = None
                    elif name and not mask & IN_MODIFY:
                        agent = os.fsdecode(name)
                        names[agent] = None
                        if mask & _ENTRY_MOVED and agent in self._wd_by_key:
                            recheck[agent] = None
                elif name == memory_name:
                    memory[key] = None
                elif name == descriptor_name:
                    descriptors[key] = None
                elif mask & _SELF_GONE:
                    if mask & IN_MOVE_SELF:
                        recheck[key] = None
                    names[key] = None
            stale = self._follow_moves(recheck, root_moved, memory)
            inotify = self._inotify
            if stale and inotify is not None:
                for wd in stale:
                    # EINVAL: the kernel dropped it already. Its IN_IGNORED comes
                    # later and finds no key. Under the lock (see watch).
                    with contextlib.suppress(OSError):
                        inotify.rm_watch(wd)
        if overflow:
            _log.warning("inotify queue overflowed; rescanning every agent")
            names[None] = None
        if not self._stopping:
            for key in gone:
                names[None if key == ROOT_KEY else key] = None
        for changed in names:
            self._agents_changed(changed)
        for agent in descriptors:
            self._descriptor_changed(agent)
        for agent in memory:
            self._memory_changed(agent)

    def _follow_moves(
        self, recheck: dict[str, None], root_moved: bool, memory: dict[str, None]
    ) -> set[int]:
        """Keep each watch on the folder its agent's name holds now (under the lock);
        returns the watch descriptors to remove from the kernel.

        A folder renamed away, another moved in over the name, a symlink pointed
        elsewhere: the watch stays on the folder it was added to, wherever that
        went, and the name's new folder would report nothing. Each agent named by
        such an event is watched again by its path: the same descriptor back means
        the same folder; another one is the new folder (counted: its events before
        now were missed); none (no folder there) leaves the agent unwatched, for
        the watch service's next tick. ``agents/`` itself renamed away takes every
        watch with it: all are dropped, and the tick watches the new tree.
        """
        key_by_wd, wd_by_key = self._key_by_wd, self._wd_by_key
        if root_moved:
            stale = set(key_by_wd)
            key_by_wd.clear()
            wd_by_key.clear()
            return stale
        stale = set()
        inotify = self._inotify
        for key in recheck:
            old = wd_by_key.get(key)
            path = self._path_by_key.get(key)
            if old is None or path is None or inotify is None:
                continue
            try:
                wd: int | None = inotify.add_watch(path, _WATCH_MASK)
            except OSError:
                wd = None  # nothing (or no folder) under the name now
            if wd == old:
                continue
            del wd_by_key[key]
            if key_by_wd.get(old) == key:
                del key_by_wd[old]
                stale.add(old)
            if wd is not None:
                displaced = key_by_wd.get(wd)
                if displaced is not None and displaced != key:
                    wd_by_key.pop(displaced, None)
                wd_by_key[key] = wd
                key_by_wd[wd] = key
                stale.discard(wd)
                memory[key] = None
        return stale


class _KeyedHandler(FileSystemEventHandler):
    def __init__(self, key: str, backend: ObserverBackend) -> None:
        self.key = key
        self.backend = backend

    def on_any_event(self, event: FileSystemEvent) -> None:
        self.backend.dispatch(self.key, event)


class ObserverBackend:
    """watchdog's platform ``Observer``: one scheduled watch per folder."""

    def __init__(self, sink: WatchSink, kind: BackendKind) -> None:
        self.kind = kind
        self._agents_changed, self._memory_changed, self._descriptor_changed = _guarded(sink)
        self._observer: Any = None
        self._watches: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _new_observer(self) -> Any:
        from watchdog.observers import Observer

        return Observer()

    def open(self) -> bool:
        return False  # watchdog's emitters watch once their threads run

    def start(self) -> None:
        self._observer = self._new_observer()
        self._observer.start()

    def stop(self) -> None:
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)
        with self._lock:
            self._watches.clear()

    def is_alive(self) -> bool:
        return self._observer is not None and bool(self._observer.is_alive())

    def watch(self, key: str, path: Path | str) -> None:
        if self._observer is None:
            raise RuntimeError("watcher is not started")
        handle = self._observer.schedule(_KeyedHandler(key, self), str(path), recursive=False)
        with self._lock:
            self._watches[key] = handle

    def unwatch(self, key: str) -> None:
        with self._lock:
            handle = self._watches.pop(key, None)
        if handle is not None and self._observer is not None:
            with contextlib.suppress(KeyError):
                self._observer.unschedule(handle)

    def watched(self) -> set[str]:
        with self._lock:
            return set(self._watches)

    def dispatch(self, key: str, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        src = os.fsdecode(event.src_path)
        dest = os.fsdecode(event.dest_path) if event.dest_path else ""
        if key == ROOT_KEY:
            if event.event_type == "modified":
                return
            for path in (src, dest):
                if path and os.path.dirname(path) != path:
                    self._agents_changed(os.path.basename(path))
            return
        names = {os.path.basename(src), os.path.basename(dest) if dest else ""}
        if MEMORY_FILE in names or DESCRIPTOR_NAME in names:
            if DESCRIPTOR_NAME in names:
                self._descriptor_changed(key)
            if MEMORY_FILE in names:
                self._memory_changed(key)
        elif (
            event.is_directory
            and event.event_type in ("deleted", "moved")
            and (os.path.basename(src) == key)
        ):
            self._agents_changed(key)


class StatPollBackend:
    """``--poll``: :class:`memd.poller.StatPoller` (one thread) behind the backend protocol."""

    kind: BackendKind = "polling"

    def __init__(self, sink: WatchSink, poll_interval_s: float) -> None:
        agents_changed, memory_changed, descriptor_changed = _guarded(sink)

        def file_changed(key: str) -> None:
            # The poller reports MEMORY.md and memd-agent.json alike: both.
            descriptor_changed(key)
            memory_changed(key)

        self.poller = StatPoller(agents_changed, file_changed, poll_interval_s)

    def open(self) -> bool:
        return False  # its first stat pass is in its thread

    def start(self) -> None:
        self.poller.start()

    def stop(self) -> None:
        self.poller.stop()

    def is_alive(self) -> bool:
        return self.poller.is_alive()

    def watch(self, key: str, path: Path | str) -> None:
        if key == ROOT_KEY:
            self.poller.watch_root(path)
        else:
            self.poller.watch(key, path)

    def unwatch(self, key: str) -> None:
        if key == ROOT_KEY:
            self.poller.unwatch_root()
        else:
            self.poller.unwatch(key)

    def watched(self) -> set[str]:
        keys = self.poller.watched()
        if self.poller.root_watched():
            keys.add(ROOT_KEY)
        return keys

    def poll_once(self) -> None:
        self.poller.poll_once()

    def replaced(self, keys: Iterable[str]) -> None:
        self.poller.replaced(keys)


def make_backend(
    kind: BackendKind, sink: WatchSink, poll_interval_s: float = 1.0
) -> DirWatchBackend:
    if kind == "inotify":
        return InotifyBackend(sink)
    if kind == "polling":
        return StatPollBackend(sink, poll_interval_s)
    return ObserverBackend(sink, kind)


def default_backend_kind(poll: bool) -> BackendKind:
    if poll:
        return "polling"
    return "inotify" if inotify_available() else "observer"


class Watcher:
    """Keeps the watches matching the set of agents; restartable when it dies."""

    def __init__(
        self,
        workspace: Path,
        sink: WatchSink,
        *,
        kind: BackendKind,
        poll_interval_s: float = 1.0,
    ) -> None:
        self.workspace = workspace
        self.agents_dir = workspace / AGENTS_DIR
        self.kind = kind
        self._sink = sink
        self._poll_interval_s = poll_interval_s
        self._backend: DirWatchBackend | None = None
        self._failed: dict[str, str] = {}
        self._stopped = False
        self._lock = threading.Lock()

    def open(self) -> bool:
        """The backend made, not started: True when watches added now (:meth:`sync`)
        are live before :meth:`start` (inotify: the kernel queues the events)."""
        with self._lock:
            self._stopped = False
            if self._backend is None:
                self._backend = make_backend(self.kind, self._sink, self._poll_interval_s)
                self._failed.clear()
            return self._backend.open()

    def start(self) -> None:
        with self._lock:
            self._stopped = False
            if self._backend is None:
                self._start_unlocked()
            else:
                self._backend.start()  # opened: its watches stay

    def _start_unlocked(self) -> None:
        backend = make_backend(self.kind, self._sink, self._poll_interval_s)
        backend.start()
        self._backend = backend
        self._failed.clear()

    def stop(self) -> None:
        # Under the lock, and remembered: a restart racing shutdown must not
        # start a backend nobody will stop.
        with self._lock:
            self._stopped = True
            self._stop_unlocked()

    def _stop_unlocked(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.stop()

    def restart(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stop_unlocked()
            self._start_unlocked()

    def is_alive(self) -> bool:
        backend = self._backend
        return backend is not None and backend.is_alive()

    @property
    def backend(self) -> DirWatchBackend | None:
        """The running backend (None while stopped)."""
        return self._backend

    @property
    def failed(self) -> dict[str, str]:
        """Agents whose folder could not be watched (they still get reconciled)."""
        return dict(self._failed)

    def watched(self) -> set[str]:
        backend = self._backend
        return set() if backend is None else backend.watched() - {ROOT_KEY}

    def root_watched(self) -> bool:
        """Whether ``agents/`` itself is watched (False while stopped)."""
        backend = self._backend
        return backend is not None and ROOT_KEY in backend.watched()

    def replaced(self, agents: Iterable[str]) -> None:
        """memd replaced these agents' MEMORY.md itself (a compaction's commit), as a
        rename another process makes: inotify reports it as it happens; the poller,
        which may see a rename only in the agent's turn, checks each on its next pass."""
        backend = self._backend
        if isinstance(backend, StatPollBackend):
            backend.replaced(agents)

    def sync(self, agent_dirs: Mapping[str, Path | str]) -> None:
        """Watch ``agents/`` and exactly the given agent folders."""
        with self._lock:
            backend = self._backend
            if backend is None:
                return
            current = backend.watched()
            if ROOT_KEY not in current and self.agents_dir.is_dir():
                self._try_watch(backend, ROOT_KEY, self.agents_dir)
            for agent, path in agent_dirs.items():
                if agent not in current:
                    self._try_watch(backend, agent, path)
            for agent in current - set(agent_dirs) - {ROOT_KEY}:
                backend.unwatch(agent)
                self._failed.pop(agent, None)

    def _try_watch(self, backend: DirWatchBackend, key: str, path: Path | str) -> None:
        try:
            backend.watch(key, path)
        except OSError as exc:
            reason = describe_error(exc, with_file=False)
            if self._failed.get(key) != reason:
                # Logged once per reason; the reconcile rescan still covers the agent.
                _log.warning(
                    "cannot watch folder; relying on the periodic rescan",
                    agent=key or None,
                    path=str(path),
                    error=reason,
                )
            self._failed[key] = reason
        else:
            self._failed.pop(key, None)


__all__ = [
    "ROOT_KEY",
    "BackendKind",
    "DirWatchBackend",
    "InotifyBackend",
    "ObserverBackend",
    "StatPollBackend",
    "WatchSink",
    "Watcher",
    "default_backend_kind",
    "make_backend",
]
