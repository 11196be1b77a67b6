"""A compaction that committed but did not finish (the folder's fsync after the swap,
or moving a late writer's turns, failed): the daemon's runner finishes it from the
journal soon after, with the recovery a restart would run, with backoff while it
keeps failing. Real compactions (compact_agent, faults injected at its steps), a
scripted summarizer, the runner's services with a made-up clock."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.daemon_services import Services, build_services
from support.memfiles import AgentWorkspace, entry_contents_everywhere

from memd.compaction import compact_agent, recover_agent
from memd.core.jobs import JobState, stored_state
from memd.core.summary import SummaryRequest, SummaryResult

LATE = "### AI \u2014 2026-01-01T00:00:00\n\nalpha late turn " + "z" * 120 + "\n\n---\n\n"
LATE_TEXT = "alpha late turn " + "z" * 120
# The drain's quiet wait kept short (the late writer is done before it starts).
FAST = {"compaction": {"drain_quiet_s": 0.05, "drain_max_s": 1.0}}
RETRY_BASE_S = 10.0  # support.daemon_services.CONFIG's daemon.retry_base_s


class ScriptedSummarizer:
    model = "scripted"

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(
            text=(
                "Goals: ship memd. Decisions: the user prefers tea and short answers; "
                "compaction keeps every entry exactly once. Open tasks: write the docs, "
                "run the crash tests, land the branch, answer alice about her turns."
            ),
            model="scripted",
        )


class RealCompaction:
    """compact_agent as the runner calls it, with ``checkpoint`` at its named steps."""

    def __init__(self, checkpoint: Callable[[str], None]) -> None:
        self.checkpoint = checkpoint
        self.calls = 0

    def __call__(self, paths: Any, summarizer: Any, options: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return compact_agent(paths, summarizer, options, checkpoint=self.checkpoint, **kwargs)


class LateWriter:
    """An agent that opened MEMORY.md just before the swap and writes one turn to
    it (the old file, by then) just after."""

    def __init__(self, memory: Path) -> None:
        self.memory = memory
        self.handle: Any = None

    def checkpoint(self, name: str) -> None:
        if name == "journal-swapping":
            self.handle = open(self.memory, "a", encoding="utf-8")

    def write(self) -> None:
        if self.handle is not None:
            self.handle.write(LATE)
            self.handle.close()
            self.handle = None


def compaction_fails_after_its_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> tuple[Services, RealCompaction, Path, list[int]]:
    """alpha over its threshold, compacted by the runner; a late turn goes to the old
    file after the swap, and ``fault`` strikes after the commit: ``eio-dir-fsync``
    (the folder's fsync after the replace) or ``enospc-drain`` (every append of the
    late turn, until the test lets it through). Returns the services, the
    compaction, MEMORY.md, and the drain's failures left (the test sets it)."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha")
    memory = ws.root / "agents" / "alpha" / "MEMORY.md"
    writer = LateWriter(memory)
    real_replace, real_fsync, real_write = os.replace, os.fsync, os.write
    drain_failures = [0]
    fsync_fails = [False]

    def checkpoint(name: str) -> None:
        writer.checkpoint(name)
        if name == "replaced":
            writer.write()

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        real_replace(src, dst, **kwargs)
        if dst == "MEMORY.md" and fault == "eio-dir-fsync":
            writer.write()
            fsync_fails[0] = True

    def fsync(fd: int) -> None:
        if fsync_fails[0]:
            fsync_fails[0] = False
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    def write(fd: int, data: Any) -> int:
        if drain_failures[0] > 0 and bytes(data) == LATE.encode():
            drain_failures[0] -= 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    compaction = RealCompaction(checkpoint)
    s = build_services(ws, compaction, extra=FAST, summarizer=ScriptedSummarizer())  # type: ignore[arg-type]
    s.fill("alpha", 20)
    s.hint("alpha")
    s.settle()
    assert s.scheduler.submitted == ["compact:alpha"]
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "write", write)
    if fault == "enospc-drain":
        drain_failures[0] = 1
    s.scheduler.run_queued()
    return s, compaction, memory, drain_failures


def run_when_due(s: Services) -> None:
    """Move the made-up clock to the agent's next attempt and let it run."""
    due = s.job("alpha").next_attempt_at
    assert due is not None
    s.clock.now = due
    s.counter.tick(s.clock.now)
    s.scheduler.run_queued()


