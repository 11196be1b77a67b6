"""Through the real compaction path (compact-now in process, a scripted OpenAI server):
what a plausible summary naming nothing drops of the decisions, open tasks, errors and
people is carried verbatim in MEMORY.md, compaction after compaction."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.memfiles import AgentWorkspace, append_entry
from support.openai_server import OpenAITestServer
from support.tokens import CL100K

from memd.cli.app import main
from memd.compaction import CompactionOptions, compact_agent
from memd.core.memfile import parse
from memd.core.summary import SummaryRequest, SummaryResult
from memd.core.summary_block import parse_summary

# A model's summary that reads well and names nothing (the retention bench's "lossy").
LOSSY = (
    "Goals:\n- Keep the ingestion pipeline healthy and finish the migration.\n"
    "Decisions:\n- The team agreed on several configuration changes.\n"
    "Facts:\n- Several services, dashboards and owners were discussed.\n"
    "Open tasks:\n- Follow up on load tests.\nErrors:\n- Some workers had connection issues."
)
# The section's heading (memd.core.carried_lines.CARRIED_HEADING), spelled out: this
# file must import nothing the change added, so it runs (red) without it.
HEADING = "Said earlier (verbatim):"
FILLER = (
    "I'll start by reading the current configuration and the recent logs, then compare "
    "the two result sets on the sampled rows and check the worker health endpoints."
)


def batch(code: str) -> list[tuple[str, str]]:
    """A session's turns with one decision, open task, error and person named by ``code``."""
    dump = [json.dumps({"id": i, "status": "pending", "worker": f"w{i}"}) for i in range(30)]
    dump.insert(15, f"ERROR worker {code}w: connection reset by peer while flushing the batch")
    return [
        ("Human", f"Thanks. We decided to move the {code}q queue to the managed broker."),
        ("Research-Agent", FILLER),
        ("Research-Agent", f"TODO: the {code}x exporter still needs a load test before we ship."),
        ("Tool Executor", "Tool Output:\n" + "\n".join(dump)),
        ("Human", f"Our contact on the vendor side is Priya {code.title()}son."),
        *[("Research-Agent", FILLER) for _ in range(6)],
    ]


def keys(code: str) -> tuple[str, ...]:
    return (f"{code}q queue", f"{code}x exporter", f"{code}w:", f"Priya {code.title()}son")


@pytest.fixture
def server() -> Iterator[OpenAITestServer]:
    replies = {"text": LOSSY}

    def respond(_body: dict[str, Any]) -> str:
        return replies["text"]

    with OpenAITestServer(responder=respond) as running:
        running.replies = replies  # type: ignore[attr-defined]
        yield running


def compact(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer, model: str, extra: str = ""
) -> str:
    config = tmp_path / "memd.toml"
    config.write_text(
        f'workspace = "{ws.root}"\n\n[trigger]\ncontext_length = 32000\n\n[summarizer]\n'
        f'model = "{model}"\napi_base = "{server.api_base}"\napi_key = "sk-test"\n'
        f"context_length = 8192\nkeep_recent_tokens = 0\n{extra}\n"
        "[compaction]\ndrain_quiet_s = 0.05\n"
    )
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["compact-now", "alpha", "--config", str(config), "--state-dir", str(tmp_path)])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    assert code == 0, err.getvalue()
    return out.getvalue()


def append(ws: AgentWorkspace, turns: list[tuple[str, str]]) -> None:
    for role, text in turns:
        append_entry(ws.paths("alpha").memory, role, text)


def block_of(ws: AgentWorkspace) -> tuple[str, str]:
    """(the summary block's text, the MEMORY.md text)."""
    data = ws.paths("alpha").memory.read_bytes()
    return parse(data).entries[0].summary_text, data.decode()


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    workspace = AgentWorkspace(tmp_path / "ws")
    workspace.create_agent("alpha")
    return workspace


