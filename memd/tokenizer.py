"""Load tiktoken encodings offline, and count tokens exactly.

tiktoken fetches its BPE files over HTTP the first time an encoding is used,
unless they already sit in ``$TIKTOKEN_CACHE_DIR`` under the sha1 of their
URL.  litellm's wheel ships exactly such a cache directory
(``litellm/litellm_core_utils/tokenizers``), so we point tiktoken at it for
the duration of the load.  litellm is located with ``importlib.util.find_spec``
and never imported: importing it is slow and phones home.

Before letting tiktoken read a file we check that it is there and that its
sha256 is the one tiktoken pins.  Otherwise tiktoken would fall back to the
network, and on a hash mismatch it would delete the file from litellm's
package directory.
"""

from __future__ import annotations

import array
import hashlib
import itertools
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from memd.core.tokens import DEFAULT_MAX_PIECE_BYTES, PieceCounter
from memd.errors import TokenizerError
from memd.litellm_data import litellm_file
from memd.settings import resolve_cache_dir, tiktoken_cache_dir, tiktoken_cache_dir_kept

if TYPE_CHECKING:
    import tiktoken

DEFAULT_ENCODING: Final = "cl100k_base"
_BLOB_BASE: Final = "https://openaipublic.blob.core.windows.net/encodings/"


@dataclass(frozen=True, slots=True)
class _BpeFile:
    url: str
    sha256: str

    @property
    def cache_key(self) -> str:
        # tiktoken.load.read_file_cached names cache entries by sha1 of the URL.
        return hashlib.sha1(self.url.encode(), usedforsecurity=False).hexdigest()


_CL100K: Final = _BpeFile(
    _BLOB_BASE + "cl100k_base.tiktoken",
    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
)
_O200K: Final = _BpeFile(
    _BLOB_BASE + "o200k_base.tiktoken",
    "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
)
_P50K: Final = _BpeFile(
    _BLOB_BASE + "p50k_base.tiktoken",
    "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
)
_R50K: Final = _BpeFile(
    _BLOB_BASE + "r50k_base.tiktoken",
    "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
)

# The single BPE file each encoding's constructor in tiktoken_ext.openai_public
# reads (URLs and hashes copied from there).  "gpt2" reads two other files that
# no wheel bundles, so it is not offered.  r50k_base is not in litellm's wheel
# either; it works when the user put it in $TIKTOKEN_CACHE_DIR themselves.
OFFLINE_ENCODINGS: Final[dict[str, _BpeFile]] = {
    "cl100k_base": _CL100K,
    "o200k_base": _O200K,
    "o200k_harmony": _O200K,
    "p50k_base": _P50K,
    "p50k_edit": _P50K,
    "r50k_base": _R50K,
}

_load_lock = threading.Lock()
# Held while TIKTOKEN_CACHE_DIR is in flux: loading an encoding, importing litellm.
loading_lock = _load_lock
_loaded: dict[str, tiktoken.Encoding] = {}


def bundled_tokenizer_dir() -> Path | None:
    """litellm's bundled tiktoken cache directory, found without importing litellm."""
    found = litellm_file("litellm_core_utils", "tokenizers")
    return found if found is not None and found.is_dir() else None


def _search_dirs() -> list[Path]:
    dirs: list[Path] = []
    bundled = bundled_tokenizer_dir()
    if bundled is not None:
        dirs.append(bundled)
    user_dir = tiktoken_cache_dir()
    if user_dir is not None and user_dir not in dirs:
        dirs.append(user_dir)
    return dirs


def _file_is_valid(path: Path, bpe: _BpeFile) -> bool:
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return hashlib.sha256(data).hexdigest() == bpe.sha256


def _locate(name: str, bpe: _BpeFile) -> Path:
    dirs = _search_dirs()
    for directory in dirs:
        if _file_is_valid(directory / bpe.cache_key, bpe):
            return directory
    searched = ", ".join(str(d) for d in dirs) or "no litellm install, TIKTOKEN_CACHE_DIR unset"
    filename = bpe.url.rsplit("/", 1)[-1]
    raise TokenizerError(
        f"tokenizer encoding {name!r}: {filename} (as {bpe.cache_key}) "
        f"not found offline in {searched}"
    )


