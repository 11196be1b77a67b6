from __future__ import annotations

import pytest

from memd.core.names import is_valid_agent_name, validate_agent_name
from memd.errors import InvalidAgentName


@pytest.mark.parametrize("name", ["alpha", "Research Bot", "agent-1_x", "ünï", "a.b"])
def test_good_names(name: str) -> None:
    assert validate_agent_name(name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("..", "'..'"),
        ("a..b", "'..'"),
        ("a\x00b", "NUL"),
        (".memd", "starts with '.'"),
        ("a\nb", "control character"),
        ("x" * 256, "longer than 255"),
    ],
)
def test_bad_names_are_refused_with_a_reason(name: str, reason: str) -> None:
    with pytest.raises(InvalidAgentName, match="invalid agent name") as info:
        validate_agent_name(name)
    assert reason in str(info.value)
    assert "\n" not in str(info.value)
    assert not is_valid_agent_name(name)
