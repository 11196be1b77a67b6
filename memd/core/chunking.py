"""Every turn read: the summarizer's window, request limits, and chunks that fit (pure).

When the transcript does not fit one request, it is cut at entry boundaries
into chunks that each fit, and summarized in rolling calls ("update this
summary with the new turns"): every request holds the summary so far plus one
chunk, so no turn goes unread.  When the chunks need more calls than allowed,
only the oldest ones are summarized this time (a partial compaction: the rest
stays raw for the next one) — turns are never skipped.

A single entry bigger than a chunk (a tool dump) is cut to its head and tail
plus its middle lines whose shape does not repeat, around a marker; it is
never dropped whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from memd.core.memfile import EntrySegment, MemoryDocument
from memd.core.pins import is_tool_role, non_repeating_lines
from memd.core.prompts import render_piece, since_last_summary

CountText = Callable[[str], int]

DEFAULT_WINDOW: Final = 8_192
# Room kept free in every request for the gap between our tokenizer and the
# provider's, and the chat framing around each message.
WINDOW_SAFETY: Final = 0.9
# The answer may use at most this share of the window.
OUTPUT_SHARE: Final = 0.25
# Of what is left for input, the summary so far may take at most this share.
PREVIOUS_SHARE: Final = 0.5
_HEAD_LINES: Final = 8
_OMITTED: Final = "[… {count} line(s) of the same shape omitted …]"


@dataclass(frozen=True, slots=True)
class Window:
    tokens: int
    source: str  # "summarizer.context_length", "model", or "default"


def summarizer_window(configured: int, from_model: int | None) -> Window:
    """``[summarizer] context_length`` > litellm's map > a conservative default."""
    if configured > 0:
        return Window(configured, "summarizer.context_length")
    if from_model:
        return Window(from_model, "model")
    return Window(DEFAULT_WINDOW, "default")


@dataclass(frozen=True, slots=True)
class RequestLimits:
    window: int
    output_tokens: int  # max_tokens asked of the model
    input_tokens: int  # prompt budget: window x safety - output


def request_limits(window: int, configured_max_tokens: int, summary_tokens: int) -> RequestLimits:
    """A 4,096-token model is never asked for 4,000 output tokens."""
    output = max(64, min(configured_max_tokens, summary_tokens, int(window * OUTPUT_SHARE)))
    return RequestLimits(
        window=window,
        output_tokens=output,
        input_tokens=max(64, int(window * WINDOW_SAFETY) - output),
    )


@dataclass(frozen=True, slots=True)
class Piece:
    """One transcript item to summarize: rendered text, and where it ends in the file."""

    text: str
    end: int  # byte offset just past the entry (0 for the previous summary's text)
    role: str = ""


@dataclass(frozen=True, slots=True)
class Chunk:
    texts: tuple[str, ...]
    end: int  # byte offset just past its last entry (0: only previous-summary text)
    tokens: int
    ends: tuple[int, ...] = ()  # where each of its pieces ends in the file, in order


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    chunks: tuple[Chunk, ...]  # the ones to summarize now, oldest first
    total_chunks: int  # all that the material needs
    cut: int  # bytes 0..cut are summarized now; 0 = every piece

    @property
    def partial(self) -> bool:
        return len(self.chunks) < self.total_chunks

    @property
    def summarized_until(self) -> int | None:
        """Where the summarized part ends when not all of it is summarized now."""
        return self.cut if self.partial else None


