"""Logging: structlog for memd, with the stdlib loggers of watchdog, apscheduler
and litellm routed through the same renderer.

JSON lines when stderr is not a terminal (systemd, docker) or when asked for;
a readable console format otherwise. Lines about one agent carry ``agent=``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any, Literal, TextIO

import structlog

import memd

LogFormat = Literal["auto", "json", "console"]

# Third-party loggers that are chatty at INFO (apscheduler logs every job run).
_QUIET_AT_INFO = ("apscheduler", "watchdog", "httpcore")
# litellm's loggers write request bodies (memory content) at DEBUG: pinned to
# CRITICAL at every (re)configuration whatever memd's level, since a reload at
# "debug" must not undo what the one-time import of litellm set.
_LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm")
# httpx's request lines carry URLs (some providers put the key in the query).
_NEVER_BELOW_WARNING = ("httpx",)
_HANDLER_NAME = "memd"


def resolve_format(fmt: LogFormat, stream: TextIO) -> Literal["json", "console"]:
    if fmt != "auto":
        return fmt
    isatty = getattr(stream, "isatty", None)
    return "console" if isatty is not None and isatty() else "json"


def configure_logging(
    fmt: LogFormat = "auto", level: str = "info", stream: TextIO | None = None
) -> Literal["json", "console"]:
    """Install memd's logging; safe to call again (e.g. after a reload)."""
    out = stream if stream is not None else sys.stderr
    chosen = resolve_format(fmt, out)
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any
    if chosen == "json":
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=bool(getattr(out, "isatty", bool)()))

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(out)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for existing in list(root.handlers):
        if existing.get_name() == _HANDLER_NAME:
            root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in _QUIET_AT_INFO:
        logging.getLogger(name).setLevel(numeric if numeric <= logging.DEBUG else logging.WARNING)
    silence_request_loggers()

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    return chosen


def silence_request_loggers() -> None:
    """Keep what a summarizer is sent, and where, out of every log."""
    for name in _LITELLM_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    for name in _NEVER_BELOW_WARNING:
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.level, logging.WARNING))


def get_logger(name: str = "memd", **initial: Any) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name)
    return logger.bind(**initial) if initial else logger


def debug_check(name: str = "memd") -> Callable[[], bool]:
    """Whether a debug line of logger ``name`` would be written, as a function a
    hot path calls first: each structlog call binds a logger before its level is
    looked at, while stdlib caches the answer (and forgets it when levels change)."""
    logger = logging.getLogger(name)
    return lambda: logger.isEnabledFor(logging.DEBUG)


def log_cli_warnings_to_stderr() -> None:
    """A command's logging (not the daemon's): warnings and worse, one console line
    each, on stderr (never into the command's output or its ``--json``);
    ``MEMD_LOG_LEVEL=debug`` shows its debug lines too, such as where an
    unexpected error came from (memd.cli.app.main)."""
    debug = os.environ.get("MEMD_LOG_LEVEL", "").strip().lower() == "debug"
    configure_logging("console", "debug" if debug else "warning", sys.stderr)


# The CLI asked for its logging before this module was imported (it does not
# import structlog itself: a command that logs nothing never pays for it).
if getattr(memd, "CLI_LOGS_TO_STDERR", False):
    log_cli_warnings_to_stderr()


__all__ = [
    "LogFormat",
    "configure_logging",
    "debug_check",
    "get_logger",
    "log_cli_warnings_to_stderr",
    "resolve_format",
    "silence_request_loggers",
]
