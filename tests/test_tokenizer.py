"""Tokenizer loading works with no network and no tiktoken cache; counts are exact."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from support.preludes import NO_LITELLM_PRELUDE
from support.token_oracle import count_bytes_with, safe_chunk_bounds

from memd.errors import TokenizerError
from memd.tokenizer import TokenCounter, bundled_tokenizer_dir, load_encoding

SAMPLE = "### User \u2014 2024-01-01T00:00:00\n\nHello, wörld! 日本語 ###\n\n---\n\n"
SAMPLE_BYTES = SAMPLE.encode() + b"\xff\xe2\x80 tail"

# Cuts the network off inside the child even where `unshare -n` is not allowed.
NO_NETWORK_PRELUDE = textwrap.dedent(
    """
    import socket

    def _no_network(*args, **kwargs):
        raise OSError("network disabled by the test")

    socket.socket.connect = _no_network
    socket.socket.connect_ex = _no_network
    socket.create_connection = _no_network
    socket.getaddrinfo = _no_network
    """
)


@cache
def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def run_offline(
    code: str, cache_dir: Path, *, prelude: str = NO_NETWORK_PRELUDE
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter: no network, an empty tiktoken cache."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("LITELLM")}
    env["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
    env["MEMD_CACHE_DIR"] = str(cache_dir.parent / "memd-parsed")  # no parsed table: a cold load
    env.pop("DATA_GYM_CACHE_DIR", None)
    argv = [sys.executable, "-c", prelude + "\n" + textwrap.dedent(code)]
    if _unshare_works():
        argv = ["unshare", "-n", *argv]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


@pytest.fixture
def empty_cache(tmp_path: Path) -> Path:
    cache_dir = tmp_path / "tiktoken-cache"
    cache_dir.mkdir()
    return cache_dir


def test_the_sandbox_really_blocks_downloads(empty_cache: Path) -> None:
    # Control experiment: plain tiktoken must fail here, or the test below proves nothing.
    result = run_offline(
        """
        import tiktoken
        tiktoken.get_encoding("cl100k_base")
        """,
        empty_cache,
    )
    assert result.returncode != 0
    assert list(empty_cache.iterdir()) == []


def test_encodings_load_offline_with_an_empty_cache(empty_cache: Path) -> None:
    result = run_offline(
        f"""
        import json, os, sys
        from memd.tokenizer import TokenCounter, load_encoding
        data = {SAMPLE_BYTES!r}
        out = {{}}
        for name in ("cl100k_base", "o200k_base", "p50k_base"):
            out[name] = [TokenCounter(name).count_bytes(data), len(load_encoding(name).encode_ordinary({SAMPLE!r}))]
        out["cache_env"] = os.environ.get("TIKTOKEN_CACHE_DIR")
        out["litellm_imported"] = "litellm" in sys.modules
        print(json.dumps(out))
        """,
        empty_cache,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for name in ("cl100k_base", "o200k_base", "p50k_base"):
        encoding = load_encoding(name)
        expected = len(encoding.encode_ordinary(SAMPLE_BYTES.decode("utf-8", "replace")))
        assert report[name] == [expected, len(encoding.encode_ordinary(SAMPLE))]
    assert report["cache_env"] == str(empty_cache)  # restored after the load
    assert report["litellm_imported"] is False
    assert list(empty_cache.iterdir()) == []  # nothing downloaded or written


def test_without_litellm_the_error_names_the_encoding(empty_cache: Path) -> None:
    result = run_offline(
        """
        from memd.tokenizer import load_encoding
        load_encoding("cl100k_base")
        """,
        empty_cache,
        prelude=NO_NETWORK_PRELUDE + NO_LITELLM_PRELUDE,
    )
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("memd.errors.TokenizerError: tokenizer encoding 'cl100k_base'")
    assert "not found offline" in last_line


def test_a_bpe_file_missing_from_every_dir_is_a_tokenizer_error(empty_cache: Path) -> None:
    # r50k_base is a real tiktoken encoding, but no wheel bundles its file.
    result = run_offline(
        """
        from memd.tokenizer import load_encoding
        load_encoding("r50k_base")
        """,
        empty_cache,
    )
    assert result.returncode != 0
    assert "TokenizerError: tokenizer encoding 'r50k_base'" in result.stderr
    assert list(empty_cache.iterdir()) == []


def test_a_corrupt_cached_file_is_refused_and_left_alone(empty_cache: Path) -> None:
    corrupt = empty_cache / "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4"  # sha1 of r50k's URL
    corrupt.write_bytes(b"not a bpe file\n")
    result = run_offline(
        """
        from memd.tokenizer import load_encoding
        load_encoding("r50k_base")
        """,
        empty_cache,
    )
    assert "TokenizerError: tokenizer encoding 'r50k_base'" in result.stderr
    assert corrupt.read_bytes() == b"not a bpe file\n"  # tiktoken would have deleted it


@pytest.mark.parametrize("name", ["no_such_encoding", "gpt2", ""])
def test_unknown_or_unsupported_encoding_names_raise(name: str) -> None:
    with pytest.raises(TokenizerError, match=f"tokenizer encoding '{name}'") as caught:
        load_encoding(name)
    assert "\n" not in str(caught.value)
    assert "cl100k_base" in str(caught.value)  # says what would work


def test_loaded_encodings_are_cached() -> None:
    assert load_encoding("cl100k_base") is load_encoding("cl100k_base")


def test_bundled_dir_is_litellms_tokenizer_dir() -> None:
    bundled = bundled_tokenizer_dir()
    assert bundled is not None
    assert bundled.parts[-3:] == ("litellm", "litellm_core_utils", "tokenizers")


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base", "p50k_base"])
def test_counts_equal_one_encode_ordinary_of_the_decoded_bytes(name: str) -> None:
    counter = TokenCounter(name, chunk_bytes=4096)
    encoding = load_encoding(name)
    big = (SAMPLE_BYTES + b"\nSome prose.\nMore prose here.\r\n###\n") * 3000
    for data in (b"", SAMPLE_BYTES, big, b"\xff" * 10_000, b" \r\n" * 5000):
        expected = len(encoding.encode_ordinary(data.decode("utf-8", "replace")))
        assert counter.count_bytes(data) == expected
    assert counter.count_text(SAMPLE) == len(encoding.encode_ordinary(SAMPLE))
    assert counter.count_text("<|endoftext|>") > 1  # special tokens are plain text here


def test_chunks_counted_in_a_process_pool_add_up_to_the_whole() -> None:
    data = (SAMPLE_BYTES + b"\nSome prose.\nMore prose here.\n") * 2000
    expected = TokenCounter("o200k_base").count_bytes(data)
    bounds = safe_chunk_bounds(data, len(data) // 3)
    assert len(bounds) >= 3
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        counts = pool.map(
            count_bytes_with, ["o200k_base"] * len(bounds), [data[a:b] for a, b in bounds]
        )
        assert sum(counts) == expected


PARSED_CACHE_PROBE = """
import sys
import tiktoken.load
if sys.argv[1] == "forbid-parse":
    def refuse(*args, **kwargs):
        raise AssertionError("parsed the BPE file although the cache was there")
    tiktoken.load.load_tiktoken_bpe = refuse
