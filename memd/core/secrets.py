"""The credential and PII detector (pure): text in, typed spans out.

One detector for the whole of memd: redaction before a summarizer call, the
scan of every summary before it is written, the summaries' "credentials are
never pinned" rule.  Nothing here reads files, the clock or the environment.

Where detect-secrets' regex plugins are precise (AWS key ids, GitHub, GitLab,
Slack webhooks, SendGrid, Twilio, PyPI, Square, Azure storage, Telegram) their
own compiled patterns are used; memd's rules cover the rest (OpenAI project
keys, Anthropic, fine-grained GitHub PATs, Slack tokens with mixed case,
Stripe's full-length keys, JWTs, whole PEM blocks, bearer tokens, passwords in
URLs and ``password=`` style assignments, passwords given to well-known
command-line tools: ``mysql -p…``, ``curl -u user:…``, ``sshpass -p``,
``ldapsearch -w``, ``ldappasswd -s``, ``redis-cli AUTH …``,
``openssl -passin pass:…``, ``smbclient -U user%…``, ``NET USE … PW``,
``net user NAME PW``, ``psexec``/``evil-winrm``/``az login``/``oc login -p``,
``helm … --password``, ``keytool -storepass``, ``sqlplus user/pw@db``,
``curl --data-urlencode "password=a b"``, redis-cli's ``host:port> AUTH PW``,
``ConvertTo-SecureString "…" -AsPlainText``, ``SSHPASS=… sshpass -e``…, also
as JSON strings of tool calls) and,
on request, PII (emails, phone numbers, card numbers passing the Luhn check,
US SSNs, UK NI numbers, IBANs).

Entropy heuristics are deliberately absent: on memory files they flag hex
hashes, UUIDs, commit ids and base64 blobs (12 of 13 look-alikes in the
redaction benchmark), which would make summaries useless.
"""

from __future__ import annotations

import base64
import bisect
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

Category = Literal["credential", "pii"]

PII: Final = "pii"
# A URL's ``user:password@`` (groups: the user, the password). The password runs
# to the LAST "@" (one made by base64 or by hand holds "/", "+", "=", "#", "?" or
# "@" unescaped: the URL's first "/" is no end), within 256 characters (a long run
# is not scanned to its end from every "://" in it); an "@" in a path after the
# URL's port is not one ("http://localhost:4873/@scope/pkg"): a ":" followed by a
# port and "/", "?" or "#" is the host's port. Pins strip the password by it too.
# Not a port: after no name (``redis://:2024/x@cache``: no host is empty), a
# number over 65535, and outside the web's schemes (whose paths hold "@": npm's
# ``/@scope/pkg``, ``/@alice``) digits, "/" and a name without "/", "?" or "#"
# up to an "@": ``postgres://app:2024/x@db/x`` holds the password ``2024/x``
# (it was read as the host "app" on port 2024, and pinned and sent whole).
# In a web scheme too when what stands before the ":" is no host's name, a bare
# word (no ".", not localhost) and the "/" is followed by a name up to an "@":
# ``https://u:2024/x@host/path`` holds the password ``2024/x`` (it was read as
# the host "u" on port 2024 and pinned whole, with the password); a host's port
# stays one: ``https://example.com:8443/a@b``, ``http://localhost:4873/@scope``,
# ``http://registry:4873/@scope/pkg`` (nothing between the "/" and the "@").
# Ambiguous and read as a password: an intranet bare host with a port and an
# "@" in its path's first name (``http://gitea:3000/alice@corp``).
_URL_NAME: Final = r"[^\s:/?#@\[\]\"'<>`]"
_URL_BARE_WORD: Final = r"(?!(?i:localhost):)[^\s:/?#@\[\]\"'<>`.]++"
_URL_PORT: Final = r"(?:\d{1,4}|[0-5]\d{4}|6[0-4]\d{3}|65[0-4]\d\d|655[0-2]\d|6553[0-5])"
_WEB_SCHEME: Final = (
    r"(?i:(?<=http://)|(?<=https://)|(?<=ws://)|(?<=wss://)|(?<=ftp://)|(?<=ftps://))"
)
URL_USERINFO: Final = (
    rf"(?!{_WEB_SCHEME}(?!{_URL_BARE_WORD}:{_URL_PORT}/[^\s/?#\"'<>`]+@)"
    rf"{_URL_NAME}++:{_URL_PORT}[/?#]"
    rf"|{_URL_NAME}++:{_URL_PORT}(?:[?#]|/(?![^\s/?#\"'<>`]*@)))"
    rf"({_URL_NAME}*):([^\s\"'<>`]{{0,256}})@"
)

# What a redaction leaves behind: ``[REDACTED:kind#3f9a1c]``.  Never re-detected.
PLACEHOLDER_RE: Final = re.compile(r"\[REDACTED:[a-z0-9_]+(?:#[0-9a-f]{4,16})?\]")


@dataclass(frozen=True, slots=True, order=True)
class Span:
    """``text[start:end]`` is a secret of ``kind`` (``aws_access_key``, ``email``, …)."""

    start: int
    end: int
    kind: str
    category: Category = "credential"
    # The secret as its program gets it, when that differs from how it is written:
    # a shell-escaped command-line password (-p"Pa\\$word1" is Pa$word1).  The
    # placeholder and the search of a reply key on this form.
    shown: str | None = field(default=None, compare=False)

    def value(self, text: str) -> str:
        return text[self.start : self.end]

    def secret(self, text: str) -> str:
        """The secret itself: ``shown`` if set, else as written."""
        return self.shown if self.shown is not None else self.value(text)


Validator = Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class Rule:
    """One pattern: group ``group`` of each match (0 = all of it) is the secret."""

    kind: str
    pattern: re.Pattern[str]
    category: Category = "credential"
    group: int = 0
    validate: Validator | None = None
    # Like ``validate``, for a rule that must see the whole match (its shape).
    validate_match: Callable[[re.Match[str]], bool] | None = None
    # Token-like secrets run on past a fixed-length pattern (Stripe keys are
    # 99 characters, detect-secrets matches 24): the span takes the whole token.
    extend: bool = False
    # Lower-case literals one of which the text must hold for the rule to run:
    # ``str.__contains__`` is far cheaper than a regex scan of a whole file.
    hints: tuple[str, ...] = ()


_TOKEN_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


