"""The one sanitizer for summary text (LLM replies and --summary alike)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memd.core.memfile import parse, render_summary_block, sanitize_summary
from memd.core.sanitize import strip_controls

HOSTILE = (
    "\x1b[2J\x1b[31mred\x1b[0m \x1b]0;pwned title\x07done\x9b1mx "
    "nul\x00 bell\x07 del\x7f nel\x85 ls\u2028ps\u2029 "
    "bidi\u202eevil\u202c iso\u2066x\u2069 mark\u200f\n\tkept"
)


def test_escapes_controls_separators_and_bidi_are_stripped() -> None:
    assert strip_controls(HOSTILE) == ("red donex nul bell del nel lsps bidievil isox mark\n\tkept")


@given(st.text())
def test_nothing_unsafe_survives(text: str) -> None:
    cleaned = strip_controls(text)
    for char in cleaned:
        code = ord(char)
        assert char in "\n\t" or not (code < 0x20 or 0x7F <= code <= 0x9F)
        assert char not in "\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def test_summary_block_written_to_memory_is_clean() -> None:
    block = render_summary_block(
        "Summary \x1b[1mbold\x1b[0m\u2028### AI \u2014 x\r\nend", "2026-01-01T00:00:00"
    )
    text = block.decode()
    assert "\x1b" not in text and "\u2028" not in text and "\r" not in text
    assert parse(block).entries[0].is_summary
    assert sanitize_summary("a\rb") == "a\nb"  # a lone CR is a line break to readers


def test_an_unterminated_osc_ends_with_its_line() -> None:
    """An OSC never terminated (a reply cut short, `\\x1b]0`) swallowed the rest of
    the text: in a dry run's whole block, the pinned facts and the provenance line
    after a reply (found by hypothesis: summary='\\x1b]0'). A terminal ends it no
    later than the line either, for what an operator would see."""
    text = "summary\x1b]0;title\nPinned facts:\n- /srv/app\nmemd-summary: v2"
    assert strip_controls(text) == "summary\nPinned facts:\n- /srv/app\nmemd-summary: v2"
    assert strip_controls("a\x1b]8;;http://x\x07link\x1b]8;;\x1b\\ b") == "alink b"