from memd.tokenizer import load_encoding
encoding = load_encoding("cl100k_base")
print(encoding.encode_ordinary(sys.argv[2]))
"""


def _probe(cache: Path, mode: str, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PARSED_CACHE_PROBE, mode, text],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "MEMD_CACHE_DIR": str(cache)},
    )


def test_parsed_table_cache_is_used_and_gives_identical_tokens(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    text = "Ünïcödé ### Human — 2026-01-01T00:00:00\n\n---\n\n tokens 12345 ✓"
    first = _probe(cache, "parse", text)
    assert first.returncode == 0, first.stderr
    assert len(list(cache.glob("tiktoken-cl100k_base-*.ranks"))) == 1
    second = _probe(cache, "forbid-parse", text)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout


def test_damaged_parsed_cache_falls_back_to_the_bpe_file(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _probe(cache, "parse", "x").returncode == 0
    (entry,) = cache.glob("*.ranks")
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2])  # truncated
    damaged = _probe(cache, "forbid-parse", "x")
    assert damaged.returncode != 0  # the damaged cache was not trusted...
    repaired = _probe(cache, "parse", "hello")
    assert repaired.returncode == 0, repaired.stderr  # ...the BPE file was parsed again
    assert _probe(cache, "forbid-parse", "hello").stdout == repaired.stdout


def test_unwritable_cache_dir_still_loads(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = _probe(blocker / "cache", "parse", "hi")
    assert result.returncode == 0, result.stderr


def test_a_giant_pre_token_is_estimated_from_above_not_merged() -> None:
    # One 3 MiB run of letters is one pre-token: BPE would merge it whole
    # (gigabytes for 200 MB). It is estimated instead, never below the truth.
    from memd.tokenizer import TokenCounter

    counter = TokenCounter("cl100k_base", max_piece_bytes=1 << 20)
    head = "### Human \u2014 2026-01-01T00:00:00\n\nsome words before it "
    run = "a" * (3 << 20)
    data = (head + run + " and after\n\n---\n\n").encode()
    exact_per_mib = len(counter.encoding.encode_ordinary(run[: 1 << 16])) * 16
    assert counter.count_bytes(data) >= len(run) > 3 * exact_per_mib * 2
    # Ordinary text (no giant run) is still counted exactly.
    text = "".join(f"Plain sentence number {n} with words.\n" for n in range(60000))
    assert counter.count_bytes(text.encode()) == len(counter.encoding.encode_ordinary(text))


def test_a_counter_checks_its_encoding_at_once_and_loads_it_at_the_first_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A daemon restarting with every file unchanged reaches READY without the table."""
    import memd.tokenizer

    loads: list[str] = []
    real = memd.tokenizer.load_encoding

    def load(name: str) -> Any:
        loads.append(name)
        return real(name)

    monkeypatch.setattr(memd.tokenizer, "load_encoding", load)
    counter = TokenCounter("cl100k_base")
    assert loads == []  # checked (found offline), not loaded
    assert counter.count_text("hello world") == 2
    counter.warm()
    assert counter.count_bytes(b"hello world") == 2
    assert loads == ["cl100k_base"]  # once
    lazy = TokenCounter("cl100k_base")
    lazy.warm()  # the daemon's background thread
    assert loads == ["cl100k_base", "cl100k_base"] and lazy.count_text("hello") == 1
    with pytest.raises(TokenizerError, match="unknown"):
        TokenCounter("no_such_encoding")