# -- validators ----------------------------------------------------------------
def luhn_valid(digits: str) -> bool:
    """The Luhn checksum of a card number (digits only)."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def _card_number(candidate: str) -> bool:
    digits = re.sub(r"[ -]", "", candidate)
    if not 13 <= len(digits) <= 19 or not luhn_valid(digits):
        return False
    # Issuer prefixes (Visa, Mastercard, Amex, Discover, JCB, Diners, UnionPay):
    # a Luhn-valid run of digits alone is one in ten of all numbers.
    return bool(re.match(r"4|5[1-5]|2[2-7]|3[47]|3[0689]|6(?:011|5|4[4-9]|2)|35", digits))


def _us_ssn(candidate: str) -> bool:
    area, group, serial = candidate.split("-")
    return area not in {"000", "666"} and area[0] != "9" and group != "00" and serial != "0000"


def _iban(candidate: str) -> bool:
    compact = candidate.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    number = "".join(str(int(char, 36)) for char in rearranged)
    return int(number) % 97 == 1


def _mixed_case(candidate: str) -> bool:
    """Real AWS secret keys are base64: a 40-char hex commit id is not one."""
    return any(c.isupper() for c in candidate) and any(c.islower() for c in candidate)


def _assigned_value(candidate: str) -> bool:
    value = candidate.strip("\"'`")
    # A stand-in, not a value: a command substitution ($(cat pw)) as well.
    if len(value) < 4 or value.startswith(("[REDACTED:", "<", "{{", "%(", "$(")):
        return False
    # "password: ********", "token=<your token>", "secret = ${SECRET}", "key=None".
    # Maven's ${env.NEXUS_PW} too.
    if re.fullmatch(r"[*x•.]+|<[^>]*>|\$\{?[A-Za-z_][\w.]*\}?|none|null|true|false", value, re.I):
        return False
    # The escapes before a quoted value deep in JSON (password=\\\\\\\"pw\\\\\\\" three
    # levels down): the value itself is found with the escapes undone.
    if re.fullmatch(r"[\\\"']+", value):
        return False
    return not value.isdigit() or len(value) >= 6


def _number(candidate: str) -> bool:
    return re.fullmatch(r"[+-]?\d+(?:\.\d+)?", candidate.strip("\"'`")) is not None


def _short_pass_assignment(match: re.Match[str]) -> bool:
    """Whether ``NAME_PASS``/``NAME_PW`` is given a password here, judged by the
    shape of the assignment rather than by the value: weak passwords are plain
    words (``ILO_PASS=changeme``), so the value alone cannot tell.

    A .env or shell line (``NAME=value``, nothing around ``=``), YAML or JSON
    (``NAME: value``) always counts.  Only in a spaced code assignment
    (``NAME = value``, ``NAME: Final = value``) does an unquoted name, dotted
    name or call read as code (``RenderPass.OPAQUE``, ``make_pass(tree, …)``);
    a quoted string there still counts (``SHADOW_PASS = "shadow"``: a string
    literal is data, and a password in code is one).  A number reads as a count
    in every shape (``NUM_PASS=3``); under a name that says whose password it
    is (``ADMIN_PW=123456``) the account rule finds it all the same.
    """
    value = match.group("value")
    if not _assigned_value(value) or _number(value):
        return False
    if match.group("code") is None or value[0] in "\"'`":
        return True
    rest = match.string[match.start("value") : match.start("value") + 300]
    reference = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
    if re.fullmatch(reference, value):
        return False
    # A call whose arguments are names, literals, keywords: make_pass(tree, strict=True).
    return re.match(reference + r"\([\w\s.,=\"'-]*\)", rest) is None


def _spoken_password(candidate: str) -> bool:
    """ "the password is hunter2!" yes, "the password is incorrect" no."""
    return _assigned_value(candidate) and bool(re.search(r"[\d\W_]", candidate))


# -- rules ---------------------------------------------------------------------
def _rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


# Not in the middle of a longer token; but a token right after an escaped
# newline or tab in JSON ("\\n"), a %-encoded byte ("%3D") or a JSON unicode
# escape ("\\u003d") starts there, although a letter or digit precedes it.
_B: Final = r"(?:(?<![A-Za-z0-9_])|(?<=\\[nrt])|(?<=%[0-9A-Fa-f]{2})|(?<=\\u[0-9A-Fa-f]{4}))"
_E: Final = r"(?![A-Za-z0-9_])"
_ASSIGN_KEYS: Final = (
    # Spelled with a space too ("api key: sk-live-…", "Access Token = …"), as
    # people write them in prose and notes; not "private key", whose value in
    # prose is mostly a path ("private key: ~/.ssh/id_ed25519").
    r"password|passwd|pwd|passphrase|secret|client[_ -]?secret|secret[_ -]?key|token|"
    r"access[_ -]?token|auth[_ -]?token|refresh[_ -]?token|api[_ -]?key|apikey|"
    r"private[_-]?key|credentials?"
)
# .env names for passwords the keys above miss: PGPASSWORD, HTPASSWD (no "_"
# before PASSWORD/PASSWD).  Upper case only: in prose these are ordinary words.
_ENV_ASSIGN_KEYS: Final = r"\b(?:[A-Z0-9]+_)*[A-Z0-9]+PASS(?:WORD|WD)\b"
# camelCase keys: rootPassword (Helm's --set auth.rootPassword=…), adminPassword,
# webhookSecret, botToken.  The capital after a lower-case letter or digit is
# where the key word starts: no "\b" nor "_" stands there.
_CAMEL_ASSIGN_KEYS: Final = r"(?<=[a-z0-9])(?:Pass(?:word|wd|phrase)|Secret|Token)\b"
# SMTP_PASS, ADMIN_PW: PASS/PW only as the last part after a "_".  Code names
# passes and limits the same way (RENDER_PASS = RenderPass.OPAQUE, NUM_PASS =
# 100000): see _short_pass_assignment for which shapes count.
# And the variables a tool reads its password from, named neither way:
# SSHPASS=pw sshpass -e ssh …, REDISCLI_AUTH=pw redis-cli, smbclient's SMBPASS.
_TOOL_PASSWORD_ENV: Final = r"SSHPASS|REDISCLI_AUTH|SMBPASS|PGPASSWORD|MYSQL_PWD"  # noqa: S105
_ENV_SHORT_KEY: Final = rf"\b(?:(?:[A-Z0-9]+_)+(?:PASS|PW)|{_TOOL_PASSWORD_ENV})\b"
_ACCOUNT_WORDS: Final = (
    r"ADMIN|ROOT|USER|USR|SU|SUPERUSER|OWNER|GUEST|OPERATOR|MASTER|DEFAULT|INITIAL|"
    r"AUTH|LOGIN|ACCOUNT|ACCT|SVC|SERVICE|APP|API|BOT|CLIENT|SERVER|WEB|SITE|PORTAL|"
    r"DB|DATABASE|SQL|MYSQL|MARIADB|PG|POSTGRES|POSTGRESQL|PSQL|MSSQL|SA|ORACLE|MONGO|"
    r"MONGODB|REDIS|RABBIT|RABBITMQ|AMQP|MQ|KAFKA|ELASTIC|ES|INFLUX|CLICKHOUSE|"
    r"CASSANDRA|SMTP|IMAP|POP3|MAIL|EMAIL|FTP|SFTP|SSH|LDAP|BIND|AD|PROXY|HTTP|"
    r"HTTPS|VPN|WIFI|WLAN|SMB|SAMBA|NAS|REGISTRY|DOCKER|NEXUS|ARTIFACTORY|GIT|REPO|"
    r"JENKINS|GRAFANA|KIBANA|MINIO|S3|VAULT|KEYSTORE|TRUSTSTORE|JKS|P12|PFX|SSL|TLS|"
    r"CERT|KEY|BASIC"
)
_ENV_ACCOUNT_KEY: Final = rf"\b(?:[A-Z0-9]+_)*(?:{_ACCOUNT_WORDS})(?:_[A-Z0-9]+)*_(?:PASS|PW)\b"
# What follows a key: a separator, then the value (group 1).
_ASSIGNED: Final = (
    # Markdown around the key or the value (**Password**: `…`) as a model
    # writes it in a summary.
    r"[\"'`*]*\s*(?::=|=>|=|:)\s*(?:\*\*)?"
    # A quoted value (a double-quoted one may hold escaped quotes:
    # "Ab&c\"d3" in JSON); one whose closing quote was cut off (a line
    # clipped by an extract) still is one.
    r"((?:\"(?:[^\"\\\n]|\\.){4,200}\"|\"[^\"\n]{4,200}(?:\"|$)|'[^'\n]{4,200}(?:'|$)"
    r"|`[^`\n]{4,200}(?:`|$)"
    # Unquoted: up to the next parameter of a query string or form
    # (?password=pw&remember=1: "&remember=1" is no part of it).
    r"|(?:(?!&[A-Za-z_][\w.-]*=)[^\s\"'`,;)}\]]){4,200}))"
)
# The same for _ENV_SHORT_KEY, with the shape of the assignment kept: "code" is
# a spaced one (NAME = value) or a typed one (NAME: Final = value).
_SHORT_KEY_ASSIGNED: Final = (
    r"(?:(?P<code>:[ \t]*[A-Za-z_][\w.\[\], |]*?[ \t]*:?=[ \t]*"
    r"|[ \t]+:?=[ \t]*|:?=[ \t]+)"
    r"|[\"'`*]*\s*(?::=|=>|=|:)\s*(?:\*\*)?)"
    r"(?P<value>\"(?:[^\"\\\n]|\\.){4,200}\"|\"[^\"\n]{4,200}(?:\"|$)|'[^'\n]{4,200}(?:'|$)"
    r"|`[^`\n]{4,200}(?:`|$)"
    # Unquoted: to a space, a quote or what ends a value in code or JSON; a
    # bracketed part is kept whole (GMAIL_PASS=Summer(2024)!).
    r"|(?:[^\s\"'`,;()}\]]|\([^\s()\"'`]{0,100}\)?){1,200})"
)

# Command lines (an agent's tool calls) that carry a password as an argument.
# Only tools whose option surely takes a password are read: ``-p`` is a port or
# a path for most tools, and ``mysql -p`` alone (nothing glued) only prompts.
#
# A regex cannot read these safely: quotes may hold ``&`` or ``;``, a command
# goes on after ``\`` + newline, a tool call may be an argv array, and a lazy
# run over "the arguments after curl" retried from every ``curl`` in a long
# one-line JSON log is quadratic (a 1 MB log took minutes).  So one regex finds
# the tool names, and the words after each are read once, left to right, the
# way a shell splits them (quotes, escapes, continuations), within one command
# (not across an unquoted ``|``, ``;``, ``&``, newline) and at most
# _COMMAND_WINDOW characters past the last tool name: every character is read
# a bounded number of times, however the tool names repeat.
_MYSQL_CLIENTS: Final = (
    r"mysql|mysqldump|mysqlimport|mysqlshow|mysqlcheck|mysqlbinlog|mysqlpump"
    r"|mariadb(?:-dump|-import|-show|-check|-binlog)?"
)
# mysqladmin also takes a new password as a command's argument: password NEW.
_MYSQL_ADMIN: Final = r"mysqladmin|mariadb-admin"
_REGISTRY_LOGIN: Final = (
    r"(?:docker|podman|buildah|skopeo|nerdctl|oras|helm[ \t]+registry)"
    r"(?:[ \t]+|[\"']\s*,\s*[\"'])login"
)
# OpenLDAP's clients take the bind password as -w (-W prompts).
_LDAP_CLIENTS: Final = r"ldap(?:search|modify|add|delete|whoami|passwd|compare|modrdn|exop)"
# MongoDB's shells and tools: -p is the password (the port is --port).
_MONGO_CLIENTS: Final = (
    r"mongosh|mongo|mongodump|mongorestore|mongoexport|mongoimport|mongostat|mongotop|mongofiles"
)
# Samba's clients take the password after a % in the user: -U alice%pw.
_SMB_CLIENTS: Final = r"smbclient|rpcclient|smbcacls|smbget"


@dataclass(frozen=True, slots=True)
class _Options:
    """A tool's options that take a password: ``valued`` the next word (or,
    for a ``--`` option, what follows its "="), ``glued`` the rest of the word
    (7z -pPW), ``long`` every long option whose name it matches."""

    valued: frozenset[str] = frozenset()
    glued: tuple[str, ...] = ()
    long: re.Pattern[str] | None = None


_PENTEST_OPTIONS: Final = _Options(frozenset(["-p", "--password", "-H", "--hash"]))
_KEYTOOL_OPTIONS: Final = _Options(
    frozenset(
        [
            "-storepass",
            "-keypass",
            "-srcstorepass",
            "-deststorepass",
            "-srckeypass",
            "-destkeypass",
            "-new",
        ]
    )
)
_ZIP_OPTIONS: Final = _Options(frozenset(["-P", "--password"]))
_SEVEN_ZIP_OPTIONS: Final = _Options(glued=("-p",))
_MOSQUITTO_OPTIONS: Final = _Options(frozenset(["-P", "--pw"]))
_DASH_P_OPTIONS: Final = _Options(frozenset(["-p", "--password"]))
# Tools (by name as run, lower case) some of whose options take a password.
_OPTION_TOOLS: Final[Mapping[str, _Options]] = {
    "psexec": _Options(frozenset(["-p"])),
    "psexec64": _Options(frozenset(["-p"])),
    "paexec": _Options(frozenset(["-p"])),
    "evil-winrm": _PENTEST_OPTIONS,
    "nxc": _PENTEST_OPTIONS,
    "netexec": _PENTEST_OPTIONS,
    "crackmapexec": _PENTEST_OPTIONS,
    "smbmap": _DASH_P_OPTIONS,
    "rdesktop": _DASH_P_OPTIONS,
    "hydra": _Options(frozenset(["-p"])),
    "keytool": _KEYTOOL_OPTIONS,
    "jarsigner": _KEYTOOL_OPTIONS,
    "gpg": _Options(frozenset(["--passphrase"])),
    "gpg2": _Options(frozenset(["--passphrase"])),
    "zip": _ZIP_OPTIONS,
    "unzip": _ZIP_OPTIONS,
    "zipcloak": _ZIP_OPTIONS,
    "7z": _SEVEN_ZIP_OPTIONS,
    "7za": _SEVEN_ZIP_OPTIONS,
    "7zr": _SEVEN_ZIP_OPTIONS,
    "7zz": _SEVEN_ZIP_OPTIONS,
    "rar": _SEVEN_ZIP_OPTIONS,
    "unrar": _SEVEN_ZIP_OPTIONS,
    "mosquitto_pub": _MOSQUITTO_OPTIONS,
    "mosquitto_sub": _MOSQUITTO_OPTIONS,
    "mosquitto_rr": _MOSQUITTO_OPTIONS,
    # ssh-keygen -p -P OLD -N NEW.
    "ssh-keygen": _Options(frozenset(["-P", "-N"])),
    "helm": _Options(frozenset(["--password"])),
    "kubectl": _Options(frozenset(["--token", "--password"])),
    "influx": _Options(frozenset(["-password", "--password", "-p", "--token", "-t"])),
    "cqlsh": _DASH_P_OPTIONS,
    "clickhouse-client": _Options(frozenset(["--password"])),
    "rabbitmqadmin": _DASH_P_OPTIONS,
    "ncftp": _Options(frozenset(["-p"])),
    "ncftpget": _Options(frozenset(["-p"])),
    "ncftpput": _Options(frozenset(["-p"])),
    # redis-server --requirepass PW (a compose file's command:), --masterauth PW.
    "redis-server": _Options(frozenset(["--requirepass", "--masterauth"])),
    # rclone --sftp-pass PW, --webdav-password=PW, --s3-secret-access-key KEY.
    "rclone": _Options(
        long=re.compile(r"--(?!ask-)[a-z0-9-]+-(?:pass|password|secret-access-key|client-secret)")
    ),
}
_SEP: Final = r"(?:[ \t]+|[\"']\s*,\s*[\"'])"  # between words, also of an argv array
_OPTION_HINTS: Final[Mapping[str, str]] = {
    "unzip": "zip",
    "zipcloak": "zip",
    "unrar": "rar",
    "gpg2": "gpg",
    "7za": "7z",
    "7zr": "7z",
    "7zz": "7z",
}
# The first letters of the names the tool regex always reads.
_TOOL_LETTERS: Final = frozenset("bcdhilmnoprswxBCIMNOPRSWX")
# More tools: (group, name, its possible first letters, hints).  One whose first
# letters are all in _TOOL_LETTERS is always read; any other only in a text
# holding one of its hints (lower case): its first letter tested at every
# position of every text cost a tool-call log naming none of them ~15 %.
_EXTRA_TOOLS: Final[tuple[tuple[str, str, str, tuple[str, ...]], ...]] = (
    # net user NAME PW [/add].
    ("netuser", rf"(?i:net1?(?:\.exe)?{_SEP}user)", "nN", ()),
    # Azure's and OpenShift's CLIs: -p/--password after "login", as docker's.
    ("cloud_login", rf"az{_SEP}login", "a", ("login",)),
    ("cloud_login", rf"oc{_SEP}login", "o", ()),
    # Oracle's clients: the logon user/pw[@db] is a word of its own.
    ("oracle", r"sqlplus|sqlldr|impdp|rman", "sir", ()),
    ("oracle", r"expdp", "e", ("expdp",)),
    # impacket's [domain/]user:password@target, -hashes LM:NT.
    (
        "impacket",
        r"impacket-(?:psexec|smbexec|wmiexec|atexec|dcomexec|secretsdump|mssqlclient|smbclient"
        r"|getTGT|GetUserSPNs|GetNPUsers|lookupsid|rpcdump)"
        r"|(?:psexec|smbexec|wmiexec|dcomexec|secretsdump|mssqlclient|smbclient|lookupsid"
        r"|rpcdump)\.py",
        "ipswdmlr",
        (),
    ),
    (
        "impacket",
        r"(?:atexec|getTGT|GetUserSPNs|GetNPUsers)\.py",
        "agG",
        ("atexec.py", "tgt.py", "spns.py", "npusers.py"),
    ),
    ("lftp", r"lftp", "l", ()),
    ("rabbitmqctl", r"rabbitmqctl", "r", ()),
    ("vault", rf"vault{_SEP}login", "v", ("vault",)),
    # Tools whose options (_OPTION_TOOLS) take a password, longest first: PsExec
    # in any case.  A name's hint is itself or the part it shares with others.
    *(
        ("options", f"(?i:{name})", name[0] + name[0].upper(), ())
        if name.startswith(("psexec", "paexec"))
        else ("options", re.escape(name), name[0], (_OPTION_HINTS.get(name, name),))
        for name in sorted(_OPTION_TOOLS, key=len, reverse=True)
    ),
)
# The entries always read.
_ALWAYS_READ: Final = frozenset(
    index
    for index, (_group, _names, first, _hints) in enumerate(_EXTRA_TOOLS)
    if set(first) <= _TOOL_LETTERS
)


def _tool_re_for(lowered: str) -> re.Pattern[str]:
    """The tool names' regex for a text (``lowered``): the tools always read, and
    those of _EXTRA_TOOLS it names."""
    present: dict[str, bool] = {}

    def holds(hint: str) -> bool:
        if hint not in present:
            present[hint] = hint in lowered
        return present[hint]

    return _tool_re(
        tuple(
            index
            for index, (_group, _names, _first, hints) in enumerate(_EXTRA_TOOLS)
            if index in _ALWAYS_READ or any(holds(hint) for hint in hints)
        )
    )


@functools.lru_cache(maxsize=64)
def _tool_re(entries: tuple[int, ...]) -> re.Pattern[str]:
    """The tool names' regex with the entries ``entries`` of _EXTRA_TOOLS."""
    letters = set(_TOOL_LETTERS)
    groups: dict[str, list[str]] = {}
    for index in entries:
        group, names, first, _hints = _EXTRA_TOOLS[index]
        groups.setdefault(group, []).append(names)
        letters.update(first)
    alternatives = "".join(f"|(?P<{group}>{'|'.join(names)})" for group, names in groups.items())
    return re.compile(
        # The first letters of the names below, tested before the boundary's
        # lookbehinds: twice as fast over text that names no tool.
        "(?=["
        + re.escape("".join(sorted(letters)))
        + "])"
        + _B
        + rf"(?:(?:(?P<mysqladmin>{_MYSQL_ADMIN})|(?P<mysql>{_MYSQL_CLIENTS})|(?P<mysqlsh>mysqlsh)"
        + r"|(?P<curl>curl)|(?P<wget>wget)|(?P<sshpass>sshpass)"
        + rf"|(?P<redis>redis-cli)|(?P<htpasswd>htpasswd)|(?P<login>{_REGISTRY_LOGIN})"
        + rf"|(?P<ldappasswd>ldappasswd)|(?P<ldap>{_LDAP_CLIENTS})|(?P<openssl>openssl)"
        + rf"|(?P<smb>{_SMB_CLIENTS})|(?P<mongo>{_MONGO_CLIENTS})"
        # Windows' tools in any case (cmd.exe ignores it; batch files write NET USE):
        # net use \\host\share PW /user:x, SQLCMD -P PW.
        + r"|(?P<capital_p>(?i:ipmitool|sqlcmd|bcp|osql))"
        # FreeRDP's /p:PW, cmdkey's /pass:PW.
        + r"|(?P<slash_pass>(?i:xfreerdp3?|wlfreerdp3?|sdl-freerdp3?|cmdkey))"
        + rf"|(?P<netuse>(?i:net(?:\.exe)?{_SEP}use))"
        + alternatives
        + r")(?i:\.exe)?(?![\w.-])"
        # The variables a tool takes its password from, set before it on its command
        # line: SSHPASS=pw sshpass -e …, REDISCLI_AUTH=pw redis-cli.  The value is a
        # shell word (quoted, in parts, in JSON), read as the other tools' are.
        + rf"|(?P<env>{_TOOL_PASSWORD_ENV})=)"
    )