def test_a_lossy_model_no_longer_loses_decisions_tasks_errors_and_people(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer
) -> None:
    codes = ("kalvo", "mirta", "zenor")
    for code in codes:
        append(ws, batch(code))
        out = compact(ws, tmp_path, server, "openai/test-model")
        assert "line(s) the summary left out kept verbatim" in out, out
    summary, memory = block_of(ws)
    for code in codes:
        for key in keys(code):
            assert key in memory, key
    parsed = parse_summary(summary)
    assert parsed.version == 2 and parsed.body == LOSSY
    assert memory.count(HEADING) == 1 and memory.index(LOSSY) < memory.index(HEADING)


def test_a_line_the_next_reply_keeps_leaves_the_section(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer
) -> None:
    append(ws, batch("kalvo"))
    compact(ws, tmp_path, server, "openai/test-model")
    server.replies["text"] = LOSSY + "\n- Decided: the kalvoq queue moves to the managed broker."  # type: ignore[attr-defined]
    append(ws, [("Human", "Thanks, keep going."), ("Research-Agent", FILLER)] * 4)
    compact(ws, tmp_path, server, "openai/test-model")
    summary, memory = block_of(ws)
    section = summary[summary.index(HEADING) :]
    assert "kalvoq" not in section and "kalvoq queue" in memory
    assert "kalvox exporter" in section and "kalvow:" in section and "Kalvoson" in section


def test_the_builtin_summary_takes_the_carried_lines_into_its_own_sections(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer
) -> None:
    append(ws, batch("kalvo"))
    compact(ws, tmp_path, server, "openai/test-model")
    append(ws, [("Human", "Thanks, keep going."), ("Research-Agent", FILLER)] * 4)
    compact(ws, tmp_path, server, "builtin")
    summary, memory = block_of(ws)
    assert HEADING not in memory
    for key in keys("kalvo"):
        assert key in parse_summary(summary).body, key


def test_credentials_are_never_carried(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer
) -> None:
    append(ws, batch("kalvo"))
    append(
        ws,
        [
            ("Human", "We decided the deploy token is ghp_abcdefghijklmnopqrstuvwxyz0123456789."),
            ("Human", "We decided to set\npassword: Tr0ub4dor-3horse\nfor the staging database."),
        ],
    )
    compact(ws, tmp_path, server, "openai/test-model")
    _summary, memory = block_of(ws)
    assert "ghp_" not in memory and "Tr0ub4dor" not in memory
    assert "deploy token" not in memory and "REDACTED" not in memory
    assert "kalvoq queue" in memory


def test_the_block_stays_under_its_cap_with_many_lines(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer
) -> None:
    """A small agent: its summary and pinned budgets leave room for some lines only;
    the newest are kept and the compaction is not refused as over the cap."""
    for index in range(12):
        append(ws, batch(f"c{index:02d}a"))
    budgets = "summary_tokens = 200\npinned_tokens = 300\n"
    out = compact(ws, tmp_path, server, "openai/test-model", budgets)
    kept = int(out.split(" line(s) the summary left out")[0].rsplit("; ", 1)[1])
    assert 0 < kept < 4 * 12, out
    _summary, memory = block_of(ws)
    assert "c11aq queue" in memory and "c00aq queue" not in memory


