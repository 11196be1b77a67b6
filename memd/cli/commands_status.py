"""``memd status [AGENT] [--json]``: tokens, threshold, % used, archives, last compaction, errors.

When a daemon runs on the workspace (a fresh heartbeat in the state DB from a
live pid) its figures are shown as they are: it already counts every file
incrementally. Otherwise the files are counted here, exactly, with the
configured tokenizer; counts are cached in the state DB keyed by (dev, inode,
size, mtime, encoding), so a repeated ``memd status`` does not even load the
tokenizer.

Cold start matters (``memd status`` is run by hand and by scripts): rich,
the tokenizer and the model map are imported only on the paths that use them,
and litellm never is.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from memd.cli.app import app
from memd.cli.common import ConfigOption, JsonOption, StateDirOption, WorkspaceOption, load
from memd.core.config import MemdConfig, resolve_policy
from memd.errors import MemdError
from memd.settings import LoadedConfig
from memd.state import AgentRecord, FileKey, Heartbeat, StateStore, resolve_state_dir
from memd.workspace import AgentPaths, agent_paths, archives_of, list_agents, require_workspace

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
        }


def iso_utc(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat(timespec="seconds")


def local_time(epoch: float | None, now: float) -> str:
    if epoch is None:
        return "never"
    stamp = datetime.datetime.fromtimestamp(epoch, datetime.UTC).astimezone()
    stamp_text = stamp.strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp_text} ({ago(now - epoch)})"


def ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def heartbeat_max_age(config: MemdConfig) -> float:
    return HEARTBEAT_INTERVALS * config.daemon.state_flush_s


def open_state(loaded: LoadedConfig, state_dir: Path | None) -> StateStore:
    """The workspace's state DB; its warnings (a rebuilt DB...) go to stderr."""
    directory = resolve_state_dir(state_dir, loaded.config.state_dir)
    store = StateStore.open(directory, loaded.workspace)
    for warning in store.warnings:
        print(f"memd: warning: {warning}", file=sys.stderr)
    return store


def live_daemon(store: StateStore, config: MemdConfig, now: float) -> Heartbeat | None:
    """The heartbeat of a daemon that is running right now, if any."""
    beat = store.read_heartbeat()
    if beat is None or not beat.is_fresh(now, heartbeat_max_age(config)) or not beat.pid_alive():
        return None
    return beat


def _context_length_of(model: str) -> int | None:
    # The model map is only read when an [agents."glob"] table names a model.
    from memd.modelinfo import context_length_for_model

    return context_length_for_model(model)


def _last_compaction(store: StateStore, paths: AgentPaths) -> tuple[float | None, str | None]:
    """(last successful compaction, error of the latest attempt if it failed)."""
    history = store.history(paths.agent, limit=50)
    last_error = history[0].error if history else None
    done = next((entry for entry in history if entry.ok), None)
    if done is not None:
        return done.started_at + done.duration_s, last_error
    archives = archives_of(paths)
    if archives:
        try:
            return archives[-1].stat().st_mtime, last_error
        except OSError:
            pass
    return None, last_error


@dataclass
class _Pending:
    """A file that has to be counted here (no live daemon figure, no cached count)."""

    agent: str
    key: FileKey
    data: bytes


def _memory_count(
    store: StateStore, paths: AgentPaths, encoding: str
) -> tuple[int | None, _Pending | None]:
    """(cached or trivial count, or the file's bytes to count). Reads only on a cache miss."""
    try:
        cached = store.cached_count(paths.agent, FileKey.of(paths.memory.stat(), encoding))
        if cached is not None:
            return cached, None
        with paths.memory.open("rb") as handle:
            # The key of the bytes actually read (the file may have grown since stat).
            key = FileKey.of(os.fstat(handle.fileno()), encoding)
            return None, _Pending(paths.agent, key, handle.read())
    except FileNotFoundError:
        return 0, None


_PARALLEL_COUNT_BYTES = 1 << 20


