"""The lifecycle's one signal rule, with real signals raised against the real handler;
what the start-up pass runs with, and what waits for READY."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.daemon_proc import wait_until
from support.daemon_services import ScriptedCompaction
from support.memfiles import AgentWorkspace
from support.tokens import CL100K

import memd.daemon.counter
import memd.workspace
from memd.core.audit import AuditEvent
from memd.core.jobs import JobState
from memd.daemon import Daemon, DaemonOptions
from memd.errors import TokenizerError
from memd.notify import SystemdNotifier
from memd.recall.service import RecallService
from memd.scheduler import JobScheduler
from memd.settings import LoadedConfig, build_config, load_settings
from memd.state import StateStore
from memd.tokenizer import TokenCounter


def make_daemon(tmp_path: Path, install: bool = True) -> Daemon:
    config, _ = build_config({}, {})
    loaded = LoadedConfig(config, None, tmp_path / "ws", ())
    return Daemon(loaded, DaemonOptions(install_signal_handlers=install))


def test_real_signals_set_only_flags_and_a_second_sigint_forces(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    with daemon.capture_signals():
        signal.raise_signal(signal.SIGHUP)
        assert daemon.reload_requested and not daemon.state.should_exit
        signal.raise_signal(signal.SIGINT)
        assert daemon.state.should_exit and not daemon.state.force_exit
        signal.raise_signal(signal.SIGINT)  # the second SIGINT forces
        assert daemon.state.force_exit
    # The previous handlers are back.
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_sigterm_never_forces(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path)
    with daemon.capture_signals():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
    assert daemon.state.should_exit and not daemon.state.force_exit


def test_handlers_are_left_alone_when_not_asked_to_install(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path, install=False)
    before = signal.getsignal(signal.SIGTERM)
    with daemon.capture_signals():
        assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.usefixtures("restore_logging")
def test_a_reload_hands_the_new_config_to_every_service(tmp_path: Path) -> None:
    import threading

    from support.daemon_proc import wait_until
    from support.daemon_services import ScriptedCompaction
    from support.memfiles import AgentWorkspace
    from support.tokens import CL100K

    from memd.settings import load_settings

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=2)
    config_file = tmp_path / "memd.toml"
    config_file.write_text("[daemon]\ncooldown_s = 60\n")
    loaded = load_settings(config_file=config_file, workspace=ws.root, environ={})
    options = DaemonOptions(
        config_file=config_file,
        workspace_flag=ws.root,
        state_dir=tmp_path / "state",
        install_signal_handlers=False,
    )
    daemon = Daemon(
        loaded,
        options,
        compact=ScriptedCompaction(),  # type: ignore[arg-type]
        counter_factory=lambda _encoding: CL100K,
        environ={},
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(daemon.run()), daemon=True)
    thread.start()
    try:
        assert daemon.ready.wait(30)
        s = daemon.services
        assert s is not None
        threshold = s.registry.agents()["alice"].policy.threshold_tokens
        config_file.write_text(
            "[daemon]\ncooldown_s = 7\n\n[trigger]\ncontext_length = 50000\n\n"
            "[retention]\nmax_archives = 3\n\n[watch]\nreconcile_s = 9\n"
        )
        daemon.handle_exit(signal.SIGHUP, None)  # the real signal rule

        def every_service_has_it() -> bool:
            return (
                s.runner.config.daemon.cooldown_s == 7
                and s.registry.agents()["alice"].policy.threshold_tokens != threshold
                and s.retention.config.retention.max_archives == 3
            )

        # Each service in turn, within one reload (waited on: the main loop runs it).
        assert wait_until(every_service_has_it, timeout=30)
        assert daemon.config.daemon.cooldown_s == 7
    finally:
        daemon.handle_exit(signal.SIGTERM, None)
        thread.join(60)
    assert codes == [0]


def test_each_reload_records_when_it_began_before_it_read_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`memd reload` takes a reload's audit record as the answer to its SIGHUP when
    ``started_ns`` >= the signal's send: that must mean the file was read after
    it, for a reload applied and for one refused."""
    import time

    import memd.daemon.lifecycle
    from memd.audit import read_audit

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=1)
    config_file = tmp_path / "memd.toml"
    config_file.write_text("[daemon]\ncooldown_s = 60\n")
    loaded = load_settings(config_file=config_file, workspace=ws.root, environ={})
    options = DaemonOptions(
        config_file=config_file,
        workspace_flag=ws.root,
        state_dir=tmp_path / "state",
        install_signal_handlers=False,
    )
    reads: list[int] = []
    real_load = memd.daemon.lifecycle.load_settings

    def load(*args: Any, **kwargs: Any) -> LoadedConfig:
        reads.append(time.monotonic_ns())  # the file is read after this
        return real_load(*args, **kwargs)

    monkeypatch.setattr(memd.daemon.lifecycle, "load_settings", load)
    daemon = Daemon(
        loaded,
        options,
        compact=ScriptedCompaction(),  # type: ignore[arg-type]
        counter_factory=lambda _encoding: CL100K,
        environ={},
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(daemon.run()), daemon=True)
    thread.start()
    try:
        assert daemon.ready.wait(30)
        s = daemon.services
        assert s is not None and s.audit.path is not None
        log = s.audit.path
        sent: list[int] = []
        for text in ("[daemon]\ncooldown_s = 7\n", "[trigger]\nthreshold = 7\n"):
            config_file.write_text(text)
            sent.append(time.monotonic_ns())
            daemon.handle_exit(signal.SIGHUP, None)
            count = len(sent)
            assert wait_until(
                lambda: (
                    len([r for r in read_audit(log).records if r.event == "config_reload"]) == count
                ),
                timeout=30,
            )
    finally:
        daemon.handle_exit(signal.SIGTERM, None)
        thread.join(60)
    assert codes == [0]
    records = [r for r in read_audit(log).records if r.event == "config_reload"]
    assert [r.fields["ok"] for r in records] == [True, False]
    for record, signalled, read in zip(records, sent, reads, strict=True):
        started = record.fields["started_ns"]
        assert isinstance(started, int)
        assert signalled <= started <= read
        assert (record.actor, record.pid) == ("daemon", os.getpid())


