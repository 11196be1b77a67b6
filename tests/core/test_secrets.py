"""The credential/PII detector on real-format fakes and the near misses memory files are full of."""

from __future__ import annotations

import itertools
import json
import re
import string
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.secret_corpus import LOOKALIKES, PLANTED, PLANTED_EXTRA, Planted

from memd.core.secrets import (
    PLACEHOLDER_RE,
    Span,
    contains_secret,
    find_secrets,
    find_secrets_by_context,
    luhn_valid,
    replace_spans,
)


def _redact(text: str, *, pii: bool = True) -> str:
    return replace_spans(text, find_secrets(text, pii=pii), lambda s, _: f"[REDACTED:{s.kind}]")


@pytest.mark.parametrize("planted", PLANTED + PLANTED_EXTRA, ids=lambda p: p.kind)
def test_every_listed_format_is_found_exactly_with_its_kind(planted: Planted) -> None:
    spans = find_secrets(planted.sentence, pii=planted.pii)
    assert [(s.kind, s.value(planted.sentence)) for s in spans] == [(planted.kind, planted.secret)]


def test_the_issue_lists_nineteen_formats() -> None:
    assert len(PLANTED) == 19


@pytest.mark.parametrize("lookalike", LOOKALIKES)
def test_no_lookalike_is_flagged(lookalike: str) -> None:
    # The bar is at most 1 in 13; the corpus today has none flagged, keep it so.
    assert find_secrets(lookalike, pii=True) == []


def test_pii_is_only_reported_when_asked() -> None:
    for planted in PLANTED:
        spans = find_secrets(planted.sentence, pii=False)
        assert bool(spans) is not planted.pii, planted.kind


def test_all_secrets_in_one_text_are_disjoint_and_ordered() -> None:
    text = "\n\n".join(p.sentence for p in PLANTED + PLANTED_EXTRA) + "\n" + "\n".join(LOOKALIKES)
    spans = find_secrets(text, pii=True)
    assert spans == sorted(spans)
    assert all(a.end <= b.start for a, b in itertools.pairwise(spans))
    redacted = _redact(text)
    for planted in PLANTED + PLANTED_EXTRA:
        assert planted.secret not in redacted
    for lookalike in LOOKALIKES:
        assert lookalike in redacted


@pytest.mark.parametrize(
    "text",
    [
        "DATABASE_URL=postgresql://app@db.internal:5432/orders",
        "cloned ssh://git@git.corp.example.com/team/x.git",
        "remote: git@github.com:org/repo.git",
        "fetch https://deploy@example.com/x and https://user@example.com",
    ],
)
def test_a_urls_user_name_is_not_an_email_address(text: str) -> None:
    """A DSN's or a git remote's user name is a service account, not personal data:
    redacted as an e-mail address, the DSN went to a remote summarizer with a
    placeholder in its middle and could not be pinned (review s7kinds)."""
    assert find_secrets(text, pii=True) == []


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("write to mailto:dana.whitfield@example.org today", "dana.whitfield@example.org"),
        ("dana.whitfield@example.org: please review", "dana.whitfield@example.org"),
        ("cc <ops+alerts@mail.example.co.uk>, thanks", "ops+alerts@mail.example.co.uk"),
    ],
)
def test_an_email_address_beside_a_colon_or_a_mailto_is_still_one(text: str, address: str) -> None:
    assert [(s.kind, s.value(text)) for s in find_secrets(text, pii=True)] == [("email", address)]


@pytest.mark.parametrize(
    "text",
    ["dsn: mysql://svc:Pa55-word@db.example.com/app", "redis://:Pa55-word@cache.example.com:6379"],
)
def test_a_password_in_a_url_is_the_password_not_an_email(text: str) -> None:
    # With no user name the email rule once took the password's tail with the host.
    assert [(s.kind, s.value(text)) for s in find_secrets(text, pii=True)] == [
        ("url_password", "Pa55-word")
    ]


@pytest.mark.parametrize(
    ("text", "password"),
    [
        ("postgres://app:Xk9+/aQ2=@db.internal:5432/app", "Xk9+/aQ2="),
        ("postgres://app:Xk9#aQ2@db.internal:5432/app", "Xk9#aQ2"),
        ("postgres://app:Xk9?aQ2@db.internal:5432/app", "Xk9?aQ2"),
        ("postgres://app:p@ss/w0rd@db.internal/app", "p@ss/w0rd"),
        (
            '{"url": "postgres://app:Xk9+/aQ2=@db.internal/app", "to": "ops@example.com"}',
            "Xk9+/aQ2=",
        ),
    ],
    ids=["slash", "hash", "question-mark", "at-then-slash", "json"],
)
def test_a_url_password_runs_to_the_authoritys_last_at(text: str, password: str) -> None:
    """A base64-made password holds "/" (and "#", "?", "@" by hand): the rule
    stopped at the first, and the rest went to a remote summarizer as written
    (review r7pins F3)."""
    assert [(s.kind, s.value(text)) for s in find_secrets(text)] == [("url_password", password)]


@pytest.mark.parametrize(
    ("text", "password"),
    [
        ("postgres://app:2024/x@db/x", "2024/x"),
        ("postgres://app:12/ab+Q=@db.internal:5432/app", "12/ab+Q="),
        ("redis://:2024/x@cache:6379/0", "2024/x"),
        ("https://app:70000/x@db/x", "70000/x"),
        ("https://app:2024/x@db/x", "2024/x"),
        ("see https://u:2024/x@host/path now", "2024/x"),
        ("wss://bot:443/k+Q=@chat.internal/ws", "443/k+Q="),
        ("postgres://app:123456@db/x", "123456"),
        ("redis://:987654@cache:6379/0", "987654"),
    ],
    ids=[
        "dsn",
        "dsn-base64",
        "no-user",
        "over-65535",
        "web-bare-user",
        "web-bare-user-in-prose",
        "web-bare-user-base64",
        "six-digits",
        "six-digits-no-user",
    ],
)
def test_a_url_password_of_digits_and_a_slash_is_no_port(text: str, password: str) -> None:
    """``user:2024/x@`` was read as the host "user" on port 2024, and the password
    went out as written: outside the web's schemes (whose paths hold "@"), after
    no user name, past 65535, or in a web scheme after a bare word (no host's
    name: no ".", not localhost) and before a name up to an "@", it is the
    password (the web's case was read as a port until session 9)."""
    assert [(s.kind, s.value(text)) for s in find_secrets(text)] == [("url_password", password)]


@pytest.mark.parametrize(
    "text",
    [
        "https://example.com:8443/a@b",  # a host's name: a port, an "@" in the path
        "https://10.0.0.7:8443/a@b",
        "http://localhost:4873/x@y",
        "http://registry:4873/@acme/pkg",  # nothing between the "/" and the "@"
        "https://app:2024/x/y@db/x",  # a "/" between: a path
        "smtp://mail.example.com:587/?from=alerts@example.com",
        "postgres://db:5432/app?user=ops@example.com",
    ],
)
def test_a_port_before_an_at_in_the_path_or_query_is_still_a_port(text: str) -> None:
    assert [s for s in find_secrets(text) if s.kind == "url_password"] == []


def _find_seconds(text: str, *, under: float | None = None) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        find_secrets(text, pii=True)
        best = min(best, time.perf_counter() - start)
        if under is not None and not under <= best <= 10 * under:
            break
    return best


@pytest.mark.parametrize("unit", ["a+", "a.", "a-", "a://b:", "a://b:1/", "a://:1/b"])
def test_a_long_run_beside_a_url_is_scanned_in_linear_time(unit: str) -> None:
    """A URL's scheme could start at every letter of a long "a+a+…" run and was
    read to the run's end from each (review r7pins F2): the 8x input takes less
    than 30x the 1x input's time (linear: ~8x; quadratic: ~64x)."""
    count = 4096 // len(unit)
    small = _find_seconds("see https://example.com/x " + unit * count)
    large = _find_seconds("see https://example.com/x " + unit * 8 * count, under=30 * small)
    assert large < 30 * small, (small, large)


@pytest.mark.parametrize(
    "text",
    [
        "redis://:@localhost:6379",
        "npm view http://localhost:4873/@acme/payments",
        "redis://:[REDACTED:url_password#abcdef]@cache:6379",
        "see http://[::1]:8080/health and https://example.com:8443/a@b",
    ],
)
def test_urls_without_a_password_are_not_secrets(text: str) -> None:
    assert find_secrets(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "password: ********",
        "token=<your token here>",
        "secret = ${SECRET}",
        "api_key=None",
        "the password is incorrect",
        "token count 4096",
        "password=[REDACTED:password#3f9a1c]",
        "Authorization: Bearer [REDACTED:bearer_token#00aa11]",
        "postgres://app:[REDACTED:url_password#abcdef]@db:5432/x",
    ],
)
def test_placeholders_and_empty_assignments_are_not_secrets(text: str) -> None:
    assert find_secrets(text, pii=True) == []


def test_redacted_text_is_clean_and_redaction_is_idempotent() -> None:
    text = "\n".join(p.sentence for p in PLANTED)
    once = _redact(text)
    assert not contains_secret(once, pii=True)
    assert _redact(once) == once
    assert len(PLACEHOLDER_RE.findall(once)) == len(PLANTED)


def test_unterminated_private_key_is_redacted_to_the_end_of_its_base64() -> None:
    text = "> key:\n> -----BEGIN OPENSSH PRIVATE KEY-----\n> b3BlbnNzaC1rZXktdjEAAAA\n> QQQQ\nnext line."
    [span] = find_secrets(text)
    assert span.kind == "private_key"
    assert "b3BlbnNzaC1rZXktdjEAAAA" in span.value(text) and "QQQQ" in span.value(text)
    assert "next line" not in span.value(text)


def test_user_patterns_add_kinds() -> None:
    text = "ticket ACME-INT-99812 and ACME-INT-1"
    spans = find_secrets(text, user_patterns={"Internal Ticket": r"ACME-INT-\d{5}"})
    assert [(s.kind, s.value(text)) for s in spans] == [("internal_ticket", "ACME-INT-99812")]


def test_luhn() -> None:
    assert luhn_valid("4111111111111111")
    assert not luhn_valid("4111111111111112")
    text = "card 4111 1111 1111 1112 and 1234 5678 9012 3452"  # second passes Luhn, no issuer
    assert find_secrets(text, pii=True) == []


def test_ssn_rules_reject_impossible_numbers() -> None:
    assert find_secrets("ids 000-12-3456 666-12-3456 912-12-3456 123-00-4567", pii=True) == []


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_spans_are_always_in_bounds_and_disjoint(text: str) -> None:
    spans = find_secrets(text, pii=True)
    assert all(0 <= s.start < s.end <= len(text) for s in spans)
    assert all(a.end <= b.start for a, b in itertools.pairwise(spans))
    assert all(isinstance(s, Span) for s in spans)


@pytest.mark.parametrize(
    "clipped", ['export API_KEY="s3cr3t-Value_42', "password: 'hunter2-Quartz!"]
)
def test_an_assignment_clipped_before_its_closing_quote_is_still_a_credential(
    clipped: str,
) -> None:
    # An extract (a pinned fact, a summary line) may lose the closing quote.
    assert [s.kind for s in find_secrets(clipped)] == ["password"]


