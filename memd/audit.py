"""The audit log file: one per workspace, in memd's state dir, append-only.

``<state_dir>/<workspace digest>.audit.jsonl`` (the digest is the state DB's,
so both sit side by side), mode 0600. Records come from
:mod:`memd.core.audit` (content-free by construction). Each one is appended
with a single ``write()`` on a descriptor opened ``O_APPEND``: the kernel
places every write at the end of the file in one piece, so the daemon and a
CLI appending at the same moment never interleave their lines; a record is
fsynced before :meth:`AuditLog.record` returns (records are rare: one per
compaction, prune, erasure or reload). The log is never rewritten: not by
``forget`` (it is what says an erasure happened), not by retention.

A failure to write the audit line is logged and does not undo or stop the
operation it describes: the operation already happened.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import secrets
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from memd.core.audit import (
    MAX_WORDS,
    AuditContents,
    AuditEvent,
    as_word,
    encode,
    make_record,
    parse_log,
)
from memd.core.privacy import is_local_summarizer
from memd.errors import MemdError, NotARegularFile, describe_error
from memd.fsutil import ensure_private_dir, iter_range
from memd.logs import get_logger
from memd.state import state_db_path

if TYPE_CHECKING:
    from memd.compaction import CompactionOutcome
    from memd.retention import PruneResult

AUDIT_SUFFIX = ".audit.jsonl"
AUDIT_KEY_SUFFIX = ".audit.key"
_KEY_BYTES = 32
PROVIDED_MODEL = "provided"  # compact-now --summary: the operator's text, no model call
_log = get_logger("memd.audit")


def audit_path(state_dir: Path, workspace: Path) -> Path:
    return state_db_path(state_dir, workspace).with_suffix(AUDIT_SUFFIX)


class AuditLog:
    """Appends records for one workspace; ``path`` None means auditing is off (no state dir)."""

    def __init__(
        self,
        path: Path | None,
        actor: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.actor = actor
        self._clock = clock
        # Why the last record() could not be written (None: it was, or no log).
        self.last_error: str | None = None

    @classmethod
    def for_workspace(cls, state_dir: Path | None, workspace: Path, actor: str) -> AuditLog:
        return cls(audit_path(state_dir, workspace) if state_dir is not None else None, actor)

    def record(self, event: AuditEvent | str, agent: str | None = None, **fields: object) -> bool:
        """Append one record; False (and a warning logged) when it could not be written.

        A field that is not an audit field, or a value that is not a count, a
        flag, a digest or a short word, raises ValueError before anything is
        written (see :mod:`memd.core.audit`).
        """
        record = make_record(
            event,
            ts=self._clock(),
            actor=self.actor,
            pid=os.getpid(),
            uid=os.getuid(),
            agent=agent,
            fields=fields,
        )
        line = encode(record)
        self.last_error = None
        if self.path is None:
            return False
        try:
            append_line(self.path, line)
        except OSError as exc:
            self.last_error = describe_error(exc, with_file=False)
            _log.warning(
                "cannot write the audit log",
                audit_event=record.event,
                agent=agent,
                error=describe_error(exc),
            )
            return False
        return True

    def keyed_hash(self, text: str) -> str:
        """A keyed digest of ``text`` (HMAC-SHA256 with this workspace's audit key).

        For a record that must show two operations used the same input (an
        erase-by-pattern's pattern) without the input being recoverable from
        the log: the key stays in the state dir (0600), never in the log.
        """
        key = self._key()
        return hmac.new(key, text.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()[
            :16
        ]

    def _key(self) -> bytes:
        if self.path is None:
            raise OSError(errno.ENOENT, "no state dir: auditing is off")
        key_path = self.path.with_name(self.path.name.removesuffix(AUDIT_SUFFIX) + AUDIT_KEY_SUFFIX)
        _ensure_private_dir(key_path.parent)
        try:
            fd = os.open(
                key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except FileExistsError:
            return _read_key(key_path)
        try:
            _give_to_state_dir_owner(fd, key_path.parent)
            os.write(fd, secrets.token_bytes(_KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        return _read_key(key_path)


def summarizer_is_remote(model: str, api_base: str, local_hosts: Sequence[str] = ()) -> bool:
    """Whether a summary made by ``model`` left the machine (the redaction rule's
    locality, :func:`memd.core.privacy.is_local_summarizer`); ``--summary`` text never does."""
    if model.strip().lower() == PROVIDED_MODEL:
        return False
    from memd.llm import litellm_provider

    return not is_local_summarizer(model, api_base, local_hosts, litellm_provider)


def record_compaction(
    audit: AuditLog,
    agent: str,
    outcome: CompactionOutcome,
    *,
    trigger: str,
    api_base: str,
    local_hosts: Sequence[str] = (),
) -> bool:
    """The audit line for a committed compaction (never the summary or its input),
    then the one for the retention pass that followed it, if it deleted archives."""
    written = audit.record(
        AuditEvent.COMPACTION,
        agent,
        trigger=trigger,
        model=as_word(outcome.model),
        remote=summarizer_is_remote(outcome.model, api_base, local_hosts),
        redactions=outcome.redacted,
        reply_redactions=outcome.reply_redacted,
        tokens_before=outcome.tokens_before,
        tokens_after=outcome.tokens_after,
        archive=outcome.archive.name,
        calls=outcome.calls,
        partial=outcome.partial,
    )
    pruned = outcome.pruned
    if pruned is not None and pruned.deleted:
        written = record_prune(audit, pruned, trigger="compaction") and written
    return written


def record_prune(audit: AuditLog, pruned: PruneResult, *, trigger: str) -> bool:
    """The audit line for archives a retention policy deleted (names and sizes only)."""
    return audit.record(
        AuditEvent.PRUNE,
        pruned.agent,
        trigger=trigger,
        archives=len(pruned.deleted),
        bytes=pruned.deleted_bytes,
        reasons=list(pruned.plan.all_reasons()),
        # At most the 64 oldest names (a first prune of a years-old folder says how many).
        names=list(pruned.deleted[:MAX_WORDS]),
        kept=pruned.kept,
        dry_run=pruned.dry_run,
    )


def _read_key(key_path: Path) -> bytes:
    # A key being written by another process right now: its 32 bytes land in
    # one write, so a short read means "not yet"; wait for it briefly.
    for _ in range(100):
        fd = os.open(key_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            key = os.read(fd, _KEY_BYTES + 1)
        finally:
            os.close(fd)
        if len(key) == _KEY_BYTES:
            return key
        time.sleep(0.01)
    raise OSError(errno.EIO, "audit key file is not 32 bytes", str(key_path))


def append_line(path: Path, line: bytes) -> None:
    """Append ``line`` in one ``write()`` (O_APPEND), fsync; create the file 0600."""
    _ensure_private_dir(path.parent)
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    created = False
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        created = True
    except FileExistsError:
        fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(errno.EINVAL, "not a regular file", str(path))
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
        if created:
            _give_to_state_dir_owner(fd, path.parent)
        written = os.write(fd, line)
        if written != len(line):
            # Only ENOSPC-like conditions do this on a regular file; the torn
            # line is counted as unreadable by readers, never misread.
            raise OSError(
                errno.ENOSPC, f"short write to the audit log ({written} bytes)", str(path)
            )
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        _fsync_dir(path.parent)


def _give_to_state_dir_owner(fd: int, directory: Path) -> None:
    # A root CLI creating the log in the daemon's state dir: the daemon's user
    # must still be able to append to it.
    if os.geteuid() != 0:
        return
    with contextlib.suppress(OSError):
        owner = os.stat(directory)
        if owner.st_uid != 0:
            os.fchown(fd, owner.st_uid, owner.st_gid)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _ensure_private_dir(directory: Path) -> None:
    ensure_private_dir(directory)  # refused when another uid owns it or may write in it


def read_audit(path: Path) -> AuditContents:
    """Every record in the log (none when it does not exist yet).

    A log that cannot be read (a state dir that is a file, or one this user
    may not enter: memd's is 0700) is a MemdError, one line for the operator.
    """
    return parse_log(_read_log(path, 0)[0])


def read_audit_from(path: Path, offset: int) -> tuple[AuditContents, int]:
    """The records appended past ``offset`` and where the next read starts: the
    end of the last whole line (a line being written is read next time). A log
    shorter than ``offset`` (replaced) is read from its start; a missing one has
    no records. The same errors as :func:`read_audit`."""
    data, start = _read_log(path, offset)
    whole = data[: data.rfind(b"\n") + 1]
    return parse_log(whole), start + len(whole)


def _read_log(path: Path, offset: int) -> tuple[bytes, int]:
    """The log's bytes from ``offset`` (from 0 when it is shorter), and that start."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return b"", 0
    except OSError as exc:
        raise MemdError(f"audit log {path}: {describe_error(exc, with_file=False)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(errno.EINVAL, "not a regular file", str(path))
        start = offset if 0 < offset <= info.st_size else 0
        try:
            return b"".join(iter_range(fd, start)), start
        except OSError as exc:
            raise MemdError(f"audit log {path}: {describe_error(exc, with_file=False)}") from None
    finally:
        os.close(fd)


__all__ = [
    "AUDIT_SUFFIX",
    "AuditLog",
    "append_line",
    "audit_path",
    "read_audit",
    "read_audit_from",
    "record_compaction",
    "record_prune",
    "summarizer_is_remote",
]
