"""Each agent's archive count and bytes, kept in its entry (and so in the state DB).

``memd status`` reads them from the state DB instead of listing 30,000 archive
folders. Kept current three ways: restored from the DB at start-up (no I/O),
refreshed at once when a compaction commits an archive, and surveyed
periodically for what other processes do (``compact-now``, ``forget``,
``prune``): one stat of each ``archive/`` folder, a listing only when its
mtime moved (archives are never modified in place).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from memd.daemon.entries import AgentEntry
from memd.daemon.registry import AgentRegistry
from memd.errors import describe_error
from memd.logs import get_logger
from memd.workspace import (
    AGENTS_DIR,
    ARCHIVE_DIR,
    NO_ARCHIVES,
    AgentPaths,
    ArchiveStats,
    archive_stats,
)

if TYPE_CHECKING:
    from memd.state import AgentRecord

_log = get_logger("memd.daemon")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class ArchiveSurvey:
    def __init__(self, registry: AgentRegistry) -> None:
        self._registry = registry
        # One refresh at a time (the periodic survey, a compaction's commit): the
        # figures written are those of the last listing. Nothing else is taken under it.
        self._lock = threading.Lock()

    @staticmethod
    def restore(entry: AgentEntry, record: AgentRecord | None) -> None:
        """Start-up: the stored figures, verified by the next survey."""
        if record is not None:
            entry.archives = record.archive_stats

    def refresh(self, entry: AgentEntry, *, relist: bool = False) -> None:
        with self._lock:
            try:
                stats = archive_stats(entry.paths, None if relist else entry.archives)
            except OSError as exc:
                _log.debug("cannot survey archives", agent=entry.name, error=describe_error(exc))
                return
            if stats == entry.archives:
                return
            entry.archives = stats
            entry.dirty = True  # after the figures (see AgentRegistry.take_changes)

    def survey(self) -> None:
        """The periodic pass: one stat per agent, a listing where something changed.

        Each ``archive/`` is stat'ed relative to ``agents/`` (two path components
        to resolve, not the workspace's whole path), and outside the lock; an
        agent surveyed before with no ``archive/`` is probed with ``access`` (no
        exception per agent per survey). Only a folder whose mtime moved (or
        that cannot be stat'ed) is refreshed, under the lock.
        """
        entries = self._registry.agents()
        try:
            agents_fd = os.open(self._registry.workspace / AGENTS_DIR, _DIR_FLAGS)
        except OSError:
            for entry in entries.values():
                self.refresh(entry)
            return
        try:
            for name, entry in entries.items():
                known = entry.archives
                if known is None or _archive_mtime(name, agents_fd, known) != known.mtime_ns:
                    self.refresh(entry)
        finally:
            os.close(agents_fd)

    def archived(self, paths: AgentPaths) -> None:
        """The agent's archives changed (a compaction committed one, a prune deleted some)."""
        entry = self._registry.get(paths.agent)
        if entry is not None:
            # Listed even if the folder's mtime looks unchanged (coarse clocks).
            self.refresh(entry, relist=True)


def _archive_mtime(agent: str, agents_fd: int, known: ArchiveStats) -> int | None:
    """The agent's ``archive/`` mtime (ns) as ``archive_stats`` takes it: the
    figures of a missing folder (:data:`NO_ARCHIVES`) when there is none, None
    when it cannot be told (refreshed then)."""
    path = f"{agent}/{ARCHIVE_DIR}"
    if known == NO_ARCHIVES and not os.access(path, os.F_OK, dir_fd=agents_fd):
        return NO_ARCHIVES.mtime_ns
    try:
        return os.stat(path, dir_fd=agents_fd).st_mtime_ns
    except OSError:
        return None


__all__ = ["ArchiveSurvey"]