@pytest.mark.parametrize(
    "before",
    ["\\n", "\\t", "%3D", "\\u003d"],
    ids=["json-newline", "json-tab", "url-encoded", "json-unicode"],
)
def test_a_token_after_an_escaped_separator_is_found(before: str) -> None:
    # JSON dumps and URL-encoded query strings in tool output put a letter or a
    # digit right before a token that starts there all the same.
    for planted in PLANTED:
        if planted.kind not in {"anthropic_api_key", "openai_api_key", "github_token", "jwt"}:
            continue
        text = f'{{"env": "HOME=/root{before}{planted.secret}"}}'
        found = [text[s.start : s.end] for s in find_secrets(text)]
        assert planted.secret in found, (planted.kind, found)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        # JSON inside a JSON string (a tool's HTTP body, a secrets-manager reply).
        (
            '{"output": "{\\"aws_secret_access_key\\": \\"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\\"}"}',
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ),
        ('{"output": "{\\"db_password\\": \\"Tr0ub4dor&3xq-Qv9\\"}"}', "Tr0ub4dor&3xq-Qv9"),
        # An encoder that writes "/" as "\/": the span keeps the backslashes.
        (
            '{"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI\\/K7MDENG\\/bPxRfiCYEXAMPLEKEY"}',
            "wJalrXUtnFEMI\\/K7MDENG\\/bPxRfiCYEXAMPLEKEY",
        ),
        ('{"o": "{\\"url\\": \\"postgres:\\/\\/u:Pa55-word@db:5432\\/x\\"}"}', "Pa55-word"),
    ],
    ids=["aws-in-escaped-json", "password-in-escaped-json", "escaped-slashes", "url-escaped"],
)
def test_a_credential_inside_escaped_json_is_found(text: str, secret: str) -> None:
    assert [s.value(text) for s in find_secrets(text)] == [secret]


def test_escaped_json_prose_is_not_flagged() -> None:
    # The unescaped view must not turn ordinary escaped text into findings.
    for lookalike in LOOKALIKES:
        escaped = json.dumps(json.dumps({"note": lookalike}))
        assert find_secrets(escaped, pii=True) == [], lookalike


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("- AWS secret key: `wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY` (eu-west-1)", None),
        ("AWS secret access key is **wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY**", None),
        ("- **Password**: `Tr0ub4dor&3xq-Qv9` for the prod database", "Tr0ub4dor&3xq-Qv9"),
        ("- `DB_PASSWORD`: `Tr0ub4dor&3xq-Qv9`", "Tr0ub4dor&3xq-Qv9"),
    ],
)
def test_a_credential_a_model_formats_as_markdown_is_found(text: str, secret: str | None) -> None:
    expected = secret or "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    assert [s.value(text) for s in find_secrets(text)] == [expected]


@pytest.mark.parametrize(
    "text",
    [
        "The `password` field is required; **Password**: see the vault.",
        "Set `token_budget` to 4000 and **api_key**: `None`.",
        "password: ```",
    ],
)
def test_markdown_about_credentials_is_not_a_credential(text: str) -> None:
    assert find_secrets(text) == []


@pytest.mark.parametrize(
    ("command", "secret"),
    [
        ("mysql -u root -pS3cr3t-db9 app", "S3cr3t-db9"),
        ("mysqldump -h db.internal -u backup -p'S3 cr3t!' app > app.sql", "S3 cr3t!"),
        ("mariadb -uroot -pS3cr3t-db9 -e 'select 1'", "S3cr3t-db9"),
        ("mysql --password=S3cr3t-db9 app", "S3cr3t-db9"),
        ("curl -u alice:S3cr3t-web9 https://api.example.com/v1", "S3cr3t-web9"),
        ("curl -sS --user alice:S3cr3t-web9 https://api.example.com", "S3cr3t-web9"),
        ('curl -u "alice:S3cr3t-web9" https://api.example.com', "S3cr3t-web9"),
        ("curl --proxy-user bob:Pr0xy-pw-77 https://example.com", "Pr0xy-pw-77"),
        ("wget --password S3cr3t-ftp9 ftp://files.example.com/a", "S3cr3t-ftp9"),
        ("wget --ftp-password=S3cr3t-ftp9 ftp://files.example.com/a", "S3cr3t-ftp9"),
        ("sshpass -p 'S3cr3t ssh!' ssh deploy@host", "S3cr3t ssh!"),
        ("sshpass -pS3cr3t-ssh9 scp f deploy@host:", "S3cr3t-ssh9"),
        ("PGPASSWORD=S3cr3t-pg9 psql -h db -U app", "S3cr3t-pg9"),
        ("docker login -u bot -p S3cr3t-reg9 registry.example.com", "S3cr3t-reg9"),
        ("podman login --password S3cr3t-reg9 quay.io", "S3cr3t-reg9"),
        ("redis-cli -h cache -a S3cr3t-red9 ping", "S3cr3t-red9"),
        ("htpasswd -b /etc/nginx/.htpasswd alice S3cr3t-ht9", "S3cr3t-ht9"),
        ("htpasswd -B -C 12 -cb .htpasswd alice S3cr3t-ht9", "S3cr3t-ht9"),
        ("htpasswd -nb alice S3cr3t-ht9", "S3cr3t-ht9"),
        # As a tool call reaches memory: a JSON-escaped command string.
        ('{"cmd": "mysql -u root -p\\"S3cr3t-db9\\" app"}', "S3cr3t-db9"),
    ],
)
def test_a_password_on_a_command_line_is_found(command: str, secret: str) -> None:
    spans = find_secrets(command)
    assert [s.value(command).replace('\\"', "") for s in spans] == [secret]
    assert all(s.kind == "password" for s in spans)


@pytest.mark.parametrize(
    "command",
    [
        "mysql -u root -p app",  # -p alone: mysql prompts
        "mysql -u root -p",
        "mysql -p -h db.internal app",
        "mysql -h db -P 3306 -u app app",
        "ssh -p 2222 deploy@host",
        "psql -p 5432 -h db app",
        "scp -P 22 -p file host:/tmp",
        "docker run -p 8080:80 nginx",
        "redis-cli -p 6380 ping",
        "curl -u alice https://api.example.com",  # no password: curl prompts
        'curl -u "$API_USER:$API_PASS" https://api.example.com',
        "docker login --password-stdin registry.example.com",
        'redis-cli -a "$REDIS_PASSWORD" ping',
        "mysql -p$MYSQL_PWD app",
        "sshpass -f ~/.pw ssh host",
        "htpasswd -c .htpasswd alice",  # prompts
        "mysql -u app app | grep -pattern x",
        "Run the mysql client with -p and type the password when asked.",
    ],
)
def test_a_command_line_without_a_password_is_not_flagged(command: str) -> None:
    assert find_secrets(command) == []


