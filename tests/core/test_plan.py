"""The compaction plan's pure rules: values in, values out."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from memd.core.memfile import parse, render_entry, render_header, render_summary_block
from memd.core.plan import (
    SUMMARY_MARKUP_TOKENS,
    FileFacts,
    RecoveryAction,
    StoredCountTrust,
    has_compactable,
    landed_prefix,
    lone_summary,
    may_exceed_cap,
    nothing_to_compact_reason,
    recovery_action,
    stored_count_trust,
    summary_does_not_shrink,
    summary_over_budget,
    summary_over_cap,
)

HEADER = render_header("alpha", "2026-01-01T00:00:00")


def test_summary_size_rules() -> None:
    assert summary_over_cap(1160, 1000) is None  # the block's markup is allowed for
    assert summary_over_cap(1161, 1000) == "summary has 1161 tokens, over the cap of 1000"
    assert summary_does_not_shrink(99, 100) is None
    refused = summary_does_not_shrink(100, 100)
    assert refused is not None and "(100 bytes) would not shrink" in refused


def test_a_block_within_the_cap_in_bytes_need_not_be_counted() -> None:
    block = render_summary_block("word " * 200, "2026-01-01T00:00:02")
    assert not may_exceed_cap(block, len(block))  # bytes bound tokens from above
    assert may_exceed_cap(
        block, len(block) - SUMMARY_MARKUP_TOKENS - 3
    )  # it could be over: count it
    # Invalid UTF-8 decodes to U+FFFD (3 bytes), which the bound allows for.
    assert may_exceed_cap(b"\xff" * 100, 150 - 64)


def test_has_compactable() -> None:
    turns = render_entry("Human", "2026-01-01T00:00:01", "hello")
    assert has_compactable(parse(HEADER + turns))
    summary = render_summary_block("the gist", "2026-01-01T00:00:02")
    assert not has_compactable(parse(HEADER + summary))
    assert not has_compactable(parse(HEADER))
    # Unparseable bytes before the boundary leave the file through the archive.
    assert has_compactable(parse(b"not a header, not an entry\n\n" + summary))


def test_a_lone_summary_block_is_compacted_only_over_its_budget() -> None:
    """A summary block with nothing after it is taken again only when a new block that
    size would be refused (over the cap): a result within it is never taken again."""

    def count(data: bytes) -> int:
        return len(data) // 4

    small = parse(HEADER + render_summary_block("the gist", "2026-01-01T00:00:02"))
    big_block = render_summary_block("the gist of it all. " * 400, "2026-01-01T00:00:02")
    big = parse(HEADER + big_block)
    assert lone_summary(small) is not None and lone_summary(big) is not None
    assert summary_over_budget(small, 100, count) is None
    assert summary_over_budget(big, 100, count) == count(big_block)
    # Within the cap and its markup allowance: left alone.
    assert summary_over_budget(big, count(big_block) - SUMMARY_MARKUP_TOKENS, count) is None
    assert summary_over_budget(big, count(big_block) - SUMMARY_MARKUP_TOKENS - 1, count)
    # Raw turns after it, or no summary at all: the usual rule, not this one.
    turn = render_entry("Human", "2026-01-01T00:00:03", "hello")
    assert lone_summary(parse(HEADER + big_block + turn)) is None
    assert summary_over_budget(parse(HEADER + big_block + turn), 100, count) is None
    assert lone_summary(parse(HEADER)) is None


def test_recovery_decision_by_phase_and_inode() -> None:
    old, new, other = (1, 10), (1, 11), (1, 12)
    decide = recovery_action
    assert decide("idle", old, old, new) is RecoveryAction.CLEAN_TEMPS
    assert decide("archiving", old, old, (None, None)) is RecoveryAction.ROLL_BACK
    assert decide("swapping", old, old, new) is RecoveryAction.ROLL_BACK
    assert decide("swapping", new, old, new) is RecoveryAction.ROLL_FORWARD
    assert decide("draining", new, old, new) is RecoveryAction.ROLL_FORWARD
    assert decide("draining", other, old, new) is RecoveryAction.KEEP_OLD_AS_ARCHIVE
    assert decide("swapping", None, old, new) is RecoveryAction.KEEP_OLD_AS_ARCHIVE


def test_landed_prefix_finds_where_an_append_could_land() -> None:
    entry = render_entry("AI", "2026-01-01T00:00:03", "late")
    other = render_entry("Human", "2026-01-01T00:00:04", "someone else")
    assert landed_prefix(b"", entry) == 0  # nothing landed
    assert landed_prefix(entry, entry) == len(entry)
    assert landed_prefix(other + entry, entry) == len(entry)  # after another writer's append
    assert landed_prefix(entry[:10], entry) == 10  # cut short, last in the file
    assert landed_prefix(entry[:10] + other, entry) == 0  # not last: not ours
    assert landed_prefix(b"xx" + entry, entry) == 0  # not at an entry start


@pytest.mark.parametrize("gap", [b"\n", b"\n\n", b"\r\n", b"\r\n\n"])
def test_landed_prefix_finds_a_chunk_after_empty_lines_that_end_an_entry(gap: bytes) -> None:
    # The drain appends once the file ends at an entry's end, empty lines after
    # its terminator included (the parser reads them so): recovery must find the
    # chunk there, or it appends it a second time.
    entry = b"### Human \xe2\x80\x94 2026-01-01T00:00:00\n\nhello\n\n---\n\n"
    for terminator in (b"\n\n---\n\n", b"\r\n\r\n---\r\n\r\n"):
        other = b"### AI \xe2\x80\x94 2026-01-01T00:00:01\n\nhi" + terminator + gap
        assert landed_prefix(other + entry, entry) == len(entry)
        assert landed_prefix(other + entry[:12], entry) == 12  # cut short, last
    assert landed_prefix(b"xx\n" + entry, entry) == 0  # a line end alone starts no entry


def test_stored_count_trust() -> None:
    stored = FileFacts(dev=1, ino=2, size=100, mtime_ns=5)

    def trust(now: FileFacts, **changes: object) -> StoredCountTrust:
        facts: dict[str, object] = {
            "tokens": 30,
            "safe_tokens": 20,
            "stored_encoding": "cl100k_base",
            "encoding": "cl100k_base",
            "has_window_digest": True,
        }
        facts.update(changes)
        return stored_count_trust(stored, now, **facts)  # type: ignore[arg-type]

    assert trust(stored) is StoredCountTrust.REUSE
    assert trust(FileFacts(1, 2, 150, 9)) is StoredCountTrust.EXTEND
    assert trust(FileFacts(1, 3, 100, 5)) is StoredCountTrust.RECOUNT  # replaced
    assert trust(FileFacts(1, 2, 90, 9)) is StoredCountTrust.RECOUNT  # truncated
    assert trust(FileFacts(1, 2, 100, 6)) is StoredCountTrust.RECOUNT  # same size, touched
    assert trust(stored, encoding="o200k_base") is StoredCountTrust.RECOUNT
    assert trust(stored, has_window_digest=False) is StoredCountTrust.RECOUNT
    assert trust(stored, tokens=10) is StoredCountTrust.RECOUNT  # a record that makes no sense


def test_kept_tail_keeps_the_newest_whole_entries_within_budget() -> None:
    from memd.core.memfile import parse, render_entry, render_header, render_summary_block
    from memd.core.plan import kept_tail_start

    data = render_header("x", "2026-01-01T00:00:00")
    data += render_summary_block("old summary", "2026-01-01T00:00:01")
    for n in range(4):
        data += render_entry("Human", f"2026-01-01T00:00:0{n + 2}", f"turn {n} " + "w " * 10)
    doc = parse(data)
    entries = doc.entries[1:]

    def count(text: str) -> int:
        return len(text)

    sizes = [len(e.raw.decode()) for e in entries]
    end = doc.boundary
    assert kept_tail_start(doc, end, 0, count) == end  # off
    assert kept_tail_start(doc, end, sizes[-1] - 1, count) == end  # newest does not fit whole
    assert kept_tail_start(doc, end, sizes[-1], count) == entries[-1].start
    assert kept_tail_start(doc, end, sizes[-1] + sizes[-2], count) == entries[-2].start
    # Never past the summary block: everything since it, at most.
    assert kept_tail_start(doc, end, 10**9, count) == entries[0].start
    # A shorter end: the tail ends there.
    assert kept_tail_start(doc, entries[1].start, sizes[0], count) == entries[0].start


def test_the_budget_equation_includes_the_recent_turns() -> None:
    import pytest

    from memd.core.summary_plan import (
        HEADER_ALLOWANCE,
        RECENT_DERIVED,
        BudgetError,
        summary_budgets,
    )

    # 28,800 threshold, low water 17,280: derived shares shrink to fit.
    derived = summary_budgets(28_800, 17_280, recent_tokens=RECENT_DERIVED)
    assert derived.total <= 17_280 and derived.recent_tokens > 2_800
    assert summary_budgets(28_800, 17_280, recent_tokens=0).recent_tokens == 0
    # Explicit values fit on their own; derived ones take what is left.
    mixed = summary_budgets(28_800, 17_280, summary_tokens=10_000, recent_tokens=RECENT_DERIVED)
    assert mixed.summary_tokens == 10_000 and mixed.total <= 17_280
    with pytest.raises(BudgetError, match="summarizer.keep_recent_tokens") as info:
        summary_budgets(28_800, 17_280, summary_tokens=10_000, recent_tokens=8_000)
    assert "summarizer.summary_tokens (10000)" in str(info.value)
    assert str(HEADER_ALLOWANCE) in str(info.value)


# -- the compaction plan: every raw entry has exactly one fate ---------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from memd.core import memfile as _memfile  # noqa: E402
from memd.core.chunking import RequestLimits  # noqa: E402
from memd.core.plan import (  # noqa: E402
    ChunkBudget,
    chunk_budget,
    plan_compaction,
    summarized_to,
)

_ITEM = st.one_of(
    st.tuples(st.just("entry"), st.sampled_from(["Human", "AI", "Tool"]), st.integers(0, 400)),
    st.tuples(st.just("summary"), st.just("System"), st.integers(1, 60)),
    st.tuples(st.just("junk"), st.just(""), st.integers(1, 30)),
)


def _document(items: list[tuple[str, str, int]]) -> _memfile.MemoryDocument:
    data = _memfile.render_header("p", "2026-01-01T00:00:00")
    for n, (kind, role, words) in enumerate(items):
        stamp = f"2026-01-01T{n // 3600:02d}:{n // 60 % 60:02d}:{n % 60:02d}"
        if kind == "entry":
            lines = [f"{role} line {n}.{i} " + "word " * (i % 7) for i in range(words // 6 + 1)]
            data += _memfile.render_entry(role, stamp, "\n".join(lines))
        elif kind == "summary":
            data += _memfile.render_summary_block("Facts:\n" + "- fact\n" * words, stamp)
        else:
            data += b"stray " * words + b"\n\n"
    return _memfile.parse(data)


def _tokens(text: str) -> int:
    return len(text) // 4 + 1


def _redact(text: str) -> str:
    return text.replace("word", "[REDACTED:w]").replace("line", "L")


@given(
    items=st.lists(_ITEM, max_size=30),
    recent=st.integers(0, 3_000),
    chunk_tokens=st.integers(150, 3_000),
    max_calls=st.integers(1, 6),
    previous_inline=st.booleans(),
    redact=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_every_raw_entry_is_kept_summarized_once_or_carried(
    items: list[tuple[str, str, int]],
    recent: int,
    chunk_tokens: int,
    max_calls: int,
    previous_inline: bool,
    redact: bool,
) -> None:
    doc = _document(items)
    end = doc.boundary
    # Production's LLM summarizer redacts every piece before it is measured; a
    # placeholder is longer or shorter than what it replaces.
    plan = plan_compaction(
        doc,
        end,
        recent,
        ChunkBudget(chunk_tokens, max_calls, previous_inline),
        _tokens,
        _redact if redact else None,
    )
    assert plan.summarized_to <= plan.kept_from <= end
    kept_tokens = 0
    summarized = [e for c in plan.chunks.chunks for e in c.ends]
    for entry in doc.raw_entries_since_summary():
        entry_end = entry.start + len(entry.raw)
        in_chunks = summarized.count(entry_end)
        if entry.start >= plan.kept_from:  # verbatim, after the new summary
            kept_tokens += _tokens(entry.raw.decode())
            assert in_chunks == 0
        elif entry_end <= plan.summarized_to:  # summarized now, in exactly one chunk
            assert in_chunks == 1, (entry_end, summarized)
        else:  # the carried tail of a partial compaction: raw for the next one
            assert plan.partial and in_chunks == 0
    assert kept_tokens <= recent
    # Chunks follow the file's order and fit the summarizer's room.
    assert summarized == sorted(summarized)
    assert all(chunk.tokens <= chunk_tokens for chunk in plan.chunks.chunks)
    assert len(plan.chunks.chunks) <= max_calls
    # The compacted part ends at an entry boundary (or where the kept tail starts).
    ends = {s.start + len(s.raw) for s in doc.segments}
    assert plan.summarized_to in ends | {plan.kept_from}


def test_chunk_budget_sends_a_small_previous_summary_whole() -> None:
    limits = RequestLimits(window=2_000, output_tokens=300, input_tokens=1_500)
    # room = 1,500 - 100 = 1,400; the previous summary may take half of it.
    assert chunk_budget(limits, 100, 0, 4) == ChunkBudget(1_100, 4, True)
    assert chunk_budget(limits, 100, 200, 4) == ChunkBudget(1_100, 4, True)  # under the answer
    assert chunk_budget(limits, 100, 700, 4) == ChunkBudget(700, 4, True)
    # Over its share: re-summarized as material, the room is the answer's only.
    assert chunk_budget(limits, 100, 701, 4) == ChunkBudget(1_100, 4, False)


def test_summarized_to_is_the_kept_tail_unless_the_summarizer_stopped_earlier() -> None:
    assert summarized_to(500, None) == 500
    assert summarized_to(500, 500) == 500
    assert summarized_to(500, 900) == 500
    assert summarized_to(500, 320) == 320


# -- the kept tail from known counts: the same decision as counting every entry -----

import pytest  # noqa: E402
from hypothesis import HealthCheck  # noqa: E402

from memd.core.plan import kept_tail  # noqa: E402
from memd.core.tokens import JUNCTION_CUT_ENCODINGS  # noqa: E402
from memd.tokenizer import shared_counter  # noqa: E402
from tests.support.strategies import entry_blocks, memory_files  # noqa: E402
from tests.support.token_oracle import safe_boundaries  # noqa: E402


def _cuts_that_add_up(data: bytes, end: int) -> list[int]:
    """0, every safe boundary before ``end``, every entry start, and ``end``: where a
    count's marks can be (safe offsets and junction cuts)."""
    starts = [
        s.start
        for s in parse(data).segments
        if s.start < end and data[s.start : s.start + 1] == b"#"
    ]
    return sorted({0, end, *safe_boundaries(data[:end]), *starts})


