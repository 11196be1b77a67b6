"""The runner owns the job states and its lock: a flush that runs in the middle of
a transition never loses it, and the runner's lock is not the registry's."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.daemon_proc import wait_until
from support.daemon_services import (
    COUNTER,
    Clock,
    ScriptedCompaction,
    Services,
    build_services,
)
from support.memfiles import AgentWorkspace, swarms_block, swarms_header

from memd.core.jobs import JobState
from memd.daemon.entries import AgentEntry
from memd.errors import CompactionAborted, NothingToCompact
from memd.settings import build_config
from memd.state import StateStore


class InterleavedEntry(AgentEntry):
    """An entry that runs ``between`` right after ``dirty`` is set, as a flusher
    thread could: the deterministic form of the race the ordering rule closes."""

    __slots__ = ("_dirty_flag", "between")

    @property  # type: ignore[override]
    def dirty(self) -> bool:
        return self._dirty_flag

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self._dirty_flag = value
        between: Callable[[], None] | None = getattr(self, "between", None)
        if value and between is not None:
            self.between = None  # once
            between()


def interleaved(s: Services, name: str) -> InterleavedEntry:
    """Replace the registered entry of ``name`` by an :class:`InterleavedEntry`."""
    entry = s.registry.get(name)
    assert entry is not None
    fields: dict[str, Any] = {
        field: getattr(entry, field) for field in AgentEntry.__dataclass_fields__
    }
    twin = InterleavedEntry(**fields)
    twin.between = None
    s.registry.register([twin], set())
    return twin


def count(s: Services, entry: AgentEntry) -> None:
    """Count the agent without deciding (the counter's half of a tick)."""
    assert s.entry_counter is not None
    assert s.entry_counter.count_locked(entry)


def stored_state(store: StateStore, name: str) -> str:
    (record,) = [record for record in store.agents() if record.agent == name]
    return record.state


def test_a_flush_in_the_middle_of_a_transition_never_loses_it(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction("ok"))
    assert s.flusher is not None
    store = StateStore.open(tmp_path / "state", ws.root)
    s.flusher.start(contextlib.ExitStack(), store)
    s.flusher.flush()
    entry = interleaved(s, "alice")
    s.fill("alice", 20)
    count(s, entry)  # over threshold now, not yet decided
    s.flusher.flush()
    assert stored_state(store, "alice") == "idle"
    # The flusher runs right after the transition marks the entry dirty.
    entry.between = s.flusher.flush
    s.runner.evaluate(entry)
    assert entry.job.state is JobState.PENDING and entry.between is None
    s.flusher.flush()  # the next periodic flush
    assert stored_state(store, "alice") == "pending"
    store.close()


def test_job_transitions_do_not_wait_for_the_registry_lock(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction("ok"))
    s.fill("alice", 20)
    entry = s.registry.get("alice")
    assert entry is not None
    count(s, entry)
    held = threading.Event()
    release = threading.Event()

    def hold_the_registry() -> None:
        with s.registry._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_registry)
    holder.start()
    try:
        assert held.wait(30)
        decided = threading.Thread(target=s.runner.evaluate, args=(entry,))
        decided.start()
        decided.join(10)
        assert not decided.is_alive()  # decided while another service held its own lock
        assert s.scheduler.submitted == ["compact:alice"]
    finally:
        release.set()
        holder.join(30)


