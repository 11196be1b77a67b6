"""``memd forget AGENT --yes``: erase an agent's memory, archives and memd state.

What goes: ``MEMORY.md``, ``archive/`` (every snapshot), everything under
``.memd/`` (journal, drain link, temp files), the agent's rows in the state
DB (counts, ledger, cached counts) and in the recall index, with no copy left
in either DB's free pages or WAL (``secure_delete``, VACUUM, a TRUNCATE
checkpoint), and the agent's rows in the ``*.corrupt-<ts>`` copies of the state
DB (a copy that cannot be cleaned is deleted; so are the recall index's, which
are derived data).

A tombstone (a salted hash of the name, not the name) stays in the state DB:
a running daemon honours it, writing no row, ledger line or metric for the
agent, until a MEMORY.md created after the erasure appears
(:mod:`memd.core.erasure`).

The archive data key (``.memd/archive.key``, encrypted archives) is overwritten
and removed first: crypto-shredding, so a copy of an encrypted archive that
survives anywhere stays unreadable.

What stays, on purpose:

* the agent folder itself: a running agent may append again at any moment,
  and Swarms expects its folder to exist;
* ``.memd/lock`` (an empty file): compactors ``flock`` it and never expect it
  to be renamed or removed. Unlinking it while a compactor waits on it would
  let that compactor and the next one lock two different inodes and run at
  the same time.

The whole erase runs under the agent's compaction lock, so it never races a
compaction by the daemon or ``compact-now`` (it waits for one in flight).
Symlinks are never followed out of the workspace (``agent_paths`` refuses
them); a symlink inside it is removed as a link, its target left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from memd.agentdir import AgentDir
from memd.archive_crypto import destroy_data_key
from memd.audit import AuditLog
from memd.cli.common import load, open_audit, open_state, read_private_text, state_dir_of
from memd.cli.options import ConfigOption, StateDirOption, WorkspaceOption
from memd.cli.recall_index import open_recall_index
from memd.core.audit import AuditEvent
from memd.core.erasure import compile_pattern
from memd.erasure import EraseOptions, EraseOutcome, erase_by_pattern, preview_erase
from memd.errors import LockTimeout, MemdError, UnknownAgent, WorkspaceError, describe_error
from memd.fsutil import AgentLock, as_owner_of
from memd.recall.index import RecallIndex, delete_corrupt_copies
from memd.settings import LoadedConfig
from memd.state import StateError, StateStore, erase_from_corrupt_copies
from memd.workspace import MEMORY_FILE, AgentPaths, agent_paths, require_workspace


class ConfirmationRequired(MemdError, ValueError):
    """A destructive command was run without ``--yes``."""

    exit_code = 2


@dataclass
class ForgetReport:
    agent: str
    memory_removed: bool = False
    archives_removed: int = 0
    private_entries_removed: int = 0
    state_rows_removed: int = 0
    recall_rows_removed: int = 0
    data_key_destroyed: bool = False
    corrupt_copies_cleaned: int = 0
    corrupt_copies_deleted: int = 0
    bytes_removed: int = 0  # of MEMORY.md and the archives
    tombstone: bool = False  # the state DB now keeps a running daemon from writing it back
    # The erased MEMORY.md's inode when other hard links keep it alive.
    survivor: tuple[int, int] = (0, 0)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = []
        if self.memory_removed:
            parts.append("MEMORY.md")
        parts.append(f"{self.archives_removed} archive(s)")
        parts.append(f"{self.private_entries_removed} private file(s)")
        parts.append(f"{self.state_rows_removed} state row(s)")
        parts.append(f"{self.recall_rows_removed} recall index row(s)")
        if self.data_key_destroyed:
            parts.append("the archive data key (encrypted archives shredded)")
        if self.corrupt_copies_cleaned or self.corrupt_copies_deleted:
            parts.append(
                f"corrupt DB copies: {self.corrupt_copies_cleaned} cleaned, "
                f"{self.corrupt_copies_deleted} deleted"
            )
        return f"forgot agent {self.agent!r}: removed " + ", ".join(parts)


def _remove_path(path: Path) -> int:
    """Remove a file, a link (not its target) or a whole tree; returns files removed."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink()
            return 1
    except FileNotFoundError:
        return 0
    count = sum(len(files) for _, _, files in os.walk(path))
    # rmtree uses fd-based traversal on Linux: symlinks inside are unlinked, never followed.
    shutil.rmtree(path)
    return count


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _shred_data_key(paths: AgentPaths, report: ForgetReport) -> None:
    """Destroy the agent's archive data key first: every encrypted archive of the
    agent is unreadable from then on, even a copy whose blocks survive the unlink."""
    if not paths.private_dir.is_dir() or paths.private_dir.is_symlink():
        return
    try:
        with AgentDir.open(paths, create_private=False) as pinned:
            if pinned.private_fd >= 0:
                report.data_key_destroyed = destroy_data_key(pinned.private_fd)
    except (OSError, MemdError) as exc:
        report.notes.append(f"archive data key not overwritten: {describe_error(exc)}")


