"""Locality of summarizers and redaction with keyed placeholders (pure)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.secret_corpus import LOOKALIKES, PLANTED, PLANTED_EXTRA, Planted

from memd.core.config import MemdConfig, PrivacyConfig, SummarizerConfig
from memd.core.privacy import (
    Privacy,
    Redactor,
    is_local_summarizer,
    outbound_redaction,
    unredacted_remote_warning,
)
from memd.core.secrets import PLACEHOLDER_RE

KEY = b"k" * 32
OTHER_KEY = b"o" * 32


@pytest.mark.parametrize(
    ("model", "api_base", "local"),
    [
        ("builtin", "", True),
        ("Builtin ", "", True),
        ("ollama/llama3.1", "", True),
        ("ollama_chat/qwen2", "", True),
        ("ollama/llama3.1", "http://gpu.example.net:11434", False),
        ("openai/gpt-4o-mini", "", False),
        ("anthropic/claude-haiku-4-5", "", False),
        ("openai/x", "http://127.0.0.1:8000/v1", True),
        ("openai/x", "http://127.3.4.5:8000/v1", True),
        ("openai/x", "http://localhost:8000", True),
        ("openai/x", "http://llm.localhost:8000", True),
        ("openai/x", "http://[::1]:8080/v1", True),
        ("openai/x", "127.0.0.1:8080", True),
        ("openai/x", "unix:///run/llm.sock", True),
        ("openai/x", "http+unix://%2Frun%2Fllm.sock/v1", True),
        ("openai/x", "https://api.openai.com/v1", False),
        ("openai/x", "http://10.0.0.5:8000", False),
        ("openai/x", "http://0.0.0.0:8000", False),
        ("openai/x", "http://127.0.0.1.evil.example:80", False),
        ("openai/x", "http://localhost.evil.example", False),
        ("openai/x", "http://user:pw@127.0.0.1@evil.example", False),
        # Providers that ignore api_base post to their cloud whatever it says.
        ("replicate/meta/meta-llama-3-8b-instruct", "http://127.0.0.1:8000", False),
        ("sagemaker/summarizer", "http://127.0.0.1:8000", False),
        ("bedrock/anthropic.claude-v2", "http://localhost:8000", False),
        ("hosted_vllm/qwen2", "http://127.0.0.1:8000/v1", True),
        ("anthropic/claude-haiku-4-5", "http://127.0.0.1:8080", True),
        ("ollama_chat/qwen2", "http://[::1]:11434", True),
        # A bare name goes where litellm infers: unknown here, so remote.
        ("gpt-4o-mini", "http://127.0.0.1:8000/v1", False),
        ("gpt-4o-mini", "", False),
    ],
)
def test_what_counts_as_local(model: str, api_base: str, local: bool) -> None:
    assert is_local_summarizer(model, api_base) is local


# Where litellm would route these bare names (the shell asks litellm itself).
_ROUTES = {
    "gpt-4o": "openai",
    "claude-sonnet-4-6": "anthropic",
    "anthropic.claude-v2": "bedrock",
    "gemini-1.5-pro": "vertex_ai",
}


@pytest.mark.parametrize(
    ("model", "local"),
    [
        ("gpt-4o", True),
        ("claude-sonnet-4-6", True),
        # Providers that ignore api_base: the request goes to their cloud.
        ("anthropic.claude-v2", False),
        ("gemini-1.5-pro", False),
        # litellm cannot tell: remote (redacted) when unsure.
        ("my-own-model", False),
    ],
)
def test_a_bare_model_name_is_judged_by_the_provider_litellm_routes_it_to(
    model: str, local: bool
) -> None:
    asked: list[str] = []

    def provider_of(name: str) -> str | None:
        asked.append(name)
        return _ROUTES.get(name)

    assert is_local_summarizer(model, "http://127.0.0.1:8000/v1", (), provider_of) is local
    assert asked == [model]
    config = MemdConfig(
        summarizer=SummarizerConfig(model=model, api_base="http://127.0.0.1:8000/v1")
    )
    redactor = Privacy(KEY).outbound(model, "http://127.0.0.1:8000/v1", provider_of)
    assert (redactor is None) is local
    assert (outbound_redaction(config, provider_of) == "none (local summarizer)") is local
    # Not local whatever the provider: nothing to ask.
    asked.clear()
    assert not is_local_summarizer(model, "https://llm.example.com/v1", (), provider_of)
    assert asked == []


def test_doctor_is_told_when_the_provider_may_ignore_api_base() -> None:
    from memd.core.privacy import api_base_ignored_warning

    def config(model: str, api_base: str = "http://127.0.0.1:8000/v1") -> MemdConfig:
        return MemdConfig(summarizer=SummarizerConfig(model=model, api_base=api_base))

    def provider_of(name: str) -> str | None:
        return {"replicate/meta/llama": "replicate", **_ROUTES}.get(name)

    bedrock = api_base_ignored_warning(config("anthropic.claude-v2"), provider_of)
    assert bedrock is not None and "'bedrock'" in bedrock and "http://127.0.0.1:8000/v1" in bedrock
    replicate = api_base_ignored_warning(config("replicate/meta/llama"), provider_of)
    assert replicate is not None and "'replicate'" in replicate
    unknown = api_base_ignored_warning(config("my-own-model"), provider_of)
    assert unknown is not None and "infers no provider" in unknown
    assert api_base_ignored_warning(config("gpt-4o"), provider_of) is None
    assert api_base_ignored_warning(config("anthropic.claude-v2", ""), provider_of) is None

    def never(name: str) -> str | None:
        raise AssertionError("a known prefix needs no lookup")

    assert api_base_ignored_warning(config("openai/my-model"), never) is None
    assert api_base_ignored_warning(config("builtin"), never) is None


def test_local_hosts_add_names_and_networks() -> None:
    assert not is_local_summarizer("openai/x", "http://gpu-box:8000")
    assert is_local_summarizer("openai/x", "http://GPU-box:8000", ("gpu-box",))
    assert is_local_summarizer("openai/x", "http://10.1.2.3:8000", ("10.1.0.0/16",))
    assert not is_local_summarizer("openai/x", "http://10.2.2.3:8000", ("10.1.0.0/16",))


def test_placeholders_are_typed_keyed_and_stable() -> None:
    redactor = Redactor(KEY, pii=True)
    planted = PLANTED[3]  # the AWS access key id
    first = redactor.redact(planted.sentence)
    second = redactor.redact("again: " + planted.secret)
    [placeholder] = PLACEHOLDER_RE.findall(first.text)
    assert re.fullmatch(r"\[REDACTED:aws_access_key#[0-9a-f]{6}\]", placeholder)
    assert placeholder in second.text
    assert first.kinds == {"aws_access_key": 1} and first.count == 1
    # Another workspace (another key) gives another hash: no cross-workspace linking.
    assert placeholder not in Redactor(OTHER_KEY, pii=True).redact(planted.sentence).text


def test_same_card_or_phone_however_spaced_same_placeholder() -> None:
    redactor = Redactor(KEY, pii=True)
    spaced = redactor.redact("card 4111 1111 1111 1111").text
    joined = redactor.redact("card 4111111111111111").text
    assert spaced == joined


def test_a_quoted_pem_block_hashes_like_the_raw_one() -> None:
    pem = next(p for p in PLANTED if p.kind == "private_key").secret
    quoted = "\n".join("> " + line for line in pem.split("\n"))
    redactor = Redactor(KEY, pii=False)
    assert PLACEHOLDER_RE.findall(redactor.redact(pem).text) == PLACEHOLDER_RE.findall(
        redactor.redact(quoted).text
    )


@pytest.mark.parametrize("planted", PLANTED + PLANTED_EXTRA, ids=lambda p: p.kind)
def test_no_planted_secret_survives_outbound_redaction(planted: Planted) -> None:
    redactor = Privacy(KEY).outbound("openai/gpt-4o-mini", "")
    assert redactor is not None
    redacted = redactor.redact(planted.sentence).text
    assert planted.secret not in redacted
    assert f"[REDACTED:{planted.kind}#" in redacted


def test_redaction_is_idempotent_and_leaves_lookalikes_alone() -> None:
    redactor = Redactor(KEY, pii=True)
    text = "\n".join([*(p.sentence for p in PLANTED), *LOOKALIKES])
    once = redactor.redact(text).text
    assert redactor.redact(once).count == 0
    for lookalike in LOOKALIKES:
        assert lookalike in once


@given(st.text(max_size=300))
def test_redaction_never_grows_a_secret_back(text: str) -> None:
    redacted = Redactor(KEY, pii=True).redact(text)
    assert Redactor(KEY, pii=True).redact(redacted.text).text == redacted.text


def test_user_patterns_are_redacted() -> None:
    privacy = Privacy(KEY, PrivacyConfig(patterns={"ticket-secret": r"TS-[0-9]{8}"}))
    redactor = privacy.outbound("openai/x", "")
    assert redactor is not None
    out = redactor.redact("the vault code is TS-12345678 today").text
    assert "TS-12345678" not in out and "[REDACTED:ticket_secret#" in out
    assert "[REDACTED:ticket_secret#" in privacy.for_reply().redact("TS-12345678").text


def test_local_models_receive_text_as_written_unless_configured() -> None:
    assert Privacy(KEY).outbound("builtin", "") is None
    assert Privacy(KEY).outbound("openai/x", "http://127.0.0.1:9/v1") is None
    forced = Privacy(KEY, PrivacyConfig(redact_local=True)).outbound("ollama/x", "")
    assert forced is not None and forced.pii


def test_pii_on_by_default_for_remote_only_and_switchable() -> None:
    remote = Privacy(KEY).outbound("openai/x", "")
    assert remote is not None and remote.pii
    off = Privacy(KEY, PrivacyConfig(redact_pii=False)).outbound("openai/x", "")
    assert off is not None and not off.pii
    assert Privacy(KEY, PrivacyConfig(redact=False)).outbound("openai/x", "") is None


def test_replies_lose_credentials_always_and_pii_when_it_was_redacted() -> None:
    sentence = "key " + PLANTED[5].secret + " mail dana.whitfield@example.org"
    reply = Privacy(KEY, PrivacyConfig(redact=False)).for_reply().redact(sentence).text
    assert PLANTED[5].secret not in reply and "dana.whitfield@example.org" in reply
    assert "dana.whitfield" not in Privacy(KEY).for_reply(pii=True).redact(sentence).text
    explicit = Privacy(KEY, PrivacyConfig(redact_pii=True)).for_reply().redact(sentence).text
    assert "dana.whitfield" not in explicit


def test_warning_for_a_remote_summarizer_with_redaction_off() -> None:
    remote = SummarizerConfig(model="openai/gpt-4o-mini")
    off = PrivacyConfig(redact=False)
    warning = unredacted_remote_warning(MemdConfig(summarizer=remote, privacy=off))
    assert warning is not None and "redact = false" in warning and "openai" in warning
    assert unredacted_remote_warning(MemdConfig(summarizer=remote)) is None
    local = SummarizerConfig(model="openai/x", api_base="http://127.0.0.1:1/v1")
    assert unredacted_remote_warning(MemdConfig(summarizer=local, privacy=off)) is None


def test_what_the_ready_line_says_the_summarizer_is_sent() -> None:
    remote = SummarizerConfig(model="openai/gpt-4o-mini")
    assert outbound_redaction(MemdConfig()) == "none (local summarizer)"
    assert outbound_redaction(MemdConfig(summarizer=remote)) == "credentials and personal data"
    no_pii = PrivacyConfig(redact_pii=False)
    assert outbound_redaction(MemdConfig(summarizer=remote, privacy=no_pii)) == "credentials"
    off = PrivacyConfig(redact=False)
    assert outbound_redaction(MemdConfig(summarizer=remote, privacy=off)) == "off (remote)"
    forced = PrivacyConfig(redact_local=True, redact_pii=False)
    assert outbound_redaction(MemdConfig(privacy=forced)) == "credentials"


def test_a_reply_repeating_a_material_secret_loses_it_however_it_is_formatted() -> None:
    # Review 14f, F5: a table cell or "the key (x)" is no assignment the detector
    # reads; the value itself, found in the summarized material, is replaced.
    material = (
        "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\nDB_PASSWORD=Tr0ub4dor&3xq"
    )
    redactor = Redactor(KEY, pii=False)
    known = redactor.values_in(material)
    assert {kind for kind, _value in known} == {"aws_secret_key", "password"}
    reply = (
        "| name | value |\n| password | Tr0ub4dor&3xq |\n"
        "The AWS key (wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY) was shared.\n"
        "Tr0ub4dor&3xqZ is another word entirely."
    )
    scrubbed = redactor.redact(reply, known)
    assert "Tr0ub4dor&3xq |" not in scrubbed.text and "EXAMPLEKEY" not in scrubbed.text
    assert "Tr0ub4dor&3xqZ is another word" in scrubbed.text  # whole values only
    assert scrubbed.kinds == {"password": 1, "aws_secret_key": 1}
    # The same placeholder as the material's own redaction gives it.
    assert redactor.placeholder("password", "Tr0ub4dor&3xq") in scrubbed.text
    assert redactor.placeholder("password", "Tr0ub4dor&3xq") in redactor.redact(material).text


def test_values_in_prose_are_none() -> None:
    assert Redactor(KEY, pii=True).values_in("\n".join(LOOKALIKES)) == ()


# Review 15b: the search for known credential values.
def test_a_type_name_in_the_material_is_not_redacted_all_over_the_reply() -> None:
    """A local model summarizes a TypeScript session: ``password: string;`` is read
    by the password= rule as a value (already a false positive outbound), and since
    b64a699 the word ``string`` is replaced wherever it stands in the summary."""
    scan = Redactor(b"k" * 32, pii=False)
    material = "interface Login {\n  username: string;\n  password: string;\n}\n"
    known = scan.values_in(material)
    reply = "The Login type has a username and a password, each a string. Parse the string."
    assert scan.redact(reply, known).text == reply


def test_a_value_found_in_escaped_json_is_searched_for_as_the_model_writes_it() -> None:
    """A tool result that is JSON inside JSON, from an encoder that writes "/" as
    "\\/" (PHP, some HTTP APIs): a local model reads it as written and repeats the
    key unescaped in a Markdown table, a form the detector does not read."""
    scan = Redactor(b"k" * 32, pii=False)
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    inner = json.dumps({"aws_secret_access_key": secret})
    material = json.dumps({"output": inner}).replace("/", "\\/")
    reply = f"| item | value |\n|---|---|\n| AWS secret | {secret} |"
    assert secret not in scan.redact(reply, scan.values_in(material)).text


@pytest.mark.parametrize("password", ['p"w\\d-9x', "\u00c4bc-9x-Q\U0001f600", "a/b\\\\c-9x"])
@pytest.mark.parametrize("template", ["export DB_PASSWORD='{}'", "mysql -uroot -p'{}' app"])
def test_a_secret_written_raw_and_json_escaped_gets_one_placeholder(
    password: str, template: str
) -> None:
    # The placeholder hashed the value as found: p"w\d as written and p\"w\\d
    # in a tool call's JSON (or \u00c4 for Ä) were two secrets to the summary.
    raw = template.format(password)
    once = json.dumps({"cmd": raw})
    twice = json.dumps({"arguments": once})
    redactor = Redactor(KEY, pii=False)
    found = [PLACEHOLDER_RE.findall(redactor.redact(text).text) for text in (raw, once, twice)]
    assert len(found[0]) == 1 and found[0] == found[1] == found[2], found
    # A reply that repeats the value (found in the turns) gets the same placeholder.
    known = redactor.values_in(once)
    assert PLACEHOLDER_RE.findall(redactor.redact(f"use {password} now", known).text) == found[0]


# Session 8 review (r8secrets): shell-escaped passwords and spaced ones.
# r8secrets F7.
@pytest.mark.parametrize(
    ("turns", "reply"),
    [
        ('ran: mysql -uroot -p"Pa\\$word1" appdb', "| appdb | root | Pa$word1 |"),
        ("ran: sshpass -p 'it'\\''s-s3cret' ssh h", "ssh creds: (it's-s3cret)"),
        ("ran: psexec \\\\srv -u admin -p Pa\\!ssw0rd cmd", "admin / Pa!ssw0rd on srv"),
    ],
)
def test_a_reply_loses_a_shell_escaped_command_password(turns: str, reply: str) -> None:
    redactor = Redactor(KEY, pii=False)
    scrubbed = redactor.redact(reply, redactor.values_in(turns)).text
    assert "Pa$word1" not in scrubbed
    assert "it's-s3cret" not in scrubbed
    assert "Pa!ssw0rd" not in scrubbed


def test_a_shell_escaped_password_gets_the_assignments_placeholder() -> None:
    redactor = Redactor(KEY, pii=False)
    text = redactor.redact('mysql -uroot -p"Pa\\$word1" appdb\nDB_PASSWORD=Pa$word1\n').text
    first, second = text.splitlines()
    assert first.split('"')[1] == second.removeprefix("DB_PASSWORD=")


# r8secrets F8.
@pytest.mark.parametrize(
    "text",
    [
        'net user admin "Winter 2024!" /add\nnet user admin Winter2024! /add',
        'psexec \\\\h -u a -p "Pa55 word" cmd\npsexec \\\\h -u a -p Pa55word cmd',
        'curl --data-urlencode "password=correct horse battery" https://x\n'
        "DB_PASSWORD=correcthorsebattery",
    ],
)
def test_two_passwords_differing_by_a_space_get_two_placeholders(text: str) -> None:
    redacted = Redactor(KEY, pii=False).redact(text)
    assert redacted.count == 2
    placeholders = [word for word in redacted.text.split() if "REDACTED" in word]
    first, second = (p.strip("\"'").split("=")[-1] for p in placeholders)
    assert first != second