def _count_all(pending: Sequence[_Pending], encoding: str) -> dict[str, int]:
    if not pending:
        return {}
    from memd.tokenizer import count_bytes_with

    # Loaded before any fork, so forked workers inherit the tokenizer.
    count_bytes_with(encoding, b"")
    total = sum(len(item.data) for item in pending)
    workers = min(os.cpu_count() or 1, len(pending))
    if total < _PARALLEL_COUNT_BYTES or workers < 2 or threading.active_count() > 1:
        return {item.agent: count_bytes_with(encoding, item.data) for item in pending}
    # tiktoken holds the GIL, so only processes use the other cores; fork
    # start-up (~10 ms) pays off once there is about a megabyte to count.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        counts = pool.map(
            count_bytes_with,
            [encoding] * len(pending),
            [item.data for item in pending],
        )
        return {item.agent: count for item, count in zip(pending, counts, strict=True)}


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

    counted = _count_all(pending, encoding)
    if counted:
        store.save_counts((item.agent, item.key, counted[item.agent]) for item in pending)

    result: list[AgentStatus] = []
    for maybe_paths, name, info in partial:
        if maybe_paths is None:
            result.append(_error_row(name, str(info["error"]), beat))
            continue
        paths = maybe_paths
        archives = len(archives_of(paths))
        record = info.get("record")
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
                )
            )
            continue
        if "error" in info:
            result.append(_error_row(name, str(info["error"]), beat))
            continue
        policy = resolve_policy(config, name, _context_length_of)
        tokens = info["tokens"]
        last_at, last_error = _last_compaction(store, paths)
        state = "disabled" if not policy.compress else ("unwatched" if beat else "offline")
        result.append(
            AgentStatus(
                agent=name,
                tokens=counted[name] if tokens is None else int(tokens),
                threshold_tokens=policy.threshold_tokens,
                archives=archives,
                last_compaction_at=last_at,
                last_error=last_error,
                state=state,
                source="files",
                daemon_pid=beat.pid if beat else None,
            )
        )
    return result, beat


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


def render_table(
    rows: Sequence[AgentStatus], beat: Heartbeat | None, now: float, workspace: Path
) -> None:
    from rich.console import Console
    from rich.table import Table

    if beat is not None:
        caption = f"live from daemon pid {beat.pid} (heartbeat {ago(now - beat.ts)})"
        if not beat.healthy:
            caption += f"; daemon unhealthy: {beat.detail}"
    else:
        caption = "no daemon running: counted from the files"
    table = Table(title=f"memd status: {workspace}", caption=caption, title_justify="left")
    for column, justify in (
        ("agent", "left"),
        ("tokens", "right"),
        ("threshold", "right"),
        ("used", "right"),
        ("archives", "right"),
        ("last compaction", "left"),
        ("state", "left"),
        ("last error", "left"),
    ):
        table.add_column(
            column,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=column != "last error",
            overflow="fold",
        )
    for row in rows:
        used = f"{row.percent_used:.1f}%"
        if row.percent_used >= 100:
            used = f"[bold red]{used}[/]"
        elif row.percent_used >= 80:
            used = f"[yellow]{used}[/]"
        table.add_row(
            row.agent,
            f"{row.tokens:,}",
            f"{row.threshold_tokens:,}",
            used,
            str(row.archives),
            local_time(row.last_compaction_at, now),
            row.state,
            _escape(row.last_error or ""),
        )
    # Piped output keeps whole rows rather than rich's 80-column default.
    # emoji=False: rich would import its 3,600-entry emoji table (~0.1 s) to scan for :codes:.
    Console(width=None if sys.stdout.isatty() else 200, emoji=False).print(table)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def status_command(
    agent: str | None,
    workspace: Path | None,
    config: Path | None,
    state_dir: Path | None,
    as_json: bool,
    emit: Callable[[str], None] = print,
) -> list[AgentStatus]:
    loaded = load(workspace, config)
    require_workspace(loaded.workspace)
    names = [agent] if agent is not None else list_agents(loaded.workspace)
    if agent is not None:
        agent_paths(loaded.workspace, agent)  # invalid name / unknown agent: one line, exit
    now = time.time()
    with open_state(loaded, state_dir) as store:
        rows, beat = collect_status(loaded, store, names, strict=agent is not None, now=now)
    if as_json:
        payload: Any = rows[0].to_json() if agent is not None else [r.to_json() for r in rows]
        emit(json.dumps(payload, indent=2))
    elif not rows:
        emit(f"no agents under {loaded.workspace / 'agents'}")
    else:
        render_table(rows, beat, now, loaded.workspace)
    return rows


@app.command("status")
def status(
    agent: Annotated[
        str | None, typer.Argument(help="Only this agent.", show_default=False)
    ] = None,
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per agent: tokens, threshold, % used, archives, last compaction, last error."""
    status_command(agent, workspace, config, state_dir, as_json)


__all__ = [
    "AgentStatus",
    "app",
    "collect_status",
    "heartbeat_max_age",
    "live_daemon",
    "open_state",
    "status_command",
]
