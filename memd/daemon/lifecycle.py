"""The daemon's lifecycle: one signal rule, ordered start-up and shutdown, reload.

Start-up (in this order, so nothing is missed and READY means ready): the
checks operators should read at start, then the services built
(:class:`~memd.daemon.wiring.Services`: the state DB, the tokenizer, every
service linked to the next stage), every crashed compaction finished or rolled
back, every agent folder watched (inotify: before its MEMORY.md is stat'ed,
so a write after the stat is reported once the watcher's thread runs; other
watchers: the files are stat'ed again once they are live) and every MEMORY.md
counted (reusing the stored count of files that did not change, in parallel for
the rest; a file too large to count in a moment is counted right after READY
instead, so readiness never waits on one agent),
then the recall index, the metrics endpoint, the scheduler, retention, the
runner, the watches and the counter started (each stage before the one that
feeds it), every agent evaluated, ``READY=1`` notified and ``ready``
logged; then the periodic jobs and the recall re-sync (passes over every agent
that READY does not wait for). The cyclic GC is off until then. Each one
started pushes its stop on one exit stack (``start(stack)``), so shutdown is
the reverse of start-up by construction: ``STOPPING`` first, the feeders
stopped before the stages they feed, the final flush once the scheduler has
stopped.

Signals (uvicorn's shape): :meth:`Daemon.capture_signals` installs
:meth:`Daemon.handle_exit` and restores the previous handlers; the handler
only sets flags, the main loop does the work. SIGTERM/SIGINT stop new
triggers and wait for in-flight compactions to finish their commit; a second
SIGINT forces: compactions abort at their next pre-commit checkpoint (the
transaction rolls back, never half-applied) and the process exits without
waiting for a slow LLM call. SIGHUP reloads the config: each service is handed
the new one (``reconfigure``).
"""

from __future__ import annotations

import contextlib
import gc
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
from typing import Any

from memd.audit import AuditLog
from memd.core.audit import AuditEvent
from memd.core.config import MemdConfig
from memd.core.privacy import outbound_redaction
from memd.daemon import checks
from memd.daemon.entries import CountUpdate, ExitState, Tokenizer
from memd.daemon.registry import RecoverFn
from memd.daemon.runner import CompactFn, SummarizerFactory
from memd.daemon.wiring import Parts, Services, new_tokenizer, open_store
from memd.errors import ConfigError, MemdError, describe_error
from memd.logs import LogFormat, configure_logging, get_logger
from memd.notify import SystemdNotifier
from memd.settings import LoadedConfig, load_settings
from memd.state import ReloadOutcome
from memd.workspace import require_workspace

_log = get_logger("memd.daemon")