def assert_drain_owed_for_a_full_disk(s: Services) -> None:
    """The late turn not moved: the agent's job owes its drain, says so in `memd
    status` (error, with why) and retries after the backoff's first step."""
    job = s.job("alpha")
    assert job.drain_owed and job.state is JobState.BACKOFF
    assert stored_state(job) == "error"
    assert "late turns not yet in MEMORY.md" in (job.last_error or "")
    assert "No space left on device" in (job.last_error or "")
    assert job.next_attempt_at == s.clock.now + RETRY_BASE_S


def assert_drain_finished(s: Services, memory: Path | None = None) -> None:
    """Every entry once, the late turn included (at the end of MEMORY.md when
    ``memory`` is given), and the agent's job healthy again."""
    counts = entry_contents_everywhere(s.ws.paths("alpha"))
    assert counts[LATE_TEXT] == 1 and all(n == 1 for n in counts.values()), counts
    if memory is not None:
        assert memory.read_bytes().endswith(LATE.encode())
    job = s.job("alpha")
    assert job.state is JobState.IDLE and not job.drain_owed and job.last_error is None


@pytest.mark.parametrize("fault", ["eio-dir-fsync", "enospc-drain"])
def test_late_turns_reach_memory_after_a_committed_compaction_fails_to_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    s, compaction, memory, _left = compaction_fails_after_its_swap(tmp_path, monkeypatch, fault)
    failed = s.job("alpha")
    failed_at = s.clock.now
    # Committed (the archive and the new file are in place), the late turn not moved.
    assert compaction.calls == 1
    assert len(list((memory.parent / "archive").glob("history_*.md"))) == 1
    assert LATE.encode() not in memory.read_bytes()

    run_when_due(s)

    # No restart, no new compaction: the journal's roll-forward moved the late turn.
    counts = entry_contents_everywhere(s.ws.paths("alpha"))
    assert counts[LATE_TEXT] == 1
    assert s.scheduler.submitted == ["compact:alpha", "finish:alpha"]
    assert compaction.calls == 1
    assert len(list((memory.parent / "archive").glob("history_*.md"))) == 1
    assert all(n == 1 for n in counts.values()), counts
    assert memory.read_bytes().endswith(LATE.encode())
    job = s.job("alpha")
    assert job.state is JobState.IDLE and not job.drain_owed and job.last_error is None
    # What `memd status` showed meanwhile: retried soon (retry_base_s), and why.
    assert failed.state is JobState.BACKOFF and failed.drain_owed
    assert failed.next_attempt_at == failed_at + RETRY_BASE_S
    assert "late turns not yet in MEMORY.md" in (failed.last_error or "")
    assert "committed" in (failed.last_error or "")


def test_finishing_the_drain_backs_off_while_it_keeps_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, compaction, memory, left = compaction_fails_after_its_swap(
        tmp_path, monkeypatch, "enospc-drain"
    )
    left[0] = 2  # the disk stays full for the next two attempts
    for delay in (RETRY_BASE_S, 2 * RETRY_BASE_S):
        job = s.job("alpha")
        assert job.next_attempt_at == s.clock.now + delay
        run_when_due(s)
        assert LATE.encode() not in memory.read_bytes()
        assert s.job("alpha").drain_owed
        assert "No space left on device" in (s.job("alpha").last_error or "")
    job = s.job("alpha")
    # Backoff, never the breaker: no model call is at stake.
    assert job.state is JobState.BACKOFF and job.drain_attempts == 3
    assert job.next_attempt_at == s.clock.now + 4 * RETRY_BASE_S
    run_when_due(s)
    assert compaction.calls == 1
    assert entry_contents_everywhere(s.ws.paths("alpha"))[LATE_TEXT] == 1
    assert not s.job("alpha").drain_owed and s.job("alpha").state is JobState.IDLE


def restart(s: Services, compaction: RealCompaction) -> Services:
    """The daemon stops with alpha's job as it is (the state DB keeps it) and starts
    again a minute later, as the wiring does: recovery (the real one; it logs a
    failure and goes on), the stored jobs restored, the count, the first decisions."""
    from memd.state import AgentRecord

    entry = s.registry.get("alpha")
    assert entry is not None
    record = AgentRecord.of(
        "alpha", entry.tracked, entry.job,
        threshold_tokens=entry.policy.threshold_tokens, count_error=None,
        encoding=s.counter.encoding, now=s.clock.now,
    )  # fmt: skip
    after = build_services(s.ws, compaction, extra=FAST, summarizer=ScriptedSummarizer())  # type: ignore[arg-type]
    after.clock.now = s.clock.now + 60.0
    restarted = after.registry.get("alpha")
    assert restarted is not None
    after.registry._recover = lambda paths, key: recover_agent(paths, key_file=key)
    after.registry.recover(restarted)
    after.runner.restore([(restarted, record)])
    assert after.entry_counter is not None
    after.entry_counter.count_locked(restarted)
    after.runner.evaluate_all([restarted])
    return after


