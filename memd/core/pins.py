"""Pinned facts (pure): durable facts found by a deterministic extractor, kept verbatim.

An agent forgets what its summary drops, and models drop exactly the facts that
matter later: paths, URLs, dates, versions, commands, identifiers and the lines a
user marks ("Remember: …").  So memd extracts them from every entry it
summarizes, carries them from summary to summary, and keeps verbatim every one
that the *same extractor* does not find again in the summarizer's reply (a
substring test is not enough: a model that drops the backticks around a command
has not kept the command).

Tool output is mostly machine noise: from a tool entry only the lines whose
shape does not repeat within it are read.  Credentials are never pinned.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final

from memd.core.secrets import URL_USERINFO, find_secrets, find_secrets_by_context, replace_spans
from memd.core.secrets import contains_secret as looks_like_credential

CountText = Callable[[str], int]

# Kinds, most valuable first: under the pinned budget, each kind keeps pins in
# proportion to its value (see :func:`fit_pins`).
KIND_VALUE: Final = {
    "marked": 9,
    "command": 8,
    "path": 7,
    "url": 7,
    "identifier": 6,
    "version": 5,
    "date": 4,
    "quantity": 3,
}

PINNED_HEADING: Final = (
    "Pinned facts (verbatim, newest mention last; older ones are in the archives):"
)
UNDATED: Final = "undated"
_MAX_FACT_CHARS: Final = 300

_MARKER: Final = r"(?:\*\*)?(?:Remember|Note|Important|Preference|NB)(?:\*\*)?[ \t]*:[ \t]*\S"
# A line's list markup and quoting ("- ", "> > ", "* "), taken whole (possessive):
# what follows may start with the same characters, and a long line of dashes was
# else split between the two at every place (quadratic, review r7pins F1).
_MARKUP: Final = r"[ \t]*+(?:[-*>+][ \t]*+)*+"
# A marked line: the marker opens the line (after list markup); the whole line is kept.
_MARKED_LINE_RE: Final = re.compile(
    rf"^{_MARKUP}(?P<marked>{_MARKER}[^\n]*)$",
    re.IGNORECASE | re.MULTILINE,
)
# Where a sentence ends: at "!" or "?", or at a "." before the line's end or
# before what opens a sentence (not a lower-case word or a number: "e.g. rg",
# "Jan. 5"), unless the "." ends a title, a month or an initial ("Dr. Smith",
# "Sept. Then", "J. Smith"); or at the line's end.
_ABBREVIATIONS: Final = (
    *("Mr", "Mrs", "Ms", "Dr", "Prof", "Sr", "Jr", "St", "vs", "cf", "approx", "e.g", "i.e"),
    *("Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec"),
)
_SENTENCE_END: Final = (
    r"(?:[!?](?=[ \t]|$)|\.(?=[ \t]*$|[ \t]+(?-i:[^\sa-z0-9]))"
    + "".join(rf"(?<!\b{re.escape(word)}\.)" for word in _ABBREVIATIONS)
    + r"(?-i:(?<!\b[A-Z]\.))|$)"
)
# A marked sentence: the marker opens a sentence inside a line ("Got it. Remember: …",
# a speaker's "Human: Remember: …"); kept from the marker to the end of its sentence.
_MARKED_SENTENCE_RE: Final = re.compile(
    rf"(?<=[.!?;:)\]\u2014\u2013])[ \t]+(?P<marked>{_MARKER}[^\n]*?{_SENTENCE_END})",
    re.IGNORECASE | re.MULTILINE,
)
# A preference sentence starts a line (after list markup) or follows a sentence or a
# speaker's colon: "- (2026-03-02T10:00:00) Human: I prefer …" is "I prefer …".
_PREFERENCE_RE: Final = re.compile(
    rf"(?:^{_MARKUP}|(?<=[.!?:]\s))"
    r"(?P<marked>[^.!?:\n]*?\bI (?:really )?(?:prefer|always want|never want|would rather)"
    rf"\b[^\n]*?{_SENTENCE_END})",
    re.IGNORECASE | re.MULTILINE,
)
# Any scheme (DSNs, s3://, ssh://, file:///…), a bracketed IPv6 host whole, a
# user:password@ to the authority's last "@" (a password may hold "/", "#", "]").
# A scheme is at most 32 characters: one that may be any length was looked for
# from every word of a long "a-a-a-…" run, each time to the run's end (review
# r7pins F2).
_URL_SCHEME: Final = r"[A-Za-z][A-Za-z0-9+.-]{0,31}://"
_URL_RE: Final = re.compile(
    rf"\b{_URL_SCHEME}(?:{URL_USERINFO})?(?:\[[0-9A-Fa-f:.]+\]|[^\s<>\"'`)\]}}])+"
)
# git's scp-like remotes: git@github.com:org/repo.git (not after "user:").
_SCP_RE: Final = re.compile(
    r"(?<![\w.+:-])[\w.-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,24}:[\w.~-]+/[\w./~-]*\w"
)
# A URL's password is not pinned: ``scheme://user:password@host`` pins as
# ``scheme://user@host`` (what is left is still screened for credentials).
_URL_PASSWORD_RE: Final = re.compile(rf"^({_URL_SCHEME}){URL_USERINFO}")
_CODE_SPAN_RE: Final = re.compile(r"`([^`\n]{2,200})`")
_SHELL_LINE_RE: Final = re.compile(r"^[ \t]*\$ ([^\n]{2,200})$", re.MULTILINE)
# Windows: a directory's name may hold single spaces and a "(x86)".  Where an
# unquoted path's last name ends in prose is a guess: it holds spaces only when
# it ends in an extension after words without one, at most four, none a word
# of prose that would go on after a path ("and", "then", "to", …):
# ``C:\Users\me\My Documents\report final.docx`` is the whole file (it was cut
# at "report"), ``saved to C:\tmp\a.txt and then`` is ``C:\tmp\a.txt`` (its first
# word has an extension), ``C:\src and edit main.py`` is ``C:\src``.  Else the
# last name holds no space.  Quoted, a path runs to its quote (_WIN_QUOTED).
_WIN_DIR: Final = r"[\w.$~@+-]+(?: [\w.$~@+-]+| ?\([\w.$~@+-]+\))*"
_WIN_PROSE: Final = (
    r"(?i:and|or|but|then|so|if|to|in|into|on|at|by|for|from|with|via|as|is|are|was|"
    r"edit|open|run|see|save|saved|copy|move|read|write|has|had|holds|exists)"
)
_WIN_SPACED_NAME: Final = (
    rf"(?:(?!{_WIN_PROSE} )[\w$~@+-]++ ){{1,4}}"
    r"[\w$~@+-]+(?:\.[\w$~@+-]+)*?\.(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{1,8}(?![\w$~@+-]|\.\w)"
)
_WIN_NAME: Final = rf"(?:{_WIN_SPACED_NAME}|[\w.$~@+-]*[\w$~@+-])"
# A relative ./deploy.sh or ~/notes.txt needs no directory; a path may end with
# a line (and column) reference: src/a.py:120:5.
_LINE_REF: Final = r"(?::\d{1,7}(?::\d{1,4})?(?!\d))?"
_PATH_RE: Final = re.compile(
    r"(?<![\w/.:-])(?:(?:~|\.{1,2})/(?:[\w.@+-]+/)*|/(?:[\w.@+-]+/)+)[\w.@+-]*[\w@+-]"
    + _LINE_REF
    + r"|(?<![\w/.:-])[\w-]+/(?:[\w.-]+/)*[\w-]+\.[A-Za-z][\w]{0,7}\b"
    + _LINE_REF
)
# Kubernetes resources (deploy/api, deployment.apps/api, pod/api-7d9f-x2k4p): a
# word of prose ("pod/container", "job/task") only with a "-" or digit in its name.
_K8S_KIND: Final = (
    r"(?:deploy(?:ments?)?|svc|sts|statefulsets?|ds|daemonsets?|cm|configmaps?|cronjobs?"
    r"|ing|ingress(?:es)?|pvc|hpa|rs|replicasets?|sa|serviceaccounts?|crd)"
)
_K8S_NAME: Final = r"[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?"
_K8S_RE: Final = re.compile(
    rf"(?<![\w/.-])(?:{_K8S_KIND}(?:\.[a-z0-9-]+)*/{_K8S_NAME}"
    r"|(?:pods?|services?|jobs?|secrets?|nodes?|namespaces?)(?:\.[a-z0-9-]+)*/"
    r"(?=[a-z0-9.]*[-\d])" + _K8S_NAME + r")(?![\w/-]|\.\w)"
)
# Container images: registry/repo[:tag][@sha256:…] (ghcr.io/org/img:1.2.3@sha256:…),
# a repo with a digest, or org/name:tag with a version or "latest" as its tag (a
# file's line, src/a.py:120, is none, nor prose's "yes/no:maybe").
_IMAGE_LABEL: Final = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_IMAGE_PART: Final = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_TAG: Final = r":\w[\w.-]{0,127}"
_IMAGE_DIGEST: Final = r"@sha256:[0-9a-f]{64}"
_IMAGE_RE: Final = re.compile(
    rf"(?<![\w./:@-])(?:(?:{_IMAGE_LABEL}(?:\.{_IMAGE_LABEL})+(?::\d{{1,5}})?|localhost:\d{{1,5}})"
    rf"/{_IMAGE_PART}(?:/{_IMAGE_PART})*(?:{_IMAGE_TAG}(?:{_IMAGE_DIGEST})?|{_IMAGE_DIGEST})"
    rf"|{_IMAGE_PART}(?:/{_IMAGE_PART})*(?:{_IMAGE_TAG})?{_IMAGE_DIGEST}"
    r"|[a-z0-9]+(?:[_-]+[a-z0-9]+)*/[a-z0-9]+(?:[_-]+[a-z0-9]+)*"
    r":(?:\d[\w.-]{0,127}|(?:latest|stable|edge|nightly)(?:-[\w.-]{1,64})?))"
    r"(?![\w/:@-]|\.\w)"
)
# Quoted, a path runs to its quote: its last name may hold spaces too
# ("C:\Program Files\My App\my app.exe"), a trailing separator left out.
_WIN_SEP: Final = r"(?:\\\\?|/)"
_WIN_REL_SEP: Final = r"(?:\\\\|\\(?!n))"
_WIN_QUOTED: Final = "|".join(
    rf"(?<={quote})[A-Za-z]:{_WIN_SEP}(?:{name}++{_WIN_SEP})*{name}++(?={_WIN_SEP}?{quote})"
    for quote, name in (('"', r"[^\n\r\t\"<>|?*:\\/]"), ("'", r"[^\n\r\t'\"<>|?*:\\/]"))
)
_WINDOWS_PATH_RE: Final = re.compile(
    # C:\Users\me\app.py, D:/data/x.csv (and JSON's C:\\Users\\me)
    rf"{_WIN_QUOTED}|(?<![\w/\\.:-])[A-Za-z]:(?:\\\\?|/)(?:{_WIN_DIR}(?:\\\\?|/))*{_WIN_NAME}"
    # \\server\share\dir\f.txt
    rf"|(?<![\w\\])\\\\[\w.-]+\\[\w.$-]+(?:\\(?:{_WIN_DIR}\\)*{_WIN_NAME})?"
    # .\scripts\run.ps1, ..\build\out.dll, ~\AppData\x.txt, %APPDATA%\Code\settings.json
    rf"|(?<![\w\\/.:~%$-])(?:\.{{1,2}}|~|%[A-Za-z_][\w()]*%)\\\\?(?:{_WIN_DIR}\\\\?)*{_WIN_NAME}"
    # src\app\main.py: as src/app/main.py, a file with an extension (so no "\d+\.\w",
    # "\frac\alpha", DOMAIN\user); it was not pinned at all.  Never across a
    # single "\n": a logged or JSON string's line break ("build\nmain.py" is two
    # lines), so src\net\x.py is not pinned either (src\\net\\x.py is).
    rf"|(?<![\w\\/.:~%$-])[\w-]+{_WIN_REL_SEP}(?:[\w.-]+{_WIN_REL_SEP})*[\w-]+\.[A-Za-z]\w{{0,7}}\b"
    + _LINE_REF
)
# What a relative backslash path always holds: its last separator and name.
_WIN_RELATIVE_HINT: Final = re.compile(r"\\[\w-]+\.[A-Za-z]")
_MONTH: Final = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*"
_DATE_RE: Final = re.compile(
    # Machine timestamps (with seconds: entry headers, log rows) are not facts.
    r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2})?\b(?![:.]\d)(?![T ]\d{2}:\d{2}:\d{2})"
    rf"|\b{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}\b"
    rf"|\b\d{{1,2}} {_MONTH} \d{{4}}\b"
)
# A version may end a sentence ("upgraded to 3.29.1."): a dot after it counts only
# when another character follows it (1.2.3.4 is no version).
# With a range's operator: ^1.2.0, ~4.17.21, >=1.2.0 (the bare version is another fact).
_VERSION_OPERATOR: Final = r"(?:(?<![\w.<>=!~^-])(?:\^|~>?|[<>]=?|[=!~]=)(?=v?\d)|(?<![\w.-]))"
_VERSION_RE: Final = re.compile(
    rf"{_VERSION_OPERATOR}v?\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.]*[0-9A-Za-z])?(?!\w|\.\w)"
    rf"|{_VERSION_OPERATOR}v\d+\.\d+(?!\w|\.\w)"
)
# Not inside a number ("1,2,3,…": each of its digits was a start, each scanned to
# the run's end, review r7pins F2).
_QUANTITY_RE: Final = re.compile(
    r"(?<![\w.])(?<!\d,)\d+(?:[.,]\d+)*\s?(?:ms|µs|us|ns|s|sec|seconds|min|minutes|h|hours|days|"
    r"weeks|KB|MB|GB|TB|KiB|MiB|GiB|TiB|%|USD|EUR|GBP|req/s|rps|qps|tokens|cores|GHz|MHz|"
    r"rows|records|users)(?![\w/])"
    r"|[$€£]\d+(?:[.,]\d+)*(?:[kKmM])?\b"
)
# Whole before the identifiers' pieces (a hostname, a hex run) are looked for.
_EMAIL_RE: Final = re.compile(
    # Not after "user:" (app:hunter2@db.example.com holds a password), but mailto:;
    # nor inside a local part (after a "%": a long %-encoded run was read from each).
    r"(?:(?<=mailto:)|(?<![\w.%+:-]))[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,24}\b"
)
# What every match of a pattern holds, led by a character (a fast search): a
# turn without it is not scanned by the pattern itself, which starts anywhere.
_SCP_HINT: Final = re.compile(r"@[A-Za-z0-9.-]+\.[A-Za-z]{2,24}:[\w.~-]+/")
_EMAIL_HINT: Final = re.compile(r"@[A-Za-z0-9-]+\.[A-Za-z0-9.-]*[A-Za-z]")
_UUID_HINT: Final = re.compile(r"-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-")
_UUID_RE: Final = re.compile(
    r"(?<![\w-])[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}(?![\w-])"
)
_HEX4: Final = r"[0-9A-Fa-f]{1,4}"
_IPV4_TAIL: Final = r"(?:\d{1,3}\.){3}\d{1,3}"
# An IPv6 address: eight groups, or fewer with one "::" (with a digit: Rust's
# Add::add is no address), optionally /prefix; ending where no group goes on.
# The last two groups may be written as an IPv4 address: ::ffff:10.0.0.1,
# 64:ff9b::192.0.2.1 (they were pinned as their IPv4 part alone).
_IPV6: Final = (
    r"(?=[0-9A-Fa-f:]*\d)(?:"
    rf"(?:{_HEX4}:){{6}}{_IPV4_TAIL}"
    rf"|::(?:{_HEX4}:){{0,5}}{_IPV4_TAIL}"
    + "".join(
        rf"|(?:{_HEX4}:){{{left}}}:(?:{_HEX4}:){{0,{5 - left}}}{_IPV4_TAIL}" for left in range(1, 6)
    )
    + rf"|(?:{_HEX4}:){{7}}{_HEX4}"
    + "".join(rf"|(?:{_HEX4}:){{1,{left}}}(?::{_HEX4}){{1,{7 - left}}}" for left in range(1, 7))
    + rf"|::(?:{_HEX4}:){{0,6}}{_HEX4}"
    rf"|(?:{_HEX4}:){{1,7}}:(?=/\d)"
    r")(?:/\d{1,3})?(?![\w:]|\.\w)"
)
_IPV6_RE: Final = re.compile(
    # Two colons near the start, or no address begins here (most places).
    rf"(?=\[?[0-9A-Fa-f]{{0,4}}:[0-9A-Fa-f]{{0,4}}:)"
    rf"(?:\[{_IPV6}\]:\d{{1,5}}(?!\d)"  # [2001:db8::1]:8080
    rf"|(?<![\w:.]){_IPV6})"  # fe80::1, 2001:db8::/32
)
_PORT: Final = r"(?::\d{1,5}(?!\d))?"
# A hostname starts at its first label, not after a label's "." or "-": from each
# label of a long "a.a.a.…" or "1.1.1.…" run the rest was scanned (40 KB: > 20 s);
# a later label matches only where the first one does.
_IDENTIFIER_RE: Final = re.compile(
    r"\b[A-Z][A-Z0-9]{1,9}-\d{1,6}\b"  # ticket ids
    # commit hashes, not a piece of a name (pod api-7d9f8c6b5-x2k4p)
    r"|(?<![\w-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])"
    r"|\b(?<![a-z0-9-][.-])(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+"
    rf"(?:internal|local|lan|corp|com|net|org|io|dev|cloud|ai|app)\b{_PORT}"  # hostnames
    rf"|\b(?:\d{{1,3}}\.){{3}}\d{{1,3}}\b{_PORT}"  # IPv4
    r"|\blocalhost:\d{1,5}(?!\d)"
)
_TRAILING_PUNCT: Final = ".,;:!?)]}'\""
_TOOL_ROLE_RE: Final = re.compile(r"tool|function|observation", re.IGNORECASE)
_SHAPE_RE: Final = re.compile(r"[0-9a-f]{6,}|\d+|\"[^\"]*\"|'[^']*'|\s+")


@dataclass(frozen=True, slots=True)
class Fact:
    """One extracted fact: its kind and its exact text."""

    kind: str
    text: str

    @property
    def key(self) -> str:
        return fact_key(self.text)


@dataclass(frozen=True, slots=True)
class Pin:
    """A fact kept across summaries, with the date it was last mentioned."""

    kind: str
    text: str
    last_seen: str  # ISO timestamp (or a date) of the newest entry mentioning it; "" unknown

    @property
    def key(self) -> str:
        return fact_key(self.text)

    @property
    def day(self) -> str:
        return self.last_seen[:10] if len(self.last_seen) >= 10 else UNDATED


def fact_key(text: str) -> str:
    """What makes two mentions the same fact: the text, whitespace-collapsed."""
    return " ".join(text.split()).strip(_TRAILING_PUNCT + " ")


def _clean(text: str) -> str:
    cleaned = " ".join(text.split()).rstrip(_TRAILING_PUNCT)
    if len(cleaned) > _MAX_FACT_CHARS:
        cleaned = cleaned[: _MAX_FACT_CHARS - 1].rstrip() + "…"
    return cleaned


def is_tool_role(role: str) -> bool:
    return bool(_TOOL_ROLE_RE.search(role))


def _line_shape(line: str) -> str:
    return _SHAPE_RE.sub("#", line.strip())


def non_repeating_lines(text: str) -> list[str]:
    """Lines whose shape (digits, hex runs and quoted strings blanked) occurs once."""
    lines = [line for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    counts: dict[str, int] = {}
    shapes = [_line_shape(line) for line in lines]
    for shape in shapes:
        counts[shape] = counts.get(shape, 0) + 1
    return [line for line, shape in zip(lines, shapes, strict=True) if counts[shape] == 1]


def extract_facts(text: str) -> list[Fact]:
    """Every fact in ``text``, in order of kind then appearance, without duplicates.

    Facts inside a marked line are not pinned again on their own: the line
    already keeps them, as far as it is kept (a long one is cut short).
    """
    return _extract_facts(text, screen=True)


# What every match of a pattern holds: a pattern runs only over text that has it
# (a plain find, or one scan for a digit), which is most of the time saved on a
# turn with no path, URL or version in it. Screening never changes the facts.
_DIGIT_RE: Final = re.compile(r"\d")
_PREFERENCE_WORDS: Final = ("prefer", "always want", "never want", "would rather")


# Lower-cased a piece at a time: a 200 MB turn is not copied whole to be screened.
_SCREEN_PIECE = 1 << 20
_WORD_OVERLAP: Final = max(len(word) for word in _PREFERENCE_WORDS) - 1


def _preference_possible(text: str) -> bool:
    # IGNORECASE matches some non-ASCII letters to ASCII ones (the long s, the
    # Kelvin sign): only ASCII text is screened by its lower case.
    if not text.isascii():
        return True
    for start in range(0, len(text), _SCREEN_PIECE):
        piece = text[start : start + _SCREEN_PIECE + _WORD_OVERLAP].lower()
        if any(word in piece for word in _PREFERENCE_WORDS):
            return True
    return False


# The patterns run over what URLs and code spans leave, in order; each step's
# matches but the last two's are blanked before the next step runs. A step
# named for a detail pins its facts as the kind _FACT_KIND names.
_STEPS: Final = (
    ("windows_path", _WINDOWS_PATH_RE),
    ("image", _IMAGE_RE),
    ("k8s", _K8S_RE),
    ("path", _PATH_RE),
    ("date", _DATE_RE),
    ("version", _VERSION_RE),
    ("email", _EMAIL_RE),
    ("uuid", _UUID_RE),
    ("ipv6", _IPV6_RE),
    ("identifier", _IDENTIFIER_RE),
    ("quantity", _QUANTITY_RE),
)
_BLANKED: Final = frozenset(kind for kind, _pattern in _STEPS[:-2])
_FACT_KIND: Final = {
    "windows_path": "path",
    "image": "identifier",
    "k8s": "identifier",
    "email": "identifier",
    "uuid": "identifier",
    "ipv6": "identifier",
}


def _blank(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """``text`` with each of ``spans`` (in order, disjoint) replaced by one space."""
    pieces: list[str] = []
    position = 0
    for start, end in spans:
        pieces.append(text[position:start])
        pieces.append(" ")
        position = end
    pieces.append(text[position:])
    return "".join(pieces)


def _without_password(url: str) -> str:
    """``url`` with the password of its ``user:password@`` taken out."""

    def drop(match: re.Match[str]) -> str:
        user = match.group(2)
        return f"{match.group(1)}{user}@" if user else match.group(1)

    return _URL_PASSWORD_RE.sub(drop, url, count=1)


def _extract_facts(text: str, *, screen: bool, marked_limit: int | None = None) -> list[Fact]:
    """:func:`extract_facts`; ``screen=False`` runs every pattern over everything
    (the reference the screened run is tested against). Past ``marked_limit``
    marked texts, a marked text is not pinned but read as any other text.

    No fact is a credential known by its context, nor a piece of one
    (:func:`_credentials_replaced`).  A short text is searched for them only
    when it has facts (most turns have none), and read again with each replaced
    when it holds one (seldom); a long one is searched first, not read twice.
    """
    found: list[Fact] = []
    if len(text) < _READ_TWICE_UNDER:
        found = _facts_of(text, screen=screen, marked_limit=marked_limit)
        if not found:
            return found
    replaced, credentials = _credentials_replaced(text)
    if not credentials:
        return found or _facts_of(text, screen=screen, marked_limit=marked_limit)
    # Nor is a credential named again elsewhere ("commit 3fa9…" after
    # "token=3fa9…").
    found = _facts_of(replaced, screen=screen, marked_limit=marked_limit)
    return [f for f in found if f.key not in credentials]


_READ_TWICE_UNDER: Final = 8192


def _facts_of(text: str, *, screen: bool, marked_limit: int | None) -> list[Fact]:
    """:func:`_extract_facts` before credentials known by their context are left out."""
    found, spans, secrets = _marked_facts(text, screen=screen, limit=marked_limit)
    # The other patterns read the text with the marked ones blanked, cut out by
    # their places in one pass (a text with a marked line on every line is not
    # searched once per line).
    pieces: list[str] = []
    at = 0
    for start, end in spans:
        pieces += [text[at:start], " "] if start >= at else []
        at = max(at, end)
    pieces.append(text[at:])
    found += _plain_facts("".join(pieces), screen=screen)
    for start, end in spans:
        # A marked text longer than a fact may be is cut: what is past the cut
        # is read on its own (a fact the cut splits too), else it would be lost.
        line = text[start:end]
        kept = _kept_part(line)
        if kept is not None:
            found += [f for f in _plain_facts(line, screen=screen) if f.text not in kept]
    if secrets:
        # A marked line left in the text for holding a credential: none of its
        # facts is the credential ("Remember: api_key = 3fa9…" is no commit hash).
        found = [f for f in found if not any(s in f.text or f.text in s for s in secrets)]
    return _unique(found)


def _credentials_replaced(text: str) -> tuple[str, set[str]]:
    """``text`` with each credential known by its context replaced by a placeholder,
    and the keys of those credentials and of the facts inside them.

    Unmarked ``api_key = 3fa9…`` (40 hex digits), ``password: <a UUID>`` or
    ``Authorization: Bearer <hex>`` pinned the bare value as a commit hash, a
    UUID: alone, it no longer reads as a credential, so it was carried in
    MEMORY.md and sent to a remote summarizer at every later compaction.  A
    placeholder names nothing: what holds one is not pinned (a marked line with
    a credential is read for its other facts, as before).  Only the text around
    the words a credential's context opens with is scanned (on transcripts, a
    few per cent of the extraction's time; the whole detector was ~75 %).
    No credential: the text as given and an empty set.
    """
    spans = find_secrets_by_context(text)
    if not spans:
        return text, set()
    credentials: set[str] = set()
    for span in spans:
        value = span.value(text)
        credentials.add(fact_key(value))
        credentials.update(fact.key for fact in _plain_facts(value, screen=True))
    replaced = replace_spans(text, spans, lambda span, _value: f"[REDACTED:{span.kind}]")
    return replaced, credentials


def _kept_part(line: str) -> str | None:
    """The part of a marked text its pin keeps, when the pin is cut short; else None."""
    if len(" ".join(line.split()).rstrip(_TRAILING_PUNCT)) <= _MAX_FACT_CHARS:
        return None
    return _clean(line).removesuffix("…")


def _within(spans: list[tuple[int, int]], at: int) -> bool:
    """Whether ``at`` falls inside one of ``spans`` (sorted, not overlapping)."""
    index = bisect.bisect_right(spans, at, key=lambda span: span[0]) - 1
    return index >= 0 and at < spans[index][1]


def _marked_facts(
    text: str, *, screen: bool, limit: int | None
) -> tuple[list[Fact], list[tuple[int, int]], set[str]]:
    """Marked lines, marked sentences and preferences: their facts, where they
    are in ``text`` (in order), and the credentials the ones not pinned for
    holding one hold.

    Only the first ``limit`` marked texts (None: all) are pinned and blanked; the
    others, one holding a redaction placeholder (which names nothing) and one
    holding a credential (never pinned), are left in the text, whose facts are
    then read as any other text's: a turn's 17th ``Remember:`` line lost its path
    with the line (review r7pins F7).
    """
    marked: list[tuple[int, int]] = []
    if not screen or ":" in text:
        lines = [
            _stripped(text, m.start("marked"), m.end()) for m in _MARKED_LINE_RE.finditer(text)
        ]
        sentences = [
            _stripped(text, m.start("marked"), m.end())
            for m in _MARKED_SENTENCE_RE.finditer(text)
            if not _within(lines, m.start("marked"))
        ]
        marked = sorted(lines + sentences)
    if not screen or _preference_possible(text):
        preferences: list[tuple[int, int]] = []
        for match in _PREFERENCE_RE.finditer(text):
            start, end = _stripped(text, *match.span("marked"))
            if start < end and not _within(marked, start):
                preferences.append((start, end))
        marked += preferences
    found: list[Fact] = []
    spans: list[tuple[int, int]] = []
    pinned: set[str] = set()
    secrets: set[str] = set()
    for start, end in marked:
        fact = Fact("marked", _clean(text[start:end]))
        if _has_placeholder(fact.text):
            continue
        credentials = {span.value(fact.text) for span in find_secrets(fact.text)}
        if credentials:
            # Not pinned, and not blanked: its other facts are read as any
            # text's but the credential ("Remember: the DB is
            # postgres://app:pw@db/x" pins the URL without its password; the
            # line was dropped with the URL).
            secrets |= credentials
            continue
        if fact.key not in pinned:
            if limit is not None and len(pinned) >= limit:
                continue
            pinned.add(fact.key)
        found.append(fact)
        spans.append((start, end))
    return found, sorted(spans), secrets


def _has_placeholder(text: str) -> bool:
    """Whether ``text`` holds a redaction placeholder, or a piece of one."""
    return "[REDACTED:" in text


def _stripped(text: str, start: int, end: int) -> tuple[int, int]:
    """The span without the whitespace at its ends."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _plain_facts(rest: str, *, screen: bool) -> list[Fact]:
    """Commands, URLs, paths, dates, versions, identifiers and quantities, by kind."""
    found: list[Fact] = []
    code = not screen or "`" in rest
    if code:
        for match in _CODE_SPAN_RE.finditer(rest):
            found.append(Fact("command", f"`{_clean(match.group(1))}`"))
    if not screen or "$ " in rest:
        for match in _SHELL_LINE_RE.finditer(rest):
            found.append(Fact("command", f"`{_clean(match.group(1))}`"))
    # URLs first, then blank them out so their paths and hosts are not pinned twice
    # (a git remote is not looked for inside a URL either).
    plain = _CODE_SPAN_RE.sub(" ", rest) if code else rest
    for pattern, possible in (
        (_URL_RE, "://" in rest),
        (_SCP_RE, "@" in rest and _SCP_HINT.search(rest) is not None),
    ):
        if screen and not possible:
            continue
        for match in pattern.finditer(rest):
            found.append(Fact("url", _clean(_without_password(match.group(0)))))
        rest = pattern.sub(" ", rest)
        plain = pattern.sub(" ", plain)
    digits = not screen or _DIGIT_RE.search(plain) is not None
    for kind, pattern in _STEPS:
        if not screen:
            possible = True
        elif kind == "windows_path":
            possible = ":\\" in plain or ":/" in plain or "\\\\" in plain
            possible = possible or ".\\" in plain or "~\\" in plain or "%\\" in plain
            possible = possible or _WIN_RELATIVE_HINT.search(plain) is not None
        elif kind in ("path", "k8s"):
            possible = "/" in plain
        elif kind == "image":
            possible = "/" in plain or "@sha256:" in plain
        elif kind == "version":
            possible = digits and "." in plain
        elif kind == "email":
            possible = "@" in plain and _EMAIL_HINT.search(plain) is not None
        elif kind == "uuid":
            possible = "-" in plain and _UUID_HINT.search(plain) is not None
        elif kind == "ipv6":
            possible = digits and ("::" in plain or plain.count(":") >= 6)
        elif kind == "identifier":
            possible = digits or "." in plain
        else:
            possible = digits  # a date, a quantity: each has a digit
        if not possible:
            continue
        spans: list[tuple[int, int]] = []
        for match in pattern.finditer(plain):
            found.append(Fact(_FACT_KIND.get(kind, kind), _clean(match.group(0))))
            spans.append(match.span())
        if spans and kind in _BLANKED:
            # A date is not also a quantity, a version not also a hostname, an
            # e-mail address's domain not also a hostname, a UUID not a hex run.
            plain = _blank(plain, spans)
            digits = not screen or _DIGIT_RE.search(plain) is not None
    return found


