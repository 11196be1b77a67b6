"""Redaction benchmark: recall on real-format fake secrets, false positives on look-alikes.

    .venv/bin/python bench/bench_redaction.py [--mb 2] [--against OTHER/secrets.py [--runs 7]]

Prints figures, asserts nothing.  The corpus (tests/support/secret_corpus.py)
plants the 19 formats of issue 12 (plus further well-known ones) in the kind
of sentences an agent's memory holds, and 26 near misses: hex hashes, UUIDs,
commit ids, paths, base64, versions, digests, timestamps, prose about passwords,
and command lines with ports, widths, prompts and stand-ins where a password
might be.  "caught" means the
exact secret lies inside a reported span of the right category.  Throughput is
``find_secrets`` (PII on) over a synthetic memory file of ``--mb`` megabytes,
and over one line of as many megabytes of JSON tool calls naming curl/mysql.
Last, end to end: how many planted secrets a remote summarizer's request would
still hold after redaction, and how many credentials the builtin summarizer
copies into a summary.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.secret_corpus import LOOKALIKES, PLANTED, PLANTED_EXTRA, Planted

from memd.core import memfile
from memd.core.carry import carry_material
from memd.core.privacy import Privacy
from memd.core.secrets import find_secrets
from memd.core.summary import SummaryRequest
from memd.core.summary_block import compose_summary
from memd.summarizers import BuiltinSummarizer


def caught(planted: Planted) -> bool:
    text = planted.sentence
    return any(
        s.start <= text.index(planted.secret)
        and text.index(planted.secret) + len(planted.secret) <= s.end
        for s in find_secrets(text, pii=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=2.0)
    parser.add_argument("--against", type=Path, help="another secrets.py to time this one against")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    print("format                   caught")
    hits = 0
    for planted in PLANTED:
        ok = caught(planted)
        hits += ok
        print(f"  {planted.kind:22} {'yes' if ok else 'NO'}")
    extra_hits = sum(caught(p) for p in PLANTED_EXTRA)
    flagged = [text for text in LOOKALIKES if find_secrets(text, pii=True)]
    print(f"recall, issue 12's formats:  {hits}/{len(PLANTED)}")
    print(f"recall, further formats:     {extra_hits}/{len(PLANTED_EXTRA)}")
    print(f"false positives, look-alikes: {len(flagged)}/{len(LOOKALIKES)} (bar: at most 1 in 13)")
    for text in flagged:
        print(f"  flagged: {text[:70]}")

    blob = mix(args.mb)
    started = time.perf_counter()
    spans = find_secrets(blob, pii=True)
    elapsed = time.perf_counter() - started
    megabytes = len(blob) / 1024 / 1024
    print(
        f"throughput: {megabytes / elapsed:.2f} MB/s over {megabytes:.1f} MB ({len(spans)} spans)"
    )
    line = tool_call_line(args.mb)
    started = time.perf_counter()
    spans = find_secrets(line, pii=True)
    elapsed = time.perf_counter() - started
    megabytes = len(line) / 1024 / 1024
    print(
        f"throughput, one-line tool-call log: {megabytes / elapsed:.2f} MB/s over "
        f"{megabytes:.1f} MB ({len(spans)} spans)"
    )
    end_to_end()
    if args.against is not None:
        against(args.against, {"mix": blob, "one-line tool-call log": line}, args.runs)


def mix(mb: float) -> str:
    """Worst case: every other line a look-alike that passes the rules' cheap hints."""
    rng = random.Random(7)
    pieces = [*LOOKALIKES, "The agent decided to retry the build after the flaky test.", "ok"]
    blob_parts: list[str] = []
    size = 0
    target = int(mb * 1024 * 1024)
    while size < target:
        piece = rng.choice(pieces) if rng.random() > 0.01 else rng.choice(PLANTED).sentence
        blob_parts.append(piece)
        size += len(piece) + 1
    return "\n".join(blob_parts)