def test_an_owed_drain_that_start_up_recovery_cannot_finish_is_finished_after_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 16a F2: the daemon stopped with a drain owed and the restart's recovery
    failed too (the disk still full). The restored job dropped the owed drain (it
    assumed recovery had finished it): no finish was ever scheduled, `memd status`
    was clean, and the late turn stayed out of MEMORY.md until the agent's next
    compaction. The drain stays owed across the restart and is finished."""
    s, compaction, memory, left = compaction_fails_after_its_swap(
        tmp_path, monkeypatch, "enospc-drain"
    )
    assert s.job("alpha").drain_owed
    left[0] = 2  # the disk is still full for the restart's recovery and the first retry
    after = restart(s, compaction)
    assert LATE.encode() not in memory.read_bytes()  # recovery failed
    assert after.scheduler.submitted == ["finish:alpha"]  # owed still: tried at once
    after.scheduler.run_queued()
    # What `memd status` shows meanwhile: the truth.
    assert_drain_owed_for_a_full_disk(after)

    run_when_due(after)  # the disk has room again

    assert after.scheduler.submitted == ["finish:alpha", "finish:alpha"]
    assert compaction.calls == 1  # finished, never compacted again
    assert_drain_finished(after, memory)


def test_a_restart_whose_recovery_finished_the_drain_clears_it_at_the_first_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual restart with a drain owed: its recovery moves the late turn. The
    restored job still says the drain is owed (only a run can tell); the first
    finish, right after READY, finds nothing left to do: the agent is healthy at
    once, nothing is moved twice, no compaction is run."""
    s, compaction, memory, _left = compaction_fails_after_its_swap(
        tmp_path, monkeypatch, "enospc-drain"
    )
    after = restart(s, compaction)
    assert memory.read_bytes().endswith(LATE.encode())  # the restart's recovery moved it
    restored = after.job("alpha")
    assert restored.drain_owed and restored.state is JobState.PENDING  # due at once
    assert after.scheduler.submitted == ["finish:alpha"]
    after.scheduler.run_queued()
    job = after.job("alpha")
    assert job.state is JobState.IDLE and not job.drain_owed and job.last_error is None
    assert stored_state(job) == "idle" and job.next_attempt_at is None
    assert after.job("alpha").last_compaction_at == s.job("alpha").last_compaction_at
    assert compaction.calls == 1
    counts = entry_contents_everywhere(after.ws.paths("alpha"))
    assert counts[LATE_TEXT] == 1 and all(n == 1 for n in counts.values()), counts


def test_an_owed_drain_whose_finish_meets_a_busy_lock_stays_owed_across_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 16c F1: the finish job met a lock held by `memd forget` / `compact-now`
    and went to a busy cooldown whose "busy: …" error replaced the drain-owed
    marker. `memd status` then showed a cooldown while the late turns were still
    missing, and a restart whose recovery failed found no marker: the drain was
    dropped, the late turn out of MEMORY.md until the agent's next compaction."""
    from memd.fsutil import AgentLock

    s, compaction, memory, left = compaction_fails_after_its_swap(
        tmp_path, monkeypatch, "enospc-drain"
    )
    owed = s.job("alpha")
    assert owed.drain_owed
    # The operator runs `memd forget` / `compact-now` on alpha (the disk is still
    # full: its own roll-forward fails too) while the daemon's finish job is due.
    holder = AgentLock(s.ws.paths("alpha").lock, "alpha")
    holder.acquire(0)
    left[0] = 1
    try:
        run_when_due(s)  # the finish job: LockTimeout after the daemon's 1 s wait
    finally:
        holder.release()
    busy = s.job("alpha")
    assert busy.drain_owed  # in memory, still owed
    # What `memd status` shows meanwhile: the late turns are still missing, and why.
    assert stored_state(busy) == "error" and busy.state is JobState.BACKOFF
    assert "late turns not yet in MEMORY.md" in (busy.last_error or ""), busy.last_error
    assert "busy: " in (busy.last_error or "")
    # Retried after retry_base_s, the busy lock not counted as a failed attempt.
    assert busy.next_attempt_at == s.clock.now + RETRY_BASE_S
    assert busy.drain_attempts == owed.drain_attempts
    # The daemon restarts (the disk still full for its recovery).
    after = restart(s, compaction)
    assert LATE.encode() not in memory.read_bytes()
    assert after.job("alpha").drain_owed, after.job("alpha")
    assert after.scheduler.submitted == ["finish:alpha"]
    after.scheduler.run_queued()
    assert entry_contents_everywhere(after.ws.paths("alpha"))[LATE_TEXT] == 1
    assert stored_state(after.job("alpha")) == "idle"


