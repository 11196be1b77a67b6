"""Who may read an agent's archives (DESIGN §1's ownership rule, as values).

An agent's user appends its MEMORY.md and may read, not change or delete, its
own archives; nobody but memd and root reads another agent's files. memd
cannot learn "the agent's user" from anywhere but the live file, so the rule
is: an archive is readable by exactly the group that can already read the
MEMORY.md it came from (the agent's own group in the shipped layouts), never
writable by it and never readable by others. A MEMORY.md no group may read
gives private archives. The archive folder, when memd creates it, follows
the same rule; memd owns both, so deleting stays memd's job (`forget`,
`prune`).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
GROUP_READ_FILE = 0o640
# Not setgid: the shipped unit's RestrictSUIDSGID= refuses that (EPERM), and
# each archive gets its group explicitly anyway.
GROUP_READ_DIR = 0o750


@dataclass(frozen=True)
class ArchiveAccess:
    file_mode: int
    dir_mode: int
    # The group to give archive files and a folder memd creates; None keeps
    # memd's own (private modes need no group).
    gid: int | None

    @property
    def shared(self) -> bool:
        return self.gid is not None


def archive_access(memory_mode: int, memory_gid: int) -> ArchiveAccess:
    """The modes and group for an archive of a MEMORY.md with this mode and group."""
    if memory_mode & stat.S_IRGRP:
        return ArchiveAccess(GROUP_READ_FILE, GROUP_READ_DIR, memory_gid)
    return ArchiveAccess(PRIVATE_FILE, PRIVATE_DIR, None)