_COMMAND_HINTS: Final = (
    "mysql",
    "mariadb",
    "curl",
    "wget",
    "sshpass",
    "redis-cli",
    "htpasswd",
    "login",
    "ldap",
    "openssl",
    "smb",
    "rpcclient",
    "mongo",
    "ipmitool",
    "sqlcmd",
    "bcp",
    "osql",
    "net",
    "freerdp",
    "cmdkey",
    "rediscli_auth",
    "pgpassword",
    "user",
    "login",
    "sqlplus",
    "sqlldr",
    "pdp",
    "rman",
    ".py",
    "impacket-",
    "lftp",
    "rabbitmqctl",
    *_OPTION_TOOLS,
)
_COMMAND_WINDOW: Final = 4096
# One piece of a shell word, or what lies between words.  Escapes of JSON (the
# command as a string in a tool call) are read as JSON means them: ``\n`` ends
# the command, ``\t`` and ``\"`` part words, ``\\\n`` continues the line.
# ``\\\"`` and ``\\\\\\\"`` part words too: a quote escaped once more for each JSON
# string the command is nested in (read as an escaped backslash and a separator,
# it glued a backslash to the password before it).
#
# A command is often a JSON string itself (["mysql -uroot -pS3cr3t", "ls"],
# {"cmd": "…", "cwd": "…"}): a quote followed by what comes after a string in
# JSON (or a Python list's repr) ends it there, not a shell quote opening:
# read as one, it glued the next command to the password.  And a lone ``&``
# inside a word is no operator but part of it (-pAb&cd3, ?a=1&b=2): a shell
# would fork there, but the word is what was meant, and its tail a password's.
# An "&" before a JSON unicode escape is inside the word too (-pab&\\u00c4x: a
# non-ASCII character as json.dumps writes it).
_PLAIN: Final = r"[^\s\"'\\|;&()<>`]+(?:&(?:[^\s\"'\\|;&()<>`]+|(?=\\u[0-9A-Fa-f]{4})))*"
# What follows a string's end in JSON or a Python list's repr: the next item
# (a comma, then a quote or a bracket), or the brackets that close the list or
# object (and a call: run(['…'])), then a comma, a space or the end.  Not what
# a shell word's quoted part may open with (-p"ab"'})c': "})c" goes on).  A
# single quote ends a string only in a command that opens one (['mysql …',
# …]): a shell's quoted part may well open with "], " (-p"ab"'], c').
_STRING_END: Final = (
    r"\"(?=\s*(?:,\s*[\"'\[{]|[\]}]+\)*(?:[\s,]|$)))"
    r"|'(?=\s*(?:,\s+[\"'\[{]|[\]}]+\)*(?:[\s,]|$)))"
)
# Where a continued command's next line starts: its indent, and the "> " that
# quotes a turn's every line in a summarizer's prompt (a command continued over
# quoted lines is one command: -p on the third line is still mysql's).
_QUOTED_LINE_START: Final = r"[ \t]*(?:>[ \t]*)?"
# What a single quote is where it ends no string: a shell's quoted part.
_SQ_PART: Final = re.compile(r"'(?P<sq>[^'\n]*)'|(?P<stray>')")
_SHELL_PIECE: Final = re.compile(
    rf"(?P<plain>{_PLAIN})"
    rf"|(?P<string_end>{_STRING_END})"
    r"|\"(?P<dq>(?:[^\"\\\n]|\\.)*)\""
    r"|'(?P<sq>[^'\n]*)'"
    # A line continued (PowerShell's backtick: _POWERSHELL_CONTINUATION).
    r"|(?P<cont>(?:\\\r?\n|\\\\\\n|\\\\\\r\\\\\\n)" + _QUOTED_LINE_START + ")"
    r"|(?P<end>\\[nr]|[\n\r|;&()`])"
    r"|(?P<sep>[ \t]+|\\t|\\(?:\\\\){0,3}\"|[<>])"
    r"|\\(?P<escaped>.)"
    # A quote never closed on its line, a backslash at the very end.
    r"|(?P<stray>[\"'\\])"
)
# PowerShell's line continuation, a backtick (after a space) before a newline,
# also in a JSON string.  Tested only where _SHELL_PIECE ends a command at a
# backtick: as one more alternative there, it slowed every piece's match.
_POWERSHELL_CONTINUATION: Final = re.compile(
    r"`(?P<cont>(?:\r?\n|\\n|\\r\\n)" + _QUOTED_LINE_START + ")"
)
# A whole word at once, for the words no rule needs to read (most of them).
_SHELL_WORD: Final = re.compile(
    rf"(?:{_PLAIN}|(?!{_STRING_END})(?:\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*')|\\[^nrt\"\r\n\\])+"
)
# A word that is an option's name, not a password starting with "-": -keystore,
# --batch, -c (a password has a digit or a sign too).
_OPTION_WORD: Final = re.compile(r"--?[A-Za-z][A-Za-z-]*(?:=.*)?", re.DOTALL)
# A redirection's file descriptor, glued to its "<" or ">".
_FD: Final = re.compile(r"\d{1,2}")
_DQ_ESCAPE: Final = re.compile(r"\\([\"\\$`])")
_ARGV_ITEM: Final = re.compile(r"\s*,\s*(?:\"((?:[^\"\\\n]|\\.)*)\"|'((?:[^'\\\n]|\\.)*)')")
_ARGV_START: Final = re.compile(r"[\"']\s*,")


# A password found on a command line: its source span, and its value as the
# program gets it (mysql -p"Pa\\$word1" gives it Pa$word1).
_Found = tuple[int, int, str]


@dataclass(slots=True)
class _Word:
    """One argument as the program gets it, and where each of its characters is:
    ``text[where[i]:ends[i]]`` is how character ``i`` is written, its escape's
    backslash included (``\\u00c4`` in a JSON string is one character: a span
    starting after the backslash split the escape and broke the JSON)."""

    chars: list[str]
    where: list[int]
    ends: list[int]

    @property
    def value(self) -> str:
        return "".join(self.chars)

    def add(self, text: str, start: int) -> None:
        """``text`` as written at ``start``, each character as itself."""
        self.chars.extend(text)
        self.where.extend(range(start, start + len(text)))
        self.ends.extend(range(start + 1, start + len(text) + 1))

    def add_escaped(self, char: str, start: int, end: int) -> None:
        """``char``, written as the escape ``text[start:end]``."""
        self.chars.append(char)
        self.where.append(start)
        self.ends.append(end)

    def tail(self, offset: int) -> _Found | None:
        """The source span of ``value[offset:]`` when it is a password, and the
        password as the program gets it (its quotes and escapes undone)."""
        # A value glued to its option (-pflag, -p'then!') is no word of prose.
        value = self.value[offset:]
        if offset >= len(self.chars) or not _command_value(value, prose=offset == 0):
            return None
        return self.where[offset], self.ends[-1], value

    def part(self, start: int, stop: int) -> _Found | None:
        """The source span of ``value[start:stop]`` when it is a password, and the
        password as the program gets it."""
        if not 0 <= start < stop <= len(self.chars):
            return None
        if not _command_value(self.value[start:stop], prose=start == 0):
            return None
        return self.where[start], self.ends[stop - 1], self.value[start:stop]


# mysqlsh's connection string, user:password@host (no scheme: a URL's is the
# url_password rule's).
_USER_PASSWORD_HOST: Final = re.compile(r"[^\s:@/]+:(.+)@[^@\s]+")
# net use's device, before the share: Z:, LPT1:, * (the next free letter).
_NET_DEVICE: Final = re.compile(r"[A-Za-z]:|(?:LPT|COM)\d:|\*", re.I)
# The share: \\host\share (the shell's reading drops one backslash), //host/share.
_NET_SHARE: Final = re.compile(r"\\|//")
# Short options of OpenLDAP's clients that take no value: -xw pw is -x -w pw.
_LDAP_FLAGS: Final = frozenset("xZnvcLMWAuNI")


# What prose about an option puts after it: "the zip -P option is…", "-storepass
# and -keypass", "gpg --passphrase can…".  (No password is one of these words.)
_PROSE_AFTER_OPTION: Final = frozenset(
    [
        "option",
        "options",
        "flag",
        "flags",
        "switch",
        "argument",
        "arguments",
        "parameter",
        "value",
        "and",
        "are",
        "can",
        "with",
        "must",
        "for",
        "the",
        "then",
        "when",
        "how",
    ]
)


# What prose that names a command without its password puts where a positional
# password would stand ("checked it with net user svc_backup today", "the CI
# asks for vault login please"): net user's and vault login's are read by
# position alone, no option before them says a password follows.
_PROSE_AT_COMMAND_END: Final = frozenset(
    [
        "today",
        "yesterday",
        "tomorrow",
        "now",
        "again",
        "once",
        "twice",
        "too",
        "also",
        "please",
        "first",
        "later",
        "earlier",
        "instead",
        "here",
        "there",
        "manually",
        "successfully",
        "before",
        "after",
        "anyway",
        "already",
        "yet",
        "works",
        "worked",
        "fails",
        "failed",
    ]
)


def _prose_word(value: str) -> bool:
    """Whether a positional password ``value`` is a word of prose instead (what
    closes the JSON string it ends, ``again"}``, left off)."""
    return value.rstrip(".,:;!?\"'}]\\") in _PROSE_AT_COMMAND_END


def _command_value(value: str, *, prose: bool = True) -> bool:
    """An argument that is a password, not a stand-in for one: ``$DB_PASS``,
    ``$(cat pw)``, ``<password>``, ``****``, ``{{ pw }}``, nor (when it is a
    word of its own, ``prose``) a word of prose about the option (``the
    sshpass -p option``)."""
    if len(value) < 3 or value.startswith(("$", "<", "{{", "[REDACTED:", "%(")):
        return False
    if prose and value.rstrip(".,:;!?") in _PROSE_AFTER_OPTION:
        return False
    # Only backslashes and quotes: the escapes of a quote in JSON inside JSON
    # (the \\\ read from -p\\\\\\\"pw\\\\\\\" three levels down, where the raw
    # text's reading ends the word); the password lies past them, found with the
    # escapes undone.
    return re.fullmatch(r"[*x•.]+|[\\\"']+", value) is None