@pytest.mark.parametrize("encoding", sorted(JUNCTION_CUT_ENCODINGS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_kept_tail_from_known_counts_is_the_one_counting_every_entry(
    encoding: str, data: st.DataObject
) -> None:
    count = shared_counter(encoding).count_bytes
    raw = data.draw(
        st.one_of(
            memory_files(max_entries=12),
            st.lists(entry_blocks(), min_size=1, max_size=14).map(b"".join),
        )
    )
    doc = parse(raw)
    end = doc.boundary
    total = count(raw[:end])
    budget = data.draw(st.integers(-1, total + 20))
    cuts = data.draw(st.lists(st.sampled_from(_cuts_that_add_up(raw, end)), unique=True))
    known = [(cut, count(raw[cut:end])) for cut in sorted(cuts)]

    def count_text(text: str) -> int:
        return count(text.encode("utf-8", "surrogateescape"))

    assert kept_tail(doc, end, budget, count_text, known) == kept_tail(doc, end, budget, count_text)


def test_kept_tail_from_known_counts_tokenizes_only_near_the_cut() -> None:
    count = shared_counter("cl100k_base").count_bytes
    raw = render_header("x", "2026-01-01T00:00:00") + render_summary_block("old", "2026-01-01")
    for n in range(400):
        raw += render_entry(
            "Human" if n % 2 else "AI", "2026-01-01T00:00:00", f"turn {n}: " + "word " * 40
        )
    doc = parse(raw)
    end = doc.boundary
    entries = doc.entries[1:]
    # A mark every 20 entries, as a count settles at an entry's start.
    known = [(e.start, count(raw[e.start : end])) for e in entries[::20]]
    tokenized: list[int] = []

    def count_text(text: str) -> int:
        tokenized.append(len(text))
        return count(text.encode())

    budget = count(raw[entries[150].start + 10 : end])  # the cut falls in entry 151
    expected = kept_tail(doc, end, budget, count_text)
    assert expected[0] == entries[151].start
    everything, tokenized[:] = sum(tokenized), []
    assert kept_tail(doc, end, budget, count_text, known) == expected
    # Entries 140..160 at most (the gap between two marks), not the 250 kept.
    assert sum(tokenized) <= len(raw[entries[140].start : entries[160].start])
    assert everything > 10 * sum(tokenized)
    # Counts that contradict each other are not trusted: every entry is counted.
    tokenized.clear()
    wrong = [(entries[100].start, 5), (entries[200].start, 10)]
    assert kept_tail(doc, end, budget, count_text, wrong) == expected
    assert sum(tokenized) == everything


def test_the_entry_that_does_not_fit_leaves_the_kept_figure_exact() -> None:
    # The walk works out the rejected (older) entry's figure first, then the kept
    # one's, which lies after it (found by hypothesis).
    count = shared_counter("cl100k_base").count_bytes
    raw = (
        b"### User \xe2\x80\x94 2024-01-01T12:00:00\n\n### \n\n---\n\n"
        b"### User \xe2\x80\x94 2024-01-01T12:00:00\n\n\n\n---\n\n"
        b"### System \xe2\x80\x94 2024-01-01T12:00:00\n\nnot closed\n\n---\n\n#"
    )
    doc = parse(raw)
    end = doc.boundary

    def count_text(text: str) -> int:
        return count(text.encode("utf-8", "surrogateescape"))

    known = [(37, count(raw[37:end]))]  # right after the first entry's "###"
    assert kept_tail(doc, end, 22, count_text, known) == kept_tail(doc, end, 22, count_text)
    assert kept_tail(doc, end, 22, count_text) == (45, 18)


_SWARMS_SUMMARY = (
    "### user \u2014 2024-01-01T12:00:00\n\n"
    "[Compressed Memory Summary]\nThe following is a compressed summary of earlier "
    "conversation turns, replacing the raw transcript to stay within the context window.\n\n"
    "what came before\n\n---\n\n"
).encode()


@pytest.mark.parametrize("encoding", sorted(JUNCTION_CUT_ENCODINGS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_newest_turns_are_never_skipped_past_a_summary(
    encoding: str, data: st.DataObject
) -> None:
    # A summary block (memd's, anywhere; Swarms' own, right after the header) ends
    # the walk, however much of the budget is left and wherever the known counts are.
    count = shared_counter(encoding).count_bytes
    header = render_header("x", "2026-01-01T00:00:00")
    first = data.draw(st.sampled_from([b"", _SWARMS_SUMMARY]))
    before = data.draw(st.lists(entry_blocks(crlf=False), max_size=4))
    summary = data.draw(st.sampled_from([b"", render_summary_block("old", "2026-01-01")]))
    after = data.draw(st.lists(entry_blocks(crlf=False), min_size=1, max_size=6))
    raw = header + first + b"".join(before) + summary + b"".join(after)
    doc = parse(raw)
    end = doc.boundary
    total = count(raw[:end])
    budget = data.draw(st.one_of(st.just(total + 50), st.integers(0, total + 50)))
    cuts = _cuts_that_add_up(raw, end)
    chosen = data.draw(st.one_of(st.just(cuts), st.lists(st.sampled_from(cuts), unique=True)))
    known = [(cut, count(raw[cut:end])) for cut in sorted(chosen)]

    def count_text(text: str) -> int:
        return count(text.encode("utf-8", "surrogateescape"))

    assert kept_tail(doc, end, budget, count_text, known) == kept_tail(doc, end, budget, count_text)


def test_nothing_to_compact_names_the_bytes_that_do_not_parse() -> None:
    """review16e F4: a file of near-Swarms turns (no `---` terminators) holds no
    entry and no summary; "no raw entries since the last summary" blamed a
    summary that is not there."""
    unterminated = "### Human — 2026-01-05T09:00:00\n\nturn 0 lorem ipsum\n\n".encode()
    document = parse(HEADER + unterminated)
    assert not has_compactable(document)
    reason = nothing_to_compact_reason(document, "")
    size = len(unterminated)
    assert reason == (
        f"nothing to compact: the {size} bytes after the last complete entry cannot be "
        "parsed (they are kept verbatim; fix or remove them)"
    )
    # A summary and nothing after it: the summary is the reason.
    summarized = parse(HEADER + render_summary_block("the gist", "2026-01-01T00:00:02"))
    assert nothing_to_compact_reason(summarized, "") == (
        "nothing to compact (no raw entries since the last summary)"
    )
    # Turns kept verbatim are the reason, whatever follows them.
    kept = " beyond the newest 100 tokens kept verbatim"
    assert nothing_to_compact_reason(document, kept) == (
        f"nothing to compact (no raw entries since the last summary{kept})"
    )


def test_a_block_whose_summary_and_pins_fill_their_budgets_is_within_the_cap(
    cl100k: Callable[[str], int],
) -> None:
    # s10retain: the block's own markup (header, preamble, archive note, version
    # line) is ~110 tokens; with an allowance of 64 a summary that used its whole
    # budget beside a full pinned section was refused as over the cap.
    from memd.core.pins import Pin, render_pinned
    from memd.core.retention import RetentionLimits
    from memd.core.summary_block import archive_note, compose_summary

    body = "Decisions:\n" + "\n".join(f"- Human: we chose plan {i}." for i in range(40))
    pins = [Pin("path", f"/srv/app{i}/conf.yaml", "2026-03-02T10:00:00") for i in range(40)]
    pinned_tokens = cl100k(render_pinned(pins))
    note = archive_note(RetentionLimits(max_archives=30, max_age_days=90, max_total_mb=512))
    composed = compose_summary(
        body,
        pins,
        pinned_tokens=pinned_tokens,
        count_text=cl100k,
        archive="history_2026-12-03_16-05-47.md",
        earlier_archives=128,
        note=note,
    )
    assert composed.pinned == len(pins)
    block = render_summary_block(composed.text, "2026-12-03T16:05:47.348313")
    cap = cl100k(body) + pinned_tokens
    assert summary_over_cap(cl100k(block.decode()), cap) is None
