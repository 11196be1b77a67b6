"""The daemon's pointer in its workspace: real files, real modes, real other uids.

The workspace is writable by agents, so the pointer counts only when owned by
this uid or root, not writable by group or others, and not a symlink (DESIGN §1).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from memd.pointer import (
    POINTER_NAME,
    PointerRefused,
    StatePointer,
    read_pointer,
    write_pointer,
)

AGENT = 31001  # a uid that is neither root nor this test's (see test_agent_isolation)
OTHER_AGENT = 31002


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "agents").mkdir(parents=True)
    return root


def test_written_and_read_back_whatever_the_umask(workspace: Path, tmp_path: Path) -> None:
    config = tmp_path / "memd.toml"
    old = os.umask(0o077)
    try:
        path = write_pointer(
            workspace,
            tmp_path / "state",
            config=config,
            settings={"trigger": {"context_length": 4000}},
        )
    finally:
        os.umask(old)
    assert path == workspace / POINTER_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # operators read it, only we write it
    pointer = read_pointer(workspace)
    assert pointer == StatePointer(
        path=path,
        state_dir=tmp_path / "state",
        config=config,
        settings={"trigger": {"context_length": 4000}},
        pid=os.getpid(),
    )
    data = json.loads(path.read_text())
    assert (data["format"], data["version"]) == ("memd-state-pointer", 1)
    assert not list(workspace.glob("*.tmp"))


def test_absent_pointer_is_none(workspace: Path) -> None:
    assert read_pointer(workspace) is None


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_group_or_other_writable_pointer_is_refused(
    workspace: Path, tmp_path: Path, mode: int
) -> None:
    path = write_pointer(workspace, tmp_path / "state", config=None)
    path.chmod(mode)
    with pytest.raises(PointerRefused, match="writable by group or others"):
        read_pointer(workspace)


def test_symlinked_pointer_is_not_followed(workspace: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = write_pointer(elsewhere, tmp_path / "state", config=None)  # a sound pointer...
    (workspace / POINTER_NAME).symlink_to(real)  # ...that an agent links to
    with pytest.raises(PointerRefused, match="symlink"):
        read_pointer(workspace)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_fifo_or_folder_named_like_the_pointer_is_refused_without_hanging(
    workspace: Path, kind: str
) -> None:
    path = workspace / POINTER_NAME
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.mkdir(mode=0o700)
    with pytest.raises(PointerRefused, match="not a regular file|cannot read"):
        read_pointer(workspace)


def test_a_newer_format_or_garbage_is_refused_with_the_reason(workspace: Path) -> None:
    path = workspace / POINTER_NAME
    path.write_text(json.dumps({"format": "memd-state-pointer", "version": 9, "state_dir": "/x"}))
    path.chmod(0o644)
    with pytest.raises(PointerRefused, match="newer than this memd reads"):
        read_pointer(workspace)
    path.write_text(json.dumps({"format": "memd-state-pointer", "version": 1, "state_dir": "x"}))
    with pytest.raises(PointerRefused, match="absolute path"):
        read_pointer(workspace)
    path.write_text("{not json")
    with pytest.raises(PointerRefused, match="not valid JSON"):
        read_pointer(workspace)


def test_a_pointer_an_older_memd_left_has_no_key_variables(workspace: Path) -> None:
    """Version 1 as memd wrote it before ``key_vars`` (review r7ops F1) reads as
    naming none; the names come back as written; anything else is refused."""
    path = workspace / POINTER_NAME
    older = {
        "format": "memd-state-pointer",
        "version": 1,
        "state_dir": "/var/lib/memd",
        "config": None,
        "settings": {},
        "pid": 1234,
        "written_at": "2026-12-02T04:00:00+00:00",
    }
    path.write_text(json.dumps(older))
    path.chmod(0o644)
    pointer = read_pointer(workspace)
    assert pointer is not None and pointer.key_vars == () and pointer.pid == 1234
    write_pointer(workspace, Path("/var/lib/memd"), config=None, key_vars=("OPENAI_API_KEY",))
    pointer = read_pointer(workspace)
    assert pointer is not None and pointer.key_vars == ("OPENAI_API_KEY",)
    path.write_text(json.dumps({**older, "key_vars": "OPENAI_API_KEY"}))
    with pytest.raises(PointerRefused, match="key_vars must be a list"):
        read_pointer(workspace)


def test_writing_replaces_a_planted_symlink_not_its_target(workspace: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (workspace / POINTER_NAME).symlink_to(victim)
    write_pointer(workspace, tmp_path / "state", config=None)
    assert victim.read_text() == "precious"
    assert not (workspace / POINTER_NAME).is_symlink()
    assert read_pointer(workspace) is not None


def _read_as(uid: int, workspace: Path) -> str:
    """read_pointer in a forked child running as ``uid``: 'trusted', or the refusal."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child exits before coverage sees it
        os.close(reader)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                answer = "trusted" if read_pointer(workspace) is not None else "none"
            except PointerRefused as exc:
                answer = str(exc)
            os.write(writer, answer.encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    return answer


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")
def test_ownership_rule_with_real_other_uids(tmp_path: Path) -> None:
    # Not under tmp_path's 0700 parents alone: the other uids must reach it.
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="memd-pointer-"))
    try:
        root.chmod(0o777)  # the workspace as agents can write it
        write_pointer(root, tmp_path / "state", config=None)
        # Root's pointer is trusted by everyone ...
        assert read_pointer(root) is not None
        assert _read_as(AGENT, root) == "trusted"
        # ... an agent's own pointer only by that agent: never by root or another uid.
        os.chown(root / POINTER_NAME, AGENT, AGENT)
        with pytest.raises(PointerRefused, match=f"owned by uid {AGENT}"):
            read_pointer(root)
        assert _read_as(AGENT, root) == "trusted"
        assert f"owned by uid {AGENT}" in _read_as(OTHER_AGENT, root)
        # A pointer an agent wrote itself (its uid, its mode) is refused by root.
        (root / POINTER_NAME).unlink()
        forged = {"format": "memd-state-pointer", "version": 1, "state_dir": "/tmp/forged"}
        pid = os.fork()
        if pid == 0:  # pragma: no cover
            try:
                os.setgroups([])
                os.setgid(AGENT)
                os.setuid(AGENT)
                (root / POINTER_NAME).write_text(json.dumps(forged))
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert (root / POINTER_NAME).stat().st_uid == AGENT
        with pytest.raises(PointerRefused, match="not by this user"):
            read_pointer(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to other uids")
def test_root_takes_the_pointer_of_the_workspaces_owner_when_no_one_else_can_write_there(
    tmp_path: Path,
) -> None:
    """`sudo memd health` beside the service: the pointer is memd's, in memd's
    /srv/agents (0750). Root takes it there (review r7ops F4), and only there:
    not the pointer of a uid that does not own the workspace, nor the owner's in
    a workspace its group or others may write (anyone could have put it there)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.chown(workspace, AGENT, AGENT)
    workspace.chmod(0o750)
    path = write_pointer(workspace, tmp_path / "state", config=None)
    os.chown(path, AGENT, AGENT)
    assert read_pointer(workspace) is not None
    for mode in (0o770, 0o757, 0o1777):
        workspace.chmod(mode)
        with pytest.raises(PointerRefused, match=f"owned by uid {AGENT}"):
            read_pointer(workspace)
    workspace.chmod(0o750)
    os.chown(path, OTHER_AGENT, OTHER_AGENT)
    with pytest.raises(PointerRefused, match=f"owned by uid {OTHER_AGENT}"):
        read_pointer(workspace)
    # Only root: another uid still takes only its own pointer, or root's.
    os.chown(path, AGENT, AGENT)
    with pytest.raises(PointerRefused, match=f"owned by uid {AGENT}"):
        read_pointer(workspace, euid=OTHER_AGENT)


def test_a_pointer_an_older_memd_left_withholds_nothing(workspace: Path) -> None:
    """Version 1 as memd wrote it before ``withheld`` (review r9leak F4) reads as
    naming none; the names come back as written; anything else is refused."""
    path = workspace / POINTER_NAME
    older = {
        "format": "memd-state-pointer",
        "version": 1,
        "state_dir": "/var/lib/memd",
        "config": None,
        "settings": {"privacy": {"patterns": {"vault": "x"}}},
        "pid": 1234,
        "key_vars": [],
        "written_at": "2026-12-02T04:00:00+00:00",
    }
    path.write_text(json.dumps(older))
    path.chmod(0o644)
    pointer = read_pointer(workspace)
    assert pointer is not None and pointer.withheld == ()
    assert pointer.settings == {"privacy": {"patterns": {"vault": "x"}}}  # still applied
    write_pointer(
        workspace, Path("/var/lib/memd"), config=None, withheld=("MEMD_PRIVACY_PATTERNS",)
    )
    pointer = read_pointer(workspace)
    assert pointer is not None and pointer.withheld == ("MEMD_PRIVACY_PATTERNS",)
    path.write_text(json.dumps({**older, "withheld": "MEMD_PRIVACY_PATTERNS"}))
    with pytest.raises(PointerRefused, match="withheld must be a list"):
        read_pointer(workspace)


def test_secrets_of_the_environment_stay_out_of_the_settings_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MEMD_PRIVACY_PATTERNS ('your own secrets', from a 0600 memd.env) and the
    summary instructions are withheld like the API key (review r9leak F4); the
    other settings of the environment are still recorded."""
    from memd.settings import environment_settings, load_settings

    workspace = tmp_path / "ws"
    (workspace / "agents").mkdir(parents=True)
    monkeypatch.setenv("MEMD_PRIVACY_PATTERNS", json.dumps({"vault": "Sup3rVaultPassw0rd-7731"}))
    monkeypatch.setenv("MEMD_SUMMARIZER_SUMMARY_INSTRUCTIONS", "Never name Jane Q. Doe.")
    monkeypatch.setenv("MEMD_TRIGGER_THRESHOLD", "0.7")
    recorded, withheld = environment_settings(load_settings(workspace=workspace))
    assert set(withheld) == {"MEMD_PRIVACY_PATTERNS", "MEMD_SUMMARIZER_SUMMARY_INSTRUCTIONS"}
    assert recorded == {"trigger": {"threshold": 0.7}}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")
def test_secret_patterns_from_the_environment_never_reach_the_agents_pointer() -> None:
    """A real daemon with MEMD_PRIVACY_PATTERNS in its environment: the pointer,
    0644 in a 0750 memd:agents workspace, read as an agent's uid, holds neither
    pattern; a command beside the daemon without the variable says it lacks it
    (review r9leak F4)."""
    import subprocess
    import sys

    from support.daemon_proc import DaemonProcess
    from support.memfiles import AgentWorkspace
    from support.two_agents import AGENTS_GID, BOB, run_as, shared_root

    with shared_root() as root:
        ws = AgentWorkspace(root / "ws")
        ws.root.mkdir(parents=True, exist_ok=True)
        os.chown(ws.root, 0, AGENTS_GID)
        ws.root.chmod(0o750)
        ws.create_agent("alice")
        secret = "Sup3rVaultPassw0rd-7731"
        patterns = json.dumps({"vault": secret, "client": r"Jane Q\. Doe"})
        with DaemonProcess(
            ws.root, root / "state", env={"MEMD_PRIVACY_PATTERNS": patterns}
        ) as daemon:
            daemon.wait_ready()
            read = run_as(BOB, "/bin/cat", str(ws.root / POINTER_NAME))
            env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
            beside = subprocess.run(
                [sys.executable, "-m", "memd", "status", "--workspace", str(ws.root)],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
            assert daemon.stop() == 0
    assert read.returncode == 0, read.stderr  # the pointer is there for the agents to read
    assert secret not in read.stdout
    assert "Jane Q" not in read.stdout
    assert json.loads(read.stdout)["withheld"] == ["MEMD_PRIVACY_PATTERNS"]
    assert "sets MEMD_PRIVACY_PATTERNS, which its state pointer does not carry" in beside.stderr