class _ToolArguments:
    """Reads one tool's arguments, word by word, for the password it was given."""

    def __init__(self, tool: str, program: str = "") -> None:
        self.tool: str | None = tool
        self.program = program  # the name as run, for an option table's tool
        self.pending: str | None = None  # the option whose value the next word is
        self.flags = ""  # htpasswd's options
        self.positional = 0
        # redis-cli's and openssl's command: AUTH, CONFIG, passwd…
        self.command: str | None = None
        # A word that is the password unless another word follows it in the
        # command (redis-cli AUTH PW, AUTH USER PW): found when the command ends.
        self.held: _Found | None = None
        if tool == "env":
            self.pending = "value"

    @property
    def wants_value(self) -> bool:
        return self.pending is not None

    def feed(self, word: _Word) -> _Found | None:
        value = word.value
        pending, self.pending = self.pending, None
        if pending == "user":  # curl -u alice:pw; "-u alice" alone prompts
            colon = value.find(":")
            return None if colon < 0 else word.tail(colon + 1)
        if pending == "uri":
            return self._user_password_host(word, 0)
        if pending == "value":
            if self.tool in ("sshpass", "env"):
                self.tool = None  # what follows is the command (sshpass) runs
            return word.tail(0)
        if pending == "skip":
            return None
        if pending == "percent":  # smbclient -U alice%pw; "-U alice" alone prompts
            percent = value.find("%")
            return None if percent < 0 else word.tail(percent + 1)
        if pending == "comma":  # lftp -u alice,pw
            comma = value.find(",")
            return None if comma < 0 else word.tail(comma + 1)
        if pending in ("form", "urlencode", "multipart"):
            return _form_password(word, 0, pending)
        if pending == "pass_source":  # openssl -passin pass:pw (env:, file:, fd: are not)
            return word.tail(5) if value.startswith("pass:") else None
        if pending == "optional" and not value.startswith("-"):
            return word.tail(0)  # mongosh -p pw; "-p" before an option prompts
        if pending == "table":
            # keytool -storepass -keypass (prose naming both) takes no password, but
            # these options always take one: -Xq7#vLp2 is a password, not an option.
            if value in _OPTION_TOOLS[self.program].valued or _OPTION_WORD.fullmatch(value):
                return None
            return word.tail(0)
        if pending == "auth":  # redis-cli AUTH [USER] PW
            self.held = word.tail(0)
            self.pending = "auth_password"
            return None
        if pending == "auth_password":
            self.held = None  # the word before was the user name
            return word.tail(0)
        match self.tool:
            case "mysql" | "mysqladmin":
                # mysqladmin [-p…] password NEW; old-password NEW on old servers.
                if self.tool == "mysqladmin" and value in ("password", "old-password"):
                    self.pending = "value"
                elif value.startswith("--password="):
                    return word.tail(11)
                elif value.startswith("-p") and len(value) > 2:
                    return word.tail(2)
            case "curl":
                name, equals, _rest = value.partition("=")
                if value in ("--user", "--proxy-user"):
                    self.pending = "user"
                elif value.startswith(("--user=", "--proxy-user=")):
                    return word.tail(value.index(":") + 1) if ":" in value else None
                elif name in _CURL_FORM_OPTIONS:
                    if not equals:
                        self.pending = _CURL_FORM_OPTIONS[name]
                        return None
                    return _form_password(word, len(name) + 1, _CURL_FORM_OPTIONS[name])
                elif value.startswith("-") and not value.startswith("--"):
                    return self._curl_short_options(word)
            case "wget":
                name, equals, _rest = value.partition("=")
                if re.fullmatch(r"--(?:http-|ftp-|proxy-)?password", name):
                    if "=" in value:
                        return word.tail(len(name) + 1)
                    self.pending = "value"
                elif name in ("--post-data", "--body-data"):
                    if not equals:
                        self.pending = "form"
                        return None
                    return _form_password(word, len(name) + 1, "form")
            case "sshpass":
                if value == "-p":
                    self.pending = "value"
                elif value.startswith("-p"):
                    self.tool = None
                    return word.tail(2)
                elif value in ("-f", "-d", "-P"):
                    self.pending = "skip"
                elif not value.startswith("-"):
                    self.tool = None
            case "redis":
                if value in ("-a", "--pass"):
                    self.pending = "value"
                elif value.startswith("--pass="):
                    return word.tail(7)
                else:
                    return self._redis_command(word)
            case "login" | "cloud_login":
                if value in ("-p", "--password"):
                    self.pending = "value"
                elif value.startswith("--password="):
                    return word.tail(11)
                elif value.startswith("-p") and not value.startswith("--"):
                    return word.tail(2)
            case "mysqlsh":
                if value.startswith("--password="):
                    return word.tail(11)
                if value.startswith("-p") and len(value) > 2 and not value.startswith("--"):
                    return word.tail(2)
                uri = value.removeprefix("--uri=")
                if value == "--uri":
                    self.pending = "uri"
                elif uri == value and value.startswith("-"):
                    return None
                return self._user_password_host(word, len(value) - len(uri))
            case "ldap":
                return self._short_option(word, "w", _LDAP_FLAGS)
            case "ldappasswd":
                # -w the bind password, -s the new one, -a the old one (-S, -A prompt).
                return self._short_option(word, "wsa", _LDAP_FLAGS | {"S"})
            case "openssl":
                return self._openssl(word)
            case "smb":
                if value in ("-U", "--user"):
                    self.pending = "percent"
                elif value == "--password":
                    self.pending = "value"
                elif value.startswith("--password="):
                    return word.tail(11)
                elif value.startswith(("-U", "--user=")) and "%" in value:
                    return word.tail(value.index("%") + 1)
            case "mongo":
                if value in ("-p", "--password"):
                    self.pending = "optional"
                elif value.startswith("--password="):
                    return word.tail(11)
                elif value.startswith("-p") and not value.startswith("--"):
                    return word.tail(2)
            case "capital_p":  # ipmitool, sqlcmd, bcp, osql: -P pw (-p is a port)
                if value == "-P":
                    self.pending = "value"
                elif value.startswith("-P"):
                    return word.tail(2)
            case "netuse":
                return self._net_use(word)
            case "netuser":
                return self._net_user(word)
            case "options":
                return self._table_option(word)
            case "oracle":
                if value.startswith(("-", "@")):
                    return None
                found = _ORACLE_LOGON.fullmatch(value)
                return None if found is None else word.part(*found.span(1))
            case "impacket":
                if value in ("-hashes", "-aesKey"):
                    self.pending = "value"
                elif not value.startswith("-"):
                    return _impacket_password(word)
            case "lftp":
                if value == "-u":
                    self.pending = "comma"
                elif value.startswith("-u") and "," in value:
                    return word.tail(value.index(",") + 1)
            case "rabbitmqctl":
                return self._rabbitmqctl(word)
            case "vault":
                return self._vault_login(word)
            case "slash_pass":
                option = value[: value.find(":") + 1].lower()
                if option in ("/p:", "/pass:", "/password:"):
                    return word.tail(len(option))
            case "htpasswd":
                # htpasswd -b[c] FILE USER PASSWORD; htpasswd -nb USER PASSWORD.
                if self.positional == 0 and value.startswith("-") and len(value) > 1:
                    self.flags += value[1:]
                    if value == "-C":
                        self.pending = "skip"
                    return None
                if "b" not in self.flags:
                    self.tool = None
                    return None
                self.positional += 1
                if self.positional == (2 if "n" in self.flags else 3):
                    self.tool = None
                    return word.tail(0)
        return None

    def _user_password_host(self, word: _Word, offset: int) -> _Found | None:
        """mysqlsh root:pw@db:3306, its --uri too."""
        if "://" in word.value:
            return None
        found = _USER_PASSWORD_HOST.fullmatch(word.value, offset)
        return None if found is None else word.part(*found.span(1))

    def _redis_command(self, word: _Word) -> _Found | None:
        """redis-cli's command, after its options: AUTH [USER] PW, CONFIG SET
        requirepass PW (or masterauth), ACL SETUSER NAME on '>PW'."""
        value = word.value
        if self.command is None:
            if value in _REDIS_VALUED:
                self.pending = "skip"
            elif not value.startswith("-"):
                self.command = value.lower()
                if self.command == "auth":
                    self.pending = "auth"
            return None
        self.positional += 1
        if self.command == "config":
            if self.positional == 1:
                self.flags = value.lower()  # SET, GET…
            elif self.flags == "set":
                # CONFIG SET NAME VALUE [NAME VALUE …]: each value is read as one.
                self.pending = "value" if value.lower() in _REDIS_PASSWORDS else "skip"
        elif self.command == "acl":
            if self.positional == 1:
                self.flags = value.lower()  # SETUSER, LIST…
            elif self.flags == "setuser" and self.positional > 2 and value.startswith((">", "<")):
                return word.tail(1)  # a password given to (or taken from) a user
        return None

    def _openssl(self, word: _Word) -> _Found | None:
        """openssl's password options, as its parser reads them: one or two
        dashes, the value after a space or an "=" (-passout=pass:pw, --passin
        pass:pw); enc's -k PW; and passwd's own arguments (openssl passwd -6 PW)."""
        value = word.value
        option = value[1:] if value.startswith("--") else value
        name, equals, given = option.partition("=")
        if name in ("-passin", "-passout", "-pass", "-password"):
            if not equals:
                self.pending = "pass_source"
                return None
            return word.tail(len(value) - len(given) + 5) if given.startswith("pass:") else None
        if name == "-k":
            if not equals:
                self.pending = "value"
                return None
            return word.tail(len(value) - len(given))
        if value.startswith("-"):
            if self.command == "passwd" and name in _OPENSSL_PASSWD_VALUED:
                self.pending = "skip"
            return None
        if self.command is None:
            self.command = value
            return None
        return word.tail(0) if self.command == "passwd" else None

    def _short_option(self, word: _Word, options: str, flags: frozenset[str]) -> _Found | None:
        """A short option whose value is the rest of the word or the next word,
        maybe bundled after options that take none: -w pw, -wpw, -xw pw."""
        value = word.value
        if not value.startswith("-") or value.startswith("--"):
            return None
        for index in range(1, len(value)):
            if value[index] in options:
                if index + 1 == len(value):
                    self.pending = "value"
                    return None
                return word.tail(index + 1)
            if value[index] not in flags:
                return None
        return None

    def _net_use(self, word: _Word) -> _Found | None:
        """net use [DEVICE] \\\\host\\share PASSWORD [/user:NAME]: the word after
        the share is the password (* prompts).  Without a share first (net use
        Z: /delete, "the net use of …") nothing is."""
        value = word.value
        if value.startswith("/") and not value.startswith("//"):
            return None  # /user:alice, /persistent:no, /savecred
        if self.positional == 0:
            if _NET_SHARE.match(value):
                self.positional = 1
            elif not _NET_DEVICE.fullmatch(value):
                self.tool = None
            return None
        self.tool = None
        return word.tail(0)

    def _net_user(self, word: _Word) -> _Found | None:
        """net user NAME PW [/add]: the second word is the password (* prompts)
        when no third follows it ("net user alice" shows the account; prose
        that names the command goes on with more words)."""
        if word.value.startswith("/") and not word.value.startswith("//"):
            return None  # /add, /domain, /active:yes
        if word.value == "}":
            self.tool = None  # a PowerShell script block's end: { net user NAME PW }
            return None
        self.positional += 1
        if self.positional == 2:
            self.held = None if _prose_word(word.value) else word.tail(0)
        elif self.positional > 2:
            self.held = None
            self.tool = None
        return None

    def _table_option(self, word: _Word) -> _Found | None:
        """An option of ``_OPTION_TOOLS``' entry for the program that takes a password."""
        options = _OPTION_TOOLS[self.program]
        value = word.value
        if not value.startswith("-"):
            return None
        name, equals, _given = value.partition("=") if value.startswith("--") else (value, "", "")
        if name in options.valued or (options.long is not None and options.long.fullmatch(name)):
            if equals:
                return word.tail(len(name) + 1)
            self.pending = "table"  # a value; the tool's own option right after it is none
            return None
        for prefix in options.glued:
            if value.startswith(prefix) and len(value) > len(prefix):
                return word.tail(len(prefix))
        return None

    def _rabbitmqctl(self, word: _Word) -> _Found | None:
        """rabbitmqctl add_user NAME PW, change_password NAME PW."""
        value = word.value
        if value.startswith("-"):
            if value in ("-n", "--node", "-t", "--timeout", "-p", "--vhost"):
                self.pending = "skip"
            return None
        if self.command is None:
            self.command = value
            return None
        if self.command in ("add_user", "change_password"):
            self.positional += 1
            if self.positional == 2:
                self.tool = None
                return word.tail(0)
        return None

    def _vault_login(self, word: _Word) -> _Found | None:
        """vault login [-flags] TOKEN: the first word that is no flag nor an auth
        method's key=value (password=… is the assignment rule's) is the token."""
        value = word.value
        if value.startswith("-"):
            if "=" not in value and value.lstrip("-") not in _VAULT_BOOLEAN_FLAGS:
                self.pending = "skip"
            return None
        if "=" in value:
            return None
        self.tool = None
        return None if _prose_word(value) else word.tail(0)

    def _curl_short_options(self, word: _Word) -> _Found | None:
        """curl's short options, bundled the way agents write them: ``-u alice:pw``,
        ``-ualice:pw``, ``-su alice:pw``, ``-sSLu alice:pw``, ``-kualice:pw``.  The
        bundle is read up to the first option that takes a value (``-sHu`` is
        ``-s`` and the header ``u``): -u/-U's value is the rest of the word or,
        when nothing follows, the next word."""
        value = word.value
        for index in range(1, len(value)):
            option = value[index]
            if option in "uU":
                if index + 1 == len(value):
                    self.pending = "user"
                    return None
                colon = value.find(":", index + 1)
                return None if colon < 0 else word.tail(colon + 1)
            if option in "dF":  # -d 'user=a&password=pw', -F password=pw
                kind = "form" if option == "d" else "multipart"
                if index + 1 == len(value):
                    self.pending = kind
                    return None
                return _form_password(word, index + 1, kind)
            if option in _CURL_VALUED_SHORT or not (option.isalnum() or option == "#"):
                return None
        return None


