"""Entry point: ``memd`` and ``python -m memd``.

Builds the Typer app and registers each command explicitly: command modules
define plain functions and never import this module (or each other), so the
CLI has no import circle. Every failure a user can cause ends as one line on
stderr and a non-zero exit code taken from the exception (see :mod:`memd.errors`).

``memd COMMAND …`` imports only that command's module: ``memd status`` on a
30,000-agent fleet is run by scripts and monitoring, and the other commands'
imports (structlog, the recall server, the compaction) would be most of its time;
the plain forms of ``memd status`` and ``memd run`` do not even import Typer
(:mod:`memd.cli.status_argv`, :mod:`memd.cli.run_argv`).
"""

from __future__ import annotations

import importlib
import logging
import sys
import traceback
from typing import TYPE_CHECKING, Any

import memd
from memd.errors import MemdError, describe_error

if TYPE_CHECKING:
    import typer

# name -> (module under memd.cli, attribute), in `memd --help` order; "config"
# is a command group (a Typer app of its own).
COMMANDS: dict[str, tuple[str, str]] = {
    "archive": ("commands_archive", "archive_app"),
    "audit": ("commands_audit", "audit_command"),
    "compact-now": ("commands_compact", "compact_now"),
    "forget": ("commands_forget", "forget_command"),
    "health": ("commands_ops", "health"),
    "history": ("commands_ops", "history"),
    "doctor": ("commands_ops", "doctor"),
    "config": ("commands_ops", "config_app"),
    "mcp": ("commands_mcp", "mcp_command"),
    "prune": ("commands_prune", "prune_command"),
    "recall": ("commands_recall", "recall_command"),
    "reload": ("commands_reload", "reload_command"),
    "run": ("commands_run", "run_command"),
    "status": ("commands_status", "status"),
}


