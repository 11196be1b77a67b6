"""``memd compact-now --dry-run``: what a compaction would do, changing nothing.

Reads MEMORY.md (through the same containment rule as the transaction), plans
the summary — turns, pinned facts, budgets, the summarizer's chunks and calls —
and, with ``summarize``, also runs the summarizer and shows the block it would
write with its retention against the pinned facts.  Takes no lock and writes no
file: a running daemon is never disturbed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from memd.compaction import (
    CompactionOptions,
    lines_the_scan_keeps,
    pins_naming_no_credential,
    pins_the_scan_keeps,
    read_memory,
)
from memd.core.carry import carry_material
from memd.core.memfile import parse, render_summary_block
from memd.core.pins import fit_pins
from memd.core.plan import (
    has_compactable,
    kept_tail_start,
    nothing_to_compact_reason,
    summary_over_budget,
)
from memd.core.privacy import Privacy
from memd.core.summary import Summarizer, SummaryRequest
from memd.core.summary_block import compose_summary, material_of
from memd.core.summary_plan import is_degenerate
from memd.errors import NothingToCompact
from memd.redaction_key import process_key
from memd.summarizers import BUILTIN_MODEL
from memd.workspace import AgentPaths

CountText = Callable[[str], int]


def preview(
    paths: AgentPaths,
    summarizer: Summarizer,
    options: CompactionOptions,
    count_text: CountText,
    *,
    summarize: bool = False,
) -> list[str]:
    """The plan as printable lines; raises NothingToCompact or SummarizerError."""
    try:
        data = read_memory(paths)
    except FileNotFoundError:
        raise NothingToCompact(f"agent {paths.agent!r}: no MEMORY.md to compact") from None
    document = parse(data)
    # The same kept tail as the transaction: bytes 0..K are what would be compacted.
    boundary = kept_tail_start(document, document.boundary, options.keep_recent_tokens, count_text)
    kept = [e for e in document.raw_entries_since_summary() if e.start >= boundary]
    prefix = document.prefix(boundary)
    # As the transaction decides: a summary block alone is re-summarized only when
    # it is over its budget.
    cap = options.summary_max_tokens + options.pinned_tokens
    oversized = (
        None
        if has_compactable(prefix)
        else summary_over_budget(
            prefix, cap, lambda raw: count_text(raw.decode("utf-8", "surrogateescape"))
        )
    )
    if not has_compactable(prefix) and oversized is None:
        beyond = (
            f" beyond the newest {options.keep_recent_tokens:,} tokens kept verbatim"
            if kept
            else ""
        )
        reason = nothing_to_compact_reason(document, beyond)
        raise NothingToCompact(f"agent {paths.agent!r}: {reason}")
    material = material_of(prefix, count_text)
    kinds = Counter(pin.kind for pin in material.pins)
    fitted = fit_pins(list(material.pins), options.pinned_tokens, count_text)
    what = "runs the summarizer, writes nothing" if summarize else "calls no model, writes nothing"
    lines = [
        f"{paths.agent}: dry run ({what})",
        f"  MEMORY.md: {count_text(data.decode('utf-8', 'replace')):,} tokens; "
        f"{material.turns} raw turn(s) since the last summary, {material.input_tokens:,} tokens "
        "to summarize with the previous summary",
        f"  budgets: summary {options.summary_max_tokens:,} tokens, "
        f"pinned facts {options.pinned_tokens:,} tokens, "
        f"recent turns {options.keep_recent_tokens:,} tokens",
        f"  kept verbatim after the summary: {len(kept)} newest turn(s), "
        f"{sum(count_text(e.raw.decode('utf-8', 'replace')) for e in kept):,} tokens "
        f"(bytes {boundary:,}..{document.boundary:,}; archived at a later compaction)",
        f"  pinned facts: {len(material.pins)} "
        f"({', '.join(f'{kind} {count}' for kind, count in sorted(kinds.items())) or 'none'}); "
        f"{fitted.evicted} would age out to the archives if the summary kept none itself",
    ]
    if oversized is not None:
        lines.append(
            f"  the summary block alone ({oversized:,} tokens) is over its budget "
            f"({cap:,} tokens and its markup): it is summarized again, shorter"
        )
    request = SummaryRequest(
        agent=paths.agent,
        document=prefix,
        max_tokens=options.summary_max_tokens,
        instructions=options.instructions,
        privacy=options.privacy,
    )
    plan_of = getattr(summarizer, "plan", None)
    window = getattr(summarizer, "window", None)
    if callable(plan_of) and window is not None:
        plan, _start, limits = plan_of(request)
        sizes = ", ".join(f"{chunk.tokens:,}" for chunk in plan.chunks)
        lines.append(
            f"  summarizer {summarizer.model}: window {window.tokens:,} tokens "
            f"(from {window.source}), answer <= {limits.output_tokens:,}, prompt <= "
            f"{limits.input_tokens:,}; {len(plan.chunks)} call(s) for {plan.total_chunks} "
            f"chunk(s) of {sizes} tokens"
        )
        if plan.partial:
            lines.append(
                f"  partial: only bytes 0..{plan.cut:,} fit {len(plan.chunks)} call(s) "
                "(summarizer.max_calls); later turns stay raw for the next compaction"
            )
    else:
        lines.append(f"  summarizer {summarizer.model}: one pass over every turn, no model call")
    if not summarize:
        return lines
    result = summarizer.summarize(request)
    cut = result.summarized_until or boundary
    summarized = document.prefix(cut)
    material = material_of(summarized, count_text)
    privacy = options.privacy or Privacy(process_key())
    scan = privacy.for_reply(pii=result.redacted_pii)
    # As the transaction: what a model's reply dropped is carried verbatim.
    carry = carry_material(summarized) if result.model != BUILTIN_MODEL else None
    composed = compose_summary(
        scan.redact(result.text.strip()).text,
        pins_naming_no_credential(pins_the_scan_keeps(material.pins, scan), carry),
        pinned_tokens=options.pinned_tokens,
        count_text=count_text,
        archive="archive/history_(not written).md",
        earlier_archives=material.earlier_archives,
        carried=lines_the_scan_keeps(carry.lines, scan) if carry is not None else (),
        carried_done=carry.done if carry is not None else frozenset(),
        block_tokens=cap,
    )
    if summarizer.model != "provided" and is_degenerate(
        count_text(result.text), material.input_tokens, options.summary_max_tokens
    ):
        lines.append("  the reply is degenerate: a real compaction would refuse it")
    total = len(material.pins)
    share = f"{100.0 * composed.covered / total:.0f} %" if total else "-"
    block = render_summary_block(composed.text, "(dry run)").decode("utf-8", "replace")
    lines += [
        f"  retention: the reply itself kept {composed.covered} of {total} pinned facts "
        f"({share}); {composed.pinned} more are pinned verbatim, {composed.evicted} age out"
        + (
            f"; {composed.carried} decision/task/error/person line(s) it left out are kept verbatim"
            if composed.carried
            else ""
        ),
        f"  the block ({count_text(block):,} tokens) that would replace the summarized turns:",
        "",
        block.rstrip(),
    ]
    return lines