# curl's options whose value is form data: name=value&… (-d), one name=value
# taken whole (--data-urlencode "password=a b": its value is encoded, spaces,
# "&" and all), a multipart field (-F password=pw; @file and <file read one).
_CURL_FORM_OPTIONS: Final[Mapping[str, str]] = {
    "--data": "form",
    "--data-raw": "form",
    "--data-binary": "form",
    "--data-ascii": "form",
    "--data-urlencode": "urlencode",
    "--form": "multipart",
    "--form-string": "multipart",
}
# A form field's name that says its value is a credential: password, user[password],
# db_pass, api_key, token.
_FORM_KEY: Final = re.compile(
    rf"(?:[\w-]*\[)?(?:(?i:(?:[A-Za-z0-9]+[_-])*(?:{_ASSIGN_KEYS}|pass))"
    rf"|[A-Za-z0-9]*{_CAMEL_ASSIGN_KEYS})\]?"
)


def _form_password(word: _Word, offset: int, kind: str) -> _Found | None:
    """The credential in form data ``word.value[offset:]``: the value of the
    first field named like one, to the next "&" (urlencode's and a multipart
    field's to the word's end)."""
    value = word.value
    fields: list[tuple[int, int]] = []
    start = offset
    while kind == "form" and (end := value.find("&", start)) >= 0:
        fields.append((start, end))
        start = end + 1
    fields.append((start, len(value)))
    for start, end in fields:
        equals = value.find("=", start, end)
        if equals < 0 or not _FORM_KEY.fullmatch(value, start, equals):
            continue
        given = value[equals + 1 : end]
        if kind == "multipart" and given.startswith(("@", "<")):
            continue  # a file's content
        if _assigned_value(given):
            return word.part(equals + 1, end)
    return None


# Oracle's logon: user/pw, user/pw@db, userid=user/pw (not / alone, the OS's account).
_ORACLE_LOGON: Final = re.compile(r"(?i:userid=)?[A-Za-z_][\w$#]*/([^\s/@]+)(?:@\S*)?")
# impacket's target, [[domain/]user[:password]@]host: what comes before the
# password (which runs to the last "@": found with rfind, not by backtracking).
_IMPACKET_USER: Final = re.compile(r"(?:(?P<domain>[^\s/:@]+)/)?[^\s/:@]+:")


def _impacket_password(word: _Word) -> _Found | None:
    """The password in impacket's target: domain/user:pw@host, user:pw@host, and
    domain/user:pw alone (GetUserSPNs.py)."""
    value = word.value
    at = value.rfind("@")
    head = value if at < 0 else value[:at]
    user = _IMPACKET_USER.match(head)
    if user is None or at == len(value) - 1 or (at < 0 and user.group("domain") is None):
        return None
    return word.part(user.end(), len(head))


# vault login's flags that take no value.
_VAULT_BOOLEAN_FLAGS: Final = frozenset(
    ["no-print", "no-store", "non-interactive", "token-only", "tls-skip-verify", "no-color"]
)


# curl's short options that take a value: in a bundle (-sSLo FILE, -Hfoo) the
# rest of the word, or else the next word, is that value, never more options.
_CURL_VALUED_SHORT: Final = frozenset("abcdeEhmortuwxyzACDFHKPQTUXY")


# redis-cli's options that take a value: the first word that is neither is the command.
_REDIS_VALUED: Final = frozenset(
    [
        "-h",
        "-p",
        "-t",
        "-s",
        "-u",
        "-r",
        "-i",
        "-n",
        "-X",
        "-d",
        "-D",
        "--user",
        "--sni",
        "--cacert",
        "--cacertdir",
        "--tls-ciphers",
        "--tls-ciphersuites",
        "--cert",
        "--key",
        "--lru-test",
        "--rdb",
        "--functions-rdb",
        "--pipe-timeout",
        "--memkeys-samples",
        "--keystats-samples",
        "--pattern",
        "--count",
        "--quoted-pattern",
        "--intrinsic-latency",
        "--eval",
        "--cluster",
    ]
)
# redis's settings that are passwords: CONFIG SET requirepass PW.
_REDIS_PASSWORDS: Final = ("requirepass", "masterauth")
# openssl passwd's options that take a value (its other words are passwords).
_OPENSSL_PASSWD_VALUED: Final = frozenset(
    ["-salt", "-in", "-rand", "-writerand", "-provider", "-provider-path", "-propquery"]
)

# Tools some of whose positional words (no option's) a rule reads.
_POSITIONAL_TOOLS: Final = frozenset(
    {
        "sshpass",
        "htpasswd",
        "mysqladmin",
        "mysqlsh",
        "netuse",
        "netuser",
        "redis",
        "openssl",
        "slash_pass",
        "oracle",
        "rabbitmqctl",
        "vault",
        "impacket",
    }
)


# A tool's name in a long option's value, a bare word, names a container, an
# image, a host, not the program run: docker run --name mongo -p 27017:27017
# mongo:7 (read as the mongo shell, its port mapping was a password), --link
# mongo:db, --name=sqlcmd, "--name", "mongo" in an argv array.  A quoted value
# (--health-cmd "mysqladmin ping -p…") is a command line.  After a space, only
# an option whose name says it names something (_NAMING_OPTION) takes the tool's
# name as its value: any other is a flag before the program it runs (sudo
# --reset-timestamp mysql -p…, env --debug, strace --follow-forks: a list of
# such flags always missed one, and the password was no longer read).
_LONG_OPTION_BEFORE: Final = re.compile(
    r"--(?<![^\s\"'\[,]--)(?P<option>[A-Za-z][\w-]*)"
    r"(?:(?P<equals>=)|[ \t]+|(?P<item>[\"'])\s*,\s*[\"'])[^\s\"'=]*\Z"
)
# The rest of an argv item that is one bare word, to its closing quote.
_BARE_ITEM_REST: Final = re.compile(r"[^\s\"']*[\"']")
# Long options whose value names a container, a host, an image, a service, a
# database… (docker's, podman's, kubectl's, compose's): --name, --link,
# --hostname, --network-alias, --volumes-from, --container-name, --entrypoint.
_NAMING_OPTION: Final = re.compile(
    r"(?:[a-z0-9-]*-)?(?:name|hostname|host|image|container|service|alias|network|net|link|"
    r"links|tag|target|pod|app|database|db|dbname|namespace|context|cluster|project|from|"
    r"entrypoint|label|user|platform)",
    re.I,
)


# Wrappers that run a program (the tool after their flags), and their boolean
# flags named like naming options: flatpak-spawn --host, unshare --net, nsenter
# --net (--net=FILE takes one), bwrap --unshare-net, systemd-run --user.
_WRAPPER: Final = re.compile(
    r"(?<![\w.-])(?:flatpak-spawn|unshare|nsenter|bwrap|systemd-run|firejail)[\"']?[\s,]"
)
_WRAPPER_BOOLEAN: Final = re.compile(r"host|net|user|(?:unshare|share)-[a-z]+|net-[a-z]+", re.I)


def _names_an_option_value(text: str, match: re.Match[str]) -> bool:
    """Whether the tool's name ``match`` is in the value of the long option before it."""
    window = max(0, match.start() - 120)
    if text.find("--", window, match.start()) < 0:
        return False  # most tool names: no long option before them at all
    before = _LONG_OPTION_BEFORE.search(text, window, match.start())
    if before is None:
        return False
    if before.group("equals") is None:
        option = before.group("option")
        if not _NAMING_OPTION.fullmatch(option):
            return False
        if _WRAPPER_BOOLEAN.fullmatch(option) and _WRAPPER.search(text, window, before.start()):
            return False  # flatpak-spawn --host mysql …: a flag, then the program

    return before.group("item") is None or _BARE_ITEM_REST.match(text, match.end()) is not None


def _tool_of(match: re.Match[str]) -> str:
    return next(name for name, value in match.groupdict().items() if value is not None)


def _arguments_for(match: re.Match[str]) -> _ToolArguments:
    tool = _tool_of(match)
    return _ToolArguments(tool, match.group(tool).lower() if tool == "options" else "")


class _CommandScanner:
    """Every password given on a command line in ``text``, as source spans."""

    def __init__(self, text: str, lowered: str) -> None:
        self.text = text
        self.tools = [
            match
            for match in _tool_re_for(lowered).finditer(text)
            if match.lastgroup == "env" or not _names_an_option_value(text, match)
        ]
        self.tool_starts = [m.start() for m in self.tools]
        # A word that ends where a tool name ends names that tool (sudo -u x mysql …).
        # An assignment (SSHPASS=…) names no tool: its value is glued to it.
        self.tool_ending_at = {m.end(): m for m in self.tools if m.lastgroup != "env"}
        self.env_starting_at = {m.start(): m for m in self.tools if m.lastgroup == "env"}
        self.found: list[_Found] = []
        self.skip_to = 0
        self.skipped_tool: re.Match[str] | None = None

    def scan(self, low: int, high: int) -> None:
        """Read the commands whose tool name lies in ``text[low:high]``."""
        position = low
        index = bisect.bisect_left(self.tool_starts, low)
        while index < len(self.tools):
            match = self.tools[index]
            index += 1
            if match.end() > high:
                break
            if match.start() < position:
                continue  # read already, as a word of an earlier command
            arguments = _arguments_for(match)
            if _ARGV_START.match(self.text, match.end()):
                position = self._read_argv(match.end() + 1, high, arguments)
            else:
                in_sq_string = match.start() > 0 and self.text[match.start() - 1] == "'"
                position = self._read_words(match.end(), high, arguments, in_sq_string)

    def _take(self, arguments: _ToolArguments, word: _Word) -> _ToolArguments:
        if not word.where:
            return arguments
        tool = self.tool_ending_at.get(word.ends[-1])
        if tool is not None and not arguments.wants_value and self._names_tool(word, tool):
            self._finish(arguments)
            return _arguments_for(tool)
        env = self.env_starting_at.get(word.where[0])
        if env is not None and not arguments.wants_value:
            # SSHPASS=pw as a word of a command read already: its value is the rest.
            self._finish(arguments)
            arguments = _ToolArguments("env")
            name = len(env.group())
            word = _Word(word.chars[name:], word.where[name:], word.ends[name:])
        span = arguments.feed(word)
        if span is not None:
            self.found.append(span)
        return arguments

    def _finish(self, arguments: _ToolArguments) -> None:
        """The command ``arguments`` read has ended: a password held until then
        (redis-cli AUTH PW with no word after it) is one."""
        if arguments.held is not None:
            self.found.append(arguments.held)
            arguments.held = None

    def _names_tool(self, word: _Word, tool: re.Match[str]) -> bool:
        """``mysql``, ``/usr/bin/mysql``, ``"mysql"``, not ``.htpasswd`` or ``my-curl``."""
        before = tool.start() - 1
        at = bisect.bisect_left(word.where, before)
        inside = at < len(word.where) and word.where[at] == before
        return not inside or self.text[before] in "/\\&"

    def _nested(self, start: int, end: int) -> None:
        """A quoted string may hold a command of its own (bash -c '…', ssh host "…")."""
        first = bisect.bisect_left(self.tool_starts, start)
        if first < len(self.tools) and self.tools[first].end() <= end:
            self.scan(start, end)

    def _read_argv(self, position: int, high: int, arguments: _ToolArguments) -> int:
        """["mysql", "-uroot", "-pS3cr3t"]: each item is one word."""
        for _ in range(256):
            item = _ARGV_ITEM.match(self.text, position, high)
            if item is None:
                break
            group = 1 if item.group(1) is not None else 2
            start, end = item.span(group)
            self._nested(start, end)
            word = _Word([], [], [])
            word.add(self.text[start:end], start)
            arguments = self._take(arguments, word)
            position = item.end()
        self._finish(arguments)
        return position

    def _skippable(self, position: int, high: int, arguments: _ToolArguments) -> bool:
        """Whether the word at ``position`` cannot matter: no rule reads it (it is
        no option, no option's value), it names no tool and holds none.  Such a
        word is passed over with one regex match (``skip_to``) instead of being
        read piece by piece: a long JSON log is mostly such words."""
        text = self.text
        if arguments.wants_value or arguments.tool in _POSITIONAL_TOOLS:
            return False
        if text[position] in "-\"'":
            return False
        whole = _SHELL_WORD.match(text, position, high)
        if whole is None:
            return False
        end = whole.end()
        if end < high and text[end] == "\\":
            return False
        # A word ending in a tool's name ("command":"curl in a JSON log) names
        # it when the name starts the word or follows a quote or a path.
        named = self.tool_ending_at.get(end) or self.tool_ending_at.get(end - 1)
        if named is not None and not (
            named.start() == position or text[named.start() - 1] in "\"'/\\&"
        ):
            return False
        inside = bisect.bisect_left(self.tool_starts, position)
        nested = inside < len(self.tools) and self.tools[inside] is not named
        if nested and self.tool_starts[inside] < end:
            return False
        self.skip_to = end
        self.skipped_tool = named
        return True

    def _read_words(
        self, position: int, high: int, arguments: _ToolArguments, in_sq_string: bool
    ) -> int:
        text = self.text
        limit = min(high, position + _COMMAND_WINDOW)
        word = _Word([], [], [])
        # The word after < or > is a redirection's file, no argument: read as
        # one, openssl passwd -stdin < pw.txt gave "pw.txt" as a password.
        redirect = False
        while position < limit:
            if not word.where and self._skippable(position, high, arguments):
                position = self.skip_to
                redirect = False
                if self.skipped_tool is not None:
                    self._finish(arguments)
                    arguments = _arguments_for(self.skipped_tool)
                    limit = min(high, position + _COMMAND_WINDOW)
                continue
            piece = _SHELL_PIECE.match(text, position, high)
            if piece is None:
                break
            kind = piece.lastgroup
            if kind == "end" and text[position] == "`" and text[position - 1] in " \t":
                # PowerShell's continuation goes on with the command (a code span's
                # closing backtick, `vault login`, follows no space: it ends it).
                continued = _POWERSHELL_CONTINUATION.match(text, position, high)
                if continued is not None:
                    piece, kind = continued, "cont"
            if kind == "string_end" and text[position] == "'" and not in_sq_string:
                piece = _SQ_PART.match(text, position, high)
                assert piece is not None  # its "stray" takes the quote alone
                kind = piece.lastgroup
            if kind in ("plain", "sq"):
                start, end = piece.span(kind)
                word.add(text[start:end], start)
                if kind == "sq":
                    self._nested(start, end)
            elif kind == "dq":
                start, end = piece.span(kind)
                content = text[start:end]
                if "\\" in content:
                    offset = start
                    for part in re.split(r"(\\.)", content):
                        if _DQ_ESCAPE.fullmatch(part):
                            word.add_escaped(part[1], offset, offset + 2)
                        else:
                            word.add(part, offset)
                        offset += len(part)
                else:
                    word.add(content, start)
                self._nested(start, end)
            elif kind == "escaped":
                word.add_escaped(piece.group(kind), piece.start(), piece.end())
            else:
                before = arguments
                if redirect and word.where:
                    redirect = False
                elif kind == "sep" and text[position] in "<>" and _FD.fullmatch(word.value):
                    pass  # 2>&1, 1>nul: the digits are the redirection's descriptor
                else:
                    arguments = self._take(arguments, word)
                redirect = redirect or (kind == "sep" and text[position] in "<>")
                word = _Word([], [], [])
                if arguments is not before:
                    limit = min(high, piece.end() + _COMMAND_WINDOW)
                if kind in ("end", "string_end"):
                    self._finish(arguments)
                    return piece.end()
            position = piece.end()
        self._finish(arguments if redirect else self._take(arguments, word))
        return position


