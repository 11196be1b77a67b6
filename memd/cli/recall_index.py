"""The recall index as CLI commands open it (recall, compact-now, forget), and what
``compact-now`` and ``prune`` hand it once their transaction has returned (the
agent's lock let go: the index re-checks each file it read, see
:meth:`memd.recall.index.RecallIndex.index_file`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from memd.cli.common import state_dir_of
from memd.errors import MemdError
from memd.fsutil import as_owner_of
from memd.recall.index import RecallIndex, delete_corrupt_copies
from memd.settings import LoadedConfig
from memd.workspace import AgentPaths

if TYPE_CHECKING:
    from memd.audit import AuditLog
    from memd.retention import PruneResult

# An archive a compaction committed → the recall index.
ArchiveIndexer = Callable[[AgentPaths, Path], None]
# What a prune deleted → the audit log, the recall index.
PruneFollowUp = Callable[[AgentPaths, "PruneResult"], None]


def open_recall_index(loaded: LoadedConfig, state_dir: Path | None) -> RecallIndex:
    """The workspace's recall index; its notes (a rebuilt index...) go to stderr."""
    directory = state_dir_of(loaded, state_dir)
    with as_owner_of(directory):  # a root CLI leaves no root-owned file there
        index = RecallIndex.open(directory, loaded.workspace)
    index.encrypting = loaded.config.privacy.encrypt_archives
    for note in index.notes:
        print(f"memd: warning: {note}", file=sys.stderr)
    return index


def archive_indexer(loaded: LoadedConfig, state_dir: Path | None) -> ArchiveIndexer:
    """What ``compact-now`` does with each archive it committed: index it."""
    directory = state_dir_of(loaded, state_dir)

    def index_archive(paths: AgentPaths, archive: Path) -> None:
        try:
            with as_owner_of(directory):
                index = RecallIndex.open(directory, loaded.workspace)
            index.encrypting = loaded.config.privacy.encrypt_archives
            with index:
                index.sync_agent(paths)
        except (MemdError, OSError) as exc:
            print(
                f"memd: warning: agent {paths.agent!r}: archive {archive.name} not indexed yet "
                f"({exc}); the next `memd recall` or daemon start indexes it",
                file=sys.stderr,
            )

    return index_archive


def archive_pruner(loaded: LoadedConfig, state_dir: Path | None) -> PruneFollowUp:
    """What ``prune`` and ``compact-now`` do after retention deleted archives: drop
    their rows from the recall index and scrub them from its file."""
    directory = state_dir_of(loaded, state_dir)

    def drop_pruned(paths: AgentPaths, pruned: PruneResult) -> None:
        try:
            with as_owner_of(directory):
                index = RecallIndex.open(directory, loaded.workspace)
                with index:
                    index.sync_agent(paths, live=False)  # scrubs the rows it dropped
                # A copy moved aside as corrupt still holds the pruned archives' text.
                copies_kept = delete_corrupt_copies(index.path)[1] if index.path else []
                for note in copies_kept:
                    print(f"memd: warning: {note}", file=sys.stderr)
        except (MemdError, OSError) as exc:
            print(
                f"memd: warning: agent {paths.agent!r}: {len(pruned.deleted)} pruned archive(s) "
                f"still in the recall index ({exc}); the next `memd recall` or daemon start "
                "drops them",
                file=sys.stderr,
            )

    return drop_pruned


def prune_follow_up(
    loaded: LoadedConfig, state_dir: Path | None, audit: AuditLog | None, trigger: str
) -> PruneFollowUp:
    """What a CLI does after a prune deleted archives: audit it (unless ``audit`` is
    None: compact-now records it after the compaction's own record), drop them
    from recall."""
    from memd.audit import record_prune

    drop_from_index = archive_pruner(loaded, state_dir)

    def after_prune(paths: AgentPaths, pruned: PruneResult) -> None:
        if audit is not None:
            record_prune(audit, pruned, trigger=trigger)
        drop_from_index(paths, pruned)

    return after_prune


__all__ = [
    "ArchiveIndexer",
    "PruneFollowUp",
    "archive_indexer",
    "archive_pruner",
    "open_recall_index",
    "prune_follow_up",
]
