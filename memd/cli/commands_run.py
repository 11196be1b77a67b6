"""``memd run``: the daemon, in the foreground (systemd, docker, a terminal).

The Typer command; the daemon's start is :mod:`memd.cli.run_daemon`. The plain
forms of its arguments are also read without Typer (:mod:`memd.cli.run_argv`,
held to these parameters by a test).
"""

from __future__ import annotations

from typing import Annotated

import typer

from memd.cli.options import ConfigOption, StateDirOption, WorkspaceOption
from memd.cli.run_daemon import LogFormatChoice, LogLevelChoice, run_daemon


def run_command(
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
    poll: Annotated[
        bool | None,
        typer.Option(
            "--poll/--no-poll",
            help="Poll instead of inotify (NFS/CIFS/Docker Desktop mounts). "
            "Default: \\[watch] poll.",
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        LogFormatChoice | None,
        typer.Option(
            "--log-format",
            help="json, console, or auto (JSON unless stderr is a terminal). "
            "Default: \\[log] format.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        LogLevelChoice | None,
        typer.Option("--log-level", help="Default: \\[log] level.", show_default=False),
    ] = None,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="Seed a demo workspace (./memd-demo unless --workspace) with a tiny "
            "context window, so the built-in summarizer compacts it within seconds.",
        ),
    ] = False,
) -> None:
    """Watch every agents/*/MEMORY.md, keep exact token counts, compact over threshold."""
    code = run_daemon(workspace, config, state_dir, poll, log_format, log_level, demo)
    raise typer.Exit(code)
