from __future__ import annotations

from memd.core.memfile import parse, render_header, render_summary_block
from memd.core.pins import Pin
from memd.core.summary_block import (
    SUMMARY_FORMAT,
    carried_pins,
    compose_summary,
    parse_summary,
    version_line,
)


def word_count(text: str) -> int:
    return len(text.split())


def test_a_block_written_by_the_previous_release_reads_as_plain_summary() -> None:
    # What memd wrote before format 2: the preamble, then the summary, nothing else.
    old = render_header("a", "2026-01-01T00:00:00") + render_summary_block(
        "Goals:\n- ship it\nFacts:\n- config at /srv/a/b.yaml", "2026-01-01T00:00:01"
    )
    block = parse(old).entries[0]
    parsed = parse_summary(block.summary_text)
    assert parsed.version == 1
    assert parsed.body == "Goals:\n- ship it\nFacts:\n- config at /srv/a/b.yaml"
    assert parsed.pins == ()
    # Its facts are still carried into the next summary's pins.
    assert "/srv/a/b.yaml" in {p.text for p in carried_pins(parsed, block.timestamp)}


def test_compose_pins_what_the_reply_lost_and_round_trips() -> None:
    pins = [
        Pin("command", "`make deploy`", "2026-01-01T10:00:00"),
        Pin("path", "/srv/a/b.yaml", "2026-01-02T10:00:00"),
    ]
    composed = compose_summary(
        "We deploy with make deploy; config at /srv/a/b.yaml.",
        pins,
        pinned_tokens=1000,
        count_text=word_count,
        archive="archive/history_2026-01-02_10-00-00.md",
        earlier_archives=2,
    )
    assert composed.pinned == 1 and composed.covered == 1
    parsed = parse_summary(composed.text)
    assert parsed.version == SUMMARY_FORMAT
    assert parsed.body == "We deploy with make deploy; config at /srv/a/b.yaml."
    assert [p.text for p in parsed.pins] == ["`make deploy`"]
    assert parsed.latest_archive == "archive/history_2026-01-02_10-00-00.md"
    assert parsed.earlier_archives == 2


def test_a_newer_format_is_carried_as_text_not_misread() -> None:
    text = "Body\n\nSomething new\n\nmemd-summary: v9; raw turns in archive/x.md"
    parsed = parse_summary(text)
    assert parsed.newer_than_known and parsed.body == text and parsed.pins == ()


def test_version_line_without_archive() -> None:
    assert parse_summary("x\n\n" + version_line("", 0)).version == SUMMARY_FORMAT
