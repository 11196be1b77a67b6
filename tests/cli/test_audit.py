"""``memd audit``: compactions are recorded without content; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run
from support.memfiles import AgentWorkspace, append_entry

from memd.audit import AuditLog, audit_path
from memd.core.audit import AuditEvent

SECRET = "sk-proj-Zq8wR2vT5yU1iO9pA3sD6fG4hJ7kL0xC"
FACT = "the launch code word is periwinkle-ostrich"


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    workspace = AgentWorkspace(tmp_path / "ws")
    workspace.create_agent("alpha", entries=12)
    workspace.create_agent("beta", entries=12)
    return workspace


def test_compaction_is_audited_and_the_log_holds_no_content(
    ws: AgentWorkspace,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Twelve short turns are far below the turns kept verbatim by default (a
    # tenth of the 180,000-token default threshold): keep none, so beta compacts.
    monkeypatch.setenv("MEMD_SUMMARIZER_KEEP_RECENT_TOKENS", "0")
    memory = ws.paths("alpha").memory
    append_entry(memory, "Human", f"my key is {SECRET} and {FACT}")
    append_entry(memory, "AI", f"noted: {FACT}")
    common = ["--workspace", str(ws.root), "--state-dir", str(state_dir)]
    code, out, err = run(capsys, "compact-now", "alpha", "--summary", f"{FACT} {SECRET}", *common)
    assert code == 0, err
    code, out, err = run(capsys, "compact-now", "beta", *common)
    assert code == 0, err

    raw = audit_path(state_dir, ws.root).read_bytes()
    assert raw.count(b"\n") == 2
    for planted in (SECRET, FACT, "periwinkle", "Zq8wR2vT5yU1", "launch code"):
        assert planted.encode() not in raw
    archive = next(ws.paths("alpha").archive_dir.iterdir())
    assert SECRET.encode() in archive.read_bytes()  # the planted text really was compacted

    code, out, err = run(capsys, "audit", "alpha", "--json", *common)
    assert code == 0, err
    payload = json.loads(out)
    (record,) = payload["records"]
    assert record["event"] == "compaction" and record["agent"] == "alpha"
    assert record["trigger"] == "manual" and record["actor"] == "cli"
    assert record["model"] == "provided" and record["remote"] is False
    assert record["archive"] == archive.name
    assert record["tokens_before"] > record["tokens_after"] > 0

    code, out, err = run(capsys, "audit", *common)
    assert code == 0, err
    assert "compaction" in out and "alpha" in out and "beta" in out


def test_audit_keeps_records_of_agents_that_no_longer_exist(
    ws: AgentWorkspace, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    AuditLog.for_workspace(state_dir, ws.root, "cli").record(
        AuditEvent.ERASURE, "gone", files=4, trigger="cli"
    )
    code, out, err = run(
        capsys,
        "audit",
        "gone",
        "--json",
        "--workspace",
        str(ws.root),
        "--state-dir",
        str(state_dir),
    )
    assert code == 0, err
    assert json.loads(out)["records"][0]["files"] == 4


def test_empty_log_and_limit(
    ws: AgentWorkspace, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--workspace", str(ws.root), "--state-dir", str(state_dir)]
    code, out, _ = run(capsys, "audit", *common)
    assert code == 0 and "no audit records" in out
    log = AuditLog.for_workspace(state_dir, ws.root, "cli")
    for n in range(5):
        log.record(AuditEvent.PRUNE, "alpha", archives=n)
    code, out, _ = run(capsys, "audit", "alpha", "-n", "2", "--json", *common)
    assert [r["archives"] for r in json.loads(out)["records"]] == [3, 4]


def test_newer_and_torn_lines_are_skipped_with_a_warning(
    ws: AgentWorkspace, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = AuditLog.for_workspace(state_dir, ws.root, "cli")
    log.record(AuditEvent.PRUNE, "alpha", archives=1)
    assert log.path is not None
    with log.path.open("ab") as handle:
        handle.write(b'{"v":7,"ts":"2030-01-01T00:00:00Z","event":"future"}\n{"v":1,"ts')
    code, out, err = run(
        capsys, "audit", "--json", "--workspace", str(ws.root), "--state-dir", str(state_dir)
    )
    assert code == 0
    assert len(json.loads(out)["records"]) == 1
    assert "1 audit record(s) in a newer format" in err
    assert "1 unreadable line(s)" in err


@pytest.mark.parametrize("name", ["../etc", "a/b", ".hidden"])
def test_bad_agent_name_is_one_line(
    ws: AgentWorkspace, state_dir: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    code, _out, err = run(
        capsys, "audit", name, "--workspace", str(ws.root), "--state-dir", str(state_dir)
    )
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("memd: error: invalid agent name")
    assert "Traceback" not in err


def test_a_mistyped_workspace_is_said_not_an_empty_log(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """review16e: `memd audit --workspace /nonexistent` exited 0 with "no audit
    records in …"; every other command says the workspace does not exist."""
    missing = tmp_path / "nonexistent"
    code, out, err = run(capsys, "audit", "--workspace", str(missing), "--state-dir", str(tmp_path))
    assert (code, out) == (2, "")
    assert err == f"memd: error: workspace {missing} does not exist\n"
