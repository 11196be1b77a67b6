"""Property tests of the count's marks and the junction-cut fast path (review 14a):
every incremental count, every mark, the snapshot's count and a compaction's
figures built from marks equal tokenizing the whole file from scratch, and a
compaction from marks keeps the same turns as one that counts every entry."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.memfiles import AgentWorkspace
from support.tokens import CL100K

import memd.compaction as compaction
from memd.compaction import CompactionOptions, compact_agent
from memd.core.memfile import parse
from memd.core.plan import kept_tail
from memd.core.summary import SummaryRequest, SummaryResult
from memd.counting import TrackedCount, count_data, count_file
from memd.errors import CompactionAborted, NothingToCompact, SummarizerError
from memd.tokenizer import TokenCounter

O200K = TokenCounter("o200k_base")
ENCODINGS = {"cl100k_base": CL100K, "o200k_base": O200K}
FAST = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, drain_max_s=2)


def block(role: str, text: str, nl: str = "\n") -> bytes:
    return f"### {role} — 2026-01-01T10:00:00{nl}{nl}{text}{nl}{nl}---{nl}{nl}".encode()


_TEXT = st.text(
    alphabet=st.sampled_from(list("ab Z\n\r\t#-—é😀1.,:! /'\u0301\u00a0\u2028")), max_size=80
)
# Fragments that sit at or near a junction: a newline, "#", whitespace before a
# newline, half a 4-byte UTF-8 character (the other half in a later append).
_FRAGMENT = st.lists(
    st.sampled_from(
        [
            *(b"\n", b"#", b"# x", b"\n\n---\n\n", b" ", b"\r", b"\xf0\x9f", b"\x98\x80"),
            *(b"a", b"\t\n", b"/", b"'", b"\r\n"),
        ]
    ),
    max_size=8,
).map(b"".join)
_APPENDS = st.lists(
    st.one_of(
        st.tuples(st.just("entry"), _TEXT, st.sampled_from(["\n", "\r\n"])),
        st.tuples(st.just("raw"), st.binary(max_size=30), st.just("")),
        st.tuples(st.just("raw"), _FRAGMENT, st.just("")),
        # An entry written in two appends, cut anywhere (inside a UTF-8 character too).
        st.tuples(st.just("split"), _TEXT, st.integers(0, 120)),
        # A long entry: past KEEP_TAIL_MAX_BYTES, or one long line.
        st.tuples(st.just("long"), st.integers(1, 5), st.sampled_from(["a", "ab ", "é", "😀\n"])),
    ),
    min_size=1,
    max_size=16,
)


def _assert_exact(data: bytes, tracked: TrackedCount, counter: TokenCounter, piece: int) -> None:
    scratch = count_data(data, 0, 0, 0, None, counter.count_bytes, max_piece_bytes=piece)[0]
    if not tracked.state.estimated and not scratch.state.estimated:
        assert tracked.tokens == counter.count_bytes(data)
    for offset, tokens in zip(tracked.marks[::2], tracked.marks[1::2], strict=True):
        assert 0 < offset <= tracked.state.safe_offset
        assert tokens == counter.count_bytes(data[:offset])


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    appends=_APPENDS,
    encoding=st.sampled_from(sorted(ENCODINGS)),
    piece=st.sampled_from([1 << 20, 300]),
)
def test_the_junction_fast_path_counts_as_tokenizing_the_whole_file(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    appends: list[tuple[str, object, object]],
    encoding: str,
    piece: int,
) -> None:
    # A mark at every count that settles something.
    monkeypatch.setattr("memd.counting.MARK_MIN_TOKENS", 1)
    monkeypatch.setattr("memd.counting.MARK_SHIFT", 62)
    counter = ENCODINGS[encoding]
    path = tmp_path_factory.mktemp("junction") / "MEMORY.md"
    path.write_bytes(b"")
    tracked: TrackedCount | None = None

    def count() -> None:
        nonlocal tracked
        tracked, _ = count_file(
            path, tracked, counter.count_bytes, junction_cut=True, max_piece_bytes=piece
        )
        data = path.read_bytes()
        assert tracked.size == len(data)
        _assert_exact(data, tracked, counter, piece)
        # The compaction's snapshot, counted on from the daemon's count.
        grown = data + "### AI — x\n\nmore".encode()
        snap, _ = count_data(
            grown,
            tracked.state.dev,
            tracked.state.ino,
            0,
            tracked,
            counter.count_bytes,
            max_piece_bytes=piece,
        )
        _assert_exact(grown, snap, counter, piece)

    for op, a, b in appends:
        with path.open("ab") as handle:
            if op == "entry":
                handle.write(block("AI", str(a), str(b)))
            elif op == "raw":
                assert isinstance(a, bytes)
                handle.write(a)
            elif op == "long":
                assert isinstance(a, int)
                handle.write(block("Tool", str(b) * (a * 800)))
            else:
                assert isinstance(b, int)
                whole = block("Human", str(a))
                handle.write(whole[:b])
                handle.flush()
                count()
                handle.write(whole[b:])
        count()


_PART = st.one_of(
    st.tuples(st.just("entry"), _TEXT.filter(str.strip), st.sampled_from(["\n", "\n", "\r\n"])),
    st.tuples(
        st.just("junk"),
        st.sampled_from([b"junk line\n", b"\n", b"### not a header\n", b"\xff\xfe\n"]),
        st.just(""),
    ),
)
_SUMMARY = (
    "The user prefers tea. Task: ship memd. Decisions: keep every entry exactly once; "
    "write the archive first. Open tasks: docs."
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    parts=st.lists(_PART, min_size=2, max_size=20),
    tail=st.sampled_from([b"", "### AI — 2026-01-01T10:00:00\n\npartial".encode(), b"x"]),
    share=st.floats(0.02, 0.6),
    every=st.integers(1, 4),
    late=st.booleans(),
)
def test_a_compaction_from_marks_keeps_the_turns_and_hands_on_the_count_of_a_recount(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    parts: list[tuple[str, object, str]],
    tail: bytes,
    share: float,
    every: int,
    late: bool,
) -> None:
    monkeypatch.setattr("memd.counting.MARK_MIN_TOKENS", 8)
    monkeypatch.setattr("memd.counting.MARK_SHIFT", 62)
    paths = AgentWorkspace(tmp_path_factory.mktemp("ws")).create_agent("a")
    counted, _ = count_file(paths.memory, None, CL100K.count_bytes, junction_cut=True)
    for index, (kind, a, nl) in enumerate(parts):
        with paths.memory.open("ab") as handle:
            handle.write(block("AI", str(a) * 4, nl) if kind == "entry" else bytes(a))  # type: ignore[arg-type]
        if index % every == 0:
            counted, _ = count_file(paths.memory, counted, CL100K.count_bytes, junction_cut=True)
    with paths.memory.open("ab") as handle:
        handle.write(tail)
    counted, _ = count_file(paths.memory, counted, CL100K.count_bytes, junction_cut=True)
    snap = paths.memory.read_bytes()
    doc = parse(snap)

    def count_text(text: str) -> int:
        return CL100K.count_bytes(text.encode("utf-8", "surrogateescape"))

    budget = int(CL100K.count_bytes(snap) * share)
    expected_k, _ = kept_tail(doc, doc.boundary, budget, count_text)  # every entry counted
    late_turn = block("Human", "late é turn")

    class Summarizer:
        model = "fixed"

        def summarize(self, request: SummaryRequest) -> SummaryResult:
            if late:
                with paths.memory.open("ab") as handle:
                    handle.write(late_turn)
            return SummaryResult(text=_SUMMARY, model=self.model)

    options = replace(FAST, keep_recent_tokens=budget, entries_add_up=True, require_shrink=False)
    try:
        outcome = compact_agent(
            paths,
            Summarizer(),
            options,
            count_bytes=CL100K.count_bytes,
            threshold=compaction.ThresholdCheck(counted, threshold_tokens=1),
        )
    except (NothingToCompact, SummarizerError, CompactionAborted):
        return
    new = paths.memory.read_bytes()
    (archive,) = paths.archive_dir.iterdir()
    assert archive.read_bytes() == snap[:expected_k]  # the same turns kept as a full walk
    kept = snap[expected_k:] + (late_turn if late else b"")
    assert new.endswith(kept) or (late and kept in new)
    assert outcome.tokens_after == CL100K.count_bytes(new)
    if outcome.counted is not None:
        _assert_exact(new, outcome.counted, CL100K, 1 << 20)
        again, _ = count_file(paths.memory, outcome.counted, CL100K.count_bytes, junction_cut=True)
        assert again.tokens == CL100K.count_bytes(new)