def _command_password_spans(text: str, lowered: str) -> Iterable[Span]:
    if not any(hint in lowered for hint in _COMMAND_HINTS):
        return
    scanner = _CommandScanner(text, lowered)
    scanner.scan(0, len(text))
    for start, end, value in scanner.found:
        yield Span(start, end, "password", shown=None if value == text[start:end] else value)


# PowerShell's string: quoted (a quote JSON escaped, \", is no quote of its own:
# the value is found where the escapes are undone) or, after the cmdlet, a bare word.
_PS_QUOTED: Final = r"(?<!\\)\"[^\"\n]{1,200}?(?<!\\)\"|(?<!\\)'[^'\n]{1,200}'"
_PS_BARE: Final = r"[^\s\"'$|;()`\\-][^\s\"'|;()`\\]{0,199}"
_SECURE_STRING: Final = r"(?i:\bConvertTo-SecureString)"


# A SQL string literal ('' is a quote inside it); one whose closing quote was
# cut off (a line clipped by an extract) still is one.
_SQL_STRING: Final = r"'(?:[^'\n]|''){1,200}(?:'|(?=\n)|\Z)|\"[^\"\n]{1,200}(?:\"|(?=\n)|\Z)"


# What comes before SQL's PASSWORD 'pw': CREATE ROLE app WITH LOGIN PASSWORD,
# ALTER USER app PASSWORD, IDENTIFIED BY PASSWORD (MySQL's old hash).
_SQL_BEFORE_PASSWORD: Final = re.compile(
    r"(?i:\b(?:login|with|encrypted|unencrypted|identified\s+by|(?:user|role)\s+[\w\"'.@-]+)\s+)\Z"
)


def _sql_password(match: re.Match[str]) -> bool:
    start = match.start()
    return _SQL_BEFORE_PASSWORD.search(match.string, max(0, start - 120), start) is not None


# What stands before redis-cli's ">" (cliRefreshPrompt in redis-cli.c): host:port,
# [ipv6]:port, or "redis /path.sock" when connected over a unix socket (-s), and
# old versions' "redis " before host:port; then a database's [n] and, in MULTI,
# "(TX)".
_REDIS_PROMPT: Final = re.compile(
    r"(?<![\w.:\[\]-])(?:(?:redis[ \t]+)?(?:[\w.-]+|\[[0-9A-Fa-f:.]+\]):\d{1,5}"
    r"|redis[ \t]+/[^\s>]{1,200})(?:\[\d{1,5}\])?(?:\(TX\))?\Z"
)


def _after_redis_prompt(match: re.Match[str]) -> bool:
    start = match.start()
    return _REDIS_PROMPT.search(match.string, max(0, start - 240), start) is not None


def _starts_a_key(match: re.Match[str]) -> bool:
    """The key is no tail of a longer word (``_B``, tested after a match: as the
    pattern's start its lookbehinds ran at every position of the text)."""
    return _KEY_START.match(match.string, match.start()) is not None


_KEY_START: Final = re.compile(_B)


def _basic_credentials(candidate: str) -> bool:
    """Basic's value is base64 of ``user:password``: "Authorization: Basic
    authentication is required" names the scheme, it gives no credentials."""
    try:
        decoded = base64.b64decode(candidate + "=" * (-len(candidate) % 4), validate=True)
    except ValueError:
        return False
    return b":" in decoded


def _secure_string_value(candidate: str) -> bool:
    return _command_value(candidate.strip("\"'"))


def _as_plain_text(match: re.Match[str]) -> bool:
    """Only with -AsPlainText is ConvertTo-SecureString's string a password as
    written (without it, an encrypted standard string): the switch may come
    before or after the string, within the statement."""
    if "-asplaintext" in match.group(0).lower():
        return True
    rest = match.string[match.end() : match.end() + 300]
    return re.match(r"[^\n;|]*?-AsPlainText\b", rest, re.I) is not None