def reduce_entry(text: str, room: int, count_text: CountText) -> str:
    """``text`` within ``room`` tokens: head, tail, and the non-repeating middle lines.

    Lines whose shape repeats are noise (rows of a dump); a line that occurs
    once is what a reader needs (the error among a thousand OK rows), so the
    head and tail shrink before any of those does.
    """
    if count_text(text) <= room:
        return text
    lines = text.split("\n")
    if len(lines) <= 3:
        return _cut_chars(text, room, count_text)
    candidate = text
    for ends in (_HEAD_LINES, 4, 2, 1):
        if 2 * ends >= len(lines):
            continue
        head, middle, tail = lines[:ends], lines[ends:-ends], lines[-ends:]
        unique = set(non_repeating_lines("\n".join(middle)))
        kept = [line for line in middle if line in unique]
        candidate = _joined(head, middle, kept, tail)
        if count_text(candidate) <= room:
            return candidate
    while kept and count_text(candidate) > room:
        kept = kept[: len(kept) * 3 // 4]
        candidate = _joined(head, middle, kept, tail)
    if count_text(candidate) <= room:
        return candidate
    return _cut_chars(candidate, room, count_text)


def _joined(head: list[str], middle: list[str], kept: list[str], tail: list[str]) -> str:
    omitted = len(middle) - len(kept)
    marker = [_OMITTED.format(count=omitted)] if omitted else []
    return "\n".join([*head, *marker, *kept, *tail])


def cut_at_line(text: str, room: int, count_text: CountText) -> str:
    """The longest run of whole lines of ``text`` within ``room`` tokens, marked when cut."""
    if count_text(text) <= room:
        return text
    marker = "[… cut to fit the summary budget …]"
    lines = text.split("\n")
    low, high = 0, len(lines)
    while low < high:
        middle = (low + high + 1) // 2
        if count_text("\n".join([*lines[:middle], marker])) <= room:
            low = middle
        else:
            high = middle - 1
    return "\n".join([*lines[:low], marker])


def _cut_chars(text: str, room: int, count_text: CountText) -> str:
    """Head and tail of ``text`` by characters, joined by a marker, within ``room``."""
    marker = "\n[… cut to fit the summarizer's window …]\n"
    low, high = 0, len(text) // 2
    while low < high:
        middle = (low + high + 1) // 2
        if count_text(text[:middle] + marker + text[-middle:]) <= room:
            low = middle
        else:
            high = middle - 1
    return text[:low] + marker + text[-low:] if low else marker.strip()


def reduce_tool_output(piece: Piece, room: int, count_text: CountText) -> Piece:
    """Tool dumps over a quarter of a chunk shed their repeating rows first."""
    if is_tool_role(piece.role) and count_text(piece.text) > room // 4:
        return Piece(reduce_entry(piece.text, room // 4, count_text), piece.end, piece.role)
    return piece


def transcript_pieces(document: MemoryDocument, previous_body: str) -> list[Piece]:
    """What a summary is made from, oldest first: the previous summary's paragraphs
    (when it is re-summarized as material), then every turn since it.

    The previous summary's pieces end where its block ends, so a partial
    compaction that only re-summarizes it still archives exactly that block.
    """
    since = since_last_summary(document)
    pieces = [
        Piece(paragraph.strip(), since.summary_end, "summary")
        for paragraph in previous_body.split("\n\n")
        if paragraph.strip()
    ]
    for turn in since.turns:
        text = render_piece(turn)
        if text:
            role = turn.role if isinstance(turn, EntrySegment) else "unparsed"
            pieces.append(Piece(text, turn.start + len(turn.raw), role))
    return pieces


def plan_chunks(
    pieces: Sequence[Piece],
    *,
    chunk_tokens: int,
    max_calls: int,
    count_text: CountText,
    separator_tokens: int = 2,
) -> ChunkPlan:
    """Pack ``pieces`` (oldest first) into chunks of at most ``chunk_tokens``.

    Pieces are never split across chunks; one too big alone is reduced to fit.
    Only the first ``max_calls`` chunks are kept for this run.
    """
    chunks: list[Chunk] = []
    texts: list[str] = []
    ends: list[int] = []
    used = 0
    end = 0
    for raw_piece in pieces:
        piece = reduce_tool_output(raw_piece, chunk_tokens, count_text)
        text = piece.text
        cost = count_text(text) + separator_tokens
        if cost > chunk_tokens:
            text = reduce_entry(text, chunk_tokens - separator_tokens, count_text)
            cost = count_text(text) + separator_tokens
        if texts and used + cost > chunk_tokens:
            chunks.append(Chunk(tuple(texts), end, used, tuple(ends)))
            texts, ends, used = [], [], 0
        texts.append(text)
        ends.append(piece.end)
        used += cost
        end = max(end, piece.end)
    if texts:
        chunks.append(Chunk(tuple(texts), end, used, tuple(ends)))
    now = chunks[:max_calls]
    partial = len(now) < len(chunks)
    cut = next((c.end for c in reversed(now) if c.end), 0) if partial else 0
    return ChunkPlan(chunks=tuple(now), total_chunks=len(chunks), cut=cut)