def _remove_memory(paths: AgentPaths, report: ForgetReport) -> None:
    """Unlink MEMORY.md, and the file it links to when it is a symlink (the link is
    followed only inside the agent's own folder): that file is the agent's memory."""
    with AgentDir.open(paths, create_private=False) as pinned:
        pinned.pin_memory()
        target = pinned.stat_memory()
        if target is not None and stat.S_ISREG(target.st_mode):
            report.bytes_removed += target.st_size
            if target.st_nlink > 1:
                report.survivor = (target.st_dev, target.st_ino)
        if (pinned.memory_dir_fd, pinned.memory_name) != (pinned.dir_fd, MEMORY_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pinned.memory_name, dir_fd=pinned.memory_dir_fd)
                report.memory_removed = True
    if _remove_path(paths.memory) > 0:
        report.memory_removed = True


def erase_agent_files(paths: AgentPaths) -> ForgetReport:
    """Delete the agent's memory, archives and private files. Caller holds the lock."""
    report = ForgetReport(agent=paths.agent)
    _shred_data_key(paths, report)
    _remove_memory(paths, report)
    if paths.archive_dir.is_symlink():
        _remove_path(paths.archive_dir)
    elif paths.archive_dir.exists():
        report.bytes_removed += _tree_bytes(paths.archive_dir)
        report.archives_removed = _remove_path(paths.archive_dir)
    if paths.private_dir.is_dir() and not paths.private_dir.is_symlink():
        for entry in paths.private_dir.iterdir():
            if entry.name != paths.lock.name:
                report.private_entries_removed += _remove_path(entry)
    return report


def erased_at_ns(paths: AgentPaths) -> int:
    """When the erasure's unlinks were done, by the file system's clock (the ctime
    of the folders they changed); see :mod:`memd.core.erasure`."""
    stamps = [time.time_ns()] if not paths.dir.is_dir() else []
    for folder in (paths.dir, paths.private_dir):
        with contextlib.suppress(OSError):
            stamps.append(os.stat(folder).st_ctime_ns)
    return max(stamps) if stamps else time.time_ns()


def _forget_state(report: ForgetReport, store: StateStore, paths: AgentPaths) -> None:
    try:
        report.state_rows_removed = store.forget_agent(
            report.agent, erased_at_ns=erased_at_ns(paths), survivor=report.survivor
        )
        report.tombstone = store.path is not None
    except StateError as exc:
        report.notes.append(f"state DB not cleaned: {exc}")


