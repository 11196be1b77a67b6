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
import struct
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


def widens_archive_dir(
    access: ArchiveAccess, dir_mode: int, dir_uid: int, memd_uid: int, has_acl: bool
) -> bool:
    """Whether writing an archive with ``access`` into an existing archive folder
    gives that folder a fresh one's mode and group: a folder an older memd made
    private (0700, before archives followed MEMORY.md's group) would keep the
    group from the very archives the rule lets it read. Only a folder memd owns,
    whose mode gives the group nothing, and with no ACL (one somebody set is
    theirs to keep); the old archives inside keep their modes (who may read
    those is the operator's call)."""
    return access.shared and dir_uid == memd_uid and not dir_mode & stat.S_IRWXG and not has_acl


# POSIX ACLs as the kernel stores them in the ``system.posix_acl_access``
# xattr: a little-endian version (2), then (tag u16, perm u16, id u32) entries.
_ACL_VERSION = 2
_ACL_HEADER = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")
ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = 1, 2, 4, 8, 0x10, 0x20
_READ = 4


def parse_acl(raw: bytes) -> list[tuple[int, int, int]] | None:
    """The entries of an access ACL xattr; None when it is not one memd reads."""
    if len(raw) < _ACL_HEADER.size or (len(raw) - _ACL_HEADER.size) % _ACL_ENTRY.size:
        return None
    if _ACL_HEADER.unpack_from(raw)[0] != _ACL_VERSION:
        return None
    return list(_ACL_ENTRY.iter_unpack(raw[_ACL_HEADER.size :]))


def pack_acl(entries: list[tuple[int, int, int]]) -> bytes:
    return _ACL_HEADER.pack(_ACL_VERSION) + b"".join(_ACL_ENTRY.pack(*e) for e in entries)


def archive_acl(memory_acl: bytes | None, access: ArchiveAccess) -> bytes | None:
    """The access ACL for an archive of a MEMORY.md carrying ``memory_acl``: read
    for exactly whom the ACL let read MEMORY.md (its named users and groups, its
    owning group as the ACL says, not as the mode's group bits, which are the
    mask), never write, nothing for others; None: mode bits only (no ACL on
    MEMORY.md, an ACL memd does not read, or a private archive)."""
    if memory_acl is None or not access.shared:
        return None
    entries = parse_acl(memory_acl)
    if entries is None:
        return None
    kept = []
    for tag, perm, ident in entries:
        if tag == ACL_USER_OBJ:
            perm = (access.file_mode >> 6) & 0o7  # memd, the archive's owner
        elif tag == ACL_OTHER:
            perm = 0
        else:  # named users and groups, the owning group, the mask: read at most
            perm &= _READ
        kept.append((tag, perm, ident))
    return pack_acl(kept)
