"""The status query shared by ``memd status`` and ``memd health``: is a daemon live, and
each agent's figures (the daemon's when it runs, else counted from the files).

When a daemon runs on the workspace (a fresh heartbeat in the state DB from a
live pid) the state DB is the source: the daemon counts every file
incrementally and keeps each agent's archive count and bytes and its window
there, so a fleet of 30,000 agents is one query, sorted and cut by SQLite
(:meth:`memd.state.StateStore.fleet_rows`), never a path resolve or a folder
listing per agent. Otherwise the files are counted here, exactly, with the
configured tokenizer; counts are cached in the state DB keyed by (dev, inode,
size, mtime, encoding), so a repeated ``memd status`` does not even load the
tokenizer. The tokenizer and the model map are imported only on the paths that
use them, and litellm never is.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from memd.cli.common import iso_utc
from memd.core.config import MemdConfig, resolve_policy
from memd.core.descriptor import AgentWindow
from memd.errors import MemdError, NotARegularFile
from memd.settings import LoadedConfig
from memd.state import (
    AgentRecord,
    FileKey,
    FleetTotals,
    Heartbeat,
    StateStore,
    StatusRow,
    StatusSort,
)
from memd.workspace import (
    NO_ARCHIVES,
    AgentPaths,
    ArchiveStats,
    agent_paths,
    archive_stats,
    archives_of,
)

Source = Literal["daemon", "files"]
# How many heartbeat intervals may pass before a daemon counts as gone.
HEARTBEAT_INTERVALS = 3.0


@dataclass(frozen=True, slots=True)
class AgentStatus:
    agent: str
    tokens: int
    threshold_tokens: int
    archives: int
    last_compaction_at: float | None
    last_error: str | None
    state: str
    source: Source
    daemon_pid: int | None
    #: Where the window came from ("memd-agent.json", "[trigger]", "model …", "default")
    #: and the tokens the agent reserves per request beside its memory.
    window: str = ""
    reserved_tokens: int = 0
    #: Archives encrypted at rest (``.md.enc``, among ``archives``); such an
    #: agent, or any agent while ``[privacy] encrypt_archives`` is on, has no
    #: recall index ("off").
    encrypted_archives: int = 0
    recall: str = "on"
    #: The last compaction used the builtin summarizer because the model kept failing.
    last_fallback: bool = False
    archive_bytes: int | None = None
    #: The count includes a conservative estimate (a piece too long to tokenize exactly).
    estimated: bool = False
    state_db: str | None = None

    @property
    def percent_used(self) -> float:
        return round(100.0 * self.tokens / max(1, self.threshold_tokens), 1)

    def to_json(self) -> dict[str, Any]:
        # Stable keys: scripts and monitoring parse this (README: "status --json");
        # new keys are only ever added. The same keys, in the same order, as
        # memd.state's SQL-built rows.
        return {
            "agent": self.agent,
            "tokens": self.tokens,
            "threshold_tokens": self.threshold_tokens,
            "percent_used": self.percent_used,
            "archives": self.archives,
            "last_compaction_at": iso_utc(self.last_compaction_at),
            "last_error": self.last_error,
            "state": self.state,
            "source": self.source,
            "window_source": self.window,
            "reserved_tokens": self.reserved_tokens,
            "encrypted_archives": self.encrypted_archives,
            "recall": self.recall,
            "last_compaction_fallback": self.last_fallback,
            "archive_bytes": self.archive_bytes,
            "estimated": self.estimated,
            "daemon_pid": self.daemon_pid,
            "state_db": self.state_db,
        }

    @classmethod
    def of_row(
        cls, row: StatusRow, beat: Heartbeat | None, state_db: str | None, encrypt_archives: bool
    ) -> AgentStatus:
        return cls(
            agent=row.agent,
            tokens=row.tokens,
            threshold_tokens=row.threshold_tokens,
            archives=row.archives or 0,
            last_compaction_at=row.last_compaction_at,
            last_error=row.last_error,
            state=row.state,
            source="daemon",
            daemon_pid=beat.pid if beat else None,
            window=row.window_source,
            reserved_tokens=row.reserved_tokens,
            encrypted_archives=row.encrypted_archives,
            recall=recall_state(row.encrypted_archives, encrypt_archives),
            last_fallback=row.last_fallback,
            archive_bytes=row.archive_bytes,
            estimated=row.estimated,
            state_db=state_db,
        )


# "Needs attention" first (the same order memd.state's SQL sorts by):
# failing, over its threshold, compacting, estimated; then fullest first.
_FAILING = ("error", "breaker_open")
_COMPACTING = ("running", "pending")


def attention_rank(row: AgentStatus) -> int:
    if row.state in _FAILING:
        return 0
    if row.threshold_tokens > 0 and row.tokens >= row.threshold_tokens:
        return 1
    if row.state in _COMPACTING:
        return 2
    return 3 if row.estimated else 4


def _used(row: AgentStatus) -> float:
    return row.tokens / max(row.threshold_tokens, 1)


def sort_rows(rows: Sequence[AgentStatus], sort: StatusSort) -> list[AgentStatus]:
    """What :meth:`StateStore.fleet_rows` does in SQL, for rows built here."""
    keys: dict[StatusSort, Callable[[AgentStatus], Any]] = {
        "attention": lambda r: (attention_rank(r), -_used(r), r.agent),
        "name": lambda r: r.agent,
        "tokens": lambda r: (-r.tokens, r.agent),
        "used": lambda r: (-_used(r), r.agent),
        "archives": lambda r: (-r.archives, -(r.archive_bytes or 0), r.agent),
    }
    return sorted(rows, key=keys[sort])


def recall_state(encrypted_archives: int, encrypt_archives: bool) -> str:
    """An agent with encrypted archives, or any while encryption is on, has no recall index."""
    return "off" if encrypted_archives or encrypt_archives else "on"


def heartbeat_max_age(config: MemdConfig) -> float:
    return HEARTBEAT_INTERVALS * config.daemon.state_flush_s


def live_daemon(store: StateStore, config: MemdConfig, now: float) -> Heartbeat | None:
    """The heartbeat of a daemon that is running right now, if any."""
    beat = store.read_heartbeat()
    if beat is None or beat.stopped:
        return None
    if not beat.is_fresh(now, heartbeat_max_age(config)) or not beat.pid_alive():
        return None
    return beat


@dataclass(frozen=True, slots=True)
class _LastCompaction:
    at: float | None  # when the last successful one ended
    error: str | None  # of the latest attempt, if it failed
    fallback: bool  # the last successful one used the builtin summarizer instead


def _last_compaction(store: StateStore, paths: AgentPaths) -> _LastCompaction:
    history = store.history(paths.agent, limit=50)
    last_error = history[0].error if history else None
    done = next((entry for entry in history if entry.ok), None)
    if done is not None:
        return _LastCompaction(done.started_at + done.duration_s, last_error, done.fallback)
    archives = archives_of(paths)
    if archives:
        try:
            return _LastCompaction(archives[-1].stat().st_mtime, last_error, False)
        except OSError:
            pass
    return _LastCompaction(None, last_error, False)


@dataclass
class _Pending:
    """A file that has to be counted here (no live daemon figure, no cached count)."""

    agent: str
    path: str


def _memory_count(
    store: StateStore, paths: AgentPaths, encoding: str
) -> tuple[int | None, _Pending | None]:
    """(cached or trivial count, or the file to count). Never reads the file itself."""
    try:
        info = paths.memory.stat()
    except FileNotFoundError:
        return 0, None
    if not stat.S_ISREG(info.st_mode):
        raise NotARegularFile(
            "MEMORY.md is not a regular file (a FIFO, device or folder); memd refuses it"
        )
    cached = store.cached_count(paths.agent, FileKey.of(info, encoding))
    if cached is not None:
        return cached, None
    return None, _Pending(paths.agent, str(paths.memory))


def _count_all(
    pending: Sequence[_Pending], encoding: str, max_piece_bytes: int
) -> dict[str, tuple[int, FileKey, bool] | str]:
    """Each pending agent's (count, key of the bytes counted, estimated) or its failure,
    counted in bounded pieces by the fork pool the daemon's start-up uses."""
    if not pending:
        return {}
    from memd.counting import CountJob, count_many, pool_workers
    from memd.tokenizer import shared_counter

    # Loaded before any fork, so forked workers inherit the tokenizer.
    counter = shared_counter(encoding, max_piece_bytes)
    paths = [item.path for item in pending]
    workers = pool_workers(paths)
    jobs = [CountJob(path) for path in paths]
    counted: dict[str, tuple[int, FileKey, bool] | str] = {}
    for index, (tracked, _kind, failure) in count_many(
        jobs, counter.count_bytes, max_piece_bytes=max_piece_bytes, workers=workers
    ):
        agent = pending[index].agent
        if tracked is None:
            gone = (0, FileKey(0, 0, 0, 0, encoding), False)
            counted[agent] = gone if failure is None else failure
            continue
        state = tracked.state
        key = FileKey(state.dev, state.ino, state.size, tracked.mtime_ns, encoding)
        counted[agent] = (tracked.tokens, key, state.estimated)
    return counted


