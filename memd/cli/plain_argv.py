"""Reading the plain forms of a command's arguments without Typer.

``memd status --json`` (scripts and monitoring, over and over) and ``memd run``
(whose start-up is timed to READY) spent a fifth and a tenth of their time
importing Typer (its click, inspect...). :func:`read_plain_args` reads the
plain forms: each option at most once, as ``--opt VALUE``, ``--opt=VALUE`` or
``-o VALUE``, flags alone, and (for a command that takes one) a bare word.
Anything else (``--help``, a typo, a repeated option, ``--``, a value Typer
would refuse or convert) is left to Typer, which reads the whole line again and
words its own messages. Each command's tables are held to its Typer command's
parameters by a test; :func:`exit_as_typer` ends the run as Typer's standalone
mode would.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, NoReturn


def read_plain_args(
    args: Sequence[str],
    *,
    flags: Mapping[str, tuple[str, bool]],
    options: Mapping[str, str],
    convert: Callable[[str, str], object],
    positional: str | None = None,
) -> dict[str, object] | None:
    """The parameters ``args`` set, or None when they are for Typer to read.

    ``flags``: option -> (parameter, the value it sets); ``options``: option taking
    a value -> parameter; ``convert(parameter, text)``: the value Typer would make
    of ``text`` (None: let Typer judge it); ``positional``: the parameter a bare
    word sets (None: the command takes none).
    """
    values: dict[str, object] = {}
    rest = iter(args)
    for token in rest:
        if not token.startswith("-"):
            if positional is None or not token or positional in values:
                return None
            values[positional] = token
            continue
        name, equals, attached = token.partition("=")
        value: object
        if name in flags and not equals:
            parameter, value = flags[name]
        elif name in options and (not equals or name.startswith("--")):
            # "-w=x" is "=x" to click: left to it, as is a value that looks like an option.
            text = attached if equals else next(rest, "")
            if not text or text.startswith("-"):
                return None
            parameter, value = options[name], convert(options[name], text)
            if value is None:
                return None
        else:
            return None
        if parameter in values:
            return None
        values[parameter] = value
    return values


class _Pacified:
    """A stream whose flush ignores a closed pipe (click's PacifyFlushWrapper): after
    ``memd status --json | head``, the flush at exit must not print a traceback."""

    def __init__(self, wrapped: IO[str]) -> None:
        self._wrapped = wrapped

    def flush(self) -> None:
        try:
            self._wrapped.flush()
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


def exit_as_typer(command: Callable[[], object]) -> NoReturn:
    """Run ``command`` and exit as Typer's standalone mode does: with the int it
    returns (0 for anything else); 130 on Ctrl-C, quietly; 1, quietly, when a
    stream's reader went away. A :class:`memd.errors.MemdError` propagates, as it
    does out of Typer."""
    try:
        code = command()
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        sys.stdout = _Pacified(sys.stdout)
        sys.stderr = _Pacified(sys.stderr)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["exit_as_typer", "read_plain_args"]
