"""The summarizer interface (pure types): what a summary is asked for and returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from memd.core.memfile import MemoryDocument
from memd.core.privacy import Privacy


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    agent: str
    document: MemoryDocument  # the snapshot prefix 0..N, parsed
    max_tokens: int  # the summary's budget
    instructions: str = ""  # extra, per-agent summary_instructions
    # At most this many model calls (a spending cap's remainder); None: the
    # summarizer's own [summarizer] max_calls.
    max_calls: int | None = None
    # The workspace's redaction key and [privacy] settings: a summarizer that is
    # not local redacts everything it sends with it (None: a per-process key).
    privacy: Privacy | None = None


@dataclass(frozen=True, slots=True)
class SummaryResult:
    text: str
    model: str
    cost_usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    # Set when only bytes 0..summarized_until were summarized (a partial
    # compaction: the model's call budget ran out); the rest stays raw.
    summarized_until: int | None = None
    calls: int = 1
    # Secrets replaced by placeholders in what was sent to the model (counted
    # once per piece of text, however many requests carried it).
    redacted: int = 0
    redacted_pii: bool = False  # personal data was redacted on the way out
    # Whether the summarizer was given the material as written, credentials
    # included (a local model): the transaction then also searches the reply for
    # each credential value found in the material, however the reply formats it.
    # False when it saw only placeholders (a remote model, the builtin
    # summarizer): that search would cost a scan of the material for nothing.
    given_as_written: bool = True
    # Tokens of what the model read (the summary so far and the turns, as cut to
    # fit its window), when the summarizer knows it: a reply is judged against
    # that, not against the raw input (a tool dump cut to a few thousand tokens
    # is no 400k-token input to summarize; review r9summary F5).
    read_tokens: int | None = None


class Summarizer(Protocol):
    """Turns a memory snapshot into summary text; raises SummarizerError on failure."""

    @property
    def model(self) -> str: ...

    def summarize(self, request: SummaryRequest) -> SummaryResult: ...
