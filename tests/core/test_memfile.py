"""The Swarms MEMORY.md parser is lossless and reads back what the renderer writes."""

from __future__ import annotations

import io
import re
import time

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from memd.core.memfile import (
    SUMMARY_PREAMBLE,
    EntrySegment,
    HeaderSegment,
    MemoryDocument,
    RawSegment,
    contains_entry_header,
    parse,
    render_entry,
    render_header,
    render_summary_block,
    sanitize_summary,
)
from tests.support.strategies import (
    any_bytes,
    content_bytes,
    entry_blocks,
    memory_files,
    roles,
    timestamps,
)

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TS = "2024-05-01T10:00:00.123456"
HEADER = render_header("demo", "2024-05-01T09:00:00")
# A terminator followed (after any empty lines) by a line that looks like an
# entry header: inside content this is genuinely ambiguous, so generated
# content avoids it.
_AMBIGUOUS = re.compile(rb"\r?\n\r?\n---\r?\n\r?\n(?:\r?\n)*### [^\r\n]* \xe2\x80\x94 ")


def assert_well_formed(doc: MemoryDocument, data: bytes) -> None:
    assert doc.render() == data
    assert doc.size == len(data)
    offset = 0
    for segment in doc.segments:
        assert segment.start == offset
        assert segment.raw  # no empty segments
        assert data[offset : offset + len(segment.raw)] == segment.raw
        offset += len(segment.raw)
    assert offset == len(data)
    assert all(not isinstance(s, HeaderSegment) for s in doc.segments[1:])
    assert 0 <= doc.boundary <= len(data)


@PROPERTY
@given(data=any_bytes)
def test_any_bytes_round_trip(data: bytes) -> None:
    assert_well_formed(parse(data), data)


@PROPERTY
@given(data=memory_files())
def test_generated_memory_files_round_trip(data: bytes) -> None:
    doc = parse(data)
    assert_well_formed(doc, data)
    for segment in doc.segments:
        if segment.start >= doc.boundary:
            assert isinstance(segment, RawSegment)


def _content_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


@PROPERTY
@given(
    entries=st.lists(st.tuples(roles, timestamps, content_bytes), max_size=6),
    with_header=st.booleans(),
)
def test_rendered_entries_parse_back_with_the_same_fields(
    entries: list[tuple[str, str, bytes]], with_header: bool
) -> None:
    for _, _, content in entries:
        assume(not _AMBIGUOUS.search(content))
    data = (HEADER if with_header else b"") + b"".join(
        render_entry(role, stamp, _content_text(content)) for role, stamp, content in entries
    )
    doc = parse(data)
    assert_well_formed(doc, data)
    assert (doc.header is not None) == with_header
    parsed = [(e.role, e.timestamp, e.content) for e in doc.entries]
    assert parsed == entries
    assert len(doc.segments) == len(entries) + with_header  # no raw leftovers
    assert doc.boundary == len(data)


TRICKY_CONTENTS = [
    "",
    "###",
    "### not a header",
    "---",
    "a\n---\nb",
    "before\n\n---\n\nafter, no header follows",
    "before\n\n---\n\n### heading but no em dash\n\nafter",
    "before\n\n---\n\n### Bob \u2014 not-a-time\n\nafter",
    "a line\n### Bob \u2014 2024-05-01T10:00:00\n\nlooks like a header, no terminator before it",
    "ends with a terminator\n\n---\n\n",
    "ends with dashes\n\n---",
    "crlf\r\nlines\r\n\r\n---\r\n\r\nmore",
    "non-ASCII: wörld 日本語 \u2014 \U0001f600",
    "invalid UTF-8: \udcff\udce2\udc80 end",
    "[Compressed Memory Summary]\nnot a summary: role is not System",
    "\n\nleading and trailing blank lines\n\n",
]


