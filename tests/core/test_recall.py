from __future__ import annotations

import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memd.core.memfile import (
    SUMMARY_PREAMBLE,
    parse,
    render_entry,
    render_header,
    render_summary_block,
)
from memd.core.recall import (
    MATCH_CLOSE,
    MATCH_OPEN,
    Highlighted,
    RecallQueryError,
    excerpt,
    fts_expression,
    parse_since,
    query_terms,
    raw_entries_for_index,
    split_highlight,
)


def test_question_words_are_quoted_and_ored_without_stopwords() -> None:
    assert query_terms("Where is the Kalomiren report?") == ["kalomiren", "report"]
    assert (
        fts_expression(query_terms("where is the kalomiren report?")) == '"kalomiren" OR "report"'
    )


def test_fts_operators_in_a_question_are_plain_words() -> None:
    expression = fts_expression(query_terms('NEAR(a b) AND "x" OR -y: col:z * ^start'))
    assert expression == '"near" OR "b" OR "x" OR "y" OR "col" OR "z" OR "start"'


def test_only_stopwords_still_searches_them() -> None:
    assert query_terms("what is it?") == ["what", "is", "it"]


def test_a_question_without_words_is_a_clear_error() -> None:
    with pytest.raises(RecallQueryError, match="no word"):
        query_terms("?!? ...")


@given(st.text(max_size=200))
def test_any_text_is_a_valid_fts5_query_or_a_clear_error(question: str) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='porter unicode61')")
    conn.execute("INSERT INTO t VALUES ('hello world')")
    try:
        expression = fts_expression(query_terms(question))
    except RecallQueryError:
        return
    conn.execute("SELECT count(*) FROM t WHERE t MATCH ?", (expression,)).fetchone()


def test_summary_blocks_are_not_raw_entries() -> None:
    data = (
        render_header("alpha", "2026-01-01T00:00:00")
        + render_summary_block("We discussed the zebra plan.", "2026-01-01T00:00:01")
        + render_entry("Human", "2026-01-01T00:00:02", "first raw")
        + render_entry("AI", "2026-01-01T00:00:03", "second raw")
    )
    entries = raw_entries_for_index(parse(data))
    assert [e.text for e in entries] == ["first raw", "second raw"]
    assert data[entries[0].offset :].startswith(b"### Human")
    assert entries[0].length == len(render_entry("Human", "2026-01-01T00:00:02", "first raw"))
    assert entries[1].epoch is not None and entries[0].epoch is not None
    assert entries[1].epoch - entries[0].epoch == pytest.approx(1.0)


def test_swarms_summary_right_after_a_header_is_not_raw() -> None:
    data = (
        render_header("alpha", "2026-01-01T00:00:00")
        + render_entry("user", "2026-01-01T00:00:01", SUMMARY_PREAMBLE + "old stuff")
        + render_entry("user", "2026-01-01T00:00:02", "[Compressed Memory Summary] typed by a user")
    )
    entries = raw_entries_for_index(parse(data))
    assert [e.text for e in entries] == ["[Compressed Memory Summary] typed by a user"]


def test_highlight_markers_become_spans() -> None:
    found = split_highlight(f"the {MATCH_OPEN}kalomiren{MATCH_CLOSE} report")
    assert found == Highlighted("the kalomiren report", ((4, 13),))


def test_excerpt_keeps_the_first_match_and_shifts_spans() -> None:
    text = "word " * 200 + "kalomiren " + "tail " * 200
    start = text.index("kalomiren")
    cut = excerpt(Highlighted(text, ((start, start + 9),)), width=100)
    assert len(cut.text) <= 110 and cut.text.startswith("… ") and cut.text.endswith(" …")
    (span,) = cut.spans
    assert cut.text[span[0] : span[1]] == "kalomiren"


def test_since_accepts_dates_and_refuses_the_rest() -> None:
    assert parse_since("2026-11-30").day == 30
    assert parse_since("2026-11-30T14:05").hour == 14
    with pytest.raises(RecallQueryError, match="--since 'yesterday'"):
        parse_since("yesterday")
