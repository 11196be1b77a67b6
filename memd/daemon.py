"""The daemon's lifecycle: scan, watch, count, schedule compactions, shut down cleanly.

Startup (in this order, so nothing is missed and READY means ready): open the
state DB, load the tokenizer, start the scheduler, finish or roll back any
crashed compaction of every agent (``recover_agent``), start the watches, count
every MEMORY.md (reusing the stored count of files that did not change, in
parallel for the rest), evaluate every agent, then notify ``READY=1`` and log
``ready``.

Threads: the main thread only sleeps in short ticks and reacts to flags set
by signal handlers (the uvicorn pattern: a handler never does work itself);
the watcher thread turns file events into debounced count requests; one
counting thread counts due agents and feeds the per-agent job state machine
(:mod:`memd.core.jobs`); the scheduler runs compactions (a pool
sized ``daemon.max_concurrent_llm``), wake-ups and the periodic reconcile and
state-flush jobs.

Shutdown: SIGTERM/SIGINT stop new triggers and wait for in-flight compactions
to finish their commit; a second SIGINT forces: compactions abort at their
next pre-commit checkpoint (the transaction rolls back, never half-applied)
and the process exits without waiting for a slow LLM call. SIGHUP reloads the
config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from memd.compaction import CompactionOptions, CompactionOutcome, ThresholdCheck
from memd.core.config import AgentPolicy, MemdConfig, resolve_policy
from memd.core.debounce import Debouncer
from memd.core.jobs import (
    NOT_COMPACTABLE,
    AgentJob,
    Decision,
    JobState,
    RetryPolicy,
    on_busy_elsewhere,
    on_cancelled,
    on_count,
    on_failure,
    on_nothing_to_compact,
    on_started,
    on_success,
    restored_job,
    stored_state,
)
from memd.core.names import is_valid_agent_name, validate_agent_name
from memd.core.plan import FileFacts, StoredCountTrust, stored_count_trust
from memd.core.summary import Summarizer
from memd.core.tokens import CountState
from memd.counting import CountKind, TrackedCount, count_file
from memd.errors import (
    CompactionAborted,
    ConfigError,
    LockTimeout,
    MemdError,
    NothingToCompact,
    UnderThreshold,
    UnknownAgent,
)
from memd.logs import LogFormat, configure_logging, get_logger
from memd.notify import SystemdNotifier
from memd.recall.service import RecallService
from memd.recall.socket_server import socket_path_for
from memd.scheduler import JobScheduler
from memd.settings import LoadedConfig, load_settings
from memd.watcher import BackendKind, Watcher, default_backend_kind
from memd.workspace import (
    AGENTS_DIR,
    ARCHIVE_DIR,
    MEMORY_FILE,
    PRIVATE_DIR,
    AgentPaths,
    agent_paths,
    contained_path,
    require_workspace,
)

if TYPE_CHECKING:
    from memd.metrics import Metrics, MetricsServer
    from memd.state import AgentRecord, StateStore

_log = get_logger("memd.daemon")

EXIT_OK = 0
EXIT_FORCED = 130

# While the daemon compacts, another compactor (compact-now, a second daemon)
# holding the lock means "try again later", not "wait minutes holding a slot".
_DAEMON_LOCK_WAIT_S = 1.0
_MAIN_TICK_S = 0.2
# New counts reach the state DB (what `memd status` reads) within about this
# long, instead of waiting for the periodic flush (daemon.state_flush_s).
_LIVE_FLUSH_S = 1.0


class CompactFn(Protocol):
    def __call__(
        self,
        paths: AgentPaths,
        summarizer: Summarizer,
        options: CompactionOptions,
        *,
        count_bytes: Callable[[bytes], int] | None = ...,
        abort: threading.Event | None = ...,
        threshold: ThresholdCheck | None = ...,
    ) -> CompactionOutcome: ...


RecoverFn = Callable[[AgentPaths], "str | None"]
SummarizerFactory = Callable[[MemdConfig, Callable[[str], int]], Summarizer]
CountedHook = Callable[[str, int], None]


class _Counter(Protocol):
    def count_bytes(self, data: bytes) -> int: ...

    def count_text(self, text: str) -> int: ...


@dataclass(slots=True, eq=False)
class AgentEntry:
    name: str
    paths: AgentPaths
    policy: AgentPolicy
    tracked: TrackedCount | None = None
    job: AgentJob = field(default_factory=AgentJob)
    count_error: str | None = None
    dirty: bool = True
    burst_started: float | None = None  # monotonic time of the first unhandled event
    may_need_recovery: bool = True
    count_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def tokens(self) -> int:
        return 0 if self.tracked is None else self.tracked.tokens


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


def _context_length_lookup() -> Callable[[str], int | None] | None:
    try:
        module = importlib.import_module("memd.modelinfo")
    except ImportError:
        return None
    lookup: Callable[[str], int | None] = module.context_length_for_model
    return lookup


def _default_compact() -> CompactFn:
    from memd.compaction import compact_agent

    return compact_agent


def _default_recover() -> RecoverFn:
    from memd.compaction import recover_agent

    return recover_agent


def _default_summarizer(config: MemdConfig, count_text: Callable[[str], int]) -> Summarizer:
    from memd.summarizers import make_summarizer

    return make_summarizer(config.summarizer, count_text)


def _default_counter(encoding: str) -> _Counter:
    from memd.tokenizer import TokenCounter

    return TokenCounter(encoding)


# Below this many bytes to count, forking workers costs more than it saves.
_POOL_MIN_BYTES = 8 << 20

# (tracked, kind, failure reason); tracked None with no failure = no MEMORY.md yet.
_PoolResult = tuple["TrackedCount | None", CountKind, "str | None"]


class _CountFailed(MemdError):
    """A count that failed in a scan worker process (the reason travels as text)."""


def _pool_count(job: tuple[str, TrackedCount | None]) -> _PoolResult:
    """Runs in a forked scan worker: count one file with the inherited tokenizer."""
    path, previous = job
    if not _POOL_COUNTER:
        _POOL_COUNTER.append(_default_counter(_POOL_ENCODING[0]))
    counter = _POOL_COUNTER[0]
    try:
        tracked, kind = count_file(Path(path), previous, counter.count_bytes)
    except FileNotFoundError:
        return None, CountKind.RECOUNTED, None
    except (OSError, MemdError, ValueError) as exc:
        return None, CountKind.RECOUNTED, _reason(exc)
    return tracked, kind, None


# The encoding name the scan workers use (set in the parent before forking),
# and each worker's counter (made on its first job; the encoding is inherited).
_POOL_ENCODING: list[str] = []
_POOL_COUNTER: list[_Counter] = []


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, MemdError) and exc.strerror:
        name = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{name}"
    return str(exc) or type(exc).__name__


class Daemon:
    def __init__(
        self,
        loaded: LoadedConfig,
        options: DaemonOptions | None = None,
        *,
        compact: CompactFn | None = None,
        recover: RecoverFn | None = None,
        summarizer_factory: SummarizerFactory | None = None,
        counter_factory: Callable[[str], _Counter] | None = None,
        notifier: SystemdNotifier | None = None,
        environ: Mapping[str, str] | None = None,
        on_counted: CountedHook | None = None,
    ) -> None:
        self.options = options or DaemonOptions()
        self.config = loaded.config
        self.workspace = loaded.workspace
        self._env_overrides = loaded.env_overrides
        self._compact = compact
        self._recover = recover
        self._summarizer_factory = summarizer_factory or _default_summarizer
        self._counter_factory = counter_factory or _default_counter
        self._environ = os.environ if environ is None else environ
        self.notifier = notifier or SystemdNotifier(self._environ)
        self._on_counted = on_counted
        self._context_length_of = _context_length_lookup()

        self._lock = threading.RLock()  # agents table, job states
        self._agents: dict[str, AgentEntry] = {}
        self._removed: set[str] = set()
        self._flush_lock = threading.Lock()
        self._last_flush = 0.0
        self._rejected: dict[str, str] = {}
        self._running: set[str] = set()
        self._summarizer: Summarizer | None = None
        self._counter: _Counter | None = None
        self.retry_policy = RetryPolicy.from_config(self.config.daemon)

        self._count_cond = threading.Condition()
        self._debouncer: Debouncer[str] = self._new_debouncer()
        self._count_now: set[str] = set()
        self._rescan_requested = False
        self._count_thread: threading.Thread | None = None

        self.scheduler: JobScheduler | None = None
        self.watcher: Watcher | None = None
        self.store: StateStore | None = None
        self.recall: RecallService | None = None
        self.metrics: Metrics | None = None
        self._metrics_server: MetricsServer | None = None

        # Flags set by signal handlers (and by tests, through the methods).
        self.should_exit = False
        self.force_exit = False
        # Set once a forced exit is seen (by the main thread, not the signal
        # handler): in-flight compactions roll back at their next checkpoint.
        self._abort = threading.Event()
        self._reload_requested = False
        self._stopping = False
        self.ready = threading.Event()
        self.stopped = threading.Event()
        self.started_at = time.time()
        self.compactions_ok = 0
        self.compactions_failed = 0
        self._previous_handlers: dict[int, Any] = {}
        self._last_status = ""
        self._root = self.workspace
        self._agents_root = self.workspace / AGENTS_DIR
        self._agents_dir_plain = False

    # ------------------------------------------------------------------ control

    def request_exit(self, force: bool = False) -> None:
        if force or (self.should_exit and not self.force_exit):
            self.force_exit = force or self.should_exit
        self.should_exit = True

    def request_reload(self) -> None:
        self._reload_requested = True

    def _handle_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only flags here: the main loop does the work (no locks in handlers).
        if signum == signal.SIGHUP:
            self._reload_requested = True
        elif signum == signal.SIGINT and self.should_exit:
            self.force_exit = True
        else:
            self.should_exit = True

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._previous_handlers[sig] = signal.signal(sig, self._handle_signal)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        self._previous_handlers.clear()

    # ---------------------------------------------------------------- lifecycle

    def run(self) -> int:
        """Run until asked to stop; returns the process exit code."""
        if self.options.install_signal_handlers:
            self._install_signal_handlers()
        started = False
        try:
            self._startup()
            started = True
            self._main_loop()
        finally:
            code = self._shutdown(quiet=not started)
            self._restore_signal_handlers()
            self.stopped.set()
        return code

    def _startup(self) -> None:
        require_workspace(self.workspace)
        self._warn_about_filesystem()
        self._root = self.workspace.resolve()
        self._agents_root = self._root / AGENTS_DIR
        self._agents_dir_plain = not self._agents_root.is_symlink()
        with contextlib.suppress(OSError):
            (self.workspace / AGENTS_DIR).mkdir(exist_ok=True)
        self._counter = self._counter_factory(self.config.tokenizer.encoding)
        if self.options.state_dir is not None:
            from memd.state import StateStore

            self.store = StateStore.open(self.options.state_dir, self.workspace)
            for warning in self.store.warnings:
                _log.warning("state database", detail=warning)
        records = self._stored_records()
        scanned = self._scan_agents()
        entries = [
            e for e in (self._make_entry(name, link) for name, link in sorted(scanned.items())) if e
        ]
        recover = self._recover or _default_recover()
        for entry in entries:
            self._recover_one(recover, entry)
        with self._lock:
            for entry in entries:
                self._agents[entry.name] = entry
            self._removed.update(set(records) - set(self._agents))
        # Counted before any thread exists, so the scan may fork a process
        # pool safely; changes made meanwhile are caught just below.
        self._initial_count(entries, records)
        # Threads only after the initial count (it may fork a process pool).
        self._start_recall()

        self._start_metrics()
        self.scheduler = JobScheduler(compaction_slots=self.config.daemon.max_concurrent_llm)
        self.scheduler.start()
        poll = self.config.watch.poll if self.options.poll is None else self.options.poll
        kind: BackendKind = default_backend_kind(poll)
        self.watcher = Watcher(
            self.workspace, self, kind=kind, poll_interval_s=self.config.watch.poll_interval_s
        )
        self.watcher.start()
        self.watcher.sync({e.name: e.paths.dir for e in entries})
        # Watches are live: anything written during the scan shows in a stat
        # (size, inode, mtime) and is counted now, incrementally.
        for entry in entries:
            if entry.count_error is None and self._changed_on_disk(entry):
                self._count_locked(entry)

        self._count_thread = threading.Thread(
            target=self._count_loop, name="memd-count", daemon=True
        )
        self._count_thread.start()
        self._schedule_periodic()
        for entry in entries:
            self._evaluate(entry)
        self._flush_state()
        status = self._status_text()
        self.notifier.ready(status)
        self.ready.set()
        _log.info(
            "ready",
            workspace=str(self.workspace),
            agents=len(entries),
            watcher=kind,
            state_db=str(self.store.path) if self.store else None,
            summarizer=self.config.summarizer.model,
            # Proof for operators (and tests) that litellm stays unloaded until
            # a summary is made with a litellm model.
            litellm_loaded="litellm" in sys.modules,
            # MEMD_* variables win over memd.toml; systemd reads
            # EnvironmentFile= only at start, never on reload.
            env_overrides=list(self._env_overrides),
        )

    def _warn_about_filesystem(self) -> None:
        # NFS without lockd, CIFS and Docker Desktop shares (virtiofs, gRPC
        # FUSE) break flock between hosts/VMs and drop inotify events: say so
        # at start, where operators look, not only in `memd doctor`.
        from memd.doctor import check_filesystem

        for check in check_filesystem(self.workspace):
            if check.status != "ok":
                _log.warning("workspace filesystem", detail=check.message, fix=check.fix)

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

    def _shutdown(self, quiet: bool = False) -> int:
        """Stop everything that started; ``quiet`` after a failed start-up
        (the caller reports that error, not a clean stop)."""
        self._stopping = True
        self.notifier.stopping()
        if not quiet:
            _log.info("stopping", compacting=sorted(self._running))
        if self.watcher is not None:
            self.watcher.stop()
        with self._count_cond:
            self._count_cond.notify_all()
        if self._count_thread is not None:
            self._count_thread.join(timeout=10)
        if self.scheduler is not None:
            # Graceful: let running compactions finish their commit. Watch for
            # a second SIGINT meanwhile (this is still the main thread).
            waiter = threading.Thread(
                target=self.scheduler.shutdown, kwargs={"wait": True}, daemon=True
            )
            waiter.start()
            while waiter.is_alive() and not self.force_exit:
                waiter.join(timeout=_MAIN_TICK_S)
            if self.force_exit:
                self._abort.set()
            if self.force_exit and waiter.is_alive():
                _log.warning("forced exit; in-flight compactions abort before their commit")
                # Give them a moment to reach a checkpoint and roll back.
                waiter.join(timeout=2.0)
        with self._lock:
            for entry in self._agents.values():
                if entry.job.state is JobState.PENDING:
                    entry.job = on_cancelled(entry.job)
                    entry.dirty = True
        with contextlib.suppress(Exception):
            self._flush_state(final=True)
        if self.recall is not None:
            with contextlib.suppress(Exception):
                self.recall.stop()
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.clear_heartbeat(os.getpid())
            with contextlib.suppress(Exception):
                self.store.close()
        if self._metrics_server is not None:
            with contextlib.suppress(Exception):
                self._metrics_server.close()
        self.notifier.close()
        code = EXIT_FORCED if self.force_exit else EXIT_OK
        if not quiet:
            _log.info("stopped", exit_code=code)
        return code

    def healthy(self) -> bool:
        return (
            self.watcher is not None
            and self.watcher.is_alive()
            and self.scheduler is not None
            and self.scheduler.is_alive()
            and self._count_thread is not None
            and self._count_thread.is_alive()
        )

    # ------------------------------------------------------------------- agents

    def _policy(self, name: str) -> AgentPolicy:
        return resolve_policy(self.config, name, self._context_length_of)

    def _scan_agents(self) -> dict[str, bool]:
        """Agent folder names under ``agents/`` (valid names only) -> is it a symlink.

        Like ``workspace.list_agents`` but keeps what ``scandir`` already knows,
        so a 10,000-agent workspace costs one directory read, not 10,000 lstats.
        """
        found: dict[str, bool] = {}
        try:
            listing = os.scandir(self._root / AGENTS_DIR)
        except (FileNotFoundError, NotADirectoryError):
            return found
        with listing:
            for item in listing:
                if not is_valid_agent_name(item.name):
                    self._note_invalid_name(item)
                    continue
                try:
                    if item.is_dir(follow_symlinks=True):
                        found[item.name] = item.is_symlink()
                except OSError:
                    continue
        return found

    def _note_invalid_name(self, item: os.DirEntry[str]) -> None:
        # Hidden entries (.git, .DS_Store) are expected; anything else that
        # cannot be an agent name is said once, so a fleet with a badly named
        # agent folder is not silently left uncounted.
        if item.name.startswith(".") or item.name in self._rejected:
            return
        try:
            is_folder = item.is_dir(follow_symlinks=False)
        except OSError:
            return
        if is_folder:
            try:
                validate_agent_name(item.name)
            except MemdError as exc:
                self._rejected[item.name] = str(exc)
                _log.warning("agent skipped", agent=repr(item.name), error=str(exc))

    def _paths_of(self, name: str, is_link: bool | None = None) -> tuple[AgentPaths, bool]:
        """The agent's paths and whether it has a ``.memd/`` dir (maybe a crashed job).

        ``agent_paths`` resolves every path to refuse symlinks that escape the
        workspace: ~20 syscalls per agent, seconds for 10,000 agents at start-up.
        One ``scandir`` of the agent folder tells which entries are symlinks;
        only then is the full check needed.
        """
        root = self._root
        agent_dir = self._agents_root / name
        if is_link is None:
            is_link = agent_dir.is_symlink()
        if not self._agents_dir_plain or is_link or not is_valid_agent_name(name):
            paths = agent_paths(self.workspace, name)
            return paths, paths.private_dir.is_dir()
        try:
            with os.scandir(agent_dir) as listing:
                special = {
                    item.name: item.is_symlink()
                    for item in listing
                    if item.name in (MEMORY_FILE, ARCHIVE_DIR, PRIVATE_DIR)
                }
        except NotADirectoryError:
            raise UnknownAgent(f"unknown agent {name!r}: {agent_dir} is not a folder") from None
        except FileNotFoundError:
            raise UnknownAgent(f"unknown agent {name!r}: no folder {agent_dir}") from None
        if any(special.values()):
            paths = agent_paths(self.workspace, name)
            return paths, paths.private_dir.is_dir()
        paths = AgentPaths(
            workspace=root,
            agent=name,
            dir=agent_dir,
            memory=agent_dir / MEMORY_FILE,
            archive_dir=agent_dir / ARCHIVE_DIR,
            private_dir=agent_dir / PRIVATE_DIR,
        )
        return paths, PRIVATE_DIR in special

    def _make_entry(self, name: str, is_link: bool | None = None) -> AgentEntry | None:
        try:
            paths, has_private = self._paths_of(name, is_link)
        except (MemdError, OSError) as exc:
            reason = str(exc)
            if self._rejected.get(name) != reason:
                _log.warning("agent skipped", agent=name, error=reason)
            self._rejected[name] = reason
            return None
        self._rejected.pop(name, None)
        return AgentEntry(
            name=name, paths=paths, policy=self._policy(name), may_need_recovery=has_private
        )

    def _recover_one(self, recover: RecoverFn, entry: AgentEntry) -> None:
        if not entry.may_need_recovery:
            return  # no .memd/: never compacted, nothing to finish
        try:
            done = recover(entry.paths)
        except Exception as exc:
            _log.error("recovery failed", agent=entry.name, error=_reason(exc))
            return
        if done:
            _log.warning("recovered an interrupted compaction", agent=entry.name, action=done)

    def _stored_records(self) -> dict[str, AgentRecord]:
        if self.store is None:
            return {}
        try:
            return {record.agent: record for record in self.store.agents()}
        except Exception as exc:
            _log.warning("state database unreadable; counting every file", error=_reason(exc))
            return {}

    def _restore(self, entry: AgentEntry, record: AgentRecord) -> bool:
        """Reuse a stored count when the file is the same inode and size."""
        entry.job = restored_job(
            record.state,
            consecutive_failures=record.consecutive_failures,
            last_error=record.last_error,
            last_compaction_at=record.last_compaction_at,
            next_attempt_at=record.next_attempt_at,
            now=time.time(),
        )
        try:
            info = os.stat(entry.paths.memory)
        except OSError:
            return False
        trust = stored_count_trust(
            FileFacts(record.dev, record.ino, record.size, record.mtime_ns),
            FileFacts(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns),
            tokens=record.tokens,
            safe_tokens=record.safe_tokens,
            stored_encoding=record.encoding,
            encoding=self.config.tokenizer.encoding,
            has_window_digest=record.window_digest is not None,
        )
        if trust is StoredCountTrust.RECOUNT:
            return False
        count = CountState(
            dev=record.dev,
            ino=record.ino,
            size=record.size,
            safe_offset=record.safe_offset,
            safe_tokens=record.safe_tokens,
            tail_tokens=record.tokens - record.safe_tokens,
        )
        # The stored window digest is verified by the next incremental count,
        # so a file truncated and regrown past its old size is recounted.
        entry.tracked = TrackedCount(
            count,
            record.mtime_ns if info.st_size == record.size else 0,
            record.window_start,
            record.window_digest,
        )
        if trust is StoredCountTrust.EXTEND:
            return False  # grew while we were down: count just the new bytes
        entry.dirty = False
        return True

    def _initial_count(self, entries: list[AgentEntry], records: Mapping[str, AgentRecord]) -> None:
        to_count = [
            entry
            for entry in entries
            if entry.name not in records or not self._restore(entry, records[entry.name])
        ]
        if not to_count:
            return
        started = time.monotonic()
        workers = max(1, min(len(to_count), os.cpu_count() or 1))
        mode = "serial"
        if workers > 1 and self._pool_worth_it(to_count):
            mode = "processes"
            self._count_in_processes(to_count, workers)
        elif workers > 1:
            # tiktoken releases the GIL for part of its work: threads help some.
            mode = "threads"
            with ThreadPoolExecutor(workers, thread_name_prefix="memd-scan") as pool:
                list(pool.map(self._count_locked, to_count))
        else:
            for entry in to_count:
                self._count_locked(entry)
        _log.info(
            "initial count",
            counted=len(to_count),
            reused=len(entries) - len(to_count),
            mode=mode,
            seconds=round(time.monotonic() - started, 3),
        )

    def _pool_worth_it(self, entries: list[AgentEntry]) -> bool:
        """A process pool pays for its fork only on a large cold scan, and only
        with the real tokenizer (a test's counter may not survive a fork)."""
        if self._counter_factory is not _default_counter or threading.active_count() > 1:
            return False
        total = 0
        for entry in entries:
            with contextlib.suppress(OSError):
                total += os.stat(entry.paths.memory).st_size
            if total >= _POOL_MIN_BYTES:
                return True
        return False

    def _count_in_processes(self, entries: list[AgentEntry], workers: int) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        jobs: list[tuple[AgentEntry, tuple[str, TrackedCount | None]]] = []
        for entry in entries:
            try:
                self._check_contained(entry)
            except MemdError:
                self._count_locked(entry)  # records the refusal
                continue
            jobs.append((entry, (str(entry.paths.memory), entry.tracked)))
        _POOL_ENCODING[:] = [self.config.tokenizer.encoding]
        # fork: no other thread exists yet (checked by the caller), and the
        # children inherit the loaded encoding instead of loading it again.
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            chunk = max(1, len(jobs) // (workers * 8))
            results = pool.map(_pool_count, [job for _, job in jobs], chunksize=chunk)
            for (entry, _job), result in zip(jobs, results, strict=True):
                with entry.count_lock:
                    self._count(entry, result)

    def _add_agent(self, name: str) -> None:
        entry = self._make_entry(name)
        if entry is None:
            return
        self._recover_one(self._recover or _default_recover(), entry)
        with self._lock:
            if name in self._agents:
                return
            self._agents[name] = entry
            self._removed.discard(name)
        _log.info("agent added", agent=name)
        if self.watcher is not None:
            self.watcher.sync(self._agent_dirs())
        self._request_count(name, now=True)

    def _remove_agent(self, name: str) -> None:
        with self._lock:
            entry = self._agents.pop(name, None)
            if entry is None:
                return
            self._removed.add(name)
        with self._count_cond:
            self._debouncer.cancel(name)
            self._count_now.discard(name)
        if self.scheduler is not None:
            self.scheduler.cancel(f"wake:{name}")
        if self.watcher is not None:
            self.watcher.unwatch(name)
        if self.metrics is not None:
            self.metrics.remove_agent(name)
        _log.info("agent removed", agent=name)

    def _agent_dirs(self) -> dict[str, Path]:
        with self._lock:
            return {name: entry.paths.dir for name, entry in self._agents.items()}

    def agents(self) -> dict[str, AgentEntry]:
        with self._lock:
            return dict(self._agents)

    # ------------------------------------------------------------- watch events

    def agents_changed(self, name: str | None) -> None:
        """Watcher hint: ``agents/`` changed; reconcile soon (not on this thread)."""
        with self._count_cond:
            self._rescan_requested = True
            self._count_cond.notify_all()

    def memory_changed(self, agent: str) -> None:
        self._request_count(agent)

    def _request_count(self, agent: str, now: bool = False) -> None:
        with self._count_cond:
            if now:
                self._count_now.add(agent)
            else:
                self._debouncer.touch(agent, time.monotonic())
            self._count_cond.notify_all()
        if not now:
            entry = self._agents.get(agent)
            if entry is not None and entry.burst_started is None:
                entry.burst_started = time.monotonic()

    # ----------------------------------------------------------------- counting

    def _count_loop(self) -> None:
        while not self._stopping:
            try:
                self._count_tick()
            except Exception:
                _log.exception("counting loop error")
                time.sleep(0.5)

    def _count_tick(self) -> None:
        with self._count_cond:
            due = self._debouncer.pop_due(time.monotonic())
            if self._count_now:
                due.extend(self._count_now - set(due))
                self._count_now.clear()
            rescan = self._rescan_requested
            self._rescan_requested = False
            if not due and not rescan:
                deadline = self._debouncer.next_deadline()
                timeout = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
                self._count_cond.wait(min(timeout, 1.0))
                return
        if rescan:
            self._reconcile_agents()
        for name in due:
            if self._stopping:
                return
            entry = self._agents.get(name)
            if entry is None:
                continue
            try:
                if self._count_locked(entry):
                    self._evaluate(entry)
            except Exception:  # one agent's surprise must not drop the rest of `due`
                _log.exception("counting failed", agent=name)
        if due and self.store is not None and time.monotonic() - self._last_flush >= _LIVE_FLUSH_S:
            self._flush_state()

    def _count_locked(self, entry: AgentEntry) -> bool:
        with entry.count_lock:
            return self._count(entry)

    @staticmethod
    def _check_contained(entry: AgentEntry) -> None:
        contained_path(entry.paths.memory, entry.paths.workspace, f"agent {entry.name!r} MEMORY.md")

    def _count(self, entry: AgentEntry, precounted: _PoolResult | None = None) -> bool:
        """Update the entry's count; False (logged once) when the file cannot be counted."""
        counter = self._counter
        assert counter is not None
        started = entry.burst_started
        entry.burst_started = None
        before = entry.tokens
        try:
            if precounted is not None:
                tracked, kind, failure = precounted
                if failure is not None:
                    raise _CountFailed(failure)
            else:
                self._check_contained(entry)
                tracked, kind = count_file(entry.paths.memory, entry.tracked, counter.count_bytes)
        except FileNotFoundError:
            tracked, kind = None, CountKind.RECOUNTED
            self._reset_if_erased(entry)
        except (OSError, MemdError, ValueError) as exc:
            reason = _reason(exc)
            if entry.count_error != reason:
                _log.warning("cannot count MEMORY.md; will retry", agent=entry.name, error=reason)
            entry.count_error = reason
            entry.tracked = None
            entry.dirty = True
            return False
        if entry.count_error is not None:
            _log.info("MEMORY.md readable again", agent=entry.name)
        entry.count_error = None
        entry.tracked = tracked
        if kind is not CountKind.UNCHANGED or entry.tokens != before:
            entry.dirty = True
        if kind is CountKind.RECOUNTED or entry.tokens != before:
            _log.debug("counted", agent=entry.name, tokens=entry.tokens, kind=str(kind))
        if self.metrics is not None:
            self.metrics.set_agent(entry.name, entry.tokens, entry.policy.threshold_tokens)
            if started is not None:
                self.metrics.set_watcher_lag(time.monotonic() - started)
        if self._on_counted is not None:
            self._on_counted(entry.name, entry.tokens)
        return True

    def _reset_if_erased(self, entry: AgentEntry) -> None:
        # No MEMORY.md and no archive: the agent's memory was erased (`memd
        # forget`, or by hand). Its past (last compaction, failures, a breaker)
        # goes with it, or the next state flush would write it back.
        if entry.paths.archive_dir.exists():
            return
        with self._lock:
            if entry.job.state not in (JobState.PENDING, JobState.RUNNING) and (
                entry.job != AgentJob()
            ):
                entry.job = AgentJob()
                entry.dirty = True

    # --------------------------------------------------------------- scheduling

    def _evaluate(self, entry: AgentEntry) -> None:
        with self._lock:
            if self._stopping or entry.count_error is not None:
                return
            if self._agents.get(entry.name) is not entry:
                return
            decision = on_count(
                entry.job,
                entry.tokens,
                entry.policy.threshold_tokens,
                entry.policy.compress,
                time.time(),
            )
            self._apply(entry, decision)

    def _apply(self, entry: AgentEntry, decision: Decision) -> None:
        if decision.job != entry.job:
            entry.dirty = True
        entry.job = decision.job
        scheduler = self.scheduler
        if scheduler is None or self._stopping:
            return
        if decision.start:
            _log.info(
                "compaction queued",
                agent=entry.name,
                tokens=entry.tokens,
                threshold=entry.policy.threshold_tokens,
            )
            scheduler.submit(f"compact:{entry.name}", self._compaction_job, entry)
        if decision.wake_at is not None:
            scheduler.wake_at(f"wake:{entry.name}", decision.wake_at, self._wake, entry.name)

    def _reevaluate(self, entry: AgentEntry, job: AgentJob) -> Decision:
        return on_count(
            job, entry.tokens, entry.policy.threshold_tokens, entry.policy.compress, time.time()
        )

    def _wake(self, agent: str) -> None:
        self._request_count(agent, now=True)

    def _get_summarizer(self) -> Summarizer:
        with self._lock:
            if self._summarizer is None:
                assert self._counter is not None
                self._summarizer = self._summarizer_factory(self.config, self._counter.count_text)
            return self._summarizer

    def _compaction_options(self, policy: AgentPolicy) -> CompactionOptions:
        options = CompactionOptions.from_config(self.config, policy)
        return dataclasses.replace(
            options,
            lock_wait_s=min(options.lock_wait_s, _DAEMON_LOCK_WAIT_S),
            on_archived=self.recall.on_archived if self.recall is not None else None,
        )

    def _start_recall(self) -> None:
        if self.options.state_dir is None:
            return
        self.recall = RecallService.open(self.options.state_dir, self.workspace)
        if self.recall is not None:
            self.recall.start(self._agent_paths_now)
            self.recall.serve(
                self._root, socket_path_for(self.config.recall.socket, self.workspace)
            )

    def _agent_paths_now(self) -> list[AgentPaths]:
        with self._lock:
            return [entry.paths for entry in self._agents.values()]

    def _compaction_job(self, entry: AgentEntry) -> None:
        try:
            self._compact_one(entry)
        finally:
            # `memd status` and the ledger readers see the result at once,
            # not at the next periodic flush.
            if not self._stopping:
                self._flush_state()

    def _compact_one(self, entry: AgentEntry) -> None:
        name = entry.name
        with self._lock:
            if self._stopping or self._agents.get(name) is not entry:
                entry.job = on_cancelled(entry.job)
                entry.dirty = True
                return
            entry.job = on_started(entry.job)
            entry.dirty = True
            self._running.add(name)
            tokens_before = entry.tokens
            # The transaction re-checks this count under the agent's lock.
            threshold = ThresholdCheck(entry.tracked, entry.policy.threshold_tokens)
        _log.info("compaction started", agent=name, tokens=tokens_before)
        started_wall = time.time()
        started = time.monotonic()
        outcome: CompactionOutcome | None = None
        error: BaseException | None = None
        try:
            compact = self._compact or _default_compact()
            outcome = compact(
                entry.paths,
                self._get_summarizer(),
                self._compaction_options(entry.policy),
                count_bytes=self._counter.count_bytes if self._counter else None,
                abort=self._abort,
                threshold=threshold,
            )
        except Exception as exc:
            error = exc
        finally:
            with self._lock:
                self._running.discard(name)
        duration = time.monotonic() - started
        # The file was replaced (or not): count it again before deciding.
        try:
            self._count_locked(entry)
        except Exception:  # the job's outcome must still be applied below
            _log.exception("recount after compaction failed", agent=name)
        now = time.time()
        policy = self.retry_policy
        if error is None:
            self.compactions_ok += 1
            assert outcome is not None
            achieved = outcome.tokens_after
            _log.info(
                "compacted",
                agent=name,
                tokens_before=outcome.tokens_before,
                tokens_after=achieved,
                archive=str(outcome.archive),
                model=outcome.model,
                cost_usd=outcome.cost_usd,
                seconds=round(duration, 3),
            )
            self._ledger(entry, started_wall, duration, outcome, None)
            if self.metrics is not None:
                self.metrics.record_compaction(
                    name,
                    "ok",
                    llm_seconds=outcome.llm_duration_s,
                    cost_usd=outcome.cost_usd,
                )
            with self._lock:
                decision = on_success(
                    entry.job,
                    achieved_tokens=achieved,
                    current_tokens=entry.tokens,
                    threshold_tokens=entry.policy.threshold_tokens,
                    low_water_tokens=entry.policy.low_water_tokens,
                    policy=policy,
                    now=now,
                )
                if decision.job.state is JobState.COOLDOWN:
                    _log.warning(
                        "compaction ended above the low-water mark; cooling down",
                        agent=name,
                        tokens_after=achieved,
                        low_water=entry.policy.low_water_tokens,
                        cooldown_s=policy.cooldown_s,
                    )
                self._apply(entry, decision)
            return
        if isinstance(error, UnderThreshold):
            _log.info("already under threshold; skipped", agent=name, tokens=entry.tokens)
            with self._lock:
                self._apply(entry, self._reevaluate(entry, on_cancelled(entry.job)))
            return
        if isinstance(error, NothingToCompact):
            if entry.job.last_error != NOT_COMPACTABLE:  # say it once, not every cooldown
                _log.warning(
                    "over threshold but nothing to compact; cooling down",
                    agent=name,
                    tokens=entry.tokens,
                    detail=NOT_COMPACTABLE,
                )
            if self.metrics is not None:
                self.metrics.record_compaction(name, "nothing")
            with self._lock:
                self._apply(entry, on_nothing_to_compact(entry.job, policy=policy, now=now))
            return
        if isinstance(error, LockTimeout):
            _log.info("agent is being compacted by another process; retrying later", agent=name)
            with self._lock:
                self._apply(entry, on_busy_elsewhere(entry.job, policy=policy, now=now))
            return
        reason = _reason(error)
        self.compactions_failed += 1
        if not isinstance(error, (MemdError, OSError)):
            _log.error(
                "compaction crashed",
                agent=name,
                error=reason,
                exc_info=(type(error), error, error.__traceback__),
            )
        self._ledger(entry, started_wall, duration, None, reason)
        if self.metrics is not None:
            aborted = isinstance(error, CompactionAborted)
            self.metrics.record_compaction(name, "aborted" if aborted else "error")
        with self._lock:
            decision = on_failure(entry.job, reason, policy=policy, now=now)
            _log.warning(
                "compaction failed",
                agent=name,
                error=reason,
                failures=decision.job.consecutive_failures,
                state=str(decision.job.state),
                retry_at=decision.wake_at,
            )
            self._apply(entry, decision)

    def _ledger(
        self,
        entry: AgentEntry,
        started_at: float,
        duration: float,
        outcome: CompactionOutcome | None,
        error: str | None,
    ) -> None:
        if self.store is None:
            return
        from memd.state import LedgerEntry

        record = LedgerEntry.of(
            entry.name,
            "daemon",
            started_at=started_at,
            duration_s=duration,
            outcome=outcome,
            error=error,
            model=self._summarizer.model if self._summarizer is not None else None,
        )
        try:
            self.store.record_compaction(record)
        except Exception as exc:
            _log.warning("cannot write the ledger", agent=entry.name, error=_reason(exc))

    # ------------------------------------------------------------ periodic jobs

    def _schedule_periodic(self) -> None:
        assert self.scheduler is not None
        self.scheduler.every("reconcile", self.config.watch.reconcile_s, self.reconcile)
        self.scheduler.every("state-flush", self.config.daemon.state_flush_s, self._flush_state)

    def reconcile(self) -> None:
        """The source of truth: rescan agents and stat every MEMORY.md."""
        if self._stopping:
            return
        try:
            self._reconcile()
        except Exception:
            _log.exception("reconcile failed")

    def _reconcile(self) -> None:
        watcher = self.watcher
        restarted = False
        if watcher is not None and not watcher.is_alive() and not self._stopping:
            _log.warning("watcher thread died; restarting it")
            watcher.restart()
            restarted = True
        self._reconcile_agents(force_sync=restarted)
        now = time.time()
        for entry in self.agents().values():
            if restarted or entry.count_error is not None or self._changed_on_disk(entry):
                self._request_count(entry.name, now=True)
            elif (
                entry.job.state in (JobState.COOLDOWN, JobState.BACKOFF, JobState.BREAKER_OPEN)
                and entry.job.next_attempt_at is not None
                and entry.job.next_attempt_at <= now
            ):
                self._evaluate(entry)  # safety net for a lost wake-up

    def _reconcile_agents(self, force_sync: bool = False) -> None:
        names = set(self._scan_agents())
        with self._lock:
            known = set(self._agents)
        for name in sorted(names - known):
            self._add_agent(name)
        for name in sorted(known - names):
            self._remove_agent(name)
        if self.watcher is None:
            return
        # Agents whose watch went away (their folder was replaced under the
        # same name) are watched again and recounted: events may have been missed.
        unwatched = (names & known) - self.watcher.watched()
        if force_sync or names != known or self.watcher.failed or unwatched:
            self.watcher.sync(self._agent_dirs())
            for name in sorted(unwatched):
                self._request_count(name, now=True)

    @staticmethod
    def _changed_on_disk(entry: AgentEntry) -> bool:
        try:
            info = os.stat(entry.paths.memory)
        except FileNotFoundError:
            return entry.tracked is not None
        except OSError:
            return True
        tracked = entry.tracked
        if tracked is None:
            return True
        state = tracked.state
        return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != (
            state.dev,
            state.ino,
            state.size,
            tracked.mtime_ns,
        )

    def _record_of(self, entry: AgentEntry, now: float) -> AgentRecord:
        from memd.state import AgentRecord

        state = entry.tracked.state if entry.tracked is not None else None
        job = entry.job
        return AgentRecord(
            agent=entry.name,
            dev=state.dev if state else 0,
            ino=state.ino if state else 0,
            size=state.size if state else 0,
            safe_offset=state.safe_offset if state else 0,
            safe_tokens=state.safe_tokens if state else 0,
            tokens=entry.tokens,
            threshold_tokens=entry.policy.threshold_tokens,
            updated_at=now,
            state=stored_state(job, count_failed=entry.count_error is not None),
            last_error=entry.count_error or job.last_error,
            last_compaction_at=job.last_compaction_at,
            consecutive_failures=job.consecutive_failures,
            next_attempt_at=job.next_attempt_at,
            mtime_ns=entry.tracked.mtime_ns if entry.tracked else 0,
            encoding=self.config.tokenizer.encoding,
            window_start=entry.tracked.window_start if entry.tracked else 0,
            window_digest=entry.tracked.window_digest if entry.tracked else None,
        )

    def _flush_state(self, final: bool = False) -> None:
        # Snapshot and write as one step: two flushes at once (the periodic job
        # and a compaction's) could otherwise write an older snapshot last.
        with self._flush_lock:
            self._flush_state_serialized(final)

    def _flush_state_serialized(self, final: bool) -> None:
        self._last_flush = time.monotonic()
        now = time.time()
        with self._lock:
            dirty = [entry for entry in self._agents.values() if entry.dirty]
            for entry in dirty:
                entry.dirty = False
            removed = list(self._removed)
            self._removed.clear()
            records = [self._record_of(entry, now) for entry in dirty]
        status = self._status_text()
        if self.store is not None:
            try:
                if records:
                    self.store.upsert_agents(records)
                for name in removed:
                    self.store.remove_agent(name)
                if not final:
                    self.store.write_heartbeat(
                        os.getpid(), self.started_at, self.healthy(), status, len(self._agents), now
                    )
            except Exception as exc:
                with self._lock:
                    for entry in dirty:
                        entry.dirty = True
                    self._removed.update(removed)
                _log.warning("cannot write the state database", error=_reason(exc))
        if not final and status != self._last_status:
            self._last_status = status
            self.notifier.status(status)

    def _status_text(self) -> str:
        with self._lock:
            agents = len(self._agents)
            running = len(self._running)
            pending = sum(1 for e in self._agents.values() if e.job.state is JobState.PENDING)
            errors = sum(
                1
                for e in self._agents.values()
                if e.count_error is not None
                or e.job.state in (JobState.BACKOFF, JobState.BREAKER_OPEN)
            )
        return (
            f"watching {agents} agents; {running} compacting, {pending} queued; "
            f"{self.compactions_ok} compacted, {self.compactions_failed} failed; "
            f"{errors} in error"
        )

    def _start_metrics(self) -> None:
        port = self.config.metrics.port
        if port <= 0:
            return
        try:
            from memd.metrics import start_metrics_server

            self._metrics_server = start_metrics_server(port, self.config.metrics.bind)
            self.metrics = self._metrics_server.metrics
        except Exception as exc:
            _log.warning("metrics server not started", port=port, error=_reason(exc))

    # ------------------------------------------------------------------- reload

    def _new_debouncer(self) -> Debouncer[str]:
        trigger = self.config.trigger
        return Debouncer(trigger.debounce_ms / 1000, trigger.max_wait_ms / 1000)

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
            self.notifier.ready(self._status_text())
            return
        if loaded.workspace != self.workspace:
            _log.warning(
                "workspace change needs a restart; keeping the current one",
                current=str(self.workspace),
                configured=str(loaded.workspace),
            )
        old = self.config
        new = loaded.config.model_copy(update={"workspace": str(self.workspace)})
        if self.options.config_transform is not None:
            new = self.options.config_transform(new)
        self.config = new
        self.retry_policy = RetryPolicy.from_config(new.daemon)
        configure_logging(
            self.options.log_format or new.log.format, self.options.log_level or new.log.level
        )
        with self._count_cond:
            pending = self._debouncer.keys()
            self._debouncer = self._new_debouncer()
            self._count_now.update(pending)
            self._count_cond.notify_all()
        with self._lock:
            self._summarizer = None  # rebuilt lazily with the new settings
            for entry in self._agents.values():
                entry.policy = self._policy(entry.name)
                entry.dirty = True
        recounting = False
        if new.tokenizer.encoding != old.tokenizer.encoding:
            try:
                counter = self._counter_factory(new.tokenizer.encoding)
            except MemdError as exc:
                _log.error("reload: tokenizer unavailable; keeping the old one", error=str(exc))
            else:
                self._counter = counter
                recounting = True
                for entry in self.agents().values():
                    # Under the count lock: a count still running with the old
                    # encoding finishes first, then its result is dropped.
                    with entry.count_lock:
                        entry.tracked = None
                    self._request_count(entry.name, now=True)
        if (
            new.watch.reconcile_s != old.watch.reconcile_s
            or new.daemon.state_flush_s != old.daemon.state_flush_s
        ):
            self._schedule_periodic()
        if new.daemon.max_concurrent_llm != old.daemon.max_concurrent_llm:
            _log.warning("daemon.max_concurrent_llm takes effect at the next restart")
        if new.watch.poll != old.watch.poll and self.options.poll is None:
            _log.warning("watch.poll takes effect at the next restart")
        if not recounting:
            # After an encoding change each agent is evaluated when its recount
            # lands: judged on "0 tokens" now, a breaker would look healed.
            for entry in self.agents().values():
                self._evaluate(entry)
        self.notifier.ready(self._status_text())
        _log.info(
            "reloaded",
            config=str(loaded.source) if loaded.source else None,
            # The environment is the one memd started with: `systemctl reload`
            # does not re-read EnvironmentFile=, so these keep their values.
            env_overrides=list(loaded.env_overrides),
        )


def run_daemon(loaded: LoadedConfig, options: DaemonOptions) -> int:
    return Daemon(loaded, options).run()


__all__ = [
    "EXIT_FORCED",
    "EXIT_OK",
    "AgentEntry",
    "CompactFn",
    "Daemon",
    "DaemonOptions",
    "run_daemon",
]