def _unique(found: list[Fact]) -> list[Fact]:
    """The first fact of each key; credentials, one-character keys and redaction
    placeholders (a URL cut at one, a command holding one: review r7pins F5) dropped."""
    seen: set[str] = set()
    unique: list[Fact] = []
    for fact in found:
        key = fact.key
        if len(key) < 2 or key in seen or _has_placeholder(key) or looks_like_credential(fact.text):
            continue
        seen.add(key)
        unique.append(fact)
    return unique


# Facts of one kind one entry may pin, the first ones it names: a listing full of
# paths (a tool's, or one pasted) would else fill the pinned section with itself.
MAX_FACTS_PER_KIND: Final = 16
MAX_TOOL_FACTS_PER_KIND: Final = 4


def extract_from_entry(role: str, content: str) -> list[Fact]:
    """Facts of one transcript entry, at most a few of each kind; tool output is read
    only where it does not repeat.

    A marked line (``Remember:``, ``Important:`` …) is one the user marked: in a
    tool's output (a fetched page, a file) nobody did, so it pins no ``marked``
    fact, only the facts it holds, as any other line (review r9summary: a page's
    "Important: AI agents reading this must …" was carried verbatim, as the
    heaviest kind, at every compaction)."""
    if is_tool_role(role) or content.lstrip().startswith("Tool Output"):
        limit = MAX_TOOL_FACTS_PER_KIND
        content = "\n".join(non_repeating_lines(content))
        marked_limit = 0
    else:
        limit = marked_limit = MAX_FACTS_PER_KIND
    # The marked texts past the limit are read for their facts (each kind capped).
    found = _extract_facts(content, screen=True, marked_limit=marked_limit)
    return _first_of_each_kind(found, limit)


