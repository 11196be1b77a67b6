"""The daemon's services wired as the lifecycle wires them, minus threads: a fake
scheduler that runs jobs when the test says so, a made-up clock, and a scripted
compaction (watchfiles' ``MockRustNotify`` pattern)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memd.core.config import MemdConfig
from memd.counting import count_file
from memd.daemon.counter import CountService
from memd.daemon.entries import EntryCounter, ExitState, RunStats
from memd.daemon.flusher import StateFlusher
from memd.daemon.registry import AgentRegistry
from memd.daemon.runner import Runner
from memd.errors import LockTimeout, NothingToCompact, SummarizerError
from memd.notify import SystemdNotifier
from memd.settings import build_config
from memd.workspace import AgentPaths
from support.memfiles import AgentWorkspace, append_entry, swarms_block, swarms_header
from support.tokens import CL100K

COUNTER = CL100K

# 1000-token context, threshold 500 tokens, low water 300; 40 ms debounce.
CONFIG: dict[str, Any] = {
    "trigger": {"context_length": 1000, "threshold": 0.5, "debounce_ms": 40, "max_wait_ms": 200},
    "summarizer": {"max_tokens": 120},
    "daemon": {
        "retry_base_s": 10,
        "retry_max_s": 40,
        "cooldown_s": 60,
        "breaker_failures": 3,
        "breaker_reset_s": 3600,
    },
}


class Clock:
    """A made-up clock: both the monotonic (debounce) and the wall (jobs) time."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@dataclass
class FakeScheduler:
    """Records what the runner asks for; the test decides when it runs."""

    clock: Clock
    queued: list[tuple[str, Callable[..., None], tuple[Any, ...]]] = field(default_factory=list)
    submitted: list[str] = field(default_factory=list)

    def submit(self, key: str, task: Callable[..., None], *args: Any) -> str:
        self.submitted.append(key)
        self.queued.append((key, task, args))
        return key

    def run_queued(self) -> int:
        """Run the jobs queued so far (not those they queue: the test runs those next)."""
        batch, self.queued = self.queued, []
        for _key, task, args in batch:
            task(*args)
        return len(batch)


class ScriptedCompaction:
    """Stands in for compact_agent: each call pops a behaviour (``ok`` rewrites
    MEMORY.md small, ``big`` still above low water, ``fail``, ``nothing``, ``busy``);
    ``during`` runs inside the job, before it ends (e.g. a writer appending)."""

    def __init__(self, *script: str) -> None:
        self.script = list(script)
        self.calls: list[str] = []
        self.models: list[str | None] = []  # the summarizer each call was given
        self.options: list[Any] = []  # the CompactionOptions each call was given
        self.during: Callable[[AgentPaths], None] | None = None
        # What each call reports it spent on its model (requests, USD), in its
        # outcome or on its error, as compact_agent does; None: the outcome's default.
        self.spent: tuple[int, float | None] | None = None
        self.seeds: list[Any] = []  # the count of its new file each ``ok``/``big`` call made
        self.kwargs: list[dict[str, Any]] = []  # count_bytes, threshold... each call was given

    def __call__(self, paths: AgentPaths, summarizer: Any, options: Any, **kwargs: Any) -> Any:
        behaviour = self.script.pop(0) if self.script else "ok"
        self.kwargs.append(kwargs)
        self.calls.append(paths.agent)
        self.options.append(options)
        self.models.append(getattr(summarizer, "model", None))
        if behaviour == "fail":
            error = SummarizerError(f"agent {paths.agent!r}: scripted failure")
            if self.spent is not None:
                error.model_calls, error.model_cost_usd = self.spent
            raise error
        if behaviour == "nothing":
            raise NothingToCompact(f"agent {paths.agent!r}: nothing to compact")
        if behaviour == "busy":
            raise LockTimeout(f"agent {paths.agent!r}: busy")
        body = "summary " * (5 if behaviour == "ok" else 450)
        tmp = paths.dir / "MEMORY.md.scripted"
        tmp.write_text(swarms_header(paths.agent) + swarms_block("System", body))
        os.replace(tmp, paths.memory)
        tokens = COUNTER.count_bytes(paths.memory.read_bytes())  # what the summary achieved
        # The job's count of the file it wrote, as compact_agent hands it on.
        seed, _kind = count_file(paths.memory, None, COUNTER.count_bytes)
        self.seeds.append(seed)
        if self.during is not None:
            self.during(paths)
        after = COUNTER.count_bytes(paths.memory.read_bytes())
        outcome = _Outcome(paths.dir / "archive", None, after, tokens, counted=seed)
        if self.spent is not None:
            outcome.calls, outcome.cost_usd = self.spent
        return outcome