@pytest.mark.usefixtures("restore_logging")
def test_a_config_that_became_unreadable_is_refused_at_reload_and_the_daemon_keeps_running(
    tmp_path: Path,
) -> None:
    """A config nested too deeply (tomllib's RecursionError ended the daemon) or
    replaced by a FIFO (its main loop blocked reading it for ever) is one refused
    reload each; the daemon goes on and applies the next good config."""
    from memd.audit import read_audit

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=1)
    config_file = tmp_path / "memd.toml"
    config_file.write_text("[daemon]\ncooldown_s = 60\n")
    loaded = load_settings(config_file=config_file, workspace=ws.root, environ={})
    options = DaemonOptions(
        config_file=config_file,
        workspace_flag=ws.root,
        state_dir=tmp_path / "state",
        install_signal_handlers=False,
    )
    daemon = Daemon(
        loaded,
        options,
        compact=ScriptedCompaction(),  # type: ignore[arg-type]
        counter_factory=lambda _encoding: CL100K,
        environ={},
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(daemon.run()), daemon=True)
    thread.start()
    try:
        assert daemon.ready.wait(30)
        s = daemon.services
        assert s is not None and s.audit.path is not None
        log = s.audit.path

        def reloads() -> list[object]:
            return [r.fields["ok"] for r in read_audit(log).records if r.event == "config_reload"]

        def reload_with(make: Callable[[], None], count: int) -> None:
            config_file.unlink()
            make()
            daemon.handle_exit(signal.SIGHUP, None)
            assert wait_until(lambda: len(reloads()) == count, timeout=30)

        reload_with(lambda: config_file.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n"), 1)
        reload_with(lambda: os.mkfifo(config_file), 2)
        reload_with(lambda: config_file.write_text("[daemon]\ncooldown_s = 7\n"), 3)
        assert reloads() == [False, False, True]
        assert thread.is_alive() and s.runner.config.daemon.cooldown_s == 7
    finally:
        daemon.handle_exit(signal.SIGTERM, None)
        thread.join(60)
    assert codes == [0]


@pytest.mark.usefixtures("restore_logging")
def test_a_failed_tokenizer_reload_never_labels_counts_with_the_new_encoding(
    tmp_path: Path,
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=2)
    config_file = tmp_path / "memd.toml"
    config_file.write_text('[tokenizer]\nencoding = "cl100k_base"\n')
    loaded = load_settings(config_file=config_file, workspace=ws.root, environ={})
    state_dir = tmp_path / "state"
    options = DaemonOptions(
        config_file=config_file,
        workspace_flag=ws.root,
        state_dir=state_dir,
        install_signal_handlers=False,
    )

    def tokenizers(encoding: str) -> Any:
        if encoding != "cl100k_base":  # e.g. its BPE file not installed offline yet
            raise TokenizerError(f"tokenizer encoding {encoding!r}: not found offline")
        return CL100K

    daemon = Daemon(
        loaded,
        options,
        compact=ScriptedCompaction(),  # type: ignore[arg-type]
        counter_factory=tokenizers,
        environ={},
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(daemon.run()), daemon=True)
    thread.start()
    try:
        assert daemon.ready.wait(30)
        s = daemon.services
        assert s is not None
        reloaded = threading.Event()
        record = s.audit.record

        def recorded(event: Any, *args: Any, **fields: Any) -> bool:
            if str(event) == str(AuditEvent.CONFIG_RELOAD):
                reloaded.set()  # the reload's last step: every service has it
            return record(event, *args, **fields)

        s.audit.record = recorded  # type: ignore[method-assign]
        config_file.write_text('[tokenizer]\nencoding = "o200k_base"\n')
        daemon.handle_exit(signal.SIGHUP, None)
        assert reloaded.wait(30)
        # Refused whole (the daemon's answer to `memd reload`): nothing of it applied.
        assert daemon.config.tokenizer.encoding == "cl100k_base"
        assert s.entry_counter.tokenizer is CL100K  # kept: the new one failed to load
        # The next flush writes alice's row (its count is cl100k's).
        s.registry.agents()["alice"].dirty = True
        s.runner.flush()
    finally:
        daemon.handle_exit(signal.SIGTERM, None)
        thread.join(60)
    assert codes == [0]
    with contextlib.closing(StateStore.open(state_dir, ws.root)) as store:
        (row,) = [r for r in store.agents() if r.agent == "alice"]
    # The count was made with cl100k_base: a restart that can load o200k_base
    # must not reuse it as an o200k_base count.
    assert row.encoding == "cl100k_base"


def _run_daemon(
    tmp_path: Path,
    ws: AgentWorkspace,
    compact: ScriptedCompaction,
    check: Any,
    tokenizer: Any = CL100K,
) -> None:
    config_file = tmp_path / "memd.toml"
    config_file.write_text(
        "[trigger]\ncontext_length = 1000\nthreshold = 0.5\n\n"
        "[daemon]\nbreaker_failures = 1\nbreaker_reset_s = 3600\n"
    )
    loaded = load_settings(config_file=config_file, workspace=ws.root, environ={})
    options = DaemonOptions(
        config_file=config_file,
        workspace_flag=ws.root,
        state_dir=tmp_path / "state",
        install_signal_handlers=False,
    )
    daemon = Daemon(
        loaded,
        options,
        compact=compact,  # type: ignore[arg-type]
        counter_factory=lambda _encoding: tokenizer,
        environ={},
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(daemon.run()), daemon=True)
    thread.start()
    try:
        assert daemon.ready.wait(30)
        check(daemon)
    finally:
        daemon.handle_exit(signal.SIGTERM, None)
        thread.join(60)
    assert codes == [0]


@pytest.mark.usefixtures("restore_logging")
def test_a_restart_keeps_the_open_breaker_of_an_agent_counted_after_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=20)  # well over its 500-token threshold

    def breaker_opens(daemon: Any) -> None:
        entry = daemon.services.registry.get("alice")
        assert wait_until(lambda: entry.job.state is JobState.BREAKER_OPEN, timeout=30)

    _run_daemon(tmp_path, ws, ScriptedCompaction("fail"), breaker_opens)
    # While memd is down the agent rewrites its file (a new inode, same content),
    # and it is large: counted after READY (made "large" here by lowering the bar).
    memory = ws.root / "agents/alice/MEMORY.md"
    copy = memory.with_suffix(".tmp")
    copy.write_bytes(memory.read_bytes())
    os.replace(copy, memory)
    monkeypatch.setattr(memd.daemon.counter, "SLOW_COUNT_BYTES", 100)
    second = ScriptedCompaction()
    seen: list[Any] = []
    counted = threading.Event()

    class SlowTokenizer:
        """A 16 MiB file takes seconds to count: here, until the test says so."""

        def count_text(self, text: str) -> int:
            return CL100K.count_text(text)

        def count_bytes(self, data: bytes) -> int:
            assert counted.wait(30)
            return CL100K.count_bytes(data)

    def after_restart(daemon: Any) -> None:
        entry = daemon.services.registry.get("alice")
        seen.append((entry.job.state, entry.job.consecutive_failures))
        counted.set()
        assert wait_until(lambda: entry.tokens > 0, timeout=30)

    _run_daemon(tmp_path, ws, second, after_restart, SlowTokenizer())
    # The breaker was open for an hour: still open after the restart, nothing retried.
    assert seen == [(JobState.BREAKER_OPEN, 1)]
    assert second.calls == []