def test_a_flush_that_finds_an_erasure_takes_the_agents_past_and_metrics(
    tmp_path: Path,
) -> None:
    import time

    from memd.core.jobs import AgentJob
    from memd.metrics import Metrics

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("ghost")
    ws.create_agent("other")
    s = build_services(ws, ScriptedCompaction("fail", "fail"))
    assert s.flusher is not None
    store = StateStore.open(tmp_path / "state", ws.root)
    s.flusher.start(contextlib.ExitStack(), store)
    metrics = Metrics(process=False)
    s.runner.metrics = metrics
    assert s.entry_counter is not None
    s.entry_counter.metrics = metrics
    for name in ("ghost", "other"):
        s.fill(name, 20)
        s.hint(name)
    s.settle()
    s.scheduler.run_queued()
    assert s.job("ghost").state is JobState.BACKOFF and s.job("other").state is JobState.BACKOFF
    wake = s.job("other").next_attempt_at
    assert wake is not None and s.job("ghost").next_attempt_at == wake

    def series(name: str) -> float | None:
        return metrics.registry.get_sample_value("memd_agent_tokens", {"agent": name})

    assert series("ghost") is not None
    # `memd forget ghost` in another process: a tombstone (its files stay for this test).
    store.forget_agent("ghost", erased_at_ns=time.time_ns() + 10**12)
    s.runner.flush()
    assert s.job("ghost") == AgentJob()
    assert series("ghost") is None
    assert s.job("other").state is JobState.BACKOFF
    assert series("other") is not None
    # The erased agent's wake-up went with its past; the other's is kept and retries.
    assert s.counter.tick(s.clock.now) == wake
    s.clock.now = wake
    s.counter.tick(s.clock.now)
    assert sorted(s.scheduler.submitted) == ["compact:ghost", "compact:other", "compact:other"]
    # Back: a new MEMORY.md lifts the tombstone; its series returns with its count.
    (ws.root / "agents/ghost/MEMORY.md").unlink()
    ws.create_agent("ghost", entries=1)
    store.forget_agent("ghost", erased_at_ns=time.time_ns() - 10**9)  # before the new file
    s.hint("ghost")
    s.settle()
    s.runner.flush()
    assert store.tombstoned(["ghost"]) == {}
    assert series("ghost") == s.tokens("ghost") > 0
    store.close()


class HandedOn:
    """The stages after a commit: records what the runner hands them, and whether
    the agent was still counted as compacting (the ``seconds`` logged include it)."""

    def __init__(self, s: Services | None = None) -> None:
        self.s = s
        self.handed: list[tuple[str, Path, list[str]]] = []
        self.maybe_replaced: list[str] = []

    def committed(self, paths: Any, outcome: Any) -> None:
        running = self.s.runner.running() if self.s is not None else []
        self.handed.append((paths.agent, outcome.archive, running))

    def replaced(self, paths: Any) -> None:
        self.maybe_replaced.append(paths.agent)


def test_only_a_committed_compaction_is_handed_on_with_its_outcome(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    handed = HandedOn()
    s = build_services(ws, ScriptedCompaction("fail", "nothing", "ok"), after_commit=handed)
    handed.s = s
    s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    s.scheduler.run_queued()  # failed: nothing committed, nothing handed on
    assert s.job("alice").state is JobState.BACKOFF and handed.handed == []
    s.clock.now = s.job("alice").next_attempt_at
    s.counter.tick(s.clock.now)
    s.scheduler.run_queued()  # nothing to compact: nothing handed on either
    assert s.compact.calls == ["alice", "alice"] and handed.handed == []
    # A failed job may have come past its commit point: the watch stage is told
    # the file may be new (a path stat of it on the poller's next pass).
    assert handed.maybe_replaced == ["alice", "alice"]
    s.clock.now = s.job("alice").next_attempt_at
    s.counter.tick(s.clock.now)
    s.scheduler.run_queued()
    assert s.compact.calls == ["alice"] * 3
    # The outcome the transaction returned, handed on while the job still runs.
    assert handed.handed == [("alice", ws.root / "agents" / "alice" / "archive", ["alice"])]
    assert s.job("alice").state is JobState.IDLE


def test_after_a_compaction_the_new_file_is_counted_on_from_the_jobs_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.daemon_services import COUNTER
    from support.memfiles import append_entry

    import memd.daemon.entries as entries

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction("ok"))
    memory = s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    previous: list[Any] = []
    count_fd = entries.count_fd

    def recording(fd: int, path: Path, prior: Any, *args: Any, **kwargs: Any) -> Any:
        previous.append(prior)
        return count_fd(fd, path, prior, *args, **kwargs)

    monkeypatch.setattr(entries, "count_fd", recording)
    s.compact.during = lambda paths: append_entry(paths.memory, "AI", "written during the drain")
    s.scheduler.run_queued()
    (seed,) = s.compact.seeds
    assert previous == [seed]  # not the old file's count: no count from scratch
    assert s.tokens("alice") == COUNTER.count_bytes(memory.read_bytes())
    assert s.job("alice").state is JobState.IDLE


