from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from support.tokens import CL100K

from memd.core import memfile
from memd.core.chunking import Window
from memd.core.config import SummarizerConfig
from memd.core.summary import SummaryRequest
from memd.errors import SummarizerError
from memd.llm import LiteLLMSummarizer
from memd.modelinfo import window_for
from memd.summarizers import BuiltinSummarizer, make_summarizer
from memd.tokenizer import TokenCounter


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return CL100K


def session() -> memfile.MemoryDocument:
    data = memfile.render_header("demo", "2026-01-01T00:00:00")
    for index in range(120):
        data += memfile.render_entry(
            "Human" if index % 2 == 0 else "Coder",
            f"2026-01-01T10:{index // 60:02d}:{index % 60:02d}",
            f"Routine progress note number {index}, nothing special happened here at all.",
        )
    data += memfile.render_entry(
        "Human",
        "2026-01-01T11:00:00",
        "We decided the release ships on 2026-04-01 from branch rc-9.",
    )
    return memfile.parse(data)


def test_builtin_is_the_default_and_works_offline(counter: TokenCounter) -> None:
    summarizer = make_summarizer(SummarizerConfig(), counter.count_text)
    assert isinstance(summarizer, BuiltinSummarizer)
    assert summarizer.model == "builtin"
    result = summarizer.summarize(SummaryRequest("alpha", session(), 150))
    assert result.model == "builtin" and result.cost_usd == 0.0
    assert result.output_tokens == counter.count_text(result.text) <= 150
    assert "release ships on 2026-04-01 from branch rc-9" in result.text
    assert not memfile.contains_entry_header(result.text)


def test_builtin_name_is_case_insensitive(counter: TokenCounter) -> None:
    config = SummarizerConfig(model=" Builtin ")
    assert make_summarizer(config, counter.count_text).model == "builtin"


def test_builtin_with_no_room_is_an_error(counter: TokenCounter) -> None:
    empty = memfile.parse(memfile.render_header("demo", "2026-01-01T00:00:00"))
    summarizer = make_summarizer(SummarizerConfig(), counter.count_text)
    with pytest.raises(SummarizerError, match="'alpha'"):
        summarizer.summarize(SummaryRequest("alpha", empty, 100))


def test_any_other_model_goes_through_litellm(counter: TokenCounter) -> None:
    config = SummarizerConfig(model="openai/gpt-4o-mini", max_tokens=2000)
    summarizer = make_summarizer(config, counter.count_text)
    assert isinstance(summarizer, LiteLLMSummarizer)
    assert summarizer.model == "openai/gpt-4o-mini"
    # The window: litellm's map, else summarizer.context_length wins, else a default.
    assert window_for(config) == Window(128_000, "model")
    assert window_for(SummarizerConfig(model="openai/made-up-model")) == Window(8_192, "default")
    configured = SummarizerConfig(model="openai/gpt-4o-mini", context_length=4_096)
    assert window_for(configured) == Window(4_096, "summarizer.context_length")
    # Built directly, the summarizer takes the same lookup (not only the configured length).
    assert summarizer.window == LiteLLMSummarizer(config).window == Window(128_000, "model")


def test_choosing_a_summarizer_never_imports_litellm() -> None:
    """``memd status`` and the builtin summarizer must not pay for litellm."""
    script = textwrap.dedent(
        """
        import sys
        from memd.core import memfile
        from memd.core.config import SummarizerConfig
        from memd.core.summary import SummaryRequest
        from memd.summarizers import make_summarizer

        count = lambda text: len(text.split())
        data = memfile.render_header("d", "2026-01-01T00:00:00") + memfile.render_entry(
            "Human", "2026-01-01T00:00:01", "We decided to use Redis 7 for the cache."
        )
        builtin = make_summarizer(SummarizerConfig(), count)
        print(builtin.summarize(SummaryRequest("a", memfile.parse(data), 100)).text)
        remote = make_summarizer(SummarizerConfig(model="anthropic/claude-haiku-4-5"), count)
        assert remote.model == "anthropic/claude-haiku-4-5"
        loaded = sorted(name for name in sys.modules if name.split(".")[0] in {"litellm", "openai"})
        print("LOADED:", loaded)
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert "Redis 7" in completed.stdout
    assert "LOADED: []" in completed.stdout
