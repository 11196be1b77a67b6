"""Synthetic Swarms-format transcripts with planted facts, for the retention benchmark.

Each batch is a run of turns as Swarms' ``Conversation`` writes them to MEMORY.md
(``### role — timestamp`` blocks): chat between the user and the agent, the agent's
tool calls, and long tool outputs whose lines mostly repeat one shape (the
distractors a summarizer must see past).  Planted among them: facts of 13 kinds,
3 of each per batch, each carrying a key that occurs nowhere else in the whole run,
so "is this fact still in MEMORY.md?" is a substring test on that key.

Deterministic: the same seed gives the same bytes.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

EM_DASH: Final = "\u2014"
USER_ROLE: Final = "Human"
AGENT_ROLE: Final = "Research-Agent"
TOOL_ROLE: Final = "Tool Executor"

# The facts an agent must never lose (the "durable" kinds).
DURABLE_KINDS: Final = ("path", "url", "date", "version", "command", "identifier", "remember")
OTHER_KINDS: Final = ("quantity", "decision", "task", "error", "preference", "person")
KINDS: Final = DURABLE_KINDS + OTHER_KINDS
FACTS_PER_KIND: Final = 3

_SYLLABLES: Final = [
    "tar",
    "vok",
    "mel",
    "isk",
    "qua",
    "run",
    "zel",
    "kov",
    "bri",
    "dax",
    "fen",
    "lor",
    "mip",
    "nav",
    "osk",
    "pel",
    "quin",
    "ras",
    "sul",
    "tev",
    "ubr",
    "vim",
    "wex",
    "yor",
    "zan",
    "cal",
    "drem",
    "fiv",
    "gul",
    "hax",
]
_FIRST_NAMES: Final = ("Priya", "Tomasz", "Aiyana", "Kofi", "Ilse", "Mateo", "Yuki", "Farah")
_LIBS: Final = ("orjson", "httpx", "pyarrow", "uvloop", "sqlglot", "polars", "grpcio")
_UNITS: Final = ("ms", "GB", "MB", "req/s", "%", "s")

_FILLER_USER: Final = (
    "Can you look into that next?",
    "Thanks, keep going.",
    "What did the last run say?",
    "Let's continue with the ingestion work.",
    "Please double-check before moving on.",
    "OK, that makes sense.",
    "Can you summarize where we are?",
    "Go ahead and run the checks again.",
)
_FILLER_AGENT: Final = (
    "I'll start by reading the current configuration and the recent logs.",
    "Looking at the output, most records are still being processed normally.",
    "The run finished; nothing unusual beyond the usual retries.",
    "I compared the two result sets and they match on the sampled rows.",
    "Next I will check the queue depth and the worker health endpoints.",
    "Everything above looks consistent with what we saw earlier today.",
    "I re-ran the query with a smaller window to keep the output readable.",
    "The worker pool scaled up as expected during the load spike.",
)


@dataclass(frozen=True, slots=True)
class PlantedFact:
    kind: str
    key: str  # occurs in the transcript only where this fact is planted
    sentence: str
    batch: int

    @property
    def durable(self) -> bool:
        return self.kind in DURABLE_KINDS


@dataclass(frozen=True, slots=True)
class Batch:
    index: int
    text: str  # Swarms-format entry blocks, to append to MEMORY.md
    facts: tuple[PlantedFact, ...]


class _Names:
    """Unique random tokens for fact keys (never repeated within a run)."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._used: set[str] = set()

    def unique(self, make: object) -> str:
        assert callable(make)
        while True:
            value = str(make())
            if value not in self._used and not any(value in u or u in value for u in self._used):
                self._used.add(value)
                return value

    def codename(self) -> str:
        rng = self._rng
        return self.unique(
            lambda: "".join(rng.choice(_SYLLABLES) for _ in range(3)) + str(rng.randint(10, 99))
        )


