"""memd-agent.json parsing, bounds and precedence (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memd.core.config import AgentOverride, MemdConfig, TriggerConfig, resolve_policy
from memd.core.descriptor import (
    CONTEXT_LENGTH_MAX,
    CONTEXT_LENGTH_MIN,
    MAX_BYTES,
    AgentWindow,
    DescriptorError,
    parse_descriptor,
)


def words(text: str) -> int:
    return len(text.split())


def descriptor(**fields: Any) -> bytes:
    document: dict[str, Any] = {
        "format": "memd-agent",
        "version": 1,
        "agent": "ada",
        "model": "gpt-4o-mini",
        "context_length": 8000,
        "reserved": {"unit": "text", "text": "one two three"},
        "writer": "memd-swarms 0.1.0 (swarms 16.0.3)",
    }
    document.update(fields)
    return json.dumps(document).encode()


def test_a_version_1_descriptor_as_memd_swarms_writes_it() -> None:
    window = parse_descriptor(descriptor(), words)
    assert window == AgentWindow(context_length=8000, reserved_tokens=3, model="gpt-4o-mini")


def test_out_of_range_numbers_are_clamped_and_each_clamp_is_reported() -> None:
    huge = parse_descriptor(descriptor(context_length=10**12), words)
    assert huge.context_length == CONTEXT_LENGTH_MAX
    assert huge.clamped == (
        f"context_length {10**12} clamped to {CONTEXT_LENGTH_MAX} "
        f"(bounds {CONTEXT_LENGTH_MIN}..{CONTEXT_LENGTH_MAX})",
    )
    tiny = parse_descriptor(descriptor(context_length=10), words)
    assert tiny.context_length == CONTEXT_LENGTH_MIN
    greedy = parse_descriptor(
        descriptor(context_length=2000, reserved={"unit": "text", "text": "w " * 1500}), words
    )
    assert greedy.reserved_tokens == 1000
    assert greedy.clamped == ("reserved 1500 tokens clamped to 1000 (50% of context_length 2000)",)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not UTF-8 JSON"),
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"[1, 2]", "not a JSON object"),
        (descriptor(format="something-else"), "format is not 'memd-agent'"),
        (descriptor(version=2), "version 2 is not one memd reads (1)"),
        (descriptor(version=True), "version True is not one memd reads"),
        (descriptor(context_length="8000"), "context_length must be a positive integer"),
        (descriptor(context_length=-1), "context_length must be a positive integer"),
        (descriptor(context_length=None), "context_length must be a positive integer"),
        (descriptor(model=["x"]), "model must be a short string"),
        (descriptor(reserved={"unit": "tokens", "text": "x"}), "reserved must be"),
        (descriptor(reserved={"unit": "text", "text": 5}), "reserved.text must be a string"),
        (b" " * (MAX_BYTES + 1), "larger than"),
        (b"[" * 200_000, "JSON nested too deeply"),
        (b'{"a": ' * 100_000, "JSON nested too deeply"),
    ],
)
def test_unusable_descriptors_are_refused_in_one_line_naming_the_field(
    data: bytes, message: str
) -> None:
    with pytest.raises(DescriptorError, match="^memd-agent.json: ") as info:
        parse_descriptor(data, words)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


WINDOW = AgentWindow(context_length=8000, reserved_tokens=500, model="gpt-4o-mini")


def test_the_declared_window_replaces_the_fleet_default_and_its_reserve_comes_off() -> None:
    policy = resolve_policy(MemdConfig(), "ada", window=WINDOW)
    assert policy.context_length == 8000
    assert policy.threshold_tokens == int(0.9 * 8000) - 500
    assert (policy.window_source, policy.reserved_tokens) == ("memd-agent.json", 500)
    plain = resolve_policy(MemdConfig(), "ada")
    assert (plain.window_source, plain.reserved_tokens, plain.threshold_tokens) == (
        "default",
        0,
        180_000,
    )
    # A [trigger] context_length is the fleet-wide default: the agent's own window beats it.
    fleet = MemdConfig(trigger=TriggerConfig(context_length=200_000))
    assert resolve_policy(fleet, "ada").window_source == "[trigger]"
    assert resolve_policy(fleet, "ada", window=WINDOW).context_length == 8000


def test_an_agents_table_that_sets_the_window_wins_even_at_the_default_value() -> None:
    explicit = MemdConfig(agents={"ad*": AgentOverride(context_length=200_000)})
    policy = resolve_policy(explicit, "ada", window=WINDOW)
    assert policy.context_length == 200_000
    assert policy.window_source == '[agents."ad*"]'
    assert policy.threshold_tokens == 180_000 - 500  # the reserve still applies
    by_model = MemdConfig(agents={"*": AgentOverride(model="big-model")})
    policy = resolve_policy(by_model, "ada", lambda model: 1_000_000, window=WINDOW)
    assert (policy.context_length, policy.window_source) == (1_000_000, "model big-model")
    # A table that sets only the threshold leaves the declared window in place.
    tighter = MemdConfig(agents={"ada": AgentOverride(threshold=0.5)})
    policy = resolve_policy(tighter, "ada", window=WINDOW)
    assert policy.threshold_tokens == 4000 - 500


def test_max_tokens_still_caps_and_the_threshold_never_reaches_zero() -> None:
    capped = MemdConfig(trigger=TriggerConfig(max_tokens=1000))
    assert resolve_policy(capped, "ada", window=WINDOW).threshold_tokens == 1000
    greedy = AgentWindow(context_length=1024, reserved_tokens=10**6, model="")
    policy = resolve_policy(MemdConfig(), "ada", window=greedy)
    assert policy.reserved_tokens == 512
    assert policy.threshold_tokens == int(0.9 * 1024) - 512