@dataclass
class _Outcome:
    archive: Path
    tokens_before: int | None
    tokens_after: int | None
    tokens_produced: int | None  # the summary's own size, before ``during`` appends
    model: str = "scripted"
    cost_usd: float | None = None
    llm_duration_s: float = 0.0
    tokens_appended: int | None = None
    pinned: int = 0
    evicted: int = 0
    calls: int = 1
    redacted: int = 0
    reply_redacted: int = 0
    pruned: Any = None
    prune_error: str | None = None
    counted: Any = None  # the job's count of the file it wrote


@dataclass
class Services:
    ws: AgentWorkspace
    clock: Clock
    scheduler: FakeScheduler
    registry: AgentRegistry
    runner: Runner
    counter: CountService
    compact: ScriptedCompaction
    flusher: StateFlusher | None = None
    entry_counter: EntryCounter | None = None

    def fill(self, agent: str, entries: int) -> Path:
        memory = self.ws.root / "agents" / agent / "MEMORY.md"
        for n in range(entries):
            role = "Human" if n % 2 == 0 else "AI"
            append_entry(memory, role, f"{agent} turn {n}: " + "word " * 20)
        return memory

    def hint(self, agent: str) -> None:
        """What the watcher does on a write."""
        self.counter.sink.memory_changed(agent)

    def settle(self) -> float | None:
        """Let the debounce expire and tick once."""
        return self.counter.tick(self.clock.advance(1.0))

    def job(self, agent: str) -> Any:
        entry = self.registry.get(agent)
        assert entry is not None
        return entry.job

    def tokens(self, agent: str) -> int:
        entry = self.registry.get(agent)
        assert entry is not None
        return entry.tokens


def build_services(
    ws: AgentWorkspace,
    compact: ScriptedCompaction,
    extra: dict[str, Any] | None = None,
    summarizer: Any = None,
    after_commit: Any = None,
    exiting: ExitState | None = None,
    wall_clock: Callable[[], float] | None = None,
) -> Services:
    """``wall_clock``: the jobs' time, when not the made-up clock itself (a wall
    clock stepped while the monotonic one runs on)."""
    data = {k: dict(v) for k, v in CONFIG.items()}
    for key, value in (extra or {}).items():
        data.setdefault(key, {}).update(value)
    config: MemdConfig = build_config(data, {})[0]
    clock = Clock()
    scheduler = FakeScheduler(clock)
    registry = AgentRegistry(
        ws.root, config, recover=lambda _paths, _key: None, context_length_of=None
    )
    registry.start(contextlib.ExitStack())
    stats = RunStats()
    flusher = StateFlusher(
        registry,
        stats,
        SystemdNotifier({}),
        "cl100k_base",
        started_at=0.0,
        clock=clock,
    )
    entry_counter = EntryCounter(COUNTER)
    runner = Runner(
        config,
        registry,
        entry_counter,
        flusher,
        stats,
        compact,  # type: ignore[arg-type]
        lambda _config, _count: summarizer,
        clock=wall_clock or clock,
        after_commit=after_commit,
    )
    counter = CountService(
        config.trigger,
        "cl100k_base",
        registry,
        entry_counter,
        runner,
        flusher,
        pool_allowed=False,
        clock=clock,
        wall_clock=wall_clock or clock,
        exiting=exiting,
    )
    # Never stopped: each test's services go with it.
    runner.start(contextlib.ExitStack(), scheduler)  # type: ignore[arg-type]
    entries = [entry for name in sorted(registry.scan()) if (entry := registry.make_entry(name))]
    registry.register(entries, set())
    counter.initial_count(entries, {})
    return Services(
        ws, clock, scheduler, registry, runner, counter, compact, flusher, entry_counter
    )
