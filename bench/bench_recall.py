"""Recall: can an agent find a planted fact again from a plain question?

    python bench/bench_recall.py [--mb 256] [--eval-batches 40]

Corpus: one agent whose archives hold ``--eval-batches`` batches of the
retention benchmark's transcripts (bench/transcripts.py: Swarms format, 39
planted facts per batch among long tool dumps), spread evenly among distractor
batches (other seeds; their codenames get a suffix so no distractor repeats a
planted key) until the archives total ``--mb`` megabytes, in ~1 MB archives.

For every planted fact, two questions:

* direct: the way a person asks about it ("When is the tarvokmel42 cutover?"),
  sharing the fact's rare word and a few common ones;
* paraphrase: different words that share only the one rare word with the
  entry ("anything I should know regarding tarvokmel42?").

recall@5: the entry holding the fact is among the first five results of
``RecallIndex.search`` (what ``memd recall`` and the agent tool run). Also
printed: index size vs archive size, index time per MB (``sync_agent``, the
path ``--reindex`` and the daemon's start-up repair take), and query latency
p50/p99 over all questions, measured on the full corpus in one run.

    python bench/bench_recall.py --agents 10000

Many agents instead: one small MEMORY.md each (3 entries, words shared by
every agent beside a word of its own), all in the one index: the first
indexing of every agent (``sync_agent``, what the daemon's start-up pass does
on an empty index), opening the index, the file's size, a query per agent and
one agent's erasure.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from transcripts import _SYLLABLES, Batch, PlantedFact, header, make_batches

from memd.recall.index import RecallIndex, recall_db_path
from memd.workspace import agent_paths

AGENT = "bench-agent"
ARCHIVE_BYTES = 1 << 20
_SYLLABLE_ALTERNATIVES = "|".join(sorted(_SYLLABLES, key=len, reverse=True))
_CODE_RE = re.compile(r"\b(?:" + _SYLLABLE_ALTERNATIVES + r"){3}\d\d\b")
_PERSON_RE = re.compile(r"(vendor side is \w+ )(\w+)")


@dataclass(frozen=True, slots=True)
class Question:
    fact: PlantedFact
    style: str
    text: str


def _code_of(fact: PlantedFact) -> str:
    found = _CODE_RE.search(fact.sentence)
    assert found is not None, fact.sentence
    return found.group(0)


def questions_for(fact: PlantedFact) -> list[Question]:
    if fact.kind == "person":
        rare = fact.key
        direct = f"What is the first name of our vendor contact {rare}?"
    else:
        rare = _code_of(fact)
        direct = {
            "path": f"Which config file should I edit for {rare}?",
            "url": f"Where is the dashboard with the graphs for {rare}?",
            "date": f"When is the {rare} cutover scheduled?",
            "version": f"Which version did we pin for the {rare} workers?",
            "command": f"How do I rebuild the {rare} index?",
            "identifier": f"What was the id or replica we noted for {rare}?",
            "remember": f"Can I write to the {rare} bucket today?",
            "quantity": f"What is the budget of the {rare} stage?",
            "decision": f"What did we decide about the {rare} queue?",
            "task": f"What is still left to do on the {rare} exporter?",
            "error": f"Why did worker {rare} fail?",
            "preference": f"How do I want the {rare} report delivered?",
        }[fact.kind]
    paraphrase = f"anything I should know regarding {rare}?"
    return [Question(fact, "direct", direct), Question(fact, "paraphrase", paraphrase)]


def distractors(pool: list[Batch], copy: int) -> str:
    """A copy of the pool whose codenames and contact names cannot match a planted key."""
    suffix = f"x{copy}"
    text = "".join(batch.text for batch in pool)
    text = _CODE_RE.sub(lambda m: m.group(0) + suffix, text)
    return _PERSON_RE.sub(lambda m: m.group(1) + m.group(2) + suffix, text)


def corpus_chunks(evaluated: list[Batch], pool: list[Batch], mb: int) -> Iterator[str]:
    """Distractor copies with the evaluated batches spread evenly among them."""
    target = mb * 1_000_000
    pool_bytes = len("".join(batch.text for batch in pool).encode())
    copies = max(0, (target - sum(len(b.text.encode()) for b in evaluated)) // pool_bytes)
    every = max(1, copies // max(1, len(evaluated)))
    pending = list(evaluated)
    for copy in range(copies):
        if pending and copy % every == 0:
            yield pending.pop(0).text
        yield distractors(pool, copy)
    for batch in pending:
        yield batch.text


def write_archives(archive_dir: Path, chunks: Iterator[str]) -> int:
    """Write the corpus as ~1 MB archives of whole entries; returns the bytes written."""
    archive_dir.mkdir(parents=True)
    written = 0
    buffer: list[str] = []
    size = 0
    number = 0

    def flush() -> None:
        nonlocal written, number, size
        data = (header(AGENT) + "".join(buffer)).encode()
        day, second = 1 + number // 3600 % 28, number % 3600
        name = f"history_2026-03-{day:02d}_00-{second // 60:02d}-{second % 60:02d}_{number}.md"
        (archive_dir / name).write_bytes(data)
        written += len(data)
        number += 1
        buffer.clear()
        size = 0

    for chunk in chunks:
        for block in chunk.split("\n\n---\n\n"):
            if not block:
                continue
            piece = block + "\n\n---\n\n"
            buffer.append(piece)
            size += len(piece)
            if size >= ARCHIVE_BYTES:
                flush()
    if buffer:
        flush()
    return written


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def query(workspace: Path, evaluated: list[Batch]) -> None:
    """Ask every question; print recall@5 and latency."""
    questions = [q for batch in evaluated for fact in batch.facts for q in questions_for(fact)]
    latencies: list[float] = []
    found: dict[str, list[bool]] = {"direct": [], "paraphrase": []}
    misses: list[Question] = []
    with RecallIndex.open(workspace.parent / "state", workspace) as index:
        cpu0 = time.process_time()
        for question in questions:
            t0 = time.perf_counter()
            hits = index.search(AGENT, question.text, limit=5)
            latencies.append(time.perf_counter() - t0)
            ok = any(question.fact.sentence in hit.text for hit in hits)
            found[question.style].append(ok)
            if not ok:
                misses.append(question)
        cpu = time.process_time() - cpu0
    total = found["direct"] + found["paraphrase"]

    def share(values: list[bool]) -> str:
        return f"{100 * sum(values) / len(values):.1f} %"

    print(
        f"recall@5: {share(total)} of {len(total)} questions (direct {share(found['direct'])}, "
        f"one-rare-word paraphrase {share(found['paraphrase'])})"
    )
    print(
        f"query latency: p50 {1000 * statistics.median(latencies):.1f} ms, "
        f"p99 {1000 * percentile(latencies, 0.99):.1f} ms, max {1000 * max(latencies):.1f} ms "
        f"({len(latencies)} queries, limit 5; CPU {1000 * cpu / len(latencies):.1f} ms/query)"
    )
    for miss in misses[:5]:
        print(f"  missed ({miss.style}, {miss.fact.kind}): {miss.text}")


def many_agents(count: int) -> int:
    """``--agents N``: N agents with a small MEMORY.md each, in one index."""
    import shutil

    base = Path(tempfile.mkdtemp(prefix="memd-bench-recall-agents-"))
    workspace = base / "ws"
    state_dir = base / "state"
    names = [f"agent-{number:05d}" for number in range(count)]
    for number, name in enumerate(names):
        folder = workspace / "agents" / name
        folder.mkdir(parents=True)
        entries = "".join(
            f"### {role} — 2026-03-02T09:0{turn}:00\n\n{text}\n\n---\n\n"
            for turn, (role, text) in enumerate(
                [
                    ("Human", f"Where is the weekly report for the kalomir{number} project?"),
                    ("AI", "The weekly report is in the shared folder, next to the budget."),
                    ("Human", f"Thanks; file the kalomir{number} budget under finance too."),
                ]
            )
        )
        (folder / "MEMORY.md").write_text(header(name) + entries)
    paths = [agent_paths(workspace, name) for name in names]
    try:
        with RecallIndex.open(state_dir, workspace) as index:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            indexed = sum(index.sync_agent(agent).entries for agent in paths)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            wall0 = time.perf_counter()
            for agent in paths:
                index.sync_agent(agent)
            again = time.perf_counter() - wall0
        print(
            f"{count:,} agents, {indexed:,} entries: first indexing {wall:.1f} s wall, "
            f"{cpu:.1f} s CPU; again, files unchanged: {again:.1f} s"
        )
        opening = []
        for _ in range(5):
            wall0 = time.perf_counter()
            with RecallIndex.open(state_dir, workspace):
                opening.append(time.perf_counter() - wall0)
        db = recall_db_path(state_dir, workspace)
        size = sum(
            os.path.getsize(f"{db}{suffix}")
            for suffix in ("", "-wal")
            if os.path.exists(f"{db}{suffix}")
        )
        print(
            f"open: median {1000 * statistics.median(opening):.1f} ms of 5; "
            f"index file {size / 1e6:.1f} MB"
        )
        with RecallIndex.open(state_dir, workspace) as index:
            latencies = []
            cpu0 = time.process_time()
            for number, name in enumerate(names):
                wall0 = time.perf_counter()
                hits = index.search(name, f"weekly report of kalomir{number}?")
                latencies.append(time.perf_counter() - wall0)
                assert hits and f"kalomir{number} " in hits[0].text, (name, hits)
            cpu = time.process_time() - cpu0
            wall0 = time.perf_counter()
            index.erase_agent(names[count // 2])
            erased = time.perf_counter() - wall0
        print(
            f"query, one per agent: p50 {1000 * statistics.median(latencies):.2f} ms, "
            f"p99 {1000 * percentile(latencies, 0.99):.2f} ms "
            f"(CPU {1000 * cpu / count:.2f} ms/query); erasing one agent {erased:.2f} s"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="archive megabytes (1 GB = 1000)")
    parser.add_argument("--eval-batches", type=int, default=40)
    parser.add_argument(
        "--keep",
        type=Path,
        help="build in this folder and keep it; when it already holds a built corpus, "
        "only ask the questions again",
    )
    parser.add_argument(
        "--agents",
        type=int,
        help="measure this many agents with one small MEMORY.md each instead of one large one",
    )
    args = parser.parse_args()
    if args.agents:
        return many_agents(args.agents)

    base = args.keep or Path(tempfile.mkdtemp(prefix="memd-bench-recall-"))
    workspace = base / "ws"
    agent_dir = workspace / "agents" / AGENT
    state_dir = base / "state"
    started = time.perf_counter()
    evaluated = make_batches(args.eval_batches, seed=11)
    if (agent_dir / "archive").is_dir() and state_dir.is_dir():
        print(f"reusing the corpus and index in {base}: query figures only")
        query(workspace, evaluated)
        return 0
    agent_dir.mkdir(parents=True)
    (agent_dir / "MEMORY.md").write_text(header(AGENT))
    pool = make_batches(10, seed=97)
    archive_bytes = write_archives(agent_dir / "archive", corpus_chunks(evaluated, pool, args.mb))
    print(
        f"corpus: {archive_bytes / 1e6:,.0f} MB of archives "
        f"({len(list((agent_dir / 'archive').iterdir()))} files), "
        f"{sum(len(b.facts) for b in evaluated)} planted facts; "
        f"generated in {time.perf_counter() - started:.0f} s"
    )

    paths = agent_paths(workspace, AGENT)
    with RecallIndex.open(state_dir, workspace) as index:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        report = index.sync_agent(paths)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        index._run(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())
        db = recall_db_path(state_dir, workspace)
        index_bytes = sum(
            os.path.getsize(f"{db}{suffix}")
            for suffix in ("", "-wal")
            if os.path.exists(f"{db}{suffix}")
        )
    mb = archive_bytes / 1e6
    print(
        f"index: {report.entries:,} entries; {wall:.1f} s wall ({wall / mb * 1000:.0f} ms/MB), "
        f"{cpu:.1f} s CPU ({cpu / mb * 1000:.0f} ms/MB)"
    )
    print(
        f"index size: {index_bytes / 1e6:,.0f} MB = "
        f"{index_bytes / archive_bytes:.2f} × the archives"
    )
    query(workspace, evaluated)
    if args.keep is None:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
