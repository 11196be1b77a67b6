"""Entry point: ``memd`` and ``python -m memd``.

Builds the Typer app and registers each command explicitly: command modules
define plain functions and never import this module (or each other), so the
CLI has no import circle. Every failure a user can cause ends as one line on
stderr and a non-zero exit code taken from the exception (see :mod:`memd.errors`).
"""

from __future__ import annotations

import sys

import typer

from memd.cli import (
    commands_archive,
    commands_audit,
    commands_compact,
    commands_forget,
    commands_mcp,
    commands_ops,
    commands_prune,
    commands_recall,
    commands_run,
    commands_status,
)
from memd.errors import MemdError


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="memd",
        help="Memory-compaction daemon for AI agents' MEMORY.md files.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    # In this order in `memd --help`.
    app.add_typer(commands_archive.archive_app, name="archive")
    app.command("audit")(commands_audit.audit_command)
    app.command("compact-now")(commands_compact.compact_now)
    app.command("forget")(commands_forget.forget_command)
    app.command("health")(commands_ops.health)
    app.command("history")(commands_ops.history)
    app.command("doctor")(commands_ops.doctor)
    app.add_typer(commands_ops.config_app, name="config")
    app.command("mcp")(commands_mcp.mcp_command)
    app.command("prune")(commands_prune.prune_command)
    app.command("recall")(commands_recall.recall_command)
    app.command("run")(commands_run.run_command)
    app.command("status")(commands_status.status)
    return app


app = build_app()


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, prog_name="memd", standalone_mode=True)
    except MemdError as exc:
        print(f"memd: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code or 0)
