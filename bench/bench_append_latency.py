"""Append → row in the state DB, and daemon CPU per append (issue 13).

    python bench/bench_append_latency.py                     # 1,000 agents, 500 appends/s, 20 s
    python bench/bench_append_latency.py --agents 200 --seconds 10

``memd run`` is a real subprocess with the default debounce (500 ms). A writer
process appends one entry at a time to a random agent at ``--rate`` appends/s in
total and records each append's time and the file's size after it. This process
polls the state DB (what ``memd status`` reads) every ``--poll-ms`` and notes when
each agent's row first shows a size at least that large.

Printed: latency from the *last* append of an agent's burst (no later append to
that agent before its row landed) to the row, p50/p99/max, against the target
debounce + 300 ms; the same from *every* append (a later append inside the
quiet period restarts the debounce, so this is longer by design); the daemon's
CPU seconds per append (psutil, user + system, all threads) against the cost of
tokenizing the appended bytes in this process (target ≤ 2×).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_daemon import Proc, entry, latency_writer, make_memory, write_config

from memd.state import state_db_path
from memd.tokenizer import TokenCounter

DEBOUNCE_MS = 500


class RowWatcher:
    """Polls the agents table; keeps, per agent, when each new size first showed."""

    def __init__(self, db: Path, poll_s: float) -> None:
        self.db = db
        self.poll_s = poll_s
        self.seen: dict[str, list[tuple[float, int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)
        last: dict[str, int] = {}
        while not self._stop.is_set():
            try:
                rows = conn.execute("SELECT agent, size FROM agents").fetchall()
            except sqlite3.OperationalError:
                rows = []
            now = time.time()
            for agent, size in rows:
                if last.get(agent) != size:
                    last[agent] = size
                    self.seen.setdefault(agent, []).append((now, size))
            self._stop.wait(self.poll_s)
        conn.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] * 1000 if ordered else float("nan")


def tokenize_cost(appends: int) -> float:
    """Seconds to tokenize one appended entry, median of a few passes in this process."""
    counter = TokenCounter("cl100k_base")
    blocks = [entry("Human", n, words=20).encode() for n in range(min(appends, 2000))]
    passes = []
    for _ in range(5):
        started = time.process_time()
        for block in blocks:
            counter.count_bytes(block)
        passes.append((time.process_time() - started) / len(blocks))
    return sorted(passes)[len(passes) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=500.0, help="appends/s in total")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--poll-ms", type=float, default=10.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="memd-bench-append-"))
    try:
        ws = root / "ws"
        for n in range(args.agents):
            make_memory(ws / "agents" / f"agent{n:04d}" / "MEMORY.md", f"agent{n:04d}", 2_000)
        config = write_config(
            root / "memd.toml",
            trigger={"context_length": 10**8, "debounce_ms": DEBOUNCE_MS},
        )
        proc = Proc(ws, root / "state", config)
        try:
            proc.wait_event("ready", 300)
            time.sleep(2.0)  # the post-ready flush settles
            watcher = RowWatcher(state_db_path(root / "state", ws), args.poll_ms / 1000)
            watcher.start()
            out = root / "writes.json"
            writer = multiprocessing.Process(
                target=latency_writer,
                args=(str(ws), args.agents, args.rate, args.seconds, str(out)),
            )
            cpu_before = proc.cpu()
            writer.start()
            writer.join(args.seconds + 120)
            time.sleep(DEBOUNCE_MS / 1000 + 1.5)  # the last bursts are counted and flushed
            cpu = proc.cpu() - cpu_before
            watcher.stop()
        finally:
            proc.stop()
        writes = json.loads(out.read_text())
        every: list[float] = []
        last: list[float] = []
        missing = 0
        next_write: dict[int, float] = {}
        by_agent: dict[str, list[int]] = {}
        for index, (agent, _when, _size) in enumerate(writes):
            by_agent.setdefault(agent, []).append(index)
        for indexes in by_agent.values():
            for a, b in itertools.pairwise(indexes):
                next_write[a] = writes[b][1]
        for index, (agent, when, size) in enumerate(writes):
            landed = [t for t, s in watcher.seen.get(agent, []) if s >= size and t >= when]
            if not landed:
                missing += 1
                continue
            at = min(landed)
            every.append(at - when)
            if next_write.get(index, float("inf")) > at:
                last.append(at - when)
        per_append = cpu / max(1, len(writes))
        anchor = tokenize_cost(len(writes))
        target = DEBOUNCE_MS + 300
        print(
            f"append -> state DB row, {args.agents} agents, {len(writes)} appends at "
            f"{len(writes) / args.seconds:.0f}/s, debounce {DEBOUNCE_MS} ms, DB polled every "
            f"{args.poll_ms:g} ms"
        )
        print(
            f"  last append of a burst -> row: p50 {pct(last, 0.5):.0f} ms, "
            f"p99 {pct(last, 0.99):.0f} ms, max {pct(last, 1):.0f} ms (target p99 <= {target} ms: "
            f"ratio {pct(last, 0.99) / target:.2f}); {len(last)} bursts"
        )
        print(
            f"  every append -> row: p50 {pct(every, 0.5):.0f} ms, p99 {pct(every, 0.99):.0f} ms, "
            f"max {pct(every, 1):.0f} ms; never landed {missing}"
        )
        print(
            f"  daemon CPU per append {per_append * 1e6:.0f} us vs tokenizing the appended entry "
            f"{anchor * 1e6:.0f} us: ratio {per_append / anchor:.2f} (target <= 2); "
            f"daemon CPU {cpu:.2f} s = {100 * cpu / args.seconds:.0f} % of a core"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
