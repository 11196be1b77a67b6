"""``memd run``: the daemon, in the foreground (systemd, docker, a terminal)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from memd.cli.common import load
from memd.cli.options import ConfigOption, StateDirOption, WorkspaceOption

if TYPE_CHECKING:
    from memd.settings import LoadedConfig

LogFormatChoice = Literal["auto", "json", "console"]
LogLevelChoice = Literal["debug", "info", "warning", "error"]


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
    from memd.daemon import EXIT_FORCED, Daemon, DaemonOptions
    from memd.logs import configure_logging
    from memd.settings import resolve_state_dir
    from memd.threads import name_native_threads

    transform = None
    settings: dict[str, dict[str, Any]] = {}
    if demo:
        from memd.demo import DEMO_DIR, DEMO_SETTINGS, demo_config, seed_demo_workspace

        workspace = (workspace or DEMO_DIR).absolute()
        workspace.mkdir(parents=True, exist_ok=True)
        seed_demo_workspace(workspace)
        transform = demo_config
        settings = DEMO_SETTINGS
    # The daemon's own settings: never another daemon's pointer.
    loaded = load(workspace, config, follow_pointer=False)
    if transform is not None:
        loaded = dataclasses.replace(loaded, config=transform(loaded.config))
    configure_logging(log_format or loaded.config.log.format, log_level or loaded.config.log.level)
    state = resolve_state_dir(state_dir, loaded.config.state_dir)
    _leave_pointer(loaded, state, settings)
    options = DaemonOptions(
        config_file=config,
        workspace_flag=workspace,
        state_dir=state,
        poll=poll,
        log_format=log_format,
        log_level=log_level,
        config_transform=transform,
    )
    name_native_threads()  # `top -H`, `ps -L` and /proc tell the daemon's threads apart
    code = Daemon(loaded, options).run()
    if code == EXIT_FORCED:
        # A forced stop does not wait for a slow LLM call in a worker thread;
        # the transaction is crash-safe, so leave now.
        sys.stderr.flush()
        os._exit(code)
    raise typer.Exit(code)


def _leave_pointer(
    loaded: LoadedConfig, state_dir: Path, settings: dict[str, dict[str, Any]]
) -> None:
    """Tell later commands on this workspace where this daemon's state is and how it is
    set (memd.pointer): `memd status -w WS` then needs no --config or --state-dir."""
    from memd.errors import describe_error
    from memd.logs import get_logger
    from memd.pointer import write_pointer

    if not loaded.workspace.is_dir():
        return  # the daemon refuses it with its own one-line reason
    try:
        path = write_pointer(loaded.workspace, state_dir, config=loaded.source, settings=settings)
    except OSError as exc:
        get_logger("memd.daemon").warning(
            "cannot leave the state pointer in the workspace; "
            "commands there need --state-dir (or the daemon's --config)",
            error=describe_error(exc),
        )
        return
    if settings:
        # Said where the demo's user looks: the log on the terminal.
        get_logger("memd.daemon").info(
            "demo settings saved in the workspace; later commands there use them",
            pointer=str(path),
            settings=settings,
            next=f"memd status --workspace {loaded.workspace}",
        )
