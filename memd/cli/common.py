"""Options and error handling shared by every command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memd.settings import LoadedConfig, load_settings

WorkspaceOption = Annotated[
    Path | None,
    typer.Option(
        "--workspace",
        "-w",
        help="Workspace root (default: MEMD_WORKSPACE, WORKSPACE_DIR, config, ./agent_workspace).",
        show_default=False,
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML config file (default: MEMD_CONFIG, else /etc/memd/memd.toml if present).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]
StateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="memd's state dir (default: config state_dir, MEMD_STATE_DIR, "
        "$STATE_DIRECTORY, ~/.local/state/memd).",
        show_default=False,
    ),
]


def load(workspace: Path | None, config: Path | None) -> LoadedConfig:
    return load_settings(config_file=config, workspace=workspace)
