"""The counter and the runner driven step by step: hints on the counter's queue,
``tick(now)`` with a made-up clock, a fake scheduler and a scripted compaction.

These replace the daemon tests that slept and then asserted that nothing more
happened: here "nothing more" is every tick and every due wake-up, exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from support.daemon_services import COUNTER, ScriptedCompaction, build_services
from support.memfiles import AgentWorkspace, append_entry

import memd.daemon.counter
from memd.core.jobs import AgentJob, JobState
from memd.daemon.counter import _COALESCE_S
from memd.workspace import AgentPaths


def full(path: Path) -> int:
    return COUNTER.count_bytes(path.read_bytes())


def test_hints_are_debounced_then_counted_once(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction())
    before = s.tokens("alice")
    memory = s.fill("alice", 2)
    start = s.clock.now
    for offset in (0.0, 0.01, 0.02):  # a burst of writes
        s.clock.now = start + offset
        s.hint("alice")
    deadline = s.counter.tick(start + 0.03)
    assert deadline is not None and abs(deadline - (start + 0.02 + 0.04)) < 1e-9
    # The thread wakes a little after a debounce deadline (the counts due just after
    # it run in the same tick).
    assert s.counter.slack(deadline) == _COALESCE_S > 0
    assert s.tokens("alice") == before  # quiet period not over: not counted yet
    assert s.counter.tick(deadline) is None  # counted; nothing else pending
    assert s.tokens("alice") == full(memory) > before
    assert s.scheduler.submitted == []  # under threshold


def test_max_wait_bounds_a_burst_that_never_pauses(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction())
    memory = s.fill("alice", 1)
    start = s.clock.now
    counted_at = None
    for step in range(40):  # a write every 20 ms for 0.8 s
        s.clock.now = start + step * 0.02
        s.hint("alice")
        s.counter.tick(s.clock.now)
        if counted_at is None and s.tokens("alice") == full(memory):
            counted_at = s.clock.now
    assert counted_at is not None and counted_at - start <= 0.2 + 1e-9  # max_wait_ms


def test_over_threshold_compacts_exactly_once(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    ws.create_agent("quiet")
    s = build_services(ws, ScriptedCompaction("ok"))
    s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    assert s.scheduler.submitted == ["compact:alice"]
    assert s.job("alice").state is JobState.PENDING
    assert s.scheduler.run_queued() == 1
    assert s.job("alice").state is JobState.IDLE
    assert s.tokens("alice") == full(ws.root / "agents/alice/MEMORY.md") < 250
    # Later writes that stay under the threshold, and the passing of time: no more jobs.
    s.fill("alice", 2)
    s.hint("alice")
    s.settle()
    s.clock.advance(3600)
    s.settle()
    assert s.scheduler.submitted == ["compact:alice"]
    assert s.compact.calls == ["alice"]


def test_trigger_during_a_run_runs_exactly_once_more(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    compact = ScriptedCompaction("ok", "ok")
    s = build_services(ws, compact)
    s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    assert s.scheduler.submitted == ["compact:alice"]

    def writer_during_the_job(paths: AgentPaths) -> None:
        # The counter sees the file over its threshold while the job runs ...
        for n in range(20):
            append_entry(paths.memory, "Human", f"late turn {n}: " + "word " * 20)
        s.hint("alice")
        s.settle()
        assert s.job("alice").state is JobState.RUNNING
        assert s.job("alice").rerun_requested
        assert s.scheduler.submitted == ["compact:alice"]  # ... and does not start a second

    compact.during = writer_during_the_job
    s.scheduler.run_queued()
    compact.during = None
    # Exactly one more, once the minimum interval between compactions is up.
    assert s.scheduler.submitted == ["compact:alice"]
    s.settle()  # daemon.min_interval_s: 1 s
    assert s.scheduler.submitted == ["compact:alice", "compact:alice"]
    s.scheduler.run_queued()
    s.settle()
    assert s.scheduler.submitted == ["compact:alice", "compact:alice"]
    assert s.job("alice").state is JobState.IDLE and not s.job("alice").rerun_requested


def test_failures_back_off_then_the_breaker_stays_open(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("flaky")
    ws.create_agent("healthy")
    s = build_services(ws, ScriptedCompaction("fail", "fail", "fail"))
    s.fill("flaky", 20)
    s.hint("flaky")
    s.settle()
    s.scheduler.run_queued()
    for failures, delay in ((1, 10), (2, 20)):
        job = s.job("flaky")
        assert job.state is JobState.BACKOFF and job.consecutive_failures == failures
        assert job.next_attempt_at == s.clock.now + delay  # exponential from retry_base_s
        # No retry before its time, whatever is written meanwhile.
        s.hint("flaky")
        s.settle()
        assert len(s.scheduler.submitted) == failures
        # The wake-up is the counter's next deadline, and due then (no slack).
        assert s.counter.tick(s.clock.now) == job.next_attempt_at
        assert s.counter.slack(job.next_attempt_at) == 0.0
        s.clock.now = job.next_attempt_at
        s.counter.tick(s.clock.now)
        assert len(s.scheduler.submitted) == failures + 1
        s.scheduler.run_queued()
    entry_job = s.job("flaky")
    assert entry_job.state is JobState.BREAKER_OPEN and entry_job.consecutive_failures == 3
    assert "scripted failure" in (entry_job.last_error or "")
    # The breaker stays open: no fourth attempt for its whole reset time.
    for _ in range(10):
        s.clock.advance(300)
        s.hint("flaky")
        s.settle()
    assert s.compact.calls == ["flaky"] * 3
    # Other agents are unaffected.
    s.fill("healthy", 20)
    s.hint("healthy")
    s.settle()
    s.scheduler.run_queued()
    assert s.compact.calls[-1] == "healthy" and s.job("healthy").state is JobState.IDLE


def test_hysteresis_cools_down_instead_of_looping(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("stubborn")
    s = build_services(ws, ScriptedCompaction("big", "ok"))
    s.fill("stubborn", 20)
    s.hint("stubborn")
    s.settle()
    s.scheduler.run_queued()
    job = s.job("stubborn")
    assert job.state is JobState.COOLDOWN
    assert s.tokens("stubborn") >= 300  # above low water (0.6 × 500)
    s.fill("stubborn", 10)
    s.hint("stubborn")
    s.settle()
    assert s.compact.calls == ["stubborn"]  # not re-triggered during the cooldown
    assert job.next_attempt_at is not None
    assert s.counter.tick(s.clock.now) == job.next_attempt_at  # no hint needed
    s.clock.now = job.next_attempt_at
    s.counter.tick(s.clock.now)
    s.scheduler.run_queued()
    assert s.compact.calls == ["stubborn", "stubborn"]  # tried again after it


def test_busy_and_nothing_to_compact_retry_without_counting_failures(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction("busy", "nothing", "ok"))
    s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    for _attempt in range(3):
        s.scheduler.run_queued()
        assert s.job("alice").consecutive_failures == 0
        s.clock.advance(3600)
        s.counter.tick(s.clock.now)
    assert s.compact.calls == ["alice"] * 3
    assert s.job("alice").state is JobState.IDLE


def test_compression_off_agents_are_counted_never_compacted(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("watchonly")
    s = build_services(
        ws, ScriptedCompaction(), {"agents": {"watch*": {"context_compression": False}}}
    )
    memory = s.fill("watchonly", 30)
    s.hint("watchonly")
    s.settle()
    s.clock.advance(3600)
    s.settle()
    assert s.tokens("watchonly") == full(memory) > 500
    assert s.scheduler.submitted == [] and s.job("watchonly").state is JobState.DISABLED


def test_agents_hint_reconciles_the_agent_set(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction())
    ws.create_agent("bob", entries=3)
    published = s.registry.rescans.number
    s.counter.sink.agents_changed("bob")
    s.counter.tick(s.clock.now)  # the rescan adds bob and asks for his count now
    # The rescan is published (the watch service follows it): the counter calls no watcher.
    assert s.registry.rescans.number == published + 1
    s.counter.tick(s.clock.now)
    assert s.tokens("bob") == full(ws.root / "agents/bob/MEMORY.md") > 0
    (ws.root / "agents/alice/MEMORY.md").unlink()
    (ws.root / "agents/alice").rmdir()
    s.counter.sink.agents_changed("alice")
    s.counter.tick(s.clock.now)
    assert set(s.registry.agents()) == {"bob"}


def test_the_periodic_reconcile_is_a_hint_swept_by_the_tick(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction())
    memory = s.fill("alice", 3)  # written with no watcher event (a lost one)
    ws.create_agent("bob", entries=2)  # nor this one
    published = s.registry.rescans.number
    # The periodic job's task only queues: no rescan, no stat on the scheduler's thread.
    s.counter.sink.reconcile_due()
    assert s.registry.rescans.number == published and "bob" not in s.registry.agents()
    s.counter.tick(s.clock.now)  # the sweep, on the count thread: rescan, stat, ask
    assert s.registry.rescans.number == published + 1 and "bob" in s.registry.agents()
    s.counter.tick(s.clock.now)  # the counts it asked for
    assert s.tokens("alice") == full(memory)
    assert s.tokens("bob") == full(ws.root / "agents/bob/MEMORY.md") > 0


def test_an_unnamed_agents_hint_is_a_whole_reconcile(tmp_path: Path) -> None:
    # What the watcher says after an inotify queue overflow: events were lost,
    # so every MEMORY.md is stat'ed, not only the agent set rescanned.
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction())
    memory = s.fill("alice", 3)  # its events were among those dropped
    s.counter.sink.agents_changed(None)
    s.counter.tick(s.clock.now)  # the sweep: rescan, stat, ask
    s.counter.tick(s.clock.now)  # the count it asked for
    assert s.tokens("alice") == full(memory)


def test_when_the_watcher_polls_the_reconcile_stats_no_memory_file(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction())
    before = s.tokens("alice")
    s.counter.files_polled = True  # the poller stats every MEMORY.md each interval
    s.fill("alice", 3)  # a write the poller reports, not the reconcile
    ws.create_agent("bob", entries=2)
    s.counter.sink.reconcile_due()
    s.counter.tick(s.clock.now)  # the agent set is still rescanned...
    assert "bob" in s.registry.agents()
    s.counter.tick(s.clock.now)
    assert s.tokens("bob") == full(ws.root / "agents/bob/MEMORY.md") > 0
    assert s.tokens("alice") == before  # ...but alice's MEMORY.md is not stat'ed


def test_an_unnamed_agents_hint_stats_every_file_when_polled_too(tmp_path: Path) -> None:
    # agents_changed(None): agents/ itself was replaced (or an event queue
    # overflowed). With --poll too, the whole reconcile stats every MEMORY.md: the
    # poller's held files may be the old tree's. (Found by review 13a, D2.)
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction())
    s.counter.files_polled = True
    memory = s.fill("alice", 3)  # written in the agents/ that replaced the old one
    s.counter.sink.agents_changed(None)
    s.counter.tick(s.clock.now)  # the sweep: rescan, stat, ask
    s.counter.tick(s.clock.now)  # the count it asked for
    assert s.tokens("alice") == full(memory)
    # Once: the next periodic reconcile leaves the stats to the poller again.
    before = s.tokens("alice")
    s.fill("alice", 2)
    s.counter.sink.reconcile_due()
    s.counter.tick(s.clock.now)
    s.counter.tick(s.clock.now)
    assert s.tokens("alice") == before


def test_counts_reach_the_state_db_on_change_batched(tmp_path: Path) -> None:
    from memd.daemon.flusher import LIVE_FLUSH_S
    from memd.state import StateStore

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction())
    assert s.flusher is not None
    store = StateStore.open(tmp_path / "state", ws.root)
    s.flusher.start(contextlib.ExitStack(), store)

    def stored_size() -> int | None:
        rows = {record.agent: record for record in store.agents()}
        return rows["alice"].size if "alice" in rows else None

    s.flusher.flush()  # the start-up flush
    memory = s.fill("alice", 2)
    s.clock.advance(LIVE_FLUSH_S)
    s.hint("alice")
    counted_at = s.counter.tick(s.clock.now)
    assert counted_at is not None
    # The count and its flush in the same tick: nothing waits for the periodic flush.
    assert s.counter.tick(counted_at) is None
    assert stored_size() == memory.stat().st_size
    # A second burst counted within LIVE_FLUSH_S of that flush waits for the
    # batch, and lands when the tick due then runs, with no new hint.
    s.fill("alice", 1)
    s.hint("alice")
    counted_at = s.counter.tick(s.clock.now)
    assert counted_at is not None
    flush_at = s.counter.tick(counted_at)
    assert flush_at is not None and flush_at > counted_at
    assert stored_size() != memory.stat().st_size
    assert s.counter.tick(flush_at) is None
    assert stored_size() == memory.stat().st_size
    # Nothing changed: no deadline, no flush.
    assert s.counter.tick(flush_at + 10) is None
    store.close()


def test_a_memory_erased_with_its_archives_takes_its_job_past_along(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("gone")
    ws.create_agent("kept")
    s = build_services(ws, ScriptedCompaction("ok", "ok"))
    for name in ("gone", "kept"):
        s.fill(name, 20)
        s.hint(name)
    s.settle()
    assert s.scheduler.run_queued() == 2
    compacted_at = s.job("gone").last_compaction_at
    assert compacted_at is not None and s.job("kept").last_compaction_at == compacted_at
    # `gone` loses MEMORY.md and has no archive/ (erased); `kept` keeps an archive/.
    (ws.root / "agents/gone/MEMORY.md").unlink()
    (ws.root / "agents/kept/archive").mkdir()
    (ws.root / "agents/kept/MEMORY.md").unlink()
    s.hint("gone")
    s.hint("kept")
    s.settle()
    assert s.tokens("gone") == 0 == s.tokens("kept")
    assert s.job("gone") == AgentJob()
    assert s.job("kept").last_compaction_at == compacted_at


def test_the_start_up_count_stops_once_the_daemon_is_exiting(tmp_path: Path) -> None:
    from memd.daemon.entries import ExitState

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=3)
    # The lifecycle's flags, set by SIGTERM before the count reached alice: read, not called.
    s = build_services(ws, ScriptedCompaction(), exiting=ExitState(should_exit=True))
    assert s.tokens("alice") == 0  # not counted: the daemon stops before READY
    counted = build_services(ws, ScriptedCompaction(), exiting=ExitState())
    assert counted.tokens("alice") == full(ws.root / "agents/alice/MEMORY.md") > 0


def test_only_a_descriptor_hint_reads_the_agents_descriptor(tmp_path: Path) -> None:
    # memd-agent.json is looked at when the watcher says it changed, not on
    # every MEMORY.md write (a stat of a file most agents lack, per append).
    import json

    from memd.descriptor import Descriptors

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction())
    s.registry.descriptors = Descriptors(COUNTER.count_text)
    entry = s.registry.get("alice")
    assert entry is not None
    before = entry.policy.threshold_tokens
    document = {
        "format": "memd-agent",
        "version": 1,
        "agent": "alice",
        "model": "gpt-4o-mini",
        "context_length": 3000,
        "reserved": {"unit": "text", "text": "alpha beta"},
    }
    (ws.root / "agents/alice/memd-agent.json").write_text(json.dumps(document))
    s.fill("alice", 1)
    s.hint("alice")  # MEMORY.md: counted, the descriptor not read
    s.settle()
    assert entry.policy.threshold_tokens == before
    s.counter.sink.descriptor_changed("alice")
    s.settle()
    assert entry.policy.threshold_tokens != before
    assert entry.policy.window_source != "[trigger]"


def test_a_descriptor_rewritten_in_a_loop_is_reread_once_per_hold_and_holds_no_count_back(
    tmp_path: Path,
) -> None:
    # A descriptor may hold 1 MiB of reserved text to count. Re-read as each hint
    # was taken, an agent rewriting it in a loop kept the count thread taking hints:
    # no other agent was counted (nor compacted) while it went on.
    import json

    from memd.daemon.counter import WINDOW_REREAD_S
    from memd.descriptor import Descriptors

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    ws.create_agent("bob")
    s = build_services(ws, ScriptedCompaction())
    reads: list[str] = []

    def counting(text: str) -> int:
        reads.append(text)
        return COUNTER.count_text(text)

    s.registry.descriptors = Descriptors(counting)
    folder = ws.root / "agents" / "alice"

    def rewrite(n: int) -> None:
        document = {
            "format": "memd-agent",
            "version": 1,
            "agent": "alice",
            "context_length": 3000 + n,
            "reserved": {"unit": "text", "text": f"alpha {n}"},
        }
        (folder / ".memd-agent.tmp").write_text(json.dumps(document))
        os.replace(folder / ".memd-agent.tmp", folder / "memd-agent.json")  # a new inode
        s.counter.sink.descriptor_changed("alice")

    rewrite(0)
    s.settle()
    assert reads == ["alpha 0"]
    held_until = s.clock.now + WINDOW_REREAD_S
    bob_before = s.tokens("bob")
    for n in range(1, 51):
        rewrite(n)
        due = s.counter.tick(s.clock.advance(0.001))
        assert due is not None and due <= held_until
    s.fill("bob", 1)
    s.counter.request_count("bob")
    s.counter.tick(s.clock.advance(0.001))
    assert reads == ["alpha 0"]  # held: not one re-read for 50 rewrites
    assert s.tokens("bob") > bob_before  # counted meanwhile
    s.counter.tick(s.clock.advance(WINDOW_REREAD_S))
    assert reads == ["alpha 0", "alpha 50"]  # the last rewrite, read once the hold ended
    entry = s.registry.get("alice")
    assert entry is not None and entry.policy.window_source == "memd-agent.json"


def test_the_stacked_stop_joins_the_count_thread_and_the_background_count(
    tmp_path: Path,
) -> None:
    """start(stack) pushes the stop; the stop waits for a large file's count after
    READY (count_later) too, so the final flush has its result."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction())
    memory = s.fill("alice", 2)
    entry = s.registry.get("alice")
    assert entry is not None
    joined: list[str] = []
    with contextlib.ExitStack() as stack:
        s.counter.start(stack)
        entry.count_lock.acquire()  # the background count waits for it
        s.counter.count_later([entry])
        (later,) = [t for t in threading.enumerate() if t.name == "memd-count-large"]
        join = later.join

        def joined_then_let_go(timeout: Any = None) -> None:
            joined.append(later.name)
            entry.count_lock.release()
            join(timeout)

        later.join = joined_then_let_go  # type: ignore[method-assign]
        count = next(t for t in threading.enumerate() if t.name == "memd-count")
    if not joined:  # not joined: let it go, then fail
        entry.count_lock.release()
    assert joined == ["memd-count-large"]
    assert not later.is_alive() and not count.is_alive()
    assert s.tokens("alice") == full(memory)  # counted before the stop returned


