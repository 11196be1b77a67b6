"""``memd run`` without Typer, for the plain forms of its arguments.

Interpreter start and imports are part of a restart's time to READY (measured
against a process with memd's imports only: ``bench/bench_startup.py``), and
Typer's were a tenth of a second of it. :func:`read_run_args` reads the plain
forms (:mod:`memd.cli.plain_argv`): ``--opt VALUE``, ``--opt=VALUE`` or ``-w
VALUE``, ``--poll``/``--no-poll`` and ``--demo``; anything else is left to Typer.
A test holds these tables to the Typer command's parameters
(:mod:`memd.cli.commands_run`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from memd.cli.plain_argv import exit_as_typer, read_plain_args
from memd.cli.run_daemon import LogFormatChoice, LogLevelChoice, run_daemon

# option -> the run command's parameter it sets
VALUE_OPTIONS: dict[str, str] = {
    "--workspace": "workspace",
    "-w": "workspace",
    "--config": "config",
    "-c": "config",
    "--state-dir": "state_dir",
    "--log-format": "log_format",
    "--log-level": "log_level",
}
# flag -> (parameter, the value it sets)
FLAGS: dict[str, tuple[str, bool]] = {
    "--poll": ("poll", True),
    "--no-poll": ("poll", False),
    "--demo": ("demo", True),
}
_CHOICES: dict[str, frozenset[str]] = {
    "log_format": frozenset(get_args(LogFormatChoice)),
    "log_level": frozenset(get_args(LogLevelChoice)),
}


@dataclass(frozen=True, slots=True)
class RunArgs:
    """The run command's parameters, as Typer passes them."""

    workspace: Path | None = None
    config: Path | None = None
    state_dir: Path | None = None
    poll: bool | None = None
    log_format: LogFormatChoice | None = None
    log_level: LogLevelChoice | None = None
    demo: bool = False


def _value(parameter: str, text: str) -> object:
    """What Typer makes of ``text`` for ``parameter``; None when Typer should judge it."""
    choices = _CHOICES.get(parameter)
    if choices is not None:
        return text if text in choices else None
    return Path(text)


def read_run_args(args: Sequence[str]) -> RunArgs | None:
    """The arguments after ``run``, or None when they are for Typer to read."""
    values = read_plain_args(args, flags=FLAGS, options=VALUE_OPTIONS, convert=_value)
    return None if values is None else RunArgs(**values)  # type: ignore[arg-type]


def run_run(args: Sequence[str]) -> None:
    """Run ``memd run ARGS`` and exit as Typer's standalone mode does (the daemon's
    exit code; 130 on a Ctrl-C before the daemon handles signals). Returns, having
    done nothing, when Typer is to read the arguments (or complete them for a
    shell). A :class:`memd.errors.MemdError` propagates, as it does out of Typer."""
    if "_MEMD_COMPLETE" in os.environ:
        return
    parsed = read_run_args(args)
    if parsed is None:
        return
    exit_as_typer(
        lambda: run_daemon(
            parsed.workspace,
            parsed.config,
            parsed.state_dir,
            parsed.poll,
            parsed.log_format,
            parsed.log_level,
            parsed.demo,
        )
    )


__all__ = ["FLAGS", "VALUE_OPTIONS", "RunArgs", "read_run_args", "run_run"]
