"""What follows a committed compaction, handed forward by the runner.

The transaction calls no one: it returns the archive it committed and what
retention pruned right after (:class:`~memd.compaction.CompactionOutcome`),
and the runner, once the transaction has returned and the agent's lock is let
go, hands that outcome here: the new archive is indexed for recall (with the
re-seeded MEMORY.md), the agent's archive figures are surveyed, and archives
retention deleted are logged and dropped from recall (then surveyed again).

Outside the agent's lock on purpose: a compaction's lock is held for the
transaction only. The recall index keeps itself right without it: rows read
from a file are written only if the file is still the one read, and taken back
if it changed before they were committed (a prune, ``forget --match`` or
``forget`` in between); ``forget`` erases the agent's rows after its files.
"""

from __future__ import annotations

import contextlib

from memd.compaction import CompactionOutcome
from memd.daemon.archives import ArchiveSurvey
from memd.daemon.recall import RecallStage
from memd.daemon.retention import RetentionService
from memd.workspace import AgentPaths


class AfterCommit:
    def __init__(
        self, recall: RecallStage, archives: ArchiveSurvey, retention: RetentionService
    ) -> None:
        self._recall = recall
        self._archives = archives
        self._retention = retention

    def committed(self, paths: AgentPaths, outcome: CompactionOutcome) -> None:
        """The compaction is committed whatever happens here: each step reports its
        own failures, and one failing does not keep the next from running."""
        with contextlib.suppress(Exception):
            self._recall.index_archive(paths, outcome.archive)
        with contextlib.suppress(Exception):
            self._archives.archived(paths)
        pruned = outcome.pruned
        if pruned is not None and pruned.deleted:
            with contextlib.suppress(Exception):
                # The compaction's audit record names the prune (record_compaction).
                self._retention.pruned(paths, pruned, "compaction", audit=False)


__all__ = ["AfterCommit"]
