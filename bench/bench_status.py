"""Wall time of ``memd status`` as whole processes (interpreter start included), median of N runs.

``--part fleet`` (issue 13): a 30,000-agent fleet with a daemon running: agent
folders on disk (MEMORY.md, some archives) and a state DB as the daemon
writes it (schema 3 rows, a live heartbeat). Measured side by side in one run:
``memd status`` (the default view: totals + the agents needing attention),
``--json`` (every agent) and ``--all`` (the table of every agent), against an
anchor process that reads the same rows from SQLite and dumps them as JSON.
Targets: the default view within 4x of the anchor, ``--json`` within 2x.

    python bench/bench_status.py --part fleet [--fleet-agents 30000] [--runs 5]

``--part cold`` (issue 2): three situations, on a workspace of AGENTS agents × SIZE KB of
Swarms-format memory:

* ``daemon live``: a daemon's heartbeat and records are in the state DB (the
  common case on a server): status only reads SQLite;
* ``no daemon, cached``: no daemon, but an earlier ``memd status`` cached the
  counts for these exact file versions: no tokenizer load;
* ``no daemon, cold``: a fresh state dir every run: loads the tokenizer and
  counts every byte.

Target (issue 2): ``memd status`` cold start <= 0.5 s.

    python bench/bench_status.py --part cold [--agents 20] [--size-kb 100] [--runs 11]

Both parts time memd as installed: byte-compiled first, as ``pip install``
does. From an editable checkout with PYTHONDONTWRITEBYTECODE set (as on this
team's machines) every run would otherwise compile memd's sources again,
~0.08 s that no installed memd pays.
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import memd
from memd.state import AgentRecord, StateStore


def compile_memd() -> None:
    """memd's bytecode, as an install has it (see the module docstring)."""
    if not compileall.compile_dir(Path(memd.__file__).parent, quiet=1):
        raise SystemExit("could not byte-compile memd")


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


# ------------------------------------------------------------------ fleet

_ANCHOR = """
import json, sqlite3, sys
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
cursor = conn.execute(
    "SELECT agent, tokens, threshold_tokens, archives, archive_bytes, last_compaction_at,"
    " last_error, state, window_source, reserved_tokens, estimated FROM agents ORDER BY agent"
)
names = [d[0] for d in cursor.description]
sys.stdout.write(json.dumps([dict(zip(names, row)) for row in cursor]))
"""

_STATES = ["idle"] * 95 + ["running", "pending", "error", "breaker_open", "cooldown"]


def build_fleet(workspace: Path, state_dir: Path, agents: int) -> Path:
    """Agent folders on disk and the state DB a daemon watching them writes."""
    header = "# Agent Memory\n\n**Conversation:** {0}\n**Created:** 2026-12-01T10:00:00\n\n---\n\n"
    entry = "### Human — 2026-12-01T10:00:01\n\nhello from {0}\n\n---\n\n"
    now = time.time()
    records = []
    for index in range(agents):
        name = f"agent{index:05d}"
        folder = workspace / "agents" / name
        folder.mkdir(parents=True)
        (folder / "MEMORY.md").write_text(header.format(name) + entry.format(name))
        archives = index % 4
        if archives:
            (folder / "archive").mkdir()
            for n in range(archives):
                (folder / "archive" / f"history_2026-12-01_10-00-0{n}.md").write_text("x" * 2000)
        state = _STATES[index % len(_STATES)]
        records.append(
            AgentRecord(
                name,
                1,
                index,
                400,
                300,
                80,
                (index * 7919) % 200_000,
                180_000,
                now,
                state=state,  # type: ignore[arg-type]
                last_error="summarizer: HTTP 500" if state in ("error", "breaker_open") else None,
                last_compaction_at=now - index if archives else None,
                archives=archives,
                archive_bytes=archives * 2000,
                archive_mtime_ns=1,
                window_source="[trigger]",
            )
        )
    with StateStore.open(state_dir, workspace) as store:
        store.upsert_agents(records)
        # A live pid and a heartbeat that stays fresh for the whole run.
        store.write_heartbeat(os.getpid(), now, True, "", agents, now + 3600)
        assert store.path is not None
        return store.path


def run_process(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{cmd[2:4]} failed: {result.stderr.decode()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def fleet(agents: int, runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="memd-bench-fleet-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        db = build_fleet(root / "ws", root / "state", agents)
        print(
            f"memd status, {agents:,} agents with a daemon's state DB "
            f"(built in {time.perf_counter() - started:.1f} s); median of {runs} runs, "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
        )
        base = [sys.executable, "-m", "memd", "status", "-w", str(root / "ws")]
        base += ["--state-dir", str(root / "state")]
        cases = {
            "anchor: sqlite3 rows -> json.dumps": [sys.executable, "-c", _ANCHOR, str(db)],
            "memd status (default view)": base,
            "memd status --json": [*base, "--json"],
            "memd status --all": [*base, "--all"],
        }
        # Interleaved, so a change of machine load hits every case alike. CPU
        # time (user + system of the whole process) is printed beside the wall
        # time: on a shared machine it is the steadier of the two.
        walls: dict[str, list[float]] = {label: [] for label in cases}
        cpus: dict[str, list[float]] = {label: [] for label in cases}
        for _ in range(runs):
            for label, cmd in cases.items():
                wall, cpu = run_process(cmd)
                walls[label].append(wall)
                cpus[label].append(cpu)
        anchor_label = "anchor: sqlite3 rows -> json.dumps"
        anchor_wall = statistics.median(walls[anchor_label])
        anchor_cpu = statistics.median(cpus[anchor_label])
        targets = {"memd status (default view)": 4.0, "memd status --json": 2.0}
        for label in cases:
            wall, cpu = statistics.median(walls[label]), statistics.median(cpus[label])
            ratio = wall / anchor_wall
            target = targets.get(label)
            verdict = "" if target is None else ("ok" if ratio <= target else "OVER")
            goal = f"(target <= {target:g}x)" if target else ""
            print(
                f"  {label:<34} wall {wall:6.3f} s {ratio:5.2f}x {goal:<17} {verdict:<4}"
                f" | CPU {cpu:6.3f} s {cpu / anchor_cpu:5.2f}x"
                f"  [wall min {min(walls[label]):.3f}, max {max(walls[label]):.3f}]"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("cold", "fleet"), default="cold")
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--fleet-agents", type=int, default=30_000)
    parser.add_argument("--size-kb", type=int, default=100)
    parser.add_argument("--runs", type=int, default=None)
    options = parser.parse_args()
    compile_memd()
    if options.part == "fleet":
        fleet(options.fleet_agents, options.runs or 5)
        return
    options.runs = options.runs or 11
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
