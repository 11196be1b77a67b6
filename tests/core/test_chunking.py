from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memd.core.chunking import (
    DEFAULT_WINDOW,
    Piece,
    cut_at_line,
    plan_chunks,
    reduce_entry,
    request_limits,
    summarizer_window,
)


def word_count(text: str) -> int:
    return len(text.split())


def test_window_comes_from_config_then_model_then_default() -> None:
    assert summarizer_window(4_096, 128_000).tokens == 4_096
    assert summarizer_window(0, 128_000).source == "model"
    assert summarizer_window(0, None).tokens == DEFAULT_WINDOW
    assert summarizer_window(0, None).source == "default"


def test_output_cap_derives_from_the_window() -> None:
    limits = request_limits(4_096, 4_000, 8_000)
    assert limits.output_tokens == 1_024
    assert limits.input_tokens + limits.output_tokens <= 4_096


def test_an_oversize_dump_keeps_head_tail_and_its_one_odd_line() -> None:
    rows = [f'{{"id": {i}, "status": "ok"}}' for i in range(400)]
    rows.insert(200, "FATAL disk full on /var/lib/pg")
    text = "Tool Output:\n" + "\n".join(rows)
    reduced = reduce_entry(text, 60, word_count)
    assert word_count(reduced) <= 60
    assert "FATAL disk full on /var/lib/pg" in reduced
    assert reduced.startswith("Tool Output:") and rows[-1] in reduced
    assert "omitted" in reduced


def test_cut_at_line_keeps_whole_lines_and_marks_the_cut() -> None:
    text = "\n".join(f"line {i} words here" for i in range(100))
    cut = cut_at_line(text, 50, word_count)
    assert word_count(cut) <= 50 and cut.endswith("…]") and "line 0 words here" in cut
    assert cut_at_line("short", 50, word_count) == "short"


pieces_strategy = st.lists(
    st.tuples(st.sampled_from(["Human", "Tool Executor", "AI"]), st.integers(1, 400)),
    min_size=1,
    max_size=40,
)


@given(pieces=pieces_strategy, chunk=st.integers(40, 300), calls=st.integers(1, 10))
def test_every_piece_is_in_exactly_one_chunk_or_left_for_later(
    pieces: list[tuple[str, int]], chunk: int, calls: int
) -> None:
    items = [
        Piece(f"p{i} " + "w " * (size - 1), end=(i + 1) * 10, role=role)
        for i, (role, size) in enumerate(pieces)
    ]
    plan = plan_chunks(items, chunk_tokens=chunk, max_calls=calls, count_text=word_count)
    assert len(plan.chunks) <= calls
    markers = [text.split()[0] for c in plan.chunks for text in c.texts]
    # Oldest first, none twice, none skipped: a prefix of all pieces.
    assert markers == [f"p{i}" for i in range(len(markers))]
    assert all(c.tokens <= chunk for c in plan.chunks)
    if plan.partial:
        assert plan.cut == items[len(markers) - 1].end
    else:
        assert len(markers) == len(items) and plan.cut == 0
