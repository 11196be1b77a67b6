"""Choose the summarizer a config asks for: the offline builtin one or a litellm model.

Importing this module never imports litellm (``memd status`` and the builtin
summarizer must start fast and offline); :mod:`memd.llm` does that itself, on
its first summary.
"""

from __future__ import annotations

from typing import Final

from memd.core.builtin_summary import extractive_summary
from memd.core.config import SummarizerConfig
from memd.core.privacy import Privacy, redact_document
from memd.core.prompts import CountText
from memd.core.summary import Summarizer, SummaryRequest, SummaryResult
from memd.errors import SummarizerError
from memd.modelinfo import window_for
from memd.redaction_key import process_key

BUILTIN_MODEL: Final = "builtin"


class BuiltinSummarizer:
    """The offline extractive summarizer: no network, no key, deterministic."""

    def __init__(self, count_text: CountText) -> None:
        self._count_text = count_text

    @property
    def model(self) -> str:
        return BUILTIN_MODEL

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        # Extracts are sentences and lines of the transcript: it never copies a
        # credential into a summary. The transcript is redacted first, whole,
        # because a secret's context ("password=", a PEM header) may not travel
        # with the line that is kept; then the extract is scanned like any reply.
        redactor = (request.privacy or Privacy(process_key())).for_reply()
        document = redact_document(request.document, redactor)
        text = extractive_summary(
            document, max_tokens=request.max_tokens, count_text=self._count_text
        )
        text = redactor.redact(text).text
        if not text.strip():
            raise SummarizerError(
                f"builtin summarizer produced nothing for agent {request.agent!r} "
                f"(summary budget {request.max_tokens} tokens)"
            )
        return SummaryResult(
            text=text,
            model=BUILTIN_MODEL,
            cost_usd=0.0,
            output_tokens=self._count_text(text),
            given_as_written=False,  # it read the document redacted, whole
        )


def needs_litellm(config: SummarizerConfig) -> bool:
    return config.model.strip().lower() != BUILTIN_MODEL


def make_summarizer(config: SummarizerConfig, count_text: CountText) -> Summarizer:
    """``model = "builtin"`` gives the offline summarizer; anything else is a litellm model."""
    if not needs_litellm(config):
        return BuiltinSummarizer(count_text)
    from memd.llm import LiteLLMSummarizer  # light: litellm itself loads on first use

    return LiteLLMSummarizer(config, count_text, window=window_for(config))
