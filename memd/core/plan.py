"""The compaction plan (pure): the rules the transaction and the daemon apply, values in
and values out.

* whether a summary is acceptable (:func:`summary_over_cap`,
  :func:`summary_does_not_shrink`; its budgets are :mod:`memd.core.summary_plan`'s);
* whether a memory file has anything to compact (:func:`has_compactable`; a
  summary block alone over its budget is re-summarized, :func:`summary_over_budget`),
  and where the newest turns kept verbatim start (:func:`kept_tail_start`);
* the chunks a summarizer's window takes the rest in (:func:`chunk_budget`,
  :func:`plan_chunks_of`) and what is carried raw when fewer calls are allowed
  than chunks (:func:`summarized_to`); :func:`plan_compaction` is the three
  together, as the transaction and the LLM summarizer apply them;
* what recovery does with a crashed job, from its journal phase and the inode
  numbers it recorded (:func:`recovery_action`), and how much of a journaled
  drain chunk had landed (:func:`landed_prefix`);
* whether a count stored in the state DB may be reused for a file as it is now
  (:func:`stored_count_trust`).

The transaction (:mod:`memd.compaction`) does the I/O around these decisions, the
LLM summarizer (:mod:`memd.llm`) the requests.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, NamedTuple

from memd.core.chunking import (
    PREVIOUS_SHARE,
    ChunkPlan,
    Piece,
    RequestLimits,
    plan_chunks,
    transcript_pieces,
)
from memd.core.config import AgentPolicy
from memd.core.jobs import unparsable_tail
from memd.core.memfile import BLOCK_TERMINATOR, EntrySegment, MemoryDocument
from memd.core.prompts import previous_summary_body, since_last_summary
from memd.core.summary_plan import MIN_SUMMARY_TOKENS
from memd.core.tokens import upper_bound

CountText = Callable[[str], int]

# The summary block adds markup around the reply and the pinned section: its
# header and preamble (48 tokens in cl100k), the archive note and the version
# line naming the archive (~60 more). It was 64: a summary that filled its
# budget beside a full pinned section was refused as over the cap (the builtin
# summary did, once it used its whole budget, s10retain).
SUMMARY_MARKUP_TOKENS = 160


# The smallest low-water mark a compaction can end below: the block's markup and
# the smallest summary memd plans for, with nothing
# pinned or kept verbatim. Below it every compaction ends over the mark.
SMALLEST_LOW_WATER_TOKENS = SUMMARY_MARKUP_TOKENS + MIN_SUMMARY_TOKENS


def threshold_too_small(policy: AgentPolicy) -> str | None:
    """Why no compaction can bring an agent under its threshold, or None (also for
    an agent memd never compacts).

    A threshold that leaves less room below its low-water mark than a summary
    block needs (a system prompt and tools reserving most of a small window, a
    ``max_tokens`` or ``threshold`` set very low) makes every compaction end over
    the mark: the agent is compacted again at each cooldown and stays over."""
    if not policy.compress or policy.low_water_tokens >= SMALLEST_LOW_WATER_TOKENS:
        return None
    reserved = f", {policy.reserved_tokens} of it reserved" if policy.reserved_tokens else ""
    return (
        f"threshold {policy.threshold_tokens} tokens (window {policy.context_length}{reserved}) "
        f"leaves a low-water mark of {policy.low_water_tokens}, under the "
        f"{SMALLEST_LOW_WATER_TOKENS} a summary block needs: no compaction brings it under "
        "its threshold"
    )


# ------------------------------------------------------------------ summary size


def summary_over_cap(summary_tokens: int, cap: int) -> str | None:
    """Why a summary block of ``summary_tokens`` is refused as too long, or None."""
    if summary_tokens > cap + SUMMARY_MARKUP_TOKENS:
        return f"summary has {summary_tokens} tokens, over the cap of {cap}"
    return None


def may_exceed_cap(block: bytes, cap: int) -> bool:
    """Whether ``block`` could be over ``cap`` at all: a text has no more tokens than
    bytes (plus the two at its ends), so a block within the cap in bytes need not
    be tokenized to pass :func:`summary_over_cap`."""
    return upper_bound(block) > cap + SUMMARY_MARKUP_TOKENS


def summary_does_not_shrink(block_bytes: int, replaced_bytes: int) -> str | None:
    """Why a summary block is refused as not shrinking the file, or None.

    ``replaced_bytes``: how much of the file the block replaces. Bytes are the
    shrink proxy so the check costs nothing on a large file.
    """
    if block_bytes >= replaced_bytes:
        return (
            f"summary ({block_bytes} bytes) would not shrink the memory it replaces "
            f"({replaced_bytes} bytes)"
        )
    return None


def unparsed_tail_bytes(document: MemoryDocument) -> int:
    """How many bytes after the last complete entry parse as no entry (0 when they
    are only whitespace): what stays in MEMORY.md verbatim at every compaction."""
    tail = document.bytes_between(document.boundary, document.size)
    return len(tail) if tail.strip() else 0


def nothing_to_compact_reason(document: MemoryDocument, kept_note: str) -> str:
    """Why ``has_compactable`` is False, for an operator: the newest turns kept
    verbatim (``kept_note``), else bytes that do not parse, else a summary
    with no raw entry after it."""
    if not kept_note:
        unparsed = unparsed_tail_bytes(document)
        if unparsed:
            return f"nothing to compact: {unparsable_tail(unparsed)}"
    return f"nothing to compact (no raw entries since the last summary{kept_note})"


def has_compactable(document: MemoryDocument) -> bool:
    """Raw entries since the last summary, or unparseable bytes before the boundary."""
    boundary = document.boundary
    # The newest entry is a raw one exactly when some raw entry follows the last summary.
    newest = next(iter(document.segments_reversed(boundary)), None)
    if isinstance(newest, EntrySegment) and not document.is_summary_entry(newest):
        return True
    # Unparseable bytes before the boundary count too: archiving them is how
    # they leave the active file (still verbatim, in the archive). Only bytes
    # before the first entry can be both unparseable and before the boundary.
    leading, _trailing = document.unparsed_edges()
    return (
        leading is not None
        and leading.start + len(leading.raw) <= boundary
        and bool(leading.raw.strip())
    )


def lone_summary(document: MemoryDocument) -> EntrySegment | None:
    """The summary block that is all ``document`` has to compact (:func:`has_compactable`
    False and its newest entry a summary); None when there is more, or no summary."""
    if has_compactable(document):
        return None
    newest = next(iter(document.segments_reversed(document.boundary)), None)
    if isinstance(newest, EntrySegment) and document.is_summary_entry(newest):
        return newest
    return None


def summary_over_budget(
    document: MemoryDocument, cap: int, count_bytes: Callable[[bytes], int]
) -> int | None:
    """The tokens of ``document``'s lone summary block (:func:`lone_summary`) when it is
    over ``cap`` as a new block would be refused (:func:`summary_over_cap`), else None.

    Such a block (an older build's summary that carried every line forward, a
    threshold or context window lowered below it, a smaller model) is compacted
    itself: re-summarized, its result held to the same cap, so a file of a block
    within its budget stays "nothing to compact" (no compaction loop)."""
    block = lone_summary(document)
    if block is None or not may_exceed_cap(block.raw, cap):
        return None
    tokens = count_bytes(block.raw)
    return tokens if summary_over_cap(tokens, cap) is not None else None


# No real text averages this many bytes per token; an entry longer than that
# many bytes per token of room is treated as not fitting without counting it.
_MAX_BYTES_PER_TOKEN = 32


def kept_tail_start(
    document: MemoryDocument, end: int, budget_tokens: int, count_text: CountText
) -> int:
    """K: where the newest whole raw entries ending by ``end`` that fit ``budget_tokens``
    start (``end`` itself when none is kept).

    Only raw entries after the last summary are kept, newest first, while they fit;
    a summary block or bytes that do not parse end the walk.  Bytes 0..K are
    compacted, K..end stay verbatim after the new summary block.
    """
    return kept_tail(document, end, budget_tokens, count_text)[0]


def kept_tail(
    document: MemoryDocument,
    end: int,
    budget_tokens: int,
    count_text: CountText,
    known: Sequence[tuple[int, int]] = (),
) -> tuple[int, int]:
    """:func:`kept_tail_start` and the sum of the kept entries' token counts (each
    entry counted on its own, as the walk counts them).

    ``known``: ``(offset, tokens of the bytes offset..end)`` pairs, offsets
    ascending and at most ``end``, each a cut where counts add up (a count's
    marks, :attr:`memd.counting.TrackedCount.marks`); given only when every
    entry start is such a cut too (:func:`memd.core.tokens.is_junction_cut`),
    so the tokens of the entries from an entry start on are those of the bytes
    from there to ``end``. The walk then tokenizes only where the known counts
    leave a decision open (near where the budget runs out); the result is the
    one the walk that counts every entry gives. Pairs that contradict each other
    (more tokens after a later offset) are not trusted: every entry is counted.
    """
    if budget_tokens <= 0:
        return end, 0
    if known and known_consistent(known, end):
        return _kept_tail_known(document, end, budget_tokens, count_text, known)
    start = end
    used = 0
    for segment in document.segments_reversed(end):
        if not isinstance(segment, EntrySegment) or document.is_summary_entry(segment):
            break
        room = budget_tokens - used
        size = len(segment.raw)
        if size > room * _MAX_BYTES_PER_TOKEN:
            break  # cannot fit (a huge tool dump): not worth tokenizing to find out
        tokens = count_text(segment.raw.decode("utf-8", "surrogateescape"))
        if used + tokens > budget_tokens:
            break
        used += tokens
        start = segment.start
    return start, used


def known_consistent(known: Sequence[tuple[int, int]], end: int) -> bool:
    """Whether ``known`` pairs (see :func:`kept_tail`) can all be true: offsets
    ascending within 0..``end``, tokens never negative and never more after a later
    offset. Only such pairs decide a kept tail or the count built from them."""
    previous_offset, previous_tokens = -1, None
    for offset, tokens in known:
        if not 0 <= offset <= end or offset <= previous_offset or tokens < 0:
            return False
        if previous_tokens is not None and tokens > previous_tokens:
            return False
        previous_offset, previous_tokens = offset, tokens
    return True


class _Suffixes:
    """Tokens of the bytes from an entry start to ``end`` (S), from the known
    counts: bounds for free, the exact figure by tokenizing only from the entry
    start to the nearest offset whose S is known (a known pair's, or one worked
    out before)."""

    def __init__(
        self,
        document: MemoryDocument,
        known: Sequence[tuple[int, int]],
        end: int,
        count_text: CountText,
    ) -> None:
        self._document = document
        self._offsets = [offset for offset, _ in known]
        self._tokens = [tokens for _, tokens in known]
        if not self._offsets or self._offsets[-1] != end:
            self._offsets.append(end)
            self._tokens.append(0)
        self._count_text = count_text

    def bounds(self, at: int) -> tuple[float, float]:
        """S(at) is at least that of the first known offset at or after ``at``
        and at most that of the last one at or before it (S only grows as ``at``
        moves back); the upper bound is infinite without one."""
        index = bisect.bisect_left(self._offsets, at)
        low: float = self._tokens[index]
        below = bisect.bisect_right(self._offsets, at) - 1
        high: float = self._tokens[below] if below >= 0 else math.inf
        return low, high

    def exact(self, at: int) -> int:
        """S(at) for ``at`` an entry start (or ``end``): the known S of the nearest
        offset after it plus the tokens of the bytes in between (no known offset
        inside them: each byte is tokenized once at most)."""
        index = bisect.bisect_left(self._offsets, at)
        upto = self._offsets[index]
        if upto == at:
            return self._tokens[index]
        stretch = self._document.bytes_between(at, upto)
        tokens = self._tokens[index] + self._count_text(stretch.decode("utf-8", "surrogateescape"))
        self._offsets.insert(index, at)
        self._tokens.insert(index, tokens)
        return tokens

    def sure_from(self, end: int, budget_tokens: int) -> int | None:
        """The oldest known offset from which every entry starting after it passes
        both rules of the walk for sure: S there is within the budget (S of every
        later entry start is at most that), and so is each later entry's size
        within the room the rule gives it (a size is at most the bytes from the
        offset to ``end``, the room at least ``budget - S`` there)."""
        for offset, tokens in zip(self._offsets, self._tokens, strict=True):
            if tokens <= budget_tokens and end - offset <= (budget_tokens - tokens) * (
                _MAX_BYTES_PER_TOKEN
            ):
                return offset
        return None


def _kept_tail_known(
    document: MemoryDocument,
    end: int,
    budget_tokens: int,
    count_text: CountText,
    known: Sequence[tuple[int, int]],
) -> tuple[int, int]:
    """:func:`kept_tail` with known counts: the same two rules, each decided by the
    bounds when they settle it, by the exact figure otherwise; the newest entries
    that pass both for sure are not read at all."""
    suffixes = _Suffixes(document, known, end, count_text)
    start = end
    used_low: float = 0  # bounds on S(start), the tokens kept so far
    used_high: float = 0
    sure = suffixes.sure_from(end, budget_tokens)
    skip_to = None if sure is None or sure >= end else document.raw_entries_after(sure, end)
    if skip_to is not None:
        start = skip_to
        used_low, used_high = suffixes.bounds(start)
    for segment in document.segments_reversed(start):
        if not isinstance(segment, EntrySegment) or document.is_summary_entry(segment):
            break
        size = len(segment.raw)
        if size > (budget_tokens - used_low) * _MAX_BYTES_PER_TOKEN:
            break  # surely too big for the room left
        if size > (budget_tokens - used_high) * _MAX_BYTES_PER_TOKEN:
            used_low = used_high = suffixes.exact(start)
            if size > (budget_tokens - used_low) * _MAX_BYTES_PER_TOKEN:
                break
        low, high = suffixes.bounds(segment.start)
        low = max(low, used_low)  # S only grows as the walk moves back
        if low > budget_tokens:
            break
        if high > budget_tokens:
            low = high = suffixes.exact(segment.start)
            if low > budget_tokens:
                break
        used_low, used_high = low, high
        start = segment.start
    return start, int(used_low) if used_low == used_high else suffixes.exact(start)


@dataclass(frozen=True, slots=True)
class ChunkBudget:
    """What a summarizer's window allows one compaction (its values, not its model).

    ``chunk_tokens``: the room for turns in each request; ``max_calls``: the
    requests allowed now; ``previous_inline``: the previous summary is sent whole
    as the summary so far (else it is re-summarized as material, oldest first).
    """

    chunk_tokens: int
    max_calls: int
    previous_inline: bool = True


def chunk_budget(
    limits: RequestLimits, prompt_overhead: int, previous_tokens: int, max_calls: int
) -> ChunkBudget:
    """The room for turns in each request of a window's ``limits``.

    ``prompt_overhead``: the tokens of the prompts around the material;
    ``previous_tokens``: the previous summary's (0: none). A previous summary
    bigger than its share of the room is re-summarized as material (oldest first)
    instead of being sent whole in every request.
    """
    room = limits.input_tokens - prompt_overhead
    inline = previous_tokens <= int(room * PREVIOUS_SHARE)
    summary_room = max(limits.output_tokens, previous_tokens if inline else 0)
    return ChunkBudget(room - summary_room, max_calls, inline)


def plan_chunks_of(
    prefix: MemoryDocument,
    budget: ChunkBudget,
    count_text: CountText,
    redact: Callable[[str], str] | None = None,
    previous: str | None = None,
) -> ChunkPlan:
    """The chunks a summarizer sends for ``prefix`` (the part being compacted), oldest
    first: the previous summary's paragraphs when it is not sent whole, then every
    turn since it; each text passed through ``redact`` (what leaves the host) before
    it is measured and cut, since a placeholder is not as long as what it replaces.

    ``previous``: the previous summary's body as the caller already redacted it
    (None: taken from ``prefix`` and redacted here).
    """
    if budget.previous_inline:
        previous = ""
    elif previous is None:
        previous = previous_summary_body(since_last_summary(prefix))
        previous = redact(previous) if redact is not None else previous
    pieces = transcript_pieces(prefix, previous)
    if redact is not None:
        pieces = [Piece(redact(piece.text), piece.end, piece.role) for piece in pieces]
    return plan_chunks(
        pieces, chunk_tokens=budget.chunk_tokens, max_calls=budget.max_calls, count_text=count_text
    )


def summarized_to(kept_from: int, summarized_until: int | None) -> int:
    """Where the summarized part ends: where the kept tail starts, unless the
    summarizer stopped earlier (its calls ran out, or memd is stopping); bytes from
    there to ``kept_from`` are the carried tail, raw for the next compaction."""
    if summarized_until is None or summarized_until >= kept_from:
        return kept_from
    return summarized_until


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """What one compaction does with a memory, decided before any model is called.

    Bytes ``kept_from``..end stay verbatim (the newest turns); of 0..``kept_from``
    the ``chunks`` are summarized now, and when they are fewer than the material
    needs (``chunks.partial``) only 0..``summarized_to`` is compacted and the
    rest stays raw for the next compaction (the carried tail).

    Production takes the same decisions from the same functions, in two places:
    the transaction (:mod:`memd.compaction`) takes the kept tail
    (:func:`kept_tail`) and the carry (:func:`summarized_to`), the LLM summarizer
    (:mod:`memd.llm`) the chunks of the prefix it is handed (:func:`plan_chunks_of`).
    """

    kept_from: int
    kept_tokens: int
    chunks: ChunkPlan
    summarized_to: int

    @property
    def partial(self) -> bool:
        return self.chunks.partial


def plan_compaction(
    document: MemoryDocument,
    end: int,
    recent_tokens: int,
    budget: ChunkBudget,
    count_text: CountText,
    redact: Callable[[str], str] | None = None,
) -> CompactionPlan:
    """The plan (pure): the kept tail within ``recent_tokens``, then every turn
    before it packed into chunks of at most ``budget.chunk_tokens`` (the
    summarizer's room per request), at most ``budget.max_calls`` of them now.

    Every raw entry since the last summary ends up in exactly one of: the kept
    tail, one chunk summarized now, or the carried tail of a partial compaction.
    """
    kept_from, kept_tokens = kept_tail(document, end, recent_tokens, count_text)
    chunks = plan_chunks_of(document.prefix(kept_from), budget, count_text, redact)
    return CompactionPlan(
        kept_from, kept_tokens, chunks, summarized_to(kept_from, chunks.summarized_until)
    )


# ---------------------------------------------------------------------- recovery


class RecoveryAction(StrEnum):
    CLEAN_TEMPS = "clean_temps"  # no job in flight: drop stale temp files only
    ROLL_BACK = "roll_back"  # crashed before the replace: MEMORY.md holds everything
    ROLL_FORWARD = "roll_forward"  # crashed after the replace: finish the drain
    KEEP_OLD_AS_ARCHIVE = "keep_old_as_archive"  # MEMORY.md replaced by someone else


IDLE_PHASE = "idle"
FileId = tuple[object, object]


def recovery_action(
    phase: object, current: FileId | None, old: FileId, new: FileId
) -> RecoveryAction:
    """What to do with a job whose journal says ``phase``.

    ``current`` is MEMORY.md's (dev, ino) now (None: missing); ``old`` and
    ``new`` are the inode numbers the journal recorded. Decided by inode
    numbers, never by guessing. A journal with no readable record never gets
    here (it is no job "rolled back": the files decide, in memd.compaction).
    """
    if phase == IDLE_PHASE:
        return RecoveryAction.CLEAN_TEMPS
    if phase == "archiving" or (phase == "swapping" and current == old):
        return RecoveryAction.ROLL_BACK
    if phase in {"swapping", "draining"} and current == new:
        return RecoveryAction.ROLL_FORWARD
    # MEMORY.md is neither the old nor the new inode: someone replaced (or
    # removed) it while memd was down.
    return RecoveryAction.KEEP_OLD_AS_ARCHIVE


_CRLF_TERMINATOR: Final = BLOCK_TERMINATOR.replace(b"\n", b"\r\n")


def landed_prefix(after: bytes, chunk: bytes) -> int:
    """Length of the longest prefix of ``chunk`` that starts where an append could.

    ``after`` is the new file from where it ended before the journaled append.
    An append lands at the end of the file as it was then: right there or after
    other writers' whole appends, so a candidate start is 0 or just after an
    entry's end: its terminator (CRLF alike) and any empty lines after it, as the
    drain waits for (a writer leaving ``---\n\n\n`` put the chunk a line further
    on: not finding it there appended it twice).
    """
    best = 0
    starts = [0]
    for terminator in (BLOCK_TERMINATOR, _CRLF_TERMINATOR):
        position = after.find(terminator)
        while position >= 0:
            start = position + len(terminator)
            starts.append(start)
            while True:
                if after.startswith(b"\n", start):
                    start += 1
                elif after.startswith(b"\r\n", start):
                    start += 2
                else:
                    break
                starts.append(start)
            position = after.find(terminator, position + 1)
    for start in starts:
        window = after[start : start + len(chunk)]
        if window == chunk:
            return len(chunk)
        # A short prefix only counts when it runs to the end of the file: a
        # write cut short is the last thing in the file unless others wrote after.
        if window and start + len(window) == len(after) and chunk.startswith(window):
            best = max(best, len(window))
    return best


# ------------------------------------------------------------ stored-count trust


class FileFacts(NamedTuple):
    """What ``stat`` says about a file (or what was stored of it); a tuple: two are
    made per agent at a restart."""

    dev: int
    ino: int
    size: int
    mtime_ns: int


class StoredCountTrust(StrEnum):
    RECOUNT = "recount"  # the stored count says nothing about this file
    REUSE = "reuse"  # the same bytes: reuse the count as it is
    EXTEND = "extend"  # the same file, grown: count only the new bytes


def stored_count_trust(
    stored: FileFacts,
    now: FileFacts,
    *,
    tokens: int,
    safe_tokens: int,
    stored_encoding: str,
    encoding: str,
    has_window_digest: bool,
) -> StoredCountTrust:
    """Whether a count stored when the file looked like ``stored`` fits the file ``now``.

    Same inode, not smaller, same encoding, a sane record, a window digest to
    verify it by, and, when the size is unchanged, an unchanged mtime (same size
    but touched: rewritten in place while memd was down).
    """
    same_file = (now.dev, now.ino) == (stored.dev, stored.ino)
    if (
        not same_file
        or now.size < stored.size
        or tokens < safe_tokens
        or stored_encoding != encoding
        or (now.size == stored.size and now.mtime_ns != stored.mtime_ns)
        or not has_window_digest
    ):
        return StoredCountTrust.RECOUNT
    return StoredCountTrust.EXTEND if now.size > stored.size else StoredCountTrust.REUSE


__all__ = [
    "IDLE_PHASE",
    "SMALLEST_LOW_WATER_TOKENS",
    "SUMMARY_MARKUP_TOKENS",
    "ChunkBudget",
    "CompactionPlan",
    "FileFacts",
    "RecoveryAction",
    "StoredCountTrust",
    "chunk_budget",
    "has_compactable",
    "kept_tail",
    "kept_tail_start",
    "known_consistent",
    "landed_prefix",
    "lone_summary",
    "may_exceed_cap",
    "nothing_to_compact_reason",
    "plan_chunks_of",
    "plan_compaction",
    "recovery_action",
    "stored_count_trust",
    "summarized_to",
    "summary_does_not_shrink",
    "summary_over_budget",
    "summary_over_cap",
    "unparsed_tail_bytes",
]
