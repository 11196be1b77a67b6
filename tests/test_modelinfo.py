"""Context lengths come from litellm's bundled model map, without importing litellm."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.preludes import NO_LITELLM_PRELUDE

from memd.modelinfo import (
    bundled_model_map_path,
    context_length_for_model,
    read_context_lengths,
)


def model_map() -> dict[str, Any]:
    path = bundled_model_map_path()
    assert path is not None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_the_map_is_litellms_bundled_json() -> None:
    path = bundled_model_map_path()
    assert path is not None
    assert path.name == "model_prices_and_context_window_backup.json"
    assert path.parent.name == "litellm"


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("claude-sonnet-4-6", "claude-sonnet-4-6"),
        ("anthropic/claude-sonnet-4-6", "claude-sonnet-4-6"),
        ("openai/gpt-4o-mini", "gpt-4o-mini"),
        ("gpt-4o-mini", "gpt-4o-mini"),
        ("ollama/llama3.1", "ollama/llama3.1"),
        ("llama3.1", "ollama/llama3.1"),  # bare name only ollama lists
        ("ollama/llama3.1:8b", "ollama/llama3.1"),  # size tag not in the map
        ("ollama/llama3:70b", "ollama/llama3:70b"),  # tag that is in the map
        (" OpenAI/GPT-4o-Mini ", "gpt-4o-mini"),
    ],
)
def test_names_with_and_without_provider_resolve(model: str, key: str) -> None:
    info = model_map()[key]
    expected = info.get("max_input_tokens") or info["max_tokens"]
    assert isinstance(expected, int) and expected > 0
    assert context_length_for_model(model) == expected


def test_reader_prefers_max_input_tokens_then_max_tokens(tmp_path: Path) -> None:
    model_file = tmp_path / "map.json"
    model_file.write_text(
        json.dumps(
            {
                "sample_spec": {"max_input_tokens": "max input tokens", "max_tokens": "n"},
                "Both": {"max_input_tokens": 1000, "max_tokens": 50},
                "only-max": {"max_input_tokens": None, "max_tokens": 4096},
                "float": {"max_input_tokens": 8192.0},
                "zero": {"max_input_tokens": 0},
                "flag": {"max_input_tokens": True},
                "not-a-dict": [1, 2],
            }
        )
    )
    assert read_context_lengths(model_file) == {"both": 1000, "only-max": 4096, "float": 8192}
    model_file.write_text("{ truncated")
    assert read_context_lengths(model_file) == {}
    assert read_context_lengths(tmp_path / "missing.json") == {}


@pytest.mark.parametrize("model", ["", "   ", "no-such-model-xyz", "nope/nothing", "sample_spec"])
def test_unknown_models_give_none(model: str) -> None:
    assert context_length_for_model(model) is None


def run_child(code: str, prelude: str = "") -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_lookups_read_the_map_once_and_never_import_litellm() -> None:
    # Operation counts, not wall-clock bounds: the whole cost of a lookup is one
    # parse of the bundled JSON, paid once per process.
    report = run_child(
        """
        import json, sys
        import memd.modelinfo as modelinfo
        reads = []
        original = modelinfo.read_context_lengths
        def counted(path):
            reads.append(str(path))
            return original(path)
        modelinfo.read_context_lengths = counted
        first = modelinfo.context_length_for_model("openai/gpt-4o-mini")
        for _ in range(1000):
            modelinfo.context_length_for_model("claude-sonnet-4-6")
            modelinfo.context_length_for_model("llama3.1")
        print(json.dumps({"first": first, "reads": len(reads),
                          "litellm": sorted(m for m in sys.modules if m.startswith("litellm"))}))
        """
    )
    assert report["first"] > 0
    assert report["litellm"] == []
    assert report["reads"] == 1, report


def test_without_litellm_installed_every_model_is_unknown() -> None:
    report = run_child(
        """
        import json
        from memd.modelinfo import context_length_for_model
        print(json.dumps({"length": context_length_for_model("gpt-4o-mini")}))
        """,
        prelude=NO_LITELLM_PRELUDE,
    )
    assert report["length"] is None
