"""A summary block alone over its budget (an older build's, a threshold or window
lowered below it) is compacted itself: re-summarized within the budget, or
replaced by an operator's ``--summary``; one within its budget is still nothing
to compact. Real files, the real tokenizer, the real builtin summarizer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from support.memfiles import AgentWorkspace, append_entry
from support.tokens import CL100K

from memd.compaction import CompactionOptions, ProvidedSummary, compact_agent
from memd.core.line_groups import expand_groups
from memd.core.memfile import parse
from memd.core.plan import SUMMARY_MARKUP_TOKENS, lone_summary, summary_over_budget
from memd.core.summary import SummaryRequest, SummaryResult
from memd.core.summary_block import parse_summary
from memd.errors import NothingToCompact, SummarizerError
from memd.fsutil import SlotJournal
from memd.summarizers import BuiltinSummarizer
from memd.workspace import AgentPaths

# The budgets a big agent had, and those left once its threshold was lowered.
WIDE = CompactionOptions(
    lock_wait_s=5, drain_quiet_s=0.05, drain_max_s=2, summary_max_tokens=8000, pinned_tokens=2000
)
NARROW = replace(WIDE, summary_max_tokens=300, pinned_tokens=200)
NARROW_CAP = NARROW.summary_max_tokens + NARROW.pinned_tokens


def big_summary(lines: int = 150) -> str:
    """A summary as an older build left it: every line carried forward."""
    return "Decisions:\n2026-11-30:\n" + "\n".join(
        f"- Human: We decided to run the batch job {index} on queue q{index} after the "
        f"retry budget of {index % 7} attempts was agreed with the platform team."
        for index in range(lines)
    )


class Fixed:
    def __init__(self, text: str) -> None:
        self.text = text
        self.requests: list[SummaryRequest] = []

    @property
    def model(self) -> str:
        return "test-fixed"

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.requests.append(request)
        return SummaryResult(text=self.text, model=self.model)


def lone_big_block(ws: AgentWorkspace) -> AgentPaths:
    """An agent whose MEMORY.md is one summary block (with pinned facts) of about
    3,900 tokens, made by a compaction under wide budgets."""
    paths = ws.create_agent("alpha")
    for index in range(4):
        append_entry(
            paths.memory, "Human", f"Remember: the config lives at /srv/app/config-{index}.yaml"
        )
    # As compact-now makes it (a summary longer than the turns it replaces).
    made = replace(WIDE, require_shrink=False)
    compact_agent(paths, Fixed(big_summary()), made, count_bytes=CL100K.count_bytes)
    document = parse(paths.memory.read_bytes())
    block = lone_summary(document)
    assert block is not None and parse_summary(block.summary_text).pins
    return paths


def block_tokens(paths: AgentPaths) -> int:
    block = lone_summary(parse(paths.memory.read_bytes()))
    assert block is not None
    return CL100K.count_bytes(block.raw)


def test_a_block_over_its_budget_is_summarized_again_within_it_then_left_alone(
    tmp_path: Path,
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = lone_big_block(ws)
    before = paths.memory.read_bytes()
    old_tokens = block_tokens(paths)
    assert old_tokens > NARROW_CAP + SUMMARY_MARKUP_TOKENS
    assert summary_over_budget(parse(before), NARROW_CAP, CL100K.count_bytes) == old_tokens
    archives = sorted(paths.archive_dir.iterdir())

    builtin = BuiltinSummarizer(CL100K.count_text)
    outcome = compact_agent(paths, builtin, NARROW, count_bytes=CL100K.count_bytes)

    # The old block is archived whole, as any compaction archives what it replaces.
    new_archives = sorted(set(paths.archive_dir.iterdir()) - set(archives))
    assert new_archives == [outcome.archive]
    assert outcome.archive.read_bytes() == before
    # The new block is within the budget and holds the old one's newest lines and pins.
    assert block_tokens(paths) <= NARROW_CAP + SUMMARY_MARKUP_TOKENS
    assert outcome.tokens_before is not None and outcome.tokens_after is not None
    assert outcome.tokens_after < outcome.tokens_before // 4
    new = parse_summary(lone_summary(parse(paths.memory.read_bytes())).summary_text)  # type: ignore[union-attr]
    assert "batch job 149 on queue q149" in expand_groups(new.body)  # lines written as one
    pinned = "\n".join(pin.text for pin in new.pins)
    for index in range(4):
        assert f"/srv/app/config-{index}.yaml" in pinned, new
    assert SlotJournal(paths.journal).read() == {"phase": "idle"}

    # Within its budget now: nothing to compact, as before (no compaction loop).
    with pytest.raises(NothingToCompact) as caught:
        compact_agent(paths, builtin, NARROW, count_bytes=CL100K.count_bytes)
    assert caught.value.reason == "nothing to compact (no raw entries since the last summary)"
    # And the big block under the wide budgets it was made for was never taken again.
    with pytest.raises(NothingToCompact):
        compact_agent(paths, builtin, WIDE, count_bytes=CL100K.count_bytes)


def test_a_block_within_its_budget_is_still_nothing_to_compact(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = lone_big_block(ws)
    before = paths.memory.read_bytes()
    archives = sorted(paths.archive_dir.iterdir())
    summarizer = Fixed("never asked")
    with pytest.raises(NothingToCompact):
        compact_agent(paths, summarizer, WIDE, count_bytes=CL100K.count_bytes)
    assert summarizer.requests == []
    assert paths.memory.read_bytes() == before
    assert sorted(paths.archive_dir.iterdir()) == archives


def test_a_re_summary_still_over_the_budget_is_refused_with_nothing_changed(
    tmp_path: Path,
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = lone_big_block(ws)
    before = paths.memory.read_bytes()
    archives = sorted(paths.archive_dir.iterdir())
    too_long = Fixed(big_summary(60))
    with pytest.raises(SummarizerError, match="over the cap of 500 .*summary block alone"):
        compact_agent(paths, too_long, NARROW, count_bytes=CL100K.count_bytes)
    # The summarizer was given the block alone, with its budget.
    (request,) = too_long.requests
    assert request.max_tokens == NARROW.summary_max_tokens
    assert lone_summary(request.document) is not None
    assert paths.memory.read_bytes() == before
    assert sorted(paths.archive_dir.iterdir()) == archives
    assert sorted(p.name for p in paths.private_dir.iterdir()) == ["journal", "lock"]


def test_an_operators_summary_replaces_a_lone_block_pins_carried_late_turns_drained(
    tmp_path: Path,
) -> None:
    """compact-now --summary: the block is replaced whatever its size (the operator
    said so), archived first; its pinned facts are carried; a turn appended while
    the job ran goes into the new file."""
    ws = AgentWorkspace(tmp_path / "ws")
    paths = lone_big_block(ws)
    before = paths.memory.read_bytes()

    def late_turn(name: str) -> None:
        if name == "new-written":  # the old file, after the new one was written
            append_entry(paths.memory, "Human", "a late turn during the swap")

    outcome = compact_agent(
        paths,
        ProvidedSummary("The operator's own short summary."),
        WIDE,
        count_bytes=CL100K.count_bytes,
        checkpoint=late_turn,
        manual=True,
    )
    assert outcome.archive.read_bytes() == before
    document = parse(paths.memory.read_bytes())
    block = lone_summary(document.prefix(document.entries[0].start + len(document.entries[0].raw)))
    assert block is not None
    parsed = parse_summary(block.summary_text)
    assert parsed.body == "The operator's own short summary."
    pinned = "\n".join(pin.text for pin in parsed.pins)
    assert all(f"/srv/app/config-{i}.yaml" in pinned for i in range(4)), parsed
    assert [entry.text.strip() for entry in document.raw_entries_since_summary()] == [
        "a late turn during the swap"
    ]
    assert SlotJournal(paths.journal).read() == {"phase": "idle"}
    # A file with no summary block and no turn has nothing to replace.
    empty = ws.create_agent("empty")
    with pytest.raises(NothingToCompact):
        compact_agent(empty, ProvidedSummary("x"), WIDE, manual=True)
