"""Compaction storm (issue 13): N agents cross their threshold at once.

    python bench/bench_storm.py                       # both parts, 200 agents
    python bench/bench_storm.py --part llm            # (a) an LLM that takes 1 s per reply
    python bench/bench_storm.py --part builtin        # (b) the builtin summarizer
    python bench/bench_storm.py --agents 40           # a quick run

``memd run`` is a real subprocess with the defaults that matter here
(``max_concurrent_llm = 2``, the drain's 1 s quiet wait, ``max_concurrent_io``
32). Every agent's MEMORY.md starts just under its threshold; once the daemon is
READY (and has loaded litellm, for (a)) one entry is appended to each, and the
clock runs from the end of those appends to the last ``compacted`` log line.

(a) the summarizer is a local OpenAI-compatible server that answers each
request after ``--llm-seconds``: the limit is agents × llm-seconds / slots (the
LLM slots never idle), printed beside the measured wall-clock as a ratio
(target ≤ 1.2). (b) the builtin summarizer: wall-clock vs the daemon's CPU
seconds (user + system, all threads) over the same window (target ≤ 2).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from bench_daemon import Proc, entry, make_memory, write_config
from support.openai_server import OpenAITestServer

from memd.tokenizer import TokenCounter

SLOTS = 2
FILE_BYTES = 60_000
# A reply the degenerate check accepts for ~15,000 tokens of input.
REPLY = "Goals:\n" + "".join(
    f"- item {n}: the agent planned deployment step {n} with owners and rollback\n"
    for n in range(25)
)


class SlowModel:
    """The server's responder: each reply after ``seconds``; counts replies in flight."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.active = 0
        self.peak = 0
        self._lock = threading.Lock()

    def __call__(self, _body: dict[str, Any]) -> str:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            time.sleep(self.seconds)
            return REPLY
        finally:
            with self._lock:
                self.active -= 1


def _count_events(proc: Proc, names: tuple[str, ...]) -> tuple[int, float]:
    """Lines whose event is one of ``names``, and when the last one was read."""
    with proc._cond:
        hits = [when for when, line in proc.lines if line.get("event") in names]
    return len(hits), (max(hits) if hits else 0.0)


def _wait_for(proc: Proc, names: tuple[str, ...], count: int, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while True:
        seen, last = _count_events(proc, names)
        if seen >= count:
            return last
        if time.monotonic() > deadline or proc.proc.poll() is not None:
            raise RuntimeError(f"only {seen} of {count} {names} from memd run")
        time.sleep(0.1)


def storm(part: str, agents: int, llm_seconds: float) -> None:
    root = Path(tempfile.mkdtemp(prefix=f"memd-bench-storm-{part}-"))
    server: OpenAITestServer | None = None
    model = SlowModel(llm_seconds)
    try:
        ws = root / "ws"
        first = ws / "agents" / "agent0000" / "MEMORY.md"
        make_memory(first, "agent0000", FILE_BYTES)
        text = first.read_text(encoding="utf-8")
        for n in range(1, agents):
            path = ws / "agents" / f"agent{n:04d}" / "MEMORY.md"
            path.parent.mkdir(parents=True)
            path.write_text(text, encoding="utf-8")
        tokens = TokenCounter("cl100k_base").count_text(text)
        # Just under the threshold (0.9 of the window); one more entry crosses it.
        context_length = int((tokens + 100) / 0.9) + 1
        summarizer: dict[str, Any] = {"model": "builtin"}
        if part == "llm":
            server = OpenAITestServer(responder=model).start()
            summarizer = {
                "model": "openai/bench-model",
                "api_base": server.api_base,
                "api_key": "sk-bench",
                "context_length": 200_000,
                "timeout_s": 120,
                "retries": 0,
            }
        config = write_config(
            root / "memd.toml",
            trigger={"context_length": context_length},
            summarizer=summarizer,
            daemon={"max_concurrent_llm": SLOTS},
        )
        proc = Proc(ws, root / "state", config)
        try:
            proc.wait_event("ready", 600)
            if part == "llm":
                proc.wait_event("summarizer loaded", 120)
            time.sleep(1.0)  # the post-ready flush and counts settle
            cpu_before = proc.cpu()
            for n in range(agents):
                path = ws / "agents" / f"agent{n:04d}" / "MEMORY.md"
                with path.open("a", encoding="utf-8") as handle:
                    handle.write(entry("Human", n, words=200))
            started = time.monotonic()
            limit = agents * llm_seconds / SLOTS
            timeout = 4 * limit + 300 if part == "llm" else 600
            done = _wait_for(proc, ("compacted", "compaction failed"), agents, timeout)
            cpu = proc.cpu() - cpu_before
            failed, _ = _count_events(proc, ("compaction failed",))
        finally:
            proc.stop()
        wall = done - started
        if part == "llm":
            assert server is not None
            requests = len(server.requests)
            print(
                f"(a) storm of {agents} agents, LLM {llm_seconds:g} s/reply, max_concurrent_llm "
                f"{SLOTS}: all compacted in {wall:.1f} s vs limit {limit:.1f} s "
                f"(agents x {llm_seconds:g} s / {SLOTS} slots): ratio {wall / limit:.2f} "
                f"(target <= 1.2); server saw {requests} requests, "
                f"{requests / wall:.2f}/s, peak {model.peak} in flight; daemon CPU {cpu:.1f} s; "
                f"failed {failed}"
            )
        else:
            print(
                f"(b) storm of {agents} agents, builtin summarizer: all compacted in {wall:.1f} s "
                f"wall vs {cpu:.1f} s daemon CPU (all threads): ratio {wall / max(cpu, 1e-9):.2f} "
                f"(target <= 2); {agents / wall:.1f} compactions/s; failed {failed}"
            )
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["llm", "builtin", "all"], default="all")
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--llm-seconds", type=float, default=1.0)
    args = parser.parse_args()
    for part in ("llm", "builtin"):
        if args.part in (part, "all"):
            storm(part, args.agents, args.llm_seconds)


if __name__ == "__main__":
    main()
