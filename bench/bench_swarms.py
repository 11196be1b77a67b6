"""Prompt tokens per request of a long-running real Swarms agent: without memd, with memd
alone, and with memd + memd_swarms (issue 10).

One agent process per situation runs TURNS tasks in a row (swarms 16.0.3 in its
own venv, MEMD_SWARMS_PYTHON) against a local OpenAI-compatible server that
records every request; prompt tokens are the request's message contents counted
with cl100k_base. memd runs as a real ``memd run`` beside it with a fleet-wide
window of CONTEXT tokens and threshold 0.5; with memd_swarms the agent declares
that same window (Agent(context_length=CONTEXT)) in memd-agent.json, so memd
needs no per-agent config. With ``--max-loops N`` each run makes N requests (swarms'
``max_loops``), each with the run's replies so far.

    MEMD_SWARMS_PYTHON=/path/to/swarms-venv/bin/python \\
        .venv/bin/python bench/bench_swarms.py [--turns 300] [--context 4000] [--max-loops 1]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.daemon_proc import DaemonProcess
from support.openai_server import OpenAITestServer
from support.swarms import SwarmsAgent, swarms_python

from memd.tokenizer import TokenCounter

SYSTEM_PROMPT = "You are the benchmark agent. Answer briefly."
SUMMARY_MARK = "[Compressed Memory Summary]"
TASK = "turn {i}: the user reports progress on item {i} of the quarterly plan. " * 3


def percentile(values: list[int], share: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run_situation(
    root: Path,
    name: str,
    turns: int,
    context: int,
    *,
    memd: bool,
    attach: bool,
    max_loops: int = 1,
) -> dict[str, Any]:
    workspace = root / name / "ws"
    workspace.mkdir(parents=True)
    config = root / name / "memd.toml"
    # A short cooldown: a compaction that ends above the low-water mark (turns
    # drained while it ran) would otherwise pause memd for the default 60 s.
    config.write_text(
        f"[trigger]\nthreshold = 0.5\ncontext_length = {context}\n"
        "debounce_ms = 50\nmax_wait_ms = 200\n"
        "[compaction]\ndrain_quiet_s = 0.1\ndrain_max_s = 2\n[daemon]\ncooldown_s = 0.5\n",
        encoding="utf-8",
    )
    spec = {
        "agent": "bench",
        "system_prompt": SYSTEM_PROMPT,
        "turns": turns,
        "task": TASK,
        "pause_s": 0.05,
        "context_length": context,
        "attach": attach,
        "max_loops": max_loops,
    }
    counter = TokenCounter("cl100k_base")
    with OpenAITestServer() as server:
        daemon = DaemonProcess(workspace, root / name / "state", config=config) if memd else None
        try:
            if daemon is not None:
                daemon.start()
                daemon.wait_ready()
            started = time.monotonic()
            with SwarmsAgent(workspace, server.api_base, spec) as agent:
                report = agent.finish(timeout=3600)
            seconds = time.monotonic() - started
            compactions = len(daemon.events("compacted")) if daemon is not None else 0
            threshold = None
            if daemon is not None:
                read = daemon.events("agent descriptor read")
                reserved = read[-1]["reserved_tokens"] if read else 0
                threshold = int(0.5 * context) - reserved
                daemon.stop()
        finally:
            if daemon is not None:
                daemon.kill()
        sizes = [
            sum(counter.count_text(str(m.get("content") or "")) for m in request.messages)
            for request in server.requests
        ]
        texts = [
            "\n".join(str(m.get("content") or "") for m in r.messages) for r in server.requests
        ]
        # A request inside a run (max_loops over 1) answers the run's task: it must
        # carry it as a user row (memd's summary need not name it).
        tasks = [
            any(
                m.get("role") == "user" and str(m.get("content")).strip() == task
                for m in request.messages
            )
            for index, request in enumerate(server.requests)
            if index % max_loops
            for task in [TASK.format(i=index // max_loops).strip()]
        ]
    # The turn before each run's first request must reach the model (verbatim: memd
    # keeps the newest turns, and one a writer appended to the old file is drained
    # into the new).
    previous = [
        re.search(rf"(?:^|\n)turn {index // max_loops - 1}: ", text) is not None
        for index, text in enumerate(texts)
        if index >= max_loops and index % max_loops == 0
    ]
    return {
        "name": name,
        "requests": len(sizes),
        "median": int(statistics.median(sizes)),
        "p95": percentile(sizes, 0.95),
        "max": max(sizes),
        "last": sizes[-1],
        "summary_share": sum(SUMMARY_MARK in text for text in texts) / len(texts),
        "previous_share": sum(previous) / max(1, len(previous)),
        "task_share": sum(tasks) / len(tasks) if tasks else None,
        "compactions": compactions,
        "rebuilds": report["rebuilds"],
        "drain_waits": report.get("drain_waits"),
        "drain_waited_s": report.get("drain_waited_s"),
        "holds": report.get("holds"),
        "held_s": report.get("held_s"),
        "call_holds": report.get("call_holds"),
        "call_rebuilds": report.get("call_rebuilds"),
        "seconds": seconds,
        "threshold": threshold,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--context", type=int, default=4000, help="the agent's context length")
    parser.add_argument("--max-loops", type=int, default=1, help="requests per run (max_loops)")
    args = parser.parse_args()
    if swarms_python() is None:
        print("swarms is not installed: set MEMD_SWARMS_PYTHON", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-swarms-") as scratch:
        root = Path(scratch)
        situations = (
            ("no memd", False, False),
            ("memd alone", True, False),
            ("memd + memd_swarms", True, True),
        )
        rows = [
            run_situation(
                root,
                name,
                args.turns,
                args.context,
                memd=memd,
                attach=attach,
                max_loops=args.max_loops,
            )
            for name, memd, attach in situations
        ]
    print(
        f"\n{args.turns} turns in one process, {args.max_loops} request(s) per run, context "
        f"{args.context}, threshold 0.5; prompt tokens per request (cl100k_base)"
    )
    columns = ("median", "p95", "max", "last")
    header = f"{'situation':<20} " + " ".join(f"{c:>7}" for c in columns)
    print(
        header
        + f" {'compactions':>12} {'memd threshold':>15} {'summary':>8} {'prev turn':>10} "
        + f"{'run task':>9}"
    )
    for row in rows:
        threshold = "-" if row["threshold"] is None else str(row["threshold"])
        task = "-" if row["task_share"] is None else f"{row['task_share']:.1%}"
        print(
            f"{row['name']:<20} {row['median']:>7} {row['p95']:>7} {row['max']:>7} "
            f"{row['last']:>7} {row['compactions']:>12} {threshold:>15} "
            f"{row['summary_share']:>8.1%} {row['previous_share']:>10.1%} {task:>9}"
        )
    print(
        "summary: requests carrying memd's summary; prev turn: requests carrying the turn "
        "before them verbatim (a run's first request: the turn before the run); run task: "
        "requests inside a run (max_loops over 1) carrying the run's task as a user row"
    )
    for row in rows:
        print(f"{row['name']}: the agent's {args.turns} turns took {row['seconds']:.1f} s")
        if row["rebuilds"] is not None:
            waited = row["drain_waited_s"]
            print(
                f"{row['name']}: {row['rebuilds']} rebuilds, {row['drain_waits']} of them "
                f"waited for memd's drain ({waited if waited is None else round(waited, 2)} s "
                f"in all); {row['holds']} runs waited while memd's count was over the "
                f"threshold ({row['held_s'] if row['held_s'] is None else round(row['held_s'], 2)}"
                f" s in all), {row['call_holds']} of the waits and {row['call_rebuilds']} "
                "rebuilds before a request inside a run"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