def test_start_up_pauses_the_collector_and_background_passes_wait_for_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up pass runs with the cyclic GC off (back on after); the recall
    re-sync and the periodic jobs (the first archive survey) start only at READY."""
    ws = AgentWorkspace(tmp_path / "ws")
    for name in ("alpha", "beta"):
        ws.create_agent(name, entries=2)
    config, _ = build_config({}, {})
    options = DaemonOptions(state_dir=tmp_path / "state", install_signal_handlers=False)
    seen: dict[str, tuple[bool, bool]] = {}  # what -> (ready already, GC on)
    daemon: Daemon

    def counter(encoding: str) -> TokenCounter:
        seen["tokenizer"] = (daemon.ready.is_set(), gc.isenabled())
        return CL100K

    def note(what: str, original: Callable[..., None]) -> Callable[..., None]:
        def call(self: object, *args: object, **kwargs: object) -> None:
            seen.setdefault(what, (daemon.ready.is_set(), gc.isenabled()))
            original(self, *args, **kwargs)

        return call

    monkeypatch.setattr(RecallService, "start", note("recall sync", RecallService.start))
    monkeypatch.setattr(JobScheduler, "every", note("periodic", JobScheduler.every))
    daemon = Daemon(LoadedConfig(config, None, ws.root, ()), options, counter_factory=counter)
    thread = threading.Thread(target=daemon.run, daemon=True)
    assert gc.isenabled()
    thread.start()
    try:
        assert daemon.ready.wait(20)
        assert wait_until(lambda: "recall sync" in seen and gc.isenabled())
        assert seen["tokenizer"] == (False, False)  # during the pass: no collector
        assert seen["recall sync"] == (True, False)  # after READY (still in start-up)
        assert seen["periodic"] == (True, False)
    finally:
        daemon.handle_exit(signal.SIGTERM, None)
        thread.join(30)
    assert gc.isenabled()


def run_until_ready(ws: AgentWorkspace, state_dir: Path) -> None:
    """Start a daemon on ``ws``, wait for READY, stop it cleanly."""
    config, _ = build_config({}, {})
    options = DaemonOptions(state_dir=state_dir, install_signal_handlers=False)
    daemon = Daemon(
        LoadedConfig(config, None, ws.root, ()), options, counter_factory=lambda _: CL100K
    )
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        assert daemon.ready.wait(20)
    finally:
        daemon.handle_exit(signal.SIGTERM, None)
        thread.join(30)
    assert daemon.stopped.is_set()


def test_a_restart_stats_agent_folders_it_listed_before_instead_of_reading_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    for name in ("alpha", "beta"):
        ws.create_agent(name, entries=2)
    state_dir = tmp_path / "state"
    monkeypatch.setattr(memd.workspace, "_RACY_NS", -(10**18))  # keep even fresh facts
    listed: list[str] = []
    real_scandir = os.scandir

    def scandir(path: Any) -> Any:
        listed.append(os.path.basename(os.fspath(path)))
        return real_scandir(path)

    monkeypatch.setattr(memd.workspace.os, "scandir", scandir)
    run_until_ready(ws, state_dir)
    assert {"alpha", "beta"} <= set(listed)  # the first start lists each folder
    with StateStore.open(state_dir, ws.root) as store:
        stored = {record.agent: record.folder for record in store.agents()}
    alpha_facts = stored["alpha"]
    assert alpha_facts is not None and stored["beta"] is not None
    assert alpha_facts.ino == os.stat(ws.root / "agents" / "alpha").st_ino
    listed.clear()
    # alpha's folder changes while memd is down: alpha alone is listed again.
    folder = ws.root / "agents" / "alpha"
    before = os.stat(folder).st_ctime_ns
    (folder / ".memd").mkdir()
    while os.stat(folder).st_ctime_ns == before:  # past the ctime's clock tick
        (folder / ".nudge").mkdir()
        (folder / ".nudge").rmdir()
    run_until_ready(ws, state_dir)
    assert "beta" not in listed and "alpha" in listed
    with StateStore.open(state_dir, ws.root) as store:
        alpha = store.get_agent("alpha")
    assert alpha is not None and alpha.folder is not None and alpha.folder.has_private
    assert alpha.folder.ctime_ns == os.stat(folder).st_ctime_ns


class RecordingNotifier(SystemdNotifier):
    """What the lifecycle tells systemd, in order (no socket: nothing is sent)."""

    def __init__(self) -> None:
        super().__init__({})
        self.said: list[str] = []

    def notify(self, *fields: str) -> bool:
        self.said.append(fields[0].split("=")[0])
        return False

    def close(self) -> None:
        self.said.append("close")
        super().close()


def test_a_failed_start_up_is_never_ready_and_closes_the_notifier_last(tmp_path: Path) -> None:
    from support.memfiles import AgentWorkspace

    from memd.errors import MemdError

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=2)

    def broken_tokenizer(_encoding: str) -> Any:
        raise MemdError("tokenizer unavailable (scripted)")

    config, _ = build_config({}, {})
    notifier = RecordingNotifier()
    daemon = Daemon(
        LoadedConfig(config, None, ws.root, ()),
        DaemonOptions(state_dir=tmp_path / "state", install_signal_handlers=False),
        counter_factory=broken_tokenizer,
        notifier=notifier,
    )
    with pytest.raises(MemdError, match="scripted"):
        daemon.run()
    # Never READY; told stopping, then closed last (pushed first on the stack).
    assert notifier.said == ["STOPPING", "close"]
    assert daemon.stopped.is_set() and daemon.services is None


def test_shutdown_stops_the_services_in_the_reverse_of_their_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each service's start pushes its stop on the exit stack: the stops run in the
    reverse of the starts, after STOPPING; the final flush after the scheduler
    stopped (queued jobs will not run), before the state DB closes."""
    from memd.daemon.counter import CountService
    from memd.daemon.flusher import StateFlusher
    from memd.daemon.recall import RecallStage
    from memd.daemon.retention import RetentionService
    from memd.daemon.runner import Runner
    from memd.daemon.watches import WatchService
    from memd.daemon.wiring import Services

    events: list[str] = []

    def note(what: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: object, *args: object, **kwargs: object) -> Any:
            events.append(what)
            return original(self, *args, **kwargs)

        return call

    for cls, name, start, stop in (
        (StateFlusher, "flusher", "start", "close"),
        (RecallStage, "recall", "start", None),
        (JobScheduler, "scheduler", "start", "_stop"),
        (RetentionService, "retention", "start", "stop"),
        (Runner, "runner", "start", "stop"),
        (WatchService, "watches", "start", "stop"),
        (CountService, "counter", "start", "stop"),
    ):
        monkeypatch.setattr(cls, start, note(f"start {name}", getattr(cls, start)))
        if stop is not None:
            monkeypatch.setattr(cls, stop, note(f"stop {name}", getattr(cls, stop)))
    monkeypatch.setattr(RecallService, "stop", note("stop recall", RecallService.stop))
    monkeypatch.setattr(Services, "final_flush", note("final flush", Services.final_flush))
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=2)
    config, _ = build_config({}, {})
    notifier = RecordingNotifier()
    notifier.said = events
    daemon = Daemon(
        LoadedConfig(config, None, ws.root, ()),
        DaemonOptions(state_dir=tmp_path / "state", install_signal_handlers=False),
        counter_factory=lambda _encoding: CL100K,
        notifier=notifier,
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(daemon.run()), daemon=True)
    thread.start()
    try:
        assert daemon.ready.wait(30)
    finally:
        daemon.handle_exit(signal.SIGTERM, None)
        thread.join(60)
    assert codes == [0]
    starts = [event.split()[1] for event in events if event.startswith("start ")]
    stops = [event.split()[1] for event in events if event.startswith("stop ")]
    # Data-flow order: each stage before the one that feeds it.
    assert starts == ["flusher", "recall", "scheduler", "retention", "runner", "watches", "counter"]
    assert stops == starts[::-1]
    tail = events[events.index("STOPPING") :]
    assert [event for event in tail if not event.startswith("STATUS")] == [
        "STOPPING",
        *(f"stop {name}" for name in stops[:-1]),
        "final flush",
        "stop flusher",
        "close",
    ]