def test_a_file_replaced_after_the_runners_count_but_before_the_job_ends_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review 13b, R5: the runner counts the new file, then applies the outcome
    # (_succeeded), which ends RUNNING. A MEMORY.md replaced in between (the agent
    # re-seeding its file) is reported; the counting thread sees RUNNING and another
    # inode and leaves it to the runner, whose count was already made. With --poll
    # (files_polled: the reconcile stats no file, the poller reported the change
    # once) it must still be counted once the job has ended.
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction("ok"))
    s.counter.files_polled = True  # --poll
    memory = s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    assert s.job("alice").state is JobState.PENDING
    succeeded = s.runner._succeeded

    def replaced_in_between(entry: Any, *args: Any, **kwargs: Any) -> Any:
        assert entry.job.state is JobState.RUNNING
        staged = memory.parent / "staged"
        staged.write_text(swarms_header("alice") + swarms_block("Human", "re-seeded " * 60))
        os.replace(staged, memory)
        s.hint("alice")  # the watcher's event ...
        s.settle()  # ... counted by the count thread while the job is still RUNNING
        return succeeded(entry, *args, **kwargs)

    monkeypatch.setattr(s.runner, "_succeeded", replaced_in_between)
    s.scheduler.run_queued()
    assert s.job("alice").state is not JobState.RUNNING
    # No sweep, no new event: the runner counted it as the job ended.
    assert s.tokens("alice") == COUNTER.count_bytes(memory.read_bytes())


class OtherTokenizer:
    """A reload's tokenizer (the same figures, another object)."""

    def count_bytes(self, data: bytes) -> int:
        return COUNTER.count_bytes(data)

    def count_text(self, text: str) -> int:
        return COUNTER.count_text(text)


def test_a_job_started_between_a_reloads_swap_and_its_reset_counts_afresh(
    tmp_path: Path,
) -> None:
    # A reload swaps the counter's tokenizer, then resets each agent's count; a job
    # starting in between must not extend the old encoding's count with the new
    # tokenizer (review 13b, R1 at the job's start): it is given no count.
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    compact = ScriptedCompaction("ok")
    s = build_services(ws, compact)
    s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    assert s.job("alice").state is JobState.PENDING
    assert s.entry_counter is not None
    new = OtherTokenizer()
    s.entry_counter.tokenizer = new  # the reload's first step; alice not reset yet
    s.scheduler.run_queued()
    (given,) = compact.kwargs
    assert given["threshold"].counted is None
    assert given["count_bytes"] == new.count_bytes


