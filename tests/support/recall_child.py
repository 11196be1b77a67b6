"""Compact one agent, then hand its archive to the recall index (as the daemon and
compact-now do), or die in between.

    python recall_child.py WORKSPACE STATE_DIR AGENT [--crash-before-index]

``--crash-before-index`` sends SIGKILL to itself once the compaction has
returned, before the archive is indexed: the archive exists, the index never
heard of it (the crash the next start must repair).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from memd.compaction import CompactionOptions, ProvidedSummary, compact_agent
from memd.recall.service import RecallService
from memd.workspace import agent_paths


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workspace", type=Path)
    parser.add_argument("state_dir", type=Path)
    parser.add_argument("agent")
    parser.add_argument("--crash-before-index", action="store_true")
    args = parser.parse_args()
    service = RecallService.open(args.state_dir, args.workspace)
    assert service is not None
    paths = agent_paths(args.workspace, args.agent)
    options = CompactionOptions(drain_quiet_s=0.05, drain_max_s=1.0)
    outcome = compact_agent(paths, ProvidedSummary("Summary."), options, manual=True)
    if args.crash_before_index:
        os.kill(os.getpid(), signal.SIGKILL)
    service.index_archive(paths, outcome.archive)
    print(outcome.archive.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