@pytest.mark.usefixtures("restore_logging")
def test_a_state_dir_that_is_a_file_leaves_the_daemon_running_without_recall(
    tmp_path: Path,
) -> None:
    """`memd run --state-dir FILE`: the state DB fell back to memory with a warning,
    then the recall index's NotADirectoryError ended the daemon at start-up, as
    'memd: error: Not a directory (…recall.sqlite3)'. Recall is disabled instead,
    as for any index it cannot use."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=1)
    state_file = tmp_path / "state"
    state_file.write_text("not a folder\n")
    config, _ = build_config({}, {})
    loaded = LoadedConfig(config, None, ws.root, ())
    options = DaemonOptions(state_dir=state_file, install_signal_handlers=False)
    daemon = Daemon(
        loaded,
        options,
        compact=ScriptedCompaction(),  # type: ignore[arg-type]
        counter_factory=lambda _encoding: CL100K,
        environ={},
    )
    codes: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            codes.append(daemon.run())
        except BaseException as exc:
            errors.append(exc)
            raise

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: daemon.ready.is_set() or bool(errors), timeout=30)
        assert errors == [] and daemon.ready.is_set()
        s = daemon.services
        assert s is not None and s.recall.service is None
        assert "alice" in s.registry.agents()
    finally:
        daemon.handle_exit(signal.SIGTERM, None)
        thread.join(60)
    assert codes == [0]
    assert state_file.read_text() == "not a folder\n"


def test_a_stop_bounds_its_waits_for_a_state_db_another_process_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `sqlite3` shell in a long transaction on the state DB: SIGTERM waited
    BUSY_TIMEOUT_S (5 s) per write left (final flush, heartbeat), ~11 s here and
    ~32 s seen in the field. The stop limits those waits before anything stops;
    the writes fail as locked (logged) and the daemon exits 0."""
    import sqlite3

    from support.memfiles import AgentWorkspace

    from memd.daemon.flusher import STOP_DB_WAIT_S
    from memd.daemon.wiring import Services
    from memd.state import StateStore

    events: list[str] = []
    limit = StateStore.limit_waits
    flush = Services.final_flush

    def limit_waits(self: StateStore, seconds: float) -> None:
        events.append(f"limit {seconds:g}")
        limit(self, seconds)

    def final_flush(self: Services) -> None:
        events.append("final flush")
        flush(self)

    monkeypatch.setattr(StateStore, "limit_waits", limit_waits)
    monkeypatch.setattr(Services, "final_flush", final_flush)
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=2)
    config, _ = build_config({}, {})
    daemon = Daemon(
        LoadedConfig(config, None, ws.root, ()),
        DaemonOptions(state_dir=tmp_path / "state", install_signal_handlers=False),
        counter_factory=lambda _encoding: CL100K,
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(daemon.run()), daemon=True)
    thread.start()
    holder: sqlite3.Connection | None = None
    try:
        assert daemon.ready.wait(30)
        store = daemon.services.flusher.store
        assert store is not None and store.path is not None
        holder = sqlite3.connect(store.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("CREATE TABLE held(x)")
    finally:
        daemon.handle_exit(signal.SIGTERM, None)
        thread.join(60)
        if holder is not None:
            holder.execute("ROLLBACK")
            holder.close()
    assert codes == [0]
    assert events == [f"limit {STOP_DB_WAIT_S:g}", "final flush"]