class _CountingPattern:
    """A compiled regex whose ``match`` calls are counted: the command scanner's
    reads, counted instead of timed (no timed assertions in tests)."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        self.calls = 0

    def match(self, *args: Any) -> re.Match[str] | None:
        self.calls += 1
        return self.pattern.match(*args)


_SCANNER_PATTERNS = ("_SHELL_PIECE", "_SHELL_WORD", "_ARGV_ITEM")


def _scanner_reads(monkeypatch: pytest.MonkeyPatch, text: str) -> int:
    """How many pieces, words and argv items the command scanner read in ``text``."""
    import memd.core.secrets as secrets

    counters = [_CountingPattern(getattr(secrets, name)) for name in _SCANNER_PATTERNS]
    for name, counter in zip(_SCANNER_PATTERNS, counters, strict=True):
        monkeypatch.setattr(secrets, name, counter)
    find_secrets(text)
    return sum(counter.calls for counter in counters)


def test_command_rules_stay_linear_on_a_long_one_line_log(monkeypatch: pytest.MonkeyPatch) -> None:
    # review16b F1: a lazy run over "the arguments after curl", retried from
    # every curl in a one-line JSON log, was quadratic (1 MB: 190 s).  Each read
    # consumes text, so a scan that reads nothing twice makes at most about one
    # read per character; a rescan from every curl makes thousands per character.
    line = (
        "["
        + ", ".join(
            f'{{"tool":"bash","command":"curl -s https://api.example.com/v1/items/{i}"}}'
            for i in range(3000)
        )
        + "]"
    )  # ~225 KB
    assert 0 < _scanner_reads(monkeypatch, line) <= len(line)


@pytest.mark.parametrize(
    "text",
    ["curl " * 40_000, '"curl curl ' * 20_000, "'curl' " * 30_000, '["curl",' * 25_000],
)
def test_repeated_tool_names_are_read_once(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    assert _scanner_reads(monkeypatch, text) <= 2 * len(text)
    assert find_secrets(text) == []


@pytest.mark.parametrize(
    "command",
    [
        "curl -sS \\\n  -u alice:S3cr3tPw \\\n  https://api.example.com/x",
        "mysql -h db -u root \\\n  -pS3cr3tPw app",
        "curl -sS \\\r\n  -u alice:S3cr3tPw https://x",
        # The same as a JSON string in a tool call.
        json.dumps({"command": "curl -sS \\\n  -u alice:S3cr3tPw \\\n  https://x"}),
    ],
)
def test_backslash_continued_command_password_is_found(command: str) -> None:
    assert "S3cr3tPw" not in _redact(command)


@pytest.mark.parametrize(
    ("command", "secret"),
    [
        ('curl -u alice:"S3cr3tPw" https://x', "S3cr3tPw"),
        ("curl -u alice:'S3cr3t Pw' https://x", "S3cr3t Pw"),
        ("curl -u 'admin:Ab&cd3fgh' https://x", "Ab&cd3fgh"),
        ("curl -u 'admin:Ab;cd3fgh' https://x", "Ab;cd3fgh"),
        ('mysql -u root "-pS3cr3tPw" app', "S3cr3tPw"),
        ("mysql -u root '-pAb&cd3fgh' app", "Ab&cd3fgh"),
        ("mysql.exe -uroot -pS3cr3tPw app", "S3cr3tPw"),
        ("curl.exe -u alice:S3cr3tPw https://x", "S3cr3tPw"),
        # A command inside a quoted string of another.
        ('sshpass -p S3cr3t-ssh9 ssh db1 "mysql -uroot -pS3cr3tPw app"', "S3cr3tPw"),
        ("bash -lc 'curl -fsS -u ci:S3cr3tPw https://x | jq .'", "S3cr3tPw"),
        ("sudo -u mysql mysql -pS3cr3tPw", "S3cr3tPw"),
    ],
)
def test_quoted_command_password_is_found(command: str, secret: str) -> None:
    assert secret in [s.value(command) for s in find_secrets(command)]


@pytest.mark.parametrize(
    ("call", "secret"),
    [
        ('{"argv": ["mysql", "-uroot", "-pS3cr3tPw", "app"]}', "S3cr3tPw"),
        ('{"args": ["curl", "-u", "alice:S3cr3tPw", "https://x"]}', "S3cr3tPw"),
        ("subprocess.run(['docker', 'login', '-p', 'S3cr3tPw', 'reg.example.com'])", "S3cr3tPw"),
        ('["sshpass", "-p", "S3cr3tPw", "ssh", "-p", "2222", "host"]', "S3cr3tPw"),
        # Each element of a one-line log is its own command.
        (
            '[{"command":"curl -s https://x"}, {"command":"mysql -uroot -pS3cr3tPw app"}]',
            "S3cr3tPw",
        ),
    ],
)
def test_argv_array_password_is_found(call: str, secret: str) -> None:
    assert [s.value(call) for s in find_secrets(call)] == [secret]


@pytest.mark.parametrize(
    "command",
    [
        "curl -su alice:S3cr3tPw https://api.example.com/x",
        "curl -ku elastic:S3cr3tPw https://localhost:9200/_cat/indices",
        "curl -fsSLu alice:S3cr3tPw https://api.example.com/x",
        "curl -kualice:S3cr3tPw https://localhost:9200",
        "curl -sU proxy:S3cr3tPw https://api.example.com/x",
        json.dumps({"command": "curl -sSu alice:S3cr3tPw https://api.example.com/x"}),
    ],
)
def test_curl_user_option_bundled_with_other_short_options_is_found(command: str) -> None:
    # review16f F1: only -u/-U alone or first in the word was read.
    assert [s.value(command) for s in find_secrets(command)] == ["S3cr3tPw"]


def _in_json(text: str, levels: int) -> str:
    """``text`` as a JSON string ``levels`` deep: 2 is an OpenAI-style tool call,
    whose arguments are a JSON string; 3 is such a call logged as a JSON string."""
    for _ in range(levels):
        text = json.dumps({"arguments": text})
    return text


def _out_of_json(text: str, levels: int) -> str:
    for _ in range(levels):
        text = json.loads(text)["arguments"]
    return text


@pytest.mark.parametrize("levels", [2, 3])
@pytest.mark.parametrize(
    "command",
    [
        'mysql -uroot -p"S3cr3tPw" app',
        'curl -u alice:"S3cr3tPw" https://api.example.com/x',
        'mysql -uroot --password="S3cr3tPw" app',
    ],
)
def test_quoted_password_in_json_inside_json_is_found_exactly(command: str, levels: int) -> None:
    # review16f F2: the raw reading and one level of escapes undone both part
    # words at \", so the password was a word no rule wanted; three levels down
    # the raw reading took -p's value to be the backslashes before it.
    text = _in_json(command, levels)
    assert [s.value(text) for s in find_secrets(text)] == ["S3cr3tPw"]
    # The placeholder lands on the password: every level of JSON stays valid.
    assert _out_of_json(_redact(text), levels) == command.replace("S3cr3tPw", "[REDACTED:password]")


def test_a_doubly_escaped_command_keeps_its_escapes() -> None:
    # review16b minor: the span took the trailing backslash of \", which broke
    # the inner string's escaping in what the summarizer saw.
    text = '{\\"command\\": \\"mysql -uroot -pS3cr3tPw\\"}'
    assert [s.value(text) for s in find_secrets(text)] == ["S3cr3tPw"]


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"command": 'bash -c "mysql -uroot -pS3cr3tPw"'}),
        json.dumps([{"command": 'ssh db1 "mysql -uroot -pS3cr3tPw"'}, {"command": 'bash -c "ls"'}]),
        _in_json('bash -c "mysql -uroot -pS3cr3tPw"', 2),
        _in_json("mysql -uroot -pS3cr3tPw", 2),
    ],
)
def test_a_nested_command_in_json_keeps_the_closing_escapes(text: str) -> None:
    # review16f F3: with escapes undone, the closing \"" of the nested command
    # read as an empty quoted string glued to the password, and the span ran on
    # over the end of the JSON object.
    assert [s.value(text) for s in find_secrets(text)] == ["S3cr3tPw"]
    assert "S3cr3tPw" not in json.dumps(json.loads(_redact(text)))


@pytest.mark.parametrize(
    "command",
    [
        "mysqladmin -u root password 'S3cr3tPw'",
        "mysqladmin -uroot -pOldPw123 password S3cr3tPw",
        "mariadb-admin --user=root password S3cr3tPw && echo done",
        "sudo mysqladmin -h db old-password S3cr3tPw",
        '["mysqladmin", "-uroot", "password", "S3cr3tPw"]',
        json.dumps({"command": 'mysqladmin -u root password "S3cr3tPw"'}),
    ],
)
def test_mysqladmin_password_command_is_found(command: str) -> None:
    # review16f F4: mysqladmin's new password is the word after its password
    # command, the classic way setup transcripts set a root password.
    assert [s.value(command) for s in find_secrets(command)][-1] == "S3cr3tPw"
    assert "S3cr3tPw" not in _redact(command)


@pytest.mark.parametrize(
    "command",
    [
        "cat /etc/nginx/.htpasswd alice S3cr3t-ht9 x",
        "sshpass -p $PW ssh -p 2222 host",
        '["ssh", "-p", "2222", "host"]',
        "curl -sS \\\n  -u alice \\\n  https://x",
        "mysql -u root \\\n  -p app",
        # A bundle ends at an option taking a value: these are an output file
        # and a header, and -su with no colon in its value prompts.
        "curl -sou:tput.json https://x",
        "curl -sHuser:agent1 https://x",
        "curl -su alice https://x",
        # mysqladmin's password command with a stand-in or nothing after it
        # (it prompts); mysql's own positional words are databases.
        'mysqladmin -u root password "$NEW_ROOT_PW"',
        "mysqladmin -u root -p password",
        "mysql -u root password app",
    ],
)
def test_more_command_lines_without_a_password_are_not_flagged(command: str) -> None:
    assert find_secrets(command) == []


@pytest.mark.parametrize(
    "code",
    [
        "MAX_PW_LEN = 64",
        "RENDER_PASS = RenderPass.OPAQUE",
        "SECOND_PASS = make_pass(tree, strict=True)",
        "NUM_PASS = 100000",
        "NUM_PASS=3000000",
        "FIRST_PASS = tokenize",
        "NEXT_PASS: Stage = stages.NEXT",
        "TESTS_PASS=true",
    ],
)
def test_a_code_constant_named_like_a_password_is_not_one(code: str) -> None:
    assert find_secrets(code) == []


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("SMTP_PASS=hunter2x", "hunter2x"),
        ("ADMIN_PW='Tr0ub4dor&3'", "Tr0ub4dor&3"),
        ("cat .env\nDB_HOST=db\nDB_PASS=postgres\nDB_NAME=app", "postgres"),
        ("MYAPP_DB_PASS = changeme", "changeme"),
        ("LDAP_BIND_PW=secretpw", "secretpw"),
        ("ADMIN_PW=123456", "123456"),
        ('export REDIS_PASS="letmein"', "letmein"),
        # A value that looks like a password counts under any _PASS name.
        ("FIRST_PASS=hunter2x", "hunter2x"),
        # review16b F3: a .env/shell line, YAML or JSON counts whatever the value
        # (weak passwords are plain words); all were found before c3348af.
        ("GMAIL_PASS=CorrectHorseBatteryStaple", "CorrectHorseBatteryStaple"),
        ("NEXTCLOUD_PASS=MyCloudPass", "MyCloudPass"),
        ("MQTT_PW=P(ssw0rd#99", "P(ssw0rd#99"),
        ("GMAIL_PASS=Summer(2024)!", "Summer(2024)!"),
        ("ROUTER_PW=correct.horse.battery.staple", "correct.horse.battery.staple"),
        ("ILO_PASS=changeme", "changeme"),
        ("MQTT_PASS=mosquitto", "mosquitto"),
        ("export IPMI_PW=calvin", "calvin"),
        ("ZABBIX_PASS: zabbixadmin", "zabbixadmin"),
        ('{"TWITTER_PASS": "iloveyou"}', "iloveyou"),
        # Erring on redacting: FIRST_PASS=tokenize is a .env line's shape, and a
        # string literal in code is data (a password in code is one too).
        ("FIRST_PASS=tokenize", "tokenize"),
        ('SHADOW_PASS = "shadow"', "shadow"),
        ("const LAST_PASS = 'finalize';", "finalize"),
        ('SHADOW_PASS: Final = "shadow"', "shadow"),
    ],
)
def test_a_dotenv_password_is_found(text: str, secret: str) -> None:
    assert [s.value(text) for s in find_secrets(text)] == [secret]


_STAGE_WORDS = ("FIRST", "SECOND", "LAST", "SHADOW", "RENDER", "LINT", "OPT", "MULTI", "NEXT")
_ACCOUNT_NAMES = ("SMTP", "DB", "ADMIN", "ROOT", "REDIS", "LDAP_BIND", "MYSQL", "FTP", "APP_DB")


@given(
    stage=st.sampled_from(_STAGE_WORDS),
    suffix=st.sampled_from(("PASS", "PW")),
    value=st.one_of(
        # Dotted names of code's length: a value is read to 200 characters at most,
        # and a longer one is judged on that much (a password, the safe side).
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{3,19}(\.[A-Z_]{1,10}){0,8}", fullmatch=True),
        st.from_regex(r"[a-z_]{4,12}\(([a-z_]{1,8}(, [a-z_]{1,8}=True)?)?\)", fullmatch=True),
        st.sampled_from(("true", "false", "None", "null")),
    ),
    separator=st.sampled_from((" = ", " =", "= ", ": Final = ", " := ")),
)
def test_a_name_or_call_in_a_spaced_code_assignment_is_not_a_password(
    stage: str, suffix: str, value: str, separator: str
) -> None:
    assert find_secrets(f"{stage}_{suffix}{separator}{value}") == []


@given(
    stage=st.sampled_from(_STAGE_WORDS),
    suffix=st.sampled_from(("PASS", "PW")),
    number=st.one_of(
        st.integers(min_value=-(10**9), max_value=10**9).map(str),
        st.floats(min_value=0, max_value=1e6, allow_nan=False).map(lambda f: f"{f:.3f}"),
    ),
    separator=st.sampled_from(("=", " = ", ": ")),
    quote=st.sampled_from(("", '"', "'")),
)
def test_a_number_under_a_stage_name_is_not_a_password(
    stage: str, suffix: str, number: str, separator: str, quote: str
) -> None:
    assert find_secrets(f"{stage}_{suffix}{separator}{quote}{number}{quote}") == []


@given(
    stage=st.sampled_from((*_STAGE_WORDS, "GMAIL", "ILO", "MQTT", "IPMI", "ZABBIX", "ROUTER")),
    suffix=st.sampled_from(("PASS", "PW")),
    value=st.from_regex(r"[A-Za-z][A-Za-z0-9!@#%^&*_.+-]{5,24}", fullmatch=True).filter(
        lambda v: v.lower() not in ("true", "false", "none", "null")
    ),
    shape=st.sampled_from(("{}={}", "export {}={}", "{}: {}", '"{}": "{}"', "{} = '{}'")),
)
def test_any_value_in_a_dotenv_yaml_or_quoted_assignment_is_a_password(
    stage: str, suffix: str, value: str, shape: str
) -> None:
    # review16b F3: ILO_PASS=changeme, GMAIL_PASS=CorrectHorseBatteryStaple.
    text = shape.format(f"{stage}_{suffix}", value)
    assert [s.value(text) for s in find_secrets(text)] == [value]


@given(
    account=st.sampled_from(_ACCOUNT_NAMES),
    suffix=st.sampled_from(("PASS", "PW")),
    # Not starting with "*": Markdown's emphasis (`**`) before a value is read as
    # formatting, and what is left may be a short PIN, which is not flagged
    # (SMTP_PASS=**0000: "0000").
    value=st.from_regex(r"[A-Za-z0-9!@#%^&*_+-]{6,24}", fullmatch=True).filter(
        lambda v: not set(v) <= set("*x.") and not v.startswith("*")
    ),
    spaced=st.booleans(),
)
def test_any_value_under_an_account_password_name_is_a_password(
    account: str, suffix: str, value: str, spaced: bool
) -> None:
    separator = " = " if spaced else "="
    text = f"{account}_{suffix}{separator}{value}"
    assert [s.value(text) for s in find_secrets(text)] == [value]


@pytest.mark.parametrize(
    ("command", "secret"),
    [
        ("ldapsearch -x -D cn=admin,dc=ex -w S3cr3tPw -b dc=ex", "S3cr3tPw"),
        ("ldapmodify -x -D cn=admin,dc=ex -wS3cr3tPw -f add.ldif", "S3cr3tPw"),
        ("ldapwhoami -xw S3cr3tPw -D cn=admin,dc=ex", "S3cr3tPw"),
        ("openssl rsa -in key.pem -passin pass:S3cr3tPw -out plain.pem", "S3cr3tPw"),
        ("openssl pkcs12 -export -in c.pem -passout 'pass:S3cr3t Pw' -out c.p12", "S3cr3t Pw"),
        ("openssl enc -aes-256-cbc -pass pass:S3cr3tPw -in f -out f.enc", "S3cr3tPw"),
        ("smbclient //srv/share -U alice%S3cr3tPw", "S3cr3tPw"),
        ("smbclient //srv/share -UCORP\\\\alice%S3cr3tPw -c ls", "S3cr3tPw"),
        ("rpcclient -U 'alice%S3cr3t&Pw' dc1", "S3cr3t&Pw"),
        ("smbclient //srv/share --user=alice%S3cr3tPw", "S3cr3tPw"),
        ("mongosh mongodb://db -u admin -p S3cr3tPw", "S3cr3tPw"),
        ("mongo admin -u admin --password S3cr3tPw", "S3cr3tPw"),
        ("mongodump --username backup --password=S3cr3tPw --out /tmp/d", "S3cr3tPw"),
        ("mysqlsh --password=S3cr3tPw root@db", "S3cr3tPw"),
        ("mysqlsh root:S3cr3tPw@db:3306 --sql", "S3cr3tPw"),
        ("mysqlsh --uri root:S3cr3tPw@db:3306", "S3cr3tPw"),
        ("mysqlsh -uroot -pS3cr3tPw -h db", "S3cr3tPw"),
        ('ConvertTo-SecureString "S3cr3tPw" -AsPlainText -Force', "S3cr3tPw"),
        ("ConvertTo-SecureString -String 'S3cr3t;Pw' -AsPlainText -Force", "S3cr3t;Pw"),
        ('ConvertTo-SecureString -AsPlainText -Force "S3cr3tPw"', "S3cr3tPw"),
        ('$p = "S3cr3tPw" | ConvertTo-SecureString -AsPlainText -Force', "S3cr3tPw"),
        ("'S3cr3t|Pw' | ConvertTo-SecureString -Force -AsPlainText", "S3cr3t|Pw"),
        ("SSHPASS=S3cr3tPw sshpass -e ssh deploy@host", "S3cr3tPw"),
        ("export SSHPASS='S3cr3t Pw'; sshpass -e scp f host:", "S3cr3t Pw"),
        ("REDISCLI_AUTH=S3cr3tPw redis-cli -h cache ping", "S3cr3tPw"),
        ("ipmitool -I lanplus -H 10.0.0.5 -U admin -P S3cr3tPw power status", "S3cr3tPw"),
        ("ipmitool -I lanplus -H 10.0.0.5 -U admin -PS3cr3tPw sel list", "S3cr3tPw"),
        ("sqlcmd -S db -U sa -P S3cr3tPw -Q 'select 1'", "S3cr3tPw"),
        ("bcp dbo.t out t.dat -S db -U sa -P S3cr3tPw -c", "S3cr3tPw"),
        ("net use \\\\host\\share S3cr3tPw /user:alice", "S3cr3tPw"),
        ("net use Z: \\\\host\\share /user:CORP\\alice S3cr3tPw /persistent:no", "S3cr3tPw"),
        ("net.exe use * //host/share S3cr3tPw", "S3cr3tPw"),
        ('["net", "use", "\\\\\\\\host\\\\share", "S3cr3tPw", "/user:alice"]', "S3cr3tPw"),
    ],
)
def test_a_password_given_to_more_tools_is_found(command: str, secret: str) -> None:
    assert [s.value(command) for s in find_secrets(command)] == [secret]
    assert all(s.kind == "password" for s in find_secrets(command))


@pytest.mark.parametrize(
    "command",
    [
        "ldapsearch -x -H ldap://ldap.example.com -p 389 -b dc=example,dc=com",
        "ldapsearch -x -W -D cn=admin,dc=ex -b dc=ex",  # -W prompts
        "ldapsearch -x -D cn=admin -y /etc/ldap.secret -b dc=ex",
        "openssl req -new -key k.pem -passin env:KEY_PW -out r.csr",
        "openssl rsa -in k.pem -passin file:/run/secrets/pw -out plain.pem",
        "openssl enc -aes-256-cbc -pass stdin -in f -out f.enc",
        "openssl s_client -connect example.com:443 -servername example.com",
        "smbclient -L //fileserver -U alice",  # prompts
        "smbclient //srv/share -U alice%$SMB_PW",
        "mongosh --port 27017 -u admin -p",
        "mongosh -u admin -p --authenticationDatabase admin",
        "mysqlsh --uri root@localhost:3306 --sql",
        "mysqlsh root@db:3306 -e 'select 1'",
        "ConvertTo-SecureString $pw -AsPlainText -Force",
        "ConvertTo-SecureString -String $env:ADMIN_PW -AsPlainText -Force",
        "$enc | ConvertTo-SecureString",  # an encrypted standard string
        "ConvertTo-SecureString '76492d1116743f0423413b16050a5345MgB8AHYAZgBhAA' -Key $key",
        "SSHPASS=$PW sshpass -e ssh host",
        "REDISCLI_AUTH=$(cat /run/secrets/redis) redis-cli ping",
        "export SSHPASS",
        "ipmitool -I lanplus -H 10.0.0.5 -p 623 -U admin -E sensor",
        "sqlcmd -S db -E -Q 'select 1'",
        "sqlcmd -S db -U sa -P $SA_PASSWORD",
        "net use Z: \\\\fileserver\\projects /persistent:yes",
        "net use \\\\fileserver\\projects * /user:alice",  # prompts
        "net use Z: /delete",
        "The net use of the cache was 80 %; net user growth 5 %.",
        # Widths, ports and sources that only look like it.
        "fold -w 80 notes.txt; ping -w 5 -c 3 10.0.0.1; fmt -w 72 README",
        "curl -w '%{http_code}' -o /dev/null https://example.com",
        "docker run -p 8080:80 nginx; scp -P 22 f host:/tmp",
        "The test pass: 212 of 212; openssl takes -passin pass:, env: or file: sources.",
        "Decrypt with `openssl rsa -passin pass:<password>`.",
    ],
)
def test_those_tools_without_a_password_are_not_flagged(command: str) -> None:
    assert find_secrets(command) == []


@pytest.mark.parametrize(
    "commands",
    [
        ["mysql -u root -pS3cr3tPw", "ls"],
        ["ls", "curl -u alice:S3cr3tPw https://x", "ls -la"],
        {"a": "sshpass -p S3cr3tPw ssh h", "b": "ls"},
        {"cmds": ["ldapsearch -x -w S3cr3tPw", "ls"], "cwd": "/tmp"},
        ["mysql -u root -p'S3cr3tPw'", 'mysql -u root -p"S3cr3tPw"'],
        ["echo 'S3cr3tPw' | ConvertTo-SecureString -AsPlainText", "ls"],
    ],
)
@pytest.mark.parametrize("compact", [False, True])
def test_a_command_in_a_json_array_or_object_ends_with_its_string(
    commands: Any, compact: bool
) -> None:
    # A known leak: the password word ran on over the string's closing quote into
    # the next command ("S3cr3t\", \"ls"), and its redaction broke the JSON.
    separators = (",", ":") if compact else None
    text = json.dumps(commands, separators=separators)
    assert {s.value(text) for s in find_secrets(text)} == {"S3cr3tPw"}
    redacted = json.loads(_redact(text))
    assert redacted == json.loads(text.replace("S3cr3tPw", "[REDACTED:password]"))


def test_a_python_list_of_commands_ends_with_each_string() -> None:
    text = str(["mysql -u root -pS3cr3tPw", "ls -la"])  # ['mysql …', 'ls -la']
    assert [s.value(text) for s in find_secrets(text)] == ["S3cr3tPw"]


@pytest.mark.parametrize(
    ("command", "secret"),
    [
        ("mysql -uroot -pAb&cd3fgh app", "Ab&cd3fgh"),
        ("sshpass -p Ab&cd3fgh ssh host", "Ab&cd3fgh"),
        ("curl -u alice:Ab&cd&3fgh https://x", "Ab&cd&3fgh"),
        ("redis-cli -a Ab&cd3fgh ping && echo ok", "Ab&cd3fgh"),
        (json.dumps({"command": "mysql -uroot -pAb&cd3fgh app"}), "Ab&cd3fgh"),
    ],
)
def test_an_ampersand_inside_an_unquoted_password_is_part_of_it(command: str, secret: str) -> None:
    # The word's "&" was read as the shell's: "Ab" was too short to flag and
    # "cd3fgh" was left as a command of its own.
    assert [s.value(command) for s in find_secrets(command)] == [secret]


@pytest.mark.parametrize(
    "command",
    [
        "true&mysql -uroot -pS3cr3tPw",
        "curl -s https://x?a=1&b=2&&mysql -uroot -pS3cr3tPw",
        "curl -s 'https://x?a=1'&mysql -uroot -pS3cr3tPw",
        "mysql -uroot -pS3cr3tPw&",
        "mysql -uroot -pS3cr3tPw & ls",
    ],
)
def test_a_command_after_an_ampersand_is_still_read(command: str) -> None:
    assert [s.value(command) for s in find_secrets(command)] == ["S3cr3tPw"]


@pytest.mark.parametrize(
    "text",
    [
        '{"password": "Ab&c\\"d3;fgh"}',
        '{"SMTP_PASS": "Ab&c\\"d3;fgh"}',
        'password="Ab&c\\"d3;fgh"',
    ],
)
def test_an_escaped_quote_inside_a_quoted_password_is_part_of_it(text: str) -> None:
    assert [s.value(text) for s in find_secrets(text)] == ['Ab&c\\"d3;fgh']


@pytest.mark.parametrize(
    "text",
    ["SMTP_PASS=$(cat /run/secrets/smtp)", 'password="$(vault kv get -field=pw db)"'],
)
def test_a_command_substitution_is_a_stand_in_not_a_password(text: str) -> None:
    assert find_secrets(text) == []


# Command lines that carry a password, as (prefix, suffix) around the password as
# written, and the quotings each tool's reading takes: "bare" (nothing around
# it), "sq"/"dq" (a shell's quotes), "parts" (a shell word of adjacent quoted
# parts: -p"Ab"'c&d').  PowerShell's strings are quoted only.
_SHELL_QUOTINGS = ("bare", "sq", "dq", "parts")
_PASSWORD_COMMANDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("mysql -u root -p", " app", _SHELL_QUOTINGS),
    ("curl -fsS -u alice:", " https://api.example.com/x", _SHELL_QUOTINGS),
    ("sshpass -p ", " ssh deploy@web1", _SHELL_QUOTINGS),
    ("redis-cli -h cache -a ", " ping", _SHELL_QUOTINGS),
    ("docker login -u bot -p ", " registry.example.com", _SHELL_QUOTINGS),
    ("wget --password=", " ftp://files.example.com/a", _SHELL_QUOTINGS),
    ("ldapsearch -x -D cn=admin,dc=ex -w ", " -b dc=ex", _SHELL_QUOTINGS),
    ("openssl rsa -in k.pem -passin pass:", " -out plain.pem", _SHELL_QUOTINGS),
    ("smbclient //fileserver/finance -U alice%", " -c ls", _SHELL_QUOTINGS),
    ("mongosh mongodb://db/admin -u admin -p ", " --quiet", _SHELL_QUOTINGS),
    ("mysqlsh --password=", " root@db", _SHELL_QUOTINGS),
    ("mysqlsh root:", "@db:3306 --sql", _SHELL_QUOTINGS),
    ("ipmitool -I lanplus -H 10.0.4.21 -U ADMIN -P ", " power status", _SHELL_QUOTINGS),
    ("sqlcmd -S db -U sa -P ", " -Q x", _SHELL_QUOTINGS),
    ("net use \\\\fileserver\\finance ", " /user:alice", _SHELL_QUOTINGS),
    ("SSHPASS=", " sshpass -e ssh web1", _SHELL_QUOTINGS),
    ("REDISCLI_AUTH=", " redis-cli ping", _SHELL_QUOTINGS),
    ("ConvertTo-SecureString ", " -AsPlainText -Force", ("sq", "dq")),
    ("$c = ", " | ConvertTo-SecureString -AsPlainText -Force", ("sq", "dq")),
)
# No quote, backslash, $ or backtick (each needs its own escaping); a letter
# first and last (a word starting with "-" is an option, "#" a comment).  Some
# are not ASCII: json.dumps writes them as \uXXXX escapes (review r7secrets F5:
# a password opening with one was redacted from after the backslash).
_LETTERS = string.ascii_letters + "\u00c4\u00f1\u00e9\u00d8\u03a9"
_PASSWORD_MIDDLE = _LETTERS + string.digits + "&;|<>()!#%^*+=,.?@[]{}~_-/:\u00df\u20ac"
_BARE_MIDDLE = _LETTERS + string.digits + "&!%^*+=.?@~_-/:\u00df\u20ac"


def _written(password: str, quoting: str) -> tuple[str, str, str]:
    """The opening, the password as written (its first to its last character)
    and the closing."""
    if quoting == "sq":
        return "'", password, "'"
    if quoting == "dq":
        return '"', password, '"'
    if quoting == "parts":
        half = len(password) // 2
        return '"', f"{password[:half]}\"'{password[half:]}", "'"
    return "", password, ""


@given(
    command=st.sampled_from(_PASSWORD_COMMANDS),
    data=st.data(),
    shape=st.sampled_from(("line", "array", "object", "python")),
    levels=st.integers(min_value=0, max_value=3),
)
def test_a_password_in_any_quoting_and_json_nesting_is_redacted_keeping_the_json(
    command: tuple[str, str, tuple[str, ...]], data: st.DataObject, shape: str, levels: int
) -> None:
    # The brief's matrix: every tool's password, with shell metacharacters inside
    # quotes (and "&" bare), in a JSON array or object of commands beside
    # another one, as a tool call's arguments and that call logged, 0-3 levels
    # of JSON strings deep.  The placeholder lands on the password, nothing
    # else: every level of JSON still decodes to the command, password replaced.
    prefix, suffix, quotings = command
    # A Python list's repr escapes a quote as \' when the string holds both
    # kinds: Python's escaping, which the shell's reading does not undo.
    if shape == "python":
        quotings = tuple(q for q in quotings if q != "parts")
    quoting = data.draw(st.sampled_from(quotings), label="quoting")
    middle = _BARE_MIDDLE if quoting == "bare" else _PASSWORD_MIDDLE
    password = data.draw(
        st.builds(
            lambda first, rest, last: first + rest + last,
            st.sampled_from(_LETTERS),
            st.text(middle, min_size=4, max_size=16).filter(lambda v: "&&" not in v),
            st.sampled_from(_LETTERS + string.digits),
        ),
        label="password",
    )
    opening, written, closing = _written(password, quoting)
    before, after = prefix + opening, closing + suffix
    line = before + written + after
    expected = before + "[REDACTED:password]" + after
    if shape == "line":
        text, redacted_form = line, expected
    elif shape == "python":
        text, redacted_form = str([line, "ls -la"]), str([expected, "ls -la"])
    elif shape == "array":
        text, redacted_form = json.dumps([line, "ls -la"]), json.dumps([expected, "ls -la"])
    else:
        text = json.dumps({"command": line, "cwd": "/srv"})
        redacted_form = json.dumps({"command": expected, "cwd": "/srv"})
    # A command at most three JSON strings deep: the views undo three levels.
    for _ in range(min(levels, 3 - (shape in ("array", "object")))):
        text, redacted_form = (
            json.dumps({"arguments": text}),
            json.dumps({"arguments": redacted_form}),
        )
    assert _redact(text) == redacted_form


@pytest.mark.parametrize("levels", [1, 2, 3])
@pytest.mark.parametrize(
    "line",
    [
        'echo "password=S3cr3tPw" done',
        'ConvertTo-SecureString "a:PASSWORD=S3cr3tPw" -AsPlainText',
        'SMTP_PASS="S3cr3tPw" ./send',
    ],
)
def test_a_value_before_an_escaped_quote_leaves_the_escape(line: str, levels: int) -> None:
    # Read unquoted up to JSON's \" (or \\\" a level deeper), a value took the
    # escape's backslashes, and the redacted text was no JSON any more.
    text = _in_json(line, levels)
    assert "S3cr3tPw" not in _redact(text)
    assert "[REDACTED:password]" in _out_of_json(_redact(text), levels)


# -- review r7secrets ------------------------------------------------------------
@pytest.mark.parametrize(
    "command",
    [
        "docker run -d --name mongo -p 27017:27017 mongo:7",
        "docker run --rm --link mongo -p 8080:8080 myapp",
        "docker run --rm --link mongo:db -p 8080:8080 myapp",
        "docker run -d --name=mongo -p 27017:27017 mongo",
        "podman run --name mongo -p 27017:27017 -v /data:/data/db docker.io/mongo",
        '{"cmd": "docker run -d --name mongo -p 27017:27017 mongo:7"}',
        '["docker", "run", "--name", "mongo", "-p", "27017:27017", "mongo:7"]',
        "docker run -d --name sqlcmd -P mcr.microsoft.com/mssql-tools",
    ],
)
def test_a_docker_port_mapping_after_a_container_named_like_a_tool_is_no_password(
    command: str,
) -> None:
    # r7secrets F1: the container's, link's or image's name "mongo" was read as
    # the mongo shell, so docker's -p 27017:27017 was redacted as its password.
    assert find_secrets(command) == []


@pytest.mark.parametrize(
    "command",
    [
        "docker exec -it mongo mongosh -u admin -p S3cretPw9",
        "docker exec --interactive --tty mongo mongosh -u admin -p S3cretPw9",
        "mongosh --host mongo -u admin -p S3cretPw9",
        "sudo --preserve-env mysql -uroot -pS3cretPw9 app",
        "env --ignore-environment mysql -uroot -pS3cretPw9 app",
        'docker run --health-cmd "mysqladmin ping -uroot -pS3cretPw9" mysql:8',
        "docker run --health-cmd='redis-cli -a S3cretPw9 ping' redis:7",
        '["docker", "run", "--health-cmd", "mysqladmin ping -uroot -pS3cretPw9", "mysql:8"]',
        "docker run --rm --network host curlimages/curl -u alice:S3cretPw9 https://x",
    ],
)
def test_a_tool_run_after_a_long_option_is_still_read(command: str) -> None:
    # What the long-option rule must leave alone: a wrapper's flag before the
    # program, a quoted option value that is a command line, an image's tool.
    assert [s.value(command) for s in find_secrets(command)] == ["S3cretPw9"]


@pytest.mark.parametrize(
    "text",
    [
        '{"headers": {"Authorization": "Basic YWxpY2U6UzNjcmV0UHc="}}',
        "{'Authorization': 'Basic YWxpY2U6UzNjcmV0UHc='}",
        'Authorization: "Basic YWxpY2U6UzNjcmV0UHc="',
        '{"name": "Authorization", "value": "Basic YWxpY2U6UzNjcmV0UHc="}',  # HAR
        'curl -H "Authorization: Basic YWxpY2U6UzNjcmV0UHc=" https://x',
        json.dumps({"arguments": json.dumps({"Authorization": "Basic YWxpY2U6UzNjcmV0UHc="})}),
    ],
)
def test_basic_auth_in_a_json_or_dict_header_is_found(text: str) -> None:
    # r7secrets F2: only "Authorization: Basic X" was read; a quote after
    # Authorization or before Basic let alice:S3cretPw through.
    spans = find_secrets(text)
    assert [(s.kind, s.value(text)) for s in spans] == [("basic_auth", "YWxpY2U6UzNjcmV0UHc=")]


@pytest.mark.parametrize(
    "text",
    [
        "Authorization: Basic authentication is required for /admin.",
        '{"WWW-Authenticate": "Basic realm=\\"api\\"", "Authorization": "Basic realm"}',
        '"Authorization": "Basic credentials are sent base64-encoded"',
    ],
)
def test_basic_auth_words_that_are_no_credentials_are_not_flagged(text: str) -> None:
    # A Basic credential is base64 of user:password: prose naming the scheme is none.
    assert find_secrets(text) == []


@pytest.mark.parametrize(
    ("command", "secrets"),
    [
        (
            "ldappasswd -x -D cn=admin,dc=ex -w Adm1nPw -s N3wPassw0rd uid=bob",
            ["Adm1nPw", "N3wPassw0rd"],
        ),
        (
            "ldappasswd -x -D uid=bob -W -a 0ldPassw0rd -s N3wPassw0rd",
            ["0ldPassw0rd", "N3wPassw0rd"],
        ),
        ("ldappasswd -xWsN3wPassw0rd -D uid=bob", ["N3wPassw0rd"]),
        ("redis-cli -h cache CONFIG SET requirepass N3wPass99", ["N3wPass99"]),
        ("redis-cli config set maxmemory 2gb masterauth N3wPass99", ["N3wPass99"]),
        ("redis-cli -h cache -p 6380 AUTH S3cretPw9", ["S3cretPw9"]),
        ("redis-cli -h cache auth S3cretPw9 && redis-cli ping", ["S3cretPw9"]),
        # Redis 6's AUTH USER PW: the user name is no secret.
        ("redis-cli -h cache AUTH default S3cretPw9", ["S3cretPw9"]),
        ('["redis-cli", "-h", "cache", "AUTH", "S3cretPw9"]', ["S3cretPw9"]),
        ('{"cmd": "redis-cli AUTH app S3cretPw9", "cwd": "/"}', ["S3cretPw9"]),
        ("redis-cli ACL SETUSER alice on '>S3cretPw9' '~*' '+@all'", ["S3cretPw9"]),
    ],
)
def test_a_new_or_server_password_given_to_these_tools_is_found(
    command: str, secrets: list[str]
) -> None:
    # r7secrets F3: only ldappasswd's -w and redis-cli's -a were read.
    assert [s.value(command) for s in find_secrets(command)] == secrets


@pytest.mark.parametrize(
    "command",
    [
        "ldappasswd -x -D uid=bob -W -A -S uid=bob",  # prompts for both
        "ldapsearch -x -s base -a always -b dc=ex",  # scope and deref
        "redis-cli CONFIG GET requirepass",
        "redis-cli -n 2 GET requirepass",
        "redis-cli SET auth token123",
        "redis-cli -p 6380 --scan --pattern 'auth:*'",
        "redis-cli -h cache AUTH $REDIS_PASSWORD",
        "redis-cli ACL SETUSER alice on '#0c8b5e9a' '~*'",
    ],
)
def test_those_tools_other_words_are_no_passwords(command: str) -> None:
    assert find_secrets(command) == []


@pytest.mark.parametrize(
    "command",
    [
        r"NET USE Z: \\fs01\share S3cretPw9 /USER:CORP\alice",
        r"Net Use Z: \\fs01\share S3cretPw9 /user:alice",
        r"NET.EXE USE \\fs01\share S3cretPw9",
        'SQLCMD -S srv -U sa -P S3cretPw9 -Q "select 1"',
        "SqlCmd.EXE -S srv -U sa -P S3cretPw9",
        "BCP dbo.t out t.dat -S db -U sa -P S3cretPw9 -c",
    ],
)
def test_windows_tool_names_in_upper_case_are_read(command: str) -> None:
    # r7secrets F4: cmd.exe ignores case; the tool names were read in lower case only.
    assert [s.value(command) for s in find_secrets(command)] == ["S3cretPw9"]


@pytest.mark.parametrize(
    "text",
    [
        "The NET USE figure was 80 %; Net Use of funds.",
        "SQLCMD -S srv -E -p -Q x",  # -p: statistics; -E: trusted connection
        "BCP, OSQL and IPMITOOL are documented in README.",
    ],
)
def test_windows_tool_names_in_upper_case_without_a_password_are_not_flagged(text: str) -> None:
    assert find_secrets(text) == []


@pytest.mark.parametrize(
    "command",
    [
        "mysql -u root -p\u00c4bc12345 db",
        "sshpass -p \u00c4bc12345 ssh host",
        "curl -u alice:\u00c4bc12345 https://x",
        "ldapsearch -x -w \u00c4bc12345 -b dc=x",
        "mongosh -u admin -p \u00f1andu2024x",
        "mysql -u root -p\\\\bc12345 db",  # a backslash first: \\\\ in JSON
    ],
)
@pytest.mark.parametrize("levels", [1, 2])
def test_a_json_command_whose_password_opens_with_an_escape_stays_json(
    command: str, levels: int
) -> None:
    # r7secrets F5: the span started after the escape's backslash, so
    # "-p\\u00c4bc…" became "-p\\[REDACTED…]", an invalid escape.
    text = _in_json(command, levels)  # ensure_ascii: json.dumps's default
    decoded = _out_of_json(_redact(text), levels)
    assert "bc12345" not in decoded and "andu2024x" not in decoded
    assert "[REDACTED:password]" in decoded


class _CountingSpan(Span):
    """A span whose ``start`` and ``end`` reads are counted: the overlap checks'
    work, counted instead of timed."""

    __slots__ = ()
    reads = 0

    @property  # type: ignore[override]
    def start(self) -> int:
        _CountingSpan.reads += 1
        return int(Span.start.__get__(self))  # type: ignore[attr-defined]

    @start.setter
    def start(self, value: int) -> None:
        Span.start.__set__(self, value)  # type: ignore[attr-defined]

    @property  # type: ignore[override]
    def end(self) -> int:
        _CountingSpan.reads += 1
        return int(Span.end.__get__(self))  # type: ignore[attr-defined]

    @end.setter
    def end(self, value: int) -> None:
        Span.end.__set__(self, value)  # type: ignore[attr-defined]


def test_many_emails_beside_many_tokens_take_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # r7secrets F6: each PII span was tested against every credential (an
    # 800 KB auth log with PII on: 9-14 s, off: 0.3 s).  The spans' positions
    # read per span stay bounded however many there are; the old check read
    # about 2 x credentials of them per e-mail address.
    import memd.core.secrets as secrets

    monkeypatch.setattr(secrets, "Span", _CountingSpan)
    lines = 2_000
    text = "".join(
        f"2026-12-01 login ok user=user{i}@example.com token=tok{i:06d}abcdef\n"
        for i in range(lines)
    )
    _CountingSpan.reads = 0
    spans = find_secrets(text, pii=True)
    assert len(spans) == 2 * lines
    assert _CountingSpan.reads < 20 * len(spans)


def test_a_span_inside_many_placeholders_is_dropped_with_linear_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The same for placeholders: every span was tested against each one.
    import memd.core.secrets as secrets

    monkeypatch.setattr(secrets, "Span", _CountingSpan)
    lines = 2_000
    text = "".join(
        f"user{i}@example.com password=[REDACTED:password#{i:04x}] ok\n" for i in range(lines)
    )
    _CountingSpan.reads = 0
    spans = find_secrets(text, pii=True)
    assert len(spans) == lines
    assert _CountingSpan.reads < 20 * len(spans)


@pytest.mark.parametrize(
    ("command", "secret"),
    [
        ("openssl pkcs12 -export -in c.pem -passout=pass:S3cretPw9 -out a.p12", "S3cretPw9"),
        ("openssl pkcs12 -in a.p12 -nodes --passin pass:S3cretPw9", "S3cretPw9"),
        ("openssl rsa -in k.pem --passin=pass:S3cretPw9 -out p.pem", "S3cretPw9"),
        ("openssl enc -aes-256-cbc -k S3cretPw9 -in f -out f.enc", "S3cretPw9"),
        ("openssl passwd -6 -salt xyz S3cretPw9", "S3cretPw9"),
        ("openssl passwd -apr1 S3cretPw9", "S3cretPw9"),
    ],
)
def test_openssl_password_options_in_every_spelling_are_read(command: str, secret: str) -> None:
    # r7secrets F7: openssl takes one or two dashes and "=" (-passout=pass:PW,
    # --passin pass:PW); only -passin pass:PW was read; -k PW and passwd PW not at all.
    assert [s.value(command) for s in find_secrets(command)] == [secret]


@pytest.mark.parametrize(
    "command",
    [
        "openssl passwd -1 -stdin < pw.txt",
        "openssl passwd -6 -in pw.txt",
        "openssl enc -aes-256-cbc -k $PW -in f",
        "openssl pkcs12 -in a.p12 --passin=env:P12_PW",
        "openssl rand -hex 32; openssl x509 -in cert.pem -noout -text",
        "openssl req -new -key k.pem -out r.csr -subj /CN=example.com",
    ],
)
def test_openssl_without_a_password_is_not_flagged(command: str) -> None:
    assert find_secrets(command) == []


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        # XML elements (Maven's settings.xml, SOAP, app.config).
        ("<server><id>nexus</id><password>S3cretPw9</password></server>", "S3cretPw9"),
        ("<ns:Password>S3cretPw9</ns:Password>", "S3cretPw9"),
        # SQL.
        ("CREATE USER 'app'@'%' IDENTIFIED BY 'S3cretPw9';", "S3cretPw9"),
        ("ALTER USER app IDENTIFIED BY S3cretPw9;", "S3cretPw9"),  # Oracle
        ("CREATE ROLE app WITH LOGIN PASSWORD 'S3cretPw9';", "S3cretPw9"),
        ("ALTER ROLE app PASSWORD 'S3cretPw9'", "S3cretPw9"),
        ("ALTER USER app WITH ENCRYPTED PASSWORD 'S3cret''Pw9'", "S3cret''Pw9"),
        # A password piped into a tool that reads its input.
        ("echo S3cretPw9 | sudo -S apt-get update", "S3cretPw9"),
        ("echo 'S3cretPw9' | sudo -k -S -u root ls", "S3cretPw9"),
        ("echo S3cretPw9 | docker login -u bot --password-stdin ghcr.io", "S3cretPw9"),
        # Form data, a query string, a %-encoded one inside another URL.
        ("curl -d 'user=alice&pass=S3cretPw9' https://x/login", "S3cretPw9"),
        ("GET /login?user=alice&password=S3cretPw9&remember=1", "S3cretPw9"),
        ("https://x/cb?next=%2Flogin%3Fuser%3Da%26password%3DS3cretPw9%26r%3D1", "S3cretPw9"),
        # FreeRDP's and cmdkey's slash options.
        ("xfreerdp /u:alice /p:S3cretPw9 /v:10.0.0.5", "S3cretPw9"),
        ("XFREERDP /U:alice /P:'S3cret Pw9' /V:host", "S3cret Pw9"),
        ("cmdkey /generic:TERMSRV/host /user:alice /pass:S3cretPw9", "S3cretPw9"),
    ],
)
def test_a_password_in_xml_sql_a_pipe_a_form_or_an_rdp_command_is_found(
    text: str, secret: str
) -> None:
    # The smaller leaks review r7secrets listed besides its findings.
    assert [s.value(text) for s in find_secrets(text)] == [secret]


@pytest.mark.parametrize(
    "text",
    [
        "<password>${env.NEXUS_PW}</password> <password>********</password>",
        "<secret>true</secret> <passwordPolicy>strict</passwordPolicy>",
        "The user is identified by their email address.",
        "ALTER USER app IDENTIFIED BY VALUES 'S:0a1b2c'; ALTER USER x IDENTIFIED EXTERNALLY",
        "Type the password 'carefully', the prompt said.",
        'echo "$PW" | sudo -S ls; echo $CR_PAT | docker login -u bot --password-stdin ghcr.io',
        "echo hello | sudo tee /etc/motd; echo done | sort -S 1G",
        "GET /report?tests=212&pass=1234&fail=0",
        "xfreerdp /u:alice /v:host /p:$RDP_PW; cmdkey /list",
    ],
)
def test_those_shapes_without_a_password_are_not_flagged(text: str) -> None:
    assert find_secrets(text) == []


def test_a_query_strings_password_leaves_the_next_parameters() -> None:
    # The unquoted value of password= ran on over "&remember=1".
    text = "POST /login?user=alice&password=S3cretPw9&remember=1&next=/home"
    assert _redact(text) == (
        "POST /login?user=alice&password=[REDACTED:password]&remember=1&next=/home"
    )


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("127.0.0.1:6379> AUTH S3cretPw9\nOK", "S3cretPw9"),
        ("127.0.0.1:6379> AUTH alice S3cretPw9\nOK", "S3cretPw9"),
        ("cache.internal:6379[2]> auth S3cretPw9", "S3cretPw9"),
        ("redis 127.0.0.1:6379> AUTH S3cretPw9", "S3cretPw9"),
        ('[::1]:6379> AUTH "S3cret Pw9"', "S3cret Pw9"),
        ("127.0.0.1:6379> CONFIG SET requirepass S3cretPw9", "S3cretPw9"),
        # A transcript as a JSON string.
        ('{"output": "127.0.0.1:6379> AUTH S3cretPw9\\nOK\\n"}', "S3cretPw9"),
    ],
)
def test_auth_at_a_redis_cli_prompt_in_a_transcript_is_found(text: str, secret: str) -> None:
    # Only redis-cli's command line was read (redis-cli AUTH PW); its
    # interactive prompt's AUTH PW went out as written.
    assert [s.value(text) for s in find_secrets(text)] == [secret]


@pytest.mark.parametrize(
    ("command", "secret"),
    [
        ('curl --data-urlencode "password=S3cret Pw9" https://x/login', "S3cret Pw9"),
        ("curl --data-urlencode 'user[password]=S3cret & Pw9' https://x", "S3cret & Pw9"),
        ("curl -sd 'user=alice&password=S3cret Pw9&remember=1' https://x", "S3cret Pw9"),
        ("curl --data 'user=alice&pass=S3cret Pw9' https://x", "S3cret Pw9"),
        ('curl -F "password=S3cret Pw9" -F file=@a.txt https://x', "S3cret Pw9"),
        ("wget --post-data 'user=alice&password=S3cret Pw9' https://x", "S3cret Pw9"),
        (
            json.dumps({"cmd": 'curl --data-urlencode "password=S3cret Pw9" https://x'}),
            "S3cret Pw9",
        ),
    ],
)
def test_a_form_fields_password_with_a_space_is_found_whole(command: str, secret: str) -> None:
    # Only "S3cret" was redacted (the assignment rules end a bare value at a
    # space); " Pw9" reached a remote summarizer.
    assert [s.value(command) for s in find_secrets(command)] == [secret]


@pytest.mark.parametrize(
    ("command", "secret"),
    [
        ("psexec \\\\web1 -u CORP\\admin -p S3cretPw9 cmd.exe", "S3cretPw9"),
        ("PsExec64.exe \\\\web1 -s -u admin -p S3cretPw9 ipconfig", "S3cretPw9"),
        ("evil-winrm -i 10.0.0.5 -u admin -p S3cretPw9", "S3cretPw9"),
        ("evil-winrm -i 10.0.0.5 -u admin -H 32ed87bdb5fdc5e9cba88547376818d4", None),
        ("az login -u alice@example.com -p S3cretPw9", "S3cretPw9"),
        ("az login --service-principal -u app-id --password S3cretPw9 --tenant t", "S3cretPw9"),
        ("az login --service-principal -u app-id --password=S3cretPw9 --tenant t", "S3cretPw9"),
        ("oc login -u developer -p S3cretPw9 https://api.ocp:6443", "S3cretPw9"),
        ('["oc", "login", "-u", "dev", "-p", "S3cretPw9"]', "S3cretPw9"),
        ("helm repo add priv https://charts.x --username bot --password S3cretPw9", "S3cretPw9"),
        ("helm repo add priv https://charts.x --username bot --password=S3cretPw9", "S3cretPw9"),
        ("net user alice S3cretPw9", "S3cretPw9"),
        ("net user alice S3cretPw9 /add /domain", "S3cretPw9"),
        ("NET USER svc_backup S3cretPw9 /ADD", "S3cretPw9"),
    ],
)
def test_a_password_given_to_remote_admin_and_cloud_tools_is_found(
    command: str, secret: str | None
) -> None:
    expected = secret or "32ed87bdb5fdc5e9cba88547376818d4"  # evil-winrm's NTLM hash
    assert [s.value(command) for s in find_secrets(command)] == [expected]


@pytest.mark.parametrize(
    ("command", "secret"),
    [
        ("keytool -importcert -keystore k.jks -storepass S3cretPw9 -file c.pem", "S3cretPw9"),
        ("jarsigner -keystore k.jks -storepass S3cretPw9 app.jar signer", "S3cretPw9"),
        ("gpg --batch --pinentry-mode loopback --passphrase S3cretPw9 -d f.gpg", "S3cretPw9"),
        ("zip -P S3cretPw9 -r out.zip dir", "S3cretPw9"),
        ("unzip -P S3cretPw9 out.zip", "S3cretPw9"),
        ("7z a -pS3cretPw9 -mhe=on out.7z dir", "S3cretPw9"),
        ("sqlplus scott/S3cretPw9@//db.internal:1521/orcl", "S3cretPw9"),
        ("expdp system/S3cretPw9 DIRECTORY=dp FULL=y", "S3cretPw9"),
        ("rman target sys/S3cretPw9@prod", "S3cretPw9"),
        ("lftp -u alice,S3cretPw9 sftp://files.example.com", "S3cretPw9"),
        ("rabbitmqctl add_user alice S3cretPw9", "S3cretPw9"),
        ("rabbitmqctl -n rabbit@mq1 change_password alice S3cretPw9", "S3cretPw9"),
        ("mosquitto_pub -h broker -u iot -P S3cretPw9 -t t -m on", "S3cretPw9"),
        ("nxc smb 10.0.0.5 -u admin -p S3cretPw9 --shares", "S3cretPw9"),
        ("crackmapexec winrm 10.0.0.5 -u admin -p S3cretPw9", "S3cretPw9"),
        ("smbmap -H 10.0.0.5 -u admin -p S3cretPw9", "S3cretPw9"),
        ("rdesktop -u admin -p S3cretPw9 10.0.0.5", "S3cretPw9"),
        ("ssh-keygen -p -N S3cretPw9 -f ~/.ssh/id_ed25519", "S3cretPw9"),
        ("rclone copy a remote: --sftp-pass S3cretPw9", "S3cretPw9"),
        ("vault login S3cretPw9tok", "S3cretPw9tok"),
        ("vault login -no-print -address https://vault:8200 S3cretPw9tok", "S3cretPw9tok"),
        ("kubectl --token S3cretPw9tok get pods", "S3cretPw9tok"),
        ("influx setup --username admin --password S3cretPw9 --org acme", "S3cretPw9"),
        ("cqlsh -u cassandra -p S3cretPw9 db1", "S3cretPw9"),
        ("clickhouse-client --user default --password S3cretPw9", "S3cretPw9"),
        ("impacket-psexec admin:S3cretPw9@10.0.0.5", "S3cretPw9"),
        ("psexec.py corp/admin:S3cr@tPw9@10.0.0.5 -dc-ip 10.0.0.1", "S3cr@tPw9"),
        ("python3 GetUserSPNs.py corp.local/svc:S3cretPw9 -request", "S3cretPw9"),
        (
            "aws configure set aws_secret_access_key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ),
        ("npm config set //registry.npmjs.org/:_authToken S3cretPw9tok", "S3cretPw9tok"),
        ("echo '//registry.npmjs.org/:_authToken=S3cretPw9tok' >> .npmrc", "S3cretPw9tok"),
    ],
)
def test_a_password_given_to_more_command_line_tools_is_found(command: str, secret: str) -> None:
    assert [s.value(command) for s in find_secrets(command)] == [secret]


@pytest.mark.parametrize(
    "command",
    [
        "sudo --reset-timestamp mysql -uroot -pS3cretPw9 app",
        "env --debug mysql -uroot -pS3cretPw9 app",
        "strace --follow-forks mysql -uroot -pS3cretPw9 app",
        "unshare --fork --pid mysql -uroot -pS3cretPw9 app",
        "setsid --wait mysql -uroot -pS3cretPw9 app",
        "nohup --whatever mongosh -u admin -p S3cretPw9",
        '["sudo", "--reset-timestamp", "mysql", "-pS3cretPw9"]',
    ],
)
def test_a_tool_after_an_unlisted_boolean_long_flag_is_still_read(command: str) -> None:
    # Any --flag before a tool's name was taken for an option whose value the
    # name was, unless the flag was on a list of wrappers' flags.
    assert [s.value(command) for s in find_secrets(command)] == ["S3cretPw9"]


@pytest.mark.parametrize(
    "text",
    [
        # redis-cli's prompt without a password, or not a prompt at all.
        "127.0.0.1:6379> AUTH\n(error) ERR wrong number of arguments",
        "127.0.0.1:6379> GET auth\n127.0.0.1:6379> AUTH $REDIS_PASSWORD",
        "127.0.0.1:6379> CONFIG GET requirepass\n127.0.0.1:6379> AUTH a b c",
        "x> AUTH abcdef; <td>AUTH</td> hunter; 3 > auth token",
        # Form data without a password, or with a stand-in or a file.
        'curl --data-urlencode "q=select a b" -d @body.json https://x',
        "curl -d 'password=$PW' -sd 'user=alice&remember=1' --data 'passes=3&fails=0' https://x",
        # The tools' other options, prompts and stand-ins.
        "psexec -s -i cmd.exe; evil-winrm -i host -u admin -P 5986 -S",
        "az login --use-device-code; oc login --web https://api; helm repo add x https://c",
        "net user alice /domain; net user; the net user count grew by twelve percent today",
        "zip -r out.zip dir; unzip -P $ZIP_PW a.zip; 7z x -p archive.7z",
        "keytool -list -keystore k.jks -storepass:env KS_PW; gpg --passphrase-file pw.txt -d f",
        'ssh-keygen -t ed25519 -N "" -f key; kubectl get pods -o wide',
        "sqlplus / as sysdba; sqlplus /nolog; sqlplus -s @scripts/run.sql; rman target /",
        "lftp -u alice sftp://host; rabbitmqctl list_users; rabbitmqctl add_user alice",
        "vault login -method=oidc; vault login -; vault login -method userpass username=bob",
        "rclone config --ask-password=false; wmiexec.py corp/admin@10.0.0.5 -k -no-pass",
        "the zip file, the helm chart and the vault itself; I used kubectl --help",
        "aws configure set region eu-west-1; //registry.npmjs.org/:_authToken=${NPM_TOKEN}",
        # A tool's name as a naming option's value, then a port mapping.
        "docker run -d --hostname mysql -p3306:3306 mysql:8",
        "docker run --network-alias mongo -p 27017:27017 mongo:7; kubectl logs --container mongo -p",
    ],
)
def test_those_tools_and_prompts_without_a_password_are_not_flagged(text: str) -> None:
    assert find_secrets(text) == []


@pytest.mark.parametrize(
    "text_of",
    [
        lambda n: "127.0.0.1:6379> AUTH a b\n" * n,
        lambda n: "1> auth " * n,
        lambda n: "npm :_authToken " * n,
        lambda n: "aws_session_token " + "Ab" * (8 * n),
        lambda n: "curl -d '" + "password=&" * n + "'",
        lambda n: "curl --data-urlencode '" + "a_" * (4 * n) + "password=x'",
        lambda n: "psexec.py a:" + "@a" * (4 * n) + "@",
        lambda n: "sqlplus a/" + "b@" * (4 * n),
        lambda n: "net user " * n,
        lambda n: "vault login -x " * n,
        lambda n: "sudo --reset-timestamp " * n + "mysql -pS3cretPw9",
        lambda n: "psexec -p " * n,
        # r8secrets' fixes: camelCase keys, socket and MULTI prompts, continuations,
        # redirections, wrappers' flags, table options' values.
        lambda n: "aB" * (4 * n) + "Password",
        lambda n: "curl -d '" + "aB" * (4 * n) + "Token=x'",
        lambda n: "redis /" + "a" * (4 * n) + "> auth x\n",
        lambda n: "redis /a(TX)> auth " * n,
        lambda n: "psexec `\n" * n + "-p S3cretPw9",
        lambda n: "net user a b 2>" * n,
        lambda n: "flatpak-spawn --host " * n + "mysql -pS3cretPw9",
        lambda n: "keytool -storepass " * n,
        lambda n: "redis-server --requirepass " * n,
    ],
)
def test_the_new_command_and_prompt_rules_stay_linear(text_of: Any) -> None:
    # As the URL rule's: the 8x input takes less than 30x the 1x input's time.
    small = _find_seconds(text_of(1000))
    large = _find_seconds(text_of(8000), under=30 * small)
    assert large < 30 * small, (small, large)


@pytest.mark.parametrize(
    "text",
    [
        "the sshpass -p option is insecure; docker login -p flag is deprecated",
        "the zip -P option is insecure; evil-winrm -H option expects an NTLM hash",
        "keytool -storepass and -keypass must match; gpg --passphrase can read a file",
        "the helm --password flag: use --password-stdin; vault login with the -method flag",
        "rabbitmqctl add_user is how you create users",
    ],
)
def test_prose_about_a_password_option_is_not_flagged(text: str) -> None:
    # The word after the option is prose ("option", "and", "can"), no password.
    assert find_secrets(text) == []


def _known_by_context(text: str, span: Span) -> bool:
    """Whether ``span`` is a credential by what stands near it: its value alone is none."""
    return span.kind != "url_password" and find_secrets(span.value(text)) == []


@pytest.mark.parametrize(
    "planted", PLANTED + PLANTED_EXTRA, ids=[p.kind for p in PLANTED + PLANTED_EXTRA]
)
def test_find_secrets_by_context_finds_what_find_secrets_knows_by_context(
    planted: Planted,
) -> None:
    """The pins' cheap search (only around keys and tool names) misses no
    credential the detector knows by its context, and finds nothing it does not.
    (A URL's password is left to the pins' URL reading.)"""
    text = f"Earlier: we discussed the release. {planted.sentence} Then we moved on."
    every = find_secrets(text)
    by_context = find_secrets_by_context(text)
    assert set(by_context) <= set(every)
    assert [s for s in every if _known_by_context(text, s) and s not in by_context] == []


def test_find_secrets_by_context_finds_no_look_alike() -> None:
    assert find_secrets_by_context("\n".join(LOOKALIKES)) == []


@pytest.mark.parametrize(
    "unit", ["token ", "api_key=ab ", "pass:", "private key ", "curl -u a:b ", "sudo ", "net "]
)
def test_find_secrets_by_context_is_linear(unit: str) -> None:
    """Windows around each key are joined, not scanned once per key: the 8x input
    takes less than 30x the 1x input's time (linear: ~8x; quadratic: ~64x)."""

    def seconds(text: str) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            find_secrets_by_context(text)
            best = min(best, time.perf_counter() - start)
        return best

    count = 4096 // len(unit)
    small = seconds("see https://example.com/x " + unit * count)
    large = seconds("see https://example.com/x " + unit * 8 * count)
    assert large < 30 * small, (small, large)


