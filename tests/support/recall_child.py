"""Compact one agent with the recall hook installed, and die where the hook runs.

    python recall_child.py WORKSPACE STATE_DIR AGENT [--crash-in-hook]

``--crash-in-hook`` sends SIGKILL to itself when the committed archive is about
to be indexed: the archive exists, the index never heard of it (the crash the
next start must repair).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from memd.compaction import CompactionOptions, ProvidedSummary, compact_agent
from memd.recall.service import RecallService
from memd.workspace import AgentPaths, agent_paths


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workspace", type=Path)
    parser.add_argument("state_dir", type=Path)
    parser.add_argument("agent")
    parser.add_argument("--crash-in-hook", action="store_true")
    args = parser.parse_args()
    service = RecallService.open(args.state_dir, args.workspace)
    assert service is not None

    def hook(paths: AgentPaths, archive: Path) -> None:
        if args.crash_in_hook:
            os.kill(os.getpid(), signal.SIGKILL)
        service.on_archived(paths, archive)

    options = CompactionOptions(drain_quiet_s=0.05, drain_max_s=1.0, on_archived=hook)
    outcome = compact_agent(
        agent_paths(args.workspace, args.agent),
        ProvidedSummary("Summary."),
        options,
        manual=True,
    )
    print(outcome.archive.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
