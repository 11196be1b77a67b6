"""``memd prune``: applies the policy now, audited, recall rows gone; bad input is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import run
from support.memfiles import AgentWorkspace, append_entry
from support.other_uid import NOBODY, can_switch_uid, reachable_tmp

from memd.audit import audit_path, read_audit
from memd.recall.index import RecallIndex, recall_db_path

DAY = 86_400.0


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    workspace = AgentWorkspace(tmp_path / "ws")
    for name in ("alpha", "beta"):
        workspace.create_agent(name, entries=3)
    return workspace


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "memd.toml"
    path.write_text(text)
    return path


def compact(capsys: pytest.CaptureFixture[str], common: list[str], agent: str, fact: str) -> Path:
    ws_root = Path(common[common.index("-w") + 1])
    memory = ws_root / "agents" / agent / "MEMORY.md"
    append_entry(memory, "Human", f"{agent}: {fact}")
    code, _out, err = run(capsys, "compact-now", agent, "--summary", "Old talk.", *common)
    assert code == 0, err
    return max((ws_root / "agents" / agent / "archive").iterdir())


def age(path: Path, days: float) -> None:
    when = time.time() - days * DAY
    os.utime(path, (when, when))


def test_prune_deletes_audits_and_drops_recall_rows(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    # Compacted with no retention set; the policy comes later (as an operator adds it).
    before = [
        "-w",
        str(ws.root),
        "--state-dir",
        str(state_dir),
        "-c",
        str(write_config(tmp_path, "")),
    ]
    old = compact(capsys, before, "alpha", "the zanthorp ledger sits in vault nine")
    new = compact(capsys, before, "alpha", "the quillmoss plan is on the wiki")
    assert old != new
    age(old, 45)
    config = write_config(tmp_path, "[retention]\nmax_age_days = 30\n")
    common = ["-w", str(ws.root), "--state-dir", str(state_dir), "-c", str(config)]
    with RecallIndex.open(state_dir, ws.root) as index:
        assert index.search("alpha", "zanthorp")

    code, out, err = run(capsys, "prune", "alpha", "--dry-run", *common)
    assert code == 0, err
    assert "alpha: would delete 1 archive(s)" in out and old.name in out and "max_age_days" in out
    assert old.exists()
    # What it would keep, not what is there now (review r8docs F6: "2 kept").
    code, out, err = run(capsys, "prune", "alpha", "--dry-run", "--json", *common)
    assert code == 0 and json.loads(out)["agents"][0]["kept"] == 1, out

    code, out, err = run(capsys, "prune", "alpha", *common)
    assert code == 0, err
    assert "alpha: deleted 1 archive(s)" in out and old.name in out
    assert not old.exists() and new.exists()
    with RecallIndex.open(state_dir, ws.root) as index:
        assert not index.search("alpha", "zanthorp")  # the pruned archive's rows are gone
        assert index.search("alpha", "quillmoss")
    # Scrubbed: the pruned text is not left in the index file's free pages or WAL.
    db = recall_db_path(state_dir, ws.root)
    for leftover in (db, db.with_name(db.name + "-wal")):
        if leftover.exists():
            assert b"zanthorp" not in leftover.read_bytes()

    records = [r for r in read_audit(audit_path(state_dir, ws.root)).records if r.event == "prune"]
    assert len(records) == 1
    (record,) = records
    assert record.agent == "alpha" and record.actor == "cli"
    assert record.fields["trigger"] == "cli" and record.fields["archives"] == 1
    assert record.fields["names"] == (old.name,) and record.fields["reasons"] == ("max_age_days",)
    raw = audit_path(state_dir, ws.root).read_bytes()
    assert b"zanthorp" not in raw and b"vault" not in raw

    code, out, _ = run(capsys, "prune", "alpha", *common)
    assert code == 0 and "alpha: nothing to prune" in out


def test_per_agent_limits_and_json(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, '[agents."al*"]\nmax_archives = 1\n')
    for name in ("alpha", "beta"):
        archive_dir = ws.paths(name).archive_dir
        archive_dir.mkdir()
        for day in (1, 2, 3):
            (archive_dir / f"history_2026-01-0{day}_10-00-00.md").write_text("raw")
    common = ["-w", str(ws.root), "--state-dir", str(state_dir), "-c", str(config)]
    code, out, err = run(capsys, "prune", "--json", *common)
    assert code == 0, err
    report = {a["agent"]: a for a in json.loads(out)["agents"]}
    assert report["alpha"]["deleted"] == [
        "history_2026-01-01_10-00-00.md",
        "history_2026-01-02_10-00-00.md",
    ]
    assert report["alpha"]["limits"] == "at most 1 archives"
    assert report["beta"] == {"agent": "beta", "limits": None, "deleted": [], "bytes": 0}
    assert len(list(ws.paths("beta").archive_dir.iterdir())) == 3


def test_compact_now_applies_retention_and_says_so(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, "[retention]\nmax_archives = 1\n")
    archive_dir = ws.paths("alpha").archive_dir
    archive_dir.mkdir()
    (archive_dir / "history_2020-01-01_10-00-00.md").write_text("raw")
    common = ["-w", str(ws.root), "--state-dir", str(state_dir), "-c", str(config)]
    code, out, err = run(capsys, "compact-now", "alpha", "--summary", "Old talk.", *common)
    assert code == 0, err
    assert "pruned 1 old archive(s) (retention)" in out
    assert len(list(archive_dir.iterdir())) == 1
    events = [r.event for r in read_audit(audit_path(state_dir, ws.root)).records]
    assert events == ["compaction", "prune"]  # the prune followed the compaction


@pytest.mark.parametrize(
    ("argv", "config_text", "expected", "exit_code"),
    [
        (["prune", "nosuch"], "", "unknown agent 'nosuch'", 3),
        (["prune", "../x"], "", "invalid agent name", 2),
        # An empty name is a bad name, not "every agent" (review16e)
        (["prune", ""], "[retention]\nmax_archives = 1\n", "invalid agent name '': empty", 2),
        (["prune"], "[retention]\nmax_archives = -1\n", "retention.max_archives", 2),
        (["prune"], '[agents."a*"]\nmax_age_days = "soon"\n', "agents.a*.max_age_days", 2),
    ],
)
def test_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str],
    ws: AgentWorkspace,
    state_dir: Path,
    tmp_path: Path,
    argv: list[str],
    config_text: str,
    expected: str,
    exit_code: int,
) -> None:
    config = write_config(tmp_path, config_text)
    code, _out, err = run(
        capsys, *argv, "-w", str(ws.root), "--state-dir", str(state_dir), "-c", str(config)
    )
    assert code == exit_code
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err


@pytest.mark.skipif(not can_switch_uid(), reason="needs root")
def test_root_prune_acts_as_memd_on_a_daemon_owned_agent(tmp_path: Path) -> None:
    """The daemon's uid owns the agent's .memd/ and archives: a root `prune` works on
    them and leaves no root-owned file (a root-owned .memd/ would lock the daemon out)."""
    with reachable_tmp("memd-prune-") as base:
        ws = AgentWorkspace(base / "ws")
        paths = ws.create_agent("alpha", entries=2)
        paths.archive_dir.mkdir(mode=0o700)
        for day in (1, 2, 3):
            (paths.archive_dir / f"history_2026-01-0{day}_10-00-00.md").write_text("raw")
        state = base / "state"
        state.mkdir(mode=0o700)
        for root, dirs, files in os.walk(base):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), NOBODY, NOBODY)
        config = write_config(tmp_path, "[retention]\nmax_archives = 1\n")  # read as root
        common = ["-w", str(ws.root), "--state-dir", str(state), "-c", str(config)]
        result = subprocess.run(
            [sys.executable, "-m", "memd", "prune", *common],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert [p.name for p in paths.archive_dir.iterdir()] == ["history_2026-01-03_10-00-00.md"]
        owners = {
            os.path.join(root, name): os.stat(os.path.join(root, name)).st_uid
            for root, dirs, files in os.walk(base)
            for name in [*dirs, *files]
        }
        assert set(owners.values()) == {NOBODY}, owners
        assert any(p.name.endswith(".audit.jsonl") for p in state.iterdir())


def test_prune_deletes_the_recall_index_copies_moved_aside_as_corrupt(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    # A copy of a damaged index holds the text of archives retention later deletes.
    before = ["-w", str(ws.root), "--state-dir", str(state_dir)]
    unlimited = [*before, "-c", str(write_config(tmp_path, ""))]
    old = compact(capsys, unlimited, "alpha", "zanthorp")
    db = recall_db_path(state_dir, ws.root)
    copy = db.with_name(f"{db.name}.corrupt-20260101-000000")
    copy.write_bytes(db.read_bytes())
    db.with_name(f"{copy.name}-wal").write_bytes(b"zanthorp in a moved-aside WAL")
    compact(capsys, unlimited, "alpha", "quillmoss")
    age(old, 45)
    config = write_config(tmp_path, "[retention]\nmax_age_days = 30\n")

    code, out, err = run(capsys, "prune", "alpha", *before, "-c", str(config))
    assert code == 0, err
    assert "alpha: deleted 1 archive(s)" in out
    assert not list(state_dir.glob(f"{db.name}.corrupt-*"))
    assert not [
        p.name for p in state_dir.rglob("*") if p.is_file() and b"zanthorp" in p.read_bytes()
    ]