def test_an_agent_added_with_a_journal_its_recovery_cannot_finish_owes_the_drain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent folder moved into agents/ (or restored from a backup) while the daemon
    runs, its journal holding a compaction that committed but did not finish, and
    the recovery run as it is added fails (the disk full). That failure was only
    logged: the late turn waited for the agent's next compaction. The job owes the
    drain: `memd status` says why, and the finish job retries after the backoff."""
    s, compaction, memory, left = compaction_fails_after_its_swap(
        tmp_path, monkeypatch, "enospc-drain"
    )
    folder = memory.parent
    away = tmp_path / "away"
    folder.rename(away)  # taken out of the workspace, the drain still owed in its journal
    running = build_services(s.ws, compaction, extra=FAST, summarizer=ScriptedSummarizer())  # type: ignore[arg-type]
    running.registry._recover = lambda paths, key: recover_agent(paths, key_file=key)
    assert running.registry.get("alpha") is None
    left[0] = 1  # the recovery at add time finds the disk still full
    away.rename(folder)  # moved back in while the daemon runs
    running.counter.reconcile_agents()
    running.counter.tick(running.clock.now)
    assert LATE.encode() not in memory.read_bytes()  # recovery failed
    assert_drain_owed_for_a_full_disk(running)

    run_when_due(running)  # the disk has room again

    assert running.scheduler.submitted == ["finish:alpha"]
    assert compaction.calls == 1  # finished from the journal, never compacted again
    assert_drain_finished(running)


def test_a_start_up_recovery_that_fails_owes_the_drain_with_no_stored_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start-up recovery fails and nothing stored says a drain is owed (a new state
    dir, or the compaction was another process's): the drain is owed all the same."""
    s, compaction, memory, left = compaction_fails_after_its_swap(
        tmp_path, monkeypatch, "enospc-drain"
    )
    after = build_services(s.ws, compaction, extra=FAST, summarizer=ScriptedSummarizer())  # type: ignore[arg-type]
    after.registry._recover = lambda paths, key: recover_agent(paths, key_file=key)
    entry = after.registry.get("alpha")
    assert entry is not None
    left[0] = 1
    after.registry.recover(entry)  # fails: the journal is left holding the job
    after.runner.restore([])
    after.runner.evaluate_all([entry])
    job = after.job("alpha")
    assert job.drain_owed and "No space left on device" in (job.last_error or "")
    assert after.scheduler.submitted == []  # after the backoff, not at once
    run_when_due(after)
    assert after.scheduler.submitted == ["finish:alpha"]
    assert entry_contents_everywhere(after.ws.paths("alpha"))[LATE_TEXT] == 1
    assert memory.read_bytes().endswith(LATE.encode())
    assert after.job("alpha").state is JobState.IDLE


def another_process_compacts(
    s: Services, monkeypatch: pytest.MonkeyPatch, drain_failures: int
) -> Path:
    """compact-now (another process: not the runner's job) compacts alpha while a
    late writer appends to the old file just after the swap; the late turn's append
    to the new file fails with ENOSPC ``drain_failures`` times (0: it ends well).
    Returns MEMORY.md."""
    from memd.compaction import CompactionOptions
    from memd.errors import CommittedUnfinished

    memory = s.ws.root / "agents" / "alpha" / "MEMORY.md"
    writer = LateWriter(memory)
    real_write = os.write
    left = [drain_failures]

    def write(fd: int, data: Any) -> int:
        if left[0] > 0 and bytes(data) == LATE.encode():
            left[0] -= 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    def checkpoint(name: str) -> None:
        writer.checkpoint(name)
        if name == "replaced":
            writer.write()

    monkeypatch.setattr(os, "write", write)
    entry = s.registry.get("alpha")
    assert entry is not None
    options = CompactionOptions.from_config(s.runner.config, entry.policy, agent="alpha")
    try:
        compact_agent(s.ws.paths("alpha"), ScriptedSummarizer(), options, checkpoint=checkpoint)
    except CommittedUnfinished:
        assert drain_failures > 0
    else:
        assert drain_failures == 0
    return memory