@pytest.mark.parametrize("content", TRICKY_CONTENTS)
def test_tricky_content_survives_between_other_entries(content: str) -> None:
    data = (
        HEADER
        + render_entry("User", TS, "first")
        + render_entry("Agent \u2014 7", TS, content)
        + render_entry("User", "2024-05-01T10:00:01", "last")
    )
    doc = parse(data)
    assert_well_formed(doc, data)
    assert [(e.role, e.content) for e in doc.entries] == [
        ("User", b"first"),
        ("Agent \u2014 7", content.encode("utf-8", "surrogateescape")),
        ("User", b"last"),
    ]
    assert doc.entries[1].text == content.encode("utf-8", "surrogateescape").decode(
        "utf-8", "replace"
    )


def test_content_ending_in_carriage_return_keeps_it() -> None:
    doc = parse(render_entry("User", TS, "line\r"))
    assert doc.entries[0].content == b"line\r"


def test_crlf_entries_have_no_stray_carriage_return() -> None:
    data = render_entry("User", TS, "hello\nworld").replace(b"\n", b"\r\n")
    doc = parse(data)
    assert doc.entries[0].content == b"hello\r\nworld"


def test_crlf_files_parse_into_entries() -> None:
    lf = HEADER + render_entry("User", TS, "one") + render_entry("Agent", TS, "two\nlines")
    crlf = lf.replace(b"\n", b"\r\n")
    doc = parse(crlf)
    assert_well_formed(doc, crlf)
    assert doc.header is not None and doc.header.conversation == "demo"
    assert [e.role for e in doc.entries] == ["User", "Agent"]
    assert doc.boundary == len(crlf)


def test_empty_file() -> None:
    doc = parse(b"")
    assert doc.segments == ()
    assert doc.header is None and doc.entries == []
    assert doc.boundary == 0 and doc.render() == b""
    assert doc.raw_entries_since_summary() == []


def test_file_without_header() -> None:
    data = render_entry("User", TS, "hi") + render_entry("Agent", TS, "hello")
    doc = parse(data)
    assert doc.header is None
    assert [e.content for e in doc.entries] == [b"hi", b"hello"]
    assert doc.boundary == len(data)


def test_header_alone_and_header_fields() -> None:
    header = render_header("Research \u2014 team", "2024-05-01T09:00:00")
    doc = parse(header)
    assert doc.header is not None
    assert (doc.header.conversation, doc.header.created) == (
        "Research \u2014 team",
        "2024-05-01T09:00:00",
    )
    assert doc.boundary == len(header) and doc.entries == []


def test_text_before_the_first_entry_is_kept_raw() -> None:
    data = b"notes someone typed\n" + render_entry("User", TS, "hi")
    doc = parse(data)
    assert_well_formed(doc, data)
    assert isinstance(doc.segments[0], RawSegment)
    assert [e.content for e in doc.entries] == [b"hi"]


@settings(PROPERTY, max_examples=150)
@given(
    with_header=st.booleans(),
    blocks=st.lists(entry_blocks(crlf=False), min_size=1, max_size=4),
    data=st.data(),
)
def test_partial_trailing_entry_is_raw_after_the_boundary(
    with_header: bool, blocks: list[bytes], data: st.DataObject
) -> None:
    assume(not any(_AMBIGUOUS.search(block) for block in blocks))
    complete, block = blocks[:-1], blocks[-1]
    prefix = (HEADER if with_header else b"") + b"".join(complete)
    whole = parse(prefix)
    assert whole.boundary == len(prefix)
    cut = data.draw(st.integers(min_value=1, max_value=len(block) - 1))
    partial = block[:cut]
    # Would look complete (empty lines after a terminator end an entry too).
    assume(not re.search(rb"\r?\n\r?\n---\r?\n\r?\n(?:\r?\n)*\Z", partial))
    file = prefix + partial
    doc = parse(file)
    assert_well_formed(doc, file)
    assert isinstance(doc.segments[-1], RawSegment)
    assert all(isinstance(s, RawSegment) for s in doc.segments if s.start >= doc.boundary)
    # Until the new entry's header line is complete, the entry before it cannot
    # be told apart from one whose content goes on: it may wait in the raw tail.
    header_line_done = re.match(rb"### [^\r\n]* \xe2\x80\x94 \S+\n\n", partial) is not None
    if header_line_done:
        assert doc.boundary == len(prefix)
        assert [e.raw for e in doc.entries] == [e.raw for e in whole.entries]
    else:
        assert doc.boundary <= len(prefix)
        assert [e.raw for e in doc.entries] == [e.raw for e in whole.entries][: len(doc.entries)]
        assert len(doc.entries) >= len(whole.entries) - 1