def forget(ws: AgentWorkspace, tmp_path: Path, pattern: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    args = ["forget", "alpha", "--match", pattern, "--yes", "-w", str(ws.root)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([*args, "--state-dir", str(tmp_path)])
        except SystemExit as exc:
            assert exc.code == 0, err.getvalue()


@pytest.mark.parametrize(
    ("pattern", "said"),
    [
        ("kalvoq queue", "kalvoq"),
        # Line-anchored: it takes the raw turn whose line opens so; the carried
        # "- Research-Agent: TODO: the kalvox …" must go with it (r11carry: kept).
        (r"^TODO: the kalvox", "kalvox"),
        (r"^ERROR worker kalvow", "kalvow"),
        (r"^Our contact on the vendor side is Priya", "Kalvoson"),
        (r"vendor side is Priya Kalvoson\.$", "Kalvoson"),
    ],
)
def test_forget_match_erases_a_carried_line_as_it_erases_the_turn(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer, pattern: str, said: str
) -> None:
    append(ws, batch("kalvo"))
    compact(ws, tmp_path, server, "openai/test-model")
    summary, _memory = block_of(ws)
    assert said in summary[summary.index(HEADING) :]
    forget(ws, tmp_path, pattern)
    paths = ws.paths("alpha")
    left = [p.name for p in [paths.memory, *paths.archive_dir.iterdir()] if said in p.read_text()]
    assert left == []
    assert "kalvoq" in block_of(ws)[1] or said == "kalvoq"  # the other lines stay


class _Fixed:
    """A model that answers ``text`` to every request."""

    model = "test-fixed"

    def __init__(self, text: str) -> None:
        self.text = text

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(text=self.text, model=self.model)


def test_a_daemon_compaction_carries_only_what_keeps_the_file_shrinking(tmp_path: Path) -> None:
    """A model that named twelve decisions, then rewords them away, a few short
    turns later: carrying all twelve made the block larger than what it replaces,
    and the daemon refused it as not shrinking the file after paying for the
    reply (r11carry), at every try until enough turns came. The carried lines
    give way instead; the reply and the pins never do."""
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha")
    for index in range(30):
        append_entry(paths.memory, "Human", f"Some chatter, number {index}, about lunch today.")
    detailed = "Decisions:\n" + "\n".join(
        f"- We decided to move the q{i}kalvo queue to broker b{i}zenor after the load test."
        for i in range(12)
    )
    goals = "Goals:\n- " + "Keep the pipeline healthy and the team informed. " * 4
    vague = goals + "\nDecisions:\n- Several queues move to new brokers after load tests."
    options = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, drain_max_s=2)
    made = dataclasses.replace(options, require_shrink=False)  # as compact-now makes it
    compact_agent(paths, _Fixed(detailed), made, count_bytes=CL100K.count_bytes)
    for index in range(3):
        append_entry(paths.memory, "Human", f"Thanks, carry on with step {index} of the plan.")
    before = paths.memory.stat().st_size
    outcome = compact_agent(paths, _Fixed(vague), options, count_bytes=CL100K.count_bytes)
    assert paths.memory.stat().st_size < before
    memory = paths.memory.read_text()
    assert outcome.carried >= 6 and memory.count("kalvo queue to broker") == outcome.carried
    assert "q11kalvo" in memory  # the newest mention kept (all undated: the latest lines)


@pytest.mark.parametrize("privacy", ["", "[privacy]\nredact_local = true\n"])
def test_a_credential_value_said_again_bare_is_not_carried(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer, privacy: str
) -> None:
    """A value its context gives away once ("api key: 3fa9…") and later said bare
    ("rotate the secret key 3fa9…"): a reply is searched for such values only
    when its model saw the turns as written (a model sent placeholders cannot
    repeat one), but a carried line is copied from the turns as written, for
    either. With a redacted (remote) summarizer the bare value was carried into
    MEMORY.md (r11carry)."""
    value = "3fa9c0d1e2f3a4b5c6d7e8f9a0b1c2d3"
    append(ws, batch("kalvo"))
    append(
        ws,
        [
            ("Human", f"We decided the api key: {value} stays for the staging cluster."),
            ("Human", f"TODO: rotate the secret key {value} after the zenorq migration."),
        ],
    )
    compact(ws, tmp_path, server, "openai/test-model", privacy)
    summary, memory = block_of(ws)
    carried = "\n".join(line.text for line in parse_summary(summary).carried)
    assert value not in carried and "zenorq" not in carried
    assert "kalvoq queue" in carried
    # Nor pinned (as a commit id) from the turn that says it bare.
    assert value not in memory
