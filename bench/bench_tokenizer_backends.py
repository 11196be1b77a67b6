"""Tokenizer speed: tiktoken on 1 vs 2 threads, and the exact-BPE alternatives.

memd counts with tiktoken's ``cl100k_base`` (exact counts are its contract).
This prints, on one synthetic corpus (chat, paths, URLs, code, CJK, emoji):

- tiktoken ``encode_ordinary`` MB/s on one thread, and on two threads each
  encoding half (tiktoken releases the GIL for part of its work);
- for each optional backend that is installed (``rs-bpe``, ``bpe-openai``):
  MB/s, and whether its token ids equal tiktoken's on the whole corpus.

    python bench/bench_tokenizer_backends.py [--mb 16]

The alternatives are not memd dependencies: install them beside memd to
measure them (``pip install rs-bpe bpe-openai``). The README records the
decision and its reasons.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence

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
    return found


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
    for name, encode in alternatives():
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
