"""Review r9data (session 9): can memd lose a line? Each test fails today because of
the defect its reason names; a fix turns its strict xfail red."""

from __future__ import annotations

import pytest
from support.memfiles import AgentWorkspace

from memd.compaction import CompactionOptions, ProvidedSummary, compact_agent

FAST = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, drain_max_s=2)
SUMMARY = ProvidedSummary("Summary: the user prefers tea; task: ship memd. " + "fact " * 20)


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