# Session 8 review (r8secrets): leaks around the latest command-line rules.


def _caught(text: str, secret: str) -> bool:
    """Whether ``secret`` (as written in ``text``) lies inside one reported span."""
    at = text.index(secret)
    return any(s.start <= at and at + len(secret) <= s.end for s in find_secrets(text))


# r8secrets F1.
@pytest.mark.parametrize(
    ("text", "secret"),
    [
        # Bitnami's charts document exactly this form.
        ("helm install db bitnami/mysql --set auth.rootPassword=S3cretPw9", "S3cretPw9"),
        ("helm upgrade pg bitnami/postgresql --set auth.postgresPassword=S3cretPw9", "S3cretPw9"),
        ('{"username": "admin", "adminPassword": "S3cretPw9"}', "S3cretPw9"),
        ("grafana:\n  adminPassword: S3cretPw9\n", "S3cretPw9"),
        ('{"oldPassword": "x", "newPassword": "S3cretPw9"}', "S3cretPw9"),
        ('{"webhookSecret": "whk-9f8e7d6c5b4a"}', "whk-9f8e7d6c5b4a"),
        ("curl -d 'user=bob&newPassword=S3cretPw9' https://x/api", "S3cretPw9"),
    ],
)
def test_a_camel_case_password_key_is_read(text: str, secret: str) -> None:
    assert _caught(text, secret)