def collect_status(
    loaded: LoadedConfig,
    store: StateStore,
    agents: Sequence[str],
    *,
    strict: bool,
    now: float | None = None,
) -> tuple[list[AgentStatus], Heartbeat | None]:
    """Status of each agent; with ``strict`` a bad agent raises, else it shows as an error row."""
    config = loaded.config
    moment = time.time() if now is None else now
    beat = live_daemon(store, config, moment)
    records: dict[str, AgentRecord] = {}
    if beat is not None and len(agents) == 1:
        found = store.get_agent(agents[0])
        records = {found.agent: found} if found is not None else {}
    elif beat is not None:
        records = {r.agent: r for r in store.agents()}
    encoding = config.tokenizer.encoding

    partial: list[tuple[AgentPaths | None, str, dict[str, Any]]] = []
    pending: list[_Pending] = []
    for name in agents:
        try:
            paths = agent_paths(loaded.workspace, name)
        except MemdError as exc:
            if strict:
                raise
            partial.append((None, name, {"error": str(exc)}))
            continue
        record = records.get(name)
        if record is not None:
            partial.append((paths, name, {"record": record}))
            continue
        try:
            tokens, to_count = _memory_count(store, paths, encoding)
        except OSError as exc:
            if strict:
                raise
            partial.append((paths, name, {"error": f"agent {name!r}: {exc}"}))
            continue
        if to_count is not None:
            pending.append(to_count)
        partial.append((paths, name, {"tokens": tokens}))

    counts = _count_all(pending, encoding, config.tokenizer.max_piece_bytes)
    counted: dict[str, int] = {}
    estimated: set[str] = set()
    to_save: list[tuple[str, FileKey, int]] = []
    for agent, outcome in counts.items():
        if isinstance(outcome, str):
            if strict:
                raise MemdError(f"agent {agent!r}: {outcome}")
            continue
        tokens, key, is_estimate = outcome
        counted[agent] = tokens
        if is_estimate:
            estimated.add(agent)  # not cached: the cache has no room for the mark
        elif key.ino:
            to_save.append((agent, key, tokens))
    if to_save:
        store.save_counts(to_save)

    state_db = str(store.path) if store.path is not None else None
    result: list[AgentStatus] = []
    for maybe_paths, name, info in partial:
        if maybe_paths is None:
            result.append(_error_row(name, str(info["error"]), beat))
            continue
        paths = maybe_paths
        record = info.get("record")
        policy = None
        if isinstance(record, AgentRecord) and record.window_source:
            # The daemon's figures (schema 3): nothing to resolve or list here.
            window, reserved = record.window_source, record.reserved_tokens
        else:
            from memd.modelinfo import context_length_for_model

            policy = resolve_policy(
                config, name, context_length_for_model, _declared_window(paths, encoding)
            )
            window, reserved = policy.window_source, policy.reserved_tokens
        surveyed = record.archive_stats if isinstance(record, AgentRecord) else None
        stats = surveyed if surveyed is not None else archive_stats(paths)
        recall = recall_state(stats.encrypted, config.privacy.encrypt_archives)
        last = _last_compaction(store, paths)
        if isinstance(record, AgentRecord):
            result.append(
                AgentStatus(
                    agent=name,
                    tokens=record.tokens,
                    threshold_tokens=record.threshold_tokens,
                    archives=stats.count,
                    last_compaction_at=record.last_compaction_at,
                    last_error=record.last_error,
                    state=record.state,
                    source="daemon",
                    daemon_pid=beat.pid if beat else None,
                    window=window,
                    reserved_tokens=reserved,
                    encrypted_archives=stats.encrypted,
                    recall=recall,
                    last_fallback=last.fallback,
                    archive_bytes=stats.total_bytes,
                    estimated=record.estimated,
                    state_db=state_db,
                )
            )
            continue
        if "error" in info:
            result.append(_error_row(name, str(info["error"]), beat))
            continue
        tokens = info["tokens"]
        failure = counts.get(name)
        if isinstance(failure, str):
            result.append(_error_row(name, f"agent {name!r}: {failure}", beat))
            continue
        assert policy is not None  # resolved above: no daemon record for this agent
        state = "disabled" if not policy.compress else ("unwatched" if beat else "offline")
        result.append(
            AgentStatus(
                agent=name,
                tokens=counted[name] if tokens is None else int(tokens),
                threshold_tokens=policy.threshold_tokens,
                archives=stats.count,
                last_compaction_at=last.at,
                last_error=last.error,
                state=state,
                source="files",
                daemon_pid=beat.pid if beat else None,
                window=window,
                reserved_tokens=reserved,
                encrypted_archives=stats.encrypted,
                recall=recall,
                last_fallback=last.fallback,
                archive_bytes=stats.total_bytes,
                state_db=state_db,
                estimated=name in estimated,
            )
        )
    return result, beat


