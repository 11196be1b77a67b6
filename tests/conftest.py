"""Shared fixtures: real workspaces in tmp dirs, written in the Swarms format."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# litellm must never phone home from the test suite.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# A developer's own config must not leak into tests (MEMD_SWARMS_PYTHON is
# not config: it points the interop tests at the swarms virtualenv).
for _var in [v for v in os.environ if v.startswith("MEMD_")] + ["WORKSPACE_DIR"]:
    if _var != "MEMD_SWARMS_PYTHON":
        os.environ.pop(_var, None)

# memd's parsed-tokenizer cache goes to a throwaway dir, not the user's ~/.cache.
os.environ["MEMD_CACHE_DIR"] = tempfile.mkdtemp(prefix="memd-test-cache-")

sys.path.insert(0, str(Path(__file__).parent))

from support.memfiles import AgentWorkspace  # noqa: E402


@pytest.fixture
def agent_ws(tmp_path: Path) -> AgentWorkspace:
    """A workspace with one agent, ``alpha``, whose MEMORY.md has a Swarms header."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha")
    return ws


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    """An empty workspace (``create_agent`` adds agents)."""
    return AgentWorkspace(tmp_path / "ws")


@pytest.fixture(scope="session")
def cl100k() -> Callable[[str], int]:
    """Exact cl100k_base token counts, loaded offline like memd loads them."""
    from support.tokens import CL100K

    return CL100K.count_text


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """memd's logging configured in a test (``configure_logging``, a daemon's
    reload) is undone after it: the root handlers and structlog's defaults.
    For every test: a daemon run in-process (tests/test_daemon.py) configures
    logging onto stderr, and a later test reading a log line from stdout (the
    default's stream) failed when it ran after it."""
    import logging

    import structlog

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
