"""Stat polling (``--poll``): one thread notices agent folders and MEMORY.md changes by ``stat``.

For NFS/CIFS and Docker Desktop mounts, where inotify sees nothing. memd needs
to know only which names came and went in ``agents/`` and that an agent's
MEMORY.md (or its descriptor) changed, so a pass is one ``stat`` per agent;
a directory snapshot per folder (watchdog's ``PollingObserver``) would list
and stat every file in it, with one thread per folder.

What keeps a pass cheap at 10,000 agents (figures in the README):

* on a local filesystem each MEMORY.md is held open and, on every pass, only
  sized: one ``lseek(fd, 0, SEEK_END)`` per file, mapped over a list of the
  held fds (no stat result to build, no Python per file: about a third of an
  ``fstat`` loop; a size that moved is checked in full). The full check (an
  ``fstat``: ctime, size, a single link; the path stat'ed when it differs) is
  for the files whose size moved, the *hot* ones (seen replaced, by a rename
  over them or unlinked and made again, within :data:`HOT_S`: their writer
  replaces the file, which the held fd's size never shows), the files memd
  replaced itself (told by :meth:`StatPoller.replaced`: checked against their
  path on the next pass), and each agent's path is stat'ed in its turn (fixed
  when it is watched), a slice of the agents each pass, every one within
  :data:`VERIFY_S`. An append does not make a file hot: it stays on the same
  inode, which the size shows (an fstat of every file a fleet wrote in the
  last minutes, on every pass, cost more than the rest of the pass together).
  Held within a share of ``RLIMIT_NOFILE`` (:func:`default_fd_budget`), never
  on a network or FUSE share;
* otherwise each MEMORY.md is stat'ed relative to a pinned ``agents/`` fd
  (two path components to resolve, not the whole workspace path; on NFS
  fewer directories to revalidate), its signature ``(inode, size, mtime)``,
  on every pass;
* ``agents/`` is listed (``scandir``: each name's inode, no stat) only when
  its own stat moved, and on every pass for :data:`SETTLE_S` after that:
  timestamps are coarse (a clock tick; 1-2 s on some filesystems), so a
  second folder made in the same tick as the first leaves the stat as it
  was. A name whose inode changed (its folder removed and made again) is
  reported and its agent's files checked against their paths; when
  ``agents/`` itself is replaced, every agent's are (the held fds are the old
  tree's files);
* a file seen missing is probed with ``access`` (no exception object per
  agent per pass), and the descriptors a slice of the agents each pass, in
  turn, every one within :data:`DESCRIPTOR_S`.

What is seen when, at interval ``i`` (1 s by default), with MEMORY.md held
open (a local disk):

=====================================================  ===============================
an append; a truncation (any size change)              the next pass (<= ``i``)
a new agent folder, a removed one, one removed and     the next pass
made again (``agents/`` moved); ``agents/`` replaced
memd's own compaction of any agent and every append    the next pass after the job
to the new file (the daemon hands each job's end on)   ends
another process's ``compact-now`` that wrote the       within two passes (the
state DB's ledger, and the appends after it (the       daemon reads the ledger
daemon reads the ledger each ``i``, hands them on)     each ``i``)
``memd forget AGENT``'s unlink (the daemon hands on    the next pass after the
each tombstone its state flush finds)                  flush that finds it
any change to a hot MEMORY.md (seen replaced within    the next pass
:data:`HOT_S`): a rename over it, a same-size
rewrite, an unlink, a rename away
the same to a MEMORY.md that is not hot (an editor's   :data:`VERIFY_S` (30 s), or
first save by rename, ``forget --match``, a            the next pass if ``i`` is
``compact-now`` that could not open the state DB),     longer
and the appends to the new file until then
a descriptor (``memd-agent.json``) written, replaced   :data:`DESCRIPTOR_S` (30 s), or
or removed (held open or not)                          the next pass, likewise
=====================================================  ===============================

Without held files (a network share, no fds to spare) every MEMORY.md path is
stat'ed on every pass: every change to it shows on the next pass, within the
filesystem's own attribute caching (NFS ``actimeo``). A change that leaves
size, inode and mtime as they were (a same-size rewrite within one clock tick)
is not seen by a stat either way; the next write is.

A file that cannot be stat'ed (gone, a symlink loop, ``ESTALE``) counts as
missing for that agent alone: the pass goes on for every other agent, and the
daemon's count of it reports the problem. A pass does its I/O without the
watches' lock (on NFS it is a round trip per agent: ``watch``/``watched``
never wait for it); only the pass thread opens and closes the files it
holds, so an unwatched agent's are given back at the start of the next pass.
Changes are reported after the pass. :meth:`StatPoller.poll_once` is one
pass (tests call it directly, with a made-up clock).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import operator
import os
import resource
import stat as stat_module
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from memd.core.descriptor import DESCRIPTOR_NAME
from memd.fsutil import filesystem_of
from memd.logs import get_logger
from memd.workspace import MEMORY_FILE

_log = get_logger("memd.poller")

# The descriptor changes rarely: each pass probes a slice of the agents'
# descriptors in turn, every one within this long (the rescan's period,
# ``watch.reconcile_s``, by default; or on every pass when the interval is
# longer). Probing every agent's on every pass would cost more than the
# MEMORY.md pass itself.
DESCRIPTOR_S = 30.0
# How long agents/ is listed on every pass after its stat last moved.
SETTLE_S = 2.0
# Each held MEMORY.md is checked against its path within this long (a slice
# of the agents each pass, or every one on every pass when the interval is
# longer), whatever its size says: a same-size rewrite, a replacement or an
# unlink of a file that is not hot shows within it, as the rescan's would.
VERIFY_S = 30.0
# A MEMORY.md seen replaced (another inode at its path, or gone and back) that
# memd did not replace itself is "hot" this long: its held fd is fstat'ed on
# every pass (ctime, size, link count), not only sized. Its writer replaces the
# file (an editor or a framework saving by rename; another process's
# compaction, which may come again): a rename over it leaves the held fd's size
# as it was, and the append after it must still show within one interval. An
# append keeps the inode (the size shows it), and memd hands its own
# replacements on (:meth:`StatPoller.replaced`): neither makes a file hot.
HOT_S = 600.0
# Filesystems where a held fd is harmless and its fstat tells a replacement
# (nlink drops to 0) or a rename away (ctime moves). Never network or FUSE
# shares: there an open file can turn an agent's unlink into a ``.nfsXXXX``
# left behind (its folder cannot be removed) or, on SMB, refuse its rename;
# nor overlayfs, where a file held open from a lower layer misses the
# writes made after its copy-up.
LOCAL_FILESYSTEMS = frozenset(
    {"bcachefs", "btrfs", "ext2", "ext3", "ext4", "f2fs", "jfs", "tmpfs", "xfs", "zfs"}
)
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC

# (inode, size, mtime_ns) of a file, or None when it is missing.
Signature = tuple[int, int, int] | None

_MEMORY, _DESCRIPTOR = 0, 1  # a _File's kind
_MEMORY_NAME = os.fsencode(MEMORY_FILE)
# lseek's other two arguments, for map() over the held fds.
_ZEROS = itertools.repeat(0)
_ENDS = itertools.repeat(os.SEEK_END)
_DESCRIPTOR_NAME = os.fsencode(DESCRIPTOR_NAME)


def passes_within(seconds: float, interval_s: float) -> int:
    """How many passes at ``interval_s`` fit in ``seconds`` (at least one)."""
    return max(1, int(seconds / interval_s))


def default_fd_budget(root: Path) -> int:
    """How many files (MEMORY.md, descriptors) a poller of ``root`` may hold open.

    None off :data:`LOCAL_FILESYSTEMS`; there, a share of the soft
    ``RLIMIT_NOFILE`` that leaves a quarter of it, and at least 1,024 fds, to
    the rest of the daemon (the limit is never raised).
    """
    if filesystem_of(root) not in LOCAL_FILESYSTEMS:
        return 0
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > 1 << 20:
        soft = 1 << 20
    return max(0, soft - max(1024, soft // 4))


def _signature(name: bytes, dir_fd: int | None, seen: Signature | bool) -> Signature:
    """The file's signature; a file seen missing (None) is probed with ``access`` first."""
    if seen is None and not os.access(name, os.F_OK, dir_fd=dir_fd):
        return None
    try:
        st = os.stat(name, dir_fd=dir_fd)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class _File:
    """One file a pass checks: its name, what it saw last, and maybe a held fd.

    ``fd`` (-1: none) is the file held open on a local filesystem, with the
    ctime and size of the path stat that ``seen`` was taken from; ``slot`` its
    place in the pass's list of held MEMORY.md files.
    """

    __slots__ = ("agent", "fd", "fd_ctime", "fd_size", "kind", "name", "seen", "slot")

    def __init__(self, agent: _Agent, kind: int) -> None:
        self.agent = agent
        self.kind = kind  # _MEMORY or _DESCRIPTOR
        self.name = b""
        self.seen: Signature = None
        self.fd = -1
        self.fd_ctime = self.fd_size = -1
        self.slot = -1

    def release(self) -> bool:
        """Close the held fd, if any; whether one was held."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return False
        os.close(fd)
        return True


class _Agent:
    """One watched agent folder: its MEMORY.md and its descriptor.

    ``turn``: given when watched, fixed: the passes whose number matches it
    (modulo ``verify_every``, ``descriptor_every``) check its path and its
    descriptor, whoever else comes and goes.
    """

    __slots__ = ("descriptor", "entry", "folder", "key", "memory", "turn")

    def __init__(self, key: str, folder: bytes, turn: int = 0) -> None:
        self.key = key
        self.folder = folder
        self.turn = turn
        self.entry: str | None = None  # its name in the pinned agents/, if it is there
        self.memory = _File(self, _MEMORY)
        self.descriptor = _File(self, _DESCRIPTOR)

    def name(self, root: bytes | None) -> None:
        """Stat relative to the pinned ``agents/`` (``root``) when the folder is in it."""
        folder = self.folder
        self.entry = None
        if root is not None:
            parent, name = os.path.split(folder)
            if parent == root and name:
                folder = name
                self.entry = os.fsdecode(name)
        self.memory.name = os.path.join(folder, _MEMORY_NAME)
        self.descriptor.name = os.path.join(folder, _DESCRIPTOR_NAME)


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
        fd_budget: int | None = None,
    ) -> None:
        """``fd_budget``: files held open at most (None: :func:`default_fd_budget`)."""
        self._agents_changed = agents_changed
        self._memory_changed = memory_changed
        self._interval_s = interval_s
        # A slice of the agents each pass: 1 in this many (every one within
        # VERIFY_S, DESCRIPTOR_S at this interval).
        self.verify_every = passes_within(VERIFY_S, interval_s)
        self.descriptor_every = passes_within(DESCRIPTOR_S, interval_s)
        self._clock = clock
        self._agents: dict[str, _Agent] = {}
        self._root: bytes | None = None
        self._root_real: bytes | None = None  # os.path.realpath(self._root)
        self._root_fd: int | None = None
        self._root_stat: tuple[int, int, int] | None = None
        self._root_names: dict[str, int] = {}  # agents/'s last listing: name -> inode
        self._root_settle_until = 0.0
        self._root_dev = -1
        # agents/ was replaced: every held file (on the old tree, still linked
        # there, so neither its size nor its fstat moves) is checked against its
        # path on the next pass.
        self._recheck = False
        self._fd_budget_asked = fd_budget
        self._fd_budget = 0
        self._held = [0, 0]  # fds held, by kind
        self._passes = 0
        self._turns = 0  # the last turn given to an agent watched
        # The agents by turn (modulo verify_every, descriptor_every), as of a
        # generation (only the pass thread touches these).
        self._turns_built = -1
        self._verify_turns: dict[int, list[_Agent]] = {}
        self._descriptor_turns: dict[int, list[_Agent]] = {}
        # Agents whose MEMORY.md memd replaced itself (:meth:`replaced`), for the
        # next pass to check against their paths.
        self._replaced: set[str] = set()
        # Bumped (under the lock) when the agents watched change; the pass's
        # lists of held and unheld MEMORY.md files are rebuilt when it moved or
        # a file was held or given back (only the pass thread touches these).
        self._generation = 0
        self._built = -1
        self._held_memory: list[_File] = []  # held MEMORY.md files (each at its slot)
        self._held_fds: list[int] = []
        self._held_sizes: list[int] = []  # each one's fd_size
        self._unheld: list[_File] = []  # MEMORY.md files stat'ed by path
        self._hot: dict[_File, float] = {}  # MEMORY.md seen replaced -> hot until
        # Given back by the pass thread (the only one that uses them), at the
        # start of its next pass: unwatched agents' held files, unpinned fds.
        self._dropped: list[_Agent] = []
        self._closing: list[int] = []
        self._lock = threading.Lock()  # the watches; never held during a pass's I/O
        self._pass_lock = threading.Lock()  # one pass at a time
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
        # A pass stuck on a slow share keeps what it uses (a daemon thread, it
        # ends with the process); otherwise every fd is given back now.
        if not self._pass_lock.acquire(timeout=5):
            _log.warning("poll pass still running at stop; its fds stay open")
            return
        try:
            with self._lock:
                self._unpin_root()
                self._dropped.extend(self._agents.values())
                self._agents.clear()
                self._replaced.clear()
                self._generation += 1
            self._give_back()
            self._held_memory, self._held_fds, self._held_sizes, self._unheld = [], [], [], []
            self._hot.clear()
        finally:
            self._pass_lock.release()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            try:
                self.poll_once()
            except Exception:  # a bug here must not end polling for every agent
                _log.exception("poll pass failed")

    # -------------------------------------------------------------- watches

    def watch_root(self, path: Path | str) -> None:
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

    def watch(self, key: str, path: Path | str) -> None:
        """Watch one agent folder (what an inotify watch would refuse is refused)."""
        if not os.path.isdir(path):
            raise NotADirectoryError(2, "no such folder", str(path))
        agent = _Agent(key, os.fsencode(path))
        with self._lock:
            root, dir_fd = self._root_real, self._root_fd
        agent.name(root if dir_fd is not None else None)
        for file in (agent.memory, agent.descriptor):  # outside the lock: a round trip on NFS
            file.seen = _signature(file.name, dir_fd, False)
        with self._lock:
            if self._root_fd != dir_fd:  # pinned or unpinned meanwhile
                agent.name(self._root_real if self._root_fd is not None else None)
            replaced = self._agents.get(key)
            if replaced is not None:
                self._dropped.append(replaced)
            self._turns += 1
            agent.turn = self._turns
            self._agents[key] = agent
            self._generation += 1

    def unwatch(self, key: str) -> None:
        with self._lock:
            agent = self._agents.pop(key, None)
            if agent is not None:
                self._dropped.append(agent)  # its fds: given back by the next pass
                self._generation += 1

    def watched(self) -> set[str]:
        with self._lock:
            return set(self._agents)

    def replaced(self, keys: Iterable[str]) -> None:
        """memd replaced these agents' MEMORY.md itself (a compaction's commit): the
        next pass checks each against its path (the held fd is the old file: its
        size never moves again) and holds the new file, sized each pass like any
        other (memd tells each of its replacements: it does not make the file hot)."""
        with self._lock:
            self._replaced.update(keys)

    def held(self) -> int:
        """How many files (MEMORY.md and descriptors) are held open."""
        with self._lock:
            return sum(self._held)

    def held_fds(self, key: str) -> tuple[int, int]:
        """The fds held open on ``key``'s MEMORY.md and descriptor (-1: none)."""
        with self._lock:
            agent = self._agents.get(key)
        if agent is None:
            return -1, -1
        return agent.memory.fd, agent.descriptor.fd

    def _pin_root(self, root: bytes) -> None:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            names = _listing(root)
        except OSError:
            os.close(fd)
            raise
        self._root, self._root_fd = root, fd
        # The agents' folders come resolved (the registry's): an agent is in the
        # pinned agents/ when its folder's parent is this, whatever symlink the
        # workspace's path goes through.
        self._root_real = os.path.realpath(root)
        self._root_stat = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        self._root_names = names
        self._root_settle_until = self._clock() + SETTLE_S
        self._root_dev = st.st_dev
        asked = self._fd_budget_asked
        self._fd_budget = default_fd_budget(Path(os.fsdecode(root))) if asked is None else asked
        for agent in self._agents.values():
            agent.name(self._root_real)

    def _unpin_root(self) -> None:
        """Forget ``agents/`` (under the lock): agents are stat'ed by full path.

        Its fd is closed by the next pass, not here: a pass may be using it.
        Files held open stay so until their next path stat (none now on
        agents/'s filesystem) gives them back.
        """
        fd, self._root_fd = self._root_fd, None
        self._root = self._root_real = self._root_stat = None
        self._root_names = {}
        self._root_dev = -1
        self._fd_budget = 0
        if fd is not None:
            self._closing.append(fd)
            for agent in self._agents.values():
                agent.name(None)

    def _give_back(self) -> None:
        """Close what was dropped since the last pass (the pass thread, or stop)."""
        with self._lock:
            dropped, self._dropped = self._dropped, []
            closing, self._closing = self._closing, []
        for agent in dropped:
            self._release(agent.memory)
            self._release(agent.descriptor)
        for fd in closing:
            os.close(fd)

    def _release(self, file: _File) -> None:
        if file.release():
            self._held[file.kind] -= 1
            if file.kind == _MEMORY:
                self._built = -1  # the held files' list is rebuilt

    def _hold(self, file: _File, st: os.stat_result, dir_fd: int | None, room: int) -> None:
        """Hold ``file`` open (``st`` is its path stat) while fewer than ``room`` of its kind are.

        Only a regular file on agents/'s own filesystem with a single link: a
        held fd tells a replacement by its link count dropping to 0, which a
        second link would hide. Its ctime and size are taken from ``st``,
        the stat the pass reported from, so a write in between still shows.
        """
        if st.st_nlink != 1 or st.st_dev != self._root_dev or not stat_module.S_ISREG(st.st_mode):
            self._release(file)
            return
        fd = file.fd
        if fd >= 0:
            try:
                same = os.fstat(fd).st_ino == st.st_ino
            except OSError:
                same = False
            if not same:
                self._release(file)
                fd = -1
        if fd < 0:
            if self._held[file.kind] >= room:
                return
            try:
                fd = os.open(file.name, _OPEN_FLAGS, dir_fd=dir_fd)
            except OSError as exc:  # a symlink (ELOOP), gone, or out of fds
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self._fd_budget = sum(self._held)
                return
            try:
                opened = os.fstat(fd)
            except OSError:
                opened = None
            if opened is None or (opened.st_ino, opened.st_dev) != (st.st_ino, st.st_dev):
                os.close(fd)  # replaced in between: the next pass sees it
                return
            file.fd = fd
            self._held[file.kind] += 1
            if file.kind == _MEMORY:
                self._built = -1
        file.fd_ctime, file.fd_size = st.st_ctime_ns, st.st_size

    # ---------------------------------------------------------------- a pass

    def poll_once(self) -> None:
        """One pass: report what changed since the previous one.

        The watches' lock is held only to take a snapshot and to record: a
        pass of 10,000 round trips on NFS never blocks ``watch``/``watched``.
        """
        with self._pass_lock:
            self._give_back()
            root_gone, names, remade = self._poll_root()
            with self._lock:
                self._passes += 1
                passes = self._passes
                agents = list(self._agents.values())
                dir_fd, budget, generation = self._root_fd, self._fd_budget, self._generation
                recheck, self._recheck = self._recheck, False
                replaced = [self._agents[k] for k in self._replaced if k in self._agents]
                self._replaced.clear()
            gone: list[str] = []
            changed: list[str] = []
            if self._turns_built != generation:
                self._build_turns(agents, generation)
            # The agents whose files are checked against their paths this pass,
            # whatever their held fds say.
            if recheck:
                forced = agents
            else:
                forced = [a for a in agents if a.entry in remade] if remade else []
                forced += replaced
            room = budget - self._held[_DESCRIPTOR]
            memory = self._poll_memory(agents, generation, passes, room, dir_fd, forced)
            for file in memory:
                if file.seen is None and not os.path.isdir(file.agent.folder):
                    gone.append(file.agent.key)  # MEMORY.md gone with its folder
                else:
                    changed.append(file.agent.key)
            # MEMORY.md first: descriptors are held only while the budget keeps
            # an fd for every agent's MEMORY.md (and given back when new agents
            # need them).
            room = budget - len(agents)
            if self._held[_DESCRIPTOR] > room:
                for agent in agents:
                    if self._held[_DESCRIPTOR] <= room:
                        break
                    self._release(agent.descriptor)
            every = self.descriptor_every
            files = [a.descriptor for a in self._descriptor_turns.get(passes % every, ())]
            if forced:  # each path, as for MEMORY.md
                for file in (a.descriptor for a in forced):
                    file.fd_ctime = -1
                files = list(dict.fromkeys(files + [a.descriptor for a in forced]))
            turn = passes // every
            changed.extend(f.agent.key for f in self._poll_files(files, turn, room, dir_fd))
        if root_gone:
            self._agents_changed(None)
        for name in names:
            self._agents_changed(name)
        for key in gone:
            self._agents_changed(key)
        for key in changed:
            self._memory_changed(key)

    def _poll_root(self) -> tuple[bool, list[str], set[str]]:
        """(agents/ went away or was replaced, the names that came or went in it
        or whose folder was made again: gone and back between two listings, its
        inode changed).

        A folder removed and made again leaves the names as they were, and the
        held fds on the removed files unchanged: the listing's inodes tell
        (``d_ino``, from the same ``getdents``: no stat).
        """
        with self._lock:
            root, fd = self._root, self._root_fd
            seen, settle_until = self._root_stat, self._root_settle_until
        if root is None:
            return False, [], set()
        try:
            st = os.stat(root)  # the path, not the pinned fd: a replaced agents/ must show
        except OSError:
            return self._root_lost(root, fd, repin=False)
        stat = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        if seen is not None and stat[0] != seen[0]:
            return self._root_lost(root, fd, repin=True)
        now = self._clock()
        if stat != seen:
            settle_until = now + SETTLE_S
        elif now >= settle_until:
            return False, [], set()
        try:
            names = _listing(root)
        except OSError:
            return self._root_lost(root, fd, repin=False)
        with self._lock:
            if self._root_fd != fd:
                return False, [], set()  # pinned again meanwhile: its own listing holds
            known = self._root_names
            changes = names.keys() ^ known.keys()
            remade = {name for name, _ino in names.items() - known.items()} - changes
            self._root_stat, self._root_settle_until = stat, settle_until
            self._root_names = names
        return False, sorted(changes | remade), remade

    def _root_lost(
        self, root: bytes, fd: int | None, repin: bool
    ) -> tuple[bool, list[str], set[str]]:
        """agents/ went away (unwatched: the next sync watches it again) or was replaced."""
        with self._lock:
            if self._root_fd != fd:
                return False, [], set()  # re-pinned or unwatched meanwhile
            self._unpin_root()
            if repin:
                with contextlib.suppress(OSError):  # else unwatched: the next sync tries again
                    self._pin_root(root)
                    self._recheck = True
        return True, [], set()

    def _poll_memory(
        self,
        agents: list[_Agent],
        generation: int,
        turn: int,
        room: int,
        dir_fd: int | None,
        forced: list[_Agent],
    ) -> list[_File]:
        """The MEMORY.md files that changed (``seen`` updated).

        Every held file is sized with one ``lseek`` (no stat result to build:
        a third of an ``fstat``'s cost); the full check (:meth:`_check`) runs
        on those whose size moved, on the hot ones (seen replaced within
        :data:`HOT_S`), on the agents whose turn it is (one in
        ``verify_every``) whose path no longer shows what was seen, and on
        every file not held; and the ``forced`` agents' files are checked
        against their paths (agents/ replaced, their folder made again, memd
        replaced them). A file found replaced otherwise (its writer replaces
        it) is hot from then on.
        """
        if self._built != generation:
            self._build(agents, generation)
        held, sizes = self._held_memory, self._held_sizes
        try:
            now_sizes = list(map(os.lseek, self._held_fds, _ZEROS, _ENDS))
        except OSError:
            now_sizes = [_size(fd) for fd in self._held_fds]
        check: dict[_File, None] = {}
        if now_sizes != sizes:
            moved = itertools.compress(held, map(operator.ne, now_sizes, sizes))
            check.update(dict.fromkeys(moved))
        for agent in forced:
            file = agent.memory
            if file.fd >= 0:
                file.fd_ctime = -1  # the check stats its path
                check[file] = None
        every = self.verify_every
        for agent in self._verify_turns.get(turn % every, ()):
            file = agent.memory
            # The path still names the held inode, unchanged: one stat tells.
            if file.fd >= 0 and _signature(file.name, dir_fd, False) != file.seen:
                file.fd_ctime = -1  # not so: the check stats it and takes the new file
                check[file] = None
        now = self._clock()
        if self._hot:
            for file, until in list(self._hot.items()):
                if until <= now:
                    del self._hot[file]
                elif file.fd >= 0:
                    check[file] = None
        renewed: list[_File] = []
        changed = self._check(list(check), room, dir_fd, renewed)
        changed += self._check(self._unheld, room, dir_fd, renewed)
        if self._built == generation:  # no file held or given back meanwhile
            for file in check:
                sizes[file.slot] = file.fd_size
        hot_until = now + HOT_S
        if renewed:
            # Not the forced ones: a new folder or memd's own compaction says
            # nothing of how the agent writes its file.
            told = {agent.memory for agent in forced}
            for file in renewed:
                if file not in told:
                    self._hot[file] = hot_until
        return changed

    def _build(self, agents: list[_Agent], generation: int) -> None:
        """The pass's lists of held and unheld MEMORY.md files, after a change."""
        held: list[_File] = []
        unheld: list[_File] = []
        for agent in agents:
            file = agent.memory
            if file.fd >= 0:
                file.slot = len(held)
                held.append(file)
            else:
                unheld.append(file)
        self._held_memory, self._unheld = held, unheld
        self._held_fds = [file.fd for file in held]
        self._held_sizes = [file.fd_size for file in held]
        if self._hot:
            watched = {id(file) for file in held}
            watched.update(id(file) for file in unheld)
            self._hot = {f: until for f, until in self._hot.items() if id(f) in watched}
        self._built = generation

    def _build_turns(self, agents: list[_Agent], generation: int) -> None:
        """The agents by their turn, after a change to the agents watched."""
        verify: dict[int, list[_Agent]] = {}
        descriptor: dict[int, list[_Agent]] = {}
        v_every, d_every = self.verify_every, self.descriptor_every
        for agent in agents:
            verify.setdefault(agent.turn % v_every, []).append(agent)
            descriptor.setdefault(agent.turn % d_every, []).append(agent)
        self._verify_turns, self._descriptor_turns = verify, descriptor
        self._turns_built = generation

    def _poll_files(
        self, files: list[_File], turn: int, room: int, dir_fd: int | None
    ) -> list[_File]:
        """The files that changed, each checked in full (descriptors, a slice a pass).

        A held file has its path stat'ed as well, whatever its fstat says, in
        one of ``verify_every`` of its turns (``turn``: how many came before).
        """
        every, per = self.verify_every, self.descriptor_every
        for file in files:
            if (file.agent.turn // per - turn) % every:
                continue
            # The path still names the held inode, unchanged: one stat tells.
            if file.fd >= 0 and _signature(file.name, dir_fd, False) != file.seen:
                file.fd_ctime = -1  # not so: the check stats it and takes the new file
        return self._check(files, room, dir_fd)

    def _check(
        self,
        files: list[_File],
        room: int,
        dir_fd: int | None,
        renewed: list[_File] | None = None,
    ) -> list[_File]:
        """The files that changed (``seen`` updated), holding up to ``room`` of their kind open.

        A held file whose fstat shows the same ctime and size and one link is
        unchanged: no path to resolve. Otherwise its path is stat'ed. Those
        whose path names another file than it did (another inode, gone, or
        back) are also added to ``renewed``.
        """
        stat, fstat, access, exists = os.stat, os.fstat, os.access, os.F_OK
        changed: list[_File] = []
        for file in files:
            fd = file.fd
            if fd >= 0:
                try:
                    held = fstat(fd)
                except OSError:
                    pass
                else:
                    if (
                        held.st_ctime_ns == file.fd_ctime
                        and held.st_size == file.fd_size
                        and held.st_nlink == 1
                    ):
                        continue
            seen = file.seen
            if seen is None and fd < 0 and not access(file.name, exists, dir_fd=dir_fd):
                continue  # still missing
            try:
                st = stat(file.name, dir_fd=dir_fd)
            except OSError:
                now: Signature = None
                self._release(file)
            else:
                now = (st.st_ino, st.st_size, st.st_mtime_ns)
                if fd >= 0 or self._held[file.kind] < room:
                    self._hold(file, st, dir_fd, room)
            if now != seen:
                file.seen = now
                changed.append(file)
                if renewed is not None and (now is None or seen is None or now[0] != seen[0]):
                    renewed.append(file)
        return changed


def _listing(root: bytes) -> dict[str, int]:
    """``root``'s entries: name -> inode (``d_ino``, no stat)."""
    with os.scandir(os.fsdecode(root)) as entries:
        return {entry.name: entry.inode() for entry in entries}


def _size(fd: int) -> int:
    """The held file's size, -1 when it cannot be told (a full check follows)."""
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        return -1


__all__ = [
    "DESCRIPTOR_S",
    "HOT_S",
    "LOCAL_FILESYSTEMS",
    "SETTLE_S",
    "VERIFY_S",
    "Signature",
    "StatPoller",
    "default_fd_budget",
    "passes_within",
]
