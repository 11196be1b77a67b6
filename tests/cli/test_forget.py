from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from support.cli import run
from support.daemon_proc import DaemonProcess, wait_until
from support.memfiles import AgentWorkspace, append_entry, snapshot_tree
from support.other_uid import NOBODY, can_switch_uid, reachable_tmp

from memd.audit import audit_path, read_audit
from memd.state import AgentRecord, FileKey, LedgerEntry, StateStore, state_db_path


@pytest.fixture
def ws(tmp_path: Path, state_dir: Path) -> AgentWorkspace:
    workspace = AgentWorkspace(tmp_path / "ws")
    for name in ("alpha", "beta"):
        paths = workspace.create_agent(name, entries=4)
        paths.archive_dir.mkdir()
        (paths.archive_dir / "history_2026-01-01_10-00-00.md").write_text(f"{name} archive")
        (paths.archive_dir / "history_2026-01-01_10-00-00_1.md").write_text(f"{name} archive 2")
        paths.private_dir.mkdir()
        paths.lock.touch()
        paths.journal.write_text("{}")
    with StateStore.open(state_dir, workspace.root) as store:
        for name in ("alpha", "beta"):
            store.upsert_agents([AgentRecord(name, 1, 2, 3, 3, 3, 10, 100, 1.0)])
            store.record_compaction(
                LedgerEntry(name, 1.0, 1.0, "a", 1, 1, "builtin", None, None, "daemon")
            )
            store.save_counts([(name, FileKey(1, 2, 3, 4, "cl100k_base"), 10)])
    return workspace


def base_args(ws: AgentWorkspace, state_dir: Path) -> list[str]:
    return ["-w", str(ws.root), "--state-dir", str(state_dir)]


def state_of(state_dir: Path, ws: AgentWorkspace, agent: str) -> tuple[object, int, object]:
    with StateStore.open(state_dir, ws.root) as store:
        return (
            store.get_agent(agent),
            len(store.history(agent)),
            store.cached_count(agent, FileKey(1, 2, 3, 4, "cl100k_base")),
        )