def services_with_real_compaction(tmp_path: Path) -> Services:
    """A daemon's services over one agent (``alpha``) whose compactions are the real
    transaction with a scripted summarizer (fast drain settings)."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha")
    return build_services(
        ws, RealCompaction(lambda _name: None), extra=FAST, summarizer=ScriptedSummarizer()
    )  # type: ignore[arg-type]


def test_a_compact_now_that_committed_but_did_not_finish_is_finished_by_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compact-now committed, then moving the late turn failed: it said "the next run
    finishes it", and the daemon never learned of it (the late turn stayed in
    .memd/drain.md until alpha's next compaction or a restart). The daemon's count
    of the new MEMORY.md (another inode, no job of its own) reads the journal, finds
    it holding the job, and finishes it at once."""
    s = services_with_real_compaction(tmp_path)
    s.fill("alpha", 6)  # under the threshold: the daemon would not compact it itself
    s.hint("alpha")
    s.settle()
    assert s.job("alpha").state is JobState.IDLE
    memory = another_process_compacts(s, monkeypatch, drain_failures=2)
    assert LATE.encode() not in memory.read_bytes()

    s.hint("alpha")  # the watcher saw the new MEMORY.md
    s.settle()
    assert s.scheduler.submitted == ["finish:alpha"]  # at once
    s.scheduler.run_queued()
    # The disk is still full for this first try: retried after the backoff, and why.
    job = s.job("alpha")
    assert job.drain_owed and job.state is JobState.BACKOFF
    assert "No space left on device" in (job.last_error or "")
    run_when_due(s)
    assert s.scheduler.submitted == ["finish:alpha", "finish:alpha"]
    assert_drain_finished(s, memory)


def test_a_compaction_by_another_process_that_finished_costs_no_job_and_appends_no_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compact-now that ended well: its new MEMORY.md is read as such (an idle
    journal: no finish, no error shown), and only that inode change reads the
    journal: the agent's appends after it cost no read."""
    import memd.daemon.entries as entries

    reads: list[str] = []
    real = entries.journal_unfinished

    def journal_unfinished(paths: Any) -> bool:
        reads.append(paths.agent)
        return real(paths)

    monkeypatch.setattr(entries, "journal_unfinished", journal_unfinished)
    s = services_with_real_compaction(tmp_path)
    s.fill("alpha", 6)
    s.hint("alpha")
    s.settle()
    memory = another_process_compacts(s, monkeypatch, drain_failures=0)
    assert memory.read_bytes().endswith(LATE.encode())  # it moved the late turn itself
    s.hint("alpha")
    s.settle()
    assert reads == ["alpha"]
    for _ in range(3):
        s.fill("alpha", 1)
        s.hint("alpha")
        s.settle()
    assert reads == ["alpha"]
    assert s.scheduler.submitted == []
    job = s.job("alpha")
    assert job.state is JobState.IDLE and job.last_error is None and not job.drain_owed


def test_a_compact_now_still_at_work_when_the_daemon_counts_its_file_reads_as_busy(
    tmp_path: Path,
) -> None:
    """The daemon counts compact-now's new MEMORY.md while compact-now still drains
    (its journal holds the job, its lock is held): the finish tried at once meets the
    lock. That is another process at work, not late turns known to be missing: a
    busy cooldown, never `error` in `memd status` after a compact-now that ends
    well; the next try finds nothing left to do."""
    from memd.compaction import CompactionOptions

    s = services_with_real_compaction(tmp_path)
    s.fill("alpha", 6)
    s.hint("alpha")
    s.settle()
    seen: list[Any] = []

    def checkpoint(name: str) -> None:
        if name == "journal-draining":  # swapped, the lock held, the drain to come
            s.hint("alpha")
            s.settle()
            s.scheduler.run_queued()  # the finish: LockTimeout after the 1 s wait
            seen.append(s.job("alpha"))

    entry = s.registry.get("alpha")
    assert entry is not None
    options = CompactionOptions.from_config(s.runner.config, entry.policy, agent="alpha")
    compact_agent(s.ws.paths("alpha"), ScriptedSummarizer(), options, checkpoint=checkpoint)
    assert s.scheduler.submitted == ["finish:alpha"]
    busy = seen[0]
    assert stored_state(busy) == "cooldown", busy
    assert (busy.last_error or "").startswith("busy: ")
    run_when_due(s)
    job = s.job("alpha")
    assert job.state is JobState.IDLE and not job.drain_owed and job.last_error is None
    assert s.scheduler.submitted == ["finish:alpha", "finish:alpha"]
