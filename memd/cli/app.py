"""Entry point: ``memd`` and ``python -m memd``.

Every failure a user can cause ends as one line on stderr and a non-zero
exit code taken from the exception (see :mod:`memd.errors`).
"""

from __future__ import annotations

import sys

import typer

from memd.errors import MemdError

app = typer.Typer(
    name="memd",
    help="Memory-compaction daemon for AI agents' MEMORY.md files.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    # Imported for their side effect of adding commands to ``app``; one module
    # per command keeps each command's code and tests side by side.
    from memd.cli import (
        commands_compact,
        commands_forget,
        commands_ops,
        commands_run,
        commands_status,
    )

    del commands_compact, commands_forget, commands_ops, commands_run, commands_status


def main(argv: list[str] | None = None) -> None:
    _register()
    try:
        app(args=argv, prog_name="memd", standalone_mode=True)
    except MemdError as exc:
        print(f"memd: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code or 0)
