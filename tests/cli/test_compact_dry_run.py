"""``memd compact-now --dry-run [--summarize]``: the plan, and optionally the block, changing nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import run
from support.memfiles import AgentWorkspace, append_entry, snapshot_tree
from support.openai_server import OpenAITestServer


def long_reply(body: dict[str, Any]) -> str:
    prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
    line = "Remember: deploys go through `make ship ENV=prod`"
    kept = f"- {line}" if line in prompt else ""
    return "Decisions:\n" + "- the team keeps the current plan and its owners\n" * 20 + kept


@pytest.fixture
def server() -> Iterator[OpenAITestServer]:
    with OpenAITestServer(responder=long_reply) as test_server:
        yield test_server


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    workspace = AgentWorkspace(tmp_path / "ws")
    paths = workspace.create_agent("alpha", entries=30, size=60)
    append_entry(paths.memory, "Human", "Remember: deploys go through `make ship ENV=prod`.")
    append_entry(paths.memory, "Human", "The runbook is at /srv/ops/runbook.md for now.")
    return workspace


def config(
    tmp_path: Path,
    server: OpenAITestServer,
    max_calls: int = 8,
    keep_recent: int = 0,
    privacy: str = "",
) -> str:
    # keep_recent 0 by default here: the plan's chunks, pins and partial cut are
    # about the whole transcript; the kept tail has its own test.
    path = tmp_path / "memd.toml"
    path.write_text(
        "[trigger]\ncontext_length = 32000\n[summarizer]\n"
        f'model = "openai/test-model"\napi_key = "k"\napi_base = "{server.api_base}"\n'
        f"context_length = 2048\nmax_calls = {max_calls}\nkeep_recent_tokens = {keep_recent}\n"
        + (f"[privacy]\n{privacy}\n" if privacy else "")
    )
    return str(path)


def test_dry_run_shows_the_turns_kept_verbatim(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot_tree(ws.root)
    code, out, err = run(
        capsys,
        "compact-now",
        "alpha",
        "--dry-run",
        "--workspace",
        str(ws.root),
        "--config",
        config(tmp_path, server, keep_recent=-1),  # a tenth of the threshold (28,800)
    )
    assert code == 0, err
    flat = " ".join(out.split())
    assert "recent turns 2,8" in flat  # a tenth, shrunk a little to fit the header
    kept = int(flat.split("kept verbatim after the summary: ")[1].split()[0])
    summarized = int(flat.split("tokens; ")[1].split()[0])
    assert kept > 0 and kept + summarized == 32
    assert snapshot_tree(ws.root) == before and server.requests == []


def test_dry_run_prints_the_plan_and_calls_nothing(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot_tree(ws.root)
    code, out, err = run(
        capsys,
        "compact-now",
        "alpha",
        "--dry-run",
        "--workspace",
        str(ws.root),
        "--config",
        config(tmp_path, server, max_calls=2),
    )
    assert code == 0, err
    assert server.requests == []
    assert snapshot_tree(ws.root) == before
    assert "alpha: dry run (calls no model, writes nothing)" in out
    assert "32 raw turn(s)" in out
    assert "pinned facts: 2 (marked 1, path 1)" in out
    assert "window 2,048 tokens (from summarizer.context_length)" in out
    assert "2 call(s) for " in out and "partial: only bytes 0.." in out


def test_dry_run_summarize_shows_the_block_and_its_retention(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot_tree(ws.root)
    code, out, err = run(
        capsys,
        "compact-now",
        "alpha",
        "--dry-run",
        "--summarize",
        "--workspace",
        str(ws.root),
        "--config",
        config(tmp_path, server, max_calls=50),
    )
    assert code == 0, err
    assert len(server.requests) > 1  # chunked: every turn read
    assert snapshot_tree(ws.root) == before
    # The model kept the marked line itself; memd pins the path it dropped.
    assert "the reply itself kept 1 of 2 pinned facts (50 %); 1 more are pinned" in out
    assert "[Compressed Memory Summary]" in out and "- /srv/ops/runbook.md" in out


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_dry_run_summarize_pins_an_email_address_as_a_compaction_would(
    ws: AgentWorkspace,
    tmp_path: Path,
    server: OpenAITestServer,
    capsys: pytest.CaptureFixture[str],
    remote: bool,
) -> None:
    """Whole for a summarizer that read it as written; not at all (nor as a
    placeholder) when personal data was redacted on the way out."""
    address = "ops-lead@example.org"
    append_entry(ws.root / "agents" / "alpha" / "MEMORY.md", "Human", f"Mail {address} weekly.")
    code, out, err = run(
        capsys,
        "compact-now",
        "alpha",
        "--dry-run",
        "--summarize",
        "--workspace",
        str(ws.root),
        "--config",
        config(tmp_path, server, max_calls=50, privacy="redact_local = true" if remote else ""),
    )
    assert code == 0, err
    block = out.split("[Compressed Memory Summary]", 1)[1]
    if remote:
        assert address not in block and "[REDACTED:email#" not in block
    else:
        assert f"- {address}" in block


def test_summarize_needs_dry_run(ws: AgentWorkspace, capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run(
        capsys, "compact-now", "alpha", "--summarize", "--workspace", str(ws.root)
    )
    assert code != 0 and "--summarize only goes with --dry-run" in err


def test_dry_run_counts_turns_separated_by_empty_lines(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """An editor's (or a writer's) empty line after each terminator merged every
    turn into the one before it: 32 turns were planned as one (review s9pins)."""
    memory = ws.paths("alpha").memory
    data = memory.read_bytes()
    memory.write_bytes(data.replace(b"\n\n---\n\n### ", b"\n\n---\n\n\n\n### "))
    code, out, err = run(
        capsys,
        "compact-now",
        "alpha",
        "--dry-run",
        "--workspace",
        str(ws.root),
        "--config",
        config(tmp_path, server, keep_recent=-1),
    )
    assert code == 0, err
    flat = " ".join(out.split())
    kept = int(flat.split("kept verbatim after the summary: ")[1].split()[0])
    summarized = int(flat.split("tokens; ")[1].split()[0])
    assert kept > 0 and kept + summarized == 32


def test_a_refused_descriptor_is_said_before_the_plan(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """compact-now took the config's window without a word when the agent's
    memd-agent.json was refused (only the daemon logged why)."""
    (ws.root / "agents/alpha/memd-agent.json").write_text(
        '{"format": "memd-agent", "version": 1, "context_length": -5}'
    )
    code, out, err = run(
        capsys,
        "compact-now",
        "alpha",
        "--dry-run",
        "--workspace",
        str(ws.root),
        "--config",
        config(tmp_path, server),
    )
    assert code == 0, err
    assert err.splitlines() == [
        "memd: warning: agent 'alpha': memd-agent.json: context_length must be a positive "
        "integer: ignored, the config's window applies (memd doctor)"
    ]
    assert "alpha: dry run" in out


def test_compact_now_says_when_no_compaction_can_bring_an_agent_under(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha", entries=3)
    cfg = tmp_path / "memd.toml"
    cfg.write_text("[trigger]\nmax_tokens = 40\n")
    code, _out, err = run(
        capsys,
        "compact-now",
        "alpha",
        "--dry-run",
        "--workspace",
        str(ws.root),
        "--config",
        str(cfg),
    )
    assert code == 0, err
    assert err.splitlines() == [
        "memd: warning: agent 'alpha': threshold 40 tokens (window 200000) leaves a low-water "
        "mark of 24, under the 416 a summary block needs: no compaction brings it under its "
        "threshold (memd doctor)"
    ]


def test_dry_run_summarize_shows_the_lines_the_reply_left_out_as_a_compaction_would(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    decision = "We decided to move the kalvoren queue to the managed broker."
    append_entry(ws.root / "agents" / "alpha" / "MEMORY.md", "Human", decision)
    code, out, err = run(
        capsys,
        "compact-now",
        "alpha",
        "--dry-run",
        "--summarize",
        "--workspace",
        str(ws.root),
        "--config",
        config(tmp_path, server, max_calls=50),
    )
    assert code == 0, err
    assert "decision/task/error/person line(s) it left out are kept verbatim" in out
    assert f"- Human: {decision}" in out.split("Said earlier (verbatim):", 1)[1]


def test_dry_run_summarize_pins_no_credential_said_bare_as_a_compaction_would(
    ws: AgentWorkspace, tmp_path: Path, server: OpenAITestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "api key: 3fa9…" in one turn, "rotate the secret key 3fa9…" in another: a
    compaction with a redacted summarizer pins no 3fa9… (r11carry); nor does the
    block the dry run shows."""
    value = "3fa9c0d1e2f3a4b5c6d7e8f9a0b1c2d3"
    memory = ws.root / "agents" / "alpha" / "MEMORY.md"
    append_entry(memory, "Human", f"We decided the api key: {value} stays for staging.")
    append_entry(memory, "Human", f"TODO: rotate the secret key {value} after the migration.")
    code, out, err = run(
        capsys,
        "compact-now",
        "alpha",
        "--dry-run",
        "--summarize",
        "--workspace",
        str(ws.root),
        "--config",
        config(tmp_path, server, max_calls=50, privacy="redact_local = true"),
    )
    assert code == 0, err
    assert "Pinned facts" in out and value not in out
