"""The daemon's side of recall: index archives as they are written, repair at start.

The daemon owns one :class:`RecallService`. Each committed compaction's archive
is handed to :meth:`RecallService.index_archive` once the transaction has
returned (outside the agent's lock: the index re-checks each file it read
before and after writing its rows); at start-up
:meth:`RecallService.start` re-syncs every agent in a background thread (an
archive written by a run that crashed before indexing it, or by an older memd,
is indexed then). Nothing here can stop the daemon: a failure is logged with
the agent's name and recall is repaired at the next sync.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path

from memd.errors import MemdError
from memd.logs import get_logger
from memd.recall.index import RecallIndex, delete_corrupt_copies
from memd.recall.socket_server import RecallSocketInUse, RecallSocketServer, StatusSource
from memd.retention import PruneResult
from memd.workspace import AgentPaths, agent_paths

_log = get_logger("memd.recall")


class RecallService:
    def __init__(self, index: RecallIndex) -> None:
        self.index = index
        self.server: RecallSocketServer | None = None
        # The socket path another listener held when we started: retried by
        # retake_socket (a rolling restart stops the daemon that held it).
        self._waiting: tuple[Path, Path] | None = None
        # retake_socket runs on the scheduler's thread: never a server started
        # after stop() looked for one (its socket file would outlive us).
        self._server_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.caught_up = threading.Event()
        self._status: StatusSource | None = None
        # drop_gone's last run failed (said once until one succeeds); its job's thread only.
        self._gone_failing = False

    @classmethod
    def open(cls, state_dir: Path, workspace: Path) -> RecallService | None:
        """The service, or None (logged) when the index cannot be used at all."""
        try:
            index = RecallIndex.open(state_dir, workspace)
        except MemdError as exc:
            _log.warning("recall disabled", error=str(exc))
            return None
        for note in index.notes:
            _log.warning("recall index", detail=note)
        return cls(index)

    def index_archive(self, paths: AgentPaths, archive: Path) -> None:
        """A compaction committed ``archive``: index it (and the re-seeded MEMORY.md)."""
        try:
            report = self.index.sync_agent(paths)
        except (MemdError, OSError) as exc:
            _log.warning(
                "archive not indexed yet",
                agent=paths.agent,
                archive=archive.name,
                error=str(exc),
            )
            return
        _log.debug(
            "archive indexed",
            agent=paths.agent,
            archive=archive.name,
            files=len(report.indexed),
            entries=report.entries,
        )

    def drop_pruned(self, paths: AgentPaths, pruned: PruneResult) -> None:
        """Retention deleted archives: drop their rows and scrub them from the file."""
        try:
            self.index.sync_agent(paths, live=False)  # scrubs what it dropped
            # A copy moved aside as corrupt still holds the pruned archives' text.
            path = self.index.path
            for note in delete_corrupt_copies(path)[1] if path is not None else []:
                _log.warning("recall index copy kept", agent=paths.agent, error=note)
        except (MemdError, OSError) as exc:
            _log.warning(
                "pruned archives still indexed",
                agent=paths.agent,
                archives=len(pruned.deleted),
                error=str(exc),
            )

    def start(self, agents: Iterable[AgentPaths]) -> None:
        """Re-sync ``agents`` in the background (the repair after a crash).

        With unchanged files this is a stat pass against the identities the
        index stored: nothing is read. Its end is logged as "recall index
        ready" with what it cost (wall and this thread's CPU seconds) and how
        many files it (re-)indexed, since an operator sees that cost after
        every restart.
        """

        def run() -> None:
            started, cpu_started = time.monotonic(), time.thread_time()
            repaired = checked = files = 0
            dropped: list[str] = []
            for paths in agents:
                if self._stopping.is_set():
                    return
                checked += 1
                try:
                    # One scrub after the pass, not one per agent that lost files.
                    report = self.index.sync_agent(paths, scrub=False)
                except (MemdError, OSError) as exc:
                    _log.warning("recall sync failed", agent=paths.agent, error=str(exc))
                    continue
                except Exception as exc:
                    # Anything else (a bug, a name the index cannot store) costs
                    # this agent its sync, never the thread and every agent after
                    # it. Its class only: the message may quote the memory's text.
                    _log.warning("recall sync failed", agent=paths.agent, error=type(exc).__name__)
                    continue
                files += len(report.indexed)
                if report.removed and not report.sealed:  # a sealed agent's are scrubbed
                    dropped.append(paths.agent)
                if report.sealed:
                    if report.removed:
                        _log.info(
                            "recall rows dropped: archives encrypted at rest",
                            agent=paths.agent,
                            sources=len(report.removed),
                        )
                    continue
                archives = [name for name in report.indexed if name != "MEMORY.md"]
                if archives or report.removed:
                    repaired += 1
                    _log.info(
                        "recall index repaired",
                        agent=paths.agent,
                        indexed=archives,
                        removed=report.removed,
                        entries=report.entries,
                    )
            if dropped:
                try:
                    self.index.scrub()
                except (MemdError, OSError) as exc:
                    _log.warning("recall index not scrubbed", agents=dropped, error=str(exc))
                except Exception as exc:
                    _log.warning(
                        "recall index not scrubbed", agents=dropped, error=type(exc).__name__
                    )
            _log.info(
                "recall index ready",
                agents=checked,
                agents_repaired=repaired,
                files_indexed=files,
                seconds=round(time.monotonic() - started, 3),
                cpu_s=round(time.thread_time() - cpu_started, 3),
            )
            self.caught_up.set()

        self._thread = threading.Thread(target=run, name="memd-recall-sync", daemon=True)
        self._thread.start()

    def drop_gone(self, workspace: Path, present: Iterable[str]) -> None:
        """Agents removed from the workspace keep no rows: every indexed agent
        not in ``present`` whose folder is gone (or refused, DESIGN §1) is erased
        and the index file scrubbed. A folder that is there (an agent the
        registry has not listed yet) is left alone."""
        try:
            known = set(present)
            gone = [
                agent
                for agent in self.index.agents()
                if agent not in known and not _agent_folder_usable(workspace, agent)
            ]
            if gone:
                removed = self.index.erase_agents(gone)
                _log.info("recall rows erased: agent removed", agents=gone, entries=removed)
        except (MemdError, OSError) as exc:
            # Said once while it keeps failing (the index locked by another
            # process for minutes: a line every reconcile_s otherwise).
            said, self._gone_failing = self._gone_failing, True
            if not said:
                _log.warning("removed agents' recall rows not erased yet", error=str(exc))
            else:
                _log.debug("removed agents' recall rows not erased yet", error=str(exc))
            return
        if self._gone_failing:
            self._gone_failing = False
            _log.info("recall index usable again: removed agents' rows checked")

    def serve(self, workspace: Path, path: Path | None, status: StatusSource | None = None) -> None:
        """Open the agents' recall socket at ``path`` (None: no socket); ``status``
        answers an agent's "status" request there."""
        if path is None:
            return
        self._status = status
        server = RecallSocketServer(self.index, workspace, path, status=status)
        try:
            server.start()
        except OSError as exc:
            _log.warning("recall socket not served", path=str(path), error=str(exc))
            if isinstance(exc, RecallSocketInUse):
                self._waiting = (workspace, path)
            return
        self.server = server

    def retake_socket(self) -> None:
        """The periodic job: serve the socket another listener held at start once
        nothing answers there (its daemon stopped: a rolling restart starts the new
        daemon, then stops the old one, whose stop removes its socket). Said once,
        when it is taken; nothing while the other still holds it."""
        with self._server_lock:
            if self._waiting is not None and not self._stopping.is_set():
                self._retake(*self._waiting)

    def _retake(self, workspace: Path, path: Path) -> None:
        server = RecallSocketServer(self.index, workspace, path, status=self._status)
        try:
            server.start()
        except RecallSocketInUse:
            return  # still held (or still not ours to replace): try again next time
        except OSError as exc:
            _log.warning("recall socket not served", path=str(path), error=str(exc))
            self._waiting = None
            return
        self._waiting = None
        self.server = server
        _log.info("recall socket taken over: no other daemon serves it now", path=str(path))

    def stop(self) -> None:
        with self._server_lock:
            self._stopping.set()
        if self.server is not None:
            self.server.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.index.close()


def _agent_folder_usable(workspace: Path, agent: str) -> bool:
    try:
        agent_paths(workspace, agent)
    except MemdError:
        return False  # gone, refused, or a name memd does not take
    return True


__all__ = ["RecallService"]
