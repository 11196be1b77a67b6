"""Per-agent policy resolution: [agents."glob"] tables, later tables win."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from memd.core.config import MemdConfig, resolve_policy


def config(**data: object) -> MemdConfig:
    return MemdConfig.model_validate(data)


def test_default_threshold_is_fraction_of_context() -> None:
    policy = resolve_policy(config(), "any")
    assert policy.threshold_tokens == 180_000
    assert policy.low_water_tokens == 108_000
    assert policy.compress


def test_absolute_cap_wins_when_lower() -> None:
    policy = resolve_policy(config(trigger={"max_tokens": 5000}), "any")
    assert policy.threshold_tokens == 5000


def test_glob_overrides_apply_in_order() -> None:
    cfg = config(
        agents={
            "Research*": {"threshold": 0.5, "context_length": 1000},
            "ResearchBot": {"context_compression": False, "summary_instructions": "keep URLs"},
        }
    )
    bot = resolve_policy(cfg, "ResearchBot")
    assert (bot.threshold_tokens, bot.compress, bot.summary_instructions) == (
        500,
        False,
        "keep URLs",
    )
    other = resolve_policy(cfg, "ResearchOther")
    assert other.compress and other.threshold_tokens == 500
    assert resolve_policy(cfg, "Writer").threshold_tokens == 180_000


def test_model_derives_context_length_unless_given() -> None:
    cfg = config(agents={"A*": {"model": "m"}, "AB": {"context_length": 42}})
    lookup = {"m": 8000}.get
    assert resolve_policy(cfg, "AX", lookup).context_length == 8000
    assert resolve_policy(cfg, "AB", lookup).context_length == 42
    unknown = config(agents={"*": {"model": "nope"}})
    assert resolve_policy(unknown, "x", lookup).context_length == 200_000


def test_retention_per_workspace_and_per_agent_glob() -> None:
    from memd.core.config import resolve_retention
    from memd.core.retention import RetentionLimits

    cfg = config(
        retention={"max_archives": 10, "max_age_days": 30},
        agents={
            "Research*": {"max_total_mb": 50},
            "ResearchBot": {"max_archives": 0},  # set means written: no count limit for it
        },
    )
    assert resolve_retention(cfg, "Writer") == RetentionLimits(10, 30, 0)
    assert resolve_retention(cfg, "ResearchOther") == RetentionLimits(10, 30, 50)
    assert resolve_retention(cfg, "ResearchBot") == RetentionLimits(0, 30, 50)
    assert resolve_policy(cfg, "ResearchBot").retention == RetentionLimits(0, 30, 50)
    assert not resolve_policy(config(), "any").retention.active


@pytest.mark.parametrize(
    "data",
    [
        {"workspace": "/a\x00b"},
        {"state_dir": "/a\x00b"},
        {"privacy": {"key_file": "/a\x00b"}},
        {"recall": {"socket": "/a\x00b"}},
    ],
)
def test_a_path_key_holding_a_nul_byte_is_refused(data: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="NUL byte"):
        MemdConfig.model_validate(data)


@pytest.mark.parametrize(
    "compaction",
    [{"drain_quiet_s": 0}, {"drain_max_s": 0}, {"drain_quiet_s": 0, "drain_max_s": 0}],
)
def test_a_drain_without_a_window_is_refused(compaction: dict[str, float]) -> None:
    """Either at 0 ends the drain at its first pass: a late writer's turn is lost (r9data)."""
    with pytest.raises(ValidationError, match="0 ends the drain at its first pass"):
        MemdConfig.model_validate({"compaction": compaction})
    assert MemdConfig.model_validate({"compaction": {"drain_quiet_s": 0.05}})
