"""Hypothesis strategies for Swarms-format memory files (shared by several test modules).

Files are built as bytes directly (not through ``memd.core.memfile.render_*``) so
the parser's tests do not check the renderer against itself.  The fragments
are chosen to hit every ambiguity of the format: ``###`` and ``---`` lines,
terminators that are not followed by a header, header-looking lines inside
content, CRLF, non-ASCII, invalid UTF-8 and empty content.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import strategies as st

EM_DASH = "\u2014"

# Byte fragments that are hard on parsers and tokenizers alike.
TRICKY_FRAGMENTS: tuple[bytes, ...] = (
    b"###",
    b"### ",
    b"#",
    b"---",
    b"\n---\n",
    b"\n\n---\n\n",
    b"\r\n\r\n---\r\n\r\n",
    b"\n### not a header\n",
    b"\n### User \xe2\x80\x94 not-a-timestamp\n\n",
    b"\n### Bob \xe2\x80\x94 2024-05-01T10:00:00\n\n",  # header line inside content
    b"\n",
    b"\n\n",
    b"\r\n",
    b"\r",
    b" ",
    b"  ",
    b"\t",
    b"'s",
    b"/",
    b"a",
    b"Hello",
    b"world",
    b"two words",
    b"a b",
    b"x  y",
    b"123456",
    b"x\ny",
    b"end.\nNext",
    b".\n",
    b")\n",
    b"\n/",
    b"\nA",
    b"\n'",
    b"end.\r\nNext",
    "é".encode(),
    "日本語".encode(),
    EM_DASH.encode(),
    "\u00a0".encode(),  # no-break space: whitespace to the tokenizer regex
    "\U0001f600".encode(),
    b"\xe2\x80",  # truncated em dash
    b"\xff",
    b"\xc3",
    b"\x00",
    b"[Compressed Memory Summary]\n",
)

fragments = st.sampled_from(TRICKY_FRAGMENTS)
small_binary = st.binary(max_size=6)
small_text = st.text(max_size=12).map(lambda text: text.encode("utf-8"))

content_bytes = st.lists(
    st.one_of(fragments, fragments, small_text, small_binary), max_size=24
).map(b"".join)
"""Entry content: arbitrary bytes rich in format markers (may be empty)."""

roles = st.one_of(
    st.sampled_from(["User", "Assistant", "System", "Research-Agent", "agent \u2014 two", "Ünï"]),
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
        min_size=1,
        max_size=16,
    ).filter(lambda role: role.strip() != ""),
)

_BASE_TIME = datetime(2024, 1, 1, 12, 0, 0)

timestamps = st.one_of(
    st.integers(min_value=0, max_value=10**9).map(
        lambda us: (_BASE_TIME + timedelta(microseconds=us)).isoformat()
    ),
    st.integers(min_value=0, max_value=10**6).map(
        lambda s: (_BASE_TIME.replace(tzinfo=UTC) + timedelta(seconds=s)).isoformat()
    ),
    st.sampled_from(["2024-01-01", "2024-01-01T00:00", "2024-01-01T00:00:00Z"]),
)


@st.composite
def entry_blocks(draw: st.DrawFn, *, crlf: bool | None = None) -> bytes:
    """One complete entry block, LF (as Swarms writes) or CRLF."""
    role = draw(roles).encode()
    stamp = draw(timestamps).encode()
    content = draw(content_bytes)
    block = b"### " + role + b" " + EM_DASH.encode() + b" " + stamp + b"\n\n" + content
    use_crlf = draw(st.booleans()) if crlf is None else crlf
    if use_crlf:
        return block.replace(b"\n", b"\r\n").replace(b"\r\r\n", b"\r\n") + (b"\r\n\r\n---\r\n\r\n")
    return block + b"\n\n---\n\n"


@st.composite
def summary_blocks(draw: st.DrawFn) -> bytes:
    stamp = draw(timestamps).encode()
    body = draw(st.text(max_size=40)).encode()
    return (
        b"### System " + EM_DASH.encode() + b" " + stamp + b"\n\n[Compressed Memory Summary]\n"
        b"The following is a compressed summary of earlier conversation turns, replacing the "
        b"raw transcript to stay within the context window.\n\n" + body + b"\n\n---\n\n"
    )


@st.composite
def headers(draw: st.DrawFn) -> bytes:
    name = draw(
        st.text(
            alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
            max_size=12,
        )
    )
    created = draw(timestamps)
    return (
        f"# Agent Memory\n\n**Conversation:** {name}\n**Created:** {created}\n\n"
        "---\n\n## Interaction Log\n\n"
    ).encode()


@st.composite
def memory_files(draw: st.DrawFn, *, max_entries: int = 8) -> bytes:
    """A whole MEMORY.md: optional header, entries and summaries, optional junk/partial tail."""
    parts: list[bytes] = []
    if draw(st.booleans()):
        parts.append(draw(headers()))
    blocks = st.one_of(entry_blocks(), entry_blocks(), summary_blocks(), content_bytes)
    parts.extend(draw(st.lists(blocks, max_size=max_entries)))
    tail = draw(st.sampled_from(["none", "partial", "junk"]))
    if tail == "partial":
        whole = draw(entry_blocks())
        parts.append(whole[: draw(st.integers(min_value=1, max_value=len(whole) - 1))])
    elif tail == "junk":
        parts.append(draw(st.binary(max_size=32)))
    return b"".join(parts)


any_bytes = st.one_of(st.binary(max_size=300), content_bytes, memory_files())
"""Anything a file could hold, weighted towards near-valid memory files."""


@st.composite
def append_splits(draw: st.DrawFn, data: bytes, *, max_appends: int = 6) -> list[int]:
    """Sorted cut offsets splitting ``data`` into an initial file plus appends."""
    if not data:
        return []
    offsets = draw(
        st.lists(st.integers(min_value=0, max_value=len(data)), max_size=max_appends, unique=True)
    )
    return sorted(offsets)