# r8secrets F2.
@pytest.mark.parametrize(
    "text",
    [
        "$ redis-cli -s /var/run/redis/redis-server.sock\n"
        "redis /var/run/redis/redis-server.sock> AUTH S3cretPw9\nOK",
        "redis /tmp/redis.sock[2]> AUTH default S3cretPw9\nOK",
        "127.0.0.1:6379(TX)> CONFIG SET requirepass S3cretPw9\nQUEUED",
    ],
)
def test_auth_at_every_redis_cli_prompt_is_found(text: str) -> None:
    assert _caught(text, "S3cretPw9")


# r8secrets F3.
@pytest.mark.parametrize(
    "text",
    [
        "az login --service-principal `\n  -u $appId `\n  -p S3cretPw9 `\n  --tenant $tenant",
        "psexec \\\\srv01 -u CORP\\admin `\n  -p S3cretPw9 cmd.exe",
        "keytool -importkeystore -srckeystore a.p12 `\n  -deststorepass S3cretPw9",
        "sqlcmd -S db01 -U sa `\n  -P S3cretPw9 -Q 'select 1'",
    ],
)
def test_a_powershell_backtick_continuation_goes_on_with_the_command(text: str) -> None:
    assert _caught(text, "S3cretPw9")


@pytest.mark.parametrize(
    "text",
    [
        "> az login --service-principal `\n>   -u $appId `\n>   -p S3cretPw9 `\n> --tenant t",
        "> mysql -u root \\\n>   -pS3cretPw9 shop",
        "> sshpass \\\n>\t-p S3cretPw9 ssh deploy@db01",
        '{"prompt": "> mysql -u root \\\\\\n>   -pS3cretPw9 shop"}',
    ],
)
def test_a_command_continued_over_quoted_lines_goes_on(text: str) -> None:
    # A summarizer's prompt quotes every line of a turn with "> ": the quote
    # after a continuation starts no new command (found by the redaction test).
    assert _caught(text, "S3cretPw9")


