"""Logging: structlog for memd, with the stdlib loggers of watchdog, apscheduler
and litellm routed through the same renderer.

JSON lines when stderr is not a terminal (systemd, docker) or when asked for;
a readable console format otherwise. Lines about one agent carry ``agent=``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
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
# Python's warnings, once routed to logging, go to this logger.
_WARNINGS_LOGGER = "py.warnings"
_MEMD_DIR = str(Path(memd.__file__).resolve().parent) + os.sep


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
    guard_warnings()

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


def _origin(filename: str) -> str:
    """The package a warning was raised in (``pydantic``, ``litellm``), from its file."""
    parts = Path(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            rest = parts[parts.index(marker) + 1 :]
            if rest:
                return rest[0].removesuffix(".py")
    return Path(filename).stem


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Replaces :func:`warnings.showwarning`: a warning is one log line naming its
    category and where it came from. Only memd's own warnings keep their text: a
    dependency's may quote what it was handed, and pydantic's serializer warning
    quotes a model's reply (what the model wrote about an agent's memory, before
    any redaction) into stderr and the journal (review r6leak F1)."""
    logger = logging.getLogger(_WARNINGS_LOGGER)
    if str(Path(filename).resolve()).startswith(_MEMD_DIR):
        logger.warning("%s: %s (%s:%d)", category.__name__, message, Path(filename).name, lineno)
    else:
        logger.warning(
            "%s from %s (its text left out: it may quote memory content)",
            category.__name__,
            _origin(filename),
        )


# What logging.captureWarnings writes (``file:line: Category: text``), should a
# dependency route warnings to logging itself (detect-secrets does, on import).
_FORMATTED_WARNING = re.compile(r"(?s)^(?P<file>.*?):(?P<line>\d+): (?P<category>\w+): ")


class _WarningTextFilter(logging.Filter):
    """Drops the text of a warning another module's ``showwarning`` logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        found = _FORMATTED_WARNING.match(text)
        if found is not None and not str(Path(found["file"]).resolve()).startswith(_MEMD_DIR):
            record.msg = "%s from %s (its text left out: it may quote memory content)"
            record.args = (found["category"], _origin(found["file"]))
        return True


_TEXT_FILTER = _WarningTextFilter()


def guard_warnings() -> None:
    """Route Python's warnings through :func:`_log_warning` (idempotent; called
    again after an import that may have replaced it, such as litellm's), and
    ignore pydantic's serializer warnings, which litellm's response models raise
    for replies of an unexpected shape (their text is the reply)."""
    warnings.showwarning = _log_warning
    warnings.filterwarnings("ignore", message="Pydantic serializer warnings", category=UserWarning)
    logger = logging.getLogger(_WARNINGS_LOGGER)
    if _TEXT_FILTER not in logger.filters:
        logger.addFilter(_TEXT_FILTER)


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
    "guard_warnings",
    "log_cli_warnings_to_stderr",
    "resolve_format",
    "silence_request_loggers",
]