EXIT_OK = 0
EXIT_FORCED = 130
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_MAIN_TICK_S = 0.2


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
    # Called periodically: leave the workspace's state pointer again when the
    # daemon it names is gone (``memd run``; None: no pointer).
    claim_pointer: Callable[[], None] | None = None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection during start-up. Its allocations (a record, an
    entry, paths and a policy per agent) set off collections that walk the whole
    heap again and again: at 30,000 agents about half the pass's CPU. What it
    leaves in cycles is collected once the collector is back on."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


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
        # The tokenizer settings the counts are made with (a reload whose
        # tokenizer cannot be loaded is refused: see _reload).
        self._tokenizer_in_use = loaded.config.tokenizer
        self.workspace = loaded.workspace
        self._env_overrides = loaded.env_overrides
        self._parts = Parts(compact, recover, summarizer_factory, counter_factory, count_updates)
        self._environ = os.environ if environ is None else environ
        self.notifier = notifier or SystemdNotifier(self._environ)
        self.started_at = time.time()
        # Built at start-up (None before, or when start-up failed first).
        self.services: Services | None = None

        # The exit flags, set by the signal handler (and by tests, through it) and
        # read by the services that stop early; reload is the main loop's alone.
        self.state = ExitState()
        self.reload_requested = False
        self.ready = threading.Event()
        self.stopped = threading.Event()

    # ------------------------------------------------------------------ signals

    def handle_exit(self, signum: int, _frame: FrameType | None) -> None:
        """The one signal rule. Only flags here: the main loop does the work (no
        locks in handlers). A second SIGINT while exiting forces."""
        if signum == signal.SIGHUP:
            self.reload_requested = True
        elif signum == signal.SIGINT and self.state.should_exit:
            self.state.force_exit = True
        else:
            self.state.should_exit = True

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

    # ---------------------------------------------------------------- lifecycle

    def run(self) -> int:
        """Run until asked to stop; returns the process exit code."""
        started = False
        with self.capture_signals():
            stack = contextlib.ExitStack()
            try:
                with _gc_paused():
                    self._startup(stack)
                started = True
                self._main_loop()
            finally:
                code = self._shutdown(stack, quiet=not started)
                self.stopped.set()
        return code

    def _startup(self, stack: contextlib.ExitStack) -> None:
        require_workspace(self.workspace)
        checks.warn_about_filesystem(self.workspace)
        checks.check_archive_key(self.config)
        checks.check_model_windows(self.config)
        stack.callback(self.notifier.close)
        s = self.services = Services(
            self.config,
            self.workspace,
            self.options.state_dir,
            self._parts,
            self.notifier,
            started_at=self.started_at,
            exiting=self.state,
        )
        s.registry.start(stack)
        s.flusher.start(stack, open_store(self.options.state_dir, self.workspace))
        checks.warn_unredacted(self.config)
        s.runner.redaction_key = checks.redaction_key(self.options.state_dir, self.workspace)
        # Runs after the scheduler has stopped: queued jobs will not run now.
        stack.callback(s.final_flush)
        watches = s.new_watches(self.options.poll)
        entries, later, watched = s.load_agents((watches, stack))
        if self.state.should_exit:
            return  # SIGTERM during the count: stop before READY
        # Threads only after the initial count (it may fork a process pool). Each
        # stage starts before the one that feeds it and pushes its stop on the
        # stack: shutdown stops the feeders first (counter, watches), then the
        # runner (no new jobs), retention (the daily pass stops between agents),
        # the scheduler (waits for the jobs in flight, unless forced), metrics, recall.
        s.recall.start(stack)
        s.metrics.start(stack)
        scheduler = s.new_scheduler()
        scheduler.start(stack, self.state, s.runner.abort)
        s.retention.start(stack)
        s.runner.start(stack, scheduler)
        watches.start(stack)
        counted = [entry for entry in entries if entry not in later]
        if not watched:  # the pass's reads came before the watches: read again
            s.counter.recount_changed(counted)
            for entry in entries:  # memd-agent.json: an lstat each
                s.registry.refresh_window(entry.name)
        s.counter.start(stack)
        s.counter.count_later(later)
        # An agent counted after READY is evaluated when its count lands: judged
        # on "0 tokens" now, its restored breaker or backoff would look healed.
        s.runner.evaluate_all(counted)
        s.flusher.set_healthy(s.healthy())  # every thread started: the first heartbeat's
        s.runner.flush()
        self.notifier.ready(s.flusher.status_text())
        self.ready.set()
        store = s.flusher.store
        # memd.llm does not import litellm; it is imported only for a bare model
        # name with a local api_base (where it routes decides what is local).
        from memd.llm import litellm_provider

        _log.info(
            "ready",
            workspace=str(self.workspace),
            agents=len(entries),
            watcher=watches.watcher.kind,
            state_db=str(store.path) if store else None,
            summarizer=self.config.summarizer.model,
            # What that summarizer is sent (README "Privacy").
            redaction=outbound_redaction(self.config, litellm_provider),
            # Proof for operators (and tests) that litellm stays unloaded until
            # a summary is made with a litellm model.
            litellm_loaded="litellm" in sys.modules,
            # MEMD_* variables win over memd.toml; systemd reads
            # EnvironmentFile= only at start, never on reload.
            env_overrides=list(self._env_overrides),
        )
        # Background passes READY does not wait for, started once it is sent: at
        # 30,000 agents the recall re-sync (a pass over every agent) and the first
        # archive survey (1 s after scheduling) competed with the start-up's own
        # pass for the interpreter lock and delayed READY by seconds.
        s.claim_pointer = self.options.claim_pointer
        s.schedule_periodic()
        s.recall.resync()
        checks.warm_tokenizer(s.entry_counter.tokenizer)  # unless a count needed it already
        if self._parts.summarizer_factory is None:
            checks.warm_summarizer(self.config)

    def _main_loop(self) -> None:
        ping_every = self.notifier.watchdog_ping_interval_s
        next_ping = time.monotonic()
        while not self.state.should_exit:
            if self.reload_requested:
                self.reload_requested = False
                self._reload()
            # Probed here, handed down as a value: the flusher's heartbeat writes it.
            healthy = self.services is not None and self.services.healthy()
            if self.services is not None:
                self.services.flusher.set_healthy(healthy)
            if ping_every is not None and time.monotonic() >= next_ping:
                if healthy:
                    self.notifier.watchdog()
                next_ping = time.monotonic() + ping_every
            time.sleep(_MAIN_TICK_S)

    def _shutdown(self, stack: contextlib.ExitStack, quiet: bool = False) -> int:
        """Stop everything that started, in reverse (each start pushed its stop on
        ``stack``); ``quiet`` after a failed start-up (the caller reports that
        error, not a clean stop)."""
        s = self.services
        self.notifier.stopping()
        if not quiet:
            _log.info("stopping", compacting=s.runner.running() if s is not None else [])
        if s is not None:
            s.flusher.stopping()
        stack.close()
        code = EXIT_FORCED if self.state.force_exit else EXIT_OK
        if not quiet:
            _log.info("stopped", exit_code=code)
        return code

    # ------------------------------------------------------------------- reload

    def _reload(self) -> None:
        """Load the config again and hand it to every service (the fan-out)."""
        s = self.services
        assert s is not None  # reloads are taken by the main loop, after start-up
        # Taken before the file is read: `memd reload` (ExecReload=) accepts this
        # reload's audit record as the answer to its SIGHUP only when it began
        # after the signal was sent (CLOCK_MONOTONIC, one clock for the host's
        # processes, as sd_notify's MONOTONIC_USEC), so a reload already under
        # way, which may have read the file before its edit, is never taken for it.
        started_ns = time.monotonic_ns()
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
            _record_reload(
                s, ReloadOutcome(os.getpid(), started_ns, ok=False, errors=len(exc.problems))
            )
            self.notifier.ready(s.flusher.status_text())
            return
        if loaded.workspace != self.workspace:
            _log.warning(
                "workspace change needs a restart; keeping the current one",
                current=str(self.workspace),
                configured=str(loaded.workspace),
            )
        checks.check_model_windows(loaded.config)
        old = self.config
        new = loaded.config.model_copy(update={"workspace": str(self.workspace)})
        if self.options.config_transform is not None:
            new = self.options.config_transform(new)
        tokenizer: Tokenizer | None = None
        if new.tokenizer != self._tokenizer_in_use:
            try:
                tokenizer = new_tokenizer(new, self._parts)
            except MemdError as exc:
                # Loaded here, with this daemon's environment (its TIKTOKEN_CACHE_DIR,
                # which `memd reload`'s may not be): the daemon's answer is the one
                # that counts. Refused whole, as a config with a problem: applying
                # the rest answered "applied", and the counts stayed the old
                # encoding's while the operator believed the new one in force.
                _log.error("reload failed; keeping the previous configuration", error=str(exc))
                _record_reload(s, ReloadOutcome(os.getpid(), started_ns, ok=False, errors=1))
                self.notifier.ready(s.flusher.status_text())
                return
            self._tokenizer_in_use = new.tokenizer
        self.config = new
        configure_logging(
            self.options.log_format or new.log.format, self.options.log_level or new.log.level
        )
        # Fan-out: each service takes what it needs from the new config (and the
        # new tokenizer's count, when there is one: summaries, reserved text).
        count_text = None if tokenizer is None else tokenizer.count_text
        s.runner.reconfigure(new, count_text)
        s.registry.reconfigure(new, count_text)
        s.retention.reconfigure(new)
        s.recall.reconfigure(new)
        if new.privacy != old.privacy:
            checks.check_archive_key(new)
        checks.warn_unredacted(new)
        s.flusher.reconfigure(new.tokenizer.encoding)
        s.counter.reconfigure(
            new.trigger, new.tokenizer.encoding, tokenizer, new.tokenizer.max_piece_bytes
        )
        if s.watches is not None:
            s.watches.check_every_s = new.watch.reconcile_s
        if (
            new.watch.reconcile_s != old.watch.reconcile_s
            or new.daemon.state_flush_s != old.daemon.state_flush_s
        ):
            s.schedule_periodic(new)
        checks.restart_only_changes(old, new, poll_fixed=self.options.poll is not None)
        if tokenizer is None:
            # After an encoding change each agent is evaluated when its recount
            # lands: judged on "0 tokens" now, a breaker would look healed.
            s.runner.evaluate_all(s.registry.agents().values())
        self.notifier.ready(s.flusher.status_text())
        _record_reload(
            s,
            ReloadOutcome(
                os.getpid(), started_ns, ok=True, changed=tuple(checks.changed_sections(old, new))
            ),
        )
        _log.info(
            "reloaded",
            config=str(loaded.source) if loaded.source else None,
            # The environment is the one memd started with: `systemctl reload`
            # does not re-read EnvironmentFile=, so these keep their values.
            env_overrides=list(loaded.env_overrides),
        )


