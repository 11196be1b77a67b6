"""Compaction overhead excluding the LLM call, for a 1 MB MEMORY.md.

    python bench/bench_compaction.py [--size-mb 1] [--runs 20] [--encrypt]

Prints the median and p95 of (transaction wall time − summarizer time), with
the drain quiet window set to 0 (that window is idle waiting for late
writers, not work; it is reported separately), plus CPU time per compaction.
``--encrypt`` measures plain and encrypted archives ([privacy] encrypt_archives)
in the same run and prints both, and the ratio.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from pathlib import Path

from memd.archive_crypto import generate_master_key
from memd.compaction import CompactionOptions, compact_agent
from memd.core.summary import SummaryRequest, SummaryResult
from memd.workspace import agent_paths


class InstantSummarizer:
    model = "bench"

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(text="A short summary of the conversation.", model="bench")


def make_memory(path: Path, size: int) -> None:
    header = (
        "# Agent Memory\n\n**Conversation:** bench\n**Created:** 2026-01-01T00:00:00\n\n"
        "---\n\n## Interaction Log\n\n"
    )
    parts = [header]
    total = len(header)
    index = 0
    while total < size:
        stamp = datetime.datetime(2026, 1, 1).isoformat()
        block = f"### Human — {stamp}\n\nturn {index}: " + "some words here " * 40 + "\n\n---\n\n"
        parts.append(block)
        total += len(block.encode())
        index += 1
    path.write_text("".join(parts), encoding="utf-8")


def measure(size: int, runs: int, key_file: Path | None) -> tuple[list[float], list[float]]:
    overheads: list[float] = []
    cpu: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        for run in range(runs):
            folder = ws / "agents" / f"a{run}"
            folder.mkdir(parents=True)
            make_memory(folder / "MEMORY.md", size)
            paths = agent_paths(ws, f"a{run}")
            options = CompactionOptions(drain_quiet_s=0.0, drain_max_s=1.0, key_file=key_file)
            cpu_start = time.process_time()
            outcome = compact_agent(paths, InstantSummarizer(), options, measure_tokens=False)
            cpu.append(time.process_time() - cpu_start)
            overheads.append(outcome.duration_s - outcome.llm_duration_s)
    overheads.sort()
    return overheads, cpu


def report(label: str, overheads: list[float], cpu: list[float]) -> None:
    p95 = overheads[min(len(overheads) - 1, int(len(overheads) * 0.95))]
    median = statistics.median(overheads)
    print(f"  {label}wall median {median * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms")
    print(f"  {label}cpu  median {statistics.median(cpu) * 1000:.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--encrypt", action="store_true", help="also with encrypted archives")
    args = parser.parse_args()
    size = int(args.size_mb * 1024 * 1024)
    print(f"compaction overhead excl. LLM, {args.size_mb:g} MB MEMORY.md, {args.runs} runs")
    plain = measure(size, args.runs, None)
    report("plain archive:     " if args.encrypt else "", *plain)
    if args.encrypt:
        with tempfile.TemporaryDirectory() as keys:
            key_file = Path(keys) / "master.key"
            generate_master_key(key_file)
            sealed = measure(size, args.runs, key_file)
        report("encrypted archive: ", *sealed)
        ratio = statistics.median(sealed[0]) / statistics.median(plain[0])
        print(f"  encrypted / plain wall median: {ratio:.2f}x")
    print("  (drain quiet window, default 1.0 s of idle waiting for late writers, not included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
