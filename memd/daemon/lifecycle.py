"""The daemon's lifecycle: ordered start-up and shutdown, signals, reload.

Start-up (in this order, so nothing is missed and READY means ready): open the
state DB, load the tokenizer, finish or roll back any crashed compaction of
every agent, count every MEMORY.md (reusing the stored count of files that did
not change, in parallel for the rest; a file too large to count in a moment is
counted right after READY instead, so readiness never waits on one agent),
start the scheduler, the watches and the counter, evaluate every agent, then
notify ``READY=1`` and log ``ready``.
Each service is started with its stop pushed on one exit stack, so shutdown is
the reverse of start-up by construction.

Data walks one way: watcher → (hint queue) → counter → runner → scheduler →
transaction → files; the flusher writes registry snapshots to the state DB and
returns the erasures it found to the runner that asked. The watches follow the
agent set the registry publishes at each rescan (the watch service owns the
watcher); nothing downstream calls a stage upstream.

Signals (uvicorn's shape): :meth:`Daemon.capture_signals` installs
:meth:`Daemon.handle_exit` and restores the previous handlers; the handler
only sets flags, the main loop does the work. SIGTERM/SIGINT stop new
triggers and wait for in-flight compactions to finish their commit; a second
SIGINT forces: compactions abort at their next pre-commit checkpoint (the
transaction rolls back, never half-applied) and the process exits without
waiting for a slow LLM call. SIGHUP reloads the config.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from memd.audit import AuditLog
from memd.core.audit import AuditEvent
from memd.core.config import MemdConfig
from memd.core.privacy import outbound_redaction, unredacted_remote_warning
from memd.daemon.archives import ArchiveSurvey
from memd.daemon.counter import CountService
from memd.daemon.entries import (
    AgentEntry,
    CountUpdate,
    EntryCounter,
    RunStats,
    Tokenizer,
)
from memd.daemon.flusher import StateFlusher
from memd.daemon.registry import AgentRegistry, RecoverFn
from memd.daemon.retention import DAILY_S, RetentionService
from memd.daemon.runner import CompactFn, Runner, SummarizerFactory
from memd.daemon.watches import WatchService
from memd.descriptor import Descriptors
from memd.errors import ConfigError, MemdError, describe_error
from memd.logs import LogFormat, configure_logging, get_logger
from memd.modelinfo import context_length_for_model
from memd.notify import SystemdNotifier
from memd.recall.service import RecallService
from memd.recall.socket_server import socket_path_for
from memd.scheduler import JobScheduler
from memd.settings import LoadedConfig, load_settings, model_window_problems
from memd.watcher import BackendKind, Watcher, default_backend_kind
from memd.workspace import AGENTS_DIR, AgentPaths, require_workspace

if TYPE_CHECKING:
    from memd.core.summary import Summarizer
    from memd.metrics import MetricsServer
    from memd.state import AgentRecord, StateStore

_log = get_logger("memd.daemon")

EXIT_OK = 0
EXIT_FORCED = 130
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_MAIN_TICK_S = 0.2
# The daily retention pass: its first run, a minute after start (not in the start-up rush).
RETENTION_FIRST_S = 60.0


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    """What the command line fixed (kept across SIGHUP reloads)."""

    config_file: Path | None = None
    workspace_flag: Path | None = None
    state_dir: Path | None = None  # None: no state DB (tests, embedding)
    poll: bool | None = None  # None: the config's [watch] poll
    log_format: LogFormat | None = None
    log_level: str | None = None
    install_signal_handlers: bool = True
    # Applied to every loaded config, the first and each reload (``--demo``).
    config_transform: Callable[[MemdConfig], MemdConfig] | None = None


def _default_compact() -> CompactFn:
    from memd.compaction import compact_agent

    return compact_agent


def _default_recover(config_of: Callable[[], MemdConfig]) -> RecoverFn:
    from memd.compaction import CompactionOptions, recover_agent

    def recover(paths: AgentPaths) -> str | None:
        # The current config's master key: a crash's old file kept as an
        # archive is sealed like any other archive.
        return recover_agent(paths, key_file=CompactionOptions.from_config(config_of()).key_file)

    return recover


def _default_summarizer(config: MemdConfig, count_text: Callable[[str], int]) -> Summarizer:
    from memd.summarizers import make_summarizer

    return make_summarizer(config.summarizer, count_text)


def _default_tokenizer(encoding: str, max_piece_bytes: int | None = None) -> Tokenizer:
    from memd.tokenizer import MAX_PIECE_BYTES, TokenCounter

    return TokenCounter(encoding, max_piece_bytes=max_piece_bytes or MAX_PIECE_BYTES)


class Daemon:
    def __init__(
        self,
        loaded: LoadedConfig,
        options: DaemonOptions | None = None,
        *,
        compact: CompactFn | None = None,
        recover: RecoverFn | None = None,
        summarizer_factory: SummarizerFactory | None = None,
        counter_factory: Callable[[str], Tokenizer] | None = None,
        notifier: SystemdNotifier | None = None,
        environ: Mapping[str, str] | None = None,
        count_updates: queue.SimpleQueue[CountUpdate] | None = None,
    ) -> None:
        self.options = options or DaemonOptions()
        self.config = loaded.config
        self.workspace = loaded.workspace
        self._env_overrides = loaded.env_overrides
        self._compact = compact
        self._summarizer_factory = summarizer_factory or _default_summarizer
        self._real_tokenizer = counter_factory is None
        self._tokenizer_factory = counter_factory or _default_tokenizer
        self._environ = os.environ if environ is None else environ
        self.notifier = notifier or SystemdNotifier(self._environ)
        # Every count made is put here when given (a benchmark's latency probe).
        self._count_updates = count_updates
        self.started_at = time.time()

        self.registry = AgentRegistry(
            self.workspace,
            self.config,
            recover or _default_recover(lambda: self.config),
            context_length_for_model,
        )
        self.stats = RunStats()
        # Built at start-up (they need the tokenizer and the state DB).
        self.counter: CountService | None = None
        self.runner: Runner | None = None
        self.flusher = StateFlusher(
            self.registry,
            self.stats,
            self.notifier,
            self.config.tokenizer.encoding,
            self.healthy,
            self.started_at,
        )
        self.archives = ArchiveSurvey(self.registry)
        self.scheduler: JobScheduler | None = None
        self.watcher: Watcher | None = None
        self.watches: WatchService | None = None
        self.recall: RecallService | None = None
        self._metrics_server: MetricsServer | None = None
        self.retention: RetentionService | None = None
        # Replaced at start-up by the workspace's log (off without a state dir).
        self.audit = AuditLog(None, "daemon")

        # Flags set by the signal handler (and by tests, through it).
        self.should_exit = False
        self.force_exit = False
        self._reload_requested = False
        self.ready = threading.Event()
        self.stopped = threading.Event()

    # ------------------------------------------------------------------ signals

    def handle_exit(self, signum: int, _frame: FrameType | None) -> None:
        """The one signal rule. Only flags here: the main loop does the work (no
        locks in handlers). A second SIGINT while exiting forces."""
        if signum == signal.SIGHUP:
            self._reload_requested = True
        elif signum == signal.SIGINT and self.should_exit:
            self.force_exit = True
        else:
            self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install :meth:`handle_exit` for the daemon's run; restore the previous
        handlers after (only the main thread can, and only when asked to)."""
        previous: dict[int, Any] = {}
        if self.options.install_signal_handlers and (
            threading.current_thread() is threading.main_thread()
        ):
            for sig in HANDLED_SIGNALS:
                previous[sig] = signal.signal(sig, self.handle_exit)
        try:
            yield
        finally:
            for restored, handler in previous.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(restored, handler)

    def request_reload(self) -> None:
        self._reload_requested = True

    @property
    def reload_requested(self) -> bool:
        """A reload is pending (the main loop takes it on its next turn)."""
        return self._reload_requested

    # ---------------------------------------------------------------- lifecycle

    @property
    def compactions_ok(self) -> int:
        return self.stats.compactions_ok

    @property
    def compactions_failed(self) -> int:
        return self.stats.compactions_failed

    @property
    def store(self) -> StateStore | None:
        return self.flusher.store

    def agents(self) -> dict[str, AgentEntry]:
        return self.registry.agents()

    def run(self) -> int:
        """Run until asked to stop; returns the process exit code."""
        started = False
        with self.capture_signals():
            stack = contextlib.ExitStack()
            try:
                self._startup(stack)
                started = True
                self._main_loop()
            finally:
                code = self._shutdown(stack, quiet=not started)
                self.stopped.set()
        return code

    def _startup(self, stack: contextlib.ExitStack) -> None:
        require_workspace(self.workspace)
        self._warn_about_filesystem()
        self._check_archive_key(self.config)
        self._check_model_windows(self.config)
        self.registry.start()
        with contextlib.suppress(OSError):
            (self.workspace / AGENTS_DIR).mkdir(exist_ok=True)
        stack.callback(self.notifier.close)
        tokenizer = self._new_tokenizer(self.config)
        stack.callback(self.flusher.close)
        self.flusher.start(self._open_store())
        self.audit = AuditLog.for_workspace(self.options.state_dir, self.workspace, "daemon")
        entry_counter = EntryCounter(
            tokenizer,
            updates=self._count_updates,
            max_piece_bytes=self.config.tokenizer.max_piece_bytes,
        )
        # Reserved text is counted with the tokenizer MEMORY.md is counted with (reload swaps it).
        self.registry.descriptors = Descriptors(
            lambda text: entry_counter.tokenizer.count_text(text)
        )
        runner = Runner(
            self.config,
            self.registry,
            entry_counter,
            self.flusher,
            self.stats,
            self._compact or _default_compact(),
            self._summarizer_factory,
            wake=self._wake,
        )
        runner.audit = self.audit
        runner.redaction_key = self._redaction_key()
        self.runner = runner
        counter = CountService(
            self.config.trigger,
            self.config.tokenizer.encoding,
            self.registry,
            entry_counter,
            runner,
            self.flusher,
            pool_allowed=self._real_tokenizer,
            should_stop=lambda: self.should_exit,
        )
        self.counter = counter
        # Runs after the scheduler has stopped: queued jobs will not run now.
        stack.callback(self._final_flush)

        records = self._stored_records()
        scanned = self.registry.scan()
        entries = [
            e
            for e in (
                self.registry.make_entry(name, link) for name, link in sorted(scanned.items())
            )
            if e
        ]
        for entry in entries:
            self.registry.recover(entry)
            self.archives.restore(entry, records.get(entry.name))
        self.registry.register(entries, set(records))
        # Counted before any thread exists, so the scan may fork a process
        # pool safely; changes made meanwhile are caught just below.
        later = counter.initial_count(entries, records)
        if self.should_exit:
            return  # SIGTERM during the count: stop before READY
        # Threads only after the initial count (it may fork a process pool).
        runner.on_archived = self.archives.on_archived
        self.retention = RetentionService(self.registry, self.archives, self.audit, self.config)
        runner.on_pruned = self.retention.hook("compaction", audit=False)
        self._start_recall(stack, runner)

        self._start_metrics(stack, entry_counter, runner)
        daemon_config = self.config.daemon
        self.scheduler = JobScheduler(
            compaction_slots=max(daemon_config.max_concurrent_io, daemon_config.max_concurrent_llm)
        )
        self.scheduler.start()
        stack.callback(self._stop_scheduler, self.scheduler)
        runner.start(self.scheduler)
        poll = self.config.watch.poll if self.options.poll is None else self.options.poll
        kind: BackendKind = default_backend_kind(poll)
        self.watcher = Watcher(
            self.workspace,
            counter.sink,
            kind=kind,
            poll_interval_s=self.config.watch.poll_interval_s,
        )
        self.watches = WatchService(
            self.watcher, self.registry, counter.sink, check_every_s=self.config.watch.reconcile_s
        )
        self.watches.start(stack)
        counter.recount_changed([entry for entry in entries if entry not in later])
        counter.start()
        stack.callback(counter.stop)
        counter.count_later(later)
        self._schedule_periodic()
        for entry in entries:
            runner.evaluate(entry)
        runner.flush()
        self.notifier.ready(self.flusher.status_text())
        self.ready.set()
        _log.info(
            "ready",
            workspace=str(self.workspace),
            agents=len(entries),
            watcher=kind,
            state_db=str(self.store.path) if self.store else None,
            summarizer=self.config.summarizer.model,
            # What that summarizer is sent (README "Privacy").
            redaction=outbound_redaction(self.config),
            # Proof for operators (and tests) that litellm stays unloaded until
            # a summary is made with a litellm model.
            litellm_loaded="litellm" in sys.modules,
            # MEMD_* variables win over memd.toml; systemd reads
            # EnvironmentFile= only at start, never on reload.
            env_overrides=list(self._env_overrides),
        )
        self._warm_summarizer()

    def _new_tokenizer(self, config: MemdConfig) -> Tokenizer:
        if self._real_tokenizer:
            return _default_tokenizer(config.tokenizer.encoding, config.tokenizer.max_piece_bytes)
        return self._tokenizer_factory(config.tokenizer.encoding)

    def _warm_summarizer(self) -> None:
        """Import litellm in the background now, not seconds into the first compaction."""
        if self._summarizer_factory is not _default_summarizer:
            return
        from memd.summarizers import needs_litellm

        if not needs_litellm(self.config.summarizer):
            return

        def warm() -> None:
            from memd.llm import warm_up

            started = time.monotonic()
            loaded = warm_up()
            _log.info("summarizer loaded", ok=loaded, seconds=round(time.monotonic() - started, 2))

        threading.Thread(target=warm, name="memd-warm-litellm", daemon=True).start()

    def _redaction_key(self) -> bytes | None:
        """The workspace's key from the state dir, shared with the CLI (README "Privacy").

        When it cannot be used, compactions still redact, with a key of this
        process only: placeholders then differ from the CLI's and after a restart.
        """
        self._warn_unredacted()
        if self.options.state_dir is None:
            return None
        from memd.redaction_key import key_path, load_or_create_key

        try:
            return load_or_create_key(key_path(self.options.state_dir, self.workspace))
        except ConfigError as exc:
            _log.warning("redaction key unusable; using one for this run only", detail=str(exc))
            return None

    def _warn_unredacted(self) -> None:
        warning = unredacted_remote_warning(self.config)
        if warning is not None:
            _log.warning("privacy: remote summarizer without redaction", detail=warning)

    def _open_store(self) -> StateStore | None:
        if self.options.state_dir is None:
            return None
        from memd.state import StateStore

        store = StateStore.open(self.options.state_dir, self.workspace)
        for warning in store.warnings:
            _log.warning("state database", detail=warning)
        return store

    def _stored_records(self) -> dict[str, AgentRecord]:
        store = self.store
        if store is None:
            return {}
        try:
            return {record.agent: record for record in store.agents()}
        except Exception as exc:
            _log.warning(
                "state database unreadable; counting every file", error=describe_error(exc)
            )
            return {}

    def _start_recall(self, stack: contextlib.ExitStack, runner: Runner) -> None:
        if self.options.state_dir is None:
            return
        recall = RecallService.open(self.options.state_dir, self.workspace)
        if recall is None:
            return
        recall.index.encrypting = self.config.privacy.encrypt_archives
        self.recall = recall
        recall.start(self.registry.all_paths)

        def stop() -> None:
            with contextlib.suppress(Exception):
                recall.stop()

        stack.callback(stop)
        recall.serve(self.registry.root, socket_path_for(self.config.recall.socket, self.workspace))
        surveyed = runner.on_archived

        def on_archived(paths: AgentPaths, archive: Path) -> None:
            recall.on_archived(paths, archive)
            if surveyed is not None:
                surveyed(paths, archive)

        runner.on_archived = on_archived
        if self.retention is not None:
            self.retention.on_pruned = recall.on_pruned

    def _check_archive_key(self, config: MemdConfig) -> None:
        # Every compaction reads the key file; a missing or loose one is said
        # at start (and reload), not first at the next compaction's failure.
        from memd.doctor import check_archive_key

        for check in check_archive_key(config.privacy):
            if check.status == "fail":
                _log.error("archive key", detail=check.message, fix=check.fix)
            elif config.privacy.encrypt_archives:
                _log.info("archives encrypted at rest", detail=check.message)

    def _warn_about_filesystem(self) -> None:
        # NFS without lockd, CIFS and Docker Desktop shares (virtiofs, gRPC
        # FUSE) break flock between hosts/VMs and drop inotify events: say so
        # at start, where operators look, not only in `memd doctor`.
        from memd.doctor import check_filesystem

        for check in check_filesystem(self.workspace):
            if check.status != "ok":
                _log.warning("workspace filesystem", detail=check.message, fix=check.fix)

    def _start_metrics(
        self, stack: contextlib.ExitStack, entry_counter: EntryCounter, runner: Runner
    ) -> None:
        port = self.config.metrics.port
        if port <= 0:
            return
        try:
            from memd.metrics import start_metrics_server

            server = start_metrics_server(port, self.config.metrics.bind)
        except Exception as exc:
            _log.warning("metrics server not started", port=port, error=describe_error(exc))
            return
        self._metrics_server = server
        entry_counter.metrics = runner.metrics = server.metrics

        def close() -> None:
            with contextlib.suppress(Exception):
                server.close()

        stack.callback(close)

    def _wake(self, agent: str) -> None:
        # A scheduled wake-up is a hint like a watcher's: count, then decide.
        if self.counter is not None:
            self.counter.request_count(agent)

    def _schedule_periodic(self) -> None:
        assert self.scheduler is not None and self.counter is not None and self.runner is not None
        self.scheduler.every("reconcile", self.config.watch.reconcile_s, self.counter.reconcile)
        self.scheduler.every("state-flush", self.config.daemon.state_flush_s, self.runner.flush)
        # Soon after start (agents restored without figures are listed), then
        # with the reconcile: what compact-now, forget and prune did meanwhile.
        self.scheduler.every(
            "archive-survey", self.config.watch.reconcile_s, self.archives.survey, first_in_s=1.0
        )
        if self.retention is not None:
            # A minute after start (not in the start-up rush), then daily.
            self.scheduler.every(
                "retention", DAILY_S, self.retention.daily, first_in_s=RETENTION_FIRST_S
            )

    def _main_loop(self) -> None:
        ping_every = self.notifier.watchdog_ping_interval_s
        next_ping = time.monotonic()
        while not self.should_exit:
            if self._reload_requested:
                self._reload_requested = False
                self._reload()
            if ping_every is not None and time.monotonic() >= next_ping:
                if self.healthy():
                    self.notifier.watchdog()
                next_ping = time.monotonic() + ping_every
            time.sleep(_MAIN_TICK_S)

    def _stop_scheduler(self, scheduler: JobScheduler) -> None:
        # Graceful: let running compactions finish their commit. Watch for a
        # second SIGINT meanwhile (this is still the main thread).
        waiter = threading.Thread(target=scheduler.shutdown, kwargs={"wait": True}, daemon=True)
        waiter.start()
        while waiter.is_alive() and not self.force_exit:
            waiter.join(timeout=_MAIN_TICK_S)
        if self.force_exit and self.runner is not None:
            self.runner.abort.set()
        if self.force_exit and waiter.is_alive():
            _log.warning("forced exit; in-flight compactions abort before their commit")
            # Give them a moment to reach a checkpoint and roll back.
            waiter.join(timeout=2.0)

    def _final_flush(self) -> None:
        if self.runner is None:
            return
        self.runner.cancel_pending()
        with contextlib.suppress(Exception):
            self.runner.flush(final=True)

    def _shutdown(self, stack: contextlib.ExitStack, quiet: bool = False) -> int:
        """Stop everything that started, in reverse; ``quiet`` after a failed
        start-up (the caller reports that error, not a clean stop)."""
        if self.runner is not None:
            self.runner.stop()
        if self.retention is not None:
            self.retention.stop()
        self.notifier.stopping()
        if not quiet:
            running = self.runner.running() if self.runner is not None else []
            _log.info("stopping", compacting=running)
        stack.close()
        code = EXIT_FORCED if self.force_exit else EXIT_OK
        if not quiet:
            _log.info("stopped", exit_code=code)
        return code

    def healthy(self) -> bool:
        return (
            self.watches is not None
            and self.watches.is_alive()
            and self.scheduler is not None
            and self.scheduler.is_alive()
            and self.counter is not None
            and self.counter.is_alive()
        )

    # ------------------------------------------------------------------- reload

    def _check_model_windows(self, config: MemdConfig) -> None:
        """Budgets that cannot fit a window taken from an agent's model: said at once
        (those agents' compactions would fail until the config changes)."""
        for problem in model_window_problems(config, context_length_for_model):
            _log.warning("summary budgets do not fit an agent's window", problem=problem)

    def _reload(self) -> None:
        self.notifier.reloading()
        _log.info("reloading configuration")
        try:
            loaded = load_settings(
                config_file=self.options.config_file,
                workspace=self.options.workspace_flag,
                environ=self._environ,
            )
        except ConfigError as exc:
            _log.error("reload failed; keeping the previous configuration", error=str(exc))
            self._audit_reload(ok=False, errors=len(exc.problems))
            self.notifier.ready(self.flusher.status_text())
            return
        if loaded.workspace != self.workspace:
            _log.warning(
                "workspace change needs a restart; keeping the current one",
                current=str(self.workspace),
                configured=str(loaded.workspace),
            )
        self._check_model_windows(loaded.config)
        old = self.config
        new = loaded.config.model_copy(update={"workspace": str(self.workspace)})
        if self.options.config_transform is not None:
            new = self.options.config_transform(new)
        self.config = new
        configure_logging(
            self.options.log_format or new.log.format, self.options.log_level or new.log.level
        )
        tokenizer: Tokenizer | None = None
        if new.tokenizer != old.tokenizer:
            try:
                tokenizer = self._new_tokenizer(new)
            except MemdError as exc:
                _log.error("reload: tokenizer unavailable; keeping the old one", error=str(exc))
        # Fan-out: each service takes what it needs from the new config.
        if self.runner is not None:
            self.runner.reconfigure(new)
        self.registry.reconfigure(new)
        if self.retention is not None:
            self.retention.config = new
        if self.recall is not None:
            self.recall.index.encrypting = new.privacy.encrypt_archives
        if new.privacy != old.privacy:
            self._check_archive_key(new)
        self._warn_unredacted()
        self.flusher.reconfigure(new.tokenizer.encoding)
        if self.counter is not None:
            self.counter.reconfigure(
                new.trigger, new.tokenizer.encoding, tokenizer, new.tokenizer.max_piece_bytes
            )
            if tokenizer is not None:
                # Agents' reserved text (memd-agent.json) is counted with the new encoding too.
                self.registry.reconfigure(new)
        if self.watches is not None:
            self.watches.check_every_s = new.watch.reconcile_s
        if (
            new.watch.reconcile_s != old.watch.reconcile_s
            or new.daemon.state_flush_s != old.daemon.state_flush_s
        ):
            self._schedule_periodic()
        for key in ("max_concurrent_llm", "max_concurrent_io"):
            if getattr(new.daemon, key) != getattr(old.daemon, key):
                _log.warning("takes effect at the next restart", setting=f"daemon.{key}")
        if new.watch.poll != old.watch.poll and self.options.poll is None:
            _log.warning("watch.poll takes effect at the next restart")
        if tokenizer is None and self.runner is not None:
            # After an encoding change each agent is evaluated when its recount
            # lands: judged on "0 tokens" now, a breaker would look healed.
            for entry in self.agents().values():
                self.runner.evaluate(entry)
        self.notifier.ready(self.flusher.status_text())
        self._audit_reload(ok=True, changed=changed_sections(old, new))
        _log.info(
            "reloaded",
            config=str(loaded.source) if loaded.source else None,
            # The environment is the one memd started with: `systemctl reload`
            # does not re-read EnvironmentFile=, so these keep their values.
            env_overrides=list(loaded.env_overrides),
        )

    def _audit_reload(self, **fields: object) -> None:
        try:
            self.audit.record(AuditEvent.CONFIG_RELOAD, None, trigger="sighup", **fields)
        except Exception as exc:  # the reload itself is done either way
            _log.warning("cannot write the audit log", error=describe_error(exc))


def changed_sections(old: MemdConfig, new: MemdConfig) -> list[str]:
    """The config's top-level keys whose values differ (names only, never values)."""
    before, after = old.model_dump(), new.model_dump()
    return sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))


def run_daemon(loaded: LoadedConfig, options: DaemonOptions) -> int:
    return Daemon(loaded, options).run()


__all__ = ["EXIT_FORCED", "EXIT_OK", "HANDLED_SIGNALS", "Daemon", "DaemonOptions", "run_daemon"]
