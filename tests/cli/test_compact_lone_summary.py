"""``memd compact-now`` on a MEMORY.md that is one summary block over the agent's
threshold (its context window lowered below it): the block is re-summarized by the
configured summarizer (builtin, an LLM), or replaced by ``--summary-file``. Real
subprocesses, real files, a real HTTP model server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.memfiles import AgentWorkspace, swarms_block, swarms_header
from support.openai_server import OpenAITestServer

from memd.core.line_groups import expand_groups
from memd.core.memfile import SUMMARY_PREAMBLE, parse
from memd.core.pins import PINNED_HEADING
from memd.core.plan import lone_summary
from memd.core.prompts import SHORTEN_REQUEST
from memd.core.summary_block import parse_summary

# Threshold 0.9 x 2,000 = 1,800 tokens (726ab50's fixture had the same).
LOWERED = {"MEMD_TRIGGER_CONTEXT_LENGTH": "2000", "MEMD_TRIGGER_THRESHOLD": "0.9"}


def memd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memd", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "MEMD_COMPACTION_DRAIN_QUIET_S": "0.1", **LOWERED, **(env or {})},
    )


def lone_block(tmp_path: Path) -> tuple[AgentWorkspace, Path, str]:
    """alpha's MEMORY.md: one summary block of ~4,000 tokens, with a pinned fact."""
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha")
    body = "Decisions:\n2026-11-30:\n" + "".join(
        f"- Human: We decided to run the batch job {index} on queue q{index}.\n"
        for index in range(300)
    )
    pins = f"{PINNED_HEADING}\n2026-11-30:\n- /srv/app/config.yaml\n"
    block = SUMMARY_PREAMBLE + body + "\n" + pins + "\nmemd-summary: v2"
    paths.memory.write_text(swarms_header("alpha") + swarms_block("System", block))
    return ws, paths.memory, paths.memory.read_text()


def status(ws: AgentWorkspace, state: Path) -> dict[str, Any]:
    result = memd("status", "alpha", "--json", "-w", str(ws.root), "--state-dir", str(state))
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    row: dict[str, Any] = rows[0] if isinstance(rows, list) else rows
    return row


def test_compact_now_re_summarizes_a_lone_block_over_the_threshold(tmp_path: Path) -> None:
    ws, memory, before = lone_block(tmp_path)
    state = tmp_path / "state"
    args = ("-w", str(ws.root), "--state-dir", str(state))
    row = status(ws, state)
    assert row["tokens"] > row["threshold_tokens"], row
    dry = memd("compact-now", "alpha", "--dry-run", *args)
    assert dry.returncode == 0, dry.stderr
    assert "the summary block alone" in dry.stdout and "summarized again" in dry.stdout

    first = memd("compact-now", "alpha", *args)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("alpha: compacted "), first.stdout
    (archive,) = (memory.parent / "archive").iterdir()
    assert archive.read_text() == before
    block = lone_summary(parse(memory.read_bytes()))
    assert block is not None
    parsed = parse_summary(block.summary_text)
    assert "batch job 299 on queue q299" in expand_groups(parsed.body)  # lines written as one
    assert "/srv/app/config.yaml" in "\n".join(pin.text for pin in parsed.pins)
    row = status(ws, state)
    assert row["tokens"] < row["threshold_tokens"], row

    # Within its budget now: nothing to compact, no new archive.
    second = memd("compact-now", "alpha", *args)
    assert second.returncode == 0, second.stderr
    assert (
        second.stdout.strip() == "alpha: nothing to compact (no raw entries since the last summary)"
    )
    assert len(list((memory.parent / "archive").iterdir())) == 1


def test_compact_now_summary_file_replaces_a_lone_block(tmp_path: Path) -> None:
    ws, memory, before = lone_block(tmp_path)
    state = tmp_path / "state"
    summary = tmp_path / "summary.txt"
    summary.write_text("The batch jobs run on their own queues; see the archive.\n")
    summary.chmod(0o600)
    result = memd(
        "compact-now", "alpha", "--summary-file", str(summary),
        "-w", str(ws.root), "--state-dir", str(state),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("alpha: compacted "), result.stdout
    (archive,) = (memory.parent / "archive").iterdir()
    assert archive.read_text() == before
    block = lone_summary(parse(memory.read_bytes()))
    assert block is not None
    parsed = parse_summary(block.summary_text)
    assert parsed.body == "The batch jobs run on their own queues; see the archive."
    assert "/srv/app/config.yaml" in "\n".join(pin.text for pin in parsed.pins)
    # The ledger has it, as any compact-now.
    history = memd("history", "alpha", "--json", "-w", str(ws.root), "--state-dir", str(state))
    assert history.returncode == 0 and "compact-now" in history.stdout, history


def test_compact_now_asks_an_llm_for_the_lone_block_written_shorter(tmp_path: Path) -> None:
    """One request: the block as the summary so far, no turns, the request to write it
    shorter; the reply (shorter, naming words of the block) is accepted by the reply
    check and written."""
    ws, memory, before = lone_block(tmp_path)
    reply = (
        "Decisions:\n- The batch jobs 0 to 299 run each on its own queue (q0 to q299), "
        "decided on 2026-11-30.\n- Job 299 runs on queue q299, the last one set up.\n"
        "Open tasks:\n- none"
    )
    with OpenAITestServer(lambda _body: reply) as server:
        result = memd(
            "compact-now", "alpha", "-w", str(ws.root), "--state-dir", str(tmp_path / "state"),
            env={
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "MEMD_SUMMARIZER_MODEL": "openai/gpt-4o-mini",
                "MEMD_SUMMARIZER_API_BASE": server.api_base,
                "MEMD_SUMMARIZER_API_KEY": "sk-test",
                "MEMD_SUMMARIZER_RETRIES": "0",
            },
        )  # fmt: skip
        requests = list(server.requests)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stdout.startswith("alpha: compacted "), result.stdout
    (request,) = requests
    user = request.messages[-1]["content"]
    assert SHORTEN_REQUEST in user and "batch job 299 on queue q299" in user
    assert "New conversation turns" not in user
    (archive,) = (memory.parent / "archive").iterdir()
    assert archive.read_text() == before
    block = lone_summary(parse(memory.read_bytes()))
    assert block is not None
    parsed = parse_summary(block.summary_text)
    assert parsed.body == reply
    assert "/srv/app/config.yaml" in "\n".join(pin.text for pin in parsed.pins)
