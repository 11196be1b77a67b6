"""What ``memd status [AGENT] [--json]`` prints: tokens, threshold, % used, archives,
last compaction, errors.

The figures come from :mod:`memd.cli.status_query`; this module renders them.
The Typer command is :mod:`memd.cli.commands_status`; nothing here imports
Typer, so the plain forms of the command run without it
(:mod:`memd.cli.status_argv`).
``memd status`` is run by hand, by scripts and by monitoring, on fleets of up
to tens of thousands of agents: the table shows the agents that need
attention first (failing, over threshold, compacting, estimated), with totals,
and only ``--limit`` of them unless ``--all``; ``--json`` streams every agent
as it is read. The table is laid out here (rich measured 78 % of the time of a
30,000-row status) and every line says where its figures came from.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from memd.cli.common import ago, load, local_time, open_state, size_text
from memd.cli.status_query import (
    AgentStatus,
    collect_status,
    fleet_in_db,
    live_daemon,
    recall_state,
    sort_rows,
    surveyed_here,
    totals_of,
)
from memd.core.config import SummarizerConfig
from memd.state import BadRow, FleetTotals, Heartbeat, SpendingRecord, StateStore, StatusSort
from memd.workspace import agent_paths, list_agents, require_workspace

# Rows the table shows without --all / --limit.
DEFAULT_TABLE_ROWS = 20
Emit = Callable[[str], None]

_COLUMNS = (
    ("agent", "<"),
    ("tokens", ">"),
    ("threshold", ">"),
    ("window from", "<"),
    ("used", ">"),
    ("archives", ">"),
    ("last compaction", "<"),
    ("state", "<"),
    ("last error", "<"),
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _clean(text: str) -> str:
    # One row per line whatever an error text holds (and no terminal escapes).
    return _CONTROL.sub(" ", text)


def source_line(store: StateStore, beat: Heartbeat | None, now: float) -> str:
    """Where the figures came from: the daemon (and its heartbeat) or the files, and
    which state DB was read, found how."""
    where = f"state DB {store.path or '(in memory)'} (from {store.found_by or 'the default'})"
    if beat is None:
        return f"no daemon running: counted from the files; {where}"
    line = f"live from daemon pid {beat.pid} (heartbeat {ago(now - beat.ts)}); {where}"
    if not beat.healthy:
        line += f"; daemon unhealthy: {beat.detail}"
    return line


def totals_line(totals: FleetTotals) -> str:
    parts = [
        f"{totals.agents:,} agents",
        f"{totals.tokens:,} tokens",
        f"{totals.over_threshold:,} over threshold",
        f"{totals.failing:,} failing",
        f"{totals.compacting:,} compacting",
    ]
    if totals.estimated:
        parts.append(f"{totals.estimated:,} estimated")
    parts.append(f"{totals.archives:,} archives ({size_text(totals.archive_bytes)})")
    return "totals: " + ", ".join(parts)


def spending_line(
    spending: SpendingRecord | None, summarizer: SummarizerConfig, now: float
) -> str | None:
    """One line on the summarizer's spending caps: what the daemon counted against
    them, and whether they hold compactions back (None when no cap is set and
    nothing holds)."""
    caps = summarizer.max_calls_per_hour > 0 or summarizer.max_usd_per_day > 0
    if spending is None or not (caps or spending.held_reason):
        return None
    parts = []
    calls_cap = summarizer.max_calls_per_hour
    parts.append(
        f"{spending.calls_last_hour:,} model calls in the last hour"
        + (f" (cap {calls_cap:,})" if calls_cap else "")
    )
    usd_cap = summarizer.max_usd_per_day
    parts.append(
        f"${spending.usd_last_day:.4f} in the last 24 h"
        + (f" (cap ${usd_cap:g})" if usd_cap else "")
    )
    line = "summarizer spending: " + ", ".join(parts)
    if spending.held_reason and spending.held_until is not None and spending.held_until > now:
        line += (
            f"; compactions held back until {local_time(spending.held_until, now)}: "
            f"{spending.held_reason}"
        )
    return line


def render_table(
    rows: Sequence[AgentStatus],
    now: float,
    workspace: Path,
    *,
    source: str,
    totals: FleetTotals,
    sort: StatusSort,
    emit: Emit,
    notes: Sequence[str] = (),
) -> None:
    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    cells = [[name for name, _ in _COLUMNS]]
    for row in rows:
        state = row.state + (" (estimated)" if row.estimated else "")
        cells.append(
            [
                _clean(row.agent),
                f"{row.tokens:,}",
                f"{row.threshold_tokens:,}",
                _clean(row.window),
                f"{row.percent_used:.1f}%",
                f"{row.archives:,} ({row.encrypted_archives:,} enc)"
                if row.encrypted_archives
                else f"{row.archives:,}",
                local_time(row.last_compaction_at, now)
                + (" (builtin fallback)" if row.last_fallback else ""),
                state,
                _clean(row.last_error or ""),
            ]
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS) - 1)]
    emit(f"memd status: {workspace}")
    emit(source)
    for note in notes:
        emit(note)
    sealed = sum(1 for row in rows if row.recall == "off")
    if sealed:
        emit(
            f"recall off for {sealed} agent(s): archives encrypted at rest "
            "(memd archive cat AGENT NAME reads one)"
        )
    emit(totals_line(totals))
    lines = []
    for index, line in enumerate(cells):
        parts = []
        for i, (_, align) in enumerate(_COLUMNS[:-1]):
            text = f"{line[i]:{align}{widths[i]}}"
            if colour and index > 0 and i == 4:
                text = _paint(text, rows[index - 1].percent_used)
            parts.append(text)
        parts.append(line[-1])
        lines.append("  ".join(parts).rstrip())
    emit("\n".join(lines))
    if len(rows) < totals.agents:
        order = "those needing attention first" if sort == "attention" else f"by {sort}"
        emit(
            f"showing {len(rows):,} of {totals.agents:,} agents, {order} "
            "(--all for every agent, --limit N, --sort attention|name|tokens|used|archives)"
        )


def _paint(text: str, percent: float) -> str:
    if percent >= 100:
        return f"\x1b[1;31m{text}\x1b[0m"
    if percent >= 80:
        return f"\x1b[33m{text}\x1b[0m"
    return text


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")


class _JsonArray:
    """A JSON array on stdout, one object per line, written chunk by chunk as produced
    (``--json`` streams: a 30,000-agent fleet is never held as one string)."""

    def __init__(self) -> None:
        self._first = True

    def write(self, texts: Sequence[str]) -> None:
        if texts:
            sys.stdout.write(("[\n" if self._first else ",\n") + ",\n".join(texts))
            self._first = False

    def close(self) -> None:
        sys.stdout.write("[]\n" if self._first else "\n]\n")


def status_command(
    agent: str | None,
    workspace: Path | None,
    config: Path | None,
    state_dir: Path | None,
    as_json: bool,
    emit: Emit = _write,
    *,
    show_all: bool = False,
    sort: StatusSort | None = None,
    limit: int | None = None,
) -> None:
    loaded = load(workspace, config)
    require_workspace(loaded.workspace)
    if agent is not None:
        agent_paths(loaded.workspace, agent)  # invalid name / unknown agent: one line, exit
    now = time.time()
    order: StatusSort = sort or ("name" if as_json else "attention")
    cut = (
        None
        if show_all
        else limit
        if limit is not None
        else (None if as_json else DEFAULT_TABLE_ROWS)
    )
    with open_state(loaded, state_dir) as store:
        beat = live_daemon(store, loaded.config, now)
        source = source_line(store, beat, now)
        # The daemon's figures only: without one running, nothing spends or holds.
        spent = spending_line(
            store.read_spending() if beat is not None else None, loaded.config.summarizer, now
        )
        notes = [spent] if spent else []
        if beat is not None and agent is None and fleet_in_db(store, beat):
            # The daemon's DB is the whole fleet: SQLite sorts, cuts and (for
            # --json) writes each object; nothing here per agent.
            if as_json:
                _fleet_json(
                    store,
                    beat,
                    loaded.workspace,
                    order,
                    cut,
                    loaded.config.privacy.encrypt_archives,
                )
                return
            sealed = loaded.config.privacy.encrypt_archives
            totals = store.fleet_totals()
            bad: list[BadRow] = []
            rows = [
                _with_archives(
                    AgentStatus.of_row(row, beat, str(store.path), sealed), loaded.workspace, sealed
                )
                for row in store.fleet_rows(order, cut, bad)
            ]
            notes += [
                f"agent {_clean(row.agent)}: not shown, its state DB row holds {row.value!r:.40}"
                f" in {row.column}, of the wrong type (the daemon writes it anew at its next"
                " count or restart)"
                for row in bad
            ]
            render_table(
                rows,
                now,
                loaded.workspace,
                source=source,
                totals=totals,
                sort=order,
                emit=emit,
                notes=notes,
            )
            return
        names = [agent] if agent is not None else list_agents(loaded.workspace)
        rows, _ = collect_status(loaded, store, names, strict=agent is not None, now=now)
    if as_json:
        if agent is not None:
            emit(json.dumps(rows[0].to_json(), indent=2))
            return
        chosen = sort_rows(rows, order)[:cut] if cut is not None else sort_rows(rows, order)
        array = _JsonArray()
        array.write([json.dumps(row.to_json()) for row in chosen])
        array.close()
    elif not rows:
        emit(f"no agents under {loaded.workspace / 'agents'}")
    else:
        chosen = sort_rows(rows, order)
        render_table(
            chosen[:cut] if cut is not None else chosen,
            now,
            loaded.workspace,
            source=source,
            totals=totals_of(rows),
            sort=order,
            emit=emit,
            notes=notes,
        )


def _with_archives(row: AgentStatus, workspace: Path, encrypt_archives: bool) -> AgentStatus:
    """Archive figures the daemon has not surveyed yet (just after an upgrade)."""
    if row.archive_bytes is not None:
        return row
    import dataclasses

    stats = surveyed_here(workspace, row.agent)
    return dataclasses.replace(
        row,
        archives=stats.count,
        archive_bytes=stats.total_bytes,
        encrypted_archives=stats.encrypted,
        recall=recall_state(stats.encrypted, encrypt_archives),
    )


def _fleet_json(
    store: StateStore,
    beat: Heartbeat,
    workspace: Path,
    order: StatusSort,
    cut: int | None,
    encrypt_archives: bool,
) -> None:
    extra = {"daemon_pid": beat.pid, "state_db": str(store.path)}
    array = _JsonArray()

    def batch(items: list[tuple[str, str, bool]]) -> None:
        texts = [text for text, _, _ in items]
        for index, (text, name, unsurveyed) in enumerate(items):
            if unsurveyed:  # archive figures the daemon has not taken yet
                data = json.loads(text)
                stats = surveyed_here(workspace, name)
                data["archives"], data["archive_bytes"] = stats.count, stats.total_bytes
                data["encrypted_archives"] = stats.encrypted
                data["recall"] = recall_state(stats.encrypted, encrypt_archives)
                texts[index] = json.dumps(data)
        array.write(texts)

    store.fleet_json(order, cut, extra, batch, encrypt_archives=encrypt_archives)
    array.close()


__all__ = [
    "DEFAULT_TABLE_ROWS",
    "render_table",
    "source_line",
    "spending_line",
    "status_command",
]
