"""Run one compaction in a child process, optionally dying at a checkpoint.

    python compaction_child.py WORKSPACE AGENT [--crash-at NAME] [--llm-sleep S]
        [--started-file PATH] [--wait S] [--drain-quiet S] [--log PATH] [--key-file PATH]
        [--keep-recent TOKENS]

``--crash-at`` calls ``os._exit(137)`` at that checkpoint: no finally blocks,
no rollback, exactly like ``kill -9`` at that instant.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from memd.compaction import CompactionOptions, compact_agent
from memd.core.secrets import find_secrets
from memd.core.summary import SummaryRequest, SummaryResult
from memd.errors import MemdError, NothingToCompact
from memd.workspace import agent_paths


class SleepySummarizer:
    def __init__(self, sleep_s: float, started_file: Path | None, log: Path | None) -> None:
        self.sleep_s = sleep_s
        self.started_file = started_file
        self.log = log

    @property
    def model(self) -> str:
        return "test-sleepy"

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        if self.log:
            with self.log.open("a") as handle:
                handle.write(f"start {os.getpid()} {time.time():.6f}\n")
        if self.started_file:
            self.started_file.write_text(str(os.getpid()))
        time.sleep(self.sleep_s)
        count = len([e for e in request.document.entries if not e.is_summary])
        if self.log:
            with self.log.open("a") as handle:
                handle.write(f"end {os.getpid()} {time.time():.6f}\n")
        return SummaryResult(
            text=f"Summary of {count} turns. "
            + "Goals: ship memd. Decisions: the user prefers tea and short answers; compaction keeps every entry exactly once. Open tasks: write the docs, run the crash tests, land the branch.",
            model=self.model,
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workspace", type=Path)
    parser.add_argument("agent")
    parser.add_argument("--crash-at", default="")
    parser.add_argument("--llm-sleep", type=float, default=0.0)
    parser.add_argument("--started-file", type=Path)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--wait", type=float, default=30.0)
    parser.add_argument("--drain-quiet", type=float, default=0.2)
    parser.add_argument("--as-uid", type=int)
    parser.add_argument("--key-file", type=Path, help="encrypt archives with this master key")
    parser.add_argument("--keep-recent", type=int, default=0, help="tokens kept verbatim")
    args = parser.parse_args()

    def checkpoint(name: str) -> None:
        if name == args.crash_at:
            os._exit(137)

    paths = agent_paths(args.workspace, args.agent)
    if args.as_uid is not None:
        # The detector's rules import detect-secrets (and the stdlib modules it
        # needs) lazily: load them while this Python's files are still readable.
        find_secrets("warm up")
        os.setgroups([])
        os.setgid(args.as_uid)
        os.setuid(args.as_uid)
    options = CompactionOptions(
        lock_wait_s=args.wait,
        drain_quiet_s=args.drain_quiet,
        drain_max_s=5.0,
        key_file=args.key_file,
        keep_recent_tokens=args.keep_recent,
    )
    try:
        outcome = compact_agent(
            paths,
            SleepySummarizer(args.llm_sleep, args.started_file, args.log),
            options,
            checkpoint=checkpoint,
        )
    except NothingToCompact:
        print("nothing")
        return 0
    except MemdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print(f"ok {outcome.archive.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
