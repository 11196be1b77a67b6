from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run
from support.memfiles import AgentWorkspace, append_entry

from memd.recall.index import RecallIndex, recall_db_path


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    workspace = AgentWorkspace(tmp_path / "ws")
    for name in ("alpha", "beta"):
        paths = workspace.create_agent(name, entries=3)
        append_entry(paths.memory, "Human", f"{name}: the kalomiren report is in drawer three.")
        append_entry(paths.memory, "AI", f"{name}: budget review moved to Friday.")
    return workspace


def args(ws: AgentWorkspace, state_dir: Path) -> list[str]:
    return ["-w", str(ws.root), "--state-dir", str(state_dir)]


def compact_now(capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path) -> str:
    code, out, err = run(
        capsys, "compact-now", "alpha", "--summary", "Old talk.", *args(ws, state_dir)
    )
    assert code == 0, err
    return out


def test_compact_now_indexes_and_recall_prints_highlighted_hits(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    compact_now(capsys, ws, state_dir)
    (archive,) = ws.paths("alpha").archive_dir.iterdir()
    # Indexed by compact-now itself, before any recall ran.
    with RecallIndex.open(state_dir, ws.root) as index:
        assert index.search("alpha", "kalomiren")[0].source == archive.name
    append_entry(ws.paths("alpha").memory, "Human", "alpha: the kalomiren draft went to the attic.")
    code, out, err = run(
        capsys, "recall", "alpha", "where is the kalomiren report?", *args(ws, state_dir)
    )
    assert code == 0, err
    assert out.startswith("1. Human — ")
    assert f"({archive.name} @ byte " in out and "(live MEMORY.md @ byte " in out
    assert "drawer three" in out and "beta" not in out


def test_json_schema(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    compact_now(capsys, ws, state_dir)
    code, out, err = run(
        capsys, "recall", "alpha", "budget?", "-n", "1", "--json", *args(ws, state_dir)
    )
    assert code == 0, err
    (hit,) = json.loads(out)
    assert set(hit) == {
        "agent",
        "source",
        "live",
        "offset",
        "length",
        "role",
        "timestamp",
        "score",
        "text",
        "matches",
    }
    assert hit["agent"] == "alpha" and hit["role"] == "AI" and hit["live"] is False
    start, end = hit["matches"][0]
    assert hit["text"][start:end] == "budget"
    archive = ws.paths("alpha").archive_dir / hit["source"]
    raw = archive.read_bytes()[hit["offset"] : hit["offset"] + hit["length"]]
    assert raw.startswith(b"### AI \xe2\x80\x94 ") and b"budget review" in raw


def test_no_match_filters_and_empty_json(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    code, out, _ = run(capsys, "recall", "alpha", "zzyzx?", *args(ws, state_dir))
    assert code == 0 and "no entry matches" in out
    code, out, _ = run(capsys, "recall", "alpha", "zzyzx", "--json", *args(ws, state_dir))
    assert code == 0 and json.loads(out) == []
    code, out, _ = run(
        capsys, "recall", "alpha", "kalomiren", "--role", "ai", "--json", *args(ws, state_dir)
    )
    assert code == 0 and json.loads(out) == []
    code, out, _ = run(
        capsys,
        "recall",
        "alpha",
        "kalomiren",
        "--since",
        "2999-01-01",
        "--json",
        *args(ws, state_dir),
    )
    assert code == 0 and json.loads(out) == []


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["alpha", "?!"], "no word to search for"),
        (["alpha", "x", "--since", "last week"], "--since 'last week'"),
        # review s7recall F4: year 1 in local time is out of the clock's range.
        (["alpha", "x", "--since", "0001-01-01"], "--since '0001-01-01' is out of range"),
        (["alpha", "x", "-n", "0"], "limit 0"),
        (["ghost", "x"], "unknown agent 'ghost'"),
        (["../etc", "x"], "agent"),
        (["alpha"], "usage: memd recall AGENT QUERY"),
        (["--reindex", "alpha", "query"], "--reindex takes at most"),
    ],
)
def test_bad_input_is_one_clear_line(
    capsys: pytest.CaptureFixture[str],
    ws: AgentWorkspace,
    state_dir: Path,
    extra: list[str],
    needle: str,
) -> None:
    code, out, err = run(capsys, "recall", *extra, *args(ws, state_dir))
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and needle in err, err