@pytest.mark.parametrize(
    "text",
    [
        "Log in with `vault login`\nthe token comes from the UI",
        "Use `sshpass -p`\nThe option is insecure; `net user alice`\nSecond line",
    ],
)
def test_a_markdown_code_spans_closing_backtick_continues_no_command(text: str) -> None:
    # PowerShell's continuation is a backtick after a space; a code span's is none.
    assert find_secrets(text) == []


# r8secrets F4.
@pytest.mark.parametrize(
    "text",
    [
        "net user svc_backup S3cretPw9 /add >nul 2>&1",
        "net user svc_backup S3cretPw9 /add 1>nul",
        json.dumps({"command": "net user svc_backup S3cretPw9 /add >nul 2>&1"}),
        "Invoke-Command -ComputerName srv01 -ScriptBlock { net user svc_backup S3cretPw9 /add }",
    ],
)
def test_net_user_password_before_a_redirection_is_found(text: str) -> None:
    assert _caught(text, "S3cretPw9")


# r8secrets F5.
@pytest.mark.parametrize(
    "text",
    [
        "flatpak-spawn --host mysql -uroot -pS3cretPw9 app",
        "unshare --net mysql -uroot -pS3cretPw9 app",
        "nsenter -t 4242 --net curl -u admin:S3cretPw9 http://10.0.0.5/",
        "bwrap --ro-bind / / --unshare-net curl -u admin:S3cretPw9 http://x/",
        "systemd-run --user mysql -uroot -pS3cretPw9",
        json.dumps(["flatpak-spawn", "--host", "redis-cli", "-a", "S3cretPw9", "ping"]),
    ],
)
def test_a_boolean_flag_named_like_a_naming_option_hides_no_tool(text: str) -> None:
    assert _caught(text, "S3cretPw9")


