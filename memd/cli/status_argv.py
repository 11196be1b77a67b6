"""``memd status`` without Typer, for the plain forms of its arguments.

``memd status --json`` is what scripts and monitoring run, over and over, on
fleets of tens of thousands of agents; importing Typer (its click, inspect...)
was a fifth of such a run. :func:`read_status_args` reads the plain forms of
the command's arguments (:mod:`memd.cli.plain_argv`): ``--opt VALUE``,
``--opt=VALUE`` or ``-w VALUE``, an agent name, ``--json`` and ``--all``; into
the values Typer would pass; anything else is left to Typer. A test holds these
tables to the Typer command's parameters (:mod:`memd.cli.commands_status`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from memd.cli.plain_argv import exit_as_typer, read_plain_args
from memd.cli.status_view import status_command
from memd.state import StatusSort

# option -> the status command's parameter it sets
VALUE_OPTIONS: dict[str, str] = {
    "--workspace": "workspace",
    "-w": "workspace",
    "--config": "config",
    "-c": "config",
    "--state-dir": "state_dir",
    "--sort": "sort",
    "--limit": "limit",
    "-n": "limit",
}
FLAGS: dict[str, str] = {"--json": "as_json", "--all": "show_all"}
_SORTS: frozenset[str] = frozenset(get_args(StatusSort))


@dataclass(frozen=True, slots=True)
class StatusArgs:
    """The status command's parameters, as Typer passes them."""

    agent: str | None = None
    workspace: Path | None = None
    config: Path | None = None
    state_dir: Path | None = None
    as_json: bool = False
    show_all: bool = False
    sort: StatusSort | None = None
    limit: int | None = None


def _value(parameter: str, text: str) -> object:
    """What Typer makes of ``text`` for ``parameter``; None when Typer should judge it."""
    if parameter == "sort":
        return text if text in _SORTS else None
    if parameter == "limit":
        # Digits only (int() would also take "+5", " 5", "5_0", other scripts' digits).
        plain = text.isascii() and text.isdigit()
        return int(text) if plain and int(text) >= 1 else None
    return Path(text)


def read_status_args(args: Sequence[str]) -> StatusArgs | None:
    """The arguments after ``status``, or None when they are for Typer to read."""
    values = read_plain_args(
        args,
        flags={option: (parameter, True) for option, parameter in FLAGS.items()},
        options=VALUE_OPTIONS,
        convert=_value,
        positional="agent",
    )
    return None if values is None else StatusArgs(**values)  # type: ignore[arg-type]


def run_status(args: Sequence[str]) -> None:
    """Run ``memd status ARGS`` and exit as Typer's standalone mode does (0; 130 on
    Ctrl-C; 1, quietly, when stdout's reader went away). Returns, having done
    nothing, when Typer is to read the arguments (or complete them for a shell).
    A :class:`memd.errors.MemdError` propagates, as it does out of Typer."""
    if "_MEMD_COMPLETE" in os.environ:
        return
    parsed = read_status_args(args)
    if parsed is None:
        return
    exit_as_typer(
        lambda: status_command(
            parsed.agent,
            parsed.workspace,
            parsed.config,
            parsed.state_dir,
            parsed.as_json,
            show_all=parsed.show_all,
            sort=parsed.sort,
            limit=parsed.limit,
        )
    )


__all__ = ["FLAGS", "VALUE_OPTIONS", "StatusArgs", "read_status_args", "run_status"]
