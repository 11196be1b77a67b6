"""The daemon: real files, real watchdog events, real subprocesses and signals.

These run the whole daemon (threads, watcher, scheduler) against a scripted
compaction function or the real transaction. That nothing *more* happens
(no second compaction, no retry during a hold) is asserted step by step in
``tests/daemon/test_counter.py``, with a made-up clock instead of sleeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.daemon_proc import DaemonProcess, NotifyListener, wait_until
from support.memfiles import (
    AgentWorkspace,
    append_entry,
    entry_contents_everywhere,
    swarms_block,
    swarms_header,
)
from support.tokens import CL100K

import memd.state
import memd.watcher
from memd.compaction import ThresholdCheck, check_still_over
from memd.core.jobs import JobState
from memd.core.memfile import parse
from memd.core.summary import SummaryRequest, SummaryResult
from memd.daemon import Daemon, DaemonOptions
from memd.settings import LoadedConfig, build_config, load_settings
from memd.state import StateStore
from memd.tokenizer import TokenCounter
from memd.workspace import AgentPaths

COUNTER = CL100K

FAST: dict[str, Any] = {
    "trigger": {"context_length": 1000, "threshold": 0.5, "debounce_ms": 40, "max_wait_ms": 200},
    "watch": {"reconcile_s": 0.5},
    "compaction": {"drain_quiet_s": 0.05, "drain_max_s": 1},
    "summarizer": {"max_tokens": 120},
    "daemon": {
        "state_flush_s": 0.2,
        "retry_base_s": 0.1,
        "retry_max_s": 0.4,
        "cooldown_s": 0.6,
        "breaker_failures": 3,
        "breaker_reset_s": 60,
        "max_concurrent_llm": 2,
    },
}


def merged(extra: dict[str, Any] | None) -> dict[str, Any]:
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in FAST.items()}
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    return data


def full_tokens(path: Path) -> int:
    return COUNTER.count_bytes(path.read_bytes())


@dataclass
class Outcome:
    agent: str
    archive: Path
    tokens_before: int | None
    tokens_after: int | None
    model: str = "scripted"
    cost_usd: float | None = None
    llm_duration_s: float = 0.0
    tokens_appended: int | None = 0
    pinned: int = 0
    evicted: int = 0
    calls: int = 1
    redacted: int = 0
    reply_redacted: int = 0
    pruned: Any = None
    prune_error: str | None = None
    partial: bool = False
    counted: Any = None  # no count of the new file: the daemon counts it

    @property
    def tokens_produced(self) -> int | None:
        return self.tokens_after  # nothing is appended during a scripted job


class ScriptedCompaction:
    """Stands in for compact_agent: each call pops a behaviour.

    ``ok`` rewrites MEMORY.md small (by rename, like the real one), ``big``
    rewrites it still above the low-water mark, ``fail`` raises
    SummarizerError, ``nothing`` raises NothingToCompact, ``busy`` LockTimeout,
    ``slow`` waits for ``release`` first, ``summarize`` asks the summarizer
    for a summary (``summarize-slow`` then waits for ``release``), ``preempted`` finds the file already
    compacted by someone else once "locked" (and applies the transaction's own
    re-check to the daemon's ``threshold``), ``checkpoints`` walks the real
    checkpoint names honouring ``abort`` as the transaction does (so a forced
    shutdown can abort it).
    """

    def __init__(self, *script: str) -> None:
        self.script = list(script)
        self.calls: list[str] = []
        self.active = 0
        self.peak = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.entered = threading.Event()
        self.committed = 0
        self.summarized = 0

    def __call__(
        self,
        paths: AgentPaths,
        summarizer: Any,
        options: Any,
        *,
        count_bytes: Any,
        abort: threading.Event,
        threshold: ThresholdCheck,
    ) -> Outcome:
        from memd.errors import CompactionAborted, LockTimeout, NothingToCompact, SummarizerError

        with self.lock:
            behaviour = self.script.pop(0) if self.script else "ok"
            self.calls.append(paths.agent)
            self.active += 1
            self.peak = max(self.peak, self.active)
        self.entered.set()
        try:
            if behaviour == "slow":
                assert self.release.wait(20)
                behaviour = "ok"
            if behaviour in ("summarize", "summarize-slow"):
                # The transaction's summary step: through the daemon's LLM slots.
                summarizer.summarize(SummaryRequest(paths.agent, parse(b""), max_tokens=10))
                with self.lock:
                    self.summarized += 1
                if behaviour == "summarize-slow":  # then the file work: commit, drain
                    assert self.release.wait(20)
                behaviour = "ok"
            if behaviour == "preempted":
                # another compactor finished just before we got the lock
                tmp = paths.dir / "MEMORY.md.other"
                tmp.write_text(swarms_header(paths.agent) + swarms_block("System", "done"))
                os.replace(tmp, paths.memory)
                check_still_over(paths, threshold, count_bytes)  # the job gives up here
                behaviour = "ok"
            if behaviour == "checkpoints":
                for name in ("locked", "summarized", "archive-written"):
                    if abort.is_set():
                        raise CompactionAborted(f"shutdown forced; aborted at {name}")
                    time.sleep(0.2)
                behaviour = "ok"
            if behaviour == "fail":
                raise SummarizerError(f"agent {paths.agent!r}: scripted failure")
            if behaviour == "nothing":
                raise NothingToCompact(f"agent {paths.agent!r}: nothing to compact")
            if behaviour == "busy":
                raise LockTimeout(f"agent {paths.agent!r}: busy")
            before = full_tokens(paths.memory)
            body = "summary " * (5 if behaviour == "ok" else 450)
            tmp = paths.dir / "MEMORY.md.scripted"
            tmp.write_text(swarms_header(paths.agent) + swarms_block("System", body))
            os.replace(tmp, paths.memory)
            self.committed += 1
            return Outcome(paths.agent, paths.dir / "archive", before, full_tokens(paths.memory))
        finally:
            with self.lock:
                self.active -= 1


class Harness:
    def __init__(self, root: Path, daemon: Daemon, thread: threading.Thread) -> None:
        self.root = root
        self.daemon = daemon
        self.thread = thread

    def tokens(self, agent: str) -> int | None:
        entry = self.daemon.services.registry.agents().get(agent)
        return None if entry is None else entry.tokens

    def job(self, agent: str) -> JobState | None:
        entry = self.daemon.services.registry.agents().get(agent)
        return None if entry is None else entry.job.state

    def stop(self) -> int | None:
        self.daemon.handle_exit(signal.SIGTERM, None)  # the real signal rule
        self.thread.join(30)
        assert not self.thread.is_alive()
        return self.code

    code: int | None = None


@pytest.fixture
def run_daemon(tmp_path: Path) -> Iterator[Any]:
    started: list[Harness] = []

    def start(
        ws: AgentWorkspace,
        compact: Any = None,
        config: dict[str, Any] | None = None,
        state: bool = True,
        counter_factory: Any = None,
        wait_ready: bool = True,
        summarizer_factory: Any = None,
    ) -> Harness:
        loaded_config, _ = build_config(merged(config), {})
        loaded = LoadedConfig(loaded_config, None, ws.root, ())
        options = DaemonOptions(
            state_dir=tmp_path / "state" if state else None, install_signal_handlers=False
        )
        daemon = Daemon(
            loaded,
            options,
            compact=compact,
            counter_factory=counter_factory,
            summarizer_factory=summarizer_factory,
        )
        harness: Harness

        def target() -> None:
            harness.code = daemon.run()

        thread = threading.Thread(target=target, daemon=True)
        harness = Harness(ws.root, daemon, thread)
        thread.start()
        if wait_ready:
            assert daemon.ready.wait(20)
        started.append(harness)
        return harness

    yield start
    for harness in started:
        if harness.thread.is_alive():
            harness.stop()


def fill(ws: AgentWorkspace, agent: str, entries: int) -> Path:
    memory = ws.root / "agents" / agent / "MEMORY.md"
    for n in range(entries):
        append_entry(memory, "Human" if n % 2 == 0 else "AI", f"{agent} turn {n}: " + "word " * 20)
    return memory


# --------------------------------------------------------------------- counting


def test_counts_at_startup_and_follows_appends_and_replacements(
    ws: AgentWorkspace, run_daemon: Any
) -> None:
    ws.create_agent("alice", entries=2)
    ws.create_agent("bob")
    h = run_daemon(ws, compact=ScriptedCompaction(), config={"trigger": {"context_length": 10**6}})
    alice = ws.root / "agents" / "alice" / "MEMORY.md"
    assert h.tokens("alice") == full_tokens(alice)
    append_entry(alice, "AI", "a new answer " * 10)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(alice))
    # replaced by rename, like an editor or memd's own re-seed
    tmp = alice.with_name("tmp")
    tmp.write_text(swarms_header("alice"))
    os.replace(tmp, alice)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(alice))
    # agents come and go while running
    ws.create_agent("carol", entries=1)
    assert wait_until(lambda: h.tokens("carol") == full_tokens(ws.root / "agents/carol/MEMORY.md"))
    (ws.root / "agents" / "bob" / "MEMORY.md").unlink()
    (ws.root / "agents" / "bob").rmdir()
    assert wait_until(lambda: "bob" not in h.daemon.services.registry.agents())
    (ws.root / "agents" / "carol").rename(ws.root / "agents" / "dave")
    assert wait_until(lambda: set(h.daemon.services.registry.agents()) == {"alice", "dave"})
    assert h.stop() == 0


def test_polling_mode_counts_and_compacts(ws: AgentWorkspace, run_daemon: Any) -> None:
    ws.create_agent("nfs")
    compact = ScriptedCompaction()
    h = run_daemon(
        ws,
        compact=compact,
        config={"watch": {"poll": True, "poll_interval_s": 0.1, "reconcile_s": 60}},
    )
    assert (
        h.daemon.services.watches.watcher is not None
        and h.daemon.services.watches.watcher.kind == "polling"
    )
    memory = fill(ws, "nfs", 2)
    assert wait_until(lambda: h.tokens("nfs") == full_tokens(memory))
    fill(ws, "nfs", 20)
    assert wait_until(lambda: compact.committed == 1)
    # The compaction renamed a new file over MEMORY.md; the poller holds the old
    # one open (its size never moves). memd hands its replacement on, so the
    # rename and the append after it show within a pass or two, not VERIFY_S.
    memory = fill(ws, "nfs", 1)
    assert wait_until(lambda: h.tokens("nfs") == full_tokens(memory))
    h.stop()


def test_polling_the_append_after_memds_own_compaction_of_a_cold_agent_is_counted(
    ws: AgentWorkspace, run_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # alice is over her threshold when memd starts, her file written long ago (not
    # hot by any measure): memd compacts her at once. The poller holds her old file
    # (the rename over it never moves its size) and her path's turn is made never
    # to come here: only memd handing its own replacement to the watch stage shows
    # the append after it within a pass. (Found by review 13a, D1: 23.8 s.)
    monkeypatch.setattr("memd.poller.VERIFY_S", 10.0**6)
    ws.create_agent("alice")
    ws.create_agent("bob")
    memory = fill(ws, "alice", 30)
    long_ago = time.time() - 7200
    os.utime(memory, (long_ago, long_ago))
    compact = ScriptedCompaction("slow")
    h = run_daemon(
        ws,
        compact=compact,
        config={
            "trigger": {"context_length": 2000},
            "watch": {"poll": True, "poll_interval_s": 0.1, "reconcile_s": 3600},
        },
    )
    assert compact.entered.wait(20)  # compacting alice (the LLM call in flight)
    poller = h.daemon.services.watches.watcher.backend.poller
    assert wait_until(lambda: poller.held_fds("alice")[0] >= 0)  # her old file, held
    compact.release.set()
    assert wait_until(lambda: compact.committed == 1)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory))
    append_entry(memory, "Human", "the next turn " * 20)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory), timeout=10)
    h.stop()


@pytest.mark.parametrize("how", ["replaced", "unlinked and made again"])
def test_polling_another_process_replacing_memory_md_is_counted(
    ws: AgentWorkspace, run_daemon: Any, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # Another process (compact-now, an editor saving by rename, an agent starting
    # its file over) puts a new MEMORY.md in place of the one the poller holds
    # open, whose size never moves again: the file's turn (VERIFY_S, made short
    # here) stats its path and the new file, with the appends made to it, is
    # counted; the one after that on the next pass.
    monkeypatch.setattr("memd.poller.VERIFY_S", 1.0)
    ws.create_agent("alice")
    ws.create_agent("bob")
    h = run_daemon(
        ws,
        compact=ScriptedCompaction(),
        config={"watch": {"poll": True, "poll_interval_s": 0.1, "reconcile_s": 3600}},
    )
    memory = fill(ws, "alice", 3)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory))
    poller = h.daemon.services.watches.watcher.backend.poller
    assert wait_until(lambda: poller.held_fds("alice")[0] >= 0)
    if how == "replaced":
        new = memory.with_name("MEMORY.md.new")
        new.write_bytes(memory.read_bytes()[: len(memory.read_bytes()) // 2])
        os.replace(new, memory)
    else:
        text = memory.read_bytes()
        memory.unlink()
        memory.write_bytes(text[: len(text) // 2])
    append_entry(memory, "Human", "the turn after " * 5)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory), timeout=20)
    append_entry(memory, "Human", "and the next one " * 5)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory), timeout=20)
    h.stop()


def compact_now(ws: AgentWorkspace, agent: str, state_dir: Path) -> None:
    """``memd compact-now`` in another process, as an operator runs it beside the daemon."""
    result = subprocess.run(
        [
            *(sys.executable, "-m", "memd", "compact-now", agent, "--wait", "10"),
            *("--summary", "compacted by hand", "--workspace", str(ws.root)),
            *("--state-dir", str(state_dir)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MEMD_COMPACTION_DRAIN_QUIET_S": "0.05"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{agent}: compacted "), result.stdout


def test_polling_sees_compact_now_beside_it_from_the_ledger(
    ws: AgentWorkspace, run_daemon: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # `memd compact-now` beside a polling daemon replaces a MEMORY.md that was only
    # appended to: the poller holds the old file (its size never moves again) and
    # would see the new one only in the file's turn (VERIFY_S, made never to come
    # here). The ledger row compact-now writes is read within a poll interval and
    # the agent handed to the poller: the appends after it are counted on the next
    # pass (the deadline is generous for a loaded machine; the wait ends on it).
    monkeypatch.setattr("memd.poller.VERIFY_S", 10.0**6)
    ws.create_agent("alice")
    ws.create_agent("bob")
    h = run_daemon(
        ws,
        compact=ScriptedCompaction(),
        config={
            "trigger": {"context_length": 10**6},
            "watch": {"poll": True, "poll_interval_s": 0.1, "reconcile_s": 3600},
        },
    )
    memory = fill(ws, "alice", 30)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory))
    poller = h.daemon.services.watches.watcher.backend.poller
    assert wait_until(lambda: poller.held_fds("alice")[0] >= 0)
    before = os.stat(memory).st_ino
    compact_now(ws, "alice", tmp_path / "state")
    assert os.stat(memory).st_ino != before  # replaced, not rewritten in place
    append_entry(memory, "Human", "the turn after " * 5)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory), timeout=10)
    append_entry(memory, "Human", "and the next one " * 5)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory), timeout=10)
    assert h.stop() == 0


def test_polling_sees_forget_beside_it_from_its_tombstone(
    ws: AgentWorkspace, run_daemon: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # `memd forget AGENT` unlinks the MEMORY.md the poller holds open (its size
    # never moves) and leaves a tombstone in the state DB: the state flush that
    # finds it hands the agent to the poller, whose next pass sees the file gone
    # (not in the file's turn, VERIFY_S, made never to come here).
    monkeypatch.setattr("memd.poller.VERIFY_S", 10.0**6)
    ws.create_agent("alice")
    ws.create_agent("bob")
    h = run_daemon(
        ws,
        compact=ScriptedCompaction(),
        config={
            "trigger": {"context_length": 10**6},
            "watch": {"poll": True, "poll_interval_s": 0.1, "reconcile_s": 3600},
        },
    )
    memory = fill(ws, "alice", 10)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory))
    poller = h.daemon.services.watches.watcher.backend.poller
    assert wait_until(lambda: poller.held_fds("alice")[0] >= 0)
    result = subprocess.run(
        [
            *(sys.executable, "-m", "memd", "forget", "alice", "--yes", "--wait", "10"),
            *("--workspace", str(ws.root), "--state-dir", str(tmp_path / "state")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert not memory.exists()
    assert wait_until(lambda: h.tokens("alice") == 0, timeout=10)
    assert h.stop() == 0


def test_polling_a_stale_count_over_threshold_spends_no_call_on_a_compacted_file(
    ws: AgentWorkspace, run_daemon: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The daemon's count of an agent over threshold is stale once compact-now beside
    # it has compacted the file, until the poller sees the new file: at the next
    # pass when the ledger says so, in the file's turn when it cannot (compact-now
    # without the state DB: the case here, the ledger read off, VERIFY_S never
    # reached). A job started on that count (second's, queued for the LLM slot while
    # compact-now ran) takes the lock, counts the file, finds it under threshold and
    # stops: no model call, no archive, no failure; the file is handed to the poller
    # as after any job, and the count is the new file's.
    import memd.compaction

    monkeypatch.setattr("memd.poller.VERIFY_S", 10.0**6)
    monkeypatch.setattr("memd.daemon.committed.OtherCompactions.take", lambda _self: [])
    checked: list[str] = []
    real_check = memd.compaction.check_still_over

    def check_still_over(where: Any, check: Any, count_bytes: Any) -> Any:
        checked.append(where.paths.agent if hasattr(where, "paths") else where.agent)
        return real_check(where, check, count_bytes)

    monkeypatch.setattr(memd.compaction, "check_still_over", check_still_over)
    from memd.daemon.runner import Runner

    ended: list[tuple[str, str]] = []  # how each failed or stopped job ended
    runner_failed = Runner._failed

    def failed(self: Runner, entry: Any, error: BaseException, *args: Any, **kwargs: Any) -> None:
        ended.append((entry.name, type(error).__name__))
        runner_failed(self, entry, error, *args, **kwargs)

    monkeypatch.setattr(Runner, "_failed", failed)
    ws.create_agent("first")
    second = ws.create_agent("second")
    gated = GatedSummarizer(
        " ".join(f"The user and the assistant went over point {n}." for n in range(10))
    )
    summarized: list[str] = []
    gated_summarize = gated.summarize

    def summarize(request: SummaryRequest) -> SummaryResult:
        summarized.append(request.agent)
        return gated_summarize(request)

    monkeypatch.setattr(gated, "summarize", summarize)
    h = run_daemon(
        ws,
        config={
            "daemon": {"max_concurrent_llm": 1},
            "summarizer": {"keep_recent_tokens": 0},
            "watch": {"poll": True, "poll_interval_s": 0.1, "reconcile_s": 3600},
        },
        summarizer_factory=lambda _config, _count: gated,
    )
    runner = h.daemon.services.runner
    fill(ws, "first", 20)
    assert wait_until(lambda: gated.active == 1, timeout=60)  # first's summary holds the slot
    memory = fill(ws, "second", 20)
    assert wait_until(
        lambda: "second" in runner.running() and len(runner.llm_slots._cond._waiters) == 1,
        timeout=60,
    )
    try:
        compact_now(ws, "second", tmp_path / "state")
    finally:
        gated.release.set()
    busy = (JobState.PENDING, JobState.RUNNING)
    assert wait_until(
        lambda: not runner.running() and h.job("first") not in busy and h.job("second") not in busy,
        timeout=60,
    )
    assert "second" in checked  # the job on the stale count did start
    assert ("second", "UnderThreshold") in ended
    assert {how for agent, how in ended if agent == "second"} == {"UnderThreshold"}
    assert wait_until(lambda: h.tokens("second") == full_tokens(memory), timeout=20)
    assert "second" not in summarized
    assert len(list(second.archive_dir.glob("history_*.md"))) == 1  # compact-now's
    assert h.daemon.services.stats.compactions_ok == 1  # first's
    assert h.daemon.services.stats.compactions_failed == 0
    # Stopped as already done (under threshold once locked), not cooled down as
    # over threshold with nothing to compact (what the transaction would say next).
    job = h.daemon.services.registry.get("second").job
    assert (job.state, job.last_error, job.next_attempt_at) == (JobState.IDLE, None, None)
    assert h.stop() == 0


def test_polling_reads_a_descriptor_written_during_the_start_up_pass_again(
    ws: AgentWorkspace, run_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polled folders are watched only after the start-up pass (the poller's first
    # look is its baseline): a memd-agent.json written after the pass read the
    # folder is read again before READY, or it would wait for its next change.
    from memd.daemon.registry import AgentRegistry

    ws.create_agent("nfs")
    make_entry = AgentRegistry.make_entry
    descriptor = {"format": "memd-agent", "version": 1, "agent": "nfs", "context_length": 3000}

    def make_then_write(registry: AgentRegistry, name: str, *args: Any) -> Any:
        entry = make_entry(registry, name, *args)
        (ws.root / "agents" / name / "memd-agent.json").write_text(json.dumps(descriptor))
        return entry

    monkeypatch.setattr(AgentRegistry, "make_entry", make_then_write)
    h = run_daemon(ws, compact=ScriptedCompaction(), config={"watch": {"poll": True}})
    entry = h.daemon.services.registry.get("nfs")
    assert entry.policy.window_source == "memd-agent.json"
    assert entry.policy.context_length == 3000
    h.stop()


def test_concurrent_writer_processes_final_count_equals_full_recount(
    ws: AgentWorkspace, run_daemon: Any
) -> None:
    ws.create_agent("shared")
    memory = ws.root / "agents" / "shared" / "MEMORY.md"
    h = run_daemon(ws, compact=ScriptedCompaction(), config={"trigger": {"context_length": 10**7}})
    writer = (
        "import sys, time\n"
        "from support.memfiles import append_entry\n"
        "from pathlib import Path\n"
        "p = Path(sys.argv[1]); w = sys.argv[2]\n"
        "for i in range(150):\n"
        "    append_entry(p, 'Human', f'writer {w} entry {i} ' + 'é😀 tokens ' * (i % 7))\n"
        "    time.sleep(0.002)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    procs = [
        subprocess.Popen([sys.executable, "-c", writer, str(memory), str(n)], env=env)
        for n in range(4)
    ]
    for proc in procs:
        assert proc.wait(60) == 0
    expected = full_tokens(memory)
    assert wait_until(lambda: h.tokens("shared") == expected, timeout=10), (
        h.tokens("shared"),
        expected,
    )
    assert h.stop() == 0


def test_restart_with_unchanged_files_does_not_retokenize(
    ws: AgentWorkspace, run_daemon: Any
) -> None:
    for name in ("a1", "a2", "a3"):
        ws.create_agent(name, entries=3)
    big = {"trigger": {"context_length": 10**6}}
    first = run_daemon(ws, compact=ScriptedCompaction(), config=big)
    assert wait_until(
        lambda: (
            {row.agent for row in first.daemon.services.flusher.store.agents()}
            == {"a1", "a2", "a3"}
            and not any(e.dirty for e in first.daemon.services.registry.agents().values())
        )
    )
    assert first.stop() == 0

    tokenized: list[int] = []

    class SpyCounter:
        def __init__(self, encoding: str) -> None:
            self.inner = TokenCounter(encoding)

        def count_bytes(self, data: bytes) -> int:
            tokenized.append(len(data))
            return self.inner.count_bytes(data)

        def count_text(self, text: str) -> int:
            return self.inner.count_text(text)

    append_entry(ws.root / "agents" / "a3" / "MEMORY.md", "AI", "changed while down")
    second = run_daemon(ws, compact=ScriptedCompaction(), config=big, counter_factory=SpyCounter)
    for name in ("a1", "a2", "a3"):
        assert second.tokens(name) == full_tokens(ws.root / "agents" / name / "MEMORY.md")
    # a1 and a2 came from the state DB; only a3 (appended) was read, and only its tail
    assert 0 < sum(tokenized) < (ws.root / "agents" / "a3" / "MEMORY.md").stat().st_size
    assert second.stop() == 0


# ------------------------------------------------------------------- scheduling


def test_over_threshold_compacts_once_and_state_is_persisted(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path
) -> None:
    ws.create_agent("alice")
    ws.create_agent("quiet")
    compact = ScriptedCompaction("ok")
    h = run_daemon(ws, compact=compact)
    fill(ws, "alice", 20)
    assert wait_until(lambda: compact.committed == 1)
    assert wait_until(lambda: h.job("alice") is JobState.IDLE)
    assert compact.calls == ["alice"]
    # an entry appended just after the commit is counted by its own event, which
    # may still be on its way: wait for the count to reach the file
    memory = ws.root / "agents/alice/MEMORY.md"
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory))
    assert full_tokens(memory) < 250
    store = StateStore.open(tmp_path / "state", ws.root)
    try:
        assert wait_until(lambda: (r := store.get_agent("alice")) is not None and r.tokens < 250)
        [entry] = store.history("alice")
        assert entry.trigger == "daemon" and entry.error is None
        heartbeat = store.read_heartbeat()
        assert heartbeat is not None and heartbeat.pid == os.getpid() and heartbeat.healthy
    finally:
        store.close()
    assert h.stop() == 0


def test_trigger_during_a_run_runs_exactly_once_more(ws: AgentWorkspace, run_daemon: Any) -> None:
    ws.create_agent("alice")
    compact = ScriptedCompaction("slow", "ok")
    h = run_daemon(ws, compact=compact)
    fill(ws, "alice", 20)
    assert compact.entered.wait(10)
    # The run has not committed yet; more appends push the count up again.
    memory = fill(ws, "alice", 20)
    assert wait_until(lambda: h.daemon.services.registry.agents()["alice"].job.rerun_requested)
    # slow finishes by writing a small file, then the late appends would be
    # lost in a real run; here we append again after it so the rerun is due
    compact.release.set()
    assert wait_until(lambda: compact.committed == 1)
    fill(ws, "alice", 20)
    assert wait_until(lambda: compact.committed == 2)
    assert compact.calls == ["alice", "alice"]
    assert compact.peak == 1
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory))
    h.stop()


class GatedSummarizer:
    """Each summary waits for ``release``; counts the summaries in flight."""

    model = "gated"

    def __init__(self, text: str = "summary") -> None:
        self.text = text
        self.active = 0
        self.peak = 0
        self.lock = threading.Lock()
        self.release = threading.Event()

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            assert self.release.wait(20)
            return SummaryResult(text=self.text, model=self.model)
        finally:
            with self.lock:
                self.active -= 1


def test_global_cap_on_concurrent_summaries(ws: AgentWorkspace, run_daemon: Any) -> None:
    # max_concurrent_llm bounds the summaries: the other jobs wait for a slot
    # before their transaction starts (their agents' locks are free meanwhile).
    names = [f"agent{n}" for n in range(5)]
    for name in names:
        ws.create_agent(name)
    compact = ScriptedCompaction(*["summarize"] * 5)
    gated = GatedSummarizer()
    h = run_daemon(ws, compact=compact, summarizer_factory=lambda _config, _count: gated)
    runner = h.daemon.services.runner
    for name in names:
        fill(ws, name, 20)
    assert wait_until(
        lambda: (
            gated.active == 2
            and len(runner.running()) == 5
            and len(runner.llm_slots._cond._waiters) == 3
        )
    )
    assert gated.active == 2  # max_concurrent_llm = 2
    assert compact.active == 2  # the three waiting have not entered their transaction
    gated.release.set()
    assert wait_until(lambda: compact.committed == 5)
    assert gated.peak == 2
    assert sorted(compact.calls) == names
    h.stop()


def test_the_file_work_after_a_summary_runs_without_its_llm_slot(
    ws: AgentWorkspace, run_daemon: Any
) -> None:
    # One slot, two jobs: each gives the slot back when its summary returns, so
    # the second summarizes while the first commits and drains.
    for name in ("first", "second"):
        ws.create_agent(name)
    compact = ScriptedCompaction("summarize-slow", "summarize-slow")
    gated = GatedSummarizer()
    gated.release.set()
    h = run_daemon(
        ws,
        compact=compact,
        config={"daemon": {"max_concurrent_llm": 1}},
        summarizer_factory=lambda _config, _count: gated,
    )
    for name in ("first", "second"):
        fill(ws, name, 20)
    assert wait_until(lambda: compact.summarized == 2 and compact.active == 2)
    compact.release.set()
    assert wait_until(lambda: compact.committed == 2)
    assert gated.peak == 1
    h.stop()


def test_global_cap_on_concurrent_compactions(ws: AgentWorkspace, run_daemon: Any) -> None:
    names = [f"agent{n}" for n in range(5)]
    for name in names:
        ws.create_agent(name)
    # Each job summarizes (one LLM slot, given back when the summary returns),
    # then waits in its file work: max_concurrent_io bounds the jobs in flight.
    compact = ScriptedCompaction(*["summarize-slow"] * 5)
    gated = GatedSummarizer()
    gated.release.set()
    h = run_daemon(
        ws,
        compact=compact,
        config={"daemon": {"max_concurrent_io": 3, "max_concurrent_llm": 1}},
        summarizer_factory=lambda _config, _count: gated,
    )
    for name in names:
        fill(ws, name, 20)
    assert wait_until(lambda: compact.active == 3 and compact.summarized == 3)
    assert compact.active == 3  # max_concurrent_io = 3
    assert len(h.daemon.services.runner.running()) == 3  # the other two not started
    compact.release.set()
    assert wait_until(lambda: compact.committed == 5)
    assert compact.peak == 3
    assert sorted(compact.calls) == names
    h.stop()


def test_stop_cancels_jobs_waiting_for_an_llm_slot(ws: AgentWorkspace, run_daemon: Any) -> None:
    names = [f"agent{n}" for n in range(4)]
    for name in names:
        ws.create_agent(name)
    compact = ScriptedCompaction(*["summarize"] * 4)
    gated = GatedSummarizer()
    h = run_daemon(ws, compact=compact, summarizer_factory=lambda _config, _count: gated)
    runner = h.daemon.services.runner
    for name in names:
        fill(ws, name, 20)
    assert wait_until(
        lambda: (
            gated.active == 2
            and len(runner.running()) == 4
            and len(runner.llm_slots._cond._waiters) == 2
        )
    )
    stopper = threading.Thread(target=h.stop)
    stopper.start()
    # The two waiting for a slot give up at once; the two summarizing finish.
    assert wait_until(lambda: len(runner.running()) == 2)
    assert compact.active == 2
    gated.release.set()
    stopper.join(30)
    assert h.code == 0
    assert compact.committed == 2
    # Cancelled, not failed: no backoff is carried into the next start.
    assert h.daemon.services.stats.compactions_failed == 0
    assert all(h.job(name) is not JobState.BACKOFF for name in names)


def test_a_job_waiting_for_an_llm_slot_leaves_its_agents_lock_free(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path
) -> None:
    # A storm: every LLM slot busy, another agent's job queued for one. That wait
    # can last minutes; the agent's lock must be free meanwhile, or compact-now
    # (forget, prune) on it times out on the lock of a job that is doing nothing.
    ws.create_agent("first")
    second = ws.create_agent("second")
    # Long enough not to be refused as degenerate (the real transaction runs).
    gated = GatedSummarizer(
        " ".join(f"The user and the assistant went over point {n}." for n in range(10))
    )
    h = run_daemon(
        ws,
        config={"daemon": {"max_concurrent_llm": 1}, "summarizer": {"keep_recent_tokens": 0}},
        summarizer_factory=lambda _config, _count: gated,
    )
    runner = h.daemon.services.runner
    fill(ws, "first", 20)
    # Generous deadlines: each wait ends on its condition, however loaded the machine.
    assert wait_until(lambda: gated.active == 1, timeout=60)  # first's summary holds the slot
    fill(ws, "second", 20)
    assert wait_until(
        lambda: "second" in runner.running() and len(runner.llm_slots._cond._waiters) == 1,
        timeout=60,
    )
    try:
        result = subprocess.run(
            [
                *(sys.executable, "-m", "memd", "compact-now", "second", "--wait", "10"),
                *("--summary", "compacted by hand", "--workspace", str(ws.root)),
                *("--state-dir", str(tmp_path / "state")),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "MEMD_COMPACTION_DRAIN_QUIET_S": "0.05"},
            check=False,
        )
    finally:
        gated.release.set()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("second: compacted ")
    # The daemon's job for second gets its slot, then its lock, and finds the
    # work done (under threshold): nothing more is archived, nothing lost.
    # Both jobs' outcomes applied: a job leaves runner.running() before its
    # outcome is (compactions_ok counted, its state out of RUNNING), so waiting on
    # running() alone saw first's compaction uncounted when its thread was slow.
    busy = (JobState.PENDING, JobState.RUNNING)
    assert wait_until(
        lambda: not runner.running() and h.job("first") not in busy and h.job("second") not in busy,
        timeout=60,
    )
    assert len(list(second.archive_dir.glob("history_*.md"))) == 1
    seen = entry_contents_everywhere(second)
    assert sum(seen.values()) == 20 and all(count == 1 for count in seen.values())
    assert h.daemon.services.stats.compactions_ok == 1  # first's
    assert h.daemon.services.stats.compactions_failed == 0
    assert h.stop() == 0


def test_failures_back_off_then_open_the_breaker(ws: AgentWorkspace, run_daemon: Any) -> None:
    ws.create_agent("flaky")
    ws.create_agent("healthy")
    compact = ScriptedCompaction("fail", "fail", "fail")
    h = run_daemon(ws, compact=compact)
    fill(ws, "flaky", 20)
    assert wait_until(lambda: h.job("flaky") is JobState.BREAKER_OPEN, timeout=10)
    entry = h.daemon.services.registry.agents()["flaky"]
    assert entry.job.consecutive_failures == 3
    assert "scripted failure" in (entry.job.last_error or "")
    assert compact.calls == ["flaky"] * 3
    # other agents are unaffected
    fill(ws, "healthy", 20)
    assert wait_until(lambda: compact.committed == 1)
    assert compact.calls[-1] == "healthy"
    h.stop()


def test_hysteresis_cooldown_instead_of_a_loop(ws: AgentWorkspace, run_daemon: Any) -> None:
    ws.create_agent("stubborn")
    compact = ScriptedCompaction("big", "ok")
    h = run_daemon(ws, compact=compact, config={"daemon": {"cooldown_s": 2.0}})
    fill(ws, "stubborn", 20)
    assert wait_until(lambda: compact.committed == 1)
    assert wait_until(lambda: h.job("stubborn") is JobState.COOLDOWN)
    assert h.tokens("stubborn") >= 300  # above low water (0.6 × 500)
    fill(ws, "stubborn", 10)
    assert compact.calls == ["stubborn"]  # not re-triggered during the cooldown
    assert wait_until(lambda: compact.committed == 2, timeout=10)  # tried again after it
    h.stop()


def test_busy_lock_and_nothing_to_compact_are_retried_without_counting_failures(
    ws: AgentWorkspace, run_daemon: Any
) -> None:
    ws.create_agent("alice")
    compact = ScriptedCompaction("busy", "nothing", "ok")
    h = run_daemon(ws, compact=compact)
    fill(ws, "alice", 20)
    assert wait_until(lambda: compact.committed == 1, timeout=10)
    assert h.daemon.services.registry.agents()["alice"].job.consecutive_failures == 0
    h.stop()


def test_recount_under_the_lock_skips_work_another_compactor_did(
    ws: AgentWorkspace, run_daemon: Any
) -> None:
    ws.create_agent("alice")
    compact = ScriptedCompaction("preempted")
    h = run_daemon(ws, compact=compact)
    fill(ws, "alice", 20)
    assert wait_until(lambda: compact.calls == ["alice"])
    assert wait_until(lambda: h.job("alice") is JobState.IDLE)
    assert compact.committed == 0
    assert (
        h.daemon.services.stats.compactions_failed == 0
        and h.daemon.services.stats.compactions_ok == 0
    )
    h.stop()


def test_compress_off_agents_are_counted_never_compacted(
    ws: AgentWorkspace, run_daemon: Any
) -> None:
    ws.create_agent("watchonly")
    compact = ScriptedCompaction()
    h = run_daemon(
        ws, compact=compact, config={"agents": {"watch*": {"context_compression": False}}}
    )
    memory = fill(ws, "watchonly", 30)
    assert wait_until(lambda: h.tokens("watchonly") == full_tokens(memory))
    assert compact.calls == [] and h.job("watchonly") is JobState.DISABLED
    h.stop()


# ------------------------------------------------------------------- bad input


def test_bad_input_is_logged_per_agent_and_others_are_unaffected(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path
) -> None:
    for name in ("garbage", "escape", "notafile", "good"):
        ws.create_agent(name)
    outside = tmp_path / "outside.md"
    outside.write_text("secret " * 1000)
    h = run_daemon(ws, compact=ScriptedCompaction(), config={"trigger": {"context_length": 10**6}})
    agents = ws.root / "agents"
    # binary garbage and invalid UTF-8: counted exactly (decoded with replacement)
    with (agents / "garbage" / "MEMORY.md").open("ab") as f:
        f.write(bytes(range(256)) * 50 + b"\xff\xfe\xc3(")
    # a symlink out of the workspace: refused
    (agents / "escape" / "MEMORY.md").unlink()
    (agents / "escape" / "MEMORY.md").symlink_to(outside)
    # not a regular file
    (agents / "notafile" / "MEMORY.md").unlink()
    (agents / "notafile" / "MEMORY.md").mkdir()
    garbage = agents / "garbage" / "MEMORY.md"
    assert wait_until(lambda: h.tokens("garbage") == full_tokens(garbage))
    assert wait_until(lambda: h.daemon.services.registry.agents()["escape"].count_error is not None)
    assert "resolves outside the agent's own folder" in str(
        h.daemon.services.registry.agents()["escape"].count_error
    )
    assert wait_until(
        lambda: h.daemon.services.registry.agents()["notafile"].count_error is not None
    )
    good = fill(ws, "good", 3)
    assert wait_until(lambda: h.tokens("good") == full_tokens(good))
    # a fixed file is picked up by the next reconcile
    (agents / "notafile" / "MEMORY.md").rmdir()
    (agents / "notafile" / "MEMORY.md").write_text(swarms_header("notafile"))
    assert wait_until(
        lambda: h.daemon.services.registry.agents()["notafile"].count_error is None, timeout=5
    )
    assert h.daemon.services.healthy()
    h.stop()


def test_agent_folder_symlinked_outside_is_skipped(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path
) -> None:
    ws.create_agent("inside")
    (tmp_path / "elsewhere").mkdir()
    (ws.root / "agents" / "evil").symlink_to(tmp_path / "elsewhere")
    h = run_daemon(ws, compact=ScriptedCompaction())
    assert set(h.daemon.services.registry.agents()) == {"inside"}
    h.stop()


def test_subprocess_a_link_to_an_agents_folder_does_not_stop_its_compactions(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    # Any agent may add an entry to agents/: agents/thief -> good made every
    # compaction of good fail ("resolves into another agent's folder") until its
    # breaker opened. The link is skipped; good is compacted.
    ws.create_agent("good", entries=1)
    (ws.root / "agents" / "thief").symlink_to("good")
    with DaemonProcess(
        ws.root, tmp_path / "state", config=write_config(tmp_path / "memd.toml")
    ) as d:
        assert d.wait_ready()["agents"] == 1
        assert d.wait_for("agent skipped")["agent"] == "thief"
        fill(ws, "good", 20)
        d.wait_for("compacted", lambda line: line.get("agent") == "good", timeout=60)
        assert d.stop() == 0
    assert not d.events("compaction failed")


def test_file_deleted_mid_compaction_is_retried(ws: AgentWorkspace, run_daemon: Any) -> None:
    ws.create_agent("alice")
    h = run_daemon(ws)  # the real transaction, built-in summarizer
    memory = fill(ws, "alice", 20)
    # deleting the file races the compaction; whatever wins, the daemon survives
    memory.unlink()
    assert h.daemon.services.healthy()
    memory.write_text(swarms_header("alice"))
    fill(ws, "alice", 20)
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory) and h.tokens("alice") < 500)
    assert h.daemon.services.healthy()
    h.stop()


# ------------------------------------------------------------- watcher health


def test_dead_watcher_is_restarted_by_reconcile(
    ws: AgentWorkspace, run_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The backend is reached through its one swappable name (watchfiles' pattern).
    backends: list[Any] = []
    real_make_backend = memd.watcher.make_backend

    def make_backend(*args: Any, **kwargs: Any) -> Any:
        backends.append(real_make_backend(*args, **kwargs))
        return backends[-1]

    monkeypatch.setattr(memd.watcher, "make_backend", make_backend)
    ws.create_agent("alice")
    h = run_daemon(ws, compact=ScriptedCompaction(), config={"trigger": {"context_length": 10**6}})
    assert h.daemon.services.watches.watcher is not None and len(backends) == 1
    backends[0].stop()  # the observer thread dies silently
    assert not h.daemon.services.healthy()
    memory = fill(ws, "alice", 2)  # an event nobody sees
    assert wait_until(lambda: h.daemon.services.healthy(), timeout=5)
    assert len(backends) == 2  # restarted with a new backend
    assert wait_until(lambda: h.tokens("alice") == full_tokens(memory))
    h.stop()


# ----------------------------------------------------------------- end to end


def test_end_to_end_real_compaction_with_concurrent_writers(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path
) -> None:
    paths = ws.create_agent("busy")
    h = run_daemon(ws, config={"trigger": {"context_length": 4000}})
    writer = (
        "import sys, time\n"
        "from support.memfiles import append_entry\n"
        "from pathlib import Path\n"
        "p = Path(sys.argv[1]); w = sys.argv[2]\n"
        "for i in range(120):\n"
        "    append_entry(p, 'Human', f'writer {w} entry {i} ' + 'lorem ipsum ' * 12)\n"
        "    time.sleep(0.004)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    procs = [
        subprocess.Popen([sys.executable, "-c", writer, str(paths.memory), str(n)], env=env)
        for n in range(3)
    ]
    for proc in procs:
        assert proc.wait(60) == 0
    assert wait_until(lambda: h.daemon.services.stats.compactions_ok >= 1, timeout=20)
    assert wait_until(
        lambda: not h.daemon.services.runner.running() and h.job("busy") is not JobState.PENDING
    )
    # every entry exactly once across archives and the live file
    seen = entry_contents_everywhere(paths)
    expected = {
        f"writer {w} entry {i} " + "lorem ipsum " * 12 for w in range(3) for i in range(120)
    }
    assert {k.strip() for k in seen} >= {e.strip() for e in expected}
    assert all(count == 1 for count in seen.values())
    assert wait_until(lambda: h.tokens("busy") == full_tokens(paths.memory))
    store = StateStore.open(tmp_path / "state", ws.root)
    try:
        assert wait_until(
            lambda: len(store.history("busy")) == h.daemon.services.stats.compactions_ok
        )
        assert all(entry.trigger == "daemon" and entry.archive for entry in store.history("busy"))
    finally:
        store.close()
    assert h.stop() == 0


def test_the_new_file_of_a_real_compaction_is_never_counted_from_scratch(
    ws: AgentWorkspace, run_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job hands on its count of the file it wrote (the kept turns' tokens
    # reused); the count thread leaves that file to it while the job runs.
    import memd.counting as counting

    recounted: list[int] = []
    recount = counting._recount_open

    def recording(fd: int, info: os.stat_result, *args: Any) -> Any:
        recounted.append(info.st_ino)
        return recount(fd, info, *args)

    monkeypatch.setattr(counting, "_recount_open", recording)
    paths = ws.create_agent("alice")
    # The drain's quiet wait outlasts the debounce (1 s and 0.5 s by default): the
    # replace's event is counted while the job still runs.
    config = {"trigger": {"context_length": 4000}, "compaction": {"drain_quiet_s": 0.5}}
    h = run_daemon(ws, config=config)
    fill(ws, "alice", 120)
    assert wait_until(lambda: h.daemon.services.stats.compactions_ok >= 1, timeout=20)
    assert wait_until(lambda: not h.daemon.services.runner.running())
    assert wait_until(lambda: h.tokens("alice") == full_tokens(paths.memory))
    kept = parse(paths.memory.read_bytes()).entries[1:]
    assert len(kept) >= 2  # the newest turns were kept verbatim
    assert paths.memory.stat().st_ino not in recounted
    assert h.stop() == 0


def test_two_daemons_on_one_workspace_are_serialized_by_the_agent_lock(
    ws: AgentWorkspace, run_daemon: Any
) -> None:
    paths = ws.create_agent("shared")
    config = {"trigger": {"context_length": 4000}, "daemon": {"retry_base_s": 0.2}}
    first = run_daemon(ws, config=config)
    second = run_daemon(ws, config=config)
    for n in range(150):
        append_entry(paths.memory, "Human", f"entry {n} " + "lorem ipsum " * 12)
        if n % 10 == 0:
            time.sleep(0.02)
    daemons = (first.daemon, second.daemon)
    assert wait_until(
        lambda: sum(d.services.stats.compactions_ok for d in daemons) >= 1, timeout=20
    )
    assert wait_until(
        lambda: (
            all(not d.services.runner.running() for d in daemons)
            and all(h.tokens("shared") == full_tokens(paths.memory) for h in (first, second))
        ),
        timeout=20,
    )
    seen = entry_contents_everywhere(paths)
    assert len(seen) == 150 and set(seen.values()) == {1}
    # Checked once both have stopped: a failure counted after running() emptied
    # (a job leaves it before its outcome is counted) is seen too.
    assert first.stop() == 0
    assert second.stop() == 0
    assert all(d.services.stats.compactions_failed == 0 for d in daemons)


def test_forced_shutdown_aborts_before_commit(ws: AgentWorkspace, run_daemon: Any) -> None:
    ws.create_agent("alice")
    compact = ScriptedCompaction("checkpoints")
    h = run_daemon(ws, compact=compact)
    memory = fill(ws, "alice", 20)
    assert compact.entered.wait(10)
    before = memory.read_bytes()
    h.daemon.handle_exit(signal.SIGINT, None)
    h.daemon.handle_exit(signal.SIGINT, None)  # the second SIGINT forces
    h.thread.join(10)
    assert h.code == 130
    assert compact.committed == 0
    assert memory.read_bytes() == before


# ----------------------------------------------------------------- subprocess


def write_config(path: Path, summarizer: str = "") -> Path:
    path.write_text(
        "[trigger]\ncontext_length = 1000\nthreshold = 0.5\ndebounce_ms = 40\nmax_wait_ms = 200\n"
        "[watch]\nreconcile_s = 0.5\n"
        "[compaction]\ndrain_quiet_s = 0.05\n"
        "[daemon]\nstate_flush_s = 0.2\nretry_base_s = 0.2\n"
        "[summarizer]\nmax_tokens = 120\n" + summarizer
    )
    return path


def test_a_threshold_changed_while_down_reaches_the_state_db_at_restart(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    # `memd status` reads the row: it must not keep showing the old threshold
    # (until the agent's next append) while the daemon already uses the new one.
    ws.create_agent("a1", entries=3)
    # A folder changed in the last 2 s is listed again at a restart (and its row
    # written anyway): let it age, so the restart takes the stored facts as they are.
    time.sleep(2.1)
    config = tmp_path / "memd.toml"
    for context_length, threshold in ((100_000, 90_000), (50_000, 45_000)):
        config.write_text(f"[trigger]\ncontext_length = {context_length}\n")
        with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
            daemon.wait_ready()
            # Written by the start-up flush, before READY (the archive survey
            # would write the row again later, hiding a stale threshold).
            with StateStore.open(tmp_path / "state", ws.root) as store:
                row = store.get_agent("a1")
            assert row is not None and row.threshold_tokens == threshold, row
            assert daemon.stop() == 0


@pytest.mark.parametrize(
    ("table", "column", "value"),
    [
        ("count_marks", "marks", "'0123456789abcdef0'"),
        ("count_marks", "marks", "5"),
        ("count_marks", "marks", "1.5"),
        ("agents", "tokens", "'abc'"),
        ("agents", "next_attempt_at", "'soon'"),
    ],
)
def test_a_wrongly_typed_stored_value_never_stops_the_daemon_from_starting(
    ws: AgentWorkspace, tmp_path: Path, table: str, column: str, value: str
) -> None:
    # SQLite keeps any type in any column (a damaged or hand-edited state DB): the
    # restart restored it and stopped with a traceback before READY, on every
    # restart (review 13b, R3). Now a bad row is not restored (one warning line
    # naming the agent and the column: the file is counted again); marks that
    # are no blob are none, silently.
    ws.create_agent("alice")
    memory = fill(ws, "alice", 5)
    ws.create_agent("bob", entries=2)
    config = write_config(tmp_path / "memd.toml")
    config.write_text(
        config.read_text().replace("context_length = 1000", "context_length = 100000")
    )
    state = tmp_path / "state"
    with DaemonProcess(ws.root, state, config=config) as daemon:
        daemon.wait_ready()
        assert daemon.stop() == 0
    with StateStore.open(state, ws.root) as store:
        assert store.path is not None
        row = store.get_agent("alice")
        assert row is not None and row.tokens == full_tokens(memory)
        conn = sqlite3.connect(store.path)
        conn.execute(
            "INSERT OR REPLACE INTO count_marks VALUES ('alice', ?, ?, x'01')", (row.dev, row.ino)
        )
        conn.execute(f"UPDATE {table} SET {column} = {value} WHERE agent = 'alice'")
        conn.commit()
        conn.close()
    with DaemonProcess(ws.root, state, config=config) as daemon:
        daemon.wait_ready()
        warned = [line for line in daemon.lines if line.get("column") is not None]
        if table == "agents":
            assert [(line["agent"], line["column"], line["level"]) for line in warned] == [
                ("alice", column, "warning")
            ]
        else:
            assert warned == []
        with StateStore.open(state, ws.root) as store:
            assert wait_until(
                lambda: (
                    (r := store.get_agent("alice")) is not None and r.tokens == full_tokens(memory)
                )
            )
        assert daemon.stop() == 0
    assert not any("Traceback" in line for line in daemon.raw)


def test_a_newer_memds_state_db_stops_the_daemon_in_one_line_and_is_kept(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    # Never moved aside or rebuilt (review 13b, R6): the newer memd's ledger,
    # spending and erasures stay; this daemon says why it cannot run and exits.
    ws.create_agent("alice", entries=2)
    state = tmp_path / "state"
    with StateStore.open(state, ws.root) as store:
        store.write_heartbeat(pid=1, started_at=0, healthy=True, detail="", agents=0, ts=1)
        path = store.path
        assert path is not None
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = 12")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    daemon = DaemonProcess(ws.root, state, config=write_config(tmp_path / "memd.toml"))
    with daemon:
        code = daemon.wait()
    assert code == 2  # bad input: the unit's RestartPreventExitStatus=2, no restart loop
    line = (
        f"memd: error: state DB {path} is schema 12, written by a newer memd;"
        f" this memd reads up to {memd.state.SCHEMA_VERSION}\n"
    )
    assert line in daemon.raw and not any("Traceback" in text for text in daemon.raw)
    assert path.read_bytes() == before and memd.state.corrupt_copies(path) == []
    assert daemon.events("ready") == []


def test_subprocess_lifecycle_notify_and_sigterm(ws: AgentWorkspace, tmp_path: Path) -> None:
    ws.create_agent("alice", entries=1)
    config = write_config(tmp_path / "memd.toml")
    with (
        NotifyListener(tmp_path / "notify.sock") as notify,
        DaemonProcess(
            ws.root,
            tmp_path / "state",
            config=config,
            env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "300000"},
        ) as daemon,
    ):
        ready = daemon.wait_ready()
        assert ready["agents"] == 1 and ready["workspace"] == str(ws.root)
        assert ready["litellm_loaded"] is False
        first = notify.wait_for("READY=1")
        assert "STATUS=watching 1 agents" in notify.messages[first]
        notify.wait_for("WATCHDOG=1", after=first)
        # a compaction through the real transaction, in the real process
        fill(ws, "alice", 20)
        line = daemon.wait_for("compacted", lambda line: line.get("agent") == "alice")
        assert line["tokens_after"] < 300
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
        notify.wait_for("STOPPING=1")
        assert daemon.events("stopped")[0]["exit_code"] == 0
    archives = list((ws.root / "agents/alice/archive").glob("history_*.md"))
    assert len(archives) == 1


def test_subprocess_sighup_reloads_config(ws: AgentWorkspace, tmp_path: Path) -> None:
    ws.create_agent("alice")
    config = write_config(tmp_path / "memd.toml").read_text()
    path = tmp_path / "memd.toml"
    path.write_text(config.replace("context_length = 1000", "context_length = 100000"))
    with (
        NotifyListener(tmp_path / "n.sock") as notify,
        DaemonProcess(
            ws.root,
            tmp_path / "state",
            config=path,
            # An EnvironmentFile= variable: it wins over memd.toml, and the
            # logs say so at start and at every reload.
            env={"NOTIFY_SOCKET": str(tmp_path / "n.sock"), "MEMD_DAEMON_COOLDOWN_S": "61"},
        ) as daemon,
    ):
        daemon.wait_ready()
        assert daemon.events("ready")[0]["env_overrides"] == ["MEMD_DAEMON_COOLDOWN_S"]
        memory = fill(ws, "alice", 20)
        # Under the high threshold: once the new count is in the state DB (a job
        # decision follows every count), nothing has been started.
        with StateStore.open(tmp_path / "state", ws.root) as store:
            expected = full_tokens(memory)
            assert wait_until(
                lambda: (r := store.get_agent("alice")) is not None and r.tokens == expected
            )
        assert daemon.events("compaction started") == []
        # a broken config is refused, the daemon keeps running
        path.write_text("[trigger]\nthreshold = 7\n")
        daemon.signal(signal.SIGHUP)
        daemon.wait_for("reload failed; keeping the previous configuration")
        reloading = notify.wait_for("RELOADING=1")
        notify.wait_for("READY=1", after=reloading)
        # lower the threshold: the agent is now over it and gets compacted
        path.write_text(config)
        daemon.signal(signal.SIGHUP)
        daemon.wait_for("reloaded")
        assert daemon.events("reloaded")[0]["env_overrides"] == ["MEMD_DAEMON_COOLDOWN_S"]
        daemon.wait_for("compacted", lambda line: line.get("agent") == "alice")
        assert daemon.stop() == 0


def test_subprocess_sigterm_waits_for_inflight_compaction_and_second_sigint_forces(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    from support.openai_server import OpenAITestServer, echo_summary

    ws.create_agent("slowpoke")
    ws.create_agent("patient")

    def long_enough(body: dict[str, Any]) -> str:
        # Past the degenerate-reply floor (a real summary of ~1k tokens is).
        return echo_summary(body) + "\nDecisions:\n" + "- keep the current plan\n" * 12

    with OpenAITestServer(responder=long_enough) as server:
        config = write_config(
            tmp_path / "memd.toml",
            f'model = "openai/test-model"\napi_base = "{server.api_base}"\n'
            'api_key = "sk-test"\nretries = 0\ntimeout_s = 60\n',
        )
        # 1) SIGTERM lets the in-flight compaction commit, then exits 0
        server.script("sleep:2")
        with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
            daemon.wait_ready()
            daemon.wait_for("summarizer loaded", timeout=120)  # a loaded machine: seconds
            fill(ws, "patient", 20)
            daemon.wait_for("compaction started", lambda line: line.get("agent") == "patient")
            # In flight once its summary has reached the server (a job still
            # waiting for an LLM slot would be cancelled instead).
            assert wait_until(lambda: len(server.requests) == 1, timeout=30)
            daemon.signal(signal.SIGTERM)
            assert daemon.wait(30) == 0
            assert daemon.events("compacted")[0]["agent"] == "patient"
        # 2) SIGINT waits; a second SIGINT forces, aborting before the commit
        server.script("sleep:30")
        memory = ws.root / "agents" / "slowpoke" / "MEMORY.md"
        with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
            daemon.wait_ready()
            fill(ws, "slowpoke", 20)
            daemon.wait_for("compaction started", lambda line: line.get("agent") == "slowpoke")
            assert wait_until(lambda: len(server.requests) == 2, timeout=30)
            before = memory.read_bytes()
            daemon.signal(signal.SIGINT)
            # The first SIGINT stops the daemon gently: it waits for the job in
            # flight (the rule itself: tests/daemon/test_lifecycle.py).
            stopping = daemon.wait_for("stopping")
            assert stopping["compacting"] == ["slowpoke"]
            assert daemon.proc is not None and daemon.proc.poll() is None
            daemon.signal(signal.SIGINT)
            # Forced: it exits while the LLM call (scripted to answer after
            # 30 s) is still in flight, without waiting for it.
            assert daemon.wait(15) == 130
            assert server.requests and not daemon.events("compacted")
            assert daemon.events("stopped")[-1]["exit_code"] == 130
        assert memory.read_bytes() == before
        assert not list((ws.root / "agents/slowpoke/archive").glob("history_*.md"))


def test_subprocess_sigterm_stops_retrying_a_trickling_summarizer(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    from support.openai_server import OpenAITestServer

    ws.create_agent("trickled")
    with OpenAITestServer() as server:
        config = write_config(
            tmp_path / "memd.toml",
            f'model = "openai/test-model"\napi_base = "{server.api_base}"\n'
            'api_key = "sk-test"\nretries = 2\ntimeout_s = 4\n',
        )
        # Every reply trickles (one byte every 0.5 s): only the wall-clock
        # deadline ends an attempt, and after SIGTERM no retry may start.
        server.script(*["trickle:0.5"] * 5)
        memory = fill(ws, "trickled", 0)
        with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
            daemon.wait_ready()
            # litellm is imported in the background after READY (not by the
            # first compaction), and says so.
            assert daemon.wait_for("summarizer loaded", timeout=120)["ok"] is True
            fill(ws, "trickled", 20)
            before = memory.read_bytes()
            daemon.wait_for("compaction started", lambda line: line.get("agent") == "trickled")
            # The job takes an LLM slot after its snapshot: the first attempt is
            # under way once the server has it.
            assert wait_until(lambda: len(server.requests) == 1, timeout=30)
            daemon.signal(signal.SIGTERM)
            assert daemon.wait(60) == 0
        assert len(server.requests) == 1
        assert memory.read_bytes() == before
        assert not list((ws.root / "agents/trickled/archive").glob("history_*.md"))


def test_subprocess_demo_compacts_with_the_builtin_summarizer(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    with DaemonProcess(demo, tmp_path / "state", extra_args=["--demo"]) as daemon:
        ready = daemon.wait_ready()
        assert ready["agents"] == 2 and ready["summarizer"] == "builtin"
        line = daemon.wait_for("compacted")
        assert line["model"] == "builtin"
        saved = daemon.wait_for(
            "demo settings saved in the workspace; later commands there use them"
        )
        assert saved["pointer"] == str(demo / ".memd-state")
        # Later commands on the demo workspace find the daemon and its settings
        # without --config or --state-dir (issue 8 D1, D4).
        health = memd_cli(tmp_path, "health", "--workspace", str(demo))
        assert health.returncode == 0, health.stderr
        assert "the daemon's pointer" in health.stdout
        assert daemon.stop() == 0
    assert list((demo / "agents").glob("*/archive/history_*.md"))
    status = memd_cli(tmp_path, "status", "--workspace", str(demo), "--json")
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)
    assert {row["threshold_tokens"] for row in rows} == {3600}  # 0.9 x the demo's 4,000
    assert {row["state_db"].startswith(str(tmp_path / "state")) for row in rows} == {True}
    health = memd_cli(tmp_path, "health", "--workspace", str(demo))
    assert health.returncode == 1 and "stopped at" in health.stderr


def memd_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``memd ARGS`` as an operator runs it: no MEMD_* variables, a HOME of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMD_", "STATE_DIRECTORY"))}
    env["HOME"] = str(tmp_path / "operator-home")
    return subprocess.run(
        [sys.executable, "-m", "memd", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_subprocess_large_cold_scan_uses_a_process_pool_and_counts_exactly(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    names = ["big1", "big2", "big3"]
    for name in names:
        memory = ws.create_agent(name).memory
        block = "".join(
            swarms_block("Human", f"{name} {n} " + "é lorem ipsum " * 30) for n in range(100)
        )
        with memory.open("a", encoding="utf-8") as handle:
            for _ in range(60):  # ~3 MB each
                handle.write(block)
    with (ws.root / "agents" / "big2" / "MEMORY.md").open("ab") as handle:
        handle.write(b"\xff\xfe garbage tail")
    config = write_config(tmp_path / "memd.toml").read_text()
    path = tmp_path / "memd.toml"
    path.write_text(config.replace("context_length = 1000", "context_length = 100000000"))
    with DaemonProcess(ws.root, tmp_path / "state", config=path) as daemon:
        line = daemon.wait_for("initial count")
        assert line["mode"] == "processes" and line["counted"] == 3
        daemon.wait_ready()
        assert daemon.stop() == 0
    with StateStore.open(tmp_path / "state", ws.root) as store:
        for name in names:
            record = store.get_agent(name)
            assert record is not None
            assert record.tokens == full_tokens(ws.root / "agents" / name / "MEMORY.md")


def test_run_refuses_a_missing_workspace_or_bad_config_with_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    base = [sys.executable, "-m", "memd", "run", "--state-dir", str(tmp_path / "state")]
    missing = subprocess.run(
        [*base, "--workspace", str(tmp_path / "nope")], capture_output=True, text=True, env=env
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"memd: error: workspace {tmp_path / 'nope'} does not exist"
    ]
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\nmax_concurrent_llm = 0\n")
    (tmp_path / "ws").mkdir()
    refused = subprocess.run(
        [*base, "--workspace", str(tmp_path / "ws"), "--config", str(bad)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert refused.returncode == 2
    [line] = refused.stderr.strip().splitlines()
    assert "daemon.max_concurrent_llm" in line and str(bad) in line
    # A bad value in systemd's EnvironmentFile= (memd.env): the same exit 2, which
    # the unit's RestartPreventExitStatus= keeps from restarting it forever.
    env_refused = subprocess.run(
        [*base, "--workspace", str(tmp_path / "ws")],
        capture_output=True,
        text=True,
        env={**env, "MEMD_TRIGGER_CONTEXT_LENGTH": "lots"},
    )
    assert env_refused.returncode == 2
    [line] = env_refused.stderr.strip().splitlines()
    assert line.startswith("memd: error: ") and "MEMD_TRIGGER_CONTEXT_LENGTH" in line


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KB tmpfs (root only): a disk that really fills up."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount_point)],
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr!r}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_full_disk_fails_the_compaction_cleanly_and_it_is_retried(
    tiny_fs: Path, run_daemon: Any
) -> None:
    ws = AgentWorkspace(tiny_fs / "ws")
    paths = ws.create_agent("hoarder")
    ws.create_agent("bystander")
    h = run_daemon(ws, config={"daemon": {"retry_base_s": 0.3, "retry_max_s": 0.6}})
    filler = tiny_fs / "filler"
    filler.write_bytes(b"\0" * (512 * 1024 - 200 * 1024))
    # ~150 KB of entries: fits once, but not a second time as the archive
    # One write: on a loaded machine a buffered loop lets the daemon compact a
    # part that still fits (and clear the failure) before the rest arrives.
    batch = "".join(
        swarms_block("Human", f"entry {n} " + "lorem ipsum dolor " * 25) for n in range(300)
    )
    with paths.memory.open("a", encoding="utf-8") as handle:
        handle.write(batch)
    assert wait_until(lambda: h.daemon.services.stats.compactions_failed >= 1, timeout=15)
    entry = h.daemon.services.registry.agents()["hoarder"]
    # The failure is tallied before the job's transition is applied: wait for that too.
    assert wait_until(lambda: entry.job.last_error is not None)
    assert "space" in (entry.job.last_error or "").lower()
    assert not list(paths.archive_dir.glob("history_*.md"))
    before = entry_contents_everywhere(paths)
    assert len(before) == 300 and set(before.values()) == {1}
    bystander = fill(ws, "bystander", 2)
    assert wait_until(lambda: h.tokens("bystander") == full_tokens(bystander))
    filler.unlink()  # space comes back: the backoff retry succeeds
    assert wait_until(lambda: h.daemon.services.stats.compactions_ok >= 1, timeout=15)
    after = entry_contents_everywhere(paths)
    assert after == before
    h.stop()


def test_subprocess_a_journal_nested_too_deeply_costs_only_its_agent(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    # The agent owns its folder, .memd/ included: a journal of "[" raised
    # json's RecursionError past recovery and the daemon never started.
    ws.create_agent("open", entries=1)
    ws.create_agent("planted", entries=1)
    private = ws.root / "agents" / "planted" / ".memd"
    private.mkdir()
    (private / "journal").write_bytes(b"[" * 8192)
    config = write_config(tmp_path / "memd.toml")
    with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
        ready = daemon.wait_ready()
        assert ready["agents"] == 2
        # Read as a journal with no intact record (a torn one's reading).
        recovered = daemon.wait_for("recovered an interrupted compaction")
        assert recovered["agent"] == "planted"
        assert "journal .memd/journal was unreadable" in recovered["action"]
        fill(ws, "open", 20)
        daemon.wait_for("compacted", lambda line: line.get("agent") == "open", timeout=60)
        assert daemon.stop() == 0


def test_subprocess_unreadable_agent_folder_is_skipped_then_picked_up(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run the daemon as another user")
    import shutil
    import tempfile

    from support.other_uid import unreachable_reason

    nobody = 65534
    # The daemon drops to uid 65534 after start-up but imports some modules
    # lazily: from a checkout that uid cannot traverse (a 0700 home), skip.
    unreachable = unreachable_reason(nobody)
    if unreachable is not None:
        pytest.skip(f"this checkout is not readable by uid {nobody}: {unreachable}")
    base = Path(tempfile.mkdtemp(prefix="memd-perm-", dir="/tmp"))
    try:
        base.chmod(0o755)
        ws = AgentWorkspace(base / "ws")
        ws.create_agent("open", entries=1)
        ws.create_agent("locked", entries=1)
        (base / "state").mkdir()
        for path in [base / "ws", base / "state", *(base / "ws").rglob("*")]:
            os.chown(path, nobody, nobody)
        locked = base / "ws" / "agents" / "locked"
        os.chown(locked, 0, 0)
        locked.chmod(0o000)
        config = write_config(base / "memd.toml")
        config.chmod(0o644)
        with DaemonProcess(ws.root, base / "state", config=config, user=nobody) as daemon:
            ready = daemon.wait_ready()
            assert ready["agents"] == 1
            skipped = daemon.wait_for("agent skipped")
            assert skipped["agent"] == "locked" and "ermission" in skipped["error"]
            # the other agent works normally
            fill(ws, "open", 20)
            daemon.wait_for("compacted", lambda line: line.get("agent") == "open")
            # fixed permissions are picked up by the next reconcile
            locked.chmod(0o755)
            os.chown(locked, nobody, nobody)
            daemon.wait_for("agent added", lambda line: line.get("agent") == "locked")
            assert daemon.stop() == 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_warns_at_start_when_the_workspace_filesystem_breaks_locks(
    ws: AgentWorkspace, run_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import structlog

    import memd.doctor as doctor

    found = doctor.mount_of(ws.root.resolve(), Path("/proc/mounts").read_text())
    assert found is not None
    # Pretend this machine's own filesystem type is a network share.
    monkeypatch.setitem(doctor.REMOTE_FILESYSTEMS, found[1], "pretend NFS")
    ws.create_agent("a")
    with structlog.testing.capture_logs() as logs:
        h = run_daemon(ws, compact=ScriptedCompaction())
        h.stop()
    warnings = [e for e in logs if e["event"] == "workspace filesystem"]
    assert warnings and "pretend NFS" in warnings[0]["detail"]
    assert warnings[0]["log_level"] == "warning"


def test_warns_at_start_when_a_remote_summarizer_gets_unredacted_text(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path
) -> None:
    import structlog

    from memd.redaction_key import key_path

    ws.create_agent("a")
    remote = {"summarizer": {"model": "openai/gpt-4o-mini"}, "privacy": {"redact": False}}
    with structlog.testing.capture_logs() as logs:
        h = run_daemon(ws, compact=ScriptedCompaction(), config=remote)
        h.stop()
    warnings = [e for e in logs if e["event"] == "privacy: remote summarizer without redaction"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert "redact = false" in warnings[0]["detail"]
    [ready] = [e for e in logs if e["event"] == "ready"]
    assert ready["redaction"] == "off (remote)"
    # The runner got the workspace's key from the state dir (made 0600 at start).
    key_file = key_path(tmp_path / "state", ws.root)
    assert (key_file.stat().st_mode & 0o777) == 0o600
    with structlog.testing.capture_logs() as logs:
        h = run_daemon(ws, compact=ScriptedCompaction())
        h.stop()
    assert not [e for e in logs if e["event"].startswith("privacy")]


def test_agent_folder_with_an_invalid_name_is_reported_once(
    ws: AgentWorkspace, run_daemon: Any
) -> None:
    import structlog

    ws.create_agent("fine")
    (ws.root / "agents" / "bad\nname").mkdir()
    (ws.root / "agents" / ".hidden").mkdir()
    with structlog.testing.capture_logs() as logs:
        h = run_daemon(ws, compact=ScriptedCompaction())
        h.stop()
    skipped = [e for e in logs if e["event"] == "agent skipped"]
    assert [e["agent"] for e in skipped] == [repr("bad\nname")]
    assert "control character" in skipped[0]["error"]
    assert set(h.daemon.services.registry.agents()) == {"fine"}


def test_subprocess_an_agent_folder_named_in_bytes_not_utf8_stops_no_one(
    ws: AgentWorkspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # os.fsdecode's surrogates reached the state DB, which refused every write
    # while the folder was there (no heartbeat: `memd health` and `memd reload`
    # said no daemon had run, `memd status` failed), and recall's sync thread died.
    from support.cli import run

    ws.create_agent("fine", entries=1)
    odd = os.path.join(os.fsencode(ws.root / "agents"), b"\xff\xfe")
    os.mkdir(odd)
    with open(os.path.join(odd, b"MEMORY.md"), "wb") as handle:
        handle.write(swarms_header("odd").encode())
    state = tmp_path / "state"
    where = ("--workspace", str(ws.root), "--state-dir", str(state))
    with DaemonProcess(ws.root, state, config=write_config(tmp_path / "memd.toml")) as daemon:
        assert daemon.wait_ready()["agents"] == 1
        skipped = daemon.wait_for("agent skipped")
        assert "not UTF-8" in skipped["error"], skipped
        fill(ws, "fine", 20)
        daemon.wait_for("compacted", lambda line: line.get("agent") == "fine", timeout=60)
        code, out, err = run(capsys, "health", *where)
        assert code == 0 and out.startswith("healthy"), (out, err)
        code, out, err = run(capsys, "status", *where)
        assert code == 0 and "fine" in out, (out, err)
        assert daemon.stop() == 0
    assert not daemon.events("<non-json>"), "".join(daemon.raw)
    assert not daemon.events("cannot write the state database")


def test_a_compaction_made_before_any_daemon_ran_is_the_agents_last(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path
) -> None:
    """`memd compact-now` before the first `memd run` finds no agent row to put its
    time in (only the ledger): the daemon takes it from there, and `memd status`
    shows it, not "never"."""
    from memd.state import LedgerEntry

    ws.create_agent("early", entries=2)
    ws.create_agent("never", entries=2)
    with StateStore.open(tmp_path / "state", ws.root) as store:
        for started, error in ((1_000.0, None), (2_000.0, "summarizer: timeout")):
            store.record_compaction(
                LedgerEntry(
                    agent="early",
                    started_at=started,
                    duration_s=1.5,
                    archive=None if error else "history_x.md",
                    tokens_before=5000,
                    tokens_after=None if error else 700,
                    model="builtin",
                    cost_usd=None,
                    error=error,
                    trigger="manual",
                )
            )
        assert store.agents() == []
    h = run_daemon(ws)
    agents = h.daemon.services.registry.agents()
    assert agents["early"].job.last_compaction_at == 1_001.5  # the failed one is not
    assert agents["never"].job.last_compaction_at is None
    assert h.stop() == 0
    with StateStore.open(tmp_path / "state", ws.root) as store:
        early, never = store.get_agent("early"), store.get_agent("never")
        assert early is not None and early.last_compaction_at == 1_001.5
        assert never is not None and never.last_compaction_at is None


def test_erased_agent_memory_resets_its_job(ws: AgentWorkspace, run_daemon: Any) -> None:
    """`memd forget` removes MEMORY.md and archive/: the daemon drops the agent's past."""
    import shutil

    ws.create_agent("gone")
    compact = ScriptedCompaction("ok")
    h = run_daemon(ws, compact=compact)
    fill(ws, "gone", 20)
    assert wait_until(lambda: compact.committed == 1)
    assert wait_until(
        lambda: h.daemon.services.registry.agents()["gone"].job.last_compaction_at is not None
    )
    folder = ws.root / "agents" / "gone"
    (folder / "archive").mkdir(exist_ok=True)
    shutil.rmtree(folder / "archive")
    (folder / "MEMORY.md").unlink()
    assert wait_until(
        lambda: h.daemon.services.registry.agents()["gone"].job.last_compaction_at is None
    )
    assert h.stop() == 0


# -- from review: restart trust --------------------
BIG = {"trigger": {"context_length": 10**6}}


def _settle(h):
    from support.daemon_proc import wait_until

    assert wait_until(
        lambda: not any(e.dirty for e in h.daemon.services.registry.agents().values())
    )


def test_same_size_rewrite_while_down_is_recounted(ws, run_daemon):
    ws.create_agent("a", entries=3)
    mem = ws.root / "agents/a/MEMORY.md"
    first = run_daemon(ws, compact=ScriptedCompaction(), config=BIG)
    _settle(first)
    assert first.stop() == 0
    ino = mem.stat().st_ino
    data = mem.read_bytes()
    # in-place rewrite (nano, `open('r+')`, an agent rewriting its file): same inode, same size
    new = data.replace(
        b"lorem ipsum", b"\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96"
    )  # 11 bytes -> 9 bytes
    new = new + b" " * (len(data) - len(new))
    assert len(new) == len(data)
    with open(mem, "r+b") as f:
        f.write(new)
    assert mem.stat().st_ino == ino
    second = run_daemon(ws, compact=ScriptedCompaction(), config=BIG)
    assert second.tokens("a") == full_tokens(mem), (second.tokens("a"), full_tokens(mem))


def test_truncate_and_regrow_while_down_is_recounted(ws, run_daemon):
    ws.create_agent("a", entries=3)
    mem = ws.root / "agents/a/MEMORY.md"
    first = run_daemon(ws, compact=ScriptedCompaction(), config=BIG)
    _settle(first)
    assert first.stop() == 0
    size = mem.stat().st_size
    # `: > MEMORY.md` then the agent writes a new header and more turns (same inode)
    with open(mem, "w") as f:
        f.write(swarms_header("a"))
    while mem.stat().st_size <= size:
        append_entry(mem, "AI", "完全不同的内容 " * 30)
    second = run_daemon(ws, compact=ScriptedCompaction(), config=BIG)
    assert second.tokens("a") == full_tokens(mem), (second.tokens("a"), full_tokens(mem))


def test_encoding_change_across_restart_recounts(ws, run_daemon):
    ws.create_agent("a", entries=0)
    mem = ws.root / "agents/a/MEMORY.md"
    for i in range(3):
        append_entry(mem, "AI", "これは日本語のテキストです。" * 20)
    first = run_daemon(ws, compact=ScriptedCompaction(), config=BIG)
    _settle(first)
    assert first.stop() == 0
    cfg = {"trigger": {"context_length": 10**6}, "tokenizer": {"encoding": "o200k_base"}}
    second = run_daemon(ws, compact=ScriptedCompaction(), config=cfg)
    expected = TokenCounter("o200k_base").count_bytes(mem.read_bytes())
    print("DBG", second.tokens("a"), expected, full_tokens(mem))
    assert second.tokens("a") == expected


# -- from review: reload encoding --------------------
TOML = """
[trigger]
context_length = {ctx}
threshold = 0.5
debounce_ms = 40
max_wait_ms = 200
[watch]
reconcile_s = 60
[daemon]
state_flush_s = 0.2
retry_base_s = 0.1
retry_max_s = 0.4
cooldown_s = 0.6
breaker_failures = 2
breaker_reset_s = 3600
[tokenizer]
encoding = "{enc}"
"""

gate = threading.Event()
blocking = threading.Event()
entered = threading.Event()


class GatedCounter:
    def __init__(self, encoding):
        self.encoding = encoding
        self.inner = TokenCounter(encoding)

    def count_bytes(self, data):
        if self.encoding == "cl100k_base" and blocking.is_set():
            entered.set()
            gate.wait(10)
        return self.inner.count_bytes(data)

    def count_text(self, text):
        return self.inner.count_text(text)


def start(tmp_path, ws, compact, ctx):
    cfg = tmp_path / "memd.toml"
    cfg.write_text(TOML.format(ctx=ctx, enc="cl100k_base"))
    loaded = load_settings(config_file=cfg, workspace=ws.root, environ={})
    opts = DaemonOptions(config_file=cfg, workspace_flag=ws.root, install_signal_handlers=False)
    d = Daemon(loaded, opts, compact=compact, counter_factory=GatedCounter, environ={})
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    assert d.ready.wait(20)
    return d, t, cfg


def jp(mem, n=1):
    for _ in range(n):
        append_entry(mem, "AI", "これは日本語のテキストです。" * 20)


def test_count_in_flight_during_reload_does_not_mix_encodings(tmp_path):
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("a")
    mem = ws.root / "agents/a/MEMORY.md"
    jp(mem, 3)
    d, t, cfg = start(tmp_path, ws, ScriptedCompaction(), 10**7)
    blocking.set()
    jp(mem)
    assert entered.wait(10)  # count thread is counting with cl100k
    cfg.write_text(TOML.format(ctx=10**7, enc="o200k_base"))
    d.handle_exit(signal.SIGHUP, None)
    assert wait_until(lambda: d.services.counter.tokenizer.encoding == "o200k_base")
    time.sleep(0.3)
    blocking.clear()
    gate.set()  # the old-encoding count lands after the reset
    time.sleep(0.5)
    jp(mem)
    o200k = TokenCounter("o200k_base")
    ok = wait_until(
        lambda: d.services.registry.agents()["a"].tokens == o200k.count_bytes(mem.read_bytes()),
        timeout=3,
    )
    got = d.services.registry.agents()["a"].tokens
    d.handle_exit(signal.SIGTERM, None)
    t.join(20)
    assert ok, (
        got,
        o200k.count_bytes(mem.read_bytes()),
        CL100K.count_bytes(mem.read_bytes()),
    )


def test_encoding_reload_keeps_an_open_breaker(tmp_path):
    gate.set()
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("a")
    mem = ws.root / "agents/a/MEMORY.md"
    compact = ScriptedCompaction("fail", "fail", "fail", "fail")
    d, t, cfg = start(tmp_path, ws, compact, 2000)
    jp(mem, 6)
    assert wait_until(
        lambda: d.services.registry.agents()["a"].job.state is JobState.BREAKER_OPEN, timeout=10
    )
    calls = len(compact.calls)
    cfg.write_text(TOML.format(ctx=2000, enc="o200k_base"))
    d.handle_exit(signal.SIGHUP, None)
    # The reload recounts the file in the new encoding, and every recount is
    # followed by a job decision: once the o200k count is in, the decision that
    # could have reset the breaker has been taken.
    o200k = TokenCounter("o200k_base").count_bytes(mem.read_bytes())
    recounted = wait_until(lambda: d.services.registry.agents()["a"].tokens == o200k, timeout=10)
    state = d.services.registry.agents()["a"].job.state
    d.handle_exit(signal.SIGTERM, None)
    t.join(20)
    assert recounted
    assert state is JobState.BREAKER_OPEN and len(compact.calls) == calls, (state, compact.calls)


def test_a_reload_whose_encoding_the_daemon_cannot_load_is_refused_whole(tmp_path):
    """The daemon kept its old encoding, applied the rest and answered "applied":
    `memd reload` (whose own look-up uses its caller's TIKTOKEN_CACHE_DIR) exited
    0. The daemon's own look-up decides: the reload is refused, nothing applied."""
    from memd.errors import TokenizerError

    def counter_factory(encoding):
        if encoding == "o200k_base":
            raise TokenizerError("tokenizer encoding 'o200k_base': not found offline (scripted)")
        return TokenCounter(encoding)

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("a", entries=2)
    cfg = tmp_path / "memd.toml"
    cfg.write_text(TOML.format(ctx=5000, enc="cl100k_base"))
    loaded = load_settings(config_file=cfg, workspace=ws.root, environ={})
    opts = DaemonOptions(
        config_file=cfg,
        workspace_flag=ws.root,
        state_dir=tmp_path / "state",
        install_signal_handlers=False,
    )
    d = Daemon(
        loaded, opts, compact=ScriptedCompaction(), counter_factory=counter_factory, environ={}
    )
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        assert d.ready.wait(20)
        cfg.write_text(TOML.format(ctx=9000, enc="o200k_base"))
        d.handle_exit(signal.SIGHUP, None)
        store = d.services.flusher.store
        assert wait_until(lambda: store.read_last_reload() is not None, timeout=10)
        answer = store.read_last_reload()
        assert answer is not None and not answer.ok and answer.errors == 1
        assert d.config.trigger.context_length == 5000  # nothing of it applied
        assert d.config.tokenizer.encoding == "cl100k_base"
        assert d.services.counter.tokenizer.encoding.name == "cl100k_base"
    finally:
        d.handle_exit(signal.SIGTERM, None)
        t.join(20)


# -- from review: flush race --------------------
BIG = {"trigger": {"context_length": 10**6}, "daemon": {"state_flush_s": 0.2}}


def test_concurrent_flushes_never_leave_a_stale_row(ws, run_daemon, tmp_path):
    ws.create_agent("a", entries=2)
    mem = ws.root / "agents/a/MEMORY.md"
    h = run_daemon(ws, compact=ScriptedCompaction(), config=BIG)
    d = h.daemon
    assert wait_until(lambda: not any(e.dirty for e in d.services.registry.agents().values()))
    store = d.services.flusher.store
    real = store.upsert_agents
    entered, release, overtaken, written = (threading.Event() for _ in range(4))
    calls = []

    def slow_upsert(records):
        records = list(records)
        calls.append(records)
        if len(calls) == 1:  # a flush (periodic or live): snapshot taken, write delayed
            entered.set()
            release.wait(10)
            try:
                return real(records)
            finally:
                written.set()
        if not release.is_set():
            overtaken.set()
        return real(records)

    store.upsert_agents = slow_upsert
    append_entry(mem, "AI", "first append " * 10)
    assert entered.wait(10)  # a flush holds snapshot #1, its write delayed
    append_entry(mem, "AI", "second append " * 10)
    entry = d.services.registry.agents()["a"]
    # The count a tick makes (made here: the counter thread may be the one whose
    # live flush is delayed, or wait for it).
    assert d.services.entry_counter.count_locked(entry)
    assert entry.tokens == full_tokens(mem)
    later = threading.Thread(target=d.services.flusher.flush)  # what a compaction job's end does
    later.start()
    # Serialized flushes: the later one waits for the delayed one (this wait
    # runs out). Were they not, it would write now, and the delayed one after it.
    overtaken.wait(1.0)
    release.set()  # the delayed flush now writes snapshot #1 ...
    later.join(10)
    assert written.wait(10) and not later.is_alive()  # ... and the later one after it
    store.upsert_agents = real
    row = store.get_agent("a")
    assert row.tokens == entry.tokens, (row.tokens, entry.tokens, entry.dirty)
    h.stop()


# -- from review: symlink loop --------------------
BIG = {"trigger": {"context_length": 10**6}}


def test_symlink_loop_at_startup_does_not_kill_the_daemon(ws, run_daemon):
    ws.create_agent("good", entries=2)
    bad = ws.root / "agents/bad"
    bad.mkdir()
    os.symlink("MEMORY.md", bad / "MEMORY.md")  # self-loop
    h = run_daemon(ws, compact=ScriptedCompaction(), config=BIG, wait_ready=False)
    assert h.daemon.ready.wait(10), f"daemon never became ready; exit code {h.code}"
    assert h.tokens("good") == full_tokens(ws.root / "agents/good/MEMORY.md")


def test_symlink_loop_appearing_while_running_does_not_starve_others(ws, run_daemon):
    ws.create_agent("good", entries=2)
    ws.create_agent("bad", entries=1)
    h = run_daemon(ws, compact=ScriptedCompaction(), config={**BIG, "watch": {"reconcile_s": 60}})
    bad = ws.root / "agents/bad/MEMORY.md"
    bad.unlink()
    os.symlink("MEMORY.md", bad)
    good = ws.root / "agents/good/MEMORY.md"
    append_entry(good, "AI", "counted? " * 10)
    assert wait_until(lambda: h.tokens("good") == full_tokens(good), timeout=5)


# -- from review: watch lost --------------------
CFG = {"trigger": {"context_length": 10**6}, "watch": {"reconcile_s": 3600}}


def test_folder_moved_away_and_replaced_is_watched_again(ws, run_daemon):
    ws.create_agent("a", entries=1)
    h = run_daemon(ws, compact=ScriptedCompaction(), config=CFG)
    agents = ws.root / "agents"
    os.rename(agents / "a", agents / "b")  # e.g. `mv a b && mkdir a` / restore from backup
    (agents / "a").mkdir()
    mem = agents / "a" / "MEMORY.md"
    mem.write_text(swarms_header("a"))
    assert wait_until(lambda: set(h.daemon.services.registry.agents()) == {"a", "b"})
    time.sleep(0.5)
    append_entry(mem, "AI", "hello " * 50)
    assert wait_until(lambda: h.tokens("a") == full_tokens(mem), timeout=3), (
        h.tokens("a"),
        full_tokens(mem),
        h.daemon.services.watches.watcher.watched(),
    )


def test_folder_deleted_and_recreated_is_watched_again(ws, run_daemon):
    ws.create_agent("a", entries=1)
    ws.create_agent("z", entries=1)
    h = run_daemon(ws, compact=ScriptedCompaction(), config=CFG)
    agents = ws.root / "agents"
    shutil.rmtree(agents / "a")
    (agents / "a").mkdir()
    mem = agents / "a" / "MEMORY.md"
    mem.write_text(swarms_header("a"))
    time.sleep(1.0)
    append_entry(mem, "AI", "hello " * 50)
    assert wait_until(lambda: h.tokens("a") == full_tokens(mem), timeout=3), (
        h.tokens("a"),
        full_tokens(mem),
        h.daemon.services.watches.watcher.watched(),
    )


def test_new_counts_reach_the_state_db_without_waiting_for_the_periodic_flush(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path
) -> None:
    """`memd status` reads the DB: it should lag the daemon by about a second, not a minute."""
    ws.create_agent("live", entries=2)
    h = run_daemon(ws, compact=ScriptedCompaction(), config={"daemon": {"state_flush_s": 600}})
    time.sleep(1.2)  # past the live-flush interval since start-up's flush
    fill(ws, "live", 3)
    expected = full_tokens(ws.root / "agents/live/MEMORY.md")
    assert wait_until(lambda: h.tokens("live") == expected)
    store = StateStore.open(tmp_path / "state", ws.root)
    try:
        assert wait_until(
            lambda: (r := store.get_agent("live")) is not None and r.tokens == expected, timeout=4
        )
    finally:
        store.close()
    assert h.stop() == 0


# -- fast writers: compacted again and again while they write -----------------------

FAST_WRITER = """
import sys, time, datetime
path, tag, count, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
for i in range(count):
    stamp = datetime.datetime.now().isoformat()
    body = f"{tag}-{i} " + "status update from the worker, all nominal " * 6
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"### Human \\u2014 {stamp}\\n\\n{body}\\n\\n---\\n\\n")
    time.sleep(pause)
"""


def test_fast_writers_are_compacted_again_and_again_never_cooled_down(
    ws: AgentWorkspace, run_daemon: Any
) -> None:
    from memd.compaction import compact_agent

    paths = ws.create_agent("busy")
    llm_s = 0.8  # each compaction takes longer than many appends

    class Slow:
        def __init__(self, inner: Any) -> None:
            self.inner, self.model = inner, inner.model

        def summarize(self, request: Any) -> Any:
            time.sleep(llm_s)
            return self.inner.summarize(request)

    def slow_compact(paths: AgentPaths, summarizer: Any, options: Any, **kw: Any) -> Any:
        return compact_agent(paths, Slow(summarizer), options, **kw)

    threshold = 3600
    h = run_daemon(
        ws,
        compact=slow_compact,
        config={
            # The shipped debounce (a writer never pauses 500 ms) and cooldown.
            "trigger": {
                "context_length": 4000,
                "threshold": 0.9,
                "debounce_ms": 500,
                "max_wait_ms": 5000,
            },
            "daemon": {"cooldown_s": 60, "min_interval_s": 0.2},
        },
    )
    writers = [
        subprocess.Popen([sys.executable, "-c", FAST_WRITER, str(paths.memory), tag, "160", "0.05"])
        for tag in ("w1", "w2")
    ]
    peak = 0
    states: set[JobState] = set()
    started = time.monotonic()
    while any(w.poll() is None for w in writers):
        peak = max(peak, COUNTER.count_bytes(paths.memory.read_bytes()))
        state = h.job("busy")
        if state is not None:
            states.add(state)
        time.sleep(0.05)
    writing_s = time.monotonic() - started
    assert all(w.wait() == 0 for w in writers)
    # Count at rest: a compaction still in flight has its archive linked before
    # its swap, so mid-flight the same entries sit in both (the journal makes
    # that exactly-once on recovery). A stop lets it commit.
    assert h.stop() == 0
    compactions = h.daemon.services.stats.compactions_ok
    appended = sum(
        n for text, n in entry_contents_everywhere(paths).items() if text.startswith("w")
    )
    rate = 320 * 2 / 0.05 / 4  # two writers, ~320-byte entries every 50 ms, ~4 bytes a token
    # Bound: the threshold, plus what arrives while the count is pending and one
    # compaction (LLM call included) runs, with slack for a loaded machine.
    bound = threshold + rate * (0.5 + llm_s + 0.2) * 3
    print(
        f"\nfast writers: {writing_s:.1f}s, {compactions} compactions, peak {peak} tokens "
        f"(threshold {threshold}, bound {bound:.0f}), states seen {sorted(s.value for s in states)}"
    )
    assert appended == 320 and set(entry_contents_everywhere(paths).values()) == {1}
    assert JobState.COOLDOWN not in states
    assert compactions >= 3
    assert peak <= bound


def test_archive_figures_and_window_reach_the_state_db(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path
) -> None:
    """`memd status` reads archive count, bytes and window from the DB, never the folder."""
    paths = ws.create_agent("arch")
    h = run_daemon(ws, config={"trigger": {"context_length": 4000}})
    fill(ws, "arch", 120)
    assert wait_until(lambda: h.daemon.services.stats.compactions_ok >= 1, timeout=20)

    def on_disk() -> tuple[int, int]:
        files = [p for p in paths.archive_dir.iterdir() if p.name.startswith("history_")]
        return len(files), sum(p.stat().st_size for p in files)

    store = StateStore.open(tmp_path / "state", ws.root)
    try:

        def stored() -> tuple[int | None, int | None]:
            row = store.get_agent("arch")
            return (None, None) if row is None else (row.archives, row.archive_bytes)

        assert wait_until(lambda: stored() == on_disk() and on_disk()[0] >= 1)
        row = store.get_agent("arch")
        assert row is not None and row.window_source == "[trigger]"
        # What another process does (compact-now, forget, prune) is surveyed too.
        planted = paths.archive_dir / "history_2020-01-01_00-00-00.md"
        planted.write_bytes(b"x" * 1234)
        assert wait_until(lambda: stored() == on_disk())
        planted.unlink()
        assert wait_until(lambda: stored() == on_disk())
    finally:
        store.close()
    assert h.stop() == 0


# ------------------------------------------------------------------ audit log


def test_daemon_audits_compactions_and_reloads_without_content(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memd.audit import audit_path, read_audit

    monkeypatch.delenv("MEMD_CONFIG", raising=False)
    ws.create_agent("alice")
    h = run_daemon(ws)  # the real transaction, built-in summarizer
    memory = ws.root / "agents" / "alice" / "MEMORY.md"
    secret = "AKIAQWERTYUIOPASDFGH-planted"
    append_entry(memory, "Human", f"remember {secret} please")
    fill(ws, "alice", 20)
    log = audit_path(tmp_path / "state", ws.root)
    assert wait_until(lambda: log.exists() and read_audit(log).records, timeout=30)
    h.daemon.handle_exit(signal.SIGHUP, None)

    def reloads() -> list[Any]:
        return [r for r in read_audit(log).records if r.event == "config_reload"]

    assert wait_until(lambda: reloads(), timeout=10)
    h.stop()
    first, second = read_audit(log).records[0], reloads()[0]
    assert (first.event, first.agent, first.actor) == ("compaction", "alice", "daemon")
    assert first.fields["trigger"] == "threshold" and first.fields["model"] == "builtin"
    assert first.fields["remote"] is False
    assert (second.event, second.fields["ok"]) == ("config_reload", True)
    assert secret.encode() not in log.read_bytes()
    assert b"remember" not in log.read_bytes()


def test_daemon_prunes_daily_and_after_each_compaction(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path
) -> None:
    from memd.audit import audit_path, read_audit

    paths = ws.create_agent("alice")
    archive_dir = paths.archive_dir
    archive_dir.mkdir()
    long_ago = time.time() - 90 * 86_400

    def plant(name: str, text: str = "raw turns", folder: Path = archive_dir) -> Path:
        path = folder / name
        path.write_text(swarms_header("alice") + swarms_block("Human", text))
        os.utime(path, (long_ago, long_ago))
        return path

    first = plant("history_2020-01-01_10-00-00.md", "the vorpelline key is under the mat")
    # Another agent's (an agent with an encrypted archive gets no recall index).
    bob = ws.create_agent("bob").archive_dir
    bob.mkdir()
    encrypted = plant("history_2020-01-02_10-00-00.md.enc", folder=bob)
    h = run_daemon(ws, config={"retention": {"max_age_days": 30}})
    log = audit_path(tmp_path / "state", ws.root)
    recall = h.daemon.services.recall.service
    assert recall is not None and recall.caught_up.wait(20)
    assert recall.index.search("alice", "vorpelline")  # indexed at start

    def prunes() -> list[Any]:
        return [r for r in read_audit(log).records if r.event == "prune"]

    assert h.daemon.services.retention.daily() == 2  # the daily pass, run by hand
    assert not first.exists() and not encrypted.exists()
    assert not recall.index.search("alice", "vorpelline")  # its rows went with it
    assert sorted((r.agent, r.fields["trigger"], r.fields["archives"]) for r in prunes()) == [
        ("alice", "daily", 1),
        ("bob", "daily", 1),
    ]

    later = plant("history_2020-01-03_10-00-00.md")
    fill(ws, "alice", 20)  # over the threshold: the real transaction compacts
    assert wait_until(lambda: len(prunes()) == 3, timeout=30)
    h.stop()
    assert not later.exists()
    after = prunes()[2]
    assert after.fields["trigger"] == "compaction" and after.fields["names"] == (later.name,)
    records = read_audit(log).records
    assert records[records.index(after) - 1].event == "compaction"  # recorded in order
    kept = list(archive_dir.iterdir())
    assert kept and all(p.name.startswith("history_20") for p in kept)  # its own archive stays
    block = (ws.root / "agents/alice/MEMORY.md").read_text()
    assert "(kept 30 days), then deleted" in block


def test_readiness_does_not_wait_for_a_file_slow_to_count(
    ws: AgentWorkspace, run_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memd.daemon.counter as counter_module

    monkeypatch.setattr(counter_module, "SLOW_COUNT_BYTES", 64 << 10)
    ws.create_agent("healthy", entries=2)
    ws.create_agent("huge", entries=0)
    huge = ws.root / "agents" / "huge" / "MEMORY.md"
    append_entry(huge, "Human", "GATE " + "word " * 20_000)  # 100 KB: "slow" here
    gate = threading.Event()

    class GatedOnTheHugeFile:
        def count_bytes(self, data: bytes) -> int:
            if b"GATE" in data:
                assert gate.wait(60)
            return COUNTER.count_bytes(data)

        def count_text(self, text: str) -> int:
            return COUNTER.count_text(text)

    h = run_daemon(
        ws,
        compact=ScriptedCompaction(),
        config={"trigger": {"context_length": 10**6}},
        counter_factory=lambda _encoding: GatedOnTheHugeFile(),
    )
    # READY while the huge file is still being counted; the healthy agent is served.
    assert h.daemon.ready.is_set() and h.tokens("huge") == 0
    healthy = ws.root / "agents" / "healthy" / "MEMORY.md"
    assert h.tokens("healthy") == full_tokens(healthy)
    append_entry(healthy, "AI", "counted while the huge one is not " * 5)
    assert wait_until(lambda: h.tokens("healthy") == full_tokens(healthy))
    gate.set()
    assert wait_until(lambda: h.tokens("huge") == full_tokens(huge))


def test_a_giant_run_is_counted_by_estimate_marked_in_the_state_db_and_compacted(
    ws: AgentWorkspace, run_daemon: Any, tmp_path: Path
) -> None:
    ws.create_agent("runaway", entries=2)
    memory = ws.root / "agents" / "runaway" / "MEMORY.md"
    append_entry(memory, "Human", "x" * 300_000)  # one pre-token of 300 KB
    compact = ScriptedCompaction("ok")
    config = {"trigger": {"context_length": 100_000}, "tokenizer": {"max_piece_bytes": 65_536}}
    h = run_daemon(ws, compact=compact, config=config)
    assert wait_until(lambda: compact.calls == ["runaway"])  # the estimate is over the threshold
    h.stop()
    with StateStore.open(tmp_path / "state", ws.root) as store:
        (row,) = store.agents()
    assert not row.estimated  # the compacted file is counted exactly again
    # Counted again from scratch (no compaction): the row says the count is an estimate.
    append_entry(memory, "Human", "y" * 300_000)
    h = run_daemon(
        ws, compact=ScriptedCompaction(), config={**config, "trigger": {"context_length": 10**7}}
    )
    assert h.tokens("runaway") >= full_tokens(memory)
    h.stop()
    with StateStore.open(tmp_path / "state", ws.root) as store:
        (row,) = store.agents()
    assert row.estimated and row.tokens >= full_tokens(memory)


def _daemon_tree_rss(pid: int) -> int:
    import psutil

    try:
        process = psutil.Process(pid)
        tree = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for member in tree:
        with contextlib.suppress(psutil.Error):
            total += member.memory_info().rss
    return total


def _run_next_to_a_single_line(root: Path, line_bytes: int) -> int:
    """A real daemon with a healthy agent and one MEMORY.md holding a single line of
    ``line_bytes`` letters: READY, the healthy agent compacted, the big file counted
    (by estimate when it is big), then SIGTERM. Returns the daemon tree's peak RSS."""
    ws = AgentWorkspace(root / "ws")
    ws.create_agent("healthy")
    ws.create_agent("runaway")
    with open(ws.root / "agents/runaway/MEMORY.md", "ab") as out:
        out.write("### Human \u2014 2026-01-01T10:00:00\n\n".encode())
        block = b"a" * (1 << 20)
        for start in range(0, line_bytes, len(block)):
            out.write(block[: line_bytes - start])
    config = write_config(root / "memd.toml")
    config.write_text(config.read_text() + "[agents.runaway]\ncontext_compression = false\n")
    peak = [0]
    done = threading.Event()
    with DaemonProcess(ws.root, root / "state", config=config) as daemon:

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _daemon_tree_rss(daemon.pid))
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            daemon.wait_ready(timeout=90)  # never waits for the big file
            fill(ws, "healthy", 20)
            daemon.wait_for("compacted", lambda line: line.get("agent") == "healthy", timeout=120)
            if line_bytes > 16 << 20:  # counted after READY, by estimate
                counted = daemon.wait_for("counted after READY", timeout=300)
                assert counted["agent"] == "runaway" and counted["estimated"] is True
        finally:
            done.set()
            sampler.join()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        assert "Traceback" not in "".join(daemon.raw)
    with StateStore.open(root / "state", ws.root) as store:
        rows = {row.agent: row for row in store.agents()}
    assert rows["runaway"].tokens >= line_bytes // 8
    assert rows["runaway"].estimated is (line_bytes > 1 << 20)
    return peak[0]


@pytest.mark.slow
def test_a_200_mb_single_line_beside_a_healthy_agent_keeps_memory_bounded(
    tmp_path: Path,
) -> None:
    small = _run_next_to_a_single_line(tmp_path / "small", 2 << 20)
    shutil.rmtree(tmp_path / "small")
    huge = _run_next_to_a_single_line(tmp_path / "huge", 200 << 20)
    print(
        f"peak RSS of the daemon and its workers: 2 MB line {small / 1e6:.0f} MB, "
        f"200 MB line {huge / 1e6:.0f} MB"
    )
    assert huge <= 3 * small


def test_subprocess_sigterm_during_the_start_up_pool_stops_it_at_once(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    import psutil

    body = " ".join(f"turn{n} of a long history" for n in range(40_000))
    for n in range(6):  # ~6 MB each: a cold start that forks counting workers
        memory = ws.create_agent(f"big{n}").memory
        with memory.open("a", encoding="utf-8") as out:
            for turn in range(6):
                out.write(f"### Human \u2014 2026-01-01T10:00:0{turn}\n\n{body}\n\n---\n\n")
    with DaemonProcess(ws.root, tmp_path / "state") as daemon:
        process = psutil.Process(daemon.pid)
        assert wait_until(lambda: len(process.children()) >= 2, timeout=60)
        workers = process.children()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        assert daemon.events("ready") == []
        (initial,) = daemon.events("initial count")
        assert initial["mode"] == "processes" and initial["stopped"] is True
        assert initial["counted"] < 6  # the pool was cut short, not waited for
        assert "Traceback" not in "".join(daemon.raw)
        assert not [w for w in workers if w.is_running() and w.status() != "zombie"]


# -- review 13b, R1: an encoding reload during a compaction ----------------


class GatedBuiltin:
    """The builtin summarizer, each summary held until ``release``."""

    model = "builtin"

    def __init__(self, count_text: Any) -> None:
        from memd.summarizers import BuiltinSummarizer

        self.inner = BuiltinSummarizer(count_text)
        self.entered = threading.Event()
        self.release = threading.Event()

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.entered.set()
        assert self.release.wait(30)
        return self.inner.summarize(request)


def _encoding_config(ws: AgentWorkspace, encoding: str) -> str:
    return f"""
workspace = "{ws.root}"
[trigger]
context_length = 4000
threshold = 0.5
debounce_ms = 40
[tokenizer]
encoding = "{encoding}"
[compaction]
drain_quiet_s = 0.05
drain_max_s = 1
[summarizer]
max_tokens = 120
[watch]
reconcile_s = 0.5
"""


def test_a_new_file_compacted_across_an_encoding_reload_is_counted_in_the_new_encoding(
    ws: AgentWorkspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A SIGHUP that changes [tokenizer] encoding while a compaction runs (review
    # 13b, R1): the job counted the new file with the old tokenizer; the runner
    # must not extend that count with the new one (a mixed figure, stored as
    # exact): it counts the new file from scratch in the new encoding.
    monkeypatch.delenv("MEMD_CONFIG", raising=False)
    cfg = tmp_path / "memd.toml"
    cfg.write_text(_encoding_config(ws, "cl100k_base"))
    paths = ws.create_agent("alice")
    gated: list[GatedBuiltin] = []

    def factory(_config: Any, count_text: Any) -> GatedBuiltin:
        summarizer = GatedBuiltin(count_text)
        gated.append(summarizer)
        return summarizer

    loaded = load_settings(config_file=cfg, workspace=ws.root, environ={})
    options = DaemonOptions(
        config_file=cfg,
        workspace_flag=ws.root,
        state_dir=tmp_path / "state",
        install_signal_handlers=False,
    )
    daemon = Daemon(loaded, options, summarizer_factory=factory)
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        assert daemon.ready.wait(20)
        for n in range(60):
            append_entry(
                paths.memory, "Human" if n % 2 == 0 else "AI", f"turn {n}: " + "слово 単語 " * 15
            )
        assert wait_until(lambda: any(g.entered.is_set() for g in gated), timeout=20)
        # The job waits in its summary: reload with another encoding.
        cfg.write_text(_encoding_config(ws, "o200k_base"))
        daemon.handle_exit(signal.SIGHUP, None)
        services = daemon.services
        assert services is not None
        assert wait_until(
            lambda: services.entry_counter.tokenizer.encoding_name == "o200k_base", timeout=20
        )
        for g in gated:
            g.release.set()
        assert wait_until(lambda: services.stats.compactions_ok >= 1, timeout=30)
        assert wait_until(lambda: not services.runner.running(), timeout=30)
        o200k = TokenCounter("o200k_base")
        entry = services.registry.agents()["alice"]
        expected = o200k.count_bytes(paths.memory.read_bytes())
        # Give the daemon every chance to settle on the right figure.
        wait_until(lambda: entry.tokens == expected, timeout=3)
        assert entry.tokens == expected
    finally:
        daemon.handle_exit(signal.SIGTERM, None)
        thread.join(30)


_DUMPABLE = """
import ctypes, resource
from memd.cli.run_daemon import keep_out_of_core_dumps
libc = ctypes.CDLL(None, use_errno=True)
before = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
keep_out_of_core_dumps()
print(before, libc.prctl(3, 0, 0, 0, 0), *resource.getrlimit(resource.RLIMIT_CORE))
"""


def test_the_daemon_leaves_no_core_dump(tmp_path: Path) -> None:
    """Review r9leak (notes): the daemon's memory holds agents' text, the archive
    master key and API keys; it sets RLIMIT_CORE 0 and PR_SET_DUMPABLE 0 (a real
    daemon's limit read from /proc; the flag in a process of its own)."""
    done = subprocess.run(
        [sys.executable, "-c", _DUMPABLE], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["1", "0", "0", "0"], done
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha")
    with DaemonProcess(ws.root, tmp_path / "state") as daemon:
        daemon.wait_ready()
        assert daemon.proc is not None
        limits = Path(f"/proc/{daemon.proc.pid}/limits").read_text()
        assert daemon.stop() == 0
    core = next(line for line in limits.splitlines() if line.startswith("Max core file size"))
    assert core.split()[4:6] == ["0", "0"], core


def test_an_archive_symlink_inside_an_agents_folder_fails_that_agent_alone(
    ws: AgentWorkspace, run_daemon: Any
) -> None:
    """archive/ -> a folder of the agent's own: its archives went there. The daemon
    refuses that agent's compactions, naming the path, writes nothing for it, and
    keeps compacting the others."""
    linked = ws.create_agent("linked")
    (linked.dir / "notes").mkdir()
    linked.archive_dir.symlink_to("notes")
    ws.create_agent("plain")
    h = run_daemon(ws)
    before = fill(ws, "linked", 12).read_bytes()
    entry = h.daemon.services.registry.agents()["linked"]
    assert wait_until(lambda: entry.job.last_error is not None, timeout=20)
    assert f"archive folder {linked.archive_dir} is a symlink, not a real folder" in (
        entry.job.last_error or ""
    )
    plain = fill(ws, "plain", 12)
    assert wait_until(lambda: list((plain.parent / "archive").glob("history_*.md")), timeout=20)
    assert linked.memory.read_bytes() == before
    assert list((linked.dir / "notes").iterdir()) == []
    assert h.stop() == 0
