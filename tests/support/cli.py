"""Run the ``memd`` CLI in-process and capture what it printed."""

from __future__ import annotations

import pytest

from memd.cli.app import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``memd ARGS…``."""
    with pytest.raises(SystemExit) as info:
        main(list(args))
    captured = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), captured.out, captured.err