def test_partial_entry_after_a_complete_header_line_keeps_the_previous_entry() -> None:
    prefix = HEADER + render_entry("User", TS, "done")
    file = prefix + b"### Agent \xe2\x80\x94 " + TS.encode() + b"\n\nhalf a repl"
    doc = parse(file)
    assert doc.boundary == len(prefix)
    assert [e.content for e in doc.entries] == [b"done"]
    assert doc.segments[-1] == RawSegment(start=len(prefix), raw=file[len(prefix) :])


def test_50_mb_single_entry_parses_in_linear_time() -> None:
    line = "a line of text with ### and --- and \u2014 in it\n"

    def timed(size: int) -> float:
        content = line * (size // len(line.encode()))
        data = HEADER + render_entry("User", TS, content)
        started = time.perf_counter()
        doc = parse(data)
        elapsed = time.perf_counter() - started
        assert len(doc.entries) == 1
        assert doc.boundary == len(data) > size - len(line)
        assert doc.entries[0].content == content.encode()
        return elapsed

    # A ratio measured in one run, not a wall-clock bound: 10x the bytes,
    # linear with slack (a quadratic scan would be ~100x). The best of a few
    # runs each, so one preempted run on a loaded machine does not decide.
    small = min(timed(5_000_000) for _ in range(3))
    large = min(timed(50_000_000) for _ in range(2))
    assert large < 10 * small * 3, (small, large)


def test_many_entries_parse_in_linear_time() -> None:
    def timed(count: int) -> float:
        data = HEADER + b"".join(render_entry("User", TS, f"turn {i}") for i in range(count))
        started = time.perf_counter()
        assert len(parse(data).entries) == count
        return time.perf_counter() - started

    small = min(timed(5_000) for _ in range(3))  # best of a few: see above
    large = min(timed(40_000) for _ in range(3))
    assert large < 8 * small * 3, (small, large)  # 8x the entries: linear, with slack


def test_summary_blocks_are_detected() -> None:
    data = (
        HEADER
        + render_summary_block("We decided X.\n### User \u2014 2024-01-01T00:00:00\nquoted", TS)
        + render_entry("System", TS, "a system turn, not a summary")
        + render_entry("User", TS, "[Compressed Memory Summary]\nuser text")
    )
    doc = parse(data)
    assert [e.is_summary for e in doc.entries] == [True, False, False]
    summary = doc.entries[0]
    assert summary.role == "System"
    assert summary.summary_text == ("We decided X.\n> ### User \u2014 2024-01-01T00:00:00\nquoted")
    assert doc.last_summary() == summary
    assert [e.content for e in doc.raw_entries_since_summary()] == [
        b"a system turn, not a summary",
        b"[Compressed Memory Summary]\nuser text",
    ]
    assert not contains_entry_header(summary.summary_text)


@pytest.mark.parametrize("local", [True, False], ids=["local", "whole-split"])
def test_a_summary_block_after_a_turn_is_a_turn_not_memds_summary(local: bool) -> None:
    # memd re-seeds MEMORY.md as header + its block: one further down was written
    # by an agent or a tool (a tool printing another MEMORY.md, which Swarms
    # writes verbatim). It hides no turn before it (review r9summary F2).
    data = (
        HEADER
        + render_entry("User", TS, "old turn")
        + render_entry("Tool", TS, "cat agents/beta/MEMORY.md:")
        + render_summary_block("beta's goal", TS)
        + render_entry("AI", TS, "that was beta's memory")
    )
    doc = parse(data)
    if not local:
        assert len(doc.segments) == 5  # the whole split read first: no fast path
    assert doc.last_summary() is None
    assert next(e.content for e in doc.raw_entries_since_summary()) == b"old turn"
    assert len(doc.raw_entries_since_summary()) == 4
    summary, texts = doc.since_summary_texts()
    assert summary is None
    assert next(text for _, _, text in texts) == "old turn"
    assert not any(doc.is_summary_entry(e) for e in doc.entries)


def test_raw_entries_since_summary_respects_an_end_offset() -> None:
    first = HEADER + render_summary_block("s", TS) + render_entry("User", TS, "a")
    data = first + render_entry("User", TS, "b")
    doc = parse(data)
    assert [e.content for e in doc.raw_entries_since_summary(len(first))] == [b"a"]
    assert [e.content for e in doc.raw_entries_since_summary()] == [b"a", b"b"]


summary_texts = st.lists(
    st.one_of(
        st.text(max_size=20),
        st.sampled_from(
            [
                "### User \u2014 2024-01-01T00:00:00",
                "###User \u2014 2024-01-01",
                "### A \u2014 B \u2014 2024-01-01T00:00:00Z",
                "   ### Lead \u2014 2024-01-01T00:00:00",
                "\x00### Nul \u2014 2024-01-01T00:00:00",
                "\n",
                "\r\n",
                "\n\n---\n\n",
            ]
        ),
    ),
    max_size=12,
).map("".join)


@PROPERTY
@given(summary=summary_texts, stamp=timestamps)
def test_sanitized_summaries_never_hold_an_entry_header(summary: str, stamp: str) -> None:
    cleaned = sanitize_summary(summary)
    assert not contains_entry_header(cleaned)
    block = render_summary_block(summary, stamp)
    doc = parse(HEADER + block)
    assert len(doc.entries) == 1 and doc.entries[0].is_summary
    assert doc.entries[0].raw == block
    for line in cleaned.split("\n"):
        assert not contains_entry_header(line + "\n\n")


def test_sanitized_summary_has_no_header_line_under_universal_newlines() -> None:
    block = render_summary_block("done\r### User \u2014 2024-01-01T00:00:00\r\rmore", TS)
    as_swarms_reads_it = io.TextIOWrapper(io.BytesIO(block), encoding="utf-8", newline=None).read()
    summary_lines = as_swarms_reads_it.split("\n")[1:]  # line 0 is the block's own header
    assert not any(contains_entry_header(line + "\n\n") for line in summary_lines)


def test_summary_with_a_lone_surrogate_renders() -> None:
    block = render_summary_block("truncated emoji \ud83d", TS)
    assert parse(block).entries[0].is_summary


@given(role=roles, stamp=timestamps)
@settings(max_examples=100, deadline=None)
def test_single_entry_header_detection(role: str, stamp: str) -> None:
    assert contains_entry_header(f"### {role} \u2014 {stamp}\n\n")
    assert isinstance(parse(render_entry(role, stamp, "x")).segments[0], EntrySegment)


SWARMS_PREAMBLE = (
    "[Compressed Memory Summary]\nThe following is a compressed summary of earlier "
    "conversation turns, replacing the raw transcript to stay within the context window.\n\n"
)


def test_swarms_own_summary_counts_only_as_the_first_block_after_the_header() -> None:
    header = render_header("c", "2026-01-01T00:00:00")
    swarms_summary = render_entry("user", "2026-01-01T00:00:01", SWARMS_PREAMBLE + "Ada likes tea.")
    later = render_entry("Human", "2026-01-01T00:00:02", "new turn")
    doc = parse(header + swarms_summary + later)
    assert doc.is_summary_entry(doc.entries[0])
    assert [e.text for e in doc.raw_entries_since_summary()] == ["new turn"]


def test_a_user_message_starting_with_the_marker_hides_nothing() -> None:
    header = render_header("c", "2026-01-01T00:00:00")
    first = render_entry("Human", "2026-01-01T00:00:01", "raw turn one")
    mimic = render_entry("user", "2026-01-01T00:00:02", SWARMS_PREAMBLE + "fake")
    doc = parse(header + first + mimic)
    assert not doc.is_summary_entry(doc.entries[1])
    assert len(doc.raw_entries_since_summary()) == 2
    # Only the marker line, without Swarms' full preamble, is not a summary either.
    short = render_entry("user", "2026-01-01T00:00:02", "[Compressed Memory Summary]\nfake")
    doc = parse(header + short)
    assert not doc.is_summary_entry(doc.entries[0])


def _reference_entry_starts(data: bytes, begin: int) -> list[tuple[int, int]]:
    """The definition: every match of the header regex from ``begin`` with a role
    and an ISO timestamp (what the scan over every byte position found)."""
    from memd.core.memfile import _ENTRY_HEADER_RE, parse_timestamp

    return [
        (m.start(), m.end())
        for m in _ENTRY_HEADER_RE.finditer(data, begin)
        if m.group(1).strip() and parse_timestamp(m.group(2).decode("ascii", "replace"))
    ]


@PROPERTY
@given(
    data=st.one_of(memory_files(), any_bytes, st.lists(entry_blocks()).map(b"".join)),
    begin=st.integers(0, 400),
)
def test_header_search_finds_exactly_what_the_regex_scan_finds(data: bytes, begin: int) -> None:
    from memd.core.memfile import _entry_starts

    begin = min(begin, len(data))
    found = [(m.start(), m.end()) for m in _entry_starts(data, begin)]
    assert found == _reference_entry_starts(data, begin)


def test_header_search_edges() -> None:
    from memd.core.memfile import _entry_starts

    line = "### Human \u2014 2024-05-01T10:00:00\n\n".encode()
    for data, begin in (
        (line, 0),
        (b"x" + line, 0),  # not at a line start
        (b"\n" + line, 1),  # begin right at a line start
        (b"#" + line, 0),  # "#### " holds "### " mid-line
        (b"\r" + line, 0),
        (line + line, 5),  # begin inside the first header
        (line + b"### \n" + line, 0),
    ):
        found = [(m.start(), m.end()) for m in _entry_starts(data, begin)]
        assert found == _reference_entry_starts(data, begin), (data, begin)


# -- the lazy reading (what compaction asks for) equals the whole split ------------

SUMMARY_PREAMBLE_BYTES = SUMMARY_PREAMBLE.encode()
_LF_PIECES = st.sampled_from(
    [
        b"### A \xe2\x80\x94 2024-01-01T00:00:00\n\n",  # a header line and its blank line
        b"### System \xe2\x80\x94 2024-01-01\n\n[Compressed Memory Summary]\nold\n\n---\n\n",
        b"### user \xe2\x80\x94 2024-01-01\n\n" + SUMMARY_PREAMBLE_BYTES + b"swarms\n\n---\n\n",
        b"### B \xe2\x80\x94 not-a-time\n\n",
        b"\n\n---\n\n",
        b"\n\n---\n\n\n",  # a terminator and an empty line
        b"\n\n---\n\n\n\n\n",
        b"---\n\n",
        b"\n",
        b"\n\n\n",
        b" \n\t",
        b"[Compressed Memory Summary]",
        b"x",
        b"### ",
    ]
)
# Entries with empty lines after some of their terminators (review s9pins).
_spaced_entries = st.lists(
    st.tuples(entry_blocks(crlf=False), st.sampled_from([b"", b"", b"\n", b"\n\n\n"])),
    max_size=8,
).map(lambda pairs: b"".join(block + lines for block, lines in pairs))
lf_memory_files = st.one_of(
    _spaced_entries,
    st.tuples(st.just(HEADER), _spaced_entries).map(b"".join),
    memory_files().map(lambda data: data.replace(b"\r", b"")),
    st.lists(st.one_of(_LF_PIECES, _LF_PIECES, entry_blocks(crlf=False)), max_size=12).map(
        b"".join
    ),
    st.tuples(st.just(HEADER), st.lists(st.one_of(_LF_PIECES, entry_blocks(crlf=False)))).map(
        lambda parts: parts[0] + b"".join(parts[1])
    ),
)


def _whole(data: bytes) -> MemoryDocument:
    """The reference: a document whose every answer comes from the whole split."""
    doc = parse(data)
    assert doc.segments is not None
    return doc


def _same_readings(data: bytes) -> None:
    whole = _whole(data)
    ends = {0, len(data), whole.boundary}
    for segment in whole.segments:
        ends |= {segment.start, segment.start + len(segment.raw)}
    assert parse(data).boundary == whole.boundary
    assert parse(data).unparsed_edges() == whole.unparsed_edges()
    assert parse(data).turns_since_summary() == whole.turns_since_summary()
    for end in sorted(ends):
        newest_first = list(reversed(whole.segments_before(end)))
        assert list(parse(data).segments_reversed(end)) == newest_first
        # A walk that stops after the newest one reads the same (and no more).
        assert next(iter(parse(data).segments_reversed(end)), None) == next(
            iter(newest_first), None
        )
        summary, turns = parse(data).since_summary(end)
        expected_summary, expected_turns = whole.since_summary(end)
        expected = list(expected_turns)
        assert (summary, list(turns)) == (expected_summary, expected)
        summary, texts = parse(data).since_summary_texts(end)
        assert summary == expected_summary
        assert list(texts) == [(e.role, e.timestamp, e.text) for e in expected]
    for segment in whole.segments:
        end = segment.start + len(segment.raw)
        part = parse(data).prefix(end)
        assert part.render() == data[:end]
        assert part.segments == tuple(whole.segments_before(end))
        assert parse(data).prefix(end).boundary == _whole(data[:end]).boundary
        summary, turns = parse(data).prefix(end).since_summary()
        expected_summary, expected_turns = _whole(data[:end]).since_summary()
        assert (summary, list(turns)) == (expected_summary, list(expected_turns))


@PROPERTY
@given(data=st.one_of(lf_memory_files, lf_memory_files, any_bytes))
def test_the_lazy_reading_equals_the_whole_split(data: bytes) -> None:
    _same_readings(data)


def test_the_lazy_reading_edges() -> None:
    empty = b"### A \xe2\x80\x94 2024-01-01\n\n"
    for data in (
        b"",
        HEADER,
        HEADER + empty,  # an entry never closed
        HEADER + empty + b"---\n\n",  # its blank line is not a terminator's
        HEADER + empty + b"\n\n---\n\n",
        HEADER + empty + b"---\n\n" + empty + b"---\n\n" + render_entry("B", TS, "x"),
        empty + b"\n---\n\n" + render_entry("B", TS, "x"),
        b"junk\n" + render_entry("B", TS, "x"),
        HEADER + render_summary_block("s", TS) + render_entry("B", TS, "x"),
        HEADER + render_entry("B", TS, "x") + render_summary_block("s", TS),
        HEADER + render_entry("B", TS, " \n [Compressed Memory Summary]\nnot a summary"),
        HEADER + render_entry("System", TS, " \n [Compressed Memory Summary]\nsummary"),
        HEADER + render_entry("System", TS, "x") + b"### [Compressed Memory Summary] \xe2\x80\x94 ",
    ):
        _same_readings(data)


def test_the_compaction_path_reads_a_swarms_file_without_splitting_it_whole() -> None:
    turns = b"".join(render_entry("Human", TS, f"turn {i}") for i in range(200))
    partial = render_entry("Human", TS, "half a repl")[:-10]
    data = HEADER + render_summary_block("so far", TS) + turns + partial
    doc = parse(data)
    assert doc.boundary == len(data) - len(partial)
    newest = next(iter(doc.segments_reversed(doc.boundary)))
    assert isinstance(newest, EntrySegment) and newest.content == b"turn 199"
    summary, since = doc.prefix(doc.boundary).since_summary()
    assert summary is not None and summary.summary_text.startswith("so far")
    assert next(since).content == b"turn 0"
    assert doc._full is None
    # A carriage return anywhere: the whole split answers (the same).
    crlf = parse(data.replace(b"turn 7", b"turn\r7"))
    assert crlf.boundary == doc.boundary
    assert crlf._full is not None


@PROPERTY
@given(summary=summary_texts, stamp=timestamps)
@example(summary="\x1b]0", stamp="2026-01-01T00:00:00")  # an unterminated OSC ate the last line
def test_a_clean_block_renders_as_the_whole_text_would(summary: str, stamp: str) -> None:
    from memd.core.memfile import render_clean_summary_block

    line = "memd-summary: v2; raw turns in archive/history_2026-01-01_00-00-00.md (+2 earlier)"
    block = render_clean_summary_block(sanitize_summary(summary), stamp, line)
    # Text that ends in a word (as the composed summary's last line does) renders
    # the same either way; otherwise its trailing blanks go with the sanitizer.
    if summary[-1:].isalnum():
        assert block == render_summary_block(f"{summary}\n{line}", stamp)
    (entry,) = parse(block).entries
    assert entry.is_summary and entry.summary_text.split("\n")[-1] == line


def test_nothing_in_the_reply_reaches_into_the_last_line() -> None:
    from memd.core.memfile import render_clean_summary_block

    line = "memd-summary: v2"
    for reply in ("an unterminated OSC \x1b]0;title", "ends in a carriage return\r", ""):
        block = render_clean_summary_block(sanitize_summary(reply), TS, line)
        (entry,) = parse(block).entries
        assert entry.summary_text.split("\n")[-1] == line
    for bad in ("", "two\nlines", "### System \u2014 2024-01-01", " padded", "caf\u00e9"):
        with pytest.raises(ValueError, match="not a line memd writes"):
            render_clean_summary_block("x", TS, bad)


# -- empty lines between a terminator and the next entry (review s9pins) -----------


@pytest.mark.parametrize(
    "lines", [b"\n", b"\n\n", b"\n" * 40, b"\r\n", b"\r\n\n", b"\n\r\n"], ids=repr
)
@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
def test_empty_lines_after_a_terminator_keep_the_turn_boundary(lines: bytes, crlf: bool) -> None:
    """``---\\n\\n\\n### …`` merged the next entry into the one before it (its
    header and content read as the first one's content): the bytes were kept,
    the turn was lost. The empty lines end the first entry's bytes, not its
    content; the lazy reading and the whole split agree."""
    first = render_entry("User", TS, "first")
    second = render_entry("Agent", "2024-05-01T10:00:01", "second")
    if crlf:
        first, second = (b.replace(b"\n", b"\r\n") for b in (first, second))
    data = HEADER + first + lines + second + lines + render_entry("User", TS, "third")
    doc = parse(data)
    assert_well_formed(doc, data)
    expected = [(b"User", b"first"), (b"Agent", b"second"), (b"User", b"third")]
    assert [(e.role.encode(), e.content) for e in doc.entries] == expected
    assert [e.raw for e in doc.entries][:2] == [first + lines, second + lines]
    assert doc.boundary == len(data)
    _same_readings(data)
    lazy = parse(data)
    assert [(e.role.encode(), e.content) for e in lazy.since_summary()[1]] == expected
    # A file that ends with the empty lines: the last entry is closed too.
    _same_readings(data + lines)
    assert parse(data + lines).boundary == len(data + lines)


def test_empty_lines_after_a_summary_block_keep_the_turns_after_it() -> None:
    data = HEADER + render_summary_block("so far", TS) + b"\n\n" + render_entry("User", TS, "new")
    doc = parse(data)
    summary, turns = doc.since_summary()
    assert summary is not None and summary.summary_text.startswith("so far")
    assert [t.content for t in turns] == [b"new"]
    assert doc._full is None  # read locally
    _same_readings(data)


def test_a_line_that_is_not_empty_after_a_terminator_is_still_content() -> None:
    for between in (b" \n", b"\t\n", b"x\n", b"\r\r\n"):
        data = HEADER + render_entry("User", TS, "first") + between + render_entry("A", TS, "x")
        doc = parse(data)
        assert [e.role for e in doc.entries] == ["User"], between
        assert doc.entries[0].content.endswith(b"### A \xe2\x80\x94 " + TS.encode() + b"\n\nx")
        _same_readings(data)
