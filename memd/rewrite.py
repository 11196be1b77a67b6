"""Staged rewrites of an agent's archives: erase-by-pattern's commit, finished by recovery.

``memd forget AGENT --match`` is the one operation that rewrites archives
(DESIGN.md §1). It never edits one in place: each new version is written in
full to a temp in ``.memd/`` (``erase-N.tmp``, fsynced, the archive's mode and
group), and a manifest (``erase.manifest``: names and inode numbers, never
content and never the pattern) says which temp replaces which archive. Once
the journal says "erasing", the job is committed: every staged temp is renamed
over its archive, by this process or, after a crash, by the next one to take
the agent's lock (:func:`apply_staged` is idempotent: a temp already renamed is
no longer there). Before that journal write a crash leaves the archives as
they were, and the temps are stale files recovery removes.

With encrypted archives the erasure re-seals every one of the agent's
``.md.enc`` files under a new data key, staged here too (``erase-key.tmp``):
once the archives are renamed, the old key file is overwritten and removed
(crypto-shredding, :func:`memd.archive_crypto.destroy_data_key`) and the new
one renamed into place, so the old ciphertext, wherever its blocks survive,
can no longer be opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from dataclasses import dataclass

from memd.agentdir import AgentDir
from memd.archive_crypto import DATA_KEY_NAME, destroy_data_key
from memd.errors import MemdError
from memd.fsutil import create_file_at, read_to_end

ERASE_PHASE = "erasing"
MANIFEST_NAME = "erase.manifest"
STAGED_PREFIX = "erase-"
STAGED_KEY = "erase-key.tmp"
MANIFEST_VERSION = 1


class StagingError(MemdError, RuntimeError):
    """A staged rewrite's manifest cannot be read (its format is newer, or it is damaged)."""


@dataclass(frozen=True, slots=True)
class StagedFile:
    """``temp`` (in ``.memd/``, inode ``ino``) replaces the archive ``name``."""

    name: str
    temp: str
    ino: int


def staged_name(index: int) -> str:
    return f"{STAGED_PREFIX}{index}.tmp"


def write_manifest(pinned: AgentDir, files: list[StagedFile], key_ino: int = 0) -> str:
    """Write the manifest durably; returns its sha256 (the journal records it)."""
    body = {
        "version": MANIFEST_VERSION,
        "files": [{"name": f.name, "temp": f.temp, "ino": f.ino} for f in files],
        "key_ino": key_ino,
    }
    data = json.dumps(body, sort_keys=True).encode()
    fd = create_file_at(pinned.private_fd, MANIFEST_NAME, [data])
    os.close(fd)
    os.fsync(pinned.private_fd)
    return hashlib.sha256(data).hexdigest()


def _read_manifest(pinned: AgentDir) -> tuple[list[StagedFile], int] | None:
    try:
        fd = pinned.open_private(MANIFEST_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        data = read_to_end(fd)
    finally:
        os.close(fd)
    try:
        body = json.loads(data)
        version = int(body["version"])
        if version > MANIFEST_VERSION:
            raise StagingError(
                f"agent {pinned.paths.agent!r}: the erase manifest has format {version}, newer "
                f"than this memd reads ({MANIFEST_VERSION}); finish it with the newer memd"
            )
        files = [StagedFile(str(f["name"]), str(f["temp"]), int(f["ino"])) for f in body["files"]]
        return files, int(body.get("key_ino", 0))
    except (ValueError, KeyError, TypeError):
        raise StagingError(
            f"agent {pinned.paths.agent!r}: the erase manifest is damaged; the archives are "
            "left as they are (check them, then remove .memd/erase.manifest)"
        ) from None


def _staged_ino(pinned: AgentDir, temp: str) -> int | None:
    try:
        result = os.stat(temp, dir_fd=pinned.private_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return result.st_ino if stat.S_ISREG(result.st_mode) else None


def _safe_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


def apply_staged(pinned: AgentDir) -> int:
    """Rename every staged temp over its archive (the commit, or its completion after
    a crash), then swap in a staged data key; returns the archives renamed."""
    manifest = _read_manifest(pinned)
    if manifest is None:
        return 0
    files, key_ino = manifest
    archive_fd, _created = pinned.archive_fd(create=False)
    renamed = 0
    for item in files:
        if not (_safe_name(item.name) and item.temp.startswith(STAGED_PREFIX)):
            continue
        if archive_fd < 0 or _staged_ino(pinned, item.temp) != item.ino:
            continue  # renamed already (a crash after it), or not ours
        os.replace(item.temp, item.name, src_dir_fd=pinned.private_fd, dst_dir_fd=archive_fd)
        renamed += 1
    if renamed:
        os.fsync(archive_fd)
    if key_ino and _staged_ino(pinned, STAGED_KEY) == key_ino:
        # Every archive is sealed under the new key by now: the old one opens
        # only old ciphertext, so it is shredded before the new one goes in.
        destroy_data_key(pinned.private_fd)
        os.replace(
            STAGED_KEY, DATA_KEY_NAME, src_dir_fd=pinned.private_fd, dst_dir_fd=pinned.private_fd
        )
    os.fsync(pinned.private_fd)
    return renamed


def remove_staging(pinned: AgentDir) -> int:
    """Remove the manifest and any staged temp (after the commit, or stale ones)."""
    if pinned.private_fd < 0:
        return 0
    removed = 0
    with os.scandir(pinned.private_fd) as entries:
        names = [
            e.name
            for e in entries
            if e.name == MANIFEST_NAME
            or (e.name.startswith(STAGED_PREFIX) and e.name.endswith(".tmp"))
        ]
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=pinned.private_fd)
            removed += 1
    return removed


__all__ = [
    "ERASE_PHASE",
    "MANIFEST_NAME",
    "STAGED_KEY",
    "StagedFile",
    "StagingError",
    "apply_staged",
    "remove_staging",
    "staged_name",
    "write_manifest",
]
