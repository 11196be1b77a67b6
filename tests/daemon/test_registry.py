"""The registry owns the agent set: a rescan adds and removes agents and is
published (the watch service waits for it; the registry calls no one)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from support.daemon_proc import DaemonProcess
from support.memfiles import AgentWorkspace
from support.systemd_layout import AGENTS_GID, ALICE, MEMD, as_alice

from memd.daemon.registry import AgentRegistry, RecoveryOptions, Rescans
from memd.settings import build_config


def make_registry(ws: AgentWorkspace) -> AgentRegistry:
    config, _ = build_config({}, {})
    registry = AgentRegistry(ws.root, config, recover=lambda _p, _key: None, context_length_of=None)
    registry.start(contextlib.ExitStack())
    return registry


def test_each_rescan_adds_removes_and_is_published(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    ws.create_agent("bob")
    (ws.root / "agents" / "a..b").mkdir()  # refused: never an agent
    registry = make_registry(ws)
    assert registry.rescans.number == 0
    assert registry.reconcile() == (["alice", "bob"], [])
    assert registry.rescans.number == 1
    assert registry.dirs() == {name: str(ws.root / "agents" / name) for name in ("alice", "bob")}
    shutil.rmtree(ws.root / "agents" / "alice")
    ws.create_agent("carol")
    assert registry.reconcile() == (["carol"], ["alice"])
    assert registry.reconcile() == ([], [])  # nothing changed: published all the same
    assert registry.rescans.number == 3
    assert registry.names() == {"bob", "carol"}


def test_a_waiter_sees_the_next_rescan_or_its_stop() -> None:
    rescans = Rescans()
    stop = threading.Event()
    assert rescans.wait(0, 0, stop) == 0  # nothing new: back after the timeout
    rescans.publish()
    assert rescans.wait(0, 3600, stop) == 1  # already past what was seen: no wait
    seen: list[int] = []
    waiter = threading.Thread(target=lambda: seen.append(rescans.wait(1, 3600, stop)))
    waiter.start()
    rescans.publish()
    waiter.join()
    assert seen == [2]
    waiter = threading.Thread(target=lambda: seen.append(rescans.wait(2, 3600, stop)))
    waiter.start()
    stop.set()
    rescans.wake()
    waiter.join()
    assert seen == [2, 2]  # woken by its stop, no rescan


def test_recovery_is_handed_the_current_configs_key_file_and_drain_times(tmp_path: Path) -> None:
    """The drain a recovery finishes waits for quiet as [compaction] says: it
    waited a fixed second (recover_agent's default) whatever the config, so a
    slow writer's late turns a longer drain_quiet_s was set for went to the
    unlinked old file, and a daemon with 16 jobs an upgrade left started 16 s late
    (s10upgrade's fixtures)."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    (ws.root / "agents" / "alice" / ".memd").mkdir()  # compacted before: may need recovery
    handed: list[Path | None] = []
    drains: list[tuple[float, float]] = []

    def recover(_paths: object, options: RecoveryOptions) -> None:
        handed.append(options.key_file)
        drains.append((options.quiet_s, options.max_s))

    plain, _ = build_config({"compaction": {"drain_quiet_s": 0.2, "drain_max_s": 3.0}}, {})
    registry = AgentRegistry(ws.root, plain, recover=recover, context_length_of=None)
    registry.start(contextlib.ExitStack())

    def add_alice() -> None:
        entry = registry.make_entry("alice")
        assert entry is not None and entry.may_need_recovery
        registry.recover(entry)

    add_alice()
    assert handed == [None]  # archives not encrypted: no key
    key = tmp_path / "master.key"
    sealed, _ = build_config({"privacy": {"encrypt_archives": True, "key_file": str(key)}}, {})
    registry.reconfigure(sealed)  # a reload: the registry holds the new config's value
    add_alice()
    assert handed == [None, key]
    assert drains == [(0.2, 3.0), (1.0, 10.0)]  # the defaults once reloaded without them


def test_a_badly_named_folder_is_said_once_and_hidden_ones_never(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    (ws.root / "agents" / "a..b").mkdir()
    (ws.root / "agents" / ".git").mkdir()
    registry = make_registry(ws)
    capsys.readouterr()
    assert registry.scan() == {"alice": False}
    assert registry.scan() == {"alice": False}  # the workspace returns it; the registry says it
    said = [line for line in capsys.readouterr().out.splitlines() if "agent skipped" in line]
    assert len(said) == 1 and "a..b" in said[0]


def test_agents_that_resolve_alike_share_one_policy(tmp_path: Path) -> None:
    # One policy per set of matching [agents."glob"] tables and declared window, not
    # one per agent (30,000 resolutions at start-up); a reload makes new ones.
    import json

    from memd.descriptor import Descriptors

    ws = AgentWorkspace(tmp_path / "ws")
    for name in ("alice", "bob", "scratch-1", "scratch-2", "dora"):
        ws.create_agent(name)
    (ws.root / "agents/dora/memd-agent.json").write_text(
        json.dumps({"format": "memd-agent", "version": 1, "agent": "dora", "context_length": 3000})
    )
    config, _ = build_config({"agents": {"scratch-*": {"threshold": 0.5}}}, {})
    registry = AgentRegistry(ws.root, config, recover=lambda _p, _key: None, context_length_of=None)
    registry.descriptors = Descriptors(len)
    registry.start(contextlib.ExitStack())
    registry.reconcile()
    policy = {name: entry.policy for name, entry in registry.agents().items()}
    assert policy["alice"] is policy["bob"]
    assert policy["scratch-1"] is policy["scratch-2"] is not policy["alice"]
    assert policy["scratch-1"].threshold == 0.5 and policy["alice"].threshold == 0.9
    assert policy["dora"].context_length == 3000 and policy["alice"].context_length != 3000
    registry.reconfigure(build_config({"trigger": {"threshold": 0.8}}, {})[0])
    again = {name: entry.policy for name, entry in registry.agents().items()}
    assert again["alice"] is again["bob"] is again["scratch-1"]
    assert again["alice"].threshold == 0.8 and again["dora"].context_length == 3000


def test_a_threshold_no_compaction_can_meet_is_logged_once_per_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    for name in ("alice", "tiny-1", "tiny-2"):
        ws.create_agent(name)
    config, _ = build_config({"agents": {"tiny-*": {"max_tokens": 200}}}, {})
    registry = AgentRegistry(ws.root, config, recover=lambda _p, _key: None, context_length_of=None)
    registry.start(contextlib.ExitStack())
    capsys.readouterr()
    registry.reconcile()
    said = [line for line in capsys.readouterr().out.splitlines() if "too small" in line]
    assert len(said) == 1 and "tiny-" in said[0]  # the two share one policy
    assert "threshold 200 tokens" in said[0] and "no compaction brings it under" in said[0]


def test_the_shared_policies_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An agent that keeps rewriting its descriptor (a new window each time) does
    # not add a policy for ever: past the bound the kept ones are dropped.
    import json

    import memd.daemon.registry
    from memd.descriptor import Descriptors

    monkeypatch.setattr(memd.daemon.registry, "MAX_SHARED_POLICIES", 3)
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("dora")
    registry = make_registry(ws)
    registry.descriptors = Descriptors(len)
    seen = []
    for window in range(2000, 2010):
        (ws.root / "agents/dora/memd-agent.json").write_text(
            # A new size each time: a new file identity however coarse the mtime.
            json.dumps({"format": "memd-agent", "version": 1, "context_length": window})
            + " " * window
        )
        seen.append(registry.policy("dora"))
        assert len(registry._policies[1]) <= 3
    assert [policy.context_length for policy in seen] == list(range(2000, 2010))


def test_a_recovery_that_fails_notes_the_journal_it_left_unfinished(tmp_path: Path) -> None:
    """A recovery that fails (an agent added while running, or any at start-up) is
    noted on the entry when the journal still holds a job (the runner owes the
    drain); one that fails around an idle journal owes nothing."""
    from memd.core.plan import IDLE_PHASE
    from memd.fsutil import SlotJournal

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")

    def fail(_paths: object, _key: object) -> str | None:
        raise OSError(28, "No space left on device")

    config, _ = build_config({}, {})
    registry = AgentRegistry(ws.root, config, recover=fail, context_length_of=None)
    registry.start(contextlib.ExitStack())
    paths = ws.paths("alice")
    paths.private_dir.mkdir()
    journal = SlotJournal(paths.journal)
    journal.write({"phase": IDLE_PHASE})
    entry = registry.make_entry("alice")
    assert entry is not None and entry.may_need_recovery
    assert registry.recover(entry) is False and entry.unfinished_journal is None
    journal.write({"phase": "draining", "version": 2, "copied_to": 10})
    assert registry.recover(entry) is True
    assert entry.unfinished_journal is not None
    assert entry.unfinished_journal.recovery_error == "No space left on device"
    assert registry.add("alice") is not None
    added = registry.get("alice")
    assert added is not None and added.unfinished_journal is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")
def test_sidecar_agent_of_another_uid_can_make_its_folder() -> None:
    """The docker sidecar's isolated layout (docs/operations.md): the image built
    with AGENTS_GID (its /workspace memd's and that group's), memd with group_add
    of it, each agent container with its own uid:gid, group_add AGENTS_GID and
    umask 0007, on a new volume. memd made agents/ 0755, its own: no agent could
    make its folder (review r7ops F3)."""
    base = Path(tempfile.mkdtemp(prefix="memd-sidecar-", dir="/tmp"))
    old_umask = os.umask(0o022)  # a container's default umask
    try:
        base.chmod(0o755)
        workspace = base / "workspace"  # mkdir /workspace; chown MEMD_UID:AGENTS_GID
        workspace.mkdir()
        os.chown(workspace, MEMD, AGENTS_GID)
        state = base / "state"
        state.mkdir()
        os.chown(state, MEMD, MEMD)
        state.chmod(0o700)
        with DaemonProcess(workspace, state, user=MEMD, groups=(AGENTS_GID, ALICE)) as daemon:
            daemon.wait_ready(timeout=60)
            made = as_alice("/bin/mkdir", "-p", str(workspace / "agents" / "alice"))
            daemon.stop()
        assert made.returncode == 0, made.stderr
        folder = (workspace / "agents" / "alice").stat()
        assert (folder.st_uid, folder.st_gid) == (ALICE, ALICE)  # its own group: not setgid
    finally:
        os.umask(old_umask)
        shutil.rmtree(base, ignore_errors=True)
