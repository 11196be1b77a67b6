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
import threading
from typing import TYPE_CHECKING

from memd.compaction import CompactionOutcome
from memd.daemon.archives import ArchiveSurvey
from memd.daemon.recall import RecallStage
from memd.daemon.retention import RetentionService
from memd.errors import describe_error
from memd.logs import get_logger
from memd.workspace import AgentPaths

if TYPE_CHECKING:
    from memd.state import LedgerMark, StateStore

_log = get_logger("memd.daemon")


class Replacements:
    """memd's own replacements of agents' MEMORY.md (a compaction's commit), put
    here as the kernel queues a rename: the watch stage, the source of file
    events, takes them (with ``--poll`` its poller checks each agent's path on
    its next pass: the file it held is the old one). A put calls no one."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._agents: dict[str, None] = {}

    def put(self, agent: str) -> None:
        with self._changed:
            self._agents[agent] = None
            self._changed.notify_all()

    def take(self, stop: threading.Event, timeout: float | None = None) -> list[str]:
        """The agents put since the last take, once there are any (or ``stop`` is
        set and :meth:`wake` called, or after ``timeout``)."""
        with self._changed:
            self._changed.wait_for(lambda: bool(self._agents) or stop.is_set(), timeout)
            agents = list(self._agents)
            self._agents.clear()
            return agents

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()


class OtherCompactions:
    """Compactions another process committed beside the daemon (``memd compact-now``),
    as the state DB's ledger records them: their agents' MEMORY.md was replaced
    under the poller, which holds the old file open and would see the new one only
    in the file's turn (:data:`memd.poller.VERIFY_S`). :meth:`take`, called each
    poll interval, hands them on like memd's own replacements: the next pass checks
    their paths. A ``compact-now`` that could not open the state DB writes no
    ledger row: its replacement still shows in the file's turn."""

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._mark: LedgerMark | None = None
        self._failing = False
        self._read_mark()

    def _read_mark(self) -> None:
        try:
            self._mark = self._store.ledger_mark()
        except Exception as exc:
            self._unreadable(exc)

    def take(self) -> list[str]:
        """The agents another process compacted since the last take (usually none:
        one ``PRAGMA`` on the daemon's connection)."""
        if self._mark is None:
            # Unreadable at start: from now on (a compaction before shows in its turn).
            self._read_mark()
            return []
        try:
            self._mark, agents = self._store.ledger_written_elsewhere(self._mark)
        except Exception as exc:
            self._unreadable(exc)
            return []
        self._failing = False
        return agents

    def _unreadable(self, exc: Exception) -> None:
        # Said once a spell, not each poll interval: the file's turn still comes.
        if not self._failing:
            _log.warning(
                "state database: ledger unreadable; another process's compactions show "
                "in each file's turn",
                error=describe_error(exc),
            )
        self._failing = True


class AfterCommit:
    def __init__(
        self,
        recall: RecallStage,
        archives: ArchiveSurvey,
        retention: RetentionService,
        replacements: Replacements | None = None,
    ) -> None:
        self._recall = recall
        self._archives = archives
        self._retention = retention
        self._replacements = replacements

    def replaced(self, paths: AgentPaths) -> None:
        """The agent's MEMORY.md may have been replaced by its job (committed, or a
        failure that may have come past the commit point): the watch stage is told."""
        if self._replacements is not None:
            self._replacements.put(paths.agent)

    def committed(self, paths: AgentPaths, outcome: CompactionOutcome) -> None:
        """The compaction is committed whatever happens here: each step reports its
        own failures, and one failing does not keep the next from running. The
        replacement goes to the watch stage first (the agent's next append must
        show within a poll interval; indexing the archive may take longer)."""
        self.replaced(paths)
        with contextlib.suppress(Exception):
            self._recall.index_archive(paths, outcome.archive)
        with contextlib.suppress(Exception):
            self._archives.archived(paths)
        pruned = outcome.pruned
        if pruned is not None and pruned.deleted:
            with contextlib.suppress(Exception):
                # The compaction's audit record names the prune (record_compaction).
                self._retention.pruned(paths, pruned, "compaction", audit=False)


__all__ = ["AfterCommit", "OtherCompactions", "Replacements"]
