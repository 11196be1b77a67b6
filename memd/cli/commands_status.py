"""``memd status [AGENT] [--json]``: tokens, threshold, % used, archives, last compaction, errors.

The Typer command; what it prints is :mod:`memd.cli.status_view`. The plain
forms of its arguments are also read without Typer (:mod:`memd.cli.status_argv`,
held to these parameters by a test).
"""

from __future__ import annotations

from typing import Annotated

import typer

from memd.cli.options import ConfigOption, JsonOption, StateDirOption, WorkspaceOption
from memd.cli.status_view import DEFAULT_TABLE_ROWS, status_command
from memd.state import StatusSort

SortOption = Annotated[
    StatusSort | None,
    typer.Option(
        "--sort",
        help="attention (failing, over threshold, compacting, estimated first; the table's "
        "default), name (--json's default), tokens, used, archives.",
        show_default=False,
    ),
]


def status(
    agent: Annotated[
        str | None, typer.Argument(help="Only this agent.", show_default=False)
    ] = None,
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="Every agent (the table shows --limit of them).")
    ] = False,
    sort: SortOption = None,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            "-n",
            min=1,
            help=f"At most N agents (table default {DEFAULT_TABLE_ROWS}; --json: all).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Per agent: tokens, threshold, % used, archives, last compaction, last error."""
    status_command(
        agent, workspace, config, state_dir, as_json, show_all=show_all, sort=sort, limit=limit
    )


__all__ = ["status"]
