"""Erase by pattern (``memd forget AGENT --match REGEX``): the transaction.

The only operation that rewrites archives. It runs under the agent's
compaction lock and is crash-safe like a compaction, by the same means:

1. take the lock, finish or roll back whatever a crash left (the journal);
2. stage: every archive holding a match is filtered (:func:`memd.core.erasure.
   erase_matching`) into a temp in ``.memd/`` (:mod:`memd.rewrite`); encrypted
   archives are decrypted in memory, filtered, and sealed under a **new** data
   key (all of the agent's ``.md.enc``, so the old key can be shredded);
   MEMORY.md's inode is hard-linked as ``.memd/drain.md`` and its entries up to
   a boundary filtered into ``MEMORY.md.new`` (owner and mode kept);
3. write the manifest, then the journal (phase ``erasing``): the commit point.
   A crash before it leaves every file as it was (recovery removes the temps);
   a crash after it is finished by the next process to take the lock;
4. rename the staged archives over the old ones (then the data key), replace
   MEMORY.md, drain what writers appended to the old inode meanwhile (as a
   compaction does), clean up.

Neither the journal, the manifest nor any log line holds the pattern or what
it matched; the temps hold only what is kept.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memd.agentdir import AgentDir
from memd.archive_crypto import (
    DataKey,
    agent_data_key,
    is_encrypted_name,
    new_data_key,
    open_archive,
    read_master_key,
    seal_archive,
    wrap_data_key,
)
from memd.compaction import (  # the transaction's own steps, shared with compaction
    ERASE_JOURNAL_VERSION,
    AuditSink,
    _drain,
    _finish,
    _Journal,
    _recover_locked,
    keep_owner,
)
from memd.core.erasure import Filtered, erase_matching
from memd.errors import CompactionAborted, MemdError, WorkspaceError, describe_error
from memd.fsutil import (
    AgentLock,
    create_file_at,
    iter_range,
    read_acl,
    read_to_end,
    set_acl,
    share_with_group,
)
from memd.rewrite import (
    ERASE_PHASE,
    STAGED_KEY,
    StagedFile,
    apply_staged,
    staged_name,
    write_manifest,
)
from memd.workspace import DRAIN_NAME, NEW_MEMORY_TEMP, AgentPaths, is_archive_name

# Named points between durable steps; the crash tests kill the process at each.
ERASE_CHECKPOINTS = (
    "locked",
    "archives-staged",
    "memory-staged",
    "journal-erasing",
    "archives-renamed",
    "replaced",
    "drained",
    "cleaned",
)

Checkpoint = Callable[[str], None]
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class EraseRefused(MemdError, RuntimeError):
    """The erasure cannot be complete (e.g. encrypted archives and no key): nothing changed."""

    exit_code = 6


@dataclass(frozen=True, slots=True)
class EraseOptions:
    lock_wait_s: float = 300.0
    drain_quiet_s: float = 1.0
    drain_max_s: float = 10.0
    drain_poll_s: float = 0.05
    # The master key file, needed when the agent has encrypted archives.
    key_file: Path | None = None
    # [privacy] encrypt_archives: a crashed compaction recovered first keeps its
    # old file as an encrypted archive, as the compaction itself would.
    encrypting: bool = False
    # The workspace's audit log: an earlier erasure a crash left, finished first
    # by recovery, is recorded there (None: not recorded).
    audit: AuditSink | None = None


@dataclass(slots=True)
class EraseOutcome:
    agent: str
    entries: int = 0
    summary_lines: int = 0
    pinned_lines: int = 0
    archives: int = 0  # archives rewritten (a match removed)
    resealed: int = 0  # encrypted archives sealed under the new data key
    memory: bool = False  # MEMORY.md rewritten

    @property
    def removed(self) -> int:
        return self.entries + self.summary_lines + self.pinned_lines

    @property
    def files(self) -> int:
        return self.archives + int(self.memory)

    def add(self, filtered: Filtered) -> None:
        self.entries += filtered.entries
        self.summary_lines += filtered.summary_lines
        self.pinned_lines += filtered.pinned_lines


def _no_checkpoint(_name: str) -> None:
    return None


@dataclass(slots=True)
class _Archive:
    name: str
    mode: int
    gid: int
    times_ns: tuple[int, int]  # atime, mtime: retention ages an archive by its mtime
    acl: bytes | None = None  # its POSIX access ACL, kept on the rewritten copy


class _Erase:
    def __init__(
        self,
        pinned: AgentDir,
        pattern: re.Pattern[str],
        options: EraseOptions,
        checkpoint: Checkpoint,
        *,
        dry_run: bool = False,
    ) -> None:
        self.pinned = pinned
        self.agent = pinned.paths.agent
        self.pattern = pattern
        # Count what would go, write nothing (``forget --match --dry-run``).
        self.dry_run = dry_run
        self.options = options
        self.checkpoint = checkpoint
        self.outcome = EraseOutcome(agent=self.agent)
        self.staged: list[StagedFile] = []
        self.key_ino = 0
        self.memory_ids: tuple[int, int, int, int] | None = None  # old dev/ino, new dev/ino
        self.copied_to = 0
        self.staged_from = b""  # MEMORY.md's bytes as staged (0..copied_to)
        self.new_fd = -1
        self.new_size = -1  # the staged copy's size (where memd's own bytes end)
        self.committed = False

    # -- staging ----------------------------------------------------------------
    def _stage(self, archive: _Archive, data: bytes) -> None:
        if self.dry_run:
            return
        temp = staged_name(len(self.staged))
        fd = create_file_at(self.pinned.private_fd, temp, [data])
        try:
            set_acl(fd, archive.acl)  # not .memd/'s default ACL, which the temp inherited
            share_with_group(fd, archive.mode, archive.gid if archive.gid != os.getegid() else None)
            # The rewritten archive keeps its age: an erasure must not make
            # retention keep it longer.
            os.utime(fd, ns=archive.times_ns)
            os.fsync(fd)
            ino = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        self.staged.append(StagedFile(archive.name, temp, ino))

    def _read_archive(self, archive_fd: int, name: str) -> tuple[_Archive, bytes] | None:
        try:
            fd = os.open(name, _READ, dir_fd=archive_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CompactionAborted(
                f"agent {self.agent!r}: archive {name}: {describe_error(exc)}; nothing changed"
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            archive = _Archive(
                name,
                stat.S_IMODE(st.st_mode),
                st.st_gid,
                (st.st_atime_ns, st.st_mtime_ns),
                read_acl(fd),
            )
            return archive, read_to_end(fd)
        finally:
            os.close(fd)

    def stage_archives(self) -> None:
        archive_fd, _created = self.pinned.archive_fd(create=False)
        if archive_fd < 0:
            return
        names = sorted(n for n in os.listdir(archive_fd) if is_archive_name(n))
        encrypted = [n for n in names if is_encrypted_name(n)]
        for name in names:
            if is_encrypted_name(name):
                continue
            found = self._read_archive(archive_fd, name)
            if found is None:
                continue
            archive, data = found
            filtered = erase_matching(data, self.pattern)
            if filtered.removed:
                self.outcome.add(filtered)
                self.outcome.archives += 1
                self._stage(archive, filtered.data)
        if encrypted:
            self._stage_encrypted(archive_fd, encrypted)

    def _keys(self, names: list[str]) -> tuple[DataKey, DataKey, bytes] | None:
        key_file = self.options.key_file
        if key_file is None:
            raise EraseRefused(
                f"agent {self.agent!r}: {len(names)} archive(s) are encrypted ({names[0]}…); "
                "set privacy.key_file (or MEMD_PRIVACY_KEY_FILE) so forget --match can decrypt, "
                "rewrite and re-encrypt them; nothing changed"
            )
        master = read_master_key(key_file)
        old = agent_data_key(self.pinned, master, create=False)
        if old is None:
            return None  # shredded already: nothing in them can be read by anyone
        new = new_data_key(self.agent)
        return old, new, wrap_data_key(new, master)

    def _stage_encrypted(self, archive_fd: int, names: list[str]) -> None:
        """Filter each encrypted archive; when any held a match, every one is sealed
        under a new data key and the old key is shredded at the commit."""
        keys = self._keys(names)
        if keys is None:
            return
        old, new, wrapped = keys
        unchanged: list[str] = []
        for name in names:
            found = self._read_archive(archive_fd, name)
            if found is None:
                continue
            archive, blob = found
            filtered = erase_matching(open_archive(old, name, blob), self.pattern)
            if not filtered.removed:
                unchanged.append(name)
                continue
            self.outcome.add(filtered)
            self.outcome.archives += 1
            self.outcome.resealed += 1
            self._stage(archive, seal_archive(new, name, filtered.data))
        if not self.outcome.resealed:
            return  # no match in any encrypted archive: the old key keeps nothing erased
        if self.dry_run:
            self.outcome.resealed += len(unchanged)
            return
        for name in unchanged:
            found = self._read_archive(archive_fd, name)
            if found is None:
                continue
            archive, blob = found
            self._stage(archive, seal_archive(new, name, open_archive(old, name, blob)))
            self.outcome.resealed += 1
        fd = create_file_at(self.pinned.private_fd, STAGED_KEY, [wrapped])
        try:
            self.key_ino = os.fstat(fd).st_ino
        finally:
            os.close(fd)

    def preview_memory(self) -> None:
        """What :meth:`stage_memory` would take out of MEMORY.md, read only."""
        try:
            fd = self.pinned.open_memory(os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            filtered = erase_matching(read_to_end(fd), self.pattern)
        finally:
            os.close(fd)
        if filtered.removed:
            self.outcome.add(filtered)
            self.outcome.memory = True

    def stage_memory(self) -> None:
        pinned = self.pinned
        pinned.unlink_private(DRAIN_NAME)
        current = pinned.stat_memory()
        if current is None:
            return
        if not stat.S_ISREG(current.st_mode):
            raise CompactionAborted(
                f"agent {self.agent!r}: MEMORY.md is not a regular file; nothing changed"
            )
        # The old inode stays reachable: writers may append to it until the
        # replace, and the drain moves what they wrote to the new file.
        os.link(
            pinned.memory_name,
            DRAIN_NAME,
            src_dir_fd=pinned.memory_dir_fd,
            dst_dir_fd=pinned.private_fd,
            follow_symlinks=False,
        )
        fd = pinned.open_private(DRAIN_NAME, os.O_RDONLY)
        try:
            old = os.fstat(fd)
            old_acl = read_acl(fd)
            data = read_to_end(fd)
        finally:
            os.close(fd)
        # The whole file, the unterminated tail included (a torn last entry, or
        # one being written): its matching lines go too. A writer still writing
        # that entry appends the rest to the old inode, which the drain moves.
        filtered = erase_matching(data, self.pattern)
        if not filtered.removed:
            pinned.unlink_private(DRAIN_NAME)
            return
        self.outcome.add(filtered)
        self.outcome.memory = True
        self.new_fd = create_file_at(
            pinned.private_fd,
            NEW_MEMORY_TEMP,
            [filtered.data],
            mode=stat.S_IMODE(old.st_mode),
        )
        keep_owner(self.new_fd, old.st_mode, old.st_uid, old.st_gid, self.agent, old_acl)
        new = os.fstat(self.new_fd)
        self.new_size = new.st_size
        self.memory_ids = (old.st_dev, old.st_ino, new.st_dev, new.st_ino)
        self.copied_to = len(data)
        self.staged_from = data

    def memory_unchanged(self) -> bool:
        """Whether the old MEMORY.md (through the drain link: its inode, whatever an
        agent did to the name) still holds the bytes the staged copy was filtered
        from. A rewrite in place (an editor, an agent's open("w")) since staging
        would otherwise be replaced by the filtered old content: its turns lost."""
        try:
            fd = self.pinned.open_private(DRAIN_NAME, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            length = len(self.staged_from)
            old_dev, old_ino, _new_dev, _new_ino = self.memory_ids or (-1, -1, -1, -1)
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (old_dev, old_ino) or st.st_size < length:
                return False
            offset = 0
            for chunk in iter_range(fd, 0, length):
                if not self.staged_from.startswith(chunk, offset):
                    return False
                offset += len(chunk)
            # Looked at again: a truncate while the compare ran.
            return offset == length and os.fstat(fd).st_size >= length
        finally:
            os.close(fd)

    # -- commit -----------------------------------------------------------------
    def commit(self, journal: _Journal) -> None:
        pinned = self.pinned
        if self.memory_ids is not None and not self.memory_unchanged():
            raise CompactionAborted(
                f"agent {self.agent!r}: MEMORY.md was rewritten in place while the erasure "
                "was staged; nothing changed (run forget --match again)"
            )
        manifest_sha = write_manifest(pinned, self.staged, self.key_ino)
        fields: dict[str, object] = {
            "phase": ERASE_PHASE,
            "erase": True,
            "agent": self.agent,
            "manifest_sha256": manifest_sha,
            "started_at": time.time(),
        }
        if self.memory_ids is not None:
            old_dev, old_ino, new_dev, new_ino = self.memory_ids
            fields.update(
                old_dev=old_dev,
                old_ino=old_ino,
                new_dev=new_dev,
                new_ino=new_ino,
                copied_to=self.copied_to,
            )
        journal.write(**fields)
        self.committed = True  # from here on, recovery finishes it
        self.checkpoint("journal-erasing")
        apply_staged(pinned)
        self.checkpoint("archives-renamed")
        if self.memory_ids is None:
            return
        # Checked again right before the replace (the archive renames took time).
        # What remains: a rewrite landing after this compare read the bytes it
        # changes and before the rename (microseconds per MiB, then one system
        # call) is not seen; a rename cannot be made conditional on content.
        if not self.memory_unchanged():
            # Committed (the archives are rewritten), but this MEMORY.md is not
            # the one the staged copy was made from: it stays as the agent left
            # it, nothing of it lost, its matches not erased.
            journal.write(new_dev=None, new_ino=None)
            self.memory_ids = None
            self.outcome.memory = False
            _finish(pinned, _no_checkpoint)
            raise CompactionAborted(
                f"agent {self.agent!r}: MEMORY.md was rewritten in place during the erasure: "
                "the archives are erased, MEMORY.md is left as rewritten (run forget --match "
                "again to erase it there)"
            )
        os.replace(
            NEW_MEMORY_TEMP,
            pinned.memory_name,
            src_dir_fd=pinned.private_fd,
            dst_dir_fd=pinned.memory_dir_fd,
        )
        os.fsync(pinned.memory_dir_fd)
        self.checkpoint("replaced")
        opts = self.options
        _drain(
            pinned,
            journal,
            self.new_fd,
            self.copied_to,
            opts.drain_quiet_s,
            opts.drain_max_s,
            opts.drain_poll_s,
            self.checkpoint,
            own_end=self.new_size,
        )

    def close(self) -> None:
        if self.new_fd >= 0:
            os.close(self.new_fd)
            self.new_fd = -1


def erase_by_pattern(
    paths: AgentPaths,
    pattern: re.Pattern[str],
    options: EraseOptions | None = None,
    *,
    checkpoint: Checkpoint | None = None,
) -> EraseOutcome:
    """Remove what ``pattern`` matches from MEMORY.md and every archive of the agent.

    Raises LockTimeout, EraseRefused or CompactionAborted; in each case before
    the commit, every file is as it was. The caller re-indexes a committed
    erasure (``outcome.removed``) once this returned: it calls no one back.
    """
    opts = options or EraseOptions()
    hook = checkpoint or _no_checkpoint
    try:
        pinned = AgentDir.open(paths)
    except WorkspaceError as exc:
        raise CompactionAborted(str(exc)) from None
    try:
        with pinned:
            lock = AgentLock(paths.lock, paths.agent, dir_fd=pinned.private_fd)
            with lock.held(opts.lock_wait_s):
                hook("locked")
                return _erase_locked(pinned, pattern, opts, hook)
    except MemdError:
        raise
    except OSError as exc:
        raise CompactionAborted(f"agent {paths.agent!r}: {describe_error(exc)}") from exc


def preview_erase(
    paths: AgentPaths, pattern: re.Pattern[str], key_file: Path | None = None
) -> EraseOutcome:
    """What :func:`erase_by_pattern` would remove now, counted the same way, with
    nothing written, created or locked (``memd forget AGENT --match R --dry-run``).
    Encrypted archives are searched with ``key_file`` (EraseRefused without it,
    as the erasure itself is)."""
    try:
        pinned = AgentDir.open(paths, create_private=False)
    except WorkspaceError as exc:
        raise CompactionAborted(str(exc)) from None
    with pinned:
        pinned.pin_memory()
        txn = _Erase(pinned, pattern, EraseOptions(key_file=key_file), _no_checkpoint, dry_run=True)
        txn.stage_archives()
        txn.preview_memory()
        return txn.outcome


def _erase_locked(
    pinned: AgentDir, pattern: re.Pattern[str], opts: EraseOptions, hook: Checkpoint
) -> EraseOutcome:
    pinned.pin_memory()
    _recover_locked(
        pinned,
        quiet_s=opts.drain_quiet_s,
        max_s=opts.drain_max_s,
        key_file=opts.key_file if opts.encrypting else None,
        audit=opts.audit,
    )
    txn = _Erase(pinned, pattern, opts, hook)
    journal = _Journal(pinned, version=ERASE_JOURNAL_VERSION)
    try:
        txn.stage_archives()
        hook("archives-staged")
        txn.stage_memory()
        hook("memory-staged")
        if txn.outcome.removed:
            txn.commit(journal)
        _finish(pinned, hook)
    except BaseException as exc:
        if not txn.committed:
            # Nothing outside .memd/ was touched: drop the staging.
            _finish(pinned, _no_checkpoint)
            raise
        if isinstance(exc, OSError):
            raise CompactionAborted(
                f"agent {pinned.paths.agent!r}: the erasure is committed but did not finish "
                f"({describe_error(exc)}); the next memd run on this agent (or this command "
                "again) finishes it"
            ) from exc
        raise
    finally:
        txn.close()
    return txn.outcome


__all__ = [
    "ERASE_CHECKPOINTS",
    "EraseOptions",
    "EraseOutcome",
    "EraseRefused",
    "erase_by_pattern",
    "preview_erase",
]
