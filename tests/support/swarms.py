"""Where the real ``swarms`` package lives for the interop tests.

swarms pins an older litellm than memd needs, so it usually has its own
virtualenv: ``MEMD_SWARMS_PYTHON`` names that interpreter (``.ci/run`` sets
it). Otherwise the test interpreter is used when it can import swarms.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile

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
