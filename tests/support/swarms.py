"""Where the real ``swarms`` package lives for the interop tests.

swarms pins an older litellm than memd needs, so it usually has its own
virtualenv: ``MEMD_SWARMS_PYTHON`` names that interpreter (``.ci/run`` sets
it). Otherwise the test interpreter is used when it can import swarms.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

SWARMS_ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


@functools.cache
def swarms_python() -> str | None:
    for python in filter(None, [os.environ.get("MEMD_SWARMS_PYTHON", ""), sys.executable]):
        probe = subprocess.run(
            [python, "-c", "import swarms.structs.conversation"],
            capture_output=True,
            check=False,
            env=SWARMS_ENV,
            # Importing swarms creates agent_workspace/error.txt under the cwd.
            cwd=tempfile.gettempdir(),
        )
        if probe.returncode == 0:
            return python
    return None


ROOT = Path(__file__).resolve().parents[2]
INTEGRATION_SRC = ROOT / "integrations" / "swarms" / "src"
AGENT_DRIVER = Path(__file__).with_name("swarms_agent_driver.py")


def agent_env(workspace: Path, api_base: str) -> dict[str, str]:
    """The agent's environment: its workspace, the local LLM, this checkout's memd_swarms."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workspace.parent),
        "WORKSPACE_DIR": str(workspace),
        "OPENAI_API_BASE": api_base,
        "OPENAI_BASE_URL": api_base,
        "OPENAI_API_KEY": "test-key",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        # The working tree's integration, not whatever copy the venv may hold.
        "PYTHONPATH": str(INTEGRATION_SRC),
    }


class SwarmsAgent:
    """A real Swarms agent in its own process: ``with SwarmsAgent(...) as a: a.run("task")``."""

    def __init__(self, workspace: Path, api_base: str, spec: dict[str, Any]) -> None:
        python = swarms_python()
        assert python is not None, "swarms is not installed"
        self.proc = subprocess.Popen(
            # -P: the driver's folder holds a swarms.py that must not shadow the package.
            [python, "-P", str(AGENT_DRIVER), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=agent_env(workspace, api_base),
            cwd=workspace.parent,  # swarms writes agent_workspace/ logs under the cwd
        )
        self._expect("ready")
        self.turns = 0

    def _expect(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        while line := self.proc.stdout.readline():
            if line.startswith(prefix):
                return line
        raise AssertionError(f"agent exited before {prefix!r}: {self._stderr_tail()}")

    def _stderr_tail(self) -> str:
        self.proc.kill()
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-3000:]

    def run(self, task: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(task.replace("\n", " ") + "\n")
        self.proc.stdin.flush()
        self.turns += 1
        self._expect(f"ok {self.turns}")

    def finish(self, timeout: float = 600) -> dict[str, Any]:
        """Close stdin (or let a ``turns`` spec finish) and return the driver's report."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        # stderr is drained by a thread: swarms logs a lot, and a full pipe would stall it.
        errors: list[str] = []
        drain = threading.Thread(target=lambda: errors.append(self.proc.stderr.read()))  # type: ignore[union-attr]
        drain.start()
        out = self.proc.stdout.read()
        self.proc.wait(timeout)
        drain.join(timeout)
        assert self.proc.returncode == 0, "".join(errors)[-3000:]
        # The report is the driver's last JSON line: swarms may log to stdout after it
        # (a failed append to a MEMORY.md that is not a file, as the process ends).
        (last, *_) = [line for line in reversed(out.splitlines()) if line.startswith("{")]
        report: dict[str, Any] = json.loads(last)
        return report

    def __enter__(self) -> SwarmsAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
