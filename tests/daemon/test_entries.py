"""EntryCounter: one count of an agent's MEMORY.md, what it returns to its caller
and what it publishes (nothing is called back)."""

from __future__ import annotations

import dataclasses
import os
import queue
from pathlib import Path

from support.daemon_services import COUNTER
from support.memfiles import AgentWorkspace, append_entry

from memd.core.config import resolve_policy
from memd.core.jobs import AgentJob, on_started
from memd.counting import count_file
from memd.daemon.entries import AgentEntry, Counted, CountUpdate, EntryCounter
from memd.settings import build_config


def make_entry(ws: AgentWorkspace, name: str) -> AgentEntry:
    config, _ = build_config({}, {})
    return AgentEntry(name, ws.paths(name), resolve_policy(config, name))


def test_each_count_returns_what_it_found_and_publishes_the_figure(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice", entries=2)
    updates: queue.SimpleQueue[CountUpdate] = queue.SimpleQueue()
    counter = EntryCounter(COUNTER, updates=updates)
    entry = make_entry(ws, "alice")

    assert counter.count_locked(entry) is Counted.COUNTED
    first = updates.get_nowait()
    size = paths.memory.stat().st_size
    assert first[:3] == ("alice", COUNTER.count_bytes(paths.memory.read_bytes()), size)
    append_entry(paths.memory, "AI", "one more turn")
    assert counter.count_locked(entry) is Counted.COUNTED
    second = updates.get_nowait()
    assert second.size == paths.memory.stat().st_size > size
    assert second.tokens == entry.tokens > first.tokens and second.at >= first.at

    # Gone: counted as empty, and said so to the caller (the runner judges an erasure).
    paths.memory.unlink()
    assert counter.count_locked(entry) is Counted.MISSING
    assert entry.tracked is None and entry.count_error is None
    gone = updates.get_nowait()
    assert gone[:3] == ("alice", 0, None)
    assert updates.empty()


def test_a_count_that_fails_is_returned_and_not_published(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice", entries=1)
    paths.memory.unlink()
    paths.memory.mkdir()  # not a file: cannot be counted
    updates: queue.SimpleQueue[CountUpdate] = queue.SimpleQueue()
    entry = make_entry(ws, "alice")
    assert EntryCounter(COUNTER, updates=updates).count_locked(entry) is Counted.FAILED
    assert entry.count_error is not None and entry.tracked is None
    assert updates.empty()


def test_without_a_queue_nothing_is_published(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=1)
    counter = EntryCounter(COUNTER)
    assert counter.updates is None
    assert counter.count_locked(make_entry(ws, "alice")) is Counted.COUNTED


class SpyTokenizer:
    """COUNTER, minding how many bytes it was given to tokenize."""

    def __init__(self) -> None:
        self.tokenized = 0

    def count_bytes(self, data: bytes) -> int:
        self.tokenized += len(data)
        return COUNTER.count_bytes(data)

    def count_text(self, text: str) -> int:
        return self.count_bytes(text.encode("utf-8", "surrogateescape"))


def test_a_running_jobs_new_file_is_counted_on_from_the_jobs_count_once_it_ends(
    tmp_path: Path,
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice", entries=30, size=200)
    spy = SpyTokenizer()
    counter = EntryCounter(spy)
    entry = make_entry(ws, "alice")
    assert counter.count_locked(entry) is Counted.COUNTED
    old = entry.tracked
    entry.job = on_started(entry.job)
    # The job installs its new file (another inode) and knows its count.
    staged = tmp_path / "new"
    staged.write_bytes(paths.memory.read_bytes()[: paths.memory.stat().st_size // 2])
    os.replace(staged, paths.memory)
    seed, _kind = count_file(paths.memory, None, COUNTER.count_bytes)
    spy.tokenized = 0
    entry.dirty = False

    # Counted while the job runs (an event of the replace): left to the runner.
    assert counter.count_locked(entry) is Counted.COUNTED
    assert entry.tracked is old and spy.tokenized == 0 and not entry.dirty

    # The runner, once the job has ended: on from the job's count, not from scratch.
    append_entry(paths.memory, "AI", "a turn written during the drain")
    assert (
        counter.count_locked(entry, after_job=True, seed=seed, seed_tokenizer=spy)
        is Counted.COUNTED
    )
    assert entry.tracked is not None and entry.dirty
    assert entry.tracked.tokens == COUNTER.count_bytes(paths.memory.read_bytes())
    assert entry.tracked.state.ino == paths.memory.stat().st_ino
    assert spy.tokenized < 1000  # the appended turn and the old tail, not the file

    # A job's seed of a file already counted (the entry's own count is newer): unused.
    newer = entry.tracked
    assert (
        counter.count_locked(entry, after_job=True, seed=seed, seed_tokenizer=spy)
        is Counted.COUNTED
    )
    assert entry.tracked.tokens == newer.tokens


def test_after_a_job_without_a_count_of_its_file_the_new_file_is_counted(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice", entries=4)
    counter = EntryCounter(COUNTER)
    entry = make_entry(ws, "alice")
    counter.count_locked(entry)
    entry.job = on_started(entry.job)
    staged = tmp_path / "new"
    staged.write_bytes(paths.memory.read_bytes()[:200])
    os.replace(staged, paths.memory)
    assert counter.count_locked(entry, after_job=True) is Counted.COUNTED  # a failed job's
    assert entry.tokens == COUNTER.count_bytes(paths.memory.read_bytes())


def test_the_junction_cut_follows_the_tokenizer() -> None:
    # Decided when the tokenizer is set (a reload may bring another encoding), not
    # looked up on every count.
    class Other:
        encoding_name = "p50k_base"  # its "\n\n" at the end is one pre-token: no junction cut

        def count_bytes(self, data: bytes) -> int:
            return len(data)

        def count_text(self, text: str) -> int:
            return len(text)

    counter = EntryCounter(COUNTER)
    assert counter.junction_cut
    counter.tokenizer = Other()
    assert not counter.junction_cut
    counter.tokenizer = COUNTER
    assert counter.junction_cut


def test_a_jobs_count_made_with_another_tokenizer_does_not_seed_the_new_files_count(
    tmp_path: Path,
) -> None:
    # A reload swapped the tokenizer while the job ran (review 13b, R1): its count
    # of the new file is another encoding's; the new file is counted from scratch.
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice", entries=30, size=200)
    counter = EntryCounter(COUNTER)
    entry = make_entry(ws, "alice")
    counter.count_locked(entry)
    entry.job = on_started(entry.job)
    staged = tmp_path / "new"
    staged.write_bytes(paths.memory.read_bytes()[: paths.memory.stat().st_size // 2])
    os.replace(staged, paths.memory)
    seed, _kind = count_file(paths.memory, None, COUNTER.count_bytes)
    wrong = dataclasses.replace(seed, state=dataclasses.replace(seed.state, safe_tokens=7))
    old_tokenizer = SpyTokenizer()
    counter.tokenizer = SpyTokenizer()  # the reload's
    assert (
        counter.count_locked(entry, after_job=True, seed=wrong, seed_tokenizer=old_tokenizer)
        is Counted.COUNTED
    )
    assert entry.tracked is not None
    assert entry.tracked.tokens == COUNTER.count_bytes(paths.memory.read_bytes())


def test_a_count_skipped_while_the_job_ran_is_made_once_the_runner_asks(tmp_path: Path) -> None:
    # The counting thread leaves a file of another inode to the runner while the
    # job runs; one replaced after the runner's own count is counted by
    # count_skipped once the job has ended (review 13b, R5), and only then.
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice", entries=4)
    counter = EntryCounter(COUNTER)
    entry = make_entry(ws, "alice")
    counter.count_locked(entry)
    assert counter.count_skipped(entry) is None  # nothing skipped
    entry.job = on_started(entry.job)
    staged = tmp_path / "new"
    staged.write_bytes(paths.memory.read_bytes()[:200])
    os.replace(staged, paths.memory)
    old = entry.tracked
    assert counter.count_locked(entry) is Counted.COUNTED
    assert entry.tracked is old and entry.count_skipped
    entry.job = AgentJob()  # the job has ended
    assert counter.count_skipped(entry) is Counted.COUNTED
    assert entry.tokens == COUNTER.count_bytes(paths.memory.read_bytes())
    assert not entry.count_skipped and counter.count_skipped(entry) is None
