"""The recall index beside the daemon, as one stage: opened and started with
:meth:`RecallStage.start` (after the initial count: it starts threads), its stop
pushed on the exit stack, its re-sync of every agent started after READY
(:meth:`RecallStage.resync`); handed each archive a compaction commits and each
prune's result (after the agent's lock is let go), and told of ``[privacy]
encrypt_archives`` on reload; removed agents' rows are erased by a periodic job
(:meth:`RecallStage.drop_gone`).

Off without a state dir, or when the index cannot be opened (said once): the
hooks then do nothing and the daemon runs without recall.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memd.core.config import MemdConfig
from memd.core.jobs import RetryPolicy, cooldown_left, stored_state
from memd.daemon.registry import AgentRegistry
from memd.recall.service import RecallService
from memd.recall.socket_server import socket_path_for
from memd.retention import PruneResult
from memd.workspace import AgentPaths


class RecallStage:
    def __init__(
        self,
        state_dir: Path | None,
        workspace: Path,
        config: MemdConfig,
        registry: AgentRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._state_dir = state_dir
        # The runner's clock (its jobs' cooldowns end on it).
        self._clock = clock
        self._workspace = workspace
        self._config = config
        self._registry = registry
        # The running service (None until started, and when recall is off).
        self.service: RecallService | None = None

    def start(self, stack: contextlib.ExitStack) -> None:
        if self._state_dir is None:
            return
        recall = RecallService.open(self._state_dir, self._workspace)
        if recall is None:
            return
        recall.index.encrypting = self._config.privacy.encrypt_archives
        self.service = recall
        stack.callback(self._stop, recall)
        recall.serve(
            self._registry.root,
            socket_path_for(self._config.recall.socket, self._workspace),
            self.status,
        )

    def status(self, agent: str) -> dict[str, Any] | None:
        """Where ``agent``'s memory stands (the socket's "status" request): memd's
        count and which file and bytes it covers, the threshold, the job's state
        and, in a cooldown after which memd compacts again, how long it still
        lasts; None for an agent the daemon does not watch. Read without the
        runner's lock: each field is one value, replaced whole."""
        entry = self._registry.get(agent)
        if entry is None:
            return None
        tracked = entry.tracked
        counted = None if tracked is None else tracked.state
        job = entry.job
        policy = RetryPolicy.from_config(self._config.daemon)
        left = cooldown_left(job, self._clock(), policy)
        return {
            "tokens": None if counted is None else counted.tokens,
            "threshold_tokens": entry.policy.threshold_tokens,
            "state": stored_state(job, count_failed=entry.count_error is not None),
            "cooldown_left_s": None if left is None else round(left, 3),
            "dev": None if counted is None else counted.dev,
            "ino": None if counted is None else counted.ino,
            "size": None if counted is None else counted.size,
        }

    def resync(self) -> None:
        """Re-sync every agent's index in the background (the repair after a crash).
        Started after READY: it is a pass over every agent, which before READY
        competed with the start-up's own for the interpreter lock."""
        if self.service is not None:
            # The agents as of now, as a list: the re-sync calls no one back.
            self.service.start(self._registry.all_paths())

    def retake_socket(self) -> None:
        """The periodic job: serve the socket once the daemon that held it at start is gone."""
        if self.service is not None:
            self.service.retake_socket()

    def drop_gone(self) -> None:
        """The periodic job: agents removed from the workspace (their folders gone
        while the daemon ran, or before it started) keep no rows in the index."""
        if self.service is not None:
            self.service.drop_gone(self._registry.root, self._registry.names())

    @staticmethod
    def _stop(recall: RecallService) -> None:
        with contextlib.suppress(Exception):
            recall.stop()

    def reconfigure(self, config: MemdConfig) -> None:
        self._config = config
        if self.service is not None:
            self.service.index.encrypting = config.privacy.encrypt_archives

    def index_archive(self, paths: AgentPaths, archive: Path) -> None:
        """A compaction committed ``archive``: index it."""
        if self.service is not None:
            self.service.index_archive(paths, archive)

    def drop_pruned(self, paths: AgentPaths, result: PruneResult) -> None:
        """Retention deleted archives: their rows go."""
        if self.service is not None:
            self.service.drop_pruned(paths, result)


__all__ = ["RecallStage"]
