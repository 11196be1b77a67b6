"""Erasure rules, pure: the tombstone ``memd forget`` leaves, and when an agent comes back.

After ``memd forget AGENT`` a running daemon still knows the agent (its folder
stays, its in-memory count and job go on): left alone it would write the
agent's row straight back into the state DB and keep its metrics series. The
tombstone tells it not to, until the agent really writes again: a MEMORY.md
that appeared after the erasure.

"After the erasure" is judged with the file system's own clock (a file's
ctime against the agent folder's ctime once the erasure's unlinks were done),
never with ``time.time()`` against a ctime: the kernel stamps files with a
coarse clock that can lag the wall clock by a tick, so a file created just
after the erasure could otherwise look older than it. An erased MEMORY.md
with other hard links lives on under its inode number, which the tombstone
records: that inode linked back as MEMORY.md is the old memory, not a new one
(a freed inode number, on the other hand, may be reused by a new file, which
is why only a surviving inode is recorded).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FileStamp:
    """What the revival rule needs of a MEMORY.md (from ``os.stat``)."""

    dev: int
    ino: int
    ctime_ns: int


@dataclass(frozen=True, slots=True)
class Tombstone:
    # A salted hash of the agent's name (see ``agent_key``): an erased agent's
    # name does not stay in the state DB's bytes.
    key: str
    erased_at_ns: int  # the agent folder's ctime once the erasure's unlinks were done
    survivor_dev: int = 0  # the erased MEMORY.md's inode when other links keep it alive
    survivor_ino: int = 0


def agent_key(salt: bytes, agent: str) -> str:
    """The name as the tombstone stores it: salted, so a name list cannot be
    checked against a copy of the DB without its salt table."""
    digest = hashlib.sha256(salt + agent.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def revives(tombstone: Tombstone, memory: FileStamp | None) -> bool:
    """Whether ``memory`` (the agent's MEMORY.md now, None when absent) ends the erasure."""
    if memory is None:
        return False
    if tombstone.survivor_ino and (memory.dev, memory.ino) == (
        tombstone.survivor_dev,
        tombstone.survivor_ino,
    ):
        return False
    return memory.ctime_ns >= tombstone.erased_at_ns


__all__ = ["FileStamp", "Tombstone", "agent_key", "revives"]