def _fact(kind: str, names: _Names, rng: random.Random, batch: int) -> PlantedFact:
    code = names.codename()
    if kind == "path":
        key = f"/srv/{code}/conf/pipeline-{rng.randint(100, 999)}.yaml"
        sentence = f"The config we should edit lives at {key}, not the copy under /tmp."
    elif kind == "url":
        key = f"https://{code}.example.net/dash/{rng.randint(1000, 9999)}"
        sentence = f"The dashboard for that service is {key} if you need the graphs."
    elif kind == "date":
        key = names.unique(lambda: f"2027-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
        sentence = f"The {code} cutover is scheduled for {key} at 14:30 UTC."
    elif kind == "version":
        key = names.unique(lambda: f"{rng.randint(2, 9)}.{rng.randint(10, 40)}.{rng.randint(1, 9)}")
        sentence = f"We pinned {rng.choice(_LIBS)} to {key} for the {code} workers."
    elif kind == "command":
        key = f"make reindex-{code} SHARD={rng.randint(2, 9)}"
        sentence = f"To rebuild the index, run `{key}` from the repo root."
    elif kind == "identifier":
        choice = rng.randint(0, 2)
        if choice == 0:
            key = names.unique(lambda: f"OPS-{rng.randint(1000, 9999)}")
            sentence = f"I filed this as {key} in the tracker for the {code} team."
        elif choice == 1:
            key = names.unique(lambda: "".join(rng.choice("0123456789abcdef") for _ in range(12)))
            sentence = f"The fix for {code} landed in commit {key} on the main branch."
        else:
            key = f"{code}.db.internal"
            sentence = f"The replica we read from is {key}; the primary is off limits."
    elif kind == "remember":
        key = code
        sentence = f"Remember: the {code} bucket is read-only on Fridays, never write to it then."
    elif kind == "quantity":
        unit = rng.choice(_UNITS)
        key = names.unique(lambda: f"{rng.randint(100, 999)}.{rng.randint(1, 9)} {unit}")
        sentence = f"The budget for the {code} stage is {key} at the 99th percentile."
    elif kind == "decision":
        key = code
        sentence = f"We decided to move the {code} queue to the managed broker, for the retries."
    elif kind == "task":
        key = code
        sentence = f"TODO: the {code} exporter still needs a load test before we ship it."
    elif kind == "error":
        key = code
        sentence = f"ERROR worker {code}: connection reset by peer while flushing the batch"
    elif kind == "preference":
        key = code
        sentence = f"I prefer the {code} report as a CSV attachment rather than inline tables."
    elif kind == "person":
        last = names.unique(lambda: rng.choice(_SYLLABLES).title() + rng.choice(_SYLLABLES))
        key = last
        sentence = f"Our contact on the vendor side is {rng.choice(_FIRST_NAMES)} {last}."
    else:
        raise ValueError(kind)
    return PlantedFact(kind=kind, key=key, sentence=sentence, batch=batch)


def _tool_dump(rng: random.Random, stamp: datetime, lines: int, planted: list[str]) -> str:
    """A JSON-lines dump whose rows repeat one shape; ``planted`` lines go mid-dump."""
    rows = []
    for i in range(lines):
        row = {
            "id": rng.randint(10_000, 99_999),
            "status": rng.choice(("pending", "done", "running", "pending")),
            "ts": (stamp + timedelta(seconds=i)).isoformat(),
            "worker": f"w{rng.randint(1, 64)}",
            "bytes": rng.randint(1_000, 900_000),
        }
        rows.append(json.dumps(row))
    for offset, line in enumerate(planted):
        rows.insert(lines // 2 + offset * 7, line)
    return "Tool Output:\n" + "\n".join(rows)


def _block(role: str, stamp: datetime, content: str) -> str:
    return f"### {role} {EM_DASH} {stamp.isoformat()}\n\n{content}\n\n---\n\n"


def make_batches(count: int = 10, seed: int = 7, dump_lines: int = 75) -> list[Batch]:
    """``count`` batches of ~30-46k cl100k tokens, 39 planted facts each."""
    rng = random.Random(seed)
    names = _Names(rng)
    batches: list[Batch] = []
    clock = datetime(2026, 3, 2, 9, 0, 0)
    for index in range(count):
        facts = [_fact(kind, names, rng, index) for kind in KINDS for _ in range(FACTS_PER_KIND)]
        rng.shuffle(facts)
        errors = [f.sentence for f in facts if f.kind == "error"]
        chat_facts = [f for f in facts if f.kind != "error"]
        blocks: list[str] = []
        dumps = rng.randint(7, 11)
        per_dump_errors: dict[int, list[str]] = {}
        for error in errors:
            per_dump_errors.setdefault(rng.randrange(dumps), []).append(error)
        facts_per_gap = max(1, len(chat_facts) // dumps + 1)
        for dump in range(dumps):
            for _ in range(facts_per_gap):
                if chat_facts:
                    fact = chat_facts.pop()
                    role = (
                        USER_ROLE
                        if fact.kind in {"remember", "preference"}
                        else rng.choice((USER_ROLE, AGENT_ROLE))
                    )
                    clock += timedelta(seconds=rng.randint(20, 200))
                    blocks.append(
                        _block(role, clock, f"{rng.choice(_FILLER_USER)} {fact.sentence}")
                    )
                clock += timedelta(seconds=rng.randint(20, 200))
                blocks.append(_block(AGENT_ROLE, clock, rng.choice(_FILLER_AGENT)))
            clock += timedelta(seconds=rng.randint(5, 60))
            blocks.append(
                _block(AGENT_ROLE, clock, 'Calling tool `query_jobs` with {"limit": 500}')
            )
            clock += timedelta(seconds=rng.randint(5, 60))
            lines = rng.randint(dump_lines * 3 // 4, dump_lines * 5 // 4)
            planted = per_dump_errors.get(dump, [])
            blocks.append(_block(TOOL_ROLE, clock, _tool_dump(rng, clock, lines, planted)))
        for fact in chat_facts:  # anything left over
            clock += timedelta(seconds=rng.randint(20, 200))
            blocks.append(_block(USER_ROLE, clock, fact.sentence))
        batches.append(Batch(index=index, text="".join(blocks), facts=tuple(facts)))
        clock += timedelta(hours=20)
    return batches


def header(conversation: str = "bench-agent", created: str = "2026-03-02T08:59:00") -> str:
    return (
        f"# Agent Memory\n\n**Conversation:** {conversation}\n**Created:** {created}\n\n"
        "---\n\n## Interaction Log\n\n"
    )
