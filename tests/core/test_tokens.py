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
    extend_count,
    full_count,
    last_safe_boundary,
    safe_boundaries,
    safe_chunk_bounds,
)
from memd.tokenizer import load_encoding
from tests.support.strategies import any_bytes, append_splits, content_bytes, memory_files

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
