"""The watches follow the agent set, one way: the registry publishes each rescan
(:class:`memd.daemon.registry.Rescans`), this service keeps the watcher's
watches matching the set, restarts a dead watcher, and asks the counter (a hint
on its queue) to count whatever a missing watch may have hidden.

It is the watcher's only driver: the counter downstream reads hints and never
calls the watcher; the registry is read, never told. One step is :meth:`tick`
(tests call it); the service thread runs it after each published rescan, and
at least every ``check_every_s`` (a dead watcher is restarted even when no
rescan comes).

memd's own replacements of MEMORY.md (a compaction's commit) come to it as
events too, on :class:`memd.daemon.committed.Replacements` (put there as the
kernel queues a rename, taken by a second thread of this service): the watcher
is told, and with ``--poll`` its next pass checks those agents' paths. So are
another process's compactions (``memd compact-now``) with ``--poll``: that thread
reads the state DB's ledger each poll interval (:class:`OtherCompactions`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping

from memd.daemon.committed import OtherCompactions, Replacements
from memd.daemon.counter import HintSink
from memd.daemon.registry import AgentRegistry
from memd.logs import get_logger
from memd.watcher import Watcher

_log = get_logger("memd.daemon")


class WatchService:
    def __init__(
        self,
        watcher: Watcher,
        registry: AgentRegistry,
        hints: HintSink,
        *,
        check_every_s: float,
        replacements: Replacements | None = None,
        others: OtherCompactions | None = None,
        others_every_s: float = 1.0,
    ) -> None:
        self.watcher = watcher
        # How long the thread waits for a rescan before checking anyway (reload sets it).
        self.check_every_s = check_every_s
        self._registry = registry
        self._hints = hints
        self._replacements = replacements
        # With --poll only (inotify reports every rename as it happens): another
        # process's compactions, read from the ledger this often (the poll interval).
        self._others = others
        self._others_every_s = others_every_s
        self._synced: set[str] = set()  # the agent set the watches were last matched to
        self._opened = False  # open() put the watcher's stop on the stack
        self._watching = False  # open() watched every agent already
        self._lock = threading.Lock()  # one tick at a time (the thread's, a test's)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._replaced_thread: threading.Thread | None = None

    def open(self, stack: contextlib.ExitStack, folders: Mapping[str, str]) -> bool:
        """Before the start-up pass: watch ``folders`` (agent -> its folder, found by
        the scan, nothing in them read yet) now if the watcher can before its thread
        runs (inotify), so every read of the pass comes after the watches and a
        write after a read is reported once :meth:`start` runs; then :meth:`match`
        once the registry holds the agents. False: nothing is watched until
        :meth:`start` (the caller reads again after)."""
        stack.callback(self.watcher.stop)
        self._opened = True
        if not self.watcher.open():
            return False
        self.watcher.sync(folders)
        self._synced = set(folders)
        self._watching = True
        return True

    def match(self) -> list[str]:
        """After :meth:`open`: match the watches to the registered agents (a folder
        :meth:`open` was not given, a symlink, is watched; a refused one is not);
        returns the agents watched now (whose reads came before their watch)."""
        names = self._registry.names()
        if names == self._synced:
            return []
        added = sorted(names - self._synced)
        self.watcher.sync(self._registry.dirs())
        self._synced = names
        return added

    def start(self, stack: contextlib.ExitStack) -> None:
        """Start the watcher; unless :meth:`open` watched every agent already, watch
        them now (the caller then stats what changed meanwhile); then follow the
        rescans in a thread."""
        self.watcher.start()
        if not self._opened:
            stack.callback(self.watcher.stop)
        seen = self._registry.rescans.number
        if not self._watching:  # open() did not (the agent set is the same since)
            self._synced = self._registry.names()
            self.watcher.sync(self._registry.dirs())
        self._thread = threading.Thread(
            target=self._loop, args=(seen,), name="memd-watch", daemon=True
        )
        self._thread.start()
        if self._replacements is not None:
            self._replaced_thread = threading.Thread(
                target=self._pass_replaced,
                args=(self._replacements,),
                name="memd-replaced",
                daemon=True,
            )
            self._replaced_thread.start()
        stack.callback(self.stop)

    def stop(self, timeout: float = 5) -> None:
        self._stop.set()
        self._registry.rescans.wake()
        if self._replacements is not None:
            self._replacements.wake()
        for thread in (self._thread, self._replaced_thread):
            if thread is not None:
                thread.join(timeout=timeout)

    def is_alive(self) -> bool:
        """The watcher's thread, and this service's that keeps it."""
        thread = self._thread
        return self.watcher.is_alive() and thread is not None and thread.is_alive()

    def _loop(self, seen: int) -> None:
        while not self._stop.is_set():
            seen = self._registry.rescans.wait(seen, self.check_every_s, self._stop)
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception:  # the next rescan tries again
                _log.exception("keeping the watches failed")

    def _pass_replaced(self, replacements: Replacements) -> None:
        others = self._others
        every_s = None if others is None else self._others_every_s
        while not self._stop.is_set():
            agents = replacements.take(self._stop, every_s)
            if others is not None and not self._stop.is_set():
                agents += [agent for agent in others.take() if agent not in agents]
            if agents:
                try:
                    self.watcher.replaced(agents)
                except Exception:  # the agents' turns still come
                    _log.exception("passing replacements to the watcher failed")

    def tick(self) -> None:
        """Match the watches to the agent set now; ask for a count of every agent
        whose events may have been missed (new, re-watched, or all after a restart)."""
        with self._lock:
            self._tick()

    def _tick(self) -> None:
        watcher = self.watcher
        restarted = False
        if not watcher.is_alive() and not self._stop.is_set():
            _log.warning("watcher thread died; restarting it")
            watcher.restart()
            restarted = True
        names = self._registry.names()
        added = names - self._synced
        if added:
            # First: a new folder may take over the watch of a folder renamed to
            # it, and the name that watch had is then seen as lost just below.
            watcher.sync(self._registry.dirs())
        # Agents whose watch went away (their folder was replaced under the same
        # name) or never came (it failed) are watched again and recounted:
        # events may have been missed.
        lost = (names - added) - watcher.watched()
        # agents/ unwatched (gone for a moment, a listing that failed, replaced by a
        # rename) with the same names: watched again here, else never until the
        # agent set changes.
        if (
            restarted
            or names != self._synced
            or watcher.failed
            or lost
            or not watcher.root_watched()
        ):
            watcher.sync(self._registry.dirs())
        self._synced = names
        for name in sorted(names if restarted else added | lost):
            self._hints.count_now(name)


__all__ = ["WatchService"]
