"""How the daemon's services are built from the config and linked, each to the next
stage only: the one module that knows every service. :class:`Services` opens
what building needs (the tokenizer, the state DB, the audit log, the redaction
key) and constructs the rest without starting a thread; the lifecycle
(:mod:`memd.daemon.lifecycle`) starts them in order and stops them in reverse.

Data walks one way: watcher → (hint queue) → counter → runner → scheduler →
transaction → files; the transaction's outcome goes back up only as its return
value, and the runner hands a committed one on (→ recall, archive figures,
retention's report); the flusher writes registry snapshots to the state DB and
returns the erasures it found to the runner that asked. The watches follow the
agent set the registry publishes at each rescan (the watch service owns the
watcher); nothing downstream calls a stage upstream.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from memd.audit import AuditLog
from memd.core.config import MemdConfig
from memd.daemon.archives import ArchiveSurvey
from memd.daemon.committed import AfterCommit, OtherCompactions, Replacements
from memd.daemon.counter import CountService
from memd.daemon.entries import (
    AgentEntry,
    CountUpdate,
    EntryCounter,
    ExitState,
    RunStats,
    Tokenizer,
)
from memd.daemon.flusher import StateFlusher
from memd.daemon.metrics import MetricsStage
from memd.daemon.recall import RecallStage
from memd.daemon.registry import AgentRegistry, RecoverFn, RecoveryOptions
from memd.daemon.retention import DAILY_S, RetentionService
from memd.daemon.runner import CompactFn, Runner, SummarizerFactory
from memd.daemon.watches import WatchService
from memd.descriptor import Descriptors
from memd.errors import describe_error
from memd.logs import get_logger
from memd.modelinfo import context_length_for_model
from memd.notify import SystemdNotifier
from memd.scheduler import JobScheduler
from memd.watcher import BackendKind, Watcher, default_backend_kind
from memd.workspace import AgentPaths

if TYPE_CHECKING:
    from memd.core.summary import Summarizer
    from memd.state import AgentRecord, StateStore

_log = get_logger("memd.daemon")

# The daily retention pass: its first run, a minute after start (not in the start-up rush).
RETENTION_FIRST_S = 60.0


@dataclass(frozen=True, slots=True)
class Parts:
    """What a caller may put in place of the real thing (tests: a scripted
    compaction, a fake tokenizer; a benchmark: a queue of every count)."""

    compact: CompactFn | None = None
    recover: RecoverFn | None = None
    summarizer_factory: SummarizerFactory | None = None
    tokenizer_factory: Callable[[str], Tokenizer] | None = None
    # Every count made is put here when given (a benchmark's latency probe).
    count_updates: queue.SimpleQueue[CountUpdate] | None = None


def default_compact() -> CompactFn:
    from memd.compaction import compact_agent

    return compact_agent


def default_recover(paths: AgentPaths, options: RecoveryOptions) -> str | None:
    from memd.compaction import recover_agent

    return recover_agent(
        paths, quiet_s=options.quiet_s, max_s=options.max_s, key_file=options.key_file
    )


def default_summarizer(config: MemdConfig, count_text: Callable[[str], int]) -> Summarizer:
    from memd.summarizers import make_summarizer

    return make_summarizer(config.summarizer, count_text)


def new_tokenizer(config: MemdConfig, parts: Parts) -> Tokenizer:
    if parts.tokenizer_factory is not None:
        return parts.tokenizer_factory(config.tokenizer.encoding)
    from memd.tokenizer import MAX_PIECE_BYTES, TokenCounter

    return TokenCounter(
        config.tokenizer.encoding,
        max_piece_bytes=config.tokenizer.max_piece_bytes or MAX_PIECE_BYTES,
    )


def open_store(state_dir: Path | None, workspace: Path) -> StateStore | None:
    if state_dir is None:
        return None
    from memd.state import StateStore

    store = StateStore.open(state_dir, workspace)
    for warning in store.warnings:
        _log.warning("state database", detail=warning)
    return store


def stored_records(store: StateStore | None) -> dict[str, AgentRecord]:
    if store is None:
        return {}
    from memd.state import BadRow

    bad: list[BadRow] = []
    try:
        records = {record.agent: record for record in store.agents(bad)}
    except Exception as exc:
        _log.warning("state database unreadable; counting every file", error=describe_error(exc))
        return {}
    for row in bad:
        # Not restored: the agent is counted from its file and its row written
        # anew; the bad row goes now (an agent gone meanwhile would keep it).
        _log.warning(
            "state database row not used (a value of the wrong type); counting the file again",
            agent=row.agent,
            column=row.column,
            value=repr(row.value)[:60],
        )
        with contextlib.suppress(Exception):
            store.remove_agent(row.agent)
    return records


class Services:
    """Every service of one daemon, built (not started) from the config.

    Building loads the tokenizer and opens nothing else: no thread, no file
    (the lifecycle starts the registry, opens the state DB for the flusher and
    loads the redaction key). The scheduler and the watcher start threads, so
    they are made only by :meth:`new_scheduler` and :meth:`new_watches`, after
    the initial count (which may fork).
    """

    def __init__(
        self,
        config: MemdConfig,
        workspace: Path,
        state_dir: Path | None,
        parts: Parts,
        notifier: SystemdNotifier,
        *,
        started_at: float,
        exiting: ExitState,
    ) -> None:
        self._config = config
        self.registry = AgentRegistry(
            workspace,
            config,
            parts.recover or default_recover,
            context_length_for_model,
        )
        self.stats = RunStats()
        self.flusher = StateFlusher(
            self.registry,
            self.stats,
            notifier,
            config.tokenizer.encoding,
            started_at,
        )
        self.archives = ArchiveSurvey(self.registry)
        self.scheduler: JobScheduler | None = None
        self.watches: WatchService | None = None
        tokenizer = new_tokenizer(config, parts)
        self.audit = AuditLog.for_workspace(state_dir, workspace, "daemon")
        self.registry.audit = self.audit
        self.entry_counter = EntryCounter(
            tokenizer,
            updates=parts.count_updates,
            max_piece_bytes=config.tokenizer.max_piece_bytes,
        )
        # Reserved text is counted with the tokenizer MEMORY.md is counted with (a
        # reload hands the registry the new one's).
        self.registry.descriptors = Descriptors(tokenizer.count_text)
        # The stages after a commit, made before the runner that hands them outcomes.
        # memd's own replacements of MEMORY.md, for the watch stage to take.
        self.replacements = Replacements()
        self.recall = RecallStage(state_dir, workspace, config, self.registry)
        # What `memd run` hands in to re-claim the workspace's state pointer when
        # the daemon it named is gone (None: no pointer, as in tests and embedding).
        self.claim_pointer: Callable[[], None] | None = None
        self.retention = RetentionService(
            self.registry, self.archives, self.recall, self.audit, config
        )
        self.runner = Runner(
            config,
            self.registry,
            self.entry_counter,
            self.flusher,
            self.stats,
            parts.compact or default_compact(),
            parts.summarizer_factory or default_summarizer,
            after_commit=AfterCommit(self.recall, self.archives, self.retention, self.replacements),
        )
        self.runner.audit = self.audit
        self.counter = CountService(
            config.trigger,
            config.tokenizer.encoding,
            self.registry,
            self.entry_counter,
            self.runner,
            self.flusher,
            pool_allowed=parts.tokenizer_factory is None,
            exiting=exiting,
        )
        self.metrics = MetricsStage(config.metrics, self.entry_counter, self.runner)

    def load_agents(
        self, watches: tuple[WatchService, contextlib.ExitStack] | None = None
    ) -> tuple[list[AgentEntry], list[AgentEntry], bool]:
        """Start-up: every agent found, recovered, registered and counted (or its
        stored count reused); returns them, those counted after READY, and whether
        ``watches`` (the service, the stack its stop goes on) watched every agent
        before the count's stats (else: stat again once they are started)."""
        records = stored_records(self.flusher.store)
        scanned = self.registry.scan()
        folders = self.registry.plain_folders(scanned)
        # Watched before anything in an agent folder is read (its stat or listing,
        # its memd-agent.json, the stat that decides whether a stored count still
        # holds): a write after a read is queued by the kernel and reported once the
        # watcher's thread runs. Counted before any thread exists, so the count may
        # fork a process pool safely.
        watched = watches is not None and watches[0].open(watches[1], folders)
        entries = []
        for name, link in sorted(scanned.items()):
            record = records.get(name)
            where = folders.get(name)
            entry = self.registry.make_entry(name, link, record.folder if record else None, where)
            if entry is not None:
                entries.append(entry)
        for entry in entries:
            self.registry.recover(entry)
            self.archives.restore(entry, records.get(entry.name))
        self.registry.register(entries, set(records))
        self._restore_last_compactions([entry for entry in entries if entry.name not in records])
        if watches is not None and watched:
            # A symlinked agent folder is watched once it is checked, after its
            # descriptor was read: read again if it changed meanwhile.
            for name in watches[0].match():
                self.registry.refresh_window(name)
        return entries, self.counter.initial_count(entries, records), watched

    def _restore_last_compactions(self, unstored: list[AgentEntry]) -> None:
        """An agent with no row yet takes its last compaction from the ledger: a
        `memd compact-now` run before any daemon recorded it there only (there was
        no row to put it in), and `memd status` said "never" while this daemon ran."""
        store = self.flusher.store
        if store is None or not unstored:
            return
        try:
            ended = store.last_compactions(entry.name for entry in unstored)
        except Exception as exc:
            _log.warning("state database: ledger unreadable", error=describe_error(exc))
            return
        for entry in unstored:
            at = ended.get(entry.name)
            if at is not None:
                entry.job = dataclasses.replace(entry.job, last_compaction_at=at)

    def new_scheduler(self) -> JobScheduler:
        daemon = self._config.daemon
        self.scheduler = JobScheduler(
            compaction_slots=max(daemon.max_concurrent_io, daemon.max_concurrent_llm)
        )
        return self.scheduler

    def new_watches(self, poll: bool | None) -> WatchService:
        """The watcher and its one driver; ``poll``: the command line's choice (None:
        the config's ``[watch] poll``)."""
        watch = self._config.watch
        kind: BackendKind = default_backend_kind(watch.poll if poll is None else poll)
        # Fixed until a restart (a reload never changes the watcher).
        self.counter.files_polled = kind == "polling"
        watcher = Watcher(
            self.registry.workspace,
            self.counter.sink,
            kind=kind,
            poll_interval_s=watch.poll_interval_s,
        )
        # Where the ledger ends now, before start-up's count: a compaction another
        # process commits after this is handed to the poller (earlier ones are counted).
        store = self.flusher.store
        others = OtherCompactions(store) if kind == "polling" and store is not None else None
        self.watches = WatchService(
            watcher,
            self.registry,
            self.counter.sink,
            check_every_s=watch.reconcile_s,
            replacements=self.replacements,
            others=others,
            others_every_s=watch.poll_interval_s,
        )
        return self.watches

    def schedule_periodic(self, config: MemdConfig | None = None) -> None:
        """The periodic jobs (again after a reload that changed their intervals)."""
        if config is not None:
            self._config = config
        assert self.scheduler is not None
        watch, daemon = self._config.watch, self._config.daemon
        # The timer only: the sweep runs on the count thread (its hint, like a watcher's).
        self.scheduler.every("reconcile", watch.reconcile_s, self.counter.sink.reconcile_due)
        self.scheduler.every("state-flush", daemon.state_flush_s, self.runner.flush)
        # At the heartbeat's pace, cheap when there is nothing to take: a daemon
        # started beside a live one (a rolling restart) serves the recall socket
        # and the pointer once that one is gone.
        self.scheduler.every("workspace-claim", daemon.state_flush_s, self.claim_workspace)
        # Soon after start (agents restored without figures are listed), then
        # with the reconcile: what compact-now, forget and prune did meanwhile.
        self.scheduler.every(
            "archive-survey", watch.reconcile_s, self.archives.survey, first_in_s=1.0
        )
        # With the reconcile that removes agents from the registry (the first soon
        # after start: agents removed while the daemon was down).
        self.scheduler.every(
            "recall-gone", watch.reconcile_s, self.recall.drop_gone, first_in_s=1.0
        )
        # A minute after start (not in the start-up rush), then daily.
        self.scheduler.every(
            "retention", DAILY_S, self.retention.daily, first_in_s=RETENTION_FIRST_S
        )

    def claim_workspace(self) -> None:
        """The periodic job: the recall socket first, then the pointer (whose check
        asks the socket who serves the workspace)."""
        self.recall.retake_socket()
        if self.claim_pointer is not None:
            self.claim_pointer()

    def final_flush(self) -> None:
        """Shutdown, after the scheduler stopped: queued jobs will not run now."""
        self.runner.cancel_pending()
        with contextlib.suppress(Exception):
            self.runner.flush(final=True)

    def healthy(self) -> bool:
        return (
            self.watches is not None
            and self.watches.is_alive()
            and self.scheduler is not None
            and self.scheduler.is_alive()
            and self.counter.is_alive()
        )


__all__ = [
    "RETENTION_FIRST_S",
    "Parts",
    "Services",
    "default_summarizer",
    "new_tokenizer",
    "open_store",
    "stored_records",
]