def test_writes_are_taken_while_waiting_and_only_move_the_next_tick(tmp_path: Path) -> None:
    # The service thread takes each write's hint and sleeps on until the first
    # debounce deadline (no tick per inotify batch): one tick counts them together.
    ws = AgentWorkspace(tmp_path / "ws")
    for name in ("alice", "bob", "carol"):
        ws.create_agent(name)
    s = build_services(ws, ScriptedCompaction())
    before = {name: s.tokens(name) for name in ("alice", "bob")}
    for name in ("alice", "bob"):
        s.fill(name, 1)
        s.hint(name)
    s.counter.gather(s.clock.now + 5.0, s.clock)  # returns once the debounce is due
    assert s.counter.inbox.empty()  # both taken, neither counted yet
    assert {name: s.tokens(name) for name in before} == before
    assert s.counter.tick(s.clock.advance(0.05)) is None  # both counted in one tick
    assert all(s.tokens(name) > before[name] for name in before)
    # A hint that asks for a count now ends the wait at once: what is queued behind
    # it is the tick's to take.
    s.hint("alice")
    s.counter.request_count("carol")
    s.hint("bob")
    s.counter.gather(s.clock.now + 5.0, s.clock)
    assert s.counter.inbox.get_nowait().name == "bob" and s.counter.inbox.empty()


