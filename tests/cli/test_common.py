"""Shared CLI plumbing: a root CLI in the daemon's state dir acts as its owner; the
one byte-size formatter (status and prune)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.memfiles import AgentWorkspace
from support.other_uid import NOBODY, can_switch_uid, reachable_tmp

from memd.cli.common import size_text


@pytest.mark.skipif(not can_switch_uid(), reason="needs root")
def test_root_cli_leaves_no_root_owned_files_in_the_daemons_state_dir() -> None:
    with reachable_tmp("memd-d6-") as base:
        ws = AgentWorkspace(base / "ws")
        ws.create_agent("alpha", entries=12)
        state = base / "state"
        state.mkdir(mode=0o700)
        # The daemon's user owns its state dir and the agents' files (a root
        # compact-now acts as that user: it could not compact a root-owned agent).
        for root, dirs, files in os.walk(base):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), NOBODY, NOBODY)
        common = ["--workspace", str(ws.root), "--state-dir", str(state)]
        for args in (["status"], ["compact-now", "alpha"], ["history", "alpha"]):
            result = subprocess.run(
                [sys.executable, "-m", "memd", *args, *common],
                capture_output=True,
                text=True,
                env={**os.environ, "MEMD_COMPACTION_DRAIN_QUIET_S": "0.1"},
                check=False,
            )
            assert result.returncode == 0, result.stderr
        owners = {path.name: path.stat().st_uid for path in state.iterdir()}
        assert owners and set(owners.values()) == {NOBODY}, owners


@pytest.mark.skipif(not can_switch_uid(), reason="needs root")
@pytest.mark.parametrize("match", [[], ["--match", "turn 3:"]])
def test_root_forget_acts_as_memd_on_a_daemon_owned_agent(match: list[str]) -> None:
    """The daemon's uid owns the agent's .memd/ (and here everything): a root `forget`
    must work on it (AgentDir refuses a .memd/ owned by another uid than its own) and
    leave no root-owned file behind."""
    with reachable_tmp("memd-d7-") as base:
        ws = AgentWorkspace(base / "ws")
        paths = ws.create_agent("alpha", entries=6)
        paths.private_dir.mkdir(mode=0o700)
        paths.archive_dir.mkdir(mode=0o700)
        (paths.archive_dir / "history_2026-01-01_10-00-00.md").write_bytes(
            paths.memory.read_bytes()
        )
        state = base / "state"
        state.mkdir(mode=0o700)
        for root, dirs, files in os.walk(base):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), NOBODY, NOBODY)
        common = ["--workspace", str(ws.root), "--state-dir", str(state)]
        result = subprocess.run(
            [sys.executable, "-m", "memd", "forget", "alpha", *match, "--yes", *common],
            capture_output=True,
            text=True,
            env={**os.environ, "MEMD_COMPACTION_DRAIN_QUIET_S": "0.1"},
            check=False,
        )
        assert result.returncode == 0, result.stderr
        if match:
            assert "turn 3:" not in paths.memory.read_text()
            assert "turn 2:" in paths.memory.read_text()
        else:
            assert not paths.memory.exists()
        owners = {
            os.path.join(root, name): os.stat(os.path.join(root, name)).st_uid
            for root, dirs, files in os.walk(base)
            for name in [*dirs, *files]
        }
        assert set(owners.values()) == {NOBODY}, owners


def test_size_text_in_powers_of_1024() -> None:
    assert size_text(0) == "0 B"
    assert size_text(1023) == "1023 B"
    assert size_text(7_578) == "7.4 KiB"
    assert size_text(3 << 20) == "3.0 MiB"
    assert size_text(5 << 30) == "5.0 GiB"
    assert size_text(2 << 40) == "2.0 TiB"
    assert size_text(2 << 50) == "2048.0 TiB"
