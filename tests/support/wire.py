"""Compaction options for tests that make real litellm calls to the recording
OpenAI-compatible server (tests/support/openai_server.py)."""

from __future__ import annotations

from memd.compaction import CompactionOptions
from memd.core.config import MemdConfig


def options_for(
    config: MemdConfig, key: bytes, *, summary_max_tokens: int = 3000
) -> CompactionOptions:
    """Fast lock and drain waits, no shrink check, and ``config``'s privacy
    (redaction decided as the daemon decides it, under ``key``)."""
    base = CompactionOptions.from_config(config, redaction_key=key)
    return CompactionOptions(
        lock_wait_s=5,
        drain_quiet_s=0.05,
        drain_max_s=2,
        summary_max_tokens=summary_max_tokens,
        require_shrink=False,
        privacy=base.privacy,
    )