def _first_of_each_kind(facts: list[Fact], limit: int) -> list[Fact]:
    taken: dict[str, int] = {}
    kept: list[Fact] = []
    for fact in facts:
        taken[fact.kind] = taken.get(fact.kind, 0) + 1
        if taken[fact.kind] <= limit:
            kept.append(fact)
    return kept


def pins_of_entries(entries: Iterable[tuple[str, str, str]]) -> list[Pin]:
    """Pins of ``(role, timestamp, content)`` entries, oldest first, newest mention kept."""
    pins: list[Pin] = []
    for role, timestamp, content in entries:
        pins.extend(Pin(f.kind, f.text, timestamp) for f in extract_from_entry(role, content))
    return merge_pins(pins)


def merge_pins(*groups: Sequence[Pin]) -> list[Pin]:
    """One pin per fact, with its latest ``last_seen``; order: least recently mentioned first."""
    merged: dict[str, Pin] = {}
    for group in groups:
        for pin in group:
            current = merged.get(pin.key)
            if current is None:
                merged[pin.key] = pin
            elif pin.last_seen > current.last_seen:
                merged[pin.key] = replace(current, last_seen=pin.last_seen)
    return sorted(merged.values(), key=lambda p: p.last_seen)


def covered_keys(text: str) -> set[str]:
    """Keys of the facts the extractor finds in ``text`` (e.g. a summarizer's reply)."""
    return {fact.key for fact in extract_facts(text)}