def totals_of(rows: Sequence[AgentStatus]) -> FleetTotals:
    """:meth:`StateStore.fleet_totals` for rows built here."""
    return FleetTotals(
        agents=len(rows),
        tokens=sum(r.tokens for r in rows),
        over_threshold=sum(1 for r in rows if 0 < r.threshold_tokens <= r.tokens),
        failing=sum(1 for r in rows if r.state in _FAILING),
        compacting=sum(1 for r in rows if r.state in _COMPACTING),
        estimated=sum(1 for r in rows if r.estimated),
        archives=sum(r.archives for r in rows),
        archive_bytes=sum(r.archive_bytes or 0 for r in rows),
    )


def fleet_in_db(store: StateStore, beat: Heartbeat) -> bool:
    """Whether the daemon's rows are the whole fleet (it wrote a row for every agent it
    watches): then status needs nothing but the DB. False when an agent was added since
    the last flush: the caller lists the folder and fills the gaps."""
    return store.agent_count() == beat.agents


def surveyed_here(workspace: Path, agent: str) -> ArchiveStats:
    """Archive figures the daemon has not surveyed yet (just after an upgrade)."""
    try:
        return archive_stats(agent_paths(workspace, agent))
    except (MemdError, OSError):
        return NO_ARCHIVES


def _declared_window(paths: AgentPaths, encoding: str) -> AgentWindow | None:
    """The agent's memd-agent.json, as the daemon reads it (None when absent or refused)."""
    from memd.descriptor import declared_window
    from memd.tokenizer import TokenCounter

    return declared_window(paths.dir, lambda text: TokenCounter(encoding).count_text(text))


def _error_row(name: str, message: str, beat: Heartbeat | None) -> AgentStatus:
    return AgentStatus(
        agent=name,
        tokens=0,
        threshold_tokens=0,
        archives=0,
        last_compaction_at=None,
        last_error=message,
        state="error",
        source="files",
        daemon_pid=beat.pid if beat else None,
    )


__all__ = [
    "HEARTBEAT_INTERVALS",
    "AgentStatus",
    "attention_rank",
    "collect_status",
    "fleet_in_db",
    "heartbeat_max_age",
    "live_daemon",
    "recall_state",
    "sort_rows",
    "surveyed_here",
    "totals_of",
]
