"""What leaves the machine (pure): which summarizers are local; keyed redaction placeholders.

Before text goes to a summarizer that is not local, every credential (and,
by default for remote models, personal data) found by :mod:`memd.core.secrets`
is replaced by a typed placeholder carrying a short keyed hash of the value::

    [REDACTED:aws_access_key#3f9a1c]

The hash is an HMAC under a per-workspace key (kept by :mod:`memd.redaction_key`
in memd's state dir), so the same secret gets the same placeholder in every
request, every compaction, from the daemon and the CLI alike: summaries stay
coherent ("rotate [REDACTED:github_token#0be2d4]") without the value, and
nobody without the key can test a guess against a placeholder.

Every summarizer's reply, local ones included, is scanned again before it is
written (:meth:`Privacy.for_reply`): credentials never land in MEMORY.md.
Nothing here reads files, the clock or the environment.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import unquote, urlsplit

from memd.core.config import MemdConfig, PrivacyConfig
from memd.core.memfile import MemoryDocument, parse
from memd.core.sanitize import strip_controls
from memd.core.secrets import Span, find_secrets, replace_spans

BUILTIN_MODEL: Final = "builtin"
# litellm providers that talk to a server on this machine when no api_base is
# given (Ollama's default is http://localhost:11434).
_LOCAL_BY_DEFAULT_PREFIXES: Final = ("ollama/", "ollama_chat/")
# litellm providers that send a summary request to the api_base they are given
# (each checked against litellm 1.110 with a recording transport).  Others may
# ignore it (replicate/ and sagemaker/ post to their cloud whatever it says), so a
# local api_base makes only these local: an unknown provider counts as remote.
_API_BASE_PROVIDERS: Final = frozenset(
    {
        "anthropic",
        "azure",
        "custom_openai",
        "hosted_vllm",
        "litellm_proxy",
        "llamafile",
        "lm_studio",
        "ollama",
        "ollama_chat",
        "openai",
        "text-completion-openai",
    }
)
_UNIX_SCHEMES: Final = frozenset({"unix", "http+unix", "https+unix"})
_LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
HASH_CHARS: Final = 6
# Kinds whose value is the same secret however it is spaced or punctuated.
_DIGITS_ONLY: Final = frozenset({"card_number", "phone_number", "us_ssn", "iban"})
_QUOTE_PREFIX_RE: Final = re.compile(r"(?m)^[ \t]*>[ \t]?")
_WHITESPACE_RE: Final = re.compile(r"\s+")
# The detector's own floor for an assigned value: shorter ones are not secrets.
_MIN_KNOWN_VALUE: Final = 4
# A value of letters only is searched for only from this long (a passphrase).
_PLAIN_WORD_MAX: Final = 16


# -- locality ------------------------------------------------------------------
def _host_matches(host: str, allowed: str) -> bool:
    if "/" in allowed:
        try:
            return ipaddress.ip_address(host) in ipaddress.ip_network(allowed, strict=False)
        except ValueError:
            return False
    return host == allowed


def endpoint_host(api_base: str) -> str | None:
    """The host ``api_base`` names, lower-cased; ``None`` for a unix socket."""
    base = api_base.strip()
    if "://" not in base:
        base = "http://" + base
    parts = urlsplit(base)
    if parts.scheme.lower() in _UNIX_SCHEMES:
        return None
    host = parts.hostname or ""
    # http+unix style sockets spelled as a percent-encoded path in the host.
    if unquote(host).startswith("/"):
        return None
    return host.lower()


def is_local_host(host: str, local_hosts: Sequence[str] = ()) -> bool:
    """Loopback (127.0.0.0/8, ::1, localhost, *.localhost) or one of ``local_hosts``."""
    host = host.strip("[]").lower()
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    return any(_host_matches(host, allowed) for allowed in local_hosts)


ProviderOf = Callable[[str], str | None]


def provider_unknown(model: str) -> str | None:
    """The resolver a caller without litellm at hand passes: no bare name is known."""
    return None


def is_local_summarizer(
    model: str,
    api_base: str,
    local_hosts: Sequence[str] = (),
    provider_of: ProviderOf = provider_unknown,
) -> bool:
    """``builtin``; an ``api_base`` on loopback, a unix socket or ``local_hosts``
    for a provider known to honour it; ``ollama/*`` with no ``api_base``.
    Everything else is remote.

    A bare model name (``gpt-4o``, no ``provider/``) goes to the provider litellm
    infers from it, which ``provider_of`` says (the shell asks litellm itself):
    one that ignores ``api_base`` posts to its cloud whatever it says, so when the
    provider is not known to honour it (or not known at all) the model is remote.
    ``provider_of`` is asked only when the ``api_base`` is local."""
    stripped = model.strip()
    name = stripped.lower()
    if name == BUILTIN_MODEL:
        return True
    if api_base.strip():
        prefix, slash, _rest = name.partition("/")
        if slash and prefix not in _API_BASE_PROVIDERS:
            return False
        host = endpoint_host(api_base)
        if not (host is None or (bool(host) and is_local_host(host, local_hosts))):
            return False
        return bool(slash) or provider_of(stripped) in _API_BASE_PROVIDERS
    return name.startswith(_LOCAL_BY_DEFAULT_PREFIXES)


# -- redaction -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Redaction:
    """Redacted text and what was replaced (kinds and counts only: no values)."""

    text: str
    kinds: Mapping[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(self.kinds.values())


def _canonical(kind: str, value: str) -> str:
    """The value a placeholder hashes: one secret, however it was quoted, spaced
    or escaped (``p"w\\d`` as written and ``p\\"w\\\\d`` in a JSON string are one)."""
    if kind in _DIGITS_ONLY:
        return "".join(char for char in value if char.isalnum())
    value = _json_unescaped(value)
    if kind != "private_key":
        # A space is part of a password ("Winter 2024!" is not Winter2024!); only a
        # key block is re-wrapped (and quoted with "> ") from one copy to the next.
        return value
    return _WHITESPACE_RE.sub("", _QUOTE_PREFIX_RE.sub("", value))


# A JSON string's escapes a secret's value may hold: \", \\, \/ and \uXXXX.
_JSON_STRING_ESCAPE_RE: Final = re.compile(r'\\(?:u([0-9A-Fa-f]{4})|(["\\/]))')
# How many times escapes are undone: the detector reads JSON three strings deep.
_ESCAPE_PASSES: Final = 8


def _json_unescape_one(match: re.Match[str]) -> str:
    code = match.group(1)
    return chr(int(code, 16)) if code is not None else match.group(2)


def _json_unescaped(value: str) -> str:
    """``value`` with JSON's escapes undone at every level it holds them (a secret
    found in JSON inside JSON is written ``\\\\\\"``): the same secret as
    written elsewhere."""
    return _json_unescape_levels(value)[-1]


def _json_unescape_levels(value: str) -> list[str]:
    """``value``, then with one level of JSON's escapes undone, two…, while any
    is left (at most _ESCAPE_PASSES).  A character JSON wrote as a surrogate
    pair is one again."""
    levels = [value]
    while "\\" in value and len(levels) <= _ESCAPE_PASSES:
        undone = _JSON_STRING_ESCAPE_RE.sub(_json_unescape_one, value)
        if undone == value:
            break
        value = undone.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        levels.append(value)
    return levels


@dataclass(frozen=True, slots=True)
class Redactor:
    """Replaces what :func:`memd.core.secrets.find_secrets` finds with keyed placeholders."""

    key: bytes = field(repr=False)
    pii: bool
    patterns: tuple[tuple[str, str], ...] = ()

    def placeholder(self, kind: str, value: str) -> str:
        canonical = _canonical(kind, value).encode("utf-8", "surrogatepass")
        digest = hmac.new(self.key, canonical, hashlib.sha256).hexdigest()[:HASH_CHARS]
        return f"[REDACTED:{kind}#{digest}]"

    def spans(self, text: str) -> list[Span]:
        return find_secrets(text, pii=self.pii, user_patterns=self.patterns)

    def redact(self, text: str, known: Sequence[tuple[str, str]] = ()) -> Redaction:
        """``text`` with credentials replaced, seen (and returned) without terminal
        escapes and other controls: ``"\x1b[31msk-ant-…"`` reads as one word to
        the detector, and the block written to MEMORY.md drops the escape later,
        which would make a whole credential of what was scanned as a fragment.

        ``known`` (kind, value) pairs, from :meth:`values_in`, are replaced too
        wherever their value stands as a whole word, whatever surrounds it."""
        text = visible_text(text)
        spans = self.spans(text)
        kinds = Counter(span.kind for span in spans)
        if spans:
            text = replace_spans(
                text, spans, lambda span, value: self.placeholder(span.kind, span.shown or value)
            )
        if known:
            kind_of = {value: kind for kind, value in known}
            # Longest first: a value that holds another one is replaced whole.
            values = sorted(kind_of, key=len, reverse=True)
            pattern = re.compile(
                r"(?<![A-Za-z0-9_])(?:" + "|".join(map(re.escape, values)) + r")(?![A-Za-z0-9_])"
            )

            def replace(match: re.Match[str]) -> str:
                kind = kind_of[match.group()]
                kinds[kind] += 1
                return self.placeholder(kind, match.group())

            text = pattern.sub(replace, text)
        return Redaction(text, dict(kinds)) if kinds else Redaction(text)

    def values_in_document(self, document: MemoryDocument) -> tuple[tuple[str, str], ...]:
        """:meth:`values_in` the whole of ``document`` (rendered and decoded here:
        at 10 MB that alone is tens of milliseconds of the search's cost)."""
        return self.values_in(document.render().decode("utf-8", "surrogateescape"))

    def values_in(self, text: str) -> tuple[tuple[str, str], ...]:
        """(kind, value) of each secret in ``text`` (the material a summary is made
        of): a model may repeat one in a form the detector does not read as one
        (a Markdown table, "the key (x)"), so the reply is also searched for the
        values themselves."""
        text = visible_text(text)
        found: dict[tuple[str, str], None] = {}
        for span in self.spans(text):
            value = span.value(text)
            # Found inside escaped JSON, a value holds its escapes (\\u00c4 too);
            # a model writes it plainly or less deep: each form is searched for.
            # A shell-escaped password (-p"Pa\\$word1") as its program got it too.
            forms = _json_unescape_levels(value)
            if span.shown is not None:
                forms += _json_unescape_levels(span.shown)
            for form in dict.fromkeys(forms):
                if _worth_searching(form):
                    found[(span.kind, form)] = None
        return tuple(found)


def _worth_searching(value: str) -> bool:
    """Whether the reply is searched for ``value`` wherever it stands: not a short
    plain word. ``password: string;`` in code or ``POSTGRES_PASSWORD=postgres`` make
    "string" and "postgres" values, and every use of the word in a summary would
    turn into a placeholder (the patterns still catch the assignment itself)."""
    if len(value) < _MIN_KNOWN_VALUE:
        return False
    return len(value) >= _PLAIN_WORD_MAX or not value.isalpha()


def visible_text(text: str) -> str:
    """``text`` as a reader sees it: a carriage return read as a line break, escape
    sequences and other control characters gone (newline and tab kept)."""
    return strip_controls(text.replace("\r\n", "\n").replace("\r", "\n"))


def redact_document(document: MemoryDocument, redactor: Redactor) -> MemoryDocument:
    """``document`` with every secret replaced, re-parsed (offsets are not kept).

    Redacted whole, not line by line: a secret's context ("password=", a PEM
    header) may sit on another line than the secret an extract would keep.
    """
    raw = document.render().decode("utf-8", "surrogateescape")
    redacted = redactor.redact(raw)
    if not redacted.count:
        return document
    return parse(redacted.text.encode("utf-8", "surrogateescape"))


@dataclass(frozen=True, slots=True)
class Privacy:
    """The workspace's redaction key with the ``[privacy]`` settings in force."""

    key: bytes = field(repr=False)
    config: PrivacyConfig = field(default_factory=PrivacyConfig)

    @property
    def patterns(self) -> tuple[tuple[str, str], ...]:
        return tuple(self.config.patterns.items())

    def is_remote(
        self, model: str, api_base: str, provider_of: ProviderOf = provider_unknown
    ) -> bool:
        return not is_local_summarizer(model, api_base, self.config.local_hosts, provider_of)

    def outbound(
        self, model: str, api_base: str, provider_of: ProviderOf = provider_unknown
    ) -> Redactor | None:
        """What redacts text sent to this summarizer; ``None``: it receives text as written.

        ``provider_of``: where a bare model name goes (see :func:`is_local_summarizer`)."""
        config = self.config
        if not config.redact:
            return None
        if not self.is_remote(model, api_base, provider_of) and not config.redact_local:
            return None
        pii = True if config.redact_pii == "auto" else config.redact_pii
        return Redactor(self.key, pii=pii, patterns=self.patterns)

    def for_reply(self, pii: bool = False) -> Redactor:
        """What scans a summary before it is written: credentials always (they are
        never kept in a summary), personal data when it was redacted on the way
        out (``pii``) or ``redact_pii = true``."""
        return Redactor(self.key, pii=pii or self.config.redact_pii is True, patterns=self.patterns)


def outbound_redaction(config: MemdConfig, provider_of: ProviderOf = provider_unknown) -> str:
    """What the configured summarizer is sent, in a word or two (the daemon's ``ready`` line)."""
    summarizer = config.summarizer
    privacy = config.privacy
    remote = not is_local_summarizer(
        summarizer.model, summarizer.api_base, privacy.local_hosts, provider_of
    )
    if not privacy.redact:
        return "off (remote)" if remote else "off"
    if not remote and not privacy.redact_local:
        return "none (local summarizer)"
    pii = privacy.redact_pii == "auto" or privacy.redact_pii is True
    return "credentials and personal data" if pii else "credentials"


def api_base_ignored_warning(
    config: MemdConfig, provider_of: ProviderOf = provider_unknown
) -> str | None:
    """The warning for an ``api_base`` the summarizer's provider is not known to send
    to (``memd doctor``): the operator points at a server of their own, and the
    requests may go to the provider's service instead (memd redacts them as for a
    remote model).  A prefix known to honour it needs no lookup."""
    summarizer = config.summarizer
    model, api_base = summarizer.model.strip(), summarizer.api_base.strip()
    if not api_base or model.lower() == BUILTIN_MODEL:
        return None
    prefix, slash, _rest = model.lower().partition("/")
    if slash and prefix in _API_BASE_PROVIDERS:
        return None
    provider = provider_of(model)
    if provider is None:
        return (
            f"litellm infers no provider from summarizer {model!r} (no provider/ prefix): "
            f"it will not send to api_base {api_base}"
        )
    if provider in _API_BASE_PROVIDERS:
        return None
    return (
        f"summarizer {model!r} goes to litellm provider {provider!r}, which is not known to "
        f"send to api_base {api_base}: requests may go to {provider}'s own service, so memd "
        "treats it as remote and redacts them"
    )


def unredacted_remote_warning(
    config: MemdConfig, provider_of: ProviderOf = provider_unknown
) -> str | None:
    """The warning for a remote summarizer configured with ``redact = false``, if so."""
    summarizer = config.summarizer
    privacy = config.privacy
    if privacy.redact or is_local_summarizer(
        summarizer.model, summarizer.api_base, privacy.local_hosts, provider_of
    ):
        return None
    where = summarizer.api_base.strip() or f"the {summarizer.model.split('/')[0]} provider"
    return (
        f"summarizer {summarizer.model!r} is remote ({where}) and [privacy] redact = false: "
        "credentials and personal data in agents' memories are sent to it as written"
    )


__all__ = [
    "HASH_CHARS",
    "Privacy",
    "ProviderOf",
    "Redaction",
    "Redactor",
    "api_base_ignored_warning",
    "endpoint_host",
    "is_local_host",
    "is_local_summarizer",
    "outbound_redaction",
    "provider_unknown",
    "redact_document",
    "unredacted_remote_warning",
]