# r8secrets F6.
@pytest.mark.parametrize(
    "text",
    [
        "psexec \\\\srv01 -u admin -p -Xq7#vLp2 cmd",
        "keytool -genkeypair -alias a -storepass -Xq7#vLp2 -keystore k.jks",
        "zip -P -Xq7#vLp2 out.zip report.pdf",
        "gpg --batch --passphrase -Xq7#vLp2 -c notes.txt",
        "mosquitto_pub -h broker -u iot -P -Xq7#vLp2 -t t -m m",
        "evil-winrm -i 10.0.0.5 -u admin -p -Xq7#vLp2",
    ],
)
def test_a_password_starting_with_a_dash_is_found(text: str) -> None:
    # sshpass -p -Xq7#vLp2 and net user NAME -Xq7#vLp2 are found today.
    assert _caught(text, "-Xq7#vLp2")


# r8secrets F9.
@pytest.mark.parametrize(
    "text",
    [
        "command: redis-server --requirepass S3cretPw9 --appendonly yes",
        'command: ["redis-server", "--requirepass", "S3cretPw9"]',
        "redis-server /etc/redis.conf --masterauth S3cretPw9",
    ],
)
def test_redis_servers_requirepass_option_is_found(text: str) -> None:
    assert _caught(text, "S3cretPw9")


