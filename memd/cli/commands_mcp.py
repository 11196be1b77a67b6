"""``memd mcp --agent NAME``: an MCP server over stdio exposing recall for one agent."""

from __future__ import annotations

from typing import Annotated

import typer

from memd.cli.common import load
from memd.cli.options import ConfigOption, WorkspaceOption
from memd.core.names import validate_agent_name
from memd.errors import ConfigError
from memd.recall.socket_server import socket_path_for
from memd.workspace import agent_paths, require_workspace


def mcp_command(
    agent: Annotated[
        str, typer.Option("--agent", help="The agent whose history to serve.", show_default=False)
    ],
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
) -> None:
    """Serve recall for one agent over stdio (MCP); queries go through the daemon's socket."""
    validate_agent_name(agent)
    loaded = load(workspace, config)
    require_workspace(loaded.workspace)
    # An agent with no folder is refused now, in one line, as every command
    # refuses it: served, each call would only fail, and a runtime that starts
    # the server and closes its stdin would see it exit 0 having served nothing.
    agent_paths(loaded.workspace, agent)
    path = socket_path_for(loaded.config.recall.socket, loaded.workspace.resolve())
    if path is None:
        raise ConfigError('memd mcp needs the recall socket, but [recall] socket = "off"')
    try:
        from memd.recall.mcp_server import serve
    except ImportError:
        raise ConfigError("memd mcp needs the `mcp` package: pip install 'memd[mcp]'") from None
    serve(agent, path)


__all__ = ["mcp_command"]
