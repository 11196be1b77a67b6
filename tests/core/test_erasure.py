from __future__ import annotations

import re

import pytest

from memd.core.erasure import (
    BadPattern,
    FileStamp,
    Tombstone,
    agent_key,
    compile_pattern,
    erase_matching,
    revives,
)
from memd.core.memfile import parse, render_entry, render_header, render_summary_block
from memd.core.pins import PINNED_HEADING

STONE = Tombstone(key="k", erased_at_ns=1_000)


def test_no_memory_file_keeps_the_agent_erased() -> None:
    assert not revives(STONE, None)


def test_a_file_changed_at_or_after_the_erasure_brings_the_agent_back() -> None:
    assert revives(STONE, FileStamp(dev=1, ino=2, ctime_ns=1_000))
    assert revives(STONE, FileStamp(dev=1, ino=2, ctime_ns=5_000))
    assert not revives(STONE, FileStamp(dev=1, ino=2, ctime_ns=999))


def test_the_erased_inode_linked_back_is_not_a_new_file() -> None:
    stone = Tombstone(key="k", erased_at_ns=1_000, survivor_dev=1, survivor_ino=2)
    assert not revives(stone, FileStamp(dev=1, ino=2, ctime_ns=9_000))
    assert revives(stone, FileStamp(dev=1, ino=3, ctime_ns=9_000))


def test_agent_key_is_salted_and_hides_the_name() -> None:
    assert agent_key(b"a", "alpha") != agent_key(b"b", "alpha")
    assert agent_key(b"a", "alpha") == agent_key(b"a", "alpha")
    assert "alpha" not in agent_key(b"a", "alpha")


# -- erase by pattern -------------------------------------------------------------

HEADER = render_header("agent", "2026-01-01T10:00:00")
SUMMARY = render_summary_block(
    "The user works on project Falcon.\nThe user's card is 4111-1111.\n\n"
    f"{PINNED_HEADING}\n2026-01-01:\n- /srv/app/config.yaml\n- card 4111-1111 on file\n\n"
    "memd-summary: v2; raw turns in archive/history_2026-01-01_10-00-00.md",
    "2026-01-01T11:00:00",
)
KEEP = render_entry("Human", "2026-01-01T11:01:00", "hello there\n### not a header")
SECRET = render_entry("AI", "2026-01-01T11:02:00", "your card 4111-1111 is saved")
LATER = render_entry("Human", "2026-01-02T09:00:00", "thanks")


def test_matching_entries_go_whole_and_summary_lines_one_by_one() -> None:
    data = HEADER + SUMMARY + KEEP + SECRET + LATER
    result = erase_matching(data, compile_pattern(r"4111-1111"))
    assert (result.entries, result.summary_lines, result.pinned_lines) == (1, 1, 1)
    assert b"4111" not in result.data
    assert result.data.startswith(HEADER) and result.data.endswith(KEEP + LATER)
    document = parse(result.data)
    summary = document.entries[0]
    assert document.is_summary_entry(summary)  # still a summary, its preamble kept
    text = summary.summary_text
    assert "project Falcon" in text and "/srv/app/config.yaml" in text
    assert text.rstrip().endswith("history_2026-01-01_10-00-00.md")
    assert parse(result.data).render() == result.data


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_a_line_anchored_pattern_matches_raw_entries_as_it_does_summary_lines(
    newline: str,
) -> None:
    """One semantics (r9data F3): ^ and $ anchor at each line in raw entries too
    (re.MULTILINE), as in the summary's lines, searched one by one."""
    address = render_entry(
        "Human", "2026-01-01T11:03:00", f"Note this.{newline}home address: 12 Elm Street{newline}ok"
    )
    summary = render_summary_block(
        "The user moved.\nhome address: 12 Elm Street\nTask: ship memd.", "2026-01-01T11:00:00"
    )
    data = HEADER + summary + KEEP + address + LATER
    result = erase_matching(data, re.compile(r"^home address: .*$"))
    assert (result.entries, result.summary_lines) == (1, 1)
    assert b"Elm Street" not in result.data
    assert (
        result.data
        == HEADER + summary.replace(b"home address: 12 Elm Street\n", b"") + KEEP + LATER
    )
    # Still one search over the entry: a pattern may span its lines.
    assert erase_matching(data, re.compile(r"this\.\s+home")).entries == 1


def test_no_match_changes_nothing() -> None:
    data = HEADER + SUMMARY + KEEP
    result = erase_matching(data, compile_pattern("nowhere-to-be-found"))
    assert result.data is data and result.removed == 0


def test_a_timestamp_pattern_erases_one_conversation() -> None:
    data = HEADER + KEEP + SECRET + LATER
    result = erase_matching(data, compile_pattern(r"2026-01-01T11:0[12]"))
    assert result.data == HEADER + LATER and result.entries == 2


def test_the_summary_preamble_is_never_dropped() -> None:
    result = erase_matching(HEADER + SUMMARY, compile_pattern(r"(?i)compressed|summary|the"))
    document = parse(result.data)
    assert document.is_summary_entry(document.entries[0])


def test_unparsed_bytes_lose_their_matching_lines() -> None:
    data = HEADER + KEEP + b"torn 4111-1111 write\nother\n"
    result = erase_matching(data, compile_pattern("4111"))
    assert result.data == HEADER + KEEP + b"other\n" and result.entries == 1


@pytest.mark.parametrize("bad", ["(unclosed", "a{2,1}", "*x"])
def test_bad_pattern_is_one_line_naming_it(bad: str) -> None:
    with pytest.raises(BadPattern) as info:
        compile_pattern(bad)
    assert repr(bad) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("everything", ["", ".*", "x?", "(?m)^"])
def test_a_pattern_matching_everything_is_refused(everything: str) -> None:
    with pytest.raises(BadPattern, match="empty string"):
        compile_pattern(everything)


def test_compile_keeps_flags() -> None:
    assert compile_pattern("(?i)falcon").flags & re.IGNORECASE