def forget_corrupt_copies(
    report: ForgetReport, state_db: Path | None, recall_db: Path | None
) -> None:
    """The agent's rows in the corrupt copies of the state DB (cleaned, or the copy
    deleted) and the recall index's corrupt copies (derived data: deleted)."""
    if state_db is not None:
        try:
            cleaned, deleted = erase_from_corrupt_copies(state_db, report.agent)
        except OSError as exc:
            report.notes.append(f"corrupt copies of the state DB not cleaned: {exc}")
        else:
            report.corrupt_copies_cleaned += cleaned
            report.corrupt_copies_deleted += deleted
    if recall_db is None:
        return
    deleted, notes = delete_corrupt_copies(recall_db)
    report.corrupt_copies_deleted += deleted
    report.notes.extend(notes)


def _forget_recall(report: ForgetReport, recall: RecallIndex | None) -> None:
    if recall is None:
        return
    try:
        report.recall_rows_removed = recall.erase_agent(report.agent)
    except MemdError as exc:
        report.notes.append(f"recall index not cleaned: {exc}")


def forget(
    paths: AgentPaths,
    store: StateStore,
    wait_s: float,
    *,
    folder_exists: bool,
    recall: RecallIndex | None = None,
) -> ForgetReport:
    """Erase under the agent's compaction lock (waiting up to ``wait_s`` for a compaction)."""
    if not folder_exists:
        report = ForgetReport(agent=paths.agent)
        _forget_state(report, store, paths)
        _forget_recall(report, recall)
        return report
    with contextlib.ExitStack() as locked:
        try:
            # The lock file lives in .memd/: create the folder so the lock can be
            # taken even for an agent memd has never compacted. Either can fail
            # (.memd a file, a folder memd's user may not write, a read-only fs):
            # one line, and nothing was erased yet.
            # Pinned, as compaction takes it: the lock file is written (its holder's
            # record), so a .memd/ the agent swapped for a symlink must not lead it
            # to a file named "lock" elsewhere.
            pinned = locked.enter_context(AgentDir.open(paths))
            locked.enter_context(
                AgentLock(paths.lock, paths.agent, dir_fd=pinned.private_fd).held(wait_s)
            )
        except LockTimeout:  # says its own line (exit 4)
            raise
        except MemdError as exc:
            raise WorkspaceError(
                f"agent {paths.agent!r}: cannot take its lock: {exc}; nothing was erased"
            ) from None
        except OSError as exc:
            raise WorkspaceError(
                f"agent {paths.agent!r}: cannot take its lock: {describe_error(exc)}; "
                "nothing was erased"
            ) from None
        try:
            report = erase_agent_files(paths)
        except OSError as exc:
            raise WorkspaceError(
                f"agent {paths.agent!r}: erasure stopped: {describe_error(exc)}; run it again "
                "(what was removed stays removed)"
            ) from None
        _forget_state(report, store, paths)
        # Under the lock too: a compaction waiting for it would otherwise
        # index an archive of the agent between the two erasures.
        _forget_recall(report, recall)
    return report


