"""memd_swarms is imported from this checkout's source tree (it is not installed here:
its distribution depends on swarms, which pins an older litellm than memd's)."""

from __future__ import annotations

import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "integrations" / "swarms" / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))