def _offline(name: str) -> _BpeFile:
    bpe = OFFLINE_ENCODINGS.get(name)
    if bpe is None:
        offered = ", ".join(sorted(OFFLINE_ENCODINGS))
        raise TokenizerError(
            f"tokenizer encoding {name!r} is unknown or not available offline "
            f"(use one of: {offered})"
        )
    return bpe


_located: dict[str, Path] = {}


def locate_encoding(name: str) -> Path:
    """The folder holding encoding ``name``'s BPE file (its digest checked), without
    loading it; :class:`TokenizerError` when it is unknown or not found offline."""
    directory = _located.get(name)
    if directory is None:
        directory = _located[name] = _locate(name, _offline(name))
    return directory


def load_encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken encoding ``name``, loaded from local files only (cached)."""
    cached = _loaded.get(name)
    if cached is not None:
        return cached
    bpe = _offline(name)
    with _load_lock:
        cached = _loaded.get(name)
        if cached is not None:
            return cached
        directory = locate_encoding(name)
        import tiktoken

        encoding = _load_parsed(name, bpe)
        if encoding is not None:
            _loaded[name] = encoding
            return encoding

        try:
            with tiktoken_cache_dir_kept(directory):
                encoding = tiktoken.get_encoding(name)
        except Exception as exc:  # tiktoken raises ValueError, OSError, requests errors...
            raise TokenizerError(f"tokenizer encoding {name!r} failed to load: {exc}") from exc
        _save_parsed(name, bpe, encoding)
        _loaded[name] = encoding
        return encoding


# Parsing a BPE file (100k+ base64 lines) takes ~0.2 s, most of a short CLI
# run such as `memd status`. The parsed table is cached as plain data (a JSON
# header, then token lengths, ranks and the concatenated token bytes; no
# pickle or marshal, so reading it can never run code) and rebuilt in ~0.03 s.
_PARSED_FORMAT: Final = 2


def _parsed_path(name: str, bpe: _BpeFile) -> Path:
    import tiktoken

    version = getattr(tiktoken, "__version__", "0")
    return resolve_cache_dir() / f"tiktoken-{name}-{bpe.sha256[:16]}-{version}.ranks"


def _load_parsed(name: str, bpe: _BpeFile) -> tiktoken.Encoding | None:
    import tiktoken

    try:
        data = _parsed_path(name, bpe).read_bytes()
        header_end = data.index(b"\n")
        header = json.loads(data[:header_end])
        if (
            header.get("format") != _PARSED_FORMAT
            or header.get("source_sha256") != bpe.sha256
            or header.get("name") != name
        ):
            return None
        count = int(header["count"])
        body = memoryview(data)[header_end + 1 :]
        lengths = array.array("I")
        lengths.frombytes(body[: 4 * count])
        ranks = array.array("I")
        ranks.frombytes(body[4 * count : 8 * count])
        blob = bytes(body[8 * count :])
        ends = list(itertools.accumulate(lengths))
        if len(lengths) != count or len(ranks) != count or (ends and ends[-1] != len(blob)):
            return None
        starts = [0, *ends[:-1]]
        mergeable = dict(zip(map(blob.__getitem__, map(slice, starts, ends)), ranks, strict=True))
        return tiktoken.Encoding(
            name=name,
            pat_str=header["pat_str"],
            mergeable_ranks=mergeable,
            special_tokens=header["special_tokens"],
        )
    except Exception:  # any damage means: parse the BPE file again
        return None


def _save_parsed(name: str, bpe: _BpeFile, encoding: tiktoken.Encoding) -> None:
    items = sorted(encoding._mergeable_ranks.items(), key=lambda item: item[1])
    header = {
        "format": _PARSED_FORMAT,
        "name": name,
        "source_sha256": bpe.sha256,
        "pat_str": encoding._pat_str,
        "special_tokens": encoding._special_tokens,
        "count": len(items),
    }
    lengths = array.array("I", [len(token) for token, _ in items])
    ranks = array.array("I", [rank for _, rank in items])
    try:
        path = _parsed_path(name, bpe)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with temp.open("wb") as handle:
            handle.write(json.dumps(header).encode() + b"\n")
            handle.write(lengths.tobytes())
            handle.write(ranks.tobytes())
            handle.write(b"".join(token for token, _ in items))
        temp.replace(path)
    except (OSError, ValueError, OverflowError):
        pass  # a read-only home (systemd ProtectHome=) only costs speed


_CHUNK_BYTES: Final = 1 << 20
# A run longer than this (no safe cut inside) is estimated, not merged by BPE.
MAX_PIECE_BYTES: Final = DEFAULT_MAX_PIECE_BYTES


class TokenCounter:
    """Exact token counts: ``len(encode_ordinary(data.decode("utf-8", "replace")))``.

    Inputs larger than ``chunk_bytes`` are counted piece by piece, cut at
    token-safe boundaries (:class:`memd.core.tokens.PieceCounter`, the same
    pieces a file is counted in): the sum is the same, and memory stays bounded
    by a piece's token list instead of one Python int per token of the whole
    input (hundreds of MB for a 20 MB file). A stretch of ``max_piece_bytes``
    with no safe boundary (a 200 MB line of letters is one pre-token, which BPE
    would merge whole: 10 GB and minutes) is estimated from above instead.

    tiktoken releases the GIL for only part of its work (two threads gave
    1.3-1.4x one thread here, ``bench/bench_tokenizer_backends.py``); to use
    several cores fully, count different files in forked workers
    (:func:`memd.counting.count_many`).
    """

    def __init__(
        self,
        encoding_name: str = DEFAULT_ENCODING,
        *,
        chunk_bytes: int = _CHUNK_BYTES,
        max_piece_bytes: int = MAX_PIECE_BYTES,
    ):
        self.encoding_name = encoding_name
        # Checked now (an unknown encoding, or one not found offline, fails here);
        # its table is loaded at the first count, or by warm() (~0.15 s a daemon
        # restarting with every file unchanged need not spend before READY).
        locate_encoding(encoding_name)
        self._encoding: tiktoken.Encoding | None = None
        self._chunk_bytes = max(1, min(chunk_bytes, max_piece_bytes))
        self.max_piece_bytes = max(self._chunk_bytes, max_piece_bytes)

    @property
    def encoding(self) -> tiktoken.Encoding:
        encoding = self._encoding
        if encoding is None:
            encoding = self._encoding = load_encoding(self.encoding_name)
        return encoding

    def warm(self) -> None:
        """Load the encoding now (the daemon's background thread, after READY)."""
        _ = self.encoding

    def count_text(self, text: str) -> int:
        return len(self.encoding.encode_ordinary(text))

    def _count_piece(self, data: bytes) -> int:
        return len(self.encoding.encode_ordinary(str(data, "utf-8", "replace")))

    def count_bytes(self, data: bytes) -> int:
        if len(data) <= self._chunk_bytes:
            return self._count_piece(data)
        pieces = PieceCounter(
            self._count_piece, max_piece_bytes=self.max_piece_bytes, window_bytes=0
        )
        pieces.feed(data)
        return pieces.finish(0, 0).tokens


_counters: dict[tuple[str, int], TokenCounter] = {}


def shared_counter(encoding_name: str, max_piece_bytes: int = MAX_PIECE_BYTES) -> TokenCounter:
    """One :class:`TokenCounter` per (encoding, piece bound) in this process."""
    key = (encoding_name, max_piece_bytes)
    counter = _counters.get(key)
    if counter is None:
        made = TokenCounter(encoding_name, max_piece_bytes=max_piece_bytes)
        counter = _counters.setdefault(key, made)
    return counter
