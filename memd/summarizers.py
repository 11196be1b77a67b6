"""Choose the summarizer a config asks for: the offline builtin one or a litellm model.

Importing this module never imports litellm (``memd status`` and the builtin
summarizer must start fast and offline); :mod:`memd.llm` does that itself, on
its first summary.
"""

from __future__ import annotations

from typing import Final

from memd.core.builtin_summary import extractive_summary
from memd.core.config import SummarizerConfig
from memd.core.prompts import CountText
from memd.core.summary import Summarizer, SummaryRequest, SummaryResult
from memd.errors import SummarizerError
from memd.modelinfo import context_length_for_model

BUILTIN_MODEL: Final = "builtin"
# Room left in the summarizer model's context for its answer and for the gap
# between our token count and the provider's.
_CONTEXT_SAFETY_MARGIN: Final = 0.9


class BuiltinSummarizer:
    """The offline extractive summarizer: no network, no key, deterministic."""

    def __init__(self, count_text: CountText) -> None:
        self._count_text = count_text

    @property
    def model(self) -> str:
        return BUILTIN_MODEL

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        text = extractive_summary(
            request.document, max_tokens=request.max_tokens, count_text=self._count_text
        )
        if not text.strip():
            raise SummarizerError(
                f"builtin summarizer produced nothing for agent {request.agent!r} "
                f"(summary budget {request.max_tokens} tokens)"
            )
        return SummaryResult(
            text=text, model=BUILTIN_MODEL, cost_usd=0.0, output_tokens=self._count_text(text)
        )


def input_budget_for(config: SummarizerConfig) -> int | None:
    """Tokens the prompt may use: the model's context minus the answer's room."""
    # litellm's bundled map, read without importing litellm; unknown -> no budget.
    context_length = context_length_for_model(config.model)
    if not context_length:
        return None
    budget = int(context_length * _CONTEXT_SAFETY_MARGIN) - config.max_tokens
    return max(1_000, budget)


def make_summarizer(config: SummarizerConfig, count_text: CountText) -> Summarizer:
    """``model = "builtin"`` gives the offline summarizer; anything else is a litellm model."""
    if config.model.strip().lower() == BUILTIN_MODEL:
        return BuiltinSummarizer(count_text)
    from memd.llm import LiteLLMSummarizer  # light: litellm itself loads on first use

    return LiteLLMSummarizer(config, count_text, input_token_budget=input_budget_for(config))