def test_a_restored_count_keeps_only_the_marks_that_fit_it(tmp_path: Path) -> None:
    # A state DB row whose marks contradict its count (review 13b, R4: a damaged or
    # hand-edited DB): restored without them, quietly; the count itself is reused.
    from memd.counting import count_file
    from memd.state import AgentRecord

    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice", entries=20)
    s = build_services(ws, ScriptedCompaction())
    tracked, _kind = count_file(paths.memory, None, COUNTER.count_bytes)
    safe = tracked.state
    good = (safe.safe_offset // 2, safe.safe_tokens // 3)
    bad = (safe.safe_offset // 3, safe.safe_tokens * 2, safe.safe_offset + 10, 5)
    record = AgentRecord.of(
        "alice", dataclasses.replace(tracked, marks=(*good, *bad)), AgentJob(),
        threshold_tokens=1, count_error=None, encoding=s.counter.encoding, now=0.0,
    )  # fmt: skip
    entry = s.registry.get("alice")
    assert entry is not None
    assert s.counter.restore(entry, record)
    assert entry.tracked is not None and entry.tracked.tokens == tracked.tokens
    assert entry.tracked.marks == good
    # And a job starts from it (made with the tokenizer in use: the encoding matched).
    assert s.entry_counter is not None
    assert s.entry_counter.job_count(entry)[1] is entry.tracked


class GatedTokenizer:
    """The real count, except that a piece holding ``GATE`` waits for :attr:`gate`
    (a 100 MB file's seconds of tokenizing, as long as the test wants); records
    which thread tokenized each piece."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.at_gate = threading.Event()
        self.threads: list[str] = []

    def count_bytes(self, data: bytes) -> int:
        self.threads.append(threading.current_thread().name)
        if b"GATE" in data:
            self.at_gate.set()
            assert self.gate.wait(30)
        return COUNTER.count_bytes(data)

    def count_text(self, text: str) -> int:
        return COUNTER.count_text(text)


def test_a_large_recount_runs_beside_the_count_thread_not_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large MEMORY.md replaced by its agent is counted from scratch in the
    background: another agent's count made meanwhile does not wait for it, and what
    was appended during it is counted after. An append to a large file counted
    before stays on the count thread."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("big")
    ws.create_agent("small")
    s = build_services(ws, ScriptedCompaction(), extra={"trigger": {"context_length": 10**6}})
    assert s.entry_counter is not None
    tokenizer = GatedTokenizer()
    s.entry_counter.tokenizer = tokenizer
    monkeypatch.setattr(memd.daemon.counter, "SLOW_COUNT_BYTES", 4096)  # "large" here
    big = ws.root / "agents/big/MEMORY.md"
    replacement = big.with_suffix(".new")
    replacement.write_bytes(big.read_bytes())
    append_entry(replacement, "Human", "GATE " + "word " * 2000)  # 10 KB
    os.replace(replacement, big)  # a new inode: counted from scratch
    small = s.fill("small", 2)
    s.hint("big")
    s.hint("small")

    ticked = threading.Event()

    def tick() -> None:
        s.counter.tick(s.clock.advance(1.0))
        ticked.set()

    ticker = threading.Thread(target=tick, name="test-tick", daemon=True)
    ticker.start()
    try:
        assert tokenizer.at_gate.wait(10)  # the big recount is in progress
        # The tick did not wait for it: the small agent is counted.
        assert ticked.wait(10)
        assert s.tokens("small") == full(small)
        assert "memd-count-large" in tokenizer.threads
        # Appended while the recount runs: counted after it, incrementally.
        append_entry(big, "AI", "written during the recount " * 20)
    finally:
        tokenizer.gate.set()
    ticker.join(10)
    for thread in threading.enumerate():
        if thread.name == "memd-count-large":
            thread.join(10)  # counted, and asked the count thread for the rest
    s.settle()
    assert s.tokens("big") == full(big)

    # An append to the large file counted before: a few KB, on the count thread.
    tokenizer.threads.clear()
    append_entry(big, "Human", "one more turn " * 10)
    s.hint("big")
    s.settle()
    assert s.tokens("big") == full(big)
    assert tokenizer.threads and set(tokenizer.threads) == {"MainThread"}


def _background_count_done() -> None:
    for thread in threading.enumerate():
        if thread.name == "memd-count-large":
            thread.join(10)
            assert not thread.is_alive()


def test_a_large_file_whose_count_fails_is_retried_at_the_reconcile_not_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 16a F1: a MEMORY.md above SLOW_COUNT_BYTES whose count fails (EIO
    here; EACCES for a daemon not root does the same) was counted in the
    background, which then asked for a count at once, whose tick sent it to the
    background again (no count: a recount from scratch)... thousands of failed
    counts and log lines a second. A failed count is retried at the reconcile,
    once, as every other failed count is; at start-up (count_later) too."""
    import errno

    import memd.daemon.entries

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("big")
    ws.create_agent("small")
    monkeypatch.setattr(memd.daemon.counter, "SLOW_COUNT_BYTES", 4096)  # "large" here
    s = build_services(ws, ScriptedCompaction(), extra={"trigger": {"context_length": 10**6}})
    big = ws.root / "agents/big/MEMORY.md"
    replacement = big.with_suffix(".new")
    replacement.write_bytes(big.read_bytes())
    append_entry(replacement, "Human", "word " * 2000)  # 10 KB
    os.replace(replacement, big)  # a new inode: a recount from scratch, in the background
    failing = [True]
    attempts: list[str] = []
    real_open = memd.daemon.entries.open_memory

    def open_memory(paths: AgentPaths) -> int:
        if paths.agent == "big":
            attempts.append(threading.current_thread().name)
            if failing[0]:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_open(paths)

    monkeypatch.setattr(memd.daemon.entries, "open_memory", open_memory)
    entry = s.registry.get("big")
    assert entry is not None

    def ticks(n: int) -> None:
        for _ in range(n):
            s.counter.tick(s.clock.advance(1.0))
            _background_count_done()

    s.hint("big")
    ticks(6)
    assert attempts == ["memd-count-large"]  # once, not once per tick
    assert entry.count_error is not None and "Input/output error" in entry.count_error

    # The reconcile retries it: once (in the background: a large file readable again
    # must not hold every other agent's count while it is tokenized from scratch).
    s.counter.sink.reconcile_due()
    ticks(6)
    assert attempts == ["memd-count-large"] * 2
    assert entry.count_error is not None

    # Start-up: a large file counted after READY fails the same way, once.
    attempts.clear()
    s.counter.count_later([entry])
    _background_count_done()
    ticks(6)
    assert attempts == ["memd-count-large"]

    # Readable again: the next reconcile counts it, and it is current from then on.
    failing[0] = False
    s.counter.sink.reconcile_due()
    ticks(3)
    assert entry.count_error is None and s.tokens("big") == full(big)


def test_a_large_memory_symlinked_out_of_its_folder_is_refused_at_once_not_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 16a F1: the slow-count check followed a MEMORY.md symlink the count
    refuses (it leaves the agent's folder), judged its large target a slow count,
    and sent the refusal to the background. The check now sees the link as the
    count does: a fast failure, on the count thread, before READY at start-up."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("big")
    monkeypatch.setattr(memd.daemon.counter, "SLOW_COUNT_BYTES", 4096)  # "large" here
    s = build_services(ws, ScriptedCompaction(), extra={"trigger": {"context_length": 10**6}})
    outside = tmp_path / "outside.md"
    outside.write_bytes(b"x" * 10_000)
    memory = ws.root / "agents/big/MEMORY.md"
    memory.unlink()
    memory.symlink_to(outside)
    entry = s.registry.get("big")
    assert entry is not None
    threads: list[str] = []
    count = s.counter._count

    def recorded(counted: Any) -> bool:
        threads.append(threading.current_thread().name)
        return count(counted)

    monkeypatch.setattr(s.counter, "_count", recorded)
    assert s.counter.initial_count([entry], {}) == []  # not left for after READY
    assert threads == ["MainThread"] and entry.count_error is not None
    s.counter.request_count("big")
    for _ in range(3):
        s.counter.tick(s.clock.advance(1.0))
        _background_count_done()
    assert threads == ["MainThread"] * 2
    assert "outside" in entry.count_error or "MEMORY.md" in entry.count_error