def tool_call_line(mb: float) -> str:
    """One long line of tool calls (a minified JSON log): every element names
    curl or mysql, so the command-line rules read arguments after each one."""
    calls: list[str] = []
    size = 0
    index = 0
    while size < mb * 1024 * 1024:
        command = (
            f"curl -s https://api.example.com/v1/items/{index}"
            if index % 3
            else f"mysql -h db -u app -e 'select {index}' app"
        )
        calls.append(f'{{"tool":"bash","command":"{command}"}}')
        size += len(calls[-1]) + 2
        index += 1
    return "[" + ", ".join(calls) + "]"


def against(path: Path, texts: dict[str, str], runs: int) -> None:
    """This detector's throughput against another version's (a secrets.py, say
    main's: ``git show main:memd/core/secrets.py > /tmp/main_secrets.py``), timed
    in this process, interleaved, medians of ``runs``: a ratio a loaded machine
    does not skew the way it skews two separate runs."""
    spec = importlib.util.spec_from_file_location("other_secrets", path)
    assert spec is not None and spec.loader is not None
    other = importlib.util.module_from_spec(spec)
    sys.modules["other_secrets"] = other  # its dataclasses look their module up
    spec.loader.exec_module(other)
    for name, text in texts.items():
        times: dict[str, list[float]] = {"this": [], "other": []}
        for _ in range(runs):
            for label, detect in (("this", find_secrets), ("other", other.find_secrets)):
                started = time.perf_counter()
                detect(text, pii=True)
                times[label].append(time.perf_counter() - started)
        mine, theirs = statistics.median(times["this"]), statistics.median(times["other"])
        megabytes = len(text) / 1024 / 1024
        print(
            f"against {path.name}, {name}: {megabytes / mine:.2f} MB/s vs "
            f"{megabytes / theirs:.2f} MB/s, this / other {theirs / mine:.2f} (medians of {runs})"
        )


def end_to_end() -> None:
    """What a remote summarizer would be sent, and what the builtin summary keeps."""
    corpus = PLANTED + PLANTED_EXTRA
    privacy = Privacy(b"bench-key-0123456789abcdef012345")
    outbound = privacy.outbound("openai/gpt-4o-mini", "")
    assert outbound is not None
    sent = [outbound.redact(p.sentence).text for p in corpus]
    survived = sum(p.secret in text for p, text in zip(corpus, sent, strict=True))
    print(f"remote request: {survived}/{len(corpus)} planted secrets survive redaction")
    data = memfile.render_header("bench", "2026-12-01T10:00:00")
    for index, planted in enumerate(corpus):
        stamp = f"2026-12-01T10:{index // 60:02d}:{index % 60:02d}"
        # The kind of line the extractive summary keeps: a decision naming the secret.
        data += memfile.render_entry("Human", stamp, f"We decided this. {planted.sentence}")
    request = SummaryRequest("bench", memfile.parse(data), 4000, privacy=privacy)
    summary = BuiltinSummarizer(lambda text: len(text) // 4).summarize(request).text
    credentials = [p for p in corpus if not p.pii]
    copied = sum(p.secret in summary for p in credentials)
    print(f"builtin summary: {copied}/{len(credentials)} credentials copied into it")
    # A model's reply that keeps none of it: the lines memd carries beside it
    # (before the reply scan that would redact what slipped through).
    data = memfile.render_header("bench", "2026-12-01T10:00:00")
    for index, planted in enumerate(credentials):
        stamp = f"2026-12-01T10:{index // 60:02d}:{index % 60:02d}"
        data += memfile.render_entry("Human", stamp, f"We decided on it: {planted.sentence}")
    material = carry_material(memfile.parse(data))
    carried = compose_summary(
        "Decisions:\n- Several were made.",
        [],
        pinned_tokens=0,
        count_text=lambda text: len(text) // 4,
        carried=material.lines,
        block_tokens=1_000_000,
    )
    copied = sum(p.secret in carried.text for p in credentials)
    print(
        f"carried lines: {copied}/{len(credentials)} credentials carried "
        f"({carried.carried} decision lines carried of {len(credentials)} turns)"
    )


if __name__ == "__main__":
    main()