def render_pinned(pins: Sequence[Pin]) -> str:
    """The ``Pinned facts`` section: pins grouped under the date last mentioned."""
    if not pins:
        return ""
    lines = [PINNED_HEADING]
    day = None
    for pin in sorted(pins, key=lambda p: ((p.day == UNDATED and "0") or p.day, p.last_seen)):
        if pin.day != day:
            day = pin.day
            lines.append(f"{day}:")
        lines.append(f"- {pin.text}")
    return "\n".join(lines)


_DAY_LINE_RE: Final = re.compile(rf"^(\d{{4}}-\d{{2}}-\d{{2}}|{UNDATED}):$")


def parse_pinned(section: str) -> list[Pin]:
    """Pins from a rendered section (the heading line may or may not be included)."""
    pins: list[Pin] = []
    day = ""
    for raw in section.replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        if not line or line == PINNED_HEADING:
            continue
        day_match = _DAY_LINE_RE.match(line)
        if day_match:
            day = "" if day_match.group(1) == UNDATED else day_match.group(1)
            continue
        if not line.startswith("- "):
            continue
        text = line[2:].strip()
        if _has_placeholder(text):
            # Written by a version that pinned a URL cut at a placeholder's "]"
            # (review r7pins F5): a placeholder names nothing, it is not carried.
            continue
        facts = extract_facts(text)
        whole = next((f for f in facts if f.key == fact_key(text)), None)
        kind = whole.kind if whole is not None else "marked"
        if text and not looks_like_credential(text):
            pins.append(Pin(kind, text, day))
    return pins


