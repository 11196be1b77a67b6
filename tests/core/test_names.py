from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
        ("\udcff\udcfe", "not UTF-8"),  # os.fsdecode(b"\xff\xfe"): a folder's raw bytes
        ("a\ud800", "not UTF-8"),  # a lone surrogate: no UTF-8 either
    ],
)
def test_bad_names_are_refused_with_a_reason(name: str, reason: str) -> None:
    with pytest.raises(InvalidAgentName, match="invalid agent name") as info:
        validate_agent_name(name)
    assert reason in str(info.value)
    assert "\n" not in str(info.value)
    assert not is_valid_agent_name(name)


@given(
    st.one_of(
        st.text(alphabet="ab.-_/\\\x00\n Z9", max_size=12),
        st.text(max_size=300),
        st.from_regex(r"[A-Za-z0-9._-]{0,300}", fullmatch=True),
    )
)
def test_the_fast_check_agrees_with_the_full_validation(name: str) -> None:
    try:
        validate_agent_name(name)
    except InvalidAgentName:
        valid = False
    else:
        valid = True
    assert is_valid_agent_name(name) is valid
