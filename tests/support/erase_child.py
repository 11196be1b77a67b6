"""Run one erase-by-pattern in a child process, optionally dying at a checkpoint.

    python erase_child.py WORKSPACE AGENT PATTERN [--crash-at NAME] [--key-file PATH]

``--crash-at`` calls ``os._exit(137)`` at that checkpoint: no finally blocks,
no cleanup, exactly like ``kill -9`` at that instant.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from memd.erasure import EraseOptions, erase_by_pattern
from memd.errors import MemdError
from memd.workspace import agent_paths


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workspace", type=Path)
    parser.add_argument("agent")
    parser.add_argument("pattern")
    parser.add_argument("--crash-at", default="")
    parser.add_argument("--key-file", type=Path)
    args = parser.parse_args()

    def checkpoint(name: str) -> None:
        if name == args.crash_at:
            os._exit(137)

    options = EraseOptions(
        lock_wait_s=10, drain_quiet_s=0.05, drain_max_s=2.0, key_file=args.key_file
    )
    try:
        outcome = erase_by_pattern(
            agent_paths(args.workspace, args.agent),
            re.compile(args.pattern),
            options,
            checkpoint=checkpoint,
        )
    except MemdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print(f"ok {outcome.removed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
