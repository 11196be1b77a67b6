"""The status query shared by ``memd status`` and ``memd health``: is a daemon live, and
each agent's figures (the daemon's when it runs, else counted from the files).

When a daemon runs on the workspace (a fresh heartbeat in the state DB from a
live pid) its figures are used as they are: it already counts every file
incrementally. Otherwise the files are counted here, exactly, with the
configured tokenizer; counts are cached in the state DB keyed by (dev, inode,
size, mtime, encoding), so a repeated ``memd status`` does not even load the
tokenizer. The tokenizer and the model map are imported only on the paths that
use them, and litellm never is.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from memd.cli.common import iso_utc
from memd.core.config import MemdConfig, resolve_policy
from memd.core.descriptor import AgentWindow
from memd.counting import CountJob, count_many, pool_worth_it
from memd.errors import MemdError, NotARegularFile
from memd.modelinfo import context_length_for_model
from memd.settings import LoadedConfig
from memd.state import AgentRecord, FileKey, Heartbeat, StateStore
from memd.workspace import AgentPaths, agent_paths, archives_of

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

    @property
    def percent_used(self) -> float:
        return round(100.0 * self.tokens / max(1, self.threshold_tokens), 1)

    def to_json(self) -> dict[str, Any]:
        # Stable keys: scripts and monitoring parse this.
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
            "daemon_pid": self.daemon_pid,
            "window_source": self.window,
            "reserved_tokens": self.reserved_tokens,
            "encrypted_archives": self.encrypted_archives,
            "recall": self.recall,
            "last_compaction_fallback": self.last_fallback,
        }


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
) -> dict[str, tuple[int, FileKey] | str]:
    """Each pending agent's (count, key of the bytes counted) or its failure, counted in
    bounded pieces by the fork pool the daemon's start-up uses."""
    if not pending:
        return {}
    from memd.tokenizer import shared_counter

    # Loaded before any fork, so forked workers inherit the tokenizer.
    counter = shared_counter(encoding, max_piece_bytes)
    workers = min(os.cpu_count() or 1, len(pending))
    paths = [item.path for item in pending]
    if not pool_worth_it(paths, workers):
        workers = 1
    jobs = [CountJob(path) for path in paths]
    counted: dict[str, tuple[int, FileKey] | str] = {}
    for index, (tracked, _kind, failure) in count_many(
        jobs, counter.count_bytes, max_piece_bytes=max_piece_bytes, workers=workers
    ):
        agent = pending[index].agent
        if tracked is None:
            counted[agent] = (0, FileKey(0, 0, 0, 0, encoding)) if failure is None else failure
            continue
        state = tracked.state
        key = FileKey(state.dev, state.ino, state.size, tracked.mtime_ns, encoding)
        counted[agent] = (tracked.tokens, key)
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
    records: dict[str, AgentRecord] = {r.agent: r for r in store.agents()} if beat else {}
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
    for agent, outcome in counts.items():
        if isinstance(outcome, str):
            if strict:
                raise MemdError(f"agent {agent!r}: {outcome}")
            continue
        counted[agent] = outcome[0]
    to_save = [(a, o[1], o[0]) for a, o in counts.items() if not isinstance(o, str) and o[1].ino]
    if to_save:
        store.save_counts(to_save)

    result: list[AgentStatus] = []
    for maybe_paths, name, info in partial:
        if maybe_paths is None:
            result.append(_error_row(name, str(info["error"]), beat))
            continue
        paths = maybe_paths
        policy = resolve_policy(
            config, name, context_length_for_model, _declared_window(paths, encoding)
        )
        window, reserved = policy.window_source, policy.reserved_tokens
        archive_files = archives_of(paths)
        archives = len(archive_files)
        encrypted = sum(1 for path in archive_files if path.name.endswith(".md.enc"))
        recall = "off" if encrypted or config.privacy.encrypt_archives else "on"
        record = info.get("record")
        last = _last_compaction(store, paths)
        if isinstance(record, AgentRecord):
            result.append(
                AgentStatus(
                    agent=name,
                    tokens=record.tokens,
                    threshold_tokens=record.threshold_tokens,
                    archives=archives,
                    last_compaction_at=record.last_compaction_at,
                    last_error=record.last_error,
                    state=record.state,
                    source="daemon",
                    daemon_pid=beat.pid if beat else None,
                    window=window,
                    reserved_tokens=reserved,
                    encrypted_archives=encrypted,
                    recall=recall,
                    last_fallback=last.fallback,
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
        state = "disabled" if not policy.compress else ("unwatched" if beat else "offline")
        result.append(
            AgentStatus(
                agent=name,
                tokens=counted[name] if tokens is None else int(tokens),
                threshold_tokens=policy.threshold_tokens,
                archives=archives,
                last_compaction_at=last.at,
                last_error=last.error,
                state=state,
                source="files",
                daemon_pid=beat.pid if beat else None,
                window=window,
                reserved_tokens=reserved,
                encrypted_archives=encrypted,
                recall=recall,
                last_fallback=last.fallback,
            )
        )
    return result, beat


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
    "collect_status",
    "heartbeat_max_age",
    "live_daemon",
]