_MEMD_RULES: Final[tuple[Rule, ...]] = (
    # Private keys: the whole block or, when unterminated (a cut tool output), its
    # base64 and header lines, also when quoted (``> ``) in a prompt.
    Rule(
        "private_key",
        _rx(
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
            r"(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
            r"|(?:\r?\n[> \t]*(?:[A-Za-z0-9+/=]{4,}|[A-Za-z-]+: [^\n]*)[ \t]*(?=\r?\n|$))*)",
            re.DOTALL,
        ),
        hints=("private key",),
    ),
    Rule(
        "private_key",
        _rx(r"PuTTY-User-Key-File-\d: .*?Private-MAC: [0-9a-f]+", re.DOTALL),
        hints=("putty",),
    ),
    Rule("anthropic_api_key", _rx(_B + r"sk-ant-[A-Za-z0-9_-]{20,}"), hints=("sk-ant-",)),
    Rule(
        "openai_api_key",
        _rx(_B + r"sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_-]{20,}"),
        hints=("sk-",),
    ),
    Rule(
        "openai_api_key",
        _rx(_B + r"sk-[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}" + _E),
        hints=("sk-",),
    ),
    Rule("openai_api_key", _rx(_B + r"sk-[A-Za-z0-9]{32,}" + _E), hints=("sk-",)),
    Rule("github_token", _rx(_B + r"github_pat_[A-Za-z0-9_]{40,}"), hints=("github_pat_",)),
    Rule("github_token", _rx(_B + r"gh[pousr]_[A-Za-z0-9]{30,}" + _E), hints=("gh",)),
    Rule("slack_token", _rx(_B + r"xox[abposre]-(?:\d+-)?[A-Za-z0-9-]{10,}"), hints=("xox",)),
    Rule("slack_token", _rx(_B + r"xapp-\d-[A-Za-z0-9-]{10,}"), hints=("xapp-",)),
    Rule(
        "stripe_key",
        _rx(_B + r"(?:sk|rk)_(?:live|test)_[0-9a-zA-Z]{16,}"),
        hints=("_live_", "_test_"),
    ),
    Rule("stripe_key", _rx(_B + r"whsec_[0-9a-zA-Z]{24,}"), hints=("whsec_",)),
    Rule("google_api_key", _rx(_B + r"AIza[0-9A-Za-z_-]{35}" + _E), hints=("aiza",)),
    Rule("google_oauth_token", _rx(_B + r"ya29\.[0-9A-Za-z_-]{20,}"), hints=("ya29.",)),
    Rule("huggingface_token", _rx(_B + r"hf_[A-Za-z0-9]{30,}" + _E), hints=("hf_",)),
    Rule("npm_token", _rx(_B + r"npm_[A-Za-z0-9]{36}" + _E), hints=("npm_",)),
    Rule("groq_api_key", _rx(_B + r"gsk_[A-Za-z0-9]{40,}" + _E), hints=("gsk_",)),
    Rule("xai_api_key", _rx(_B + r"xai-[A-Za-z0-9]{60,}" + _E), hints=("xai-",)),
    Rule("digitalocean_token", _rx(_B + r"do[por]_v1_[a-f0-9]{64}" + _E), hints=("_v1_",)),
    Rule("shopify_token", _rx(_B + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _E), hints=("shp",)),
    Rule("databricks_token", _rx(_B + r"dapi[a-f0-9]{32}(?:-\d)?" + _E), hints=("dapi",)),
    Rule(
        "jwt",
        _rx(_B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}" + _E),
        hints=("eyj",),
    ),
    Rule(
        "aws_secret_key",
        _rx(
            r"(?i:aws|secret[_ -]?access[_ -]?key)[\w \-\"'`*]{0,30}?(?::|=|=>|\bis\b)\s*[\"'`*]*"
            r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
        ),
        group=1,
        validate=_mixed_case,
        hints=("aws", "secret"),
    ),
    Rule(
        "bearer_token",
        _rx(r"(?i:\b(?:bearer|token)\s+)([A-Za-z0-9._~+/-]{16,}=*)(?![A-Za-z0-9._~+/=-])"),
        group=1,
        validate=lambda value: any(c.isdigit() for c in value),
        hints=("bearer", "token"),
    ),
    # Authorization: Basic …, also as JSON, a Python dict, quoted YAML
    # ("Authorization": "Basic …") and a HAR header ("name": "Authorization",
    # "value": "Basic …").
    Rule(
        "basic_auth",
        _rx(
            r"(?i:authorization[\"']?\s*(?:[:=]|,\s*[\"']?value[\"']?\s*:)\s*[\"']?basic\s+)"
            r"([A-Za-z0-9+/]{8,}=*)"
        ),
        group=1,
        validate=_basic_credentials,
        hints=("basic",),
    ),
    # scheme://user:password@host, and scheme://:password@host (Redis's own
    # documented form has no user name); see URL_USERINFO.
    Rule(
        "url_password",
        _rx(rf"[a-zA-Z][a-zA-Z0-9+.-]{{0,31}}://{URL_USERINFO}[^\s/?#@\"'<>`]+"),
        group=2,
        validate=lambda value: not value.startswith("[REDACTED"),
        hints=("://",),
    ),
    # PowerShell's ConvertTo-SecureString "pw" -AsPlainText, "pw" | ConvertTo-SecureString …
    Rule(
        "password",
        _rx(
            _SECURE_STRING
            + r"(?:\s+-(?i:AsPlainText|Force)(?::\$?\w+)?)*\s+(?:-(?i:String)\s+)?"
            + rf"({_PS_QUOTED}|{_PS_BARE})"
        ),
        group=1,
        validate=_secure_string_value,
        validate_match=_as_plain_text,
        hints=("convertto-securestring",),
    ),
    Rule(
        "password",
        _rx(rf"({_PS_QUOTED})\s*\|\s*" + _SECURE_STRING + r"\b"),
        group=1,
        validate=_secure_string_value,
        validate_match=_as_plain_text,
        hints=("convertto-securestring",),
    ),
    # <password>…</password> (Maven's settings.xml, a SOAP body, app.config).
    Rule(
        "password",
        _rx(rf"<(?:[\w-]+:)?(?i:{_ASSIGN_KEYS}|pass)>([^<>\n]{{4,200}})</"),
        group=1,
        validate=_assigned_value,
        hints=("pass", "pwd", "secret", "token", "key", "credential"),
    ),
    # (The rules below open with a character class, not (?i:\b…): the regex
    # engine then skips to the candidates instead of trying every position.)
    # SQL: CREATE USER … IDENTIFIED BY 'pw' (Oracle's bare pw after a user's
    # name), CREATE ROLE … WITH LOGIN PASSWORD 'pw', ALTER USER … PASSWORD 'pw'.
    Rule(
        "password",
        _rx(r"[Ii](?<![\w][Ii])" + rf"(?i:dentified\s+by\s+)({_SQL_STRING})"),
        group=1,
        validate=_assigned_value,
        hints=("identified",),
    ),
    Rule(
        "password",
        _rx(rf"(?i:password)\s+({_SQL_STRING})"),
        group=1,
        validate=_assigned_value,
        validate_match=_sql_password,
        hints=("password",),
    ),
    Rule(
        "password",
        _rx(
            r"[CcAa](?<![\w][CcAa])(?i:(?:(?<=[Cc])reate|(?<=[Aa])lter)\s+user\s+"
            r"[\w\"'.@-]+\s+identified\s+by\s+)"
            r"(?!(?i:values|password|externally|globally)\b)([^\s;'\"]+)"
        ),
        group=1,
        validate=_assigned_value,
        hints=("identified",),
    ),
    # redis-cli's interactive prompt in a transcript: 127.0.0.1:6379> AUTH [USER] PW
    # (also [::1]:6379[2]>, "redis host:port>", "redis /tmp/redis.sock>", a
    # MULTI's "(TX)>"), and CONFIG SET requirepass PW.
    Rule(
        "password",
        _rx(
            r">(?:(?<=\w>)|(?<=\]>)|(?<=\)>))[ \t]*"
            r"(?i:auth[ \t]+(?:[^\s\"'>]{1,200}[ \t]+)?"
            r"|config[ \t]+set[ \t]+(?:requirepass|masterauth)[ \t]+)"
            # (A bare one does not run into a JSON string's escaped newline.)
            r"(\"(?:[^\"\\\n]|\\.){1,200}\"|'[^'\n]{1,200}'|(?:[^\s\"'\\]|\\[^nr]){1,200})"
            r"[ \t]*(?=[\r\n]|\\[nr]|\Z)"
        ),
        group=1,
        validate=_secure_string_value,
        validate_match=_after_redis_prompt,
        hints=("auth", "requirepass", "masterauth"),
    ),
    # npm's registry credentials: //registry/:_authToken=X (.npmrc) or, given to
    # npm config set, after a space; _auth and _password are base64.
    Rule(
        "password",
        _rx(r":_(?:authToken|auth|password)(?:[ \t]*=[ \t]*|[ \t]+)([^\s\"'`]{4,400})"),
        group=1,
        validate=_assigned_value,
        hints=(":_auth", ":_password"),
    ),
    # aws configure set aws_secret_access_key KEY (no "=" nor ":").
    Rule(
        "aws_secret_key",
        _rx(
            r"[Aa](?i:ws_secret_access_key|ws_session_token)[ \t]+"
            r"([A-Za-z0-9/+]{20,1024}=*)(?![A-Za-z0-9/+=])"
        ),
        group=1,
        validate=_mixed_case,
        hints=("aws_s",),
    ),
    # A password piped into a tool that reads it from its input:
    # echo PW | sudo -S …, echo PW | docker login --password-stdin.
    Rule(
        "password",
        _rx(
            r"[EePp](?<![\w][EePp])(?i:(?:(?<=[Ee])cho|(?<=[Pp])rintf)\s+(?:-[neE]+\s+)?)"
            r"('[^'\n]{1,200}'|\"[^\"\n]{1,200}\"|[^\s|;&'\"]{1,200})\s*\|\s*"
            r"(?:sudo\s+(?:-[^\sS]+\s+(?:[^\s-]\S*\s+)?)*-[A-Za-z]*S\b|[^|;\n]*--password-stdin\b)"
        ),
        group=1,
        validate=_assigned_value,
        hints=("sudo", "password-stdin"),
    ),
    # A form or query string's pass=pw (curl -d 'user=a&pass=pw'), and a
    # password=pw %-encoded (a redirect URL inside another: password%3Dpw).
    Rule(
        "password",
        _rx(
            r"[?&'\"](?:(?<=[?&])|(?<=-d ['\"])|(?<=--data ['\"]))"
            r"(?i:pass|passwd|pwd|password)=([^&\s\"'#]{4,200})"
        ),
        group=1,
        validate=_assigned_value,
        hints=("pass", "pwd"),
    ),
    Rule(
        "password",
        _rx(rf"(?i:(?:{_ASSIGN_KEYS}|pass)%3D)((?:(?!%26)[^\s\"'&,;)}}\]#]){{4,200}})"),
        group=1,
        validate=_assigned_value,
        validate_match=_starts_a_key,
        hints=("%3d",),
    ),
    # password=…, "api_key": "…", SECRET_KEY: …, export GITHUB_TOKEN=…
    Rule(
        "password",
        _rx(
            rf"(?:(?i:\b(?:[A-Z0-9]+_)*(?:{_ASSIGN_KEYS})\b)|{_ENV_ASSIGN_KEYS}|{_CAMEL_ASSIGN_KEYS})"
            + _ASSIGNED
        ),
        group=1,
        validate=_assigned_value,
        hints=("pass", "pwd", "secret", "token", "key", "credential"),
    ),
    # SMTP_PASS=…, ADMIN_PW: …  (DB_PASS=postgres: see _ENV_SHORT_KEY)
    Rule(
        "password",
        _rx(_ENV_SHORT_KEY + _SHORT_KEY_ASSIGNED),
        group=2,  # "value"
        validate_match=_short_pass_assignment,
        hints=("_pass", "_pw", "sshpass", "rediscli_auth", "smbpass", "pgpassword"),
    ),
    Rule(
        "password",
        _rx(_ENV_ACCOUNT_KEY + _ASSIGNED),
        group=1,
        validate=_assigned_value,
        hints=("_pass", "_pw"),
    ),
    Rule(
        "password",
        _rx(
            r"(?i:\b(?:pass(?:word|phrase)|api[ _-]?key|secret[ _-]?key|access[ _-]?token|"
            r"auth[ _-]?token)\s+(?:is|was|=)\s*:?\s*)([^\s\"']{4,100}?)(?=[.,;!?]?(?:\s|$))"
        ),
        group=1,
        validate=_spoken_password,
        hints=("pass", "key", "token"),
    ),
)

_PII_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        "email",
        # Not a URL's user name (postgresql://app@db.internal, ssh://git@host) nor a
        # git remote's (git@github.com:org/repo.git): service accounts, not a person's
        # address, and a DSN with a placeholder in its middle is no use to a summary.
        # A mailto: address is still one.
        _rx(
            r"(?<![\w.+-])(?<!://)[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
            r"\.[A-Za-z]{2,24}\b(?!:[\w~./-])"
        ),
        "pii",
        hints=("@",),
    ),
    Rule(
        "card_number",
        _rx(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])"),
        "pii",
        validate=_card_number,
    ),
    Rule("us_ssn", _rx(r"(?<![\d-])\d{3}-\d{2}-\d{4}(?![\d-])"), "pii", validate=_us_ssn),
    Rule(
        "uk_national_insurance",
        _rx(r"\b[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"),
        "pii",
    ),
    Rule(
        "iban",
        _rx(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b"),
        "pii",
        validate=_iban,
    ),
    # +1 415 555 0132, +44 20 7946 0958, (415) 555-0132, 415-555-0132, 415.555.0132
    Rule(
        "phone_number",
        _rx(
            r"(?<![\w+.-])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]\d{2,4}){1,4}"
            r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}|\d{3}[.-]\d{3}[.-]\d{4})(?![\w.-]*\d)"
        ),
        "pii",
        validate=lambda value: 8 <= sum(c.isdigit() for c in value) <= 15,
    ),
)

# detect-secrets plugins whose patterns are precise enough for free text.
_DETECT_SECRETS_PLUGINS: Final = (
    ("aws", "AWSKeyDetector", "aws_access_key", (0,), ("akia", "asia", "abia", "acca", "a3t")),
    ("github_token", "GitHubTokenDetector", "github_token", None, ("gh",)),
    ("gitlab_token", "GitLabTokenDetector", "gitlab_token", None, ("gl", "gr1348941")),
    ("slack", "SlackDetector", "slack_webhook", (1,), ("hooks.slack.com",)),
    ("stripe", "StripeDetector", "stripe_key", None, ("k_live_",)),
    ("openai", "OpenAIDetector", "openai_api_key", None, ("t3blbkfj",)),
    ("sendgrid", "SendGridDetector", "sendgrid_api_key", None, ("sg.",)),
    ("twilio", "TwilioKeyDetector", "twilio_api_key", None, ("ac", "sk")),
    ("pypi_token", "PypiTokenDetector", "pypi_token", None, ("pypi-",)),
    ("square_oauth", "SquareOAuthDetector", "square_oauth_secret", None, ("sq0csp-",)),
    ("azure_storage_key", "AzureStorageKeyDetector", "azure_storage_key", None, ("accountkey=",)),
    ("telegram_token", "TelegramBotTokenDetector", "telegram_bot_token", None, (":",)),
    ("discord", "DiscordBotTokenDetector", "discord_bot_token", None, (".",)),
    ("mailchimp", "MailchimpDetector", "mailchimp_api_key", None, ("-us",)),
)


@functools.cache
def _detect_secrets_rules() -> tuple[Rule, ...]:
    """The chosen detect-secrets plugins' compiled patterns (imported once, lazily)."""
    import importlib

    rules: list[Rule] = []
    for module_name, class_name, kind, indexes, hints in _DETECT_SECRETS_PLUGINS:
        module = importlib.import_module(f"detect_secrets.plugins.{module_name}")
        patterns = list(getattr(module, class_name).denylist)
        for index, pattern in enumerate(patterns):
            if indexes is not None and index not in indexes:
                continue
            group = 1 if pattern.groups else 0
            rules.append(Rule(kind, pattern, group=group, extend=True, hints=hints))
    return tuple(rules)


@functools.cache
def compile_user_patterns(patterns: tuple[tuple[str, str], ...]) -> tuple[Rule, ...]:
    """``[privacy] patterns`` (name -> regex) as rules; the whole match is the secret."""
    rules = []
    for name, pattern in patterns:
        kind = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "custom"
        rules.append(Rule(kind, re.compile(pattern)))
    return tuple(rules)


def _spans_of(text: str, rules: Iterable[Rule]) -> Iterable[Span]:
    lowered = text.lower()
    for rule in rules:
        if rule.hints and not any(hint in lowered for hint in rule.hints):
            continue
        for match in rule.pattern.finditer(text):
            start, end = match.span(rule.group)
            if start < 0 or end <= start:
                continue
            value = text[start:end]
            if rule.validate is not None and not rule.validate(value):
                continue
            if rule.validate_match is not None and not rule.validate_match(match):
                continue
            if rule.extend:
                while end < len(text) and text[end] in _TOKEN_CHARS:
                    end += 1
            # A value read up to an escaped quote (password=pw\" in a JSON string,
            # \\\" a level deeper) stops before the escape: taken, its backslashes
            # left the quote bare in the redacted text and broke the JSON.
            if end < len(text) and text[end] in "\"'":
                while end > start and text[end - 1] == "\\":
                    end -= 1
                if end == start:
                    continue
            if end - start >= 2 and text[start] in "\"'`" and text[end - 1] == text[start]:
                start, end = start + 1, end - 1
            yield Span(start, end, rule.kind, rule.category)
    yield from _command_password_spans(text, lowered)