def forget_command(
    agent: Annotated[str, typer.Argument(help="The agent to erase.", show_default=False)],
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Really erase (required: nothing is kept).")
    ] = False,
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            min=0,
            help="Seconds to wait for a compaction in flight (default: compaction.lock_wait_s).",
            show_default=False,
        ),
    ] = None,
    match: Annotated[
        str | None,
        typer.Option(
            "--match",
            help="Erase only the entries this regular expression matches (and the lines of "
            "summaries and pinned facts it matches), in MEMORY.md and every archive.",
            show_default=False,
        ),
    ] = None,
    match_file: Annotated[
        Path | None,
        typer.Option(
            "--match-file",
            help="--match's pattern read from this UTF-8 file (- reads stdin; one final "
            "newline dropped): what you erase stays off the command line, which ps shows "
            "every user.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="With --match: say what would be erased (entries, summary and pinned "
            "lines, files), erasing nothing (no --yes needed).",
        ),
    ] = False,
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """Erase an agent's MEMORY.md, archives and memd state (the folder stays); with
    --match, only what the pattern matches."""
    if match is not None and match_file is not None:
        raise typer.BadParameter("give --match or --match-file, not both")
    if match_file is not None:
        match = read_private_text(match_file, "pattern", "--match-file")
        match = match[:-1] if match.endswith("\n") else match
        match = match[:-1] if match.endswith("\r") else match
        if not match:
            raise typer.BadParameter("the pattern file is empty", param_hint="--match-file")
    loaded = load(workspace, config)
    require_workspace(loaded.workspace)
    paths = agent_paths(loaded.workspace, agent, must_exist=False)
    folder_exists = paths.dir.is_dir()
    if dry_run and match is None:
        raise ConfirmationRequired(
            "memd forget --dry-run goes with --match (without it everything is erased)"
        )
    if match is not None:
        pattern = compile_pattern(match)  # a bad one is refused before anything else
        if dry_run:
            if not folder_exists:
                raise UnknownAgent(f"unknown agent {agent!r}: no folder {paths.dir}")
            key_file = loaded.config.privacy.key_file
            # Reads only: no lock, nothing created, no audit record.
            outcome = preview_erase(
                paths, pattern, Path(key_file).expanduser() if key_file else None
            )
            print(describe_erase(outcome, dry_run=True))
            return
        if not yes:
            raise ConfirmationRequired(
                f"memd forget {agent} --match: rewrites its MEMORY.md and archives without the "
                "matching entries; add --yes to confirm"
            )
        if not folder_exists:
            raise UnknownAgent(f"unknown agent {agent!r}: no folder {paths.dir}")
        wait_s = loaded.config.compaction.lock_wait_s if wait is None else wait
        _forget_matching(loaded, state_dir, paths, match, pattern, wait_s)
        return
    if not yes:
        raise ConfirmationRequired(
            f"memd forget {agent}: erases its memory and every archive; add --yes to confirm"
        )
    wait_s = loaded.config.compaction.lock_wait_s if wait is None else wait
    with open_state(loaded, state_dir) as store:
        if not folder_exists and not _known_to_state(store, agent):
            raise UnknownAgent(f"unknown agent {agent!r}: no folder {paths.dir}")
        recall, recall_note = _open_recall(loaded, state_dir)
        directory = state_dir_of(loaded, state_dir)
        try:
            # A root CLI acts on the agent's files as memd (the state dir's owner)
            # does: the .memd/ it finds is memd's, and it leaves no root-owned file.
            with as_owner_of(directory):
                report = forget(paths, store, wait_s, folder_exists=folder_exists, recall=recall)
        finally:
            if recall is not None:
                recall.close()
        with as_owner_of(directory):  # a root CLI leaves no root-owned file there
            forget_corrupt_copies(report, store.path, recall.path if recall else None)
            audit_erasure(open_audit(loaded, state_dir), report)
        if recall_note:
            report.notes.append(recall_note)
    for note in report.notes:
        print(f"memd: warning: {note}", file=sys.stderr)
    print(report.summary())


def _forget_matching(
    loaded: LoadedConfig,
    state_dir: Path | None,
    paths: AgentPaths,
    match: str,
    pattern: re.Pattern[str],
    wait_s: float,
) -> None:
    recall, recall_note = _open_recall(loaded, state_dir)
    index_rows = 0
    notes = [recall_note] if recall_note else []

    def reindex(committed: AgentPaths) -> None:
        # The rewritten files are indexed afresh and the index file scrubbed, so
        # no matched text stays in its bytes. After the agent's lock is let go:
        # rows read from a file are written only while it is the file read (a
        # sync racing this one cannot write the erased text back).
        nonlocal index_rows
        if recall is None:
            return
        try:
            index_rows = recall.sync_agent(committed, scrub=False).entries
            recall.scrub()  # once, the rewritten files' old rows too
        except MemdError as exc:
            notes.append(f"recall index not cleaned: {exc}")

    compaction = loaded.config.compaction
    key_file = loaded.config.privacy.key_file
    audit = open_audit(loaded, state_dir)
    options = EraseOptions(
        lock_wait_s=wait_s,
        drain_quiet_s=compaction.drain_quiet_s,
        drain_max_s=compaction.drain_max_s,
        key_file=Path(key_file).expanduser() if key_file else None,
        encrypting=loaded.config.privacy.encrypt_archives,
        audit=audit,  # an earlier erasure a crash left, finished first
    )
    directory = state_dir_of(loaded, state_dir)
    try:
        with as_owner_of(directory):  # as memd, like `forget AGENT --yes`
            outcome = erase_by_pattern(paths, pattern, options)
            if outcome.removed:
                reindex(paths)
            if recall is not None and recall.path is not None:
                # A copy of the index moved aside as corrupt holds the matched text
                # (even of files already gone): derived data, deleted as `forget` does.
                notes.extend(delete_corrupt_copies(recall.path)[1])
    finally:
        if recall is not None:
            recall.close()
    with as_owner_of(directory):
        try:
            pattern_hash = audit.keyed_hash(match)
        except OSError:
            pattern_hash = None  # no state dir: auditing is off anyway
        audit.record(
            AuditEvent.ERASE_MATCH,
            paths.agent,
            entries=outcome.entries,
            files=outcome.files,
            archives=outcome.archives,
            summary_lines=outcome.summary_lines,
            pinned_lines=outcome.pinned_lines,
            index_rows=index_rows,
            pattern_hash=pattern_hash,
        )
    for note in notes:
        print(f"memd: warning: {note}", file=sys.stderr)
    print(describe_erase(outcome))


def describe_erase(outcome: EraseOutcome, *, dry_run: bool = False) -> str:
    if not outcome.removed:
        return f"agent {outcome.agent!r}: nothing matched; nothing changed"
    files = []
    if outcome.memory:
        files.append("MEMORY.md")
    files.append(f"{outcome.archives} archive(s)")
    erased, rewrote = ("would erase", "would rewrite") if dry_run else ("erased", "rewrote")
    text = (
        f"agent {outcome.agent!r}: {erased} {outcome.entries} matching entr"
        f"{'y' if outcome.entries == 1 else 'ies'}, {outcome.summary_lines} summary line(s) "
        f"and {outcome.pinned_lines} pinned fact line(s); {rewrote} " + " and ".join(files)
    )
    if outcome.resealed:
        text += (
            f"; {outcome.resealed} encrypted archive(s) "
            + ("would be " if dry_run else "")
            + "re-sealed under a new data key (the old key shredded)"
        )
    if dry_run:
        text += " (dry run: nothing changed)"
    return text


def audit_erasure(audit: AuditLog, report: ForgetReport) -> None:
    """The audit line: that the agent was erased and how much went (counts only)."""
    audit.record(
        AuditEvent.ERASURE,
        report.agent,
        files=int(report.memory_removed) + report.private_entries_removed,
        archives=report.archives_removed,
        bytes=report.bytes_removed,
        ledger_rows=report.state_rows_removed,
        index_rows=report.recall_rows_removed,
        shredded=report.data_key_destroyed,
        tombstone=report.tombstone,
    )


def _open_recall(
    loaded: LoadedConfig, state_dir: Path | None
) -> tuple[RecallIndex | None, str | None]:
    try:
        return open_recall_index(loaded, state_dir), None
    except MemdError as exc:
        return None, f"recall index not cleaned: {exc}"


def _known_to_state(store: StateStore, agent: str) -> bool:
    return store.get_agent(agent) is not None or bool(store.history(agent, limit=1))


__all__ = [
    "ConfirmationRequired",
    "ForgetReport",
    "audit_erasure",
    "erase_agent_files",
    "erased_at_ns",
    "forget",
    "forget_command",
    "forget_corrupt_copies",
]
