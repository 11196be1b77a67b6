"""Deleting archives a retention policy no longer keeps (decided by :mod:`memd.core.retention`).

Always called with the agent's compaction lock held and its folder pinned
(:class:`memd.agentdir.AgentDir`): the archive folder is listed and each
archive unlinked through the pinned ``archive/`` fd, never by a path an agent
could swap for a symlink. The archive folder is fsynced once after the
deletions. Plain (``.md``) and encrypted (``.md.enc``) archives both count;
any other file there is left alone.

Who calls it: the compaction transaction right after its commit (the new
archive protected), ``memd prune`` and the daemon's daily pass (through
:func:`memd.compaction.prune_agent`, which takes the lock and finishes a
crashed compaction first).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass

from memd.agentdir import AgentDir
from memd.core.retention import (
    ArchiveInfo,
    PrunePlan,
    RetentionLimits,
    is_archive_name,
    plan_prune,
)


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What a prune did (or, ``dry_run``, would do) to one agent's archives."""

    agent: str
    limits: RetentionLimits
    plan: PrunePlan
    deleted: tuple[str, ...]  # names actually unlinked (none on a dry run)
    deleted_bytes: int
    dry_run: bool = False

    @property
    def kept(self) -> int:
        """Archives left after it (on a dry run: that the prune would leave)."""
        if self.dry_run:
            return len(self.plan.keep)
        return len(self.plan.keep) + len(self.plan.delete) - len(self.deleted)


def local_utc_offset(instant: float) -> int:
    """This process's UTC offset at ``instant`` in seconds (its TZ, DST included):
    what retention believes an archive's mtime against."""
    return time.localtime(instant).tm_gmtoff


def list_archives(pinned: AgentDir) -> list[ArchiveInfo]:
    """The agent's archives (regular files with an archive name), via the pinned fd."""
    archive_fd, _created = pinned.archive_fd(create=False)
    if archive_fd < 0:
        return []
    found = []
    for name in os.listdir(archive_fd):
        if not is_archive_name(name):
            continue
        try:
            result = os.stat(name, dir_fd=archive_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(result.st_mode):
            found.append(ArchiveInfo(name, result.st_size, result.st_mtime))
    return found


def prune_locked(
    pinned: AgentDir,
    limits: RetentionLimits,
    now: float,
    *,
    protect: Iterable[str] = (),
    dry_run: bool = False,
) -> PruneResult:
    """Apply ``limits`` to the agent's archives; the caller holds the agent's lock."""
    plan = plan_prune(list_archives(pinned), limits, now, protect, local_utc_offset)
    deleted: list[str] = []
    deleted_bytes = 0
    if not dry_run and plan.delete:
        archive_fd, _created = pinned.archive_fd(create=False)
        for info in plan.delete:
            try:
                os.unlink(info.name, dir_fd=archive_fd)
            except FileNotFoundError:
                continue  # gone meanwhile (forget, an operator): not ours to count
            deleted.append(info.name)
            deleted_bytes += info.size
        with contextlib.suppress(OSError):
            os.fsync(archive_fd)
    return PruneResult(
        agent=pinned.paths.agent,
        limits=limits,
        plan=plan,
        deleted=tuple(deleted),
        deleted_bytes=deleted_bytes,
        dry_run=dry_run,
    )


__all__ = ["PruneResult", "list_archives", "prune_locked"]
