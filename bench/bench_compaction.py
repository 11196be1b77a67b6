"""Compaction overhead excluding the LLM call, on the daemon's real path, vs its I/O.

    python bench/bench_compaction.py [--size-mb 1] [--runs 20] [--encrypt] [--first]
        [--keep-recent-tokens N] [--restored] [--builtin]
    python bench/bench_compaction.py --size-mb 10 --runs 5

Each run compacts a MEMORY.md the way the daemon does: the real tokenizer,
the daemon's incremental count of the file handed in (``ThresholdCheck``), made
as the daemon makes it, the file growing a few turns at a time and counted after
each append (so it has the count's marks; ``--restored``: without them, as a
recount from scratch leaves it, or a state DB an older memd wrote), token figures measured
(``measure_tokens=True``), a summarizer that answers at once with a reply long
enough to pass the degenerate-reply check. The drain's quiet window is 0 here
(idle waiting for late writers, not work). The agent has been compacted once
before, as the daemon usually finds it (``--first``: a fresh agent folder, whose
first compaction also creates ``.memd/``, the journal and ``archive/``).

By default two configurations are measured in the same run, their compactions
interleaved: no newest turns kept verbatim, and the daemon's default kept tail
(a tenth of the threshold; here a tenth of the file's tokens, a file just over
its threshold). ``--keep-recent-tokens N`` measures that budget alone.

Printed, as medians over the runs:

* overhead: transaction wall time − summarizer time − pinning − redaction −
  the carried lines' search;
* pinning (facts extracted from every summarized turn and from the reply) and
  redaction (the credential scan of the reply and its pinned facts; what a
  remote summarizer is sent is redacted inside the summarizer), timed apart;
* the I/O floor, measured in the same run on the same file: read it, sha256 it,
  write and fsync a copy (the archive) and a small new file, fsync the folder;
* the ratio overhead / I/O floor (target ≤ 2 at 10 MB);
* reading the turns: splitting the turns since the last summary out of the
  snapshot and decoding them, timed apart on the archived bytes. The
  transaction itself reads only the newest entries and the last summary
  block; every turn is read once, by the pinning pass that takes it (so this
  is inside the pinning figure), as a summarizer's prompt building reads it
  inside the summarizer's time. The ratio with it added is printed too.

The summarizer here answers at once: the builtin summarizer (or a model) is
the "LLM call" the overhead excludes, prompt building included. ``--builtin``
also times the builtin summarizer on each snapshot, apart (what a daemon with
``model = "builtin"`` spends where a model call would be).

``--encrypt`` measures plain and encrypted archives ([privacy] encrypt_archives)
in the same run and prints both, and the ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import memd.compaction
import memd.core.summary_block as summary_block
from memd.archive_crypto import generate_master_key
from memd.compaction import CompactionOptions, ProvidedSummary, ThresholdCheck, compact_agent
from memd.core.memfile import parse
from memd.core.privacy import Redactor
from memd.core.summary import SummaryRequest, SummaryResult
from memd.counting import TrackedCount, count_file
from memd.summarizers import BuiltinSummarizer
from memd.tokenizer import TokenCounter
from memd.workspace import AgentPaths, agent_paths


class InstantSummarizer:
    """Answers at once, with about one word per 400 bytes summarized (past the
    degenerate-reply floor, 0.5 % of the input's tokens)."""

    model = "bench"

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        words = max(40, request.document.size // 400)
        return SummaryResult(text="summary " * words, model="bench")


class Stopwatch:
    """Wraps module functions to add up the time spent in them."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, module: Any, name: str) -> None:
        inner: Callable[..., Any] = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        setattr(module, name, timed)


PINNING = Stopwatch()
# The search for decisions, open tasks, errors and people a model's reply may drop
# (memd.core.carry, s11): it runs on every turn summarized, for any model but the
# builtin one (this bench's stand-in is a model), so apart like pinning.
CARRY = Stopwatch()
CARRY.wrap(memd.compaction, "carry_material")
REDACTION = Stopwatch()
for _name in ("pins_of_entries", "covered_keys", "carried_pins"):
    PINNING.wrap(summary_block, _name)
REDACTION.wrap(Redactor, "redact")  # the reply and its pinned facts, before writing
# The search of the summarized material for credential values the reply may repeat
# (a summarizer given the material as written, as this stand-in says it is).
REDACTION.wrap(Redactor, "values_in_document")


def make_memory(path: Path, size: int, *, append: bool = False) -> None:
    """A MEMORY.md of about ``size`` bytes: a header and turns, or (``append``)
    turns added to the file there is."""
    header = (
        "# Agent Memory\n\n**Conversation:** bench\n**Created:** 2026-01-01T00:00:00\n\n"
        "---\n\n## Interaction Log\n\n"
    )
    parts = [] if append else [header]
    total = path.stat().st_size if append else len(header)
    with path.open("a" if append else "w", encoding="utf-8") as out:
        out.write("".join(parts) + "".join(turns(size - total)))


def turns(size: int) -> list[str]:
    """Turns of about ``size`` bytes in all."""
    stamp = datetime.datetime(2026, 1, 1).isoformat()
    blocks: list[str] = []
    total = 0
    while total < size:
        index = len(blocks)
        block = f"### Human — {stamp}\n\nturn {index}: " + "some words here " * 40 + "\n\n---\n\n"
        blocks.append(block)
        total += len(block.encode())
    return blocks


# Turns per append in grow(): what one debounced count of a busy agent takes in.
BURST = 4


def grow(path: Path, size: int, tokenizer: TokenCounter) -> TrackedCount:
    """Append turns to ``path`` until it holds about ``size`` bytes, a few at a time,
    counting the file after each append as the daemon does (its incremental count,
    marks included): what the daemon has in memory when the file reaches its
    threshold."""
    counted, _kind = count_file(path, None, tokenizer.count_bytes, junction_cut=True)
    blocks = turns(size - path.stat().st_size)
    with path.open("a", encoding="utf-8") as out:
        for start in range(0, len(blocks), BURST):
            out.write("".join(blocks[start : start + BURST]))
            out.flush()
            counted, _kind = count_file(path, counted, tokenizer.count_bytes, junction_cut=True)
    return counted


def compacted_before(paths: AgentPaths) -> None:
    """The agent as the daemon usually finds it: compacted before (its .memd/
    folder, lock, journal and archive folder exist; MEMORY.md starts with a
    summary block)."""
    make_memory(paths.memory, 8192)
    compact_agent(
        paths,
        ProvidedSummary("Earlier turns: the bench agent said some words."),
        CompactionOptions(drain_quiet_s=0.0, drain_max_s=1.0, require_shrink=False),
        manual=True,
    )


def io_floor(memory: Path, scratch: Path) -> float:
    """Read + sha256 + write and fsync the archive copy and a small new file + fsync dir."""
    started = time.perf_counter()
    data = memory.read_bytes()
    hashlib.sha256(data).hexdigest()
    for name, payload in (("archive.tmp", data), ("new.tmp", data[:4096])):
        fd = os.open(scratch / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
    dir_fd = os.open(scratch, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    elapsed = time.perf_counter() - started
    for name in ("archive.tmp", "new.tmp"):
        (scratch / name).unlink()
    return elapsed


def read_turns(snapshot: bytes) -> float:
    """Split out and decode every turn since the last summary (what pinning reads)."""
    started = time.perf_counter()
    _summary, turns = parse(snapshot).since_summary_texts()
    for _role, _stamp, text in turns:
        assert text
    return time.perf_counter() - started


def builtin_summary(snapshot: bytes, tokenizer: TokenCounter, max_tokens: int) -> float:
    """The builtin summarizer's time on ``snapshot`` (redaction of what it reads included)."""
    request = SummaryRequest(agent="bench", document=parse(snapshot), max_tokens=max_tokens)
    started = time.perf_counter()
    BuiltinSummarizer(tokenizer.count_text).summarize(request)
    return time.perf_counter() - started


@dataclass
class Figures:
    overhead: list[float] = field(default_factory=list)  # excl. pinning and redaction
    pinning: list[float] = field(default_factory=list)
    carry: list[float] = field(default_factory=list)
    redaction: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    turns: list[float] = field(default_factory=list)  # inside pinning; see the docstring
    builtin: list[float] = field(default_factory=list)  # the builtin summarizer, apart
    kept_budget: int = 0  # the kept tail's budget (tokens)


# The daemon keeps a tenth of the threshold verbatim by default: for a file just
# over its threshold, a tenth of its tokens.
DEFAULT_KEEP = -1


def measure(
    size: int,
    runs: int,
    key_file: Path | None,
    *,
    first: bool = False,
    keeps: tuple[int, ...] = (0,),
    builtin: bool = False,
    restored: bool = False,
) -> list[Figures]:
    """Figures for each kept-tail budget in ``keeps`` (DEFAULT_KEEP: the daemon's
    default), their runs interleaved so each sees the same load."""
    tokenizer = TokenCounter("cl100k_base")
    all_figures = [Figures() for _ in keeps]
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        scratch = ws / "scratch"
        scratch.mkdir()
        for run in range(runs):
            for index, keep in enumerate(keeps):
                figures = all_figures[index]
                name = f"a{run}-{index}"
                (ws / "agents" / name).mkdir(parents=True)
                paths = agent_paths(ws, name)
                if first:
                    make_memory(paths.memory, 0)
                else:
                    compacted_before(paths)
                # What the daemon has in memory when it starts the job: its count
                # of the file, made append by append.
                counted = grow(paths.memory, size, tokenizer)
                if restored:
                    # Without marks: a recount, or a state DB an older memd wrote.
                    counted = dataclasses.replace(counted, marks=())
                kept_budget = counted.tokens // 10 if keep == DEFAULT_KEEP else keep
                figures.kept_budget = kept_budget
                figures.floor.append(io_floor(paths.memory, scratch))
                options = CompactionOptions(
                    drain_quiet_s=0.0,
                    drain_max_s=1.0,
                    summary_max_tokens=size // 4,
                    keep_recent_tokens=kept_budget,
                    entries_add_up=True,  # cl100k_base, as from_config sets it
                    key_file=key_file,
                )
                PINNING.seconds = REDACTION.seconds = CARRY.seconds = 0.0
                cpu_start = time.process_time()
                outcome = compact_agent(
                    paths,
                    InstantSummarizer(),
                    options,
                    count_bytes=tokenizer.count_bytes,
                    threshold=ThresholdCheck(counted, threshold_tokens=1),
                )
                figures.cpu.append(time.process_time() - cpu_start)
                figures.pinning.append(PINNING.seconds)
                figures.carry.append(CARRY.seconds)
                figures.redaction.append(REDACTION.seconds)
                figures.overhead.append(
                    outcome.duration_s
                    - outcome.llm_duration_s
                    - PINNING.seconds
                    - CARRY.seconds
                    - REDACTION.seconds
                )
                assert outcome.tokens_before == counted.tokens
                snapshot = outcome.archive.read_bytes()
                figures.turns.append(read_turns(snapshot))
                if builtin:
                    figures.builtin.append(builtin_summary(snapshot, tokenizer, size // 4))
    return all_figures


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms"


def report(label: str, figures: Figures) -> None:
    overhead = sorted(figures.overhead)
    p95 = overhead[min(len(overhead) - 1, int(len(overhead) * 0.95))]
    ratio = statistics.median(overhead) / statistics.median(figures.floor)
    print(
        f"  {label}overhead (excl. pinning, redaction, carried lines) median {_ms(overhead)}, "
        f"p95 {p95 * 1000:.1f} ms; I/O floor median {_ms(figures.floor)}; "
        f"ratio {ratio:.2f} (target <= 2)"
    )
    print(
        f"  {label}pinning median {_ms(figures.pinning)}; redaction median "
        f"{_ms(figures.redaction)}; carried lines' search median {_ms(figures.carry)}; "
        f"cpu median {_ms(figures.cpu)} (all of it)"
    )
    with_turns = statistics.median(
        [o + t for o, t in zip(figures.overhead, figures.turns, strict=True)]
    )
    if figures.builtin:
        print(f"  {label}builtin summarizer (the LLM's stand-in) median {_ms(figures.builtin)}")
    print(
        f"  {label}reading the turns (inside pinning) median {_ms(figures.turns)}; "
        f"overhead with it {with_turns * 1000:.1f} ms, ratio "
        f"{with_turns / statistics.median(figures.floor):.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--encrypt", action="store_true", help="also with encrypted archives")
    parser.add_argument(
        "--first", action="store_true", help="the agent's first compaction (no .memd/ yet)"
    )
    parser.add_argument(
        "--keep-recent-tokens",
        type=int,
        default=None,
        help="newest turns kept verbatim (default: both none and the daemon's default, a "
        "tenth of the threshold, i.e. of the file's tokens, in the same run)",
    )
    parser.add_argument(
        "--builtin", action="store_true", help="also time the builtin summarizer, apart"
    )
    parser.add_argument(
        "--restored",
        action="store_true",
        help="the daemon's count without its marks (as a recount from scratch leaves it, "
        "or one restored from a state DB an older memd wrote)",
    )
    args = parser.parse_args()
    size = int(args.size_mb * 1024 * 1024)
    which = "first compaction" if args.first else "compacted before"
    count = "without its marks" if args.restored else "made append by append"
    keeps = (0, DEFAULT_KEEP) if args.keep_recent_tokens is None else (args.keep_recent_tokens,)
    print(
        f"compaction overhead excl. LLM, daemon path, {args.size_mb:g} MB MEMORY.md, "
        f"{args.runs} runs, agent {which}, count {count}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    plain = measure(
        size,
        args.runs,
        None,
        first=args.first,
        keeps=keeps,
        builtin=args.builtin,
        restored=args.restored,
    )
    for figures in plain:
        label = f"kept tail {figures.kept_budget} tokens: "
        report(("plain archive, " if args.encrypt else "") + label, figures)
    if len(plain) == 2:
        none, kept = plain
        print(
            "  kept tail / none, overhead medians: "
            f"{statistics.median(kept.overhead) / statistics.median(none.overhead):.2f}x"
        )
    if args.encrypt:
        with tempfile.TemporaryDirectory() as keys:
            key_file = Path(keys) / "master.key"
            generate_master_key(key_file)
            sealed = measure(
                size,
                args.runs,
                key_file,
                first=args.first,
                keeps=keeps,
                restored=args.restored,
            )
        for figures, plain_figures in zip(sealed, plain, strict=True):
            report(f"encrypted archive, kept tail {figures.kept_budget} tokens: ", figures)
            ratio = statistics.median(figures.overhead) / statistics.median(plain_figures.overhead)
            print(f"  encrypted / plain overhead median: {ratio:.2f}x")
    print(f"  load average now {os.getloadavg()[0]:.2f}")
    print("  (drain quiet window, default 1.0 s of idle waiting for late writers, not included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