def _record_reload(s: Services, outcome: ReloadOutcome) -> None:
    """The reload's answer for ``memd reload``, in both places it reads: the
    audit log's record, and the state DB's last reload, which also says why that
    record could not be written (an unwritable or full log: the reload itself is
    done either way, and without this row `memd reload` could not confirm it)."""
    said: dict[str, object] = (
        {"ok": True, "changed": list(outcome.changed)}
        if outcome.ok
        else {"ok": False, "errors": outcome.errors}
    )
    audit_error = _audit_reload(s.audit, **said, started_ns=outcome.started_ns)
    store = s.flusher.store
    if store is None:
        return
    try:
        store.write_last_reload(outcome._replace(audit_error=audit_error))
    except Exception as exc:  # the reload itself is done either way
        _log.warning("cannot write the state database", error=describe_error(exc))


def _audit_reload(audit: AuditLog, **fields: object) -> str | None:
    """Append the reload's audit record; why it could not be written, or None."""
    try:
        if audit.record(AuditEvent.CONFIG_RELOAD, None, trigger="sighup", **fields):
            return None
        return audit.last_error or "auditing is off"
    except Exception as exc:  # the reload itself is done either way
        _log.warning("cannot write the audit log", error=describe_error(exc))
        return describe_error(exc)


def run_daemon(loaded: LoadedConfig, options: DaemonOptions) -> int:
    return Daemon(loaded, options).run()


__all__ = ["EXIT_FORCED", "EXIT_OK", "HANDLED_SIGNALS", "Daemon", "DaemonOptions", "run_daemon"]