# r8secrets F10.
@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("mysql -uroot -pflag appdb", "flag"),
        ("7z x -pswitch backup.7z", "switch"),
        ("sshpass -p'then!' ssh root@h", "then!"),
    ],
)
def test_a_glued_password_is_never_prose(text: str, secret: str) -> None:
    assert _caught(text, secret)


# r8secrets F11.
@pytest.mark.parametrize(
    "text",
    [
        "Checked the svc account with net user svc_backup today",
        "Ran net user administrator twice",
        "The CI asks for vault login please",
    ],
)
def test_prose_naming_net_user_or_vault_login_is_not_flagged(text: str) -> None:
    assert find_secrets(text) == []


# -- key names written with a space (found by r10late) -------------------------------


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (
            "api key: sk-live-4f8a9b2c7d1e6f3a5b8c9d0e1f2a3b4c",
            "sk-live-4f8a9b2c7d1e6f3a5b8c9d0e1f2a3b4c",
        ),
        ("The API Key = 9f8e7d6c5b4a39281706f5e4d3c2b1a0", "9f8e7d6c5b4a39281706f5e4d3c2b1a0"),
        (
            "access token: ghx_9f8e7d6c5b4a39281706f5e4d3c2b1a0",
            "ghx_9f8e7d6c5b4a39281706f5e4d3c2b1a0",
        ),
        (
            "Priya said the api key is 4f8a9b2c7d1e6f3a5b8c9d0e1f2a3b4c.",
            "4f8a9b2c7d1e6f3a5b8c9d0e1f2a3b4c",
        ),
        ("the secret key was Zq9!vL2#pX7m, rotate it", "Zq9!vL2#pX7m"),
    ],
)
def test_a_key_name_written_with_a_space_is_a_key(text: str, secret: str) -> None:
    assert [text[s.start : s.end] for s in find_secrets(text)] == [secret]


@pytest.mark.parametrize(
    "text",
    [
        "the api key is invalid",
        "the access token is expired.",
        "the API key is in the vault",
        "our api key was rotated on Monday.",
        "api key rotation is due",
        "private key: ~/.ssh/id_ed25519",
    ],
)
def test_prose_about_a_spaced_key_name_is_not_a_secret(text: str) -> None:
    assert find_secrets(text) == []


@pytest.mark.parametrize(
    "sentence",
    [
        "Remember the api key: 3fa9c0d1e2f3a4b5c6d7e8f9a0b1c2d3 for staging.",
        "The API Key = 3fa9c0d1e2f3a4b5c6d7e8f9a0b1c2d3 goes in the vault.",
        "Here is the api key:\n3fa9c0d1e2f3a4b5c6d7e8f9a0b1c2d3\nuse it for staging.",
        "the api key is 3fa9c0d1e2f3a4b5c6d7e8f9a0b1c2d3, keep it safe",
        "privatekey=3fa9c0d1e2f3a4b5c6d7e8f9a0b1c2d3",
    ],
)
def test_find_secrets_by_context_finds_a_key_name_spelled_with_a_space(sentence: str) -> None:
    """ "api key" (88354c9 taught the detector key names spelled with a space) was
    no literal of the cheap search: the pins' and the carried lines' screen missed
    it, and "api key: 3fa9…" pinned the value in MEMORY.md (r11carry)."""
    every = [s for s in find_secrets(sentence) if _known_by_context(sentence, s)]
    assert every and set(every) <= set(find_secrets_by_context(sentence))
