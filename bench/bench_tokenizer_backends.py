"""Tokenizer speed: tiktoken on 1 vs 2 threads, and the exact-BPE alternatives.

memd counts with tiktoken's ``cl100k_base`` (exact counts are its contract).
This prints, on one synthetic corpus (chat, paths, URLs, code, CJK, emoji):

- tiktoken ``encode_ordinary`` MB/s on one thread, and on two threads each
  encoding half (tiktoken releases the GIL for part of its work);
- the same encoding used from a thread that did not use it first, and two threads
  each with an encoding of its own: the regex crate keeps a matcher's scratch
  space for the first thread that used it, and every other thread borrows one from
  a locked pool at each match (the first thread is this process's main thread here;
  in the daemon, whichever thread counted first);
- for each optional backend that is installed (``rs-bpe``, ``bpe-openai``,
  ``kitoken``): MB/s, and whether its token ids equal tiktoken's on the whole
  corpus; then, on Swarms turns one call each (what the daemon's counting thread
  does per append), microseconds per turn in a loop and paced (a 2 ms sleep before
  each call, as appends come: the tables cold in the CPU's caches), against
  tiktoken's in the same run, and how many turns' ids differ from tiktoken's.

    python bench/bench_tokenizer_backends.py [--mb 16]

The alternatives are not memd dependencies: install them beside memd to
measure them (``pip install rs-bpe bpe-openai kitoken``). The README records the
decision and its reasons.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from memd.tokenizer import load_encoding

PIECES = (
    "memory", "agent", "the", "compaction", "/srv/agents/alice/MEMORY.md", "v1.2.3",
    "https://example.com/x?y=1", "  ", "\n\n", "élan", "数据", "🙂", "ERROR: timeout after 30s",
    "def f(x):\n    return x**2", "0x1f2e3d", "I prefer tea", "`pip install memd`",
)  # fmt: skip


def corpus(megabytes: float) -> str:
    rnd = random.Random(1)
    out: list[str] = []
    size = 0
    while size < megabytes * 1e6:
        piece = rnd.choice(PIECES) + rnd.choice((" ", "", "\n", ", "))
        out.append(piece)
        size += len(piece.encode())
    return "".join(out)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def two_threads(encode: Callable[[str], Sequence[int]], text: str) -> float:
    half = len(text) // 2
    parts = (text[:half], text[half:])
    threads = [threading.Thread(target=encode, args=(part,)) for part in parts]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def elsewhere(encode: Callable[[str], Sequence[int]], text: str) -> float:
    """Seconds to encode ``text`` on a new thread (not the one that used it first)."""
    took: list[float] = []
    thread = threading.Thread(target=lambda: took.append(timed(lambda: encode(text))[0]))
    thread.start()
    thread.join()
    return took[0]


def own_encodings(text: str) -> float:
    """Two threads, each encoding half of ``text`` with an encoding of its own that it
    used first (built from the loaded one's ranks)."""
    import tiktoken as tiktoken_module

    shared = load_encoding("cl100k_base")
    half = len(text) // 2
    parts = (text[:half], text[half:])
    encodings = [
        tiktoken_module.Encoding(
            name=shared.name,
            pat_str=shared._pat_str,
            mergeable_ranks=shared._mergeable_ranks,
            special_tokens=shared._special_tokens,
        )
        for _ in parts
    ]
    ready = threading.Barrier(len(parts) + 1)

    def encode(encoding: tiktoken_module.Encoding, part: str) -> None:
        encoding.encode_ordinary("claim")  # this thread uses it first
        ready.wait()
        encoding.encode_ordinary(part)

    threads = [
        threading.Thread(target=encode, args=(encoding, part))
        for encoding, part in zip(encodings, parts, strict=True)
    ]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def alternatives() -> list[tuple[str, Callable[[str], Sequence[int]]]]:
    found: list[tuple[str, Callable[[str], Sequence[int]]]] = []
    try:
        from rs_bpe.bpe import openai as rs_openai  # type: ignore[import-not-found]

        found.append(("rs-bpe", rs_openai.cl100k_base().encode))
    except ImportError:
        print("rs-bpe: not installed")
    try:
        import bpe_openai  # type: ignore[import-not-found]

        found.append(("bpe-openai", bpe_openai.get_encoding("cl100k_base").encode_ordinary))
    except ImportError:
        print("bpe-openai: not installed")
    try:
        import kitoken  # type: ignore[import-not-found]

        from memd.tokenizer import locate_encoding

        ranks = locate_encoding("cl100k_base") / CL100K_FILE
        encoder = kitoken.Kitoken.from_tiktoken_file(str(ranks))
        found.append(("kitoken", lambda text: encoder.encode(text, False)))
    except ImportError:
        print("kitoken: not installed")
    return found


# tiktoken's cache names the cl100k_base file by the sha1 of its URL.
CL100K_FILE = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"


def per_call_us(
    encode: Callable[[str], Sequence[int]], turns: Sequence[str]
) -> tuple[float, float]:
    """Microseconds per turn, one call each: in a loop (median of 3 passes), and
    paced with a 2 ms sleep before each call (CPU time of the calls alone)."""
    passes = []
    for _ in range(3):
        started = time.process_time()
        for turn in turns:
            encode(turn)
        passes.append((time.process_time() - started) / len(turns))
    paced = 0.0
    few = turns[:500]
    for turn in few:
        time.sleep(0.002)
        started = time.process_time()
        encode(turn)
        paced += time.process_time() - started
    return sorted(passes)[1] * 1e6, paced / len(few) * 1e6


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=16.0)
    args = parser.parse_args(argv)
    text = corpus(args.mb)
    megabytes = len(text.encode()) / 1e6
    tiktoken = load_encoding("cl100k_base")
    one, reference = timed(lambda: tiktoken.encode_ordinary(text))
    assert isinstance(reference, list)
    two = two_threads(tiktoken.encode_ordinary, text)
    print(f"corpus {megabytes:.1f} MB, {len(reference):,} tokens")
    print(f"tiktoken, 1 thread : {megabytes / one:6.2f} MB/s")
    print(f"tiktoken, 2 threads: {megabytes / two:6.2f} MB/s ({one / two:.2f}x one thread)")
    other = elsewhere(tiktoken.encode_ordinary, text)
    print(
        f"tiktoken, 1 thread that did not use the encoding first: {megabytes / other:6.2f} MB/s "
        f"({one / other:.2f}x the first thread)"
    )
    # What the daemon's counting thread does: one call per appended turn (~750 bytes).
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_daemon import swarms_turns

    turns = swarms_turns() * 5

    def per_turn() -> None:
        for turn in turns:
            tiktoken.encode_ordinary(turn)

    first, _ = timed(per_turn)
    per_turn_other = elsewhere(lambda _text: per_turn() or [], "")
    print(
        f"tiktoken, {len(turns)} Swarms turns one call each: first thread "
        f"{first / len(turns) * 1e6:.0f} us per turn, another thread "
        f"{per_turn_other / len(turns) * 1e6:.0f} us ({per_turn_other / first:.2f}x)"
    )
    owned = own_encodings(text)
    print(
        f"tiktoken, 2 threads with an encoding each: {megabytes / owned:6.2f} MB/s "
        f"({one / owned:.2f}x one thread)"
    )
    backends = alternatives()
    for name, encode in backends:
        try:
            seconds, ids = timed(lambda encode=encode: encode(text))  # type: ignore[misc]
        except Exception as exc:  # a backend that refuses the input is a finding
            print(f"{name}: failed on the corpus: {type(exc).__name__}: {exc}")
            continue
        exact = list(ids) == reference  # type: ignore[call-overload]
        print(
            f"{name:<11}: {megabytes / seconds:6.2f} MB/s ({one / seconds:.2f}x tiktoken), "
            f"ids identical to tiktoken: {exact}"
        )
    base_loop, base_paced = per_call_us(tiktoken.encode_ordinary, turns)
    print(
        f"per Swarms turn, one call each ({len(turns)} turns): tiktoken {base_loop:.1f} us "
        f"in a loop, {base_paced:.1f} us paced"
    )
    for name, encode in backends:
        differ = sum(1 for turn in turns if list(encode(turn)) != tiktoken.encode_ordinary(turn))
        loop, paced = per_call_us(encode, turns)
        print(
            f"  {name:<11}: {loop:.1f} us in a loop ({base_loop / loop:.2f}x tiktoken), "
            f"{paced:.1f} us paced ({base_paced / paced:.2f}x); turns whose ids differ: "
            f"{differ} of {len(turns)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
