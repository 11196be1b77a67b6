"""Shared CLI plumbing: a root CLI in the daemon's state dir acts as its owner."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.memfiles import AgentWorkspace
from support.other_uid import NOBODY, can_switch_uid, reachable_tmp


@pytest.mark.skipif(not can_switch_uid(), reason="needs root")
def test_root_cli_leaves_no_root_owned_files_in_the_daemons_state_dir() -> None:
    with reachable_tmp("memd-d6-") as base:
        ws = AgentWorkspace(base / "ws")
        ws.create_agent("alpha", entries=12)
        state = base / "state"
        state.mkdir(mode=0o700)
        os.chown(state, NOBODY, NOBODY)  # the daemon's user owns its state dir
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
