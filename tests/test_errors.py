"""errors.describe_error: the one line every layer prints for an error."""

from __future__ import annotations

import errno

from memd.errors import LockTimeout, describe_error


def test_an_os_error_reads_as_its_system_text_and_file() -> None:
    exc = OSError(errno.ENOSPC, "No space left on device", "/srv/a/MEMORY.md")
    assert describe_error(exc) == "No space left on device (/srv/a/MEMORY.md)"
    assert describe_error(exc, with_file=False) == "No space left on device"
    assert describe_error(OSError(errno.EACCES, "")) == "Permission denied"  # from errno
    assert describe_error(OSError("no errno at all")) == "no errno at all"


def test_memd_errors_and_others_keep_their_message() -> None:
    # LockTimeout is also an OSError (TimeoutError): its own message speaks for it.
    assert describe_error(LockTimeout("agent 'a': busy")) == "agent 'a': busy"
    assert describe_error(ValueError("bad value")) == "bad value"
    assert describe_error(RuntimeError()) == "RuntimeError"


def test_an_os_error_without_system_text_never_reads_none() -> None:
    # Sites that print an OSError next to the path they name use with_file=False;
    # exc.strerror alone would print "None" for these.
    assert describe_error(TimeoutError("timed out"), with_file=False) == "timed out"
    assert describe_error(OSError(), with_file=False) == "OSError"
    assert describe_error(OSError(errno.EIO, None), with_file=False) == "Input/output error"
