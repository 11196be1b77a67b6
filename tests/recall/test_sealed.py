"""Recall with archives encrypted at rest: the index holds no text of such an agent
(issue 12 item 4), and recall/status say so clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run
from support.memfiles import AgentWorkspace, append_entry

from memd.archive_crypto import generate_master_key
from memd.compaction import CompactionOptions, ProvidedSummary, compact_agent
from memd.recall.index import RecallIndex, RecallSealed, recall_db_path
from memd.workspace import AgentPaths

PLANTED = "xylophonic kalomiren report"


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "master.key"
    generate_master_key(path)
    return path


def compact(paths: AgentPaths, key_file: Path | None) -> Path:
    options = CompactionOptions(drain_quiet_s=0.05, drain_max_s=1.0, key_file=key_file)
    return compact_agent(paths, ProvidedSummary("Summary."), options, manual=True).archive


def db_bytes(state_dir: Path, ws: AgentWorkspace) -> bytes:
    path = recall_db_path(state_dir, ws.root)
    return b"".join(
        Path(f"{path}{suffix}").read_bytes()
        for suffix in ("", "-wal", "-shm", "-journal")
        if Path(f"{path}{suffix}").exists()
    )


def test_rows_of_an_agent_whose_archives_become_encrypted_are_dropped_and_scrubbed(
    ws: AgentWorkspace, state_dir: Path, key_file: Path
) -> None:
    alpha, beta = ws.create_agent("alpha", entries=2), ws.create_agent("beta", entries=2)
    for index in range(50):
        append_entry(alpha.memory, "Human", f"{PLANTED} number {index}")
    append_entry(beta.memory, "Human", "beta keeps its zanzibarite")
    compact(alpha, None)  # a plain archive, indexed as before
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(alpha)
        index.sync_agent(beta)
        assert index.search("alpha", "kalomiren")
    assert b"kalomiren" in db_bytes(state_dir, ws)

    append_entry(alpha.memory, "Human", "a later turn about the kalomiren report")
    compact(alpha, key_file)  # encryption turned on: the next archive is sealed
    with RecallIndex.open(state_dir, ws.root) as index:
        report = index.sync_agent(alpha)
        assert report.sealed and report.removed
        assert "encrypted at rest" in report.describe()
        with pytest.raises(RecallSealed, match="recall is off: its archives are encrypted"):
            index.search("alpha", "kalomiren")
        # Other agents are untouched.
        index.sync_agent(beta)
        assert index.search("beta", "zanzibarite")
        assert index.agents() == ["beta"]
    data = db_bytes(state_dir, ws)
    assert b"kalomiren" not in data and b"xylophonic" not in data
    assert b"zanzibarite" in data


def test_with_encryption_on_no_agent_is_indexed(
    ws: AgentWorkspace, state_dir: Path, key_file: Path
) -> None:
    alpha = ws.create_agent("alpha", entries=2)
    append_entry(alpha.memory, "Human", PLANTED)
    with RecallIndex.open(state_dir, ws.root) as index:
        index.encrypting = True
        assert index.sync_agent(alpha).sealed
        index.sync_agent(alpha)  # again: still nothing indexed
        assert index.stats() == {"sources": 0, "entries": 0}
        with pytest.raises(RecallSealed):
            index.search("alpha", "kalomiren")
    assert b"kalomiren" not in db_bytes(state_dir, ws)


def test_recall_and_status_say_why_for_an_encrypted_agent(
    ws: AgentWorkspace,
    state_dir: Path,
    key_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    alpha = ws.create_agent("alpha", entries=3)
    append_entry(alpha.memory, "Human", PLANTED)
    compact(alpha, key_file)
    ws.create_agent("beta", entries=1)
    config = tmp_path / "memd.toml"
    config.write_text(f'[privacy]\nencrypt_archives = true\nkey_file = "{key_file}"\n')
    common = ["-w", str(ws.root), "-c", str(config), "--state-dir", str(state_dir)]

    code, out, err = run(capsys, "recall", "alpha", "kalomiren", *common)
    assert code == 3 and out == ""
    assert err.count("\n") == 1
    assert "recall is off: its archives are encrypted at rest" in err
    assert "memd archive cat alpha NAME" in err

    code, out, err = run(capsys, "status", "--json", *common)
    assert code == 0, err
    rows = {row["agent"]: row for row in json.loads(out)}
    assert rows["alpha"]["archives"] == 1 and rows["alpha"]["encrypted_archives"] == 1
    assert rows["alpha"]["recall"] == "off"
    assert rows["beta"]["recall"] == "off"  # encryption is on for the workspace

    # Encryption turned off again: beta is indexed, alpha (sealed archives) still not.
    plain = ["-w", str(ws.root), "--state-dir", str(state_dir)]
    code, out, err = run(capsys, "status", "--json", *plain)
    rows = {row["agent"]: row for row in json.loads(out)}
    assert rows["alpha"]["recall"] == "off" and rows["beta"]["recall"] == "on"
    code, out, err = run(capsys, "recall", "alpha", "kalomiren", *plain)
    assert code == 3 and "encrypted at rest" in err
