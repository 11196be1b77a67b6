"""Review r9data (session 9): can memd lose a line? Each test fails today because of
the defect its reason names; a fix turns its strict xfail red."""

from __future__ import annotations

import os

import pytest
from support.memfiles import AgentWorkspace, entry_contents_everywhere, swarms_block

from memd.compaction import CompactionOptions, ProvidedSummary, compact_agent

FAST = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, drain_max_s=2)
SUMMARY = ProvidedSummary("Summary: the user prefers tea; task: ship memd. " + "fact " * 20)


@pytest.mark.xfail(
    strict=True,
    reason="r9data F1: the drain appends a late turn into the middle of an entry an agent "
    "is writing to the new MEMORY.md in two write() calls (both turns broken as entries)",
)
def test_a_drained_late_turn_never_lands_inside_an_agents_entry_in_the_new_file(
    agent_ws: AgentWorkspace,
) -> None:
    paths = agent_ws.create_agent("alpha", entries=4)
    # A writer that opened MEMORY.md before the swap (the drain's reason to exist).
    late_writer = os.open(paths.memory, os.O_WRONLY | os.O_APPEND)
    # An agent that writes one entry in two write() calls (header, then the rest:
    # buffered writers do this for a turn over their buffer size; so does a shell
    # script appending line by line), to the new MEMORY.md after the swap.
    split = swarms_block("Human", "SPLIT turn written in two write() calls").encode()
    fresh: list[int] = []

    def at(name: str) -> None:
        if name == "replaced":
            os.write(late_writer, swarms_block("AI", "LATE turn to the old inode").encode())
            fd = os.open(paths.memory, os.O_WRONLY | os.O_APPEND)
            os.write(fd, split[:20])
            fresh.append(fd)

    try:
        compact_agent(paths, SUMMARY, FAST, manual=True, checkpoint=at)
        os.write(fresh[0], split[20:])
    finally:
        for fd in (*fresh, late_writer):
            os.close(fd)
    seen = entry_contents_everywhere(paths)
    # Today the new file reads "### Human — 2026-1### AI — …LATE…---\n\n2-03T…SPLIT…":
    # neither turn parses as an entry any more.
    assert seen["LATE turn to the old inode"] == 1
    assert seen["SPLIT turn written in two write() calls"] == 1


@pytest.mark.xfail(
    strict=True,
    reason="r9data F3: forget --match runs a line-anchored regex (^…, …$) on a summary line "
    "by line but on a raw entry as one string (no re.MULTILINE): the summary line goes, the "
    "same line in a raw turn (MEMORY.md and archives) stays, and the audit says it was erased",
)
def test_forget_match_erases_a_line_anchored_pattern_from_raw_turns_too(
    agent_ws: AgentWorkspace,
) -> None:
    import re

    from support.memfiles import append_entry

    from memd.erasure import EraseOptions, erase_by_pattern

    paths = agent_ws.create_agent("alpha", entries=3)
    append_entry(paths.memory, "Human", "Note this.\nhome address: 12 Elm Street\nThanks.")
    summary = "The user moved.\nhome address: 12 Elm Street\nTask: ship memd. " + "fact " * 20
    compact_agent(paths, ProvidedSummary(summary), FAST, manual=True)
    append_entry(paths.memory, "Human", "Again:\nhome address: 12 Elm Street\nbye")
    outcome = erase_by_pattern(
        paths, re.compile(r"^home address: .*$"), EraseOptions(drain_quiet_s=0.05)
    )
    assert outcome.summary_lines == 1  # the summary's line went (line by line)
    left = [
        p.name
        for p in [paths.memory, *paths.archive_dir.iterdir()]
        if b"12 Elm Street" in p.read_bytes()
    ]
    assert left == []  # today: ['MEMORY.md', 'history_….md'] (the raw turns kept it)