def test_reindex_rebuilds_every_agent_and_drops_gone_ones(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    compact_now(capsys, ws, state_dir)
    ghost = ws.create_agent("ghost", entries=1)
    run(capsys, "recall", "ghost", "turn", *args(ws, state_dir))
    for path in ghost.dir.iterdir():
        path.unlink()
    ghost.dir.rmdir()
    code, out, err = run(capsys, "recall", "--reindex", *args(ws, state_dir))
    assert code == 0, err
    assert "alpha: indexed 2 file(s)" in out and "beta: indexed 1 file(s)" in out
    assert "ghost: folder gone" in out
    with RecallIndex.open(state_dir, ws.root) as index:
        assert index.agents() == ["alpha", "beta"]
    code, out, err = run(capsys, "recall", "--reindex", "beta", *args(ws, state_dir))
    assert code == 0 and out.startswith("beta: indexed 1 file(s)"), err


def test_reindex_of_every_agent_goes_on_past_a_folder_it_refuses(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    """An agent folder that is a symlink out of the workspace is refused (§1): as
    the daemon does, --reindex says so in one line and reindexes the others
    (review 14e, F6)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "MEMORY.md").write_text("### user — 2026-01-01T00:00:01\n\nkalomiren\n\n---\n\n")
    (ws.root / "agents" / "evil").symlink_to(outside)
    code, out, err = run(capsys, "recall", "--reindex", *args(ws, state_dir))
    assert code == 1
    assert err.count("\n") == 1 and "evil" in err and "outside the workspace" in err
    assert "alpha: indexed" in out and "beta: indexed" in out
    with RecallIndex.open(state_dir, ws.root) as index:
        assert index.agents() == ["alpha", "beta"]


def _refuse_folder(ws: AgentWorkspace, agent: str, outside: Path) -> None:
    """Move ``agent``'s folder out of the workspace and leave a symlink to it: the
    folder is then refused (DESIGN.md §1), its files still there."""
    folder = ws.root / "agents" / agent
    folder.rename(outside)
    folder.symlink_to(outside)


@pytest.mark.parametrize("named", [False, True], ids=["every-agent", "named"])
def test_reindex_erases_the_rows_of_an_agent_whose_folder_is_now_refused(
    capsys: pytest.CaptureFixture[str],
    ws: AgentWorkspace,
    state_dir: Path,
    tmp_path: Path,
    named: bool,
) -> None:
    """beta was indexed; then its folder became a symlink out of the workspace.
    --reindex skipped it and kept its old rows: text of a folder memd refuses,
    kept in the index as if current. Its rows are erased (and scrubbed from the
    file), and the output says so."""
    code, out, err = run(capsys, "recall", "beta", "kalomiren", *args(ws, state_dir))
    assert code == 0 and "kalomiren" in out, err
    _refuse_folder(ws, "beta", tmp_path / "outside")
    code, out, err = run(
        capsys, "recall", "--reindex", *(["beta"] if named else []), *args(ws, state_dir)
    )
    with RecallIndex.open(state_dir, ws.root) as index:
        assert "beta" not in index.agents()
        assert index.search("beta", "kalomiren") == []
    assert b"beta: the kalomiren" not in recall_db_path(state_dir, ws.root).read_bytes()
    assert code != 0
    assert err.count("\n") == 1 and "'beta'" in err and "outside the workspace" in err, err
    assert "beta: folder refused; its rows were erased" in out
    assert ("alpha: indexed" in out) is not named


@pytest.mark.parametrize("named", [False, True], ids=["every-agent", "named"])
def test_reindex_treats_an_archive_symlink_inside_the_folder_as_a_refused_folder(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, named: bool
) -> None:
    """archive/ -> notes/ inside beta's own folder is refused once pinned (never
    archived through): --reindex of every agent stopped at it (exit 2, alpha not
    reindexed). Now as a refused folder: its rows erased, said, the others go on."""
    code, out, err = run(capsys, "recall", "beta", "kalomiren", *args(ws, state_dir))
    assert code == 0 and "kalomiren" in out, err
    folder = ws.root / "agents" / "beta"
    (folder / "notes").mkdir()
    (folder / "archive").symlink_to("notes")
    code, out, err = run(
        capsys, "recall", "--reindex", *(["beta"] if named else []), *args(ws, state_dir)
    )
    assert code == (2 if named else 1), err
    (line,) = err.splitlines()
    assert line == (
        f"memd: error: agent 'beta': archive folder {folder / 'archive'} is a symlink, "
        "not a real folder; nothing is archived through it"
    )
    assert "beta: folder refused; its rows were erased" in out
    assert ("alpha: indexed" in out) is not named
    with RecallIndex.open(state_dir, ws.root) as index:
        assert "beta" not in index.agents()


def test_forget_erases_the_agents_rows(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    compact_now(capsys, ws, state_dir)
    run(capsys, "recall", "beta", "kalomiren", *args(ws, state_dir))
    code, out, err = run(capsys, "forget", "alpha", "--yes", *args(ws, state_dir))
    assert code == 0, err
    assert "recall index row(s)" in out and " 0 recall" not in out
    db = recall_db_path(state_dir, ws.root)
    assert b"alpha: the kalomiren" not in db.read_bytes()
    with RecallIndex.open(state_dir, ws.root) as index:
        assert index.search("alpha", "kalomiren") == []
        assert index.search("beta", "kalomiren")


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_role_no_entry_has_is_said_with_the_agents_roles(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, as_json: bool
) -> None:
    """Roles are free text (Swarms writes the agent's own name for its turns), so
    --role cannot be a fixed choice; a mistyped one matched nothing, silently."""
    json_flag = ["--json"] if as_json else []
    code, out, err = run(
        capsys, "recall", "alpha", "kalomiren", "--role", "Humna", *json_flag, *args(ws, state_dir)
    )
    assert code == 0
    assert (out.strip() == "[]") if as_json else out.startswith("no entry matches")
    assert err.splitlines() == [
        "memd: note: agent 'alpha' has no entry of role 'Humna' (its roles: AI, Human)"
    ]
    # A role the agent has, in any case: no note, whether or not the query matches.
    for query in ("kalomiren", "zzyzx"):
        code, out, err = run(
            capsys, "recall", "alpha", query, "--role", "human", *args(ws, state_dir)
        )
        assert code == 0 and err == "", err
