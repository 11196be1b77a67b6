"""``memd status [AGENT] [--json]``: tokens, threshold, % used, archives, last compaction, errors.

The figures come from :mod:`memd.cli.status_query`; this module renders them.
Cold start matters (``memd status`` is run by hand and by scripts): rich is
imported only when a table is printed.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from memd.cli.common import (
    ConfigOption,
    JsonOption,
    StateDirOption,
    WorkspaceOption,
    ago,
    load,
    local_time,
    open_state,
)
from memd.cli.status_query import AgentStatus, collect_status
from memd.core.config import SummarizerConfig
from memd.state import Heartbeat, SpendingRecord
from memd.workspace import agent_paths, list_agents, require_workspace


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
    beat: Heartbeat | None,
    now: float,
    workspace: Path,
    notes: Sequence[str] = (),
) -> None:
    from rich.console import Console
    from rich.table import Table

    if beat is not None:
        caption = f"live from daemon pid {beat.pid} (heartbeat {ago(now - beat.ts)})"
        if not beat.healthy:
            caption += f"; daemon unhealthy: {beat.detail}"
    else:
        caption = "no daemon running: counted from the files"
    sealed = [row.agent for row in rows if row.recall == "off"]
    if sealed:
        caption += (
            f"; recall off for {len(sealed)} agent(s): archives encrypted at rest "
            "(memd archive cat AGENT NAME reads one)"
        )
    for note in notes:
        caption += f"\n{note}"
    table = Table(title=f"memd status: {workspace}", caption=caption, title_justify="left")
    for column, justify in (
        ("agent", "left"),
        ("tokens", "right"),
        ("threshold", "right"),
        ("window from", "left"),
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
            _escape(row.window),
            used,
            f"{row.archives} ({row.encrypted_archives} enc)"
            if row.encrypted_archives
            else str(row.archives),
            local_time(row.last_compaction_at, now)
            + (" (builtin fallback)" if row.last_fallback else ""),
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
        # The daemon's figures only: without one running, nothing spends or holds.
        spent = spending_line(
            store.read_spending() if beat is not None else None, loaded.config.summarizer, now
        )
    if as_json:
        payload: Any = rows[0].to_json() if agent is not None else [r.to_json() for r in rows]
        emit(json.dumps(payload, indent=2))
    elif not rows:
        emit(f"no agents under {loaded.workspace / 'agents'}")
    else:
        render_table(rows, beat, now, loaded.workspace, [spent] if spent else [])
    return rows


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


__all__ = ["render_table", "spending_line", "status", "status_command"]
