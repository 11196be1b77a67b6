"""Incremental token counting equals a full recount, for every encoding memd offers."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memd.core.tokens import (
    CountState,
    PieceCounter,
    last_safe_boundary,
    upper_bound,
)
from memd.tokenizer import load_encoding
from tests.support.strategies import any_bytes, append_splits, content_bytes, memory_files
from tests.support.token_oracle import (
    extend_count,
    full_count,
    safe_boundaries,
    safe_chunk_bounds,
)

ENCODINGS = ["cl100k_base", "o200k_base", "p50k_base"]
Count = Callable[[bytes], int]

PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_counter(name: str) -> Count:
    """The ground truth: one encode_ordinary over the whole decoded text."""
    encoding = load_encoding(name)

    def count(data: bytes) -> int:
        return len(encoding.encode_ordinary(data.decode("utf-8", "replace")))

    return count


@pytest.fixture(params=ENCODINGS, scope="module")
def count(request: pytest.FixtureRequest) -> Count:
    return reference_counter(request.param)


ENTRY_A = "### User \u2014 2024-01-01T00:00:00\n\nhello\n\n---\n\n"
ENTRY_B = "### Agent \u2014 2024-01-01T00:00:01\n\nhi there\n\n---\n\n"


def test_cutting_before_the_header_is_not_additive_for_p50k() -> None:
    # Why the rule is "after ###", not "after the terminator": at end-of-text
    # p50k's \s++$ makes "\n\n" one pre-token, mid-text it is two.
    count = reference_counter("p50k_base")
    a, b = ENTRY_A.encode(), ENTRY_B.encode()
    assert count(a) + count(b) != count(a + b)
    cut = len(a) + 3
    assert cut in safe_boundaries(a + b)
    assert count((a + b)[:cut]) + count((a + b)[cut:]) == count(a + b)


def test_boundaries_sit_after_header_hashes_and_between_lf_lines() -> None:
    data = (ENTRY_A + ENTRY_B).encode()
    header_cuts = [i + 4 for i in range(len(data)) if data.startswith(b"\n### ", i)]
    assert header_cuts and set(header_cuts) <= set(safe_boundaries(data))
    assert safe_boundaries(b"one.\nTwo") == [5]
    assert safe_boundaries(b"one \nTwo") == []  # space before the newline
    assert safe_boundaries(b"one.\r\nTwo") == []  # CRLF: p50k merges "\r\n" at end-of-text
    assert safe_boundaries(b"one.\n/two") == []  # o200k joins "\n/" to the punctuation
    assert safe_boundaries(b"\n####x") == []


@PROPERTY
@given(data=any_bytes, suffix=content_bytes)
def test_every_safe_boundary_is_additive_whatever_follows(
    count: Count, data: bytes, suffix: bytes
) -> None:
    for whole in (data, data + suffix):
        total = count(whole)
        for cut in safe_boundaries(data):
            assert count(whole[:cut]) + count(whole[cut:]) == total, cut


@PROPERTY
@given(data=any_bytes)
def test_last_safe_boundary_is_the_largest_boundary(data: bytes) -> None:
    assert last_safe_boundary(data) == max(safe_boundaries(data), default=0)


def test_last_safe_boundary_across_its_window_edges() -> None:
    # Every prefix of a text whose cuts of each kind sit on and around the
    # backward windows' edges (64, 256, 1024 bytes from the end).
    text = (
        b"### Human \xe2\x80\x94 2026\n\nword word\n"
        + b"{}-=+" * 13
        + b"\n### AI\nNext line"
        + b"0123456789:;" * 30
        + b"a b\n\n---\n\n"
        + b"[]" * 500
    )
    for end in range(len(text) + 1):
        data = text[:end]
        assert last_safe_boundary(data) == max(safe_boundaries(data), default=0), end


def test_last_safe_boundary_looks_far_back_when_needed() -> None:
    data = b"intro.\nText" + b" \r\n" * 200_000
    assert last_safe_boundary(data) == 7
    assert last_safe_boundary(b"") == 0
    assert last_safe_boundary(b" \r\n" * 10_000) == 0


@PROPERTY
@given(data=memory_files(), dev=st.integers(0, 2**40), ino=st.integers(0, 2**40))
def test_full_count_is_exact(count: Count, data: bytes, dev: int, ino: int) -> None:
    state = full_count(count, data, dev, ino)
    assert state.tokens == count(data)
    assert (state.dev, state.ino, state.size) == (dev, ino, len(data))
    assert state.safe_offset == last_safe_boundary(data)
    assert state.safe_tokens == count(data[: state.safe_offset])


@PROPERTY
@given(st.data())
def test_incremental_count_equals_full_recount_after_every_append(
    count: Count, data: st.DataObject
) -> None:
    content = data.draw(memory_files())
    cuts = data.draw(append_splits(content))
    first = cuts[0] if cuts else len(content)
    state = full_count(count, content[:first], 7, 42)
    for cut in [*cuts[1:], len(content)]:
        state = extend_count(state, count, content[state.safe_offset : cut], cut)
        assert state.size == cut
        assert state.tokens == count(content[:cut])
        assert state.safe_tokens == count(content[: state.safe_offset])
    assert (state.dev, state.ino) == (7, 42)


def test_extend_count_tokenizes_only_the_tail_and_the_new_bytes() -> None:
    seen: list[int] = []
    count = reference_counter("cl100k_base")

    def recording(data: bytes) -> int:
        seen.append(len(data))
        return count(data)

    prefix = (ENTRY_A * 5000).encode()
    state = full_count(count, prefix, 1, 1)
    grown_file = prefix + ENTRY_B.encode()
    size = len(prefix) + 33
    grown = extend_count(state, recording, grown_file[state.safe_offset : size], size)
    assert grown.tokens == count(grown_file[:size])
    assert sum(seen) == len(prefix) - state.safe_offset + 33 < 200


def test_extend_count_refuses_shrinking_and_wrong_slices() -> None:
    count = reference_counter("cl100k_base")
    data = (ENTRY_A + ENTRY_B).encode()
    state = full_count(count, data, 1, 2)
    with pytest.raises(ValueError, match="shrank"):
        extend_count(state, count, b"", state.size - 1)
    with pytest.raises(ValueError, match=f"from offset {state.safe_offset}"):
        extend_count(state, count, b"new bytes only", state.size + 14)


def test_count_state_is_frozen() -> None:
    state = CountState(dev=1, ino=2, size=3, safe_offset=0, safe_tokens=0, tail_tokens=1)
    assert state.tokens == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.size = 4  # type: ignore[misc]


@PROPERTY
@given(data=memory_files(max_entries=20), target=st.integers(1, 400))
def test_safe_chunks_tile_the_data_and_add_up(count: Count, data: bytes, target: int) -> None:
    bounds = safe_chunk_bounds(data, target)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(data)
    assert all(end == start for (_, end), (start, _) in itertools.pairwise(bounds))
    assert sum(count(data[start:end]) for start, end in bounds) == count(data)


def test_a_space_between_two_words_is_a_safe_boundary() -> None:
    # A long single line (no newline) must still be countable in pieces.
    assert safe_boundaries(b"two words here") == [3, 9]
    assert safe_boundaries(b"two  words, 1 2 x\n") == []


def _pieces(data: bytes, sizes: list[int]) -> list[bytes]:
    blocks, position = [], 0
    for size in sizes:
        blocks.append(data[position : position + size])
        position += size
    blocks.append(data[position:])
    return blocks


@PROPERTY
@given(
    data=memory_files(max_entries=12),
    sizes=st.lists(st.integers(1, 300), max_size=8),
    max_piece=st.integers(8, 400),
)
def test_piece_counter_is_exact_unless_estimated_and_never_below(
    count: Count, data: bytes, sizes: list[int], max_piece: int
) -> None:
    longest: list[int] = [0]

    def spy(piece: bytes) -> int:
        longest[0] = max(longest[0], len(piece))
        return count(piece)

    counter = PieceCounter(spy, max_piece_bytes=max_piece, window_bytes=16)
    for block in _pieces(data, sizes):
        counter.feed(block)
    state = counter.finish(1, 2)
    truth = count(data)
    assert state.size == len(data)
    assert longest[0] <= max_piece  # never more than one piece at a time
    if state.estimated:
        assert state.tokens >= truth
    else:
        assert state.tokens == truth
        assert state.safe_tokens == count(data[: state.safe_offset])
    assert counter.recent == data[: state.safe_offset][-16:]


@PROPERTY
@given(st.data())
def test_piece_counter_resumed_after_appends_stays_exact_or_above(
    count: Count, data: st.DataObject
) -> None:
    content = data.draw(memory_files(max_entries=12))
    cuts = data.draw(append_splits(content))
    max_piece = data.draw(st.integers(8, 300))
    counter = PieceCounter(count, max_piece_bytes=max_piece)
    first = cuts[0] if cuts else len(content)
    counter.feed(content[:first])
    state = counter.finish(7, 42)
    for cut in [*cuts[1:], len(content)]:
        counter = PieceCounter.resume(state, count, max_piece_bytes=max_piece)
        counter.feed(content[state.safe_offset : cut])
        state = counter.finish(7, 42)
        truth = count(content[:cut])
        assert state.tokens >= truth if state.estimated else state.tokens == truth


def test_a_giant_run_is_estimated_in_bounded_pieces_and_the_rest_exactly() -> None:
    count = reference_counter("cl100k_base")
    longest: list[int] = [0]

    def spy(piece: bytes) -> int:
        longest[0] = max(longest[0], len(piece))
        return count(piece)

    head = ENTRY_A.encode() + b"### User \xe2\x80\x94 2024-01-01T00:00:00\n\nsome words "
    run = b"a" * 50_000
    after = b" and more words\n\n---\n\n" + ENTRY_B.encode()
    counter = PieceCounter(spy, max_piece_bytes=4096)
    for block in _pieces(head + run + after, [1000] * 60):
        counter.feed(block)
    state = counter.finish(1, 1)
    assert state.estimated and not state.open_run
    assert longest[0] <= 4096
    truth = count(head + run + after)
    assert truth <= state.tokens <= truth + len(run) + 4 * 13
    # Without the run the same text is exact.
    plain = PieceCounter(count, max_piece_bytes=4096)
    plain.feed(head + after)
    assert plain.finish(1, 1) == full_count(count, head + after, 1, 1)


def test_an_open_run_stays_estimated_across_appends() -> None:
    count = reference_counter("cl100k_base")
    counter = PieceCounter(count, max_piece_bytes=100)
    counter.feed(b"words first " + b"z" * 450)
    state = counter.finish(1, 1)
    assert state.open_run and state.estimated
    assert state.tokens >= count(b"words first " + b"z" * 450)
    whole = b"words first " + b"z" * 460 + b" done"
    grown = extend_count(state, count, whole[state.safe_offset :], len(whole))
    assert grown.estimated and grown.tokens >= count(whole)


def test_upper_bound_is_never_below_the_count() -> None:
    count = reference_counter("cl100k_base")
    for data in (b"", b"a" * 1000, "日本語".encode() * 50, b"\xff\xfe" * 40, b" " * 99):
        assert upper_bound(data) >= count(data)


@PROPERTY
@given(before=any_bytes, after=any_bytes)
def test_a_newline_then_a_hash_is_a_cut_for_the_junction_encodings(
    before: bytes, after: bytes
) -> None:
    from memd.core.tokens import JUNCTION_CUT_ENCODINGS, is_junction_cut

    before, after = before + b"\n", b"#" + after
    assert is_junction_cut(before, after)
    for name in sorted(JUNCTION_CUT_ENCODINGS):
        count = reference_counter(name)
        assert count(before + after) == count(before) + count(after), name


def test_the_junction_is_not_a_cut_for_p50k() -> None:
    count = reference_counter("p50k_base")
    before, after = b"done\n\n---\n\n", b"### User"
    assert count(before + after) != count(before) + count(after)


_long_texts = st.tuples(
    st.one_of(
        content_bytes,
        st.sampled_from([b"abcdefghijklmnop ", b"x" * 40 + b" y\n", b"hello world. ", b"\xff\n"]),
    ),
    st.integers(1, 60),
).map(lambda text_times: text_times[0] * text_times[1])


@PROPERTY
@given(data=st.one_of(any_bytes, _long_texts, _long_texts), floor=st.integers(0, 200))
def test_counting_up_to_a_floor_decides_it_exactly(count: Count, data: bytes, floor: int) -> None:
    from memd.core.tokens import count_at_least

    whole = count(data)
    found = count_at_least(data, floor, count)
    assert (found < floor) is (whole < floor)
    if found < floor:
        assert found == whole


def test_counting_up_to_a_floor_reads_less_of_a_long_text() -> None:
    from memd.core.tokens import count_at_least

    reference = reference_counter("cl100k_base")
    seen: list[int] = []

    def count(data: bytes) -> int:
        seen.append(len(data))
        return reference(data)

    text = b"The quick brown fox jumps over the lazy dog. " * 2000
    assert count_at_least(text, 100, count) >= 100
    assert sum(seen) < len(text) // 10
    seen.clear()
    assert count_at_least(text, 10**6, count) == reference(text)  # never reached: all of it
    assert sum(seen) == len(text)