@dataclass(frozen=True, slots=True)
class PinnedSection:
    pins: tuple[Pin, ...]
    text: str
    evicted: int


def fit_pins(pins: Sequence[Pin], max_tokens: int, count_text: CountText) -> PinnedSection:
    """The pins that fit ``max_tokens``, evicted fairly across kinds.

    Each kind keeps a share of the pins by its value (:data:`KIND_VALUE`: a
    marked line weighs most): over budget, a pin goes from the kind with the
    most pins for its value, its oldest mention first.  So a flood of one kind
    (a tool listing full of paths) evicts its own kind's oldest pins, not every
    date and version.  Deterministic: ties go to the less valuable kind, then
    to the kind's name, then to the order given.

    Evicted facts stay in the archives (``memd recall`` finds them).
    """
    kept = list(pins)
    text = render_pinned(kept)
    if max_tokens <= 0:
        return PinnedSection((), "", len(kept))
    total = count_text(text) if text else 0
    if total <= max_tokens:
        return PinnedSection(tuple(kept), text, 0)
    # Each kind's pins, oldest mention first (the order given breaks ties).
    queues: dict[str, list[int]] = {}
    for index in sorted(range(len(kept)), key=lambda i: kept[i].last_seen):
        queues.setdefault(kept[index].kind, []).append(index)
    heads = dict.fromkeys(queues, 0)

    def next_victim() -> int:
        kind = max(
            (kind for kind in queues if heads[kind] < len(queues[kind])),
            key=lambda kind: (
                (len(queues[kind]) - heads[kind]) / _kind_weight(kind),
                -_kind_weight(kind),
                kind,
            ),
        )
        heads[kind] += 1
        return queues[kind][heads[kind] - 1]

    # Estimate per-pin costs once, drop until the estimate fits, then verify.
    costs = [count_text(f"- {p.text}") + 1 for p in kept]
    dropped: set[int] = set()
    excess = total - max_tokens
    while excess > 0 and len(dropped) < len(kept):
        victim = next_victim()
        dropped.add(victim)
        excess -= costs[victim]
    text = render_pinned([p for i, p in enumerate(kept) if i not in dropped])
    while len(dropped) < len(kept) and count_text(text) > max_tokens:
        dropped.add(next_victim())
        text = render_pinned([p for i, p in enumerate(kept) if i not in dropped])
    remaining = tuple(p for i, p in enumerate(kept) if i not in dropped)
    return PinnedSection(remaining, text if remaining else "", len(dropped))


def _kind_weight(kind: str) -> int:
    return max(1, KIND_VALUE.get(kind, 1))