def build_app(only: str | None = None) -> typer.Typer:
    """The CLI; with ``only``, just that command (same name, options and help)."""
    import typer

    app = typer.Typer(
        name="memd",
        help="Memory-compaction daemon for AI agents' MEMORY.md files. "
        "(memd --version prints its version.)",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    if only is not None:
        # A lone command would otherwise become the app itself (no subcommand name).
        app.callback()(_group)
    for name, (module_name, attribute) in COMMANDS.items():
        if only is not None and name != only:
            continue
        target = getattr(importlib.import_module(f"memd.cli.{module_name}"), attribute)
        if isinstance(target, typer.Typer):
            app.add_typer(target, name=name)
        else:
            app.command(name)(target)
    return app


def _group() -> None:
    """Memory-compaction daemon for AI agents' MEMORY.md files."""


def __getattr__(name: str) -> Any:
    if name == "app":  # the whole CLI, for tools that import it
        return build_app()
    raise AttributeError(name)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("--version", "-V"):
        # Answered before anything loads: packaging scripts and bug reports ask
        # it, and it must work whatever the configuration or environment says.
        print(f"memd {memd.__version__}")
        sys.exit(0)
    only = args[0] if args and args[0] in COMMANDS else None
    if only != "run":  # the daemon configures its own logging (format, level, reloads)
        _log_warnings_to_stderr()
    stdout = sys.stdout
    json_out = _JsonOutput(stdout) if _wants_json(args) else None
    if json_out is not None:
        sys.stdout = json_out
    try:
        _run(args, only, json_out)
    finally:
        if sys.stdout is json_out:
            sys.stdout = stdout


def _run(args: list[str], only: str | None, json_out: _JsonOutput | None) -> None:
    try:
        if only == "status":
            from memd.cli.status_argv import run_status

            run_status(args[1:])  # exits, unless the arguments are for Typer to read
        elif only == "run":
            from memd.cli.run_argv import run_run

            run_run(args[1:])  # the same
        # Not standalone: a usage error comes back here, to be said in one line
        # like memd's own, instead of Click's multi-line usage box. --help and
        # typer.Exit(code) come back as the exit code (Ctrl-C as 130).
        code = build_app(only)(args=args, prog_name="memd", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except MemdError as exc:
        print(f"memd: error: {exc}", file=sys.stderr)
        if exc.exit_code and json_out is not None:
            json_out.say_error(str(exc), exc.exit_code)
        sys.exit(exc.exit_code or 0)
    except KeyboardInterrupt:
        # Ctrl-C before a command took over SIGINT (while its modules load, say,
        # or before the daemon's handler is installed): quiet, as Typer's own.
        sys.exit(130)
    except _usage_errors() as exc:
        code = _say_usage_error(exc, json_out)
        sys.exit(code)
    except (OSError, ValueError, OverflowError) as exc:
        # The last line of defence: an error the OS or the standard library gave
        # where no command turned it into its own line (a path too long for the
        # OS, an unreadable file, a number too large for a C call...) is still
        # one line, never a traceback. Where it came from stays visible in the
        # debug log (MEMD_LOG_LEVEL=debug).
        # stdlib logging: silent until a command configured it (never on stdout).
        if only == "run" and not isinstance(exc, OSError):
            # A ValueError out of the daemon is a bug (bad input is a MemdError or,
            # from the OS, an OSError: a path too long...). Its stderr is its log
            # (journald, docker logs), and the traceback is what the operator's
            # report needs: written there, before the one line.
            traceback.print_exc(file=sys.stderr)
        else:
            logging.getLogger("memd.cli").debug("unexpected error", exc_info=True)
        print(f"memd: error: {describe_error(exc)}", file=sys.stderr)
        if json_out is not None:
            json_out.say_error(describe_error(exc), 1)
        sys.exit(1)


def _wants_json(args: list[str]) -> bool:
    """Whether the command line asks for ``--json`` output (before a ``--``, after
    which a word is an argument, a recall query say)."""
    options = args[: args.index("--")] if "--" in args else args
    return "--json" in options


class _JsonOutput:
    """stdout for a ``--json`` command: notes whether the command wrote anything,
    so that a failure before it did still gives a script parsing stdout a JSON
    object, ``{"error": "<the stderr line's reason>", "exit_code": N}`` (README
    "Commands"), and never a second document after one the command wrote (``memd
    health --json`` prints its answer, then exits 1 when unhealthy)."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped
        self.written = False

    def write(self, text: str) -> int:
        if text:
            self.written = True
        return int(self._wrapped.write(text))

    def say_error(self, message: str, exit_code: int) -> None:
        if self.written:
            return
        import json

        self.write(json.dumps({"error": message, "exit_code": exit_code}) + "\n")
        self.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


def _usage_errors() -> tuple[type[BaseException], ...]:
    """What the argument parser raises out of a non-standalone call: Typer's own
    exceptions (Typer >= 0.22 carries its own Click) or Click's, and Abort (an
    EOF at a prompt). Evaluated whenever an exception passes main's handlers (a
    plain `memd status`'s SystemExit too), so it imports nothing: a module not
    loaded yet raised nothing."""
    kinds: list[type[BaseException]] = []
    for module, names in (
        ("typer", ("TyperException", "Abort")),
        ("click.exceptions", ("ClickException", "Abort")),
    ):
        imported = sys.modules.get(module)
        kinds += [kind for name in names if isinstance(kind := getattr(imported, name, None), type)]
    return tuple(kinds)


def _say_usage_error(exc: BaseException, json_out: _JsonOutput | None = None) -> int:
    """One line on stderr, ``memd: error: …``, naming the command's --help (and, for
    a ``--json`` command, the same reason as a JSON object on stdout); the exit
    code (2 for a usage error, as Click's)."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        # `memd` or `memd config` alone: the help is the answer (it may have been
        # printed already, by Typer's rich help, while the error was made).
        format_message = getattr(exc, "format_message", None)
        help_text = str(format_message()) if callable(format_message) else ""
        if help_text.strip():
            print(help_text, file=sys.stderr)
        return 2
    format_message = getattr(exc, "format_message", None)
    if not callable(format_message):  # Abort: no message of its own
        print("memd: error: aborted", file=sys.stderr)
        if json_out is not None:
            json_out.say_error("aborted", 1)
        return 1
    message = " ".join(str(format_message()).split())  # one line, whatever Click wrapped
    # Typer checks a Literal option's choice with pydantic, whose message starts
    # "Value error, " (memd.settings drops it from config errors too).
    message = message.replace(": Value error, ", ": ")
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None)
    hint = f" (see '{path} --help')" if path else ""
    print(f"memd: error: {message}{hint}", file=sys.stderr)
    code = getattr(exc, "exit_code", 2)
    code = code if isinstance(code, int) else 2
    if json_out is not None and code:
        json_out.say_error(f"{message}{hint}", code)
    return code


def _log_warnings_to_stderr() -> None:
    """Warnings a command logs (the audit log cannot be written, a bad memd-agent.json)
    go to stderr, one line each: unconfigured, structlog prints every level to
    stdout, into the command's output or the middle of its ``--json``.

    Lazily: importing structlog costs ~0.12 s, which a command that logs nothing
    (``memd status`` with a daemon running) must not pay; :mod:`memd.logs`
    configures itself so when a command first imports it."""
    if "memd.logs" in sys.modules:
        from memd.logs import log_cli_warnings_to_stderr

        log_cli_warnings_to_stderr()
    else:
        memd.CLI_LOGS_TO_STDERR = True
    # Until then, stdlib logging (main's last line of defence logs there) goes
    # nowhere: configured with it once memd.logs is imported.