def test_a_reload_that_turns_compression_off_drops_the_queued_compaction(
    tmp_path: Path,
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    compact = ScriptedCompaction("ok")
    s = build_services(ws, compact)
    s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    assert s.job("alice").state is JobState.PENDING  # queued behind a storm
    # SIGHUP: [agents.alice] context_compression = false ("watch and count, never compact").
    data = s.runner.config.model_dump()
    data["agents"] = {"alice": {"context_compression": False}}
    data.pop("workspace", None)
    new = build_config(data, {})[0]
    s.runner.reconfigure(new)
    s.registry.reconfigure(new)
    assert not s.registry.agents()["alice"].policy.compress
    s.runner.evaluate_all(s.registry.agents().values())  # what _reload does next
    s.scheduler.run_queued()  # the slot frees up
    assert compact.calls == []  # never compacted after it was turned off
    assert s.job("alice").state is JobState.DISABLED


def test_a_forced_exit_rollback_is_not_counted_as_a_failure(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction())

    def aborted(paths: Any, _summarizer: Any, _options: Any, **kwargs: Any) -> Any:
        s.runner.stop()  # SIGINT: the runner stops taking jobs...
        kwargs["abort"].set()  # ...and a second SIGINT forces: the job rolls back
        raise CompactionAborted(
            f"agent {paths.agent!r}: shutdown forced; aborted before commit (at summarized)"
        )

    s.runner._compact = aborted
    s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    s.scheduler.run_queued()
    job = s.job("alice")
    assert job.consecutive_failures == 0
    assert job.state is JobState.IDLE


class GatedSummarizer:
    """Records which model each agent's summary went to; ``gate`` holds the first."""

    def __init__(self, model: str, log: list[tuple[str, str]], gate: threading.Event) -> None:
        self.model = model
        self._log = log
        self._gate = gate

    def summarize(self, request: Any) -> Any:
        self._log.append((request.agent, self.model))
        if request.agent == "a":
            assert self._gate.wait(30)
        raise NothingToCompact(f"agent {request.agent!r}: scripted")


def test_a_reload_that_changes_the_model_applies_to_jobs_still_waiting_for_a_slot(
    tmp_path: Path,
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("a")
    ws.create_agent("b")
    s = build_services(ws, ScriptedCompaction(), extra={"daemon": {"max_concurrent_llm": 1}})
    sent: list[tuple[str, str]] = []
    gate = threading.Event()
    s.runner.summarizers._factory = lambda config, _count: GatedSummarizer(
        config.summarizer.model, sent, gate
    )

    def compact(paths: Any, summarizer: Any, options: Any, **_kwargs: Any) -> Any:
        # compact_agent's shape: lock, snapshot, then the summary (an LLM slot).
        return summarizer.summarize(SimpleNamespace(agent=paths.agent))

    s.runner._compact = compact
    for name in ("a", "b"):
        s.fill(name, 20)
        s.hint(name)
    s.settle()
    jobs = sorted(s.scheduler.queued, key=lambda job: job[0])
    s.scheduler.queued = []
    assert [key for key, _t, _a in jobs] == ["compact:a", "compact:b"]
    threads = [threading.Thread(target=task, args=args) for _key, task, args in jobs]
    threads[0].start()
    assert wait_until(lambda: sent == [("a", "builtin")], timeout=30)  # a holds the one slot
    threads[1].start()
    assert wait_until(lambda: len(s.runner.llm_slots._cond._waiters) == 1, timeout=30)
    # SIGHUP: the operator moves summaries to another model (say: a local one).
    data = s.runner.config.model_dump()
    data.pop("workspace", None)
    data["summarizer"]["model"] = "ollama/llama3.1"
    s.runner.reconfigure(build_config(data, {})[0])
    gate.set()
    for thread in threads:
        thread.join(30)
    # b gave up its slot unstarted when it saw the reload, and was queued again.
    assert s.scheduler.run_queued() == 1
    # b's summary had not started at the reload: it goes to the model configured now.
    assert sent == [("a", "builtin"), ("b", "ollama/llama3.1")]


def test_a_summary_started_over_with_every_slot_busy_waits_for_its_slot(
    tmp_path: Path,
) -> None:
    # MEMORY.md rewritten during a's summary: its transaction starts over and needs
    # a slot again, under the agent's lock. b holds the only one: a waits for it
    # (review 16c F2: giving up and queueing again reset its restart count, so a
    # storm could keep it summarizing forever), then summarizes; not a failure.
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("a")
    ws.create_agent("b")
    s = build_services(ws, ScriptedCompaction(), extra={"daemon": {"max_concurrent_llm": 1}})
    sent: list[tuple[str, str]] = []
    b_summarizing = threading.Event()
    release_b = threading.Event()

    class Summarizer:
        model = "builtin"

        def summarize(self, request: Any) -> Any:
            sent.append((request.agent, self.model))
            if request.agent == "b":
                b_summarizing.set()
                assert release_b.wait(30)
            raise NothingToCompact(f"agent {request.agent!r}: scripted")

    s.runner.summarizers._factory = lambda _config, _count: Summarizer()
    a_started_over = threading.Event()

    def compact(paths: Any, summarizer: Any, options: Any, **_kwargs: Any) -> Any:
        request = SimpleNamespace(agent=paths.agent)
        if paths.agent == "a" and not a_started_over.is_set():
            with contextlib.suppress(NothingToCompact):
                summarizer.summarize(request)  # the first summary: its reserved slot
            a_started_over.set()
            assert b_summarizing.wait(30)  # meanwhile b took the slot
        return summarizer.summarize(request)

    s.runner._compact = compact
    for name in ("a", "b"):
        s.fill(name, 20)
        s.hint(name)
    s.settle()
    jobs = sorted(s.scheduler.queued, key=lambda job: job[0])
    s.scheduler.queued = []
    threads = [threading.Thread(target=task, args=args) for _key, task, args in jobs]
    threads[0].start()
    assert a_started_over.wait(30)
    threads[1].start()
    assert wait_until(lambda: len(s.runner.llm_slots._cond._waiters) == 1, timeout=30)
    assert threads[0].is_alive() and sent == [("a", "builtin"), ("b", "builtin")]
    release_b.set()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    # a's second summary ran once b's returned, in the same job: not queued again.
    assert sent == [("a", "builtin"), ("b", "builtin"), ("a", "builtin")]
    assert s.job("a").consecutive_failures == 0
    assert s.scheduler.queued == []
    assert s.runner.llm_slots._free == 1


def test_a_file_rewritten_during_every_summary_is_not_resummarized_forever_in_a_storm(
    tmp_path: Path,
) -> None:
    """Review 16c F2: a summary started over with every slot busy (the storm's next
    job took the freed one) gave up and was queued again, its transaction's restart
    count back at 0: a file rewritten during every summary was summarized again
    forever, a model call each round, never a failure, never a backoff. Real Runner
    and compact_agent, one slot, max_restarts = 3."""
    from memd.compaction import compact_agent
    from memd.core.summary import SummaryRequest, SummaryResult

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha")
    memory = ws.root / "agents" / "alpha" / "MEMORY.md"
    calls: list[str] = []
    other_jobs: list[threading.Thread] = []
    other_took = threading.Event()

    def another_agents_job() -> None:
        # Another agent's job of the storm, waiting for a slot: it gets the one
        # alpha's summary gives back, and summarizes until alpha's job has either
        # queued for the next slot or left (given up, or failed).
        slots = s.runner.llm_slots
        slots._take("other")
        other_took.set()
        assert wait_until(
            lambda: bool(slots._cond._waiters) or "alpha" not in s.runner._stats.running,
            timeout=10,
        )
        slots._give_back()

    class RewritingSummarizer:
        """The agent rewrites MEMORY.md (same bytes, new inode: an editor's save,
        a tool's write-and-rename) while each summary is made."""

        model = "scripted"

        def summarize(self, request: SummaryRequest) -> SummaryResult:
            calls.append(request.agent)
            data = memory.read_bytes()
            tmp = memory.with_name("MEMORY.md.new")
            tmp.write_bytes(data)
            os.replace(tmp, memory)
            waiter = threading.Thread(target=another_agents_job)
            waiter.start()
            other_jobs.append(waiter)
            assert wait_until(lambda: len(s.runner.llm_slots._cond._waiters) >= 1, timeout=10)
            return SummaryResult(text="Goals: ship memd. " * 10, model="scripted")

    def checkpoint(name: str) -> None:
        if name == "summarized":  # alpha's slot is back: the storm's next job has it
            assert other_took.wait(10)
            other_took.clear()

    def compact(paths: Any, summarizer: Any, options: Any, **kwargs: Any) -> Any:
        return compact_agent(paths, summarizer, options, checkpoint=checkpoint, **kwargs)

    s = build_services(
        ws,
        compact,
        extra={"daemon": {"max_concurrent_llm": 1}, "compaction": {"max_restarts": 3}},
        summarizer=RewritingSummarizer(),
    )
    s.fill("alpha", 20)
    s.hint("alpha")
    s.settle()
    for _round in range(8):
        if s.scheduler.run_queued() == 0:
            break
        for waiter in other_jobs:
            waiter.join(10)
    job = s.job("alpha")
    # max_restarts = 3: at most 4 summaries of a file rewritten during each, then
    # the job fails and backs off (as it does with a slot free).
    assert len(calls) <= 4, (len(calls), job)
    assert job.consecutive_failures >= 1 and job.state is not JobState.PENDING, job
    assert "rewritten during compaction" in (job.last_error or "")
    assert s.runner.llm_slots._free == 1  # every slot back, exactly once


def test_a_lock_held_by_another_process_shows_as_busy_not_as_an_error(tmp_path: Path) -> None:
    # compact-now (forget, prune, a second daemon) held the agent's lock past the
    # daemon's short wait: the job is retried later, and `memd status` (the state
    # DB), the systemd STATUS= line and the ledger say busy, not failed.
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction("busy", "ok"))
    assert s.flusher is not None
    store = StateStore.open(tmp_path / "state", ws.root)
    s.flusher.start(contextlib.ExitStack(), store)
    s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    assert s.scheduler.run_queued() == 1
    (record,) = [record for record in store.agents() if record.agent == "alice"]
    assert record.state == "cooldown"
    # With the lock timeout's own reason (the scripted one's: "agent 'alice': busy").
    assert record.last_error == "busy: agent 'alice': busy"
    assert record.consecutive_failures == 0
    assert store.history("alice") == []  # not a failed compaction
    assert "0 in error" in s.flusher.status_text()
    # Retried once the wait is over, and then compacted.
    s.clock.advance(3600)
    s.counter.tick(s.clock.now)
    assert s.scheduler.run_queued() == 1
    assert s.compact.calls == ["alice", "alice"]
    assert s.job("alice").state is JobState.IDLE and s.job("alice").last_error is None
    store.close()


def test_a_lock_held_elsewhere_for_half_an_hour_is_said_once_as_a_warning(
    tmp_path: Path,
) -> None:
    """A `compact-now` whose model hangs (or a wedged second daemon) keeps the agent's
    lock: the daemon's quiet "retrying later" every few seconds hid that the agent
    could not be compacted at all. After BUSY_WARNING_AFTER_S it warns, once, naming
    the holder; once it gets the lock, it says so and the next hold starts afresh."""
    import structlog

    from memd.daemon.runner import BUSY_WARNING_AFTER_S

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    tries = int(BUSY_WARNING_AFTER_S // 600) + 2  # one try every 10 minutes
    s = build_services(ws, ScriptedCompaction(*["busy"] * tries, "ok", "busy"))
    s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    with structlog.testing.capture_logs() as logs:
        for _ in range(tries + 2):
            assert s.scheduler.run_queued() == 1
            s.clock.advance(600)
            s.counter.tick(s.clock.now)
            if s.compact.calls.count("alice") == tries + 1:
                break
            if s.job("alice").state is JobState.IDLE:
                s.fill("alice", 20)
                s.hint("alice")
                s.settle()
    warnings = [log for log in logs if log["log_level"] == "warning"]
    assert [w["event"].split(";")[0] for w in warnings] == [
        "another process has held the agent's lock for a long time"
    ], warnings
    assert warnings[0]["agent"] == "alice" and warnings[0]["lock"] == "agent 'alice': busy"
    assert warnings[0]["held_for_min"] >= BUSY_WARNING_AFTER_S / 60
    assert any(log["event"].startswith("the agent's lock was let go") for log in logs)
    entry = s.registry.get("alice")
    assert entry is not None and entry.busy_since is None and not entry.busy_warned


def test_one_short_collision_hours_after_another_is_not_a_lock_held_for_hours(
    tmp_path: Path,
) -> None:
    """review r8cli F3: the time a lock was first found busy outlived the job that met
    it (the next try found the agent under its threshold: no lock taken, nothing
    reset), so one collision six hours later was warned as a lock held for 365 min."""
    import structlog

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction("busy", "busy"))
    memory = ws.root / "agents" / "alice" / "MEMORY.md"
    with structlog.testing.capture_logs() as logs:
        s.fill("alice", 20)
        s.hint("alice")
        s.settle()
        assert s.scheduler.run_queued() == 1  # busy: compact-now has the lock
        # That compact-now compacts the agent and lets go: the daemon's retry finds it
        # under its threshold and has nothing to do (it never takes the lock).
        memory.write_text(swarms_header("alice") + swarms_block("System", "summary " * 5))
        for _ in range(5):
            s.clock.advance(60)
            s.counter.tick(s.clock.now)
            s.settle()
            s.scheduler.run_queued()
        # Six hours later the agent is over its threshold again and the daemon meets a
        # compact-now that took the lock a moment ago.
        s.clock.advance(6 * 3600)
        s.counter.tick(s.clock.now)
        s.fill("alice", 20)
        s.hint("alice")
        s.settle()
        assert s.scheduler.run_queued() == 1
    assert s.compact.calls == ["alice", "alice"]
    warnings = [log for log in logs if log["log_level"] == "warning"]
    # Today: "another process has held the agent's lock for a long time … (if that
    # process is stuck, stop it)", held_for_min=365, about a holder of one second.
    assert warnings == [], warnings


def test_a_wall_clock_stepped_back_an_hour_holds_a_cooldown_no_longer_than_it_lasts(
    tmp_path: Path,
) -> None:
    """Holds and wake-ups are wall-clock times: stepped back an hour while the agent
    cooled down after a busy lock (10 s), it was compacted an hour and 10 s later,
    over its threshold all along. Now the step wakes the agent at the next tick,
    its hold cut to the longest cooldown memd sets (60 s), then it is compacted."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    wall = Clock()  # the wall clock, advanced with the monotonic one
    s = build_services(ws, ScriptedCompaction("busy", "ok"), wall_clock=wall)

    def advance(seconds: float) -> float:
        wall.advance(seconds)
        return s.clock.advance(seconds)

    s.fill("alice", 20)
    s.hint("alice")
    s.counter.tick(advance(1.0))
    assert s.scheduler.run_queued() == 1
    job = s.job("alice")
    assert job.state is JobState.COOLDOWN and job.next_attempt_at == wall.now + 10
    wall.advance(-3600)  # the wall clock steps back; the monotonic one runs on
    s.counter.tick(advance(0.5))
    cut = s.job("alice").next_attempt_at
    assert cut is not None and cut <= wall.now + 60
    for _ in range(61):
        s.counter.tick(advance(1.0))
        if s.scheduler.run_queued():
            break
    assert s.compact.calls == ["alice", "alice"]
    assert s.job("alice").state is JobState.IDLE


def _lone_summary(lines: int) -> str:
    """A summary block of distinct carried lines, as an older build left it."""
    from memd.core.memfile import SUMMARY_PREAMBLE

    return (
        SUMMARY_PREAMBLE
        + "Earlier (carried forward):\n"
        + "".join(f"> the build {index} passed on runner r{index}\n" for index in range(lines))
    )


def test_a_summary_alone_over_its_budget_is_summarized_again_and_ends_below_the_threshold(
    tmp_path: Path,
) -> None:
    """An older build's summary block bigger than today's threshold (726ab50's builtin
    summary carried every earlier line forward; tests/test_upgrade.py met it), or a
    threshold lowered below a summary: the file is that block alone. It was 'nothing
    to compact' at every cooldown, the agent over its window for good; the block is
    now re-summarized within its budget (the real transaction and builtin summarizer),
    and then, within it, left alone."""
    from support.tokens import CL100K

    from memd.compaction import compact_agent
    from memd.summarizers import BuiltinSummarizer

    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice")
    before = swarms_header("alice") + swarms_block("System", _lone_summary(150))
    paths.memory.write_text(before)
    s = build_services(ws, ScriptedCompaction(), summarizer=BuiltinSummarizer(CL100K.count_text))
    s.runner._compact = compact_agent
    s.hint("alice")
    s.settle()
    entry = s.registry.get("alice")
    assert entry is not None and entry.tokens > entry.policy.threshold_tokens
    assert s.scheduler.run_queued() == 1
    job = s.job("alice")
    assert job.state is JobState.IDLE and job.last_error is None, job
    assert entry.tokens < entry.policy.low_water_tokens, entry.tokens
    (archive,) = paths.archive_dir.iterdir()
    assert archive.read_text() == before
    assert "the build 149 passed on runner r149" in paths.memory.read_text()
    # Nothing more to do: no job queued, however long the clock runs.
    for _ in range(5):
        s.settle()
        assert s.scheduler.run_queued() == 0


def test_a_summary_alone_over_the_threshold_is_said_so_never_as_unparsable_bytes(
    tmp_path: Path,
) -> None:
    """A summary block within its budget yet over the threshold (a low-water mark near
    the threshold leaves a budget that big): nothing to compact. The job's error says
    why, in compact-now's words; it said the bytes after the last entry did not parse
    ('fix or remove them'), and there were none."""
    from support.tokens import CL100K

    from memd.compaction import compact_agent
    from memd.core.plan import SUMMARY_MARKUP_TOKENS

    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice")
    # Threshold 500 tokens; summary 300 + pinned 100 (+ the block's markup) may be 560.
    extra = {
        "trigger": {"low_water": 0.95},
        "summarizer": {"summary_tokens": 300, "pinned_tokens": 100},
    }
    lines = 1
    while CL100K.count_text(swarms_block("System", _lone_summary(lines))) <= 520:
        lines += 1
    text = swarms_block("System", _lone_summary(lines))
    assert 500 < CL100K.count_text(text) <= 400 + SUMMARY_MARKUP_TOKENS
    paths.memory.write_text(swarms_header("alice") + text)
    s = build_services(ws, ScriptedCompaction(), extra=extra)
    s.runner._compact = compact_agent
    s.hint("alice")
    s.settle()
    assert s.scheduler.run_queued() == 1
    job = s.job("alice")
    assert job.state is JobState.COOLDOWN
    assert job.last_error == (
        "over its threshold with nothing to compact (no raw entries since the last summary)"
    )
    # Garbage after the last entry is still said as such, with its size.
    with paths.memory.open("a") as handle:
        handle.write("### not an entry\n" * 300)
    s.clock.now = job.next_attempt_at
    s.hint("alice")
    s.settle()
    s.scheduler.run_queued()
    error = s.job("alice").last_error or ""
    assert error.startswith("over its threshold with nothing to compact: the "), error
    assert error.endswith(
        " bytes after the last complete entry cannot be parsed (they are kept verbatim; fix or remove them)"
    ), error
