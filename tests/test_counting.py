from __future__ import annotations

import gc
import itertools
import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.tokens import CL100K

from memd.core.tokens import CountState
from memd.counting import (
    CountJob,
    CountKind,
    NotARegularFile,
    TrackedCount,
    count_file,
    count_many,
    fitting_marks,
    pool_workers,
    worker_count,
)

COUNTER = CL100K


def entry(role: str, text: str) -> bytes:
    return f"### {role} — 2026-01-01T10:00:00\n\n{text}\n\n---\n\n".encode()


def full(path: Path) -> int:
    return COUNTER.count_bytes(path.read_bytes())


def test_append_tokenizes_only_the_new_bytes(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_bytes(entry("Human", "hello " * 5000))
    seen: list[int] = []

    def spy(data: bytes) -> int:
        seen.append(len(data))
        return COUNTER.count_bytes(data)

    tracked, kind = count_file(path, None, spy)
    assert kind is CountKind.RECOUNTED and tracked.tokens == full(path)
    with path.open("ab") as f:
        f.write(entry("AI", "short answer"))
    # the first append settles the old unsafe tail (the last entry); after
    # that only the last entry and the new bytes are read
    tracked, kind = count_file(path, tracked, spy)
    seen.clear()
    with path.open("ab") as f:
        f.write(entry("AI", "another"))
    tracked, kind = count_file(path, tracked, spy)
    assert kind is CountKind.APPENDED and tracked.tokens == full(path)
    assert sum(seen) < 200  # the 30 KB prefix was not tokenized again
    again, kind = count_file(path, tracked, spy)
    assert kind is CountKind.UNCHANGED and again.tokens == tracked.tokens


def test_replace_truncate_and_rewrite_force_a_full_recount(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_bytes(entry("Human", "a b c " * 300) + entry("AI", "x"))
    tracked, _ = count_file(path, None, COUNTER.count_bytes)
    # rewrite in place, same size, inside the verified window
    data = bytearray(path.read_bytes())
    data[-60:-50] = b"ZZZZZZZZZZ"
    with path.open("r+b") as f:
        f.write(bytes(data))
    tracked, kind = count_file(path, tracked, COUNTER.count_bytes)
    assert kind is CountKind.RECOUNTED and tracked.tokens == full(path)
    # truncation
    with path.open("r+b") as f:
        f.truncate(100)
    tracked, kind = count_file(path, tracked, COUNTER.count_bytes)
    assert kind is CountKind.RECOUNTED and tracked.tokens == full(path)
    # replaced by rename: new inode
    tmp = tmp_path / "new"
    tmp.write_bytes(entry("System", "summary") + b"more")
    os.replace(tmp, path)
    tracked, kind = count_file(path, tracked, COUNTER.count_bytes)
    assert kind is CountKind.RECOUNTED and tracked.tokens == full(path)


def test_restored_count_is_extended_without_reading_the_prefix(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_bytes(entry("Human", "hi " * 1000))
    first, _ = count_file(path, None, COUNTER.count_bytes)
    # As the daemon restores it from the state DB: the stored numbers and window digest.
    stored = CountState(**{f: getattr(first.state, f) for f in first.state.__slots__})
    saved = TrackedCount(stored, first.mtime_ns, first.window_start, first.window_digest)
    with path.open("ab") as f:
        f.write(entry("AI", "ok"))
    tracked, kind = count_file(path, saved, COUNTER.count_bytes)
    assert kind is CountKind.APPENDED and tracked.tokens == full(path)
    assert tracked.window_digest is not None


def test_non_regular_files_and_missing_files_raise(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(NotARegularFile):
        count_file(tmp_path / "dir", None, COUNTER.count_bytes)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(NotARegularFile):
        count_file(tmp_path / "fifo", None, COUNTER.count_bytes)
    with pytest.raises(FileNotFoundError):
        count_file(tmp_path / "missing", None, COUNTER.count_bytes)


_TEXT = st.text(
    alphabet=st.sampled_from(list("abc XYZ\n\r#-—é😀123.,:!")), min_size=0, max_size=120
)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("entry"), st.sampled_from(["Human", "AI", "System"]), _TEXT),
        st.tuples(st.just("raw"), st.binary(max_size=60), st.just("")),
        st.tuples(st.just("text"), _TEXT, st.just("")),
        st.tuples(st.just("truncate"), st.integers(0, 400), st.just("")),
        st.tuples(st.just("replace"), _TEXT, st.just("")),
        st.tuples(st.just("poke"), st.integers(1, 200), st.just("")),
        # An entry written in two appends, cut anywhere (inside a UTF-8 character too).
        st.tuples(st.just("split"), _TEXT, st.integers(0, 200)),
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("one_read", [True, False])
@pytest.mark.parametrize("junction_cut", [False, True])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS)
def test_incremental_count_always_equals_a_full_recount(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ops: list[tuple],
    junction_cut: bool,
    one_read: bool,
) -> None:
    # one_read False: every append is read block by block, as a large one is.
    monkeypatch.setattr("memd.counting.ONE_READ_BYTES", 1 << 20 if one_read else 0)
    # A mark at every count that settled something (checked after each count).
    monkeypatch.setattr("memd.counting.MARK_MIN_TOKENS", 1)
    monkeypatch.setattr("memd.counting.MARK_SHIFT", 62)
    path = tmp_path / "MEMORY.md"
    path.write_bytes(b"")
    tracked: TrackedCount | None = None
    for op, a, b in ops:
        if op == "entry":
            with path.open("ab") as f:
                f.write(entry(a, b))
        elif op == "raw":
            with path.open("ab") as f:
                f.write(a)
        elif op == "text":
            with path.open("ab") as f:
                f.write(a.encode())
        elif op == "truncate":
            with path.open("r+b") as f:
                f.truncate(min(a, os.path.getsize(path)))
        elif op == "replace":
            tmp = tmp_path / "tmp"
            tmp.write_bytes(entry("System", a))
            os.replace(tmp, path)
        elif op == "split":
            block = entry("AI", a)
            cut = min(b, len(block))
            with path.open("ab") as f:
                f.write(block[:cut])
            tracked, _ = count_file(path, tracked, COUNTER.count_bytes, junction_cut=junction_cut)
            assert tracked.tokens == full(path)
            with path.open("ab") as f:
                f.write(block[cut:])
        elif op == "poke":
            # in-place rewrite of a byte near the end (what the window guards)
            size = os.path.getsize(path)
            if size:
                with path.open("r+b") as f:
                    f.seek(max(0, size - a))
                    f.write(b"#")
        tracked, _ = count_file(path, tracked, COUNTER.count_bytes, junction_cut=junction_cut)
        assert tracked.tokens == full(path)
        assert tracked.size == os.path.getsize(path)
        assert_marks_exact(path.read_bytes(), tracked)


def assert_marks_exact(data: bytes, tracked: TrackedCount) -> None:
    """Every mark is the exact count of the bytes before it, at a cut where the
    counts of both sides add up to the whole (what a compaction relies on)."""
    marks = tracked.marks
    pairs = list(zip(marks[::2], marks[1::2], strict=True))
    assert pairs == sorted(pairs)
    for offset, tokens in pairs:
        assert 0 < offset <= tracked.state.safe_offset
        assert tokens == COUNTER.count_bytes(data[:offset])
        assert tokens + COUNTER.count_bytes(data[offset:]) == COUNTER.count_bytes(data)


def test_a_long_single_line_is_read_and_counted_in_bounded_pieces(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    words = " ".join(f"word{n % 7}x" if n % 5 else "plain" for n in range(40_000))
    path.write_bytes(entry("Human", words)[:-8])  # one long line, no newline after it
    longest: list[int] = [0]

    def spy(data: bytes) -> int:
        longest[0] = max(longest[0], len(data))
        return COUNTER.count_bytes(data)

    tracked, _ = count_file(path, None, spy, max_piece_bytes=8192)
    assert tracked.tokens == full(path) and not tracked.state.estimated
    assert longest[0] <= 8192


def test_a_giant_run_is_estimated_and_stays_marked_until_a_recount(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_bytes(entry("Human", "start " + "q" * 200_000 + " end"))
    tracked, _ = count_file(path, None, COUNTER.count_bytes, max_piece_bytes=16_384)
    assert tracked.state.estimated and tracked.tokens >= full(path)
    with path.open("ab") as f:
        f.write(entry("AI", "a short reply"))
    tracked, kind = count_file(path, tracked, COUNTER.count_bytes, max_piece_bytes=16_384)
    assert kind is CountKind.APPENDED and tracked.state.estimated
    assert tracked.tokens >= full(path)
    path.write_bytes(entry("System", "summary"))  # rewritten: exact again
    tracked, kind = count_file(path, tracked, COUNTER.count_bytes, max_piece_bytes=16_384)
    assert kind is CountKind.RECOUNTED and not tracked.state.estimated
    assert tracked.tokens == full(path)


def _files(tmp_path: Path, count: int) -> list[CountJob]:
    jobs = []
    for n in range(count):
        path = tmp_path / f"m{n}.md"
        path.write_bytes(entry("Human", f"file {n} " + "text " * (n * 50)))
        jobs.append(CountJob(str(path)))
    jobs.append(CountJob(str(tmp_path / "missing.md")))
    return jobs


@pytest.mark.parametrize("workers", [1, 2])
def test_count_many_counts_every_file_in_or_out_of_process(tmp_path: Path, workers: int) -> None:
    jobs = _files(tmp_path, 12)
    (tmp_path / "dir.md").mkdir()
    jobs.append(CountJob(str(tmp_path / "dir.md")))
    results = dict(count_many(jobs, COUNTER.count_bytes, workers=workers))
    assert sorted(results) == list(range(len(jobs)))
    for index, job in enumerate(jobs[:12]):
        tracked, _kind, failure = results[index]
        assert failure is None and tracked is not None
        assert tracked.tokens == full(Path(job.path))
    assert results[12] == (None, CountKind.RECOUNTED, None)  # missing: no file yet
    assert results[13][0] is None and "not a regular file" in str(results[13][2])


def test_a_dead_counting_worker_is_a_failure_not_a_traceback(tmp_path: Path) -> None:
    jobs = _files(tmp_path, 6)
    poison = Path(jobs[3].path)
    poison.write_bytes(b"DIE " * 10)

    def dies_on_poison(data: bytes) -> int:
        if b"DIE" in data:
            os._exit(9)  # as the OOM killer would end it
        return COUNTER.count_bytes(data)

    results = dict(count_many(jobs, dies_on_poison, workers=2))
    assert sorted(results) == list(range(len(jobs)))
    assert "worker died" in str(results[3][2])


def test_workers_collect_cycles_when_the_parent_has_paused_its_collector(tmp_path: Path) -> None:
    """The daemon's start-up pass runs with the GC off; its forked workers turn it on."""
    jobs = _files(tmp_path, 4)

    def collector_state(data: bytes) -> int:
        return 1 if gc.isenabled() else 0

    gc.disable()
    try:
        results = dict(count_many(jobs, collector_state, workers=2))
    finally:
        gc.enable()
    counted = [result[0] for result in results.values() if result[0] is not None]
    assert len(counted) == 4 and all(tracked.tokens > 0 for tracked in counted)  # 0: GC off


def test_stop_ends_the_pool_without_waiting_for_a_slow_file(tmp_path: Path) -> None:
    jobs = _files(tmp_path, 4)
    slow = Path(jobs[0].path)
    slow.write_bytes(b"SLOW " * 10)

    class Sigterm:  # the daemon's exit flags: read, never called
        should_exit = False

    sigterm = Sigterm()

    def hangs_on_slow(data: bytes) -> int:
        if b"SLOW" in data:
            while True:  # a count that would never finish
                pass
        return COUNTER.count_bytes(data)

    seen = []
    for index, _result in count_many(jobs, hangs_on_slow, workers=2, stop=sigterm):
        seen.append(index)
        if len(seen) == len(jobs) - 1:
            sigterm.should_exit = True  # SIGTERM arrives while the slow file is counted
    assert 0 not in seen and len(seen) == len(jobs) - 1


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(
        st.sampled_from(
            [entry("Human", "hello there"), entry("AI", "a b\nc d"), b"half an entr", b"\n"]
        ),
        min_size=1,
        max_size=12,
    ),
    split=st.integers(min_value=0, max_value=12),
)
def test_count_data_extends_an_earlier_count_exactly(parts: list[bytes], split: int) -> None:
    from memd.counting import count_data

    data = b"".join(parts)
    earlier = b"".join(parts[:split])
    previous, _kind = count_data(earlier, 1, 2, 0, None, COUNTER.count_bytes)
    counted, kind = count_data(data, 1, 2, 0, previous, COUNTER.count_bytes)
    assert counted.tokens == COUNTER.count_bytes(data)
    assert kind is not CountKind.RECOUNTED
    # The window is checked: a rewritten earlier part is counted from scratch.
    rewritten = earlier.swapcase() + data[len(earlier) :]
    counted, kind = count_data(rewritten, 1, 2, 0, previous, COUNTER.count_bytes)
    assert counted.tokens == COUNTER.count_bytes(rewritten)
    window = earlier[previous.window_start : previous.state.safe_offset]
    if window.swapcase() != window:
        assert kind is CountKind.RECOUNTED
    # Another inode: from scratch.
    counted, kind = count_data(data, 1, 3, 0, previous, COUNTER.count_bytes)
    assert kind is CountKind.RECOUNTED and counted.tokens == COUNTER.count_bytes(data)


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(_TEXT, min_size=1, max_size=12),
    burst=st.lists(st.integers(1, 3), min_size=1, max_size=12),
)
def test_entries_appended_whole_are_tokenized_once(texts: list[str], burst: list[int]) -> None:
    # Each byte once: the old tail settles with the tokens it already has when
    # the next entry starts (a junction cut), however the appends are grouped.
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "MEMORY.md"
        path.write_bytes(b"")
        tokenized = [0]

        def spy(data: bytes) -> int:
            tokenized[0] += len(data)
            return COUNTER.count_bytes(data)

        tracked: TrackedCount | None = None
        blocks = [entry("Human" if n % 2 else "AI", text) for n, text in enumerate(texts)]
        written = 0
        for size in itertools.cycle(burst):
            if written >= len(blocks):
                break
            with path.open("ab") as f:
                f.write(b"".join(blocks[written : written + size]))
            written += size
            tracked, _ = count_file(path, tracked, spy, junction_cut=True)
            assert tracked.tokens == full(path)
        assert tokenized[0] == path.stat().st_size
        again, kind = count_file(path, tracked, spy, junction_cut=True)
        assert kind is CountKind.UNCHANGED and again.tokens == tracked.tokens
        assert tokenized[0] == path.stat().st_size  # an unchanged file costs no tokens


def test_a_tail_rewritten_in_place_is_counted_from_scratch(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_bytes(entry("Human", "hello there") + entry("AI", "last words"))
    tracked, _ = count_file(path, None, COUNTER.count_bytes, junction_cut=True)
    data = path.read_bytes()
    # The unsettled tail's last newline becomes a space, then an entry is
    # appended: the old end is no longer a junction cut.
    with path.open("r+b") as f:
        f.write(data[:-1] + b" " + entry("Human", "more"))
    tracked, kind = count_file(path, tracked, COUNTER.count_bytes, junction_cut=True)
    assert kind is CountKind.RECOUNTED
    assert tracked.tokens == full(path)


def test_a_complete_entry_after_a_junction_stays_the_tail_whole(tmp_path: Path) -> None:
    # A tool's JSON output has no safe cut for kilobytes: the entry appended at
    # a junction is kept whole as the tail (one tokenizer call, no search for a
    # cut), and the next entry settles it with the tokens it has.
    path = tmp_path / "MEMORY.md"
    path.write_bytes(entry("Human", "run the query please"))
    calls: list[int] = []

    def spy(data: bytes) -> int:
        calls.append(len(data))
        return COUNTER.count_bytes(data)

    tracked, _ = count_file(path, None, spy, junction_cut=True)
    dump = "Tool Output:\n" + "\n".join(
        f'{{"id": {n}, "status": "done", "bytes": {n * 977}}}' for n in range(200)
    )
    for block in (entry("Tool", dump), entry("AI", "done: 200 rows")):
        before = path.stat().st_size
        with path.open("ab") as f:
            f.write(block)
        calls.clear()
        tracked, kind = count_file(path, tracked, spy, junction_cut=True)
        assert kind is CountKind.APPENDED and tracked.tokens == full(path)
        assert tracked.state.safe_offset == before  # the whole entry is the tail
        assert calls == [len(block)]  # tokenized once, in one call
    # Bytes that do not start an entry: the kept tail is tokenized once more,
    # then cut as usual (a small tail again).
    with path.open("ab") as f:
        f.write(b"a line that is no entry\n")
    calls.clear()
    tracked, _ = count_file(path, tracked, spy, junction_cut=True)
    assert tracked.tokens == full(path)
    assert sum(calls) <= len(entry("AI", "done: 200 rows")) + 24
    assert path.stat().st_size - tracked.state.safe_offset < 24


def test_one_worker_count_for_the_daemon_and_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert [worker_count(n) for n in (0, 1, 3, 4, 100)] == [1, 1, 3, 4, 4]
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert worker_count(100) == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    small = [tmp_path / f"{n}.md" for n in range(3)]
    for path in small:
        path.write_bytes(b"x" * 10)
    assert pool_workers([str(path) for path in small]) == 1  # too little to count: no fork
    big = tmp_path / "big.md"
    with big.open("wb") as out:
        out.truncate(8 << 20)
    # Megabytes to count: a pool, unless another thread runs (fork is unsafe then).
    expected = 3 if threading.active_count() == 1 else 1
    assert pool_workers([str(big), *map(str, small[:2])]) == expected


def test_marks_stay_few_and_cover_the_newest_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An entry at a time, as the daemon counts a growing file: a mark at most
    # every 1/128 of the count, the ones older than its newest half dropped.
    monkeypatch.setattr("memd.counting.MARK_MIN_TOKENS", 64)
    path = tmp_path / "MEMORY.md"
    path.write_bytes(b"")
    tracked: TrackedCount | None = None
    most = 0
    with path.open("ab") as out:
        for n in range(1500):
            out.write(entry("Human" if n % 2 else "AI", f"turn {n}: " + "some words here " * 12))
            out.flush()
            tracked, _ = count_file(path, tracked, COUNTER.count_bytes, junction_cut=True)
            most = max(most, len(tracked.marks) // 2)
    assert tracked is not None
    tokens = tracked.tokens
    offsets, counts = tracked.marks[::2], tracked.marks[1::2]
    assert 2 <= most <= (1 << 7) + 2
    assert counts[0] >= tokens // 2 - (tokens >> 7) - 400  # the newest half, one gap more
    assert counts[0] <= tokens // 2 + (tokens >> 7) + 400
    gaps = [b - a for a, b in itertools.pairwise(counts)]
    assert max(gaps) <= (tokens >> 7) + 400  # a mark about every 1/128 (an entry is ~150)
    data = path.read_bytes()
    for offset, count in zip(offsets, counts, strict=True):
        assert count == COUNTER.count_bytes(data[:offset])
    # Replaced (a new inode): the marks start over with the new file's count.
    replaced = tmp_path / "new"
    replaced.write_bytes(entry("System", "short"))
    os.replace(replaced, path)
    fresh, kind = count_file(path, tracked, COUNTER.count_bytes, junction_cut=True)
    assert kind is CountKind.RECOUNTED and fresh.marks == ()


def test_an_estimated_count_marks_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memd.counting.MARK_MIN_TOKENS", 1)
    path = tmp_path / "MEMORY.md"
    path.write_bytes(b"x" * 5000 + entry("Human", "after the run " * 50))
    tracked, _ = count_file(path, None, COUNTER.count_bytes, max_piece_bytes=1024)
    assert tracked.state.estimated and tracked.marks == ()
    with path.open("ab") as out:
        out.write(entry("AI", "more words " * 50))
    tracked, _ = count_file(path, tracked, COUNTER.count_bytes, max_piece_bytes=1024)
    assert tracked.state.estimated and tracked.marks == ()


def test_marks_of_an_exact_count_are_dropped_once_it_turns_estimated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # total - mark is the count after the mark only while the total is exact: a
    # run longer than a piece makes it a bound, and the earlier marks must go.
    monkeypatch.setattr("memd.counting.MARK_MIN_TOKENS", 1)
    monkeypatch.setattr("memd.counting.MARK_SHIFT", 62)
    path = tmp_path / "MEMORY.md"
    text = entry("Human", "some words here") * 20
    path.write_bytes(text)
    tracked, _ = count_file(path, None, COUNTER.count_bytes, max_piece_bytes=1024)
    with path.open("ab") as out:
        out.write(text)
    tracked, _ = count_file(path, tracked, COUNTER.count_bytes, max_piece_bytes=1024)
    assert tracked.marks and not tracked.state.estimated
    with path.open("ab") as out:
        out.write(b"x" * 5000)
    tracked, _ = count_file(path, tracked, COUNTER.count_bytes, max_piece_bytes=1024)
    assert tracked.state.estimated and tracked.marks == ()


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("entries"), st.lists(_TEXT, min_size=1, max_size=3)),
            st.tuples(st.just("raw"), st.sampled_from([b"x", b"\n", b"#", b"\xc3", b"\xa9 ok\n"])),
            st.tuples(st.just("poke"), st.integers(1, 4096)),  # within the window
            st.tuples(st.just("truncate"), st.integers(0, 3000)),
        ),
        min_size=1,
        max_size=14,
    )
)
def test_the_append_fast_path_tracks_what_the_piece_counter_would(ops: list[tuple]) -> None:
    # Whole entries appended at a junction cut skip the PieceCounter: the result
    # (count, safe offset, window and its digest, tail digest, marks) is the counter's
    # exactly, so everything later (the window check, the state DB) is unchanged.
    import tempfile

    import memd.counting as counting

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as small_marks:
        small_marks.setattr(counting, "MARK_MIN_TOKENS", 16)  # marks every few entries
        path = Path(tmp) / "MEMORY.md"
        path.write_bytes(entry("Human", "start " * 800))  # a window of a full 4 KB
        fast = slow = None
        for op, arg in ops:
            if op == "entries":
                with path.open("ab") as f:
                    f.write(b"".join(entry("AI", text) for text in arg))
            elif op == "raw":
                with path.open("ab") as f:
                    f.write(arg)
            elif op == "poke":
                size = path.stat().st_size
                with path.open("r+b") as f:
                    f.seek(max(0, size - arg))
                    f.write(b"Q")
            else:
                with path.open("r+b") as f:
                    f.truncate(max(0, path.stat().st_size - arg))
            fast, _ = count_file(path, fast, COUNTER.count_bytes, junction_cut=True)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(counting, "KEEP_TAIL_MAX_BYTES", -1)  # no fast path
                slow, _ = count_file(path, slow, COUNTER.count_bytes, junction_cut=True)
            assert fast.tokens == full(path)
            assert (fast, fast.tail_digest, fast.marks) == (slow, slow.tail_digest, slow.marks)


