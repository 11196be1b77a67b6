"""Token-counting benchmark: cold scan throughput and incremental append cost.

    python bench/bench_tokens.py [--mb 20] [--appends 600] [--encoding cl100k_base]

Prints figures, asserts nothing (beyond the counts being exact). Both parts time
memd's production code: the cold scan is :func:`memd.counting.count_file` with
no previous count (what the daemon does for a new or rewritten file: read in
blocks, counted in pieces cut at safe boundaries) against one ``encode_ordinary``
call on the decoded bytes (what a naive counter does). The append part writes a
real file and, after each append, calls ``count_file`` with the previous count,
as the daemon's counting thread does (open, ``fstat``, one read of the window, the
old tail and the new bytes, the window check, the new tail tokenized); the anchor
is tokenizing the same appended entries alone, in the same process.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from memd.core.memfile import render_entry, render_header
from memd.core.tokens import JUNCTION_CUT_ENCODINGS
from memd.counting import TrackedCount, count_file
from memd.tokenizer import TokenCounter, load_encoding

_VOCABULARY = (
    "the agent decided to refactor module memory context window token budget summary "
    "user asked for report weather plan error retry backoff deploy build test result "
    "função naïve café 東京 données größe — “quoted” code: def f(x): return x * 2 {} [] "
    "https://example.com/path?q=1 2024-05-01 42 3.14159 0xdeadbeef"
)
WORDS = _VOCABULARY.split()


def make_entry(rng: random.Random, index: int) -> bytes:
    stamp = (datetime(2024, 5, 1) + timedelta(seconds=index)).isoformat()
    lines = []
    for _ in range(rng.randint(1, 6)):
        lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 30))))
    if rng.random() < 0.1:
        lines.append("```python\nfor i in range(10):\n    print(i)\n```")
    role = rng.choice(["User", "Research-Agent", "Tool"])
    return render_entry(role, stamp, "\n".join(lines).capitalize())


def make_file(size: int, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    parts = [render_header("bench", "2024-05-01T00:00:00")]
    total = len(parts[0])
    index = 0
    while total < size:
        entry = make_entry(rng, index)
        parts.append(entry)
        total += len(entry)
        index += 1
    return b"".join(parts)


def best_of(runs: int, func: object) -> tuple[float, int]:
    """Best wall time of ``runs`` (the machine may be shared: best is least disturbed)."""
    assert callable(func)
    best = float("inf")
    result = 0
    for _ in range(runs):
        started = time.perf_counter()
        result = func()
        best = min(best, time.perf_counter() - started)
    return best, result


def cold_scan(counter: TokenCounter, data: bytes, workdir: Path) -> None:
    encoding = counter.encoding
    mb = len(data) / 1e6
    path = workdir / "MEMORY-scan.md"
    path.write_bytes(data)

    def raw() -> int:
        return len(encoding.encode_ordinary(data.decode("utf-8", "replace")))

    def memd_scan() -> int:
        return count_file(path, None, counter.count_bytes)[0].tokens

    raw_s, raw_tokens = best_of(5, raw)
    memd_s, memd_tokens = best_of(5, memd_scan)
    assert raw_tokens == memd_tokens, (raw_tokens, memd_tokens)
    load = os.getloadavg()
    print(
        f"cold scan of {mb:.1f} MB ({raw_tokens:,} tokens; best of 5 wall times; load "
        f"average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs):"
    )
    print(f"  raw encode_ordinary           {raw_s:6.3f} s  {mb / raw_s:6.1f} MB/s  1.00x")
    print(
        f"  memd count_file, one process  {memd_s:6.3f} s  {mb / memd_s:6.1f} MB/s  "
        f"{raw_s / memd_s:.2f}x of raw"
    )


class AppendCost:
    def __init__(self, count_s: float, tokenize_s: float) -> None:
        self.count_s = count_s  # CPU per append, memd's incremental count
        self.tokenize_s = tokenize_s  # CPU per append, tokenizing the entry alone


def append_cost(counter: TokenCounter, size: int, appends: int, workdir: Path) -> AppendCost:
    """CPU seconds per append: ``count_file`` with the previous count (the daemon's
    path) after each append, and tokenizing the same entries alone (median of 3)."""
    rng = random.Random(7)
    path = workdir / f"MEMORY-{size}.md"
    path.write_bytes(make_file(size))
    junction_cut = counter.encoding_name in JUNCTION_CUT_ENCODINGS
    tracked: TrackedCount | None
    tracked, _ = count_file(path, None, counter.count_bytes, junction_cut=junction_cut)
    new_entries = [make_entry(rng, 10**6 + i) for i in range(appends)]
    spent = 0.0
    with path.open("ab", buffering=0) as writer:
        for entry in new_entries:
            writer.write(entry)
            started = time.process_time()
            tracked, _ = count_file(path, tracked, counter.count_bytes, junction_cut=junction_cut)
            spent += time.process_time() - started
    assert tracked.tokens == counter.count_bytes(path.read_bytes()), "incremental count drifted"
    passes = []
    for _ in range(3):
        started = time.process_time()
        for entry in new_entries:
            counter.count_bytes(entry)
        passes.append(time.process_time() - started)
    return AppendCost(spent / appends, statistics.median(passes) / appends)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=20.0, help="file size in MB")
    parser.add_argument("--appends", type=int, default=600)
    parser.add_argument("--encoding", default="cl100k_base")
    args = parser.parse_args()

    load_encoding(args.encoding)
    counter = TokenCounter(args.encoding)
    data = make_file(int(args.mb * 1e6))
    with tempfile.TemporaryDirectory() as tmp:
        cold_scan(counter, data, Path(tmp))
        append_cost(counter, 20_000, 50, Path(tmp))  # warm-up: caches, allocator
        small = append_cost(counter, 20_000, args.appends, Path(tmp))
        large = append_cost(counter, int(args.mb * 1e6), args.appends, Path(tmp))
    print(
        f"incremental count per append (memd.counting.count_file after each of "
        f"{args.appends} appends, CPU per append) vs tokenizing the appended entry alone:"
    )
    for label, cost in (("20 KB file", small), (f"{args.mb:.0f} MB file", large)):
        print(
            f"  {label:12s} {cost.count_s * 1e6:7.1f} us vs {cost.tokenize_s * 1e6:6.1f} us, "
            f"ratio {cost.count_s / cost.tokenize_s:.2f}"
        )
    print(f"  {args.mb:.0f} MB / 20 KB: {large.count_s / small.count_s:.2f}")


if __name__ == "__main__":
    main()