def _merged(ranges: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Sorted ``(start, end)`` ranges as the starts and ends of their union's
    disjoint pieces (overlapping ones joined), for ``_overlaps`` and ``_inside``."""
    starts: list[int] = []
    ends: list[int] = []
    for start, end in ranges:
        if ends and start < ends[-1]:
            ends[-1] = max(ends[-1], end)
        else:
            starts.append(start)
            ends.append(end)
    return starts, ends


def _overlaps(merged: tuple[list[int], list[int]], span: Span) -> bool:
    """Whether ``span`` shares a character with the union of the merged ranges:
    only the last piece starting before the span ends can (the pieces are
    disjoint, so their ends ascend with their starts)."""
    starts, ends = merged
    at = bisect.bisect_left(starts, span.end) - 1
    return at >= 0 and ends[at] > span.start


def _inside(merged: tuple[list[int], list[int]], span: Span) -> bool:
    """Whether ``span`` lies within one piece of the merged ranges."""
    starts, ends = merged
    at = bisect.bisect_right(starts, span.start) - 1
    return at >= 0 and span.end <= ends[at]


def _without_overlaps(spans: Iterable[Span]) -> list[Span]:
    """Earliest first; overlapping spans merge under the first one's kind.

    PII that overlaps a credential is dropped first: in
    ``postgres://app:pw@db.example.com`` the password is the secret, not an
    "email" running from the password to the host.  Each candidate is looked up
    among the credentials' sorted union, not tested against every credential:
    a log of thousands of e-mail addresses beside thousands of tokens was
    quadratic (1.1 MB: 16 s).
    """
    candidates = list(spans)
    covered = _merged(sorted((s.start, s.end) for s in candidates if s.category == "credential"))
    candidates = [s for s in candidates if s.category == "credential" or not _overlaps(covered, s)]
    ordered = sorted(candidates, key=lambda s: (s.start, -(s.end - s.start)))
    kept: list[Span] = []
    for span in ordered:
        if kept and span.start < kept[-1].end:
            if span.end > kept[-1].end:
                previous = kept[-1]
                kept[-1] = Span(previous.start, span.end, previous.kind, previous.category)
            continue
        kept.append(span)
    return kept


# A JSON string held inside another (a tool result whose value is itself JSON, an
# HTTP body) reaches memory as {\"password\": \"…\"}, and encoders may write
# "/" as "\/": the assignment rules read quotes and slashes, so such text is also
# scanned with those escapes undone, and what is found there is mapped back.
_JSON_ESCAPE: Final = re.compile(r'\\(["/\\])')


def _unescaped_view(text: str) -> tuple[str, list[int]] | None:
    """``text`` with ``\\"``, ``\\/`` and ``\\\\`` undone, and where in the view each
    undone escape sits (ascending); None when there is nothing to undo."""
    if '\\"' not in text and "\\/" not in text:
        return None
    escapes: list[int] = []

    def undo(match: re.Match[str]) -> str:
        # Each earlier escape made the view one character shorter.
        escapes.append(match.start() - len(escapes))
        return match.group(1)

    return _JSON_ESCAPE.sub(undo, text), escapes


# How many times escapes are undone: a tool call's arguments are a JSON string
# (OpenAI-style calls), held in a JSON log line, held in a JSON tool result.
_ESCAPE_LEVELS: Final = 3


def _spans_with_escapes_undone(text: str, rules: Sequence[Rule]) -> Iterable[Span]:
    """Spans in ``text`` and in its views with one, two, three levels of JSON
    escapes undone: ``-p\\\\\\"pw\\\\\\"`` in a JSON string inside a JSON string is
    ``-p"pw"`` only two levels down."""
    yield from _spans_of(text, rules)
    view = text
    # Each view and its undone escapes, shallowest first.
    levels: list[tuple[str, list[int]]] = []
    for _ in range(_ESCAPE_LEVELS):
        unescaped = _unescaped_view(view)
        if unescaped is None:
            return
        view = unescaped[0]
        levels.append(unescaped)
        for span in _spans_of(view, rules):
            start, end = span.start, span.end
            shown = span.shown
            for level_view, undone in reversed(levels):
                cut = _within_escaped_string(level_view, undone, start, end)
                if cut != end:
                    shown = None  # what was read on past the string is no password
                end = cut
                # A view character's source starts after one extra character per
                # escape before it, its backslash included when it is an escape itself.
                start += bisect.bisect_left(undone, start)
                end += bisect.bisect_left(undone, end)
            if start < end:
                yield Span(start, end, span.kind, span.category, shown)


def _within_escaped_string(view: str, undone: list[int], start: int, end: int) -> int:
    """Where a span found in ``view`` ends so as to stay inside the escaped string
    it was found in.  A quote that was no escape is that string's own end one
    level up, so a span over one read on past it: ``bash -c \\"mysql -pS3cr3t\\""}``
    or ``{\\"a\\": \\"mysql -pS3cr3t\\"}"}`` read ``-pS3cr3t""}`` and
    ``-pS3cr3t"}"}`` as one word in the view.  Which of its quotes are the
    password's own cannot be told then, and the first one is where the
    string's reading went wrong: the span ends there.  Escaped quotes that
    close the span are left out too (they belong to the JSON around it)."""

    def was_escaped(position: int) -> bool:
        at = bisect.bisect_left(undone, position)
        return at < len(undone) and undone[at] == position

    first_quote = quote = view.find('"', start, end)
    while quote >= 0:
        if not was_escaped(quote):
            return first_quote
        quote = view.find('"', quote + 1, end)
    while end > start and view[end - 1] == '"' and was_escaped(end - 1):
        end -= 1
    return end


def _placeholder_ranges(text: str) -> list[tuple[int, int]]:
    return [match.span() for match in PLACEHOLDER_RE.finditer(text)]


def find_secrets(
    text: str,
    *,
    pii: bool = False,
    user_patterns: Mapping[str, str] | Sequence[tuple[str, str]] = (),
) -> list[Span]:
    """Every credential (and, with ``pii``, personal data) in ``text``, in order, disjoint.

    Placeholders left by an earlier redaction are never reported again.
    """
    if not text:
        return []
    pairs = tuple(user_patterns.items() if isinstance(user_patterns, Mapping) else user_patterns)
    rules: list[Rule] = [
        *_MEMD_RULES,
        *_detect_secrets_rules(),
        *compile_user_patterns(pairs),
    ]
    if pii:
        rules += _PII_RULES
    found = _spans_with_escapes_undone(text, rules)
    placeholders = _placeholder_ranges(text)
    if placeholders:
        merged = _merged(placeholders)
        found = (span for span in found if not _inside(merged, span))
    return _without_overlaps(found)


# Where a value is a credential by what stands near it, not by its shape (a
# value found by its shape, sk-ant-…, ghp_…, a JWT, is one wherever it stands):
# the rules' keys (_ASSIGN_KEYS; "pass" holds _ENV_ASSIGN_KEYS' and the short
# keys' PASS, PASSWORD and PASSWD, "pwd" MYSQL_PWD) before a separator, an XML
# tag's end, %3D or a HAR header's ","; the words read before a space (Bearer …,
# token …, PASSWORD '…', the password is …, IDENTIFIED BY …, AWS … is …, secret
# access key …); echo … | sudo -S, --password-stdin and "…" |
# ConvertTo-SecureString, whose value comes before; a private key's header (its
# block follows).  Tools given a password are _TOOL_RE's.
_CONTEXT_RE: Final = re.compile(
    rf"(?i:(?:{_ASSIGN_KEYS}|pass|pwd|_pw|aws|authorization|rediscli_auth)"
    r"[\w.-]{0,40}?[\\\"'`*\]]*\s*(?::|=|%3d|>|,)"
    r"|(?:bearer|token|pass(?:word|phrase)?|identified|aws|secret|api[ _-]?key)\s"
    r"|sudo|securestring|password-stdin|>\s*auth\s|(?P<block>private key|putty-user-key-file))"
)
# What every match of _CONTEXT_RE holds, lower-cased: found by a plain search
# (most text holds none), and only around them is the pattern run.
_CONTEXT_LITERALS: Final = (
    *("pass", "pwd", "_pw", "secret", "token", "api_key", "api-key", "apikey", "private_key"),
    # A key name spelled with a space, and private[_-]?key's bare form (_ASSIGN_KEYS).
    *("api key", "privatekey"),
    *("private-key", "credential", "aws", "authorization", "rediscli_auth", "bearer"),
    *("identified", "sudo", "securestring", "private key", "putty-user-key-file"),
    "> auth",  # redis-cli's prompt: 127.0.0.1:6379> AUTH [USER] PW
)
# How far a match may reach from the literal inside it.
_CONTEXT_REACH: Final = 64
# How far from such a word its value may be: a key, its separator and a value of
# up to 200 characters after it; echo's value before "| sudo -S" and SQL's
# "CREATE USER x" before PASSWORD; a tool's password up to _COMMAND_WINDOW after
# its name; a private key's block (8192-bit RSA: ~6.4 KB) after its header.
_CONTEXT_BEFORE: Final = 256
_CONTEXT_AFTER: Final = 320
_BLOCK_AFTER: Final = 16_384


def _literals_re(literals: Iterable[str]) -> re.Pattern[str]:
    return re.compile("|".join(map(re.escape, sorted(literals, key=len, reverse=True))))


_CONTEXT_LITERALS_RE: Final = _literals_re(_CONTEXT_LITERALS)
_COMMAND_HINTS_RE: Final = _literals_re(_COMMAND_HINTS)
# Either: one search tells most text apart.
_ANY_LITERAL_RE: Final = _literals_re({*_CONTEXT_LITERALS, *_COMMAND_HINTS})


def _literal_ranges(lowered: str, literals: re.Pattern[str], reach: int) -> list[tuple[int, int]]:
    """Where in ``lowered`` the ``literals`` stand, ``reach`` characters either
    side, joined where they overlap (in order, disjoint)."""
    first = literals.search(lowered)
    if first is None:
        return []
    starts: list[int] = []
    ends: list[int] = []
    for match in literals.finditer(lowered, first.start()):
        start, end = max(0, match.start() - reach), match.end() + reach
        if ends and start <= ends[-1]:
            ends[-1] = end
        else:
            starts.append(start)
            ends.append(end)
    return list(zip(starts, ends, strict=True))


def context_windows(text: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The parts of ``text`` around what makes a value near it a credential (each
    list in order, disjoint): a key or word of :data:`_CONTEXT_RE`, where
    :func:`find_secrets` is to be run, and a tool given a password, where its
    command scanner is.  Found by a plain search for literals (most text holds
    none), the patterns run only around them: linear in ``text``."""
    lowered = text.lower()
    if _ANY_LITERAL_RE.search(lowered) is None:
        return [], []
    if len(lowered) != len(text):
        # A letter whose lower case is longer ("İ"): places in the lower-cased
        # text are not the text's.  Rare: all of it.
        whole = [(0, len(text))]
        return whole, whole
    keys: list[tuple[int, int]] = []
    for start, end in _literal_ranges(lowered, _CONTEXT_LITERALS_RE, _CONTEXT_REACH):
        for match in _CONTEXT_RE.finditer(text, start, end):
            after = _BLOCK_AFTER if match.group("block") else _CONTEXT_AFTER
            keys.append((max(0, match.start() - _CONTEXT_BEFORE), match.end() + after))
    tools: list[tuple[int, int]] = []
    tool_re = _tool_re_for(lowered)
    for start, end in _literal_ranges(lowered, _COMMAND_HINTS_RE, _CONTEXT_REACH):
        for match in tool_re.finditer(text, start, end):
            tools.append((max(0, match.start() - _CONTEXT_BEFORE), match.end() + _COMMAND_WINDOW))
    return _clipped(keys, len(text)), _clipped(tools, len(text))


def _clipped(ranges: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    if not ranges:
        return ranges
    starts, ends = _merged(sorted(ranges))
    return [(start, min(end, size)) for start, end in zip(starts, ends, strict=True)]


def find_secrets_by_context(text: str) -> list[Span]:
    """The credentials :func:`find_secrets` finds in ``text`` by a value's context
    (``api_key = 3fa9…``, whose value alone is a commit hash), placed in ``text``
    (in order, disjoint), at a fraction of its cost: only the
    :func:`context_windows` are scanned."""
    keys, tools = context_windows(text)
    if not keys and not tools:
        return []
    found: list[Span] = []
    for start, end in keys:
        found += [
            Span(span.start + start, span.end + start, span.kind, span.category)
            for span in find_secrets(text[start:end])
        ]
    for start, end in tools:
        # The command scanner alone (with JSON's escapes undone, as find_secrets
        # reads them): a log of curl calls is read once, not by every rule.
        found += [
            Span(span.start + start, span.end + start, span.kind, span.category)
            for span in _spans_with_escapes_undone(text[start:end], ())
        ]
    return _without_overlaps(found)


def contains_secret(text: str, *, pii: bool = False) -> bool:
    return bool(find_secrets(text, pii=pii))


def replace_spans(text: str, spans: Sequence[Span], replacement: Callable[[Span, str], str]) -> str:
    """``text`` with each span swapped for ``replacement(span, secret_value)``."""
    pieces: list[str] = []
    position = 0
    for span in sorted(spans):
        pieces.append(text[position : span.start])
        pieces.append(replacement(span, span.value(text)))
        position = span.end
    pieces.append(text[position:])
    return "".join(pieces)


__all__ = [
    "PII",
    "PLACEHOLDER_RE",
    "Span",
    "compile_user_patterns",
    "contains_secret",
    "context_windows",
    "find_secrets",
    "find_secrets_by_context",
    "luhn_valid",
    "replace_spans",
]
