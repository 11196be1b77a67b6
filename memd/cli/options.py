"""The options several commands share, as Typer parameter types.

Apart from :mod:`memd.cli.common` so that the commands' shared helpers do not
import Typer (``memd status`` runs without it, see :mod:`memd.cli.status_argv`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def path_value(value: str) -> Path:
    """A path option's value, read by memd rather than Click's Path type (memd's
    own checks say an unreadable path in one line, and doctor diagnoses it;
    Click's would be a usage box before any of them runs). An empty value
    (``--workspace "$WS"`` with WS unset) is refused: read as a path it was the
    current folder, where ``forget`` or ``compact-now`` would then act."""
    if not value:
        raise typer.BadParameter(
            "an empty path (an unset variable?): name a path, or leave the option out"
        )
    return Path(value)


WorkspaceOption = Annotated[
    Path | None,
    typer.Option(
        "--workspace",
        "-w",
        help="Workspace root (default: MEMD_WORKSPACE, WORKSPACE_DIR, config, ./agent_workspace).",
        show_default=False,
        parser=path_value,
        metavar="PATH",
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML config file (default: MEMD_CONFIG, else /etc/memd/memd.toml if present).",
        show_default=False,
        parser=path_value,
        metavar="PATH",
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
        parser=path_value,
        metavar="PATH",
    ),
]