def test_an_entry_appended_at_a_junction_is_read_once_and_counted_without_a_piece_counter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_bytes(entry("Human", "hello there " * 600))
    tracked, _ = count_file(path, None, COUNTER.count_bytes, junction_cut=True)
    with path.open("ab") as f:
        f.write(entry("AI", "first"))
    tracked, _ = count_file(path, tracked, COUNTER.count_bytes, junction_cut=True)
    reads: list[int] = []
    real_pread = os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        reads.append(length)
        return real_pread(fd, length, offset)

    def no_counter(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the piece counter was used")

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr("memd.counting.PieceCounter", no_counter)
    block = entry("Human", "second — with a dash")
    with path.open("ab") as f:
        f.write(block)
    counted, kind = count_file(path, tracked, COUNTER.count_bytes, junction_cut=True)
    assert kind is CountKind.APPENDED and counted.tokens == full(path)
    # One read: the 4 KB window, the old tail and the new entry.
    assert reads == [
        tracked.state.safe_offset - tracked.window_start + len(entry("AI", "first")) + len(block)
    ]
    assert (
        counted.state.safe_offset == tracked.size
        and counted.state.tail_tokens == COUNTER.count_bytes(block)
    )


def test_only_marks_that_fit_their_count_are_kept() -> None:
    # Marks restored from a state DB row (review 13b, R4): whole pairs, offsets and
    # tokens strictly increasing, within the count's safe offset and tokens; the
    # rest dropped, never an error.
    state = CountState(dev=1, ino=2, size=5000, safe_offset=4000, safe_tokens=900, tail_tokens=50)
    good = (100, 20, 2000, 400, 4000, 900)
    assert fitting_marks(good, state) == good
    assert fitting_marks((*good, 7), state) == ()  # not whole pairs
    assert fitting_marks((100, 20, 90, 30, 2000, 400), state) == (100, 20, 2000, 400)
    assert fitting_marks((100, 20, 2000, 10, 3000, 500), state) == (100, 20, 3000, 500)
    assert fitting_marks((100, 20, 4001, 500), state) == (100, 20)  # past the safe offset
    assert fitting_marks((100, 20, 2000, 901), state) == (100, 20)  # more than its tokens
    assert fitting_marks((0, 0, -5, 3, 100, 20), state) == (100, 20)
    estimated = CountState(1, 2, 5000, 4000, 900, 50, estimated=True)
    assert fitting_marks(good, estimated) == ()
