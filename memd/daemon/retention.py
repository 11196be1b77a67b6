"""The daemon's retention: after each compaction (inside the transaction) and once a day.

The transaction prunes under the agent's lock right after its commit and
returns what it deleted; the runner hands that on (:mod:`memd.daemon.committed`)
to :meth:`RetentionService.pruned`. The daily pass
(:meth:`RetentionService.daily`) prunes every agent whose policy sets a limit,
each under its own lock (an agent being compacted is skipped until the next
pass: its compaction prunes it anyway). After a prune that deleted archives,
once the agent's lock is let go: one log line and one audit record (names,
counts, bytes, reasons; never content), the recall index drops their rows, the
archive figures are re-surveyed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from memd.daemon.archives import ArchiveSurvey
from memd.daemon.recall import RecallStage
from memd.daemon.registry import AgentRegistry
from memd.errors import LockTimeout, MemdError, describe_error
from memd.logs import get_logger
from memd.retention import PruneResult
from memd.workspace import AgentPaths

if TYPE_CHECKING:
    from memd.audit import AuditLog
    from memd.core.config import MemdConfig

_log = get_logger("memd.daemon")

DAILY_S = 86_400.0
# An agent being compacted is skipped, not waited for: the compaction prunes it.
LOCK_WAIT_S = 1.0


class RetentionService:
    def __init__(
        self,
        registry: AgentRegistry,
        archives: ArchiveSurvey,
        recall: RecallStage,
        audit: AuditLog,
        config: MemdConfig,
    ) -> None:
        # Replaced on reload: where a crashed compaction's recovery writes (key file, drain).
        self.config = config
        self._registry = registry
        self._archives = archives
        self._recall = recall
        self._audit = audit
        # Set at shutdown: a daily pass over many agents stops between two of them.
        self._stopping = threading.Event()

    def reconfigure(self, config: MemdConfig) -> None:
        self.config = config

    def start(self, stack: contextlib.ExitStack) -> None:
        """The daily pass runs on the scheduler: started after it, so this stop
        (pushed on ``stack``) comes before the scheduler's wait for running jobs."""
        stack.callback(self.stop)

    def stop(self) -> None:
        self._stopping.set()

    def pruned(
        self, paths: AgentPaths, result: PruneResult, trigger: str, *, audit: bool = True
    ) -> None:
        """A prune deleted archives; ``audit`` False when the caller records it (after a
        compaction, the compaction's record comes first: see record_compaction)."""
        _log.info(
            "archives pruned",
            agent=paths.agent,
            trigger=trigger,
            archives=list(result.deleted),
            bytes=result.deleted_bytes,
            reasons=list(result.plan.all_reasons()),
            kept=result.kept,
        )
        if audit:
            from memd.audit import record_prune

            try:
                record_prune(self._audit, result, trigger=trigger)
            except Exception as exc:  # the archives are gone whatever happens here
                _log.warning(
                    "cannot write the audit log", agent=paths.agent, error=describe_error(exc)
                )
        self._recall.drop_pruned(paths, result)
        self._archives.archived(paths)

    def daily(self, prune: Callable[..., PruneResult] | None = None) -> int:
        """Prune every agent with a retention limit; returns the archives deleted."""
        from memd.compaction import CompactionOptions

        if prune is None:
            from memd.compaction import prune_agent

            prune = prune_agent
        options = CompactionOptions.from_config(self.config)
        deleted = 0
        for entry in list(self._registry.agents().values()):
            if self._stopping.is_set():
                break
            limits = entry.policy.retention
            if not limits.active:
                continue
            try:
                result = prune(
                    entry.paths,
                    limits,
                    lock_wait_s=LOCK_WAIT_S,
                    quiet_s=options.drain_quiet_s,
                    max_s=options.drain_max_s,
                    key_file=options.key_file,
                    audit=self._audit,  # an erasure a crash left, finished first
                )
            except LockTimeout:
                continue
            except (MemdError, OSError) as exc:
                _log.warning("retention failed", agent=entry.name, error=describe_error(exc))
                continue
            if result.deleted:
                # Each step reports its own failures; the archives are gone whatever happens.
                with contextlib.suppress(Exception):
                    self.pruned(entry.paths, result, "daily")
            deleted += len(result.deleted)
        return deleted


__all__ = ["DAILY_S", "RetentionService"]
