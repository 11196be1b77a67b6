"""A state dir that is a file (or under one): every command that uses the state
dir refuses it in one line naming the path (exit 2), the daemon does not start,
and nothing is written; doctor says it as its `fail state dir`. Each command fell
back to a temporary in-memory state DB (which a daemon's `memd status` and
`memd health` never see), or failed on the audit log or recall index with a bare
'Not a directory'; `memd run` ran so, with neither audit log nor recall."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run
from support.memfiles import AgentWorkspace, snapshot_tree

COMMANDS = [
    ["status"],
    ["status", "alpha", "--json"],
    ["compact-now", "alpha", "--summary", "the ledger"],
    ["recall", "alpha", "ledger"],
    ["recall", "--reindex"],
    ["health"],
    ["history", "alpha"],
    ["audit"],
    ["prune"],
    ["forget", "alpha", "--yes"],
    ["forget", "alpha", "--match", "ledger", "--yes"],
    ["reload"],
]


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    workspace = AgentWorkspace(tmp_path / "ws")
    workspace.create_agent("alpha", entries=30)
    return workspace


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_state_dir_that_is_a_file_is_refused_in_one_line_naming_it(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    ws: AgentWorkspace,
    command: list[str],
) -> None:
    monkeypatch.setenv("MEMD_COMPACTION_DRAIN_QUIET_S", "0.1")
    state = tmp_path / "state.sqlite3"
    state.write_text("not a folder\n")
    before = snapshot_tree(tmp_path)
    code, _, err = run(capsys, *command, "-w", str(ws.root), "--state-dir", str(state))
    assert code == 2, err
    (line,) = err.splitlines()
    assert line == (
        f"memd: error: state dir {state} is a regular file, not a folder (from --state-dir); "
        "name a folder memd may create or use (--state-dir, MEMD_STATE_DIR or state_dir in "
        "the config)"
    )
    assert snapshot_tree(tmp_path) == before  # nothing written, nothing erased


def test_a_state_dir_under_a_file_names_the_file(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    ws: AgentWorkspace,
) -> None:
    (tmp_path / "state").write_text("not a folder\n")
    monkeypatch.setenv("MEMD_STATE_DIR", str(tmp_path / "state" / "memd"))
    code, _, err = run(capsys, "status", "-w", str(ws.root))
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith(
        f"memd: error: state dir {tmp_path / 'state' / 'memd'}: {tmp_path / 'state'} is a "
        "regular file, not a folder (from MEMD_STATE_DIR)"
    ), line


def test_the_daemon_does_not_start_on_a_state_dir_that_is_a_file(
    tmp_path: Path, ws: AgentWorkspace
) -> None:
    state = tmp_path / "state"
    state.write_text("not a folder\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    proc = subprocess.run(
        [sys.executable, "-m", "memd", "run", "-w", str(ws.root), "--state-dir", str(state)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # it ran until stopped
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"memd: error: state dir {state} is a regular file, not a folder")
    assert not (ws.root / ".memd-recall.sock").exists()
    assert state.read_text() == "not a folder\n"


def test_doctor_fails_its_state_dir_check_naming_it_and_checks_the_rest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, ws: AgentWorkspace
) -> None:
    import json

    state = tmp_path / "state"
    state.write_text("not a folder\n")
    args = ["doctor", "--offline", "--json", "-w", str(ws.root), "--state-dir", str(state)]
    code, out, _ = run(capsys, *args)
    assert code == 1
    checks = {check["name"]: check for check in json.loads(out)["checks"]}
    assert checks["state dir"]["status"] == "fail"
    assert checks["state dir"]["message"] == f"state dir {state} is a regular file, not a folder"
    failed = [name for name, check in checks.items() if check["status"] == "fail"]
    assert failed == ["state dir"]  # the redaction key is not a second, cryptic failure
    assert checks["workspace"]["status"] == "ok"
