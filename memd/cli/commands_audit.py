"""``memd audit [AGENT] [--json]``: the workspace's content-free audit log.

What happened to agents' memories (compactions, prunes, erasures, reloads),
when, by which process and uid; never what the memories held (see
:mod:`memd.core.audit`). An agent that was erased still has its records: the
name is checked for form only, not for existence.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from memd.audit import audit_path, read_audit
from memd.cli.common import load, local_time, state_dir_of
from memd.cli.options import ConfigOption, JsonOption, StateDirOption, WorkspaceOption
from memd.core.audit import AuditRecord, describe_fields
from memd.core.names import validate_agent_name
from memd.workspace import require_workspace


def audit_command(
    agent: Annotated[
        str | None,
        typer.Argument(help="Only this agent's records (default: all).", show_default=False),
    ] = None,
    as_json: JsonOption = False,
    limit: Annotated[
        int | None,
        typer.Option("--limit", "-n", min=1, help="Only the last N records.", show_default=False),
    ] = None,
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """Show the audit log: compactions, prunes, erasures and reloads (never content)."""
    if agent is not None:
        validate_agent_name(agent)
    loaded = load(workspace, config)
    # A mistyped workspace is said as every other command says it, not as an
    # empty log (the log's name is derived from the workspace's path).
    require_workspace(loaded.workspace)
    path = audit_path(state_dir_of(loaded, state_dir), loaded.workspace)
    contents = read_audit(path)
    records = contents.for_agent(agent)
    if limit is not None:
        records = records[-limit:]
    if as_json:
        payload = {
            "log": str(path),
            "records": [record.to_json() for record in records],
            "unreadable_lines": contents.unreadable,
            "newer_format_lines": contents.newer,
        }
        print(json.dumps(payload, indent=2))
    else:
        _print_table(records, path, agent)
    if contents.newer:
        print(
            f"memd: warning: {contents.newer} audit record(s) in a newer format than this memd "
            "reads were skipped; upgrade memd to see them",
            file=sys.stderr,
        )
    if contents.unreadable:
        print(
            f"memd: warning: {contents.unreadable} unreadable line(s) in {path} were skipped",
            file=sys.stderr,
        )


def _print_table(records: tuple[AuditRecord, ...], path: Path, agent: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(emoji=False, highlight=False)
    if not records:
        whose = f" for agent {agent!r}" if agent else ""
        console.print(f"no audit records{whose} in {path}", markup=False)
        return
    now = time.time()
    table = Table(title=f"memd audit: {path}", title_justify="left")
    for column in ("time", "event", "agent", "by", "details"):
        table.add_column(column, overflow="fold")
    for record in records:
        table.add_row(
            local_time(record.ts, now),
            record.event,
            record.agent or "-",
            f"{record.actor} pid {record.pid} uid {record.uid}",
            describe_fields(record),
        )
    console.print(table)


__all__ = ["audit_command"]
