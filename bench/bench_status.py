"""Cold-start time of ``memd status`` (wall time of a fresh process, median of N runs).

Three situations, on a workspace of AGENTS agents × SIZE KB of Swarms-format memory:

* ``daemon live``: a daemon's heartbeat and records are in the state DB (the
  common case on a server): status only reads SQLite;
* ``no daemon, cached``: no daemon, but an earlier ``memd status`` cached the
  counts for these exact file versions: no tokenizer load;
* ``no daemon, cold``: a fresh state dir every run: loads the tokenizer and
  counts every byte.

Target (issue 2): ``memd status`` cold start <= 0.5 s.

    /work/venv/bin/python bench/bench_status.py [--agents 20] [--size-kb 100] [--runs 11]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memd.state import AgentRecord, StateStore


def build_workspace(root: Path, agents: int, size_kb: int) -> None:
    for index in range(agents):
        folder = root / "agents" / f"agent{index:03d}"
        folder.mkdir(parents=True)
        now = datetime.datetime.now().isoformat()
        parts = [
            f"# Agent Memory\n\n**Conversation:** agent{index:03d}\n**Created:** {now}\n\n"
            "---\n\n## Interaction Log\n\n"
        ]
        size = len(parts[0])
        turn = 0
        while size < size_kb * 1024:
            role = "Human" if turn % 2 == 0 else "AI"
            content = (
                f"Turn {turn}: please summarise the quarterly report for region {turn % 7}; "
                "revenue grew 4.2% while costs fell, and the team shipped three features. "
            ) * 3
            block = f"### {role} — {now}\n\n{content.strip()}\n\n---\n\n"
            parts.append(block)
            size += len(block.encode())
            turn += 1
        (folder / "MEMORY.md").write_text("".join(parts), encoding="utf-8")


def time_status(args: list[str], runs: int, fresh_state: Path | None = None) -> list[float]:
    timings = []
    for run in range(runs):
        cmd = [sys.executable, "-m", "memd", "status", *args]
        if fresh_state is not None:
            cmd += ["--state-dir", str(fresh_state / f"run{run}")]
        started = time.perf_counter()
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        timings.append(time.perf_counter() - started)
        if result.returncode != 0:
            raise SystemExit(f"memd status failed: {result.stderr}")
    return timings


def fake_daemon(state_dir: Path, workspace: Path, agents: int) -> None:
    now = time.time()
    with StateStore.open(state_dir, workspace) as store:
        store.write_heartbeat(os.getpid(), now, True, "", agents, now + 3600)
        store.upsert_agents(
            AgentRecord(f"agent{i:03d}", 1, i, 1, 1, 1, 25_000, 180_000, now) for i in range(agents)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--size-kb", type=int, default=100)
    parser.add_argument("--runs", type=int, default=11)
    options = parser.parse_args()
    env_python = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory(prefix="memd-bench-status-") as tmp:
        root = Path(tmp)
        workspace = root / "ws"
        build_workspace(workspace, options.agents, options.size_kb)
        total_mb = options.agents * options.size_kb / 1024
        print(
            f"memd status cold start: {options.agents} agents x {options.size_kb} KB "
            f"({total_mb:.1f} MB), median of {options.runs} runs, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        baseline = []
        for _ in range(options.runs):
            started = time.perf_counter()
            subprocess.run(env_python, check=True)
            baseline.append(time.perf_counter() - started)
        print(f"  python -c pass (interpreter floor)   {statistics.median(baseline):6.3f} s")
        cli_floor = time_status(["--help"], options.runs)
        print(f"  memd status --help (CLI import floor) {statistics.median(cli_floor):6.3f} s")

        live_state = root / "live-state"
        fake_daemon(live_state, workspace, options.agents)
        base = ["-w", str(workspace)]
        results = {
            "daemon live": time_status([*base, "--state-dir", str(live_state)], options.runs),
            "daemon live, --json": time_status(
                [*base, "--state-dir", str(live_state), "--json"], options.runs
            ),
        }
        cached_state = root / "cached-state"
        time_status([*base, "--state-dir", str(cached_state)], 1)  # fills the count cache
        results["no daemon, cached counts"] = time_status(
            [*base, "--state-dir", str(cached_state)], options.runs
        )
        results["no daemon, cold (tokenize all)"] = time_status(
            base, options.runs, fresh_state=root / "fresh"
        )
        for label, timings in results.items():
            median = statistics.median(timings)
            verdict = "ok" if median <= 0.5 else "OVER 0.5 s"
            print(
                f"  memd status, {label:<31} {median:6.3f} s  "
                f"(min {min(timings):.3f}, max {max(timings):.3f})  {verdict}"
            )


if __name__ == "__main__":
    main()
