"""Exceptions: small subclasses of built-ins, each carrying a one-line reason.

Every error a user can cause or meet names the thing at fault (the agent, the
key, the file), so the CLI can print ``str(exc)`` as its single stderr line.
"""

from __future__ import annotations

import os


def describe_error(exc: BaseException, *, with_file: bool = True) -> str:
    """One line for an error: an OSError's system text (and the file it names),
    else the message memd's own errors already carry."""
    if isinstance(exc, OSError) and not isinstance(exc, MemdError):
        text = exc.strerror or (os.strerror(exc.errno) if exc.errno else "")
        if text:
            where = f" ({exc.filename})" if with_file and exc.filename else ""
            return f"{text}{where}"
    return str(exc) or type(exc).__name__


class MemdError(Exception):
    """Base for errors memd reports to the operator as one line."""

    exit_code = 1
    # What a failed compaction spent on its model before it failed (requests,
    # re-asks and retries included, and their cost as far as litellm priced
    # them), set by the summarizer and the transaction that saw them; None:
    # not known (the caller charges what it reserved).
    model_calls: int | None = None
    model_cost_usd: float | None = None


class ConfigError(MemdError, ValueError):
    """Bad config file, env var or flag; the message names key and source.

    ``problems`` lists every error found (one line each; the message shows the
    first), for ``memd config check``.
    """

    exit_code = 2

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)


class InvalidAgentName(MemdError, ValueError):
    exit_code = 2


class UnknownAgent(MemdError, LookupError):
    exit_code = 3


class WorkspaceError(MemdError, OSError):
    """Missing workspace, or a path that escapes it."""

    exit_code = 2


class NotARegularFile(MemdError, OSError):
    """A file memd must read or write is a directory, FIFO, device or similar."""


class LockTimeout(MemdError, TimeoutError):
    """Another compaction of the same agent held the lock past ``--wait``."""

    exit_code = 4


class NothingToCompact(MemdError):
    """No raw entries since the last summary: success, not a failure.

    ``reason``: why, in the words ``memd compact-now`` prints after the agent's
    name ("nothing to compact (no raw entries since the last summary)"), for a
    daemon to say of a file it cannot shrink; None when not known."""

    exit_code = 0

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class SummarizerError(MemdError, RuntimeError):
    """The summarizer failed, timed out or returned unusable output."""

    exit_code = 5


class CompactionAborted(MemdError, RuntimeError):
    """The transaction gave up before its commit; nothing was changed."""

    exit_code = 6


class SummaryNotStarted(CompactionAborted):
    """The daemon stopped while the job waited for an LLM slot: nothing was
    changed and nothing failed (the job counts as cancelled)."""


class SummaryRequeued(SummaryNotStarted):
    """The job gave up before its summary started (nothing was changed, nothing
    failed) and is queued again."""


class SummarySettingsChanged(SummaryRequeued):
    """A reload changed the summarizer or privacy settings while the job waited
    for an LLM slot: nothing was changed, and the job is queued again to be
    summarized with the new settings."""


class UnderThreshold(CompactionAborted):
    """Once the agent's lock was taken, the file was already under its threshold
    (another compactor did the work first): nothing was changed, nothing failed."""


class CommittedUnfinished(CompactionAborted):
    """The compaction committed (its archive and the new MEMORY.md are in place) but
    a step after the swap failed (the folder's fsync, moving late appends): the
    journal still holds the job, and recovery's roll-forward finishes it (the
    turns a late writer appended to the old file reach MEMORY.md then)."""


class TokenizerError(MemdError, RuntimeError):
    exit_code = 2