def test_refuses_without_yes_and_touches_nothing(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    before = snapshot_tree(ws.root)
    code, out, err = run(capsys, "forget", "alpha", *base_args(ws, state_dir))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--yes" in err
    assert snapshot_tree(ws.root) == before
    assert state_of(state_dir, ws, "alpha")[1] == 1


def test_forget_erases_files_and_state_but_keeps_folder_and_lock(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    beta_before = snapshot_tree(ws.root / "agents" / "beta")
    code, out, err = run(capsys, "forget", "alpha", "--yes", *base_args(ws, state_dir))
    assert code == 0, err
    assert "forgot agent 'alpha'" in out and "2 archive(s)" in out
    paths = ws.paths("alpha")
    assert paths.dir.is_dir()
    assert not paths.memory.exists() and not paths.archive_dir.exists()
    assert [p.name for p in paths.private_dir.iterdir()] == ["lock"]
    assert state_of(state_dir, ws, "alpha") == (None, 0, None)
    # The other agent is untouched, files and state.
    assert snapshot_tree(ws.root / "agents" / "beta") == beta_before
    assert state_of(state_dir, ws, "beta")[1] == 1
    # Forgetting twice is fine (nothing left to remove).
    code, out, _ = run(capsys, "forget", "alpha", "--yes", *base_args(ws, state_dir))
    assert code == 0 and "0 archive(s)" in out


def test_agent_memd_never_compacted(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    paths = ws.create_agent("fresh", entries=1)
    code, _, err = run(capsys, "forget", "fresh", "--yes", *base_args(ws, state_dir))
    assert code == 0, err
    assert not paths.memory.exists()
    assert [p.name for p in paths.private_dir.iterdir()] == ["lock"]


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from memd.fsutil import AgentLock
    lock = AgentLock(Path(sys.argv[1]), "alpha")
    lock.acquire(5)
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    lock.release()
    """
)


def hold_lock(path: Path, seconds: float) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_waits_for_a_compaction_in_flight(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    holder = hold_lock(ws.paths("alpha").lock, 1.0)
    started = time.monotonic()
    code, _, err = run(
        capsys, "forget", "alpha", "--yes", "--wait", "20", *base_args(ws, state_dir)
    )
    waited = time.monotonic() - started
    holder.wait(timeout=10)
    assert code == 0, err
    assert waited >= 0.5  # it really waited for the holder
    assert not ws.paths("alpha").memory.exists()


def test_lock_timeout_leaves_everything(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    holder = hold_lock(ws.paths("alpha").lock, 5.0)
    try:
        before = snapshot_tree(ws.root)
        code, _, err = run(
            capsys, "forget", "alpha", "--yes", "--wait", "0.2", *base_args(ws, state_dir)
        )
        assert code == 4 and "alpha" in err and err.count("\n") == 1
        assert snapshot_tree(ws.root) == before
        assert state_of(state_dir, ws, "alpha")[1] == 1
    finally:
        holder.kill()
        holder.wait()


def test_refuses_symlink_out_of_workspace(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "precious.md"
    outside.write_text("keep me")
    paths = ws.paths("alpha")
    paths.memory.unlink()
    paths.memory.symlink_to(outside)
    before = snapshot_tree(ws.root)
    code, _, err = run(capsys, "forget", "alpha", "--yes", *base_args(ws, state_dir))
    assert code == 2 and "resolves outside the agent's own folder" in err
    assert outside.read_text() == "keep me"
    assert snapshot_tree(ws.root) == before


def test_a_private_folder_swapped_for_a_symlink_leads_the_lock_nowhere(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    """review r8cli: the lock holder writes its record into the lock file, so forget
    takes the lock in the pinned .memd/, as compaction does (the folder check before
    it refuses the link; the pinned open closes the window between the two)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "lock").write_text("precious")
    paths = ws.paths("alpha")
    for name in os.listdir(paths.private_dir):
        (paths.private_dir / name).unlink()
    paths.private_dir.rmdir()
    paths.private_dir.symlink_to(elsewhere)
    code, _, err = run(capsys, "forget", "alpha", "--yes", *base_args(ws, state_dir))
    assert code == 2 and err.count("\n") == 1 and "outside the agent's own folder" in err, err
    assert (elsewhere / "lock").read_text() == "precious"
    assert paths.memory.exists()


def test_symlink_inside_workspace_removed_as_link(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    shared = ws.root / "agents" / "alpha" / "shared-archive"
    shared.mkdir()
    (shared / "history_x.md").write_text("shared")
    paths = ws.paths("alpha")
    for child in paths.archive_dir.iterdir():
        child.unlink()
    paths.archive_dir.rmdir()
    paths.archive_dir.symlink_to(shared)
    code, _, err = run(capsys, "forget", "alpha", "--yes", *base_args(ws, state_dir))
    assert code == 0, err
    assert not paths.archive_dir.is_symlink() and not paths.archive_dir.exists()
    assert (shared / "history_x.md").read_text() == "shared"


def test_unknown_and_invalid_agents(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    code, _, err = run(capsys, "forget", "nobody", "--yes", *base_args(ws, state_dir))
    assert code == 3 and "unknown agent 'nobody'" in err
    code, _, err = run(capsys, "forget", "..", "--yes", *base_args(ws, state_dir))
    assert code == 2 and "invalid agent name" in err


def test_state_only_agent_can_be_forgotten(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    # The folder was deleted by hand; memd's rows for it remain until forgotten.
    with StateStore.open(state_dir, ws.root) as store:
        store.record_compaction(LedgerEntry("gone", 1.0, 1.0, "a", 1, 1, "m", None, None, "daemon"))
    code, out, err = run(capsys, "forget", "gone", "--yes", *base_args(ws, state_dir))
    assert code == 0, err
    assert "1 state row(s)" in out
    assert state_of(state_dir, ws, "gone")[1] == 0


def test_end_to_end_exit_codes(ws: AgentWorkspace, state_dir: Path) -> None:
    cmd = [sys.executable, "-m", "memd", "forget", "alpha", *base_args(ws, state_dir)]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.startswith("memd: error: ")
    assert len(refused.stderr.splitlines()) == 1
    done = subprocess.run([*cmd, "--yes"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not ws.paths("alpha").memory.exists()


def test_no_trace_in_state_db_bytes_wal_or_corrupt_copies(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    planted = "PLANTED-4d2f-never-again"
    with StateStore.open(state_dir, ws.root) as store:
        for i in range(20):
            store.upsert_agents(
                [AgentRecord("alpha", 1, 2, 3, 3, 3, i, 100, 1.0, "error", planted)]
            )
        path = store.path
    assert path is not None
    copy = path.with_name(f"{path.name}.corrupt-20260101-000000")
    copy.write_bytes(path.read_bytes())
    assert planted.encode() in copy.read_bytes()
    code, out, err = run(capsys, "forget", "alpha", "--yes", *base_args(ws, state_dir))
    assert code == 0, err
    assert "corrupt DB copies" in out
    for name in (path, Path(f"{path}-wal"), *state_dir.glob("*.corrupt-*")):
        raw = name.read_bytes() if name.exists() else b""
        assert b"alpha" not in raw and planted.encode() not in raw, name
    assert state_of(state_dir, ws, "beta")[1] == 1
    with StateStore.open(state_dir, ws.root) as store:
        assert store.tombstoned(["alpha", "beta"]).keys() == {"alpha"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def test_running_daemon_honours_the_erasure_until_a_new_memory_file(tmp_path: Path) -> None:
    """A real daemon process: after `memd forget` it writes no row and no metric for
    the agent (old code wrote the row straight back); a new MEMORY.md brings it back."""
    workspace = AgentWorkspace(tmp_path / "w")
    workspace.create_agent("ghost", entries=2)
    workspace.create_agent("other", entries=2)
    state = tmp_path / "s"
    port = _free_port()
    config = tmp_path / "memd.toml"
    config.write_text(
        "[trigger]\ncontext_length = 100000\ndebounce_ms = 40\n[watch]\nreconcile_s = 0.5\n"
        f"[daemon]\nstate_flush_s = 0.2\n[metrics]\nport = {port}\n"
    )

    def row(name: str) -> object:
        with StateStore.open(state, workspace.root) as store:
            return store.get_agent(name)

    def flushes_after(moment: float, count: int = 3) -> bool:
        # The daemon's heartbeat is written by every flush: `count` flushes after
        # `moment` means the daemon has had every chance to write the row back.
        with StateStore.open(state, workspace.root) as store:
            beat = store.read_heartbeat()
        return beat is not None and beat.ts > moment + count * 0.2

    with DaemonProcess(workspace.root, state, config=config) as daemon:
        daemon.wait_ready()
        assert wait_until(lambda: row("ghost") is not None, timeout=20)
        append_entry(workspace.paths("ghost").memory, "Human", "one more")  # a count: a metric
        assert wait_until(lambda: 'agent="ghost"' in _scrape(port), timeout=20)
        command = ["forget", "ghost", "--yes", "-w", str(workspace.root), "--state-dir", str(state)]
        forget = subprocess.run(
            [sys.executable, "-m", "memd", *command],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert forget.returncode == 0, forget.stderr
        forgotten_at = time.time()
        daemon.wait_for("agent erased by memd forget; not tracked until it writes again")
        assert wait_until(lambda: flushes_after(forgotten_at), timeout=20)
        assert wait_until(lambda: 'agent="ghost"' not in _scrape(port), timeout=20)
        assert row("ghost") is None
        assert row("other") is not None
        db = state_db_path(state, workspace.root)
        for name in (db, Path(f"{db}-wal")):
            assert b"ghost" not in (name.read_bytes() if name.exists() else b""), name
        # The agent writes again: a new MEMORY.md, and memd tracks it again.
        workspace.create_agent("ghost", entries=1)
        daemon.wait_for("agent writes again after its erasure")
        assert wait_until(lambda: row("ghost") is not None, timeout=20)
        assert wait_until(lambda: 'agent="ghost"' in _scrape(port), timeout=20)


def test_erasure_is_audited_without_content(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    code, _, err = run(capsys, "forget", "alpha", "--yes", *base_args(ws, state_dir))
    assert code == 0, err
    log = audit_path(state_dir, ws.root)
    records = read_audit(log).for_agent("alpha")
    assert [r.event for r in records] == ["erasure"]
    fields = dict(records[0].fields)
    assert fields["archives"] == 2 and fields["ledger_rows"] == 2 and fields["tombstone"] is True
    assert fields["files"] >= 2  # MEMORY.md and the journal
    assert fields["bytes"] > len("alpha archive") + len("alpha archive 2")
    assert b"lorem ipsum" not in log.read_bytes() and b"archive 2" not in log.read_bytes()
    code, out, _ = run(capsys, "audit", "alpha", *base_args(ws, state_dir))
    assert code == 0 and "erasure" in out


def test_a_symlinked_memory_file_is_erased_with_its_target(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    # MEMORY.md may link to a file in the agent's own folder: that file is the memory.
    paths = ws.paths("alpha")
    real = paths.dir / "conversation.md"
    paths.memory.rename(real)
    paths.memory.symlink_to("conversation.md")
    code, _, err = run(capsys, "forget", "alpha", "--yes", *base_args(ws, state_dir))
    assert code == 0, err
    assert not real.exists() and not paths.memory.is_symlink()


ONE_ENTRY = "### user — 2026-01-01T00:00:01\n\nhello alpha\n\n---\n\n"


def _forget_subprocess(ws: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "memd",
            "forget",
            "alpha",
            "--yes",
            "--workspace",
            str(ws),
            "--state-dir",
            str(state),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("memd: error:")]
    assert len(errors) == 1, proc.stderr


def test_forget_of_an_agent_whose_dot_memd_is_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    """mkdir .memd/ fails (FileExistsError): one line, nothing erased (review 14e, F5)."""
    folder = tmp_path / "ws" / "agents" / "alpha"
    folder.mkdir(parents=True)
    (folder / "MEMORY.md").write_text(ONE_ENTRY)
    (folder / ".memd").write_text("not a folder")
    proc = _forget_subprocess(tmp_path / "ws", tmp_path / "st")
    _one_line_error(proc)
    assert (folder / "MEMORY.md").read_text() == ONE_ENTRY


@pytest.mark.skipif(not can_switch_uid(), reason="needs root to hand the state dir to another uid")
def test_root_forget_with_a_state_dir_of_another_uid_is_a_one_line_error() -> None:
    """The daemon runs as its own user (its state dir); the operator runs
    ``sudo memd forget AGENT --yes`` on an agent memd never compacted, whose
    folder that user cannot write: the CLI acts as the state dir's owner
    (``as_owner_of``) and the mkdir of .memd/ fails (review 14e, F5)."""
    with reachable_tmp("memd-forget-") as base:
        folder = base / "ws" / "agents" / "alpha"
        folder.mkdir(parents=True)
        (folder / "MEMORY.md").write_text(ONE_ENTRY)
        state = base / "st"
        state.mkdir(mode=0o700)
        os.chown(state, NOBODY, NOBODY)
        proc = _forget_subprocess(base / "ws", state)
        assert "state DB" not in proc.stderr  # the daemon's state DB opened (as its owner)
        _one_line_error(proc)
        assert (folder / "MEMORY.md").exists()
