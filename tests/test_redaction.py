"""Redaction observed where it matters: what the LLM test server received, what MEMORY.md holds.

The test server listens on 127.0.0.1, a local address; ``[privacy] redact_local
= true`` (for a loopback proxy to a remote provider) makes memd treat it as a
remote summarizer, which is the path under test.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from support.memfiles import AgentWorkspace, append_entry
from support.openai_server import OpenAITestServer
from support.secret_corpus import PLANTED, PLANTED_EXTRA, Planted
from support.wire import options_for

from memd.audit import audit_path, read_audit
from memd.compaction import CompactionOptions, compact_agent
from memd.core import memfile
from memd.core.config import MemdConfig, PrivacyConfig, SummarizerConfig
from memd.core.secrets import PLACEHOLDER_RE
from memd.core.summary_block import parse_summary
from memd.llm import LiteLLMSummarizer, import_litellm
from memd.redaction_key import key_path, load_or_create_key
from memd.summarizers import BuiltinSummarizer
from memd.workspace import AgentPaths

ALL_PLANTED = PLANTED + PLANTED_EXTRA
CREDENTIALS = tuple(p for p in ALL_PLANTED if not p.pii)
PLACEHOLDER_OF = re.compile(r"\[REDACTED:([a-z0-9_]+)#([0-9a-f]{6})\]")


@pytest.fixture(scope="module", autouse=True)
def _litellm_once() -> None:
    import_litellm()


def user_text(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


def echo_prompt(body: dict[str, Any]) -> str:
    """The worst model: its 'summary' is everything it was sent."""
    return "Facts:\n" + user_text(body)


def config_for(server: OpenAITestServer, **privacy: Any) -> MemdConfig:
    return MemdConfig(
        summarizer=SummarizerConfig(
            model="openai/test-model",
            api_base=server.api_base,
            api_key=SecretStr("sk-test-5f3a9c"),
            timeout_s=5,
            retries=2,
            max_tokens=3000,
            context_length=32_000,
        ),
        privacy=PrivacyConfig(**privacy),
    )


def plant_everything(ws: AgentWorkspace, name: str = "alpha") -> AgentPaths:
    """Every planted secret in a turn, and a previous summary that still holds some
    (as an older memd wrote them), pinned facts included."""
    paths = ws.create_agent(name)
    stale = "\n\n".join(
        [
            "Facts:\n- the deploy token is " + PLANTED[5].secret,
            "Pinned facts (kept verbatim; raw turns in the archives):\n2026-01-01:\n"
            "- " + PLANTED[13].secret,
            "memd-summary: v2",
        ]
    )
    with paths.memory.open("ab") as handle:
        handle.write(memfile.render_summary_block(stale, "2026-01-01T09:00:00"))
    for index, planted in enumerate(ALL_PLANTED):
        append_entry(paths.memory, "Human" if index % 2 == 0 else "AI", planted.sentence)
    return paths


def leaked(text: str, planted: tuple[Planted, ...] = ALL_PLANTED) -> list[str]:
    """Kinds whose secret is in ``text``, also once turns' "> " quoting is taken off."""
    unquoted = re.sub(r"(?m)^[ \t]*> ?", "", text)
    return [p.kind for p in planted if p.secret in text or p.secret in unquoted]


def sent(server: OpenAITestServer) -> str:
    """Everything the server received, bodies as JSON text and decoded."""
    return "\n".join(
        json.dumps(r.body, ensure_ascii=False) + "\n" + r.prompt_text for r in server.requests
    )


def test_no_planted_secret_reaches_a_remote_summarizer(agent_ws: AgentWorkspace) -> None:
    paths = plant_everything(agent_ws, "beta")
    with OpenAITestServer(echo_prompt) as server:
        config = config_for(server, redact_local=True)
        # A failure, a retry and a truncated answer re-asked: every request is checked.
        server.script("http:500", "length")
        outcome = compact_agent(
            paths, LiteLLMSummarizer(config.summarizer), options_for(config, b"k" * 32)
        )
        assert len(server.requests) == 3
        wire = sent(server)
    assert leaked(wire) == []
    for planted in ALL_PLANTED:
        assert f"[REDACTED:{planted.kind}#" in wire, planted.kind
    assert outcome.redacted >= len(ALL_PLANTED)
    memory = paths.memory.read_text()
    assert leaked(memory) == []


def test_placeholders_are_stable_across_compactions(agent_ws: AgentWorkspace) -> None:
    paths = agent_ws.create_agent("gamma")
    token = PLANTED[5]  # ghp_
    email = PLANTED[13]
    key = load_or_create_key(agent_ws.root / "redaction.key")
    with OpenAITestServer(echo_prompt) as server:
        config = config_for(server, redact_local=True)
        summarizer = LiteLLMSummarizer(config.summarizer)
        for round_ in range(2):
            append_entry(paths.memory, "Human", f"round {round_}: {token.sentence}")
            append_entry(paths.memory, "AI", f"round {round_}: {email.sentence}")
            compact_agent(paths, summarizer, options_for(config, key))
        first, second = (user_text(r.body) for r in server.requests)
    assert leaked(first + second) == []
    for kind in ("github_token", "email"):
        in_first = {h for k, h in PLACEHOLDER_OF.findall(first) if k == kind}
        in_second = {h for k, h in PLACEHOLDER_OF.findall(second) if k == kind}
        assert len(in_first) == 1 and in_first == in_second, kind
    # The second request carries the first summary (placeholders kept) and new turns.
    assert second.count("[REDACTED:github_token#") >= 2


def test_an_echoed_secret_never_lands_in_memory(agent_ws: AgentWorkspace) -> None:
    paths = agent_ws.create_agent("delta")
    for index in range(6):
        append_entry(paths.memory, "Human", f"turn {index}: we discussed the session handling.")
    jwt = next(p for p in PLANTED if p.kind == "jwt").secret
    echoed = f"Facts:\n- the session cookie is {jwt}\n- contact {PLANTED[13].secret}"
    with OpenAITestServer() as server:
        config = config_for(server, redact_local=True)
        server.script(f"ok:{echoed}")
        outcome = compact_agent(
            paths, LiteLLMSummarizer(config.summarizer), options_for(config, b"k" * 32)
        )
    memory = paths.memory.read_text()
    assert jwt not in memory and PLANTED[13].secret not in memory
    assert "[REDACTED:jwt#" in memory and "[REDACTED:email#" in memory
    assert outcome.reply_redacted == 2


def test_a_secret_behind_a_terminal_escape_neither_leaves_nor_lands(
    agent_ws: AgentWorkspace,
) -> None:
    """grep --color wraps a match in escapes that end in a letter ("\x1b[K"): the
    detector must see the token start, on the wire and in the reply (where the
    block's sanitizer would otherwise drop the escape after the scan)."""
    paths = agent_ws.create_agent("zeta")
    anthropic = next(p for p in PLANTED if p.kind == "anthropic_api_key").secret
    coloured = f".env:ANTHROPIC_KEY=\x1b[01;31m\x1b[K{anthropic}\x1b[m\x1b[K"
    for index in range(6):
        append_entry(paths.memory, "Human", f"turn {index}: what does grep say?")
    append_entry(paths.memory, "Tool", f"$ grep -r ANTHROPIC .\n{coloured}\n")
    with OpenAITestServer() as server:
        config = config_for(server, redact_local=True)
        server.script(f"ok:Facts:\n- the tool printed: {coloured}\n" + "- checked the env\n" * 8)
        outcome = compact_agent(
            paths, LiteLLMSummarizer(config.summarizer), options_for(config, b"k" * 32)
        )
        wire = sent(server)
    assert anthropic not in wire and "[REDACTED:anthropic_api_key#" in wire
    summary = memfile.parse(paths.memory.read_bytes())
    block = b"".join(s.raw for s in summary.segments).decode()
    assert anthropic not in block
    assert outcome.reply_redacted >= 1


def test_a_local_model_receives_text_as_written_but_its_reply_is_scanned(
    agent_ws: AgentWorkspace,
) -> None:
    paths = plant_everything(agent_ws, "epsilon")
    with OpenAITestServer(echo_prompt) as server:
        config = config_for(server)  # 127.0.0.1 and nothing configured: local
        outcome = compact_agent(
            paths, LiteLLMSummarizer(config.summarizer), options_for(config, b"k" * 32)
        )
        wire = sent(server)
    assert set(leaked(wire)) == {p.kind for p in ALL_PLANTED}
    assert outcome.redacted == 0
    memory = paths.memory.read_text()
    # Credentials are never kept in a summary; personal data stays local by default.
    assert leaked(memory, CREDENTIALS) == []
    assert PLANTED[13].secret in memory


def test_the_builtin_summarizer_never_copies_a_credential(agent_ws: AgentWorkspace) -> None:
    paths = plant_everything(agent_ws, "zeta")
    # Sentences of the kind the extractive summary keeps (decisions, errors, facts).
    for planted in CREDENTIALS:
        append_entry(paths.memory, "Human", f"Important: we decided this. {planted.sentence}")
    config = MemdConfig()
    outcome = compact_agent(
        paths, BuiltinSummarizer(lambda text: len(text) // 4), options_for(config, b"k" * 32)
    )
    memory = paths.memory.read_text()
    assert leaked(memory, CREDENTIALS) == []
    assert "[REDACTED:" in memory
    assert outcome.redacted == 0  # nothing was sent anywhere


def test_redaction_off_sends_as_written(agent_ws: AgentWorkspace) -> None:
    paths = agent_ws.create_agent("eta")
    append_entry(paths.memory, "Human", PLANTED[5].sentence)
    with OpenAITestServer(echo_prompt) as server:
        config = config_for(server, redact_local=True, redact=False)
        compact_agent(paths, LiteLLMSummarizer(config.summarizer), options_for(config, b"k" * 32))
        assert PLANTED[5].secret in sent(server)
    assert PLANTED[5].secret not in paths.memory.read_text()


def test_user_patterns_are_redacted_on_the_wire(agent_ws: AgentWorkspace) -> None:
    paths = agent_ws.create_agent("theta")
    append_entry(paths.memory, "Human", "The vault unlock code is VAULT-93810482-QX, keep it.")
    with OpenAITestServer(echo_prompt) as server:
        config = config_for(server, redact_local=True, patterns={"vault": r"VAULT-\d{8}-[A-Z]{2}"})
        compact_agent(paths, LiteLLMSummarizer(config.summarizer), options_for(config, b"k" * 32))
        wire = sent(server)
    assert "VAULT-93810482-QX" not in wire and "[REDACTED:vault#" in wire


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_an_email_address_is_pinned_whole_unless_personal_data_was_redacted(
    agent_ws: AgentWorkspace, remote: bool
) -> None:
    """An address the reply drops is pinned whole for a summarizer that read it
    as written; when personal data was redacted on the way out (a remote one) it
    is not pinned at all: not as written, and not as a placeholder, which names
    nothing and would be carried on as a marked line."""
    paths = agent_ws.create_agent("iota")
    address = "ops-lead@example.org"
    for index in range(6):
        append_entry(paths.memory, "Human", f"turn {index}: we discussed the weekly report.")
    append_entry(paths.memory, "Human", f"Send the weekly report to {address} on Mondays.")
    with OpenAITestServer() as server:
        config = config_for(server, redact_local=remote)
        server.script("ok:Facts:\n" + "- the weekly report goes out on Mondays\n" * 8)
        compact_agent(paths, LiteLLMSummarizer(config.summarizer), options_for(config, b"k" * 32))
        wire = sent(server)
    block = memfile.parse(paths.memory.read_bytes()).last_summary()
    assert block is not None
    pinned = parse_summary(block.summary_text).pins
    if remote:
        assert address not in wire
        assert pinned == ()
        assert address not in paths.memory.read_text()
    else:
        assert [pin.text for pin in pinned] == [address]


# ------------------------------------------------------- CLI and daemon, one key


def _memd(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memd", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("MEMD_")},
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "MEMD_COMPACTION_DRAIN_QUIET_S": "0.05",
            **env,
        },
    )


def audited_compactions(log: Path, agents: set[str]) -> dict[str, Any]:
    """Each agent's compaction record's fields, once all of ``agents`` have one (bounded)."""
    deadline = time.monotonic() + 60
    while True:
        records = [r for r in read_audit(log).records if r.event == "compaction"]
        found = {r.agent: r.fields for r in records}
        if agents <= set(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_cli_and_daemon_share_one_private_key(ws: AgentWorkspace, tmp_path: Path) -> None:
    from support.daemon_proc import DaemonProcess

    state = tmp_path / "state"
    secret = PLANTED[5]
    for name in ("cli", "daemon"):
        paths = ws.create_agent(name)
        append_entry(paths.memory, "Human", secret.sentence)
    with OpenAITestServer(echo_prompt) as server:
        config = tmp_path / "memd.toml"
        config.write_text(
            "[trigger]\ncontext_length = 1000\nthreshold = 0.5\ndebounce_ms = 40\n"
            "[compaction]\ndrain_quiet_s = 0.05\n"
            f'[summarizer]\nmodel = "openai/test-model"\napi_base = "{server.api_base}"\n'
            'api_key = "sk-test-5f3a9c"\nmax_tokens = 120\ncontext_length = 16000\n'
            "[privacy]\nredact_local = true\n"
        )
        common = ["--workspace", str(ws.root), "--config", str(config)]
        result = _memd("compact-now", "cli", *common, "--state-dir", str(state), env={})
        assert result.returncode == 0, result.stderr
        assert "1 secret(s) redacted" in " ".join(result.stdout.split())
        key_file = key_path(state, ws.root)
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_bytes()
        with DaemonProcess(ws.root, state, config=config) as daemon:
            daemon.wait_ready(timeout=120)
            for n in range(30):
                append_entry(ws.root / "agents/daemon/MEMORY.md", "AI", f"turn {n} " + "w " * 20)
            line = daemon.wait_for(
                # Importing litellm takes seconds, more on a loaded machine.
                "compacted",
                lambda line: line.get("agent") == "daemon",
                timeout=180,
            )
            # The CLI's request came first; the daemon's after its start.
            cli_sent = user_text(server.requests[0].body)
            daemon_sent = "\n".join(user_text(r.body) for r in server.requests[1:])
            # The daemon audits right after its "compacted" line: wait for it.
            by_agent = audited_compactions(audit_path(state, ws.root), {"cli", "daemon"})
    assert key_file.read_bytes() == key  # the daemon used the file, did not replace it
    # The audit log has the counts (never values) of both.
    assert by_agent["cli"]["redactions"] == 1 and by_agent["daemon"]["redactions"] >= 1
    assert "reply_redactions" in by_agent["daemon"]
    assert secret.secret.encode() not in audit_path(state, ws.root).read_bytes()
    assert line["redacted"] >= 1 and "reply_redacted" in line
    assert secret.secret not in cli_sent + daemon_sent
    cli_tags = set(PLACEHOLDER_RE.findall(cli_sent))
    daemon_tags = set(PLACEHOLDER_RE.findall(daemon_sent))
    assert cli_tags and cli_tags <= daemon_tags


def test_the_summary_carried_between_rolling_calls_is_redacted_too(
    agent_ws: AgentWorkspace,
) -> None:
    """A model's own reply goes back out as "summary so far": the last gate catches it."""
    paths = agent_ws.create_agent("iota")
    for index in range(40):
        append_entry(paths.memory, "Human", f"turn {index}: " + "we reviewed the rollout plan " * 6)
    leaked_by_model = PLANTED[6].secret  # github_pat_: never in the file, the model made it up
    with OpenAITestServer(echo_prompt) as server:
        config = config_for(server, redact_local=True)
        small = config.summarizer.model_copy(update={"context_length": 2500, "max_tokens": 300})
        # Within the reply budget: an over-budget reply would be re-asked and
        # dropped, and the leaked PAT never carried.
        server.script(f"ok:Facts:\n- the PAT is {leaked_by_model}\n" + "- reviewed the plan\n" * 12)
        outcome = compact_agent(paths, LiteLLMSummarizer(small), options_for(config, b"k" * 32))
        assert len(server.requests) >= 2
        later = "\n".join(user_text(r.body) for r in server.requests[1:])
    assert leaked_by_model not in later and "[REDACTED:github_token#" in later
    assert leaked_by_model not in paths.memory.read_text()
    assert outcome.calls >= 2


# -- review 14f: forms a tool output or a model gives credentials ---------------
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example
DB_PASSWORD = "Tr0ub4dor&3xq-Qv9"


def wire_leaks(text: str, secrets: dict[str, str]) -> list[str]:
    """Names whose value is in ``text`` as written, or with JSON's escaping of it (\\/ for /)."""
    return [
        name
        for name, value in secrets.items()
        if value in text or value.replace("/", "\\/") in text
    ]


def compact_over_the_wire(agent_ws: AgentWorkspace, contents: list[str]) -> tuple[str, str]:
    """Human/Tool turns compacted by an echoing remote summarizer: (wire, summary block)."""
    paths = agent_ws.create_agent("leaky")
    for index, content in enumerate(contents):
        append_entry(paths.memory, "Tool" if index % 2 else "Human", content)
    for index in range(4):
        append_entry(paths.memory, "AI", f"Padding turn {index} about the release checklist.")
    with OpenAITestServer(echo_prompt) as server:
        config = config_for(server, redact_local=True)
        compact_agent(paths, LiteLLMSummarizer(config.summarizer), options_for(config, b"k" * 32))
        wire = sent(server)
    assert wire, "no request reached the test server"
    memory = paths.memory.read_text()
    # The summary block only: raw turns kept verbatim after it were in MEMORY.md already.
    start = memory.index("[Compressed Memory Summary]")
    return wire, memory[start : memory.index("\n---\n", start)]


def test_a_tool_output_holding_escaped_json_leaks_no_credential(
    agent_ws: AgentWorkspace,
) -> None:
    # A tool's result is a JSON string whose value is itself JSON (an HTTP body,
    # a secrets-manager reply): the inner quotes reach MEMORY.md as \".
    inner = json.dumps({"aws_secret_access_key": AWS_SECRET, "db_password": DB_PASSWORD})
    tool_output = json.dumps({"tool": "get_secret_value", "output": inner})
    wire, summary = compact_over_the_wire(agent_ws, ["Fetch the prod credentials.", tool_output])
    secrets = {"aws_secret_key": AWS_SECRET, "db_password": DB_PASSWORD}
    assert wire_leaks(wire, secrets) == []
    assert wire_leaks(summary, secrets) == []  # the echoing model's reply is scanned too


def test_a_password_in_a_url_with_no_user_name_never_leaves(agent_ws: AgentWorkspace) -> None:
    # redis://:PASSWORD@host is Redis's own documented form (no user name).
    wire, summary = compact_over_the_wire(
        agent_ws,
        [
            f"Set REDIS_URL=redis://:{DB_PASSWORD}@redis:6379/0 in the worker env (docker compose).",
            "ok, the worker is restarted",
        ],
    )
    assert wire_leaks(wire, {"redis": DB_PASSWORD}) == []
    assert wire_leaks(summary, {"redis": DB_PASSWORD}) == []


def compact_remotely(paths: AgentPaths, reply: Any) -> str:
    """One compaction by a remote summarizer (redaction on) answering ``reply``:
    what it was sent."""
    for index in range(6):
        append_entry(paths.memory, "AI", f"Padding turn {index} about the release checklist.")
    with OpenAITestServer(reply) as server:
        config = config_for(server, redact_local=True)
        compact_agent(paths, LiteLLMSummarizer(config.summarizer), options_for(config, b"k" * 32))
        return sent(server)


VAGUE = "Facts:\n" + "- the team reviewed the deployment and agreed it is fine for now\n" * 10


def pinned_after(paths: AgentPaths) -> list[str]:
    block = memfile.parse(paths.memory.read_bytes()).last_summary()
    assert block is not None
    return [pin.text for pin in parse_summary(block.summary_text).pins]


def test_a_slashed_url_password_neither_leaves_nor_is_pinned(agent_ws: AgentWorkspace) -> None:
    """A base64-made password holds "/": it went to the summarizer as written and
    was pinned whole, carried from summary to summary past the archive's
    retention (review r7pins F3)."""
    password = "Xk9+/aQ2="
    paths = agent_ws.create_agent("slashpw")
    append_entry(
        paths.memory, "Human", f"The prod DB is postgres://app:{password}@db.internal:5432/app."
    )
    wire = compact_remotely(paths, lambda body: VAGUE)
    assert wire_leaks(wire, {"url": password}) == []
    assert pinned_after(paths) == ["postgres://app@db.internal:5432/app"]
    block = memfile.parse(paths.memory.read_bytes()).last_summary()
    assert block is not None and password not in block.summary_text


def test_a_dsn_and_a_git_remote_are_pinned_for_a_remote_summarizer(
    agent_ws: AgentWorkspace,
) -> None:
    """With personal data redacted (a remote summarizer's default), a URL's user
    name read as an e-mail address made pins_the_scan_keeps drop every DSN with a
    user and every git remote (review r7pins F4, fixed by 69d6d34)."""
    paths = agent_ws.create_agent("remotes")
    append_entry(
        paths.memory,
        "Human",
        "Deploy from git@github.com:acme/payments.git; its DB is "
        "postgres://app:hunter2xyz@db.internal:5432/app and the mirror is "
        "ssh://git@git.acme.dev/acme/payments.git.",
    )
    compact_remotely(paths, lambda body: VAGUE)
    assert sorted(pinned_after(paths)) == [
        "git@github.com:acme/payments.git",
        "postgres://app@db.internal:5432/app",
        "ssh://git@git.acme.dev/acme/payments.git",
    ]


def test_a_redacted_url_is_not_carried_as_pieces(agent_ws: AgentWorkspace) -> None:
    """A model kept the URL with its password's placeholder; read back from that
    body the URL was cut at the placeholder's "]", and once the next model dropped
    it, "postgres://app:[REDACTED:…" and "db.internal:5432" were pinned (review
    r7pins F5). Now it is the URL without its password."""
    paths = agent_ws.create_agent("pieces")
    append_entry(
        paths.memory, "Human", "The prod DB is postgres://app:hunter2xyz@db.internal:5432/app."
    )
    compact_remotely(paths, echo_prompt)  # keeps the URL, its password a placeholder
    block = memfile.parse(paths.memory.read_bytes()).last_summary()
    assert block is not None and "postgres://app:[REDACTED:url_password#" in block.summary_text
    compact_remotely(paths, lambda body: VAGUE)  # drops it
    assert pinned_after(paths) == ["postgres://app@db.internal:5432/app"]


def test_env_file_password_variables_never_leave(agent_ws: AgentWorkspace) -> None:
    env_file = "\n".join(
        [
            "cat .env",
            f"PGPASSWORD={DB_PASSWORD}",
            "SMTP_PASS=Mq7!vR2#pLx9",
            "DB_PASS=Zk4$wN8@tHc1",
        ]
    )
    wire, summary = compact_over_the_wire(agent_ws, [env_file, "done"])
    secrets = {"pgpassword": DB_PASSWORD, "smtp_pass": "Mq7!vR2#pLx9", "db_pass": "Zk4$wN8@tHc1"}
    assert wire_leaks(wire, secrets) == []
    assert wire_leaks(summary, secrets) == []


def test_a_local_models_markdown_reply_never_writes_a_credential(
    agent_ws: AgentWorkspace,
) -> None:
    # A local summarizer is sent the transcript as written; the scan of its
    # reply is what keeps credentials out of MEMORY.md. Models write Markdown.
    paths = agent_ws.create_agent("local")
    append_entry(paths.memory, "Human", "Here is the prod .env, keep it handy.")
    append_entry(
        paths.memory,
        "Tool",
        f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}\nDB_PASSWORD={DB_PASSWORD}\nREGION=eu-west-1",
    )
    for index in range(4):
        append_entry(paths.memory, "AI", f"Padding turn {index} about the release checklist.")
    reply = (
        "Facts:\n"
        "- The user shared the production environment for the deploy.\n"
        f"- AWS secret key: `{AWS_SECRET}` (region eu-west-1)\n"
        f"- **Password**: `{DB_PASSWORD}` for the prod database\n"
        "- The release checklist was discussed over four turns.\n"
    )
    with OpenAITestServer() as server:
        server.script("ok:" + reply)
        config = config_for(server)  # local
        compact_agent(paths, LiteLLMSummarizer(config.summarizer), options_for(config, b"k" * 32))
        assert server.requests
    memory = paths.memory.read_text()
    start = memory.index("[Compressed Memory Summary]")
    summary = memory[start : memory.index("\n---\n", start)]
    assert "release checklist" in summary  # the reply was written
    assert wire_leaks(summary, {"aws_secret_key": AWS_SECRET, "db_password": DB_PASSWORD}) == []


def test_a_reply_repeating_a_summarized_credential_in_a_table_never_writes_it(
    agent_ws: AgentWorkspace,
) -> None:
    # No assignment the detector reads in the reply: the value, found in the
    # summarized material, is what it looks for.
    paths = agent_ws.create_agent("table")
    append_entry(paths.memory, "Tool", f"DB_PASSWORD={DB_PASSWORD}")
    for index in range(4):
        append_entry(paths.memory, "AI", f"Padding turn {index} about the release checklist.")
    reply = f"Facts:\n| setting | value |\n| db password | {DB_PASSWORD} |\n- release checklist.\n"
    with OpenAITestServer() as server:
        server.script("ok:" + reply)
        config = config_for(server)  # local
        outcome = compact_agent(
            paths, LiteLLMSummarizer(config.summarizer), options_for(config, b"k" * 32)
        )
    memory = paths.memory.read_text()
    summary = memory[memory.index("[Compressed Memory Summary]") :]
    assert DB_PASSWORD not in summary.split("\n---\n")[0]
    assert outcome.reply_redacted >= 1


@pytest.mark.parametrize("given_as_written", [True, False])
def test_the_material_is_searched_for_credential_values_only_when_the_summarizer_saw_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given_as_written: bool
) -> None:
    # A summarizer that saw placeholders only (a remote model, the builtin one)
    # cannot repeat a value: the material is not scanned for them (~3 MB/s, a
    # whole second on a 10 MB compaction); one given it as written is.
    from memd.core.privacy import Redactor
    from memd.core.summary import SummaryRequest, SummaryResult

    class Summarizer:
        model = "stand-in"

        def summarize(self, request: SummaryRequest) -> SummaryResult:
            return SummaryResult(
                text="Decisions: ship memd; the user prefers tea. " * 4,
                model="stand-in",
                given_as_written=given_as_written,
            )

    searched: list[int] = []
    real_values_in = Redactor.values_in

    def values_in(self: Redactor, text: str) -> tuple[tuple[str, str], ...]:
        searched.append(len(text))
        return real_values_in(self, text)

    monkeypatch.setattr(Redactor, "values_in", values_in)
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha", entries=6)
    compact_agent(
        paths, Summarizer(), CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, drain_max_s=2)
    )
    assert bool(searched) == given_as_written


# Credentials the detector knows only by their context (review s8pins, "left
# undone"): alone, each value is a commit hash, a UUID, a path. The pins were
# extracted from the raw turns, so the bare value was pinned, written to
# MEMORY.md, and sent as written to a remote summarizer at every later compaction.
_PEM_BODY = (
    "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
    "/BMZnYJZFgBOERnhoChyCA/6lBVPPlw3d0QV1cZeZ2ul5hBDj9XV/GMSgXRMRYXQ\n"
    "VaK4MsVPEYQ/yGxI3/TXeZvXhdM3NFMEEbUmnmsP8NXc95sRTQKBgCeYxUbGtmNr"
)
KNOWN_BY_CONTEXT = {
    "api_key": (
        "The mirror needs api_key = {} from now on.",
        "eee65f53e9421ce50211670eae679f02e8d28a79",
    ),
    "password": ("The staging DB password: {}", "7d1e2f30-4a5b-4c6d-8e9f-0a1b2c3d4e5f"),
    "token": ("CI pulls with token={} from the registry.", "b7e3c9a1d5f2"),
    "secret": ("Webhook secret: {} (rotated monthly).", "/Xk9aQ2bR7/cT1dE5fG3hJ8kL0mN4pQ6rS2tU9v+"),
    "bearer": (
        "Called it with Authorization: Bearer {} and got a 200.",
        "e4d909c290d0fb1ca068ffaddf22cbd0",
    ),
    "sshpass": ("Deployed with sshpass -p {} ssh deploy@build.internal", "c0ffee1234ab"),
    "private_key": (
        "Here is the deploy key:\n-----BEGIN RSA PRIVATE KEY-----\n{}\n-----END RSA PRIVATE KEY-----",
        _PEM_BODY,
    ),
}
LOOK_ALIKES = (
    "Fixed in commit 023c39c200661fccd268a29a0d347301ef56e64d yesterday.",
    "The failing request id 0f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a is in the log.",
)


def parts(value: str, size: int = 8) -> set[str]:
    """Every run of ``size`` characters of ``value`` (its lines' for a block)."""
    return {
        line[at : at + size]
        for line in value.split("\n")
        for at in range(max(1, len(line) - size + 1))
    }


def compact_with_the_builtin_summarizer(paths: AgentPaths) -> str:
    for index in range(6):
        append_entry(paths.memory, "AI", f"Padding turn {index} about the release checklist.")
    compact_agent(
        paths, BuiltinSummarizer(lambda text: len(text) // 4), options_for(MemdConfig(), b"k" * 32)
    )
    return paths.memory.read_text()


@pytest.mark.parametrize("form", sorted(KNOWN_BY_CONTEXT))
def test_a_credential_known_by_its_context_is_never_pinned(
    agent_ws: AgentWorkspace, form: str
) -> None:
    sentence, value = KNOWN_BY_CONTEXT[form]
    paths = agent_ws.create_agent("ctx" + form.replace("_", ""))
    append_entry(paths.memory, "Human", sentence.format(value))
    for index, look_alike in enumerate(LOOK_ALIKES):
        append_entry(paths.memory, "AI" if index else "Human", look_alike)
    memory = compact_with_the_builtin_summarizer(paths)
    pins = " ".join(pinned_after(paths))
    assert [part for part in parts(value) if part in pins] == []
    assert [part for part in parts(value) if part in memory] == []
    # Look-alikes beside no credential are kept (in the summary or pinned).
    assert "023c39c200661fccd268a29a0d347301ef56e64d" in memory
    assert "0f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a" in memory


def test_a_credential_known_by_its_context_is_not_sent_on_by_later_compactions(
    agent_ws: AgentWorkspace,
) -> None:
    sentence, value = KNOWN_BY_CONTEXT["api_key"]
    paths = agent_ws.create_agent("ctxlater")
    append_entry(paths.memory, "Human", sentence.format(value))
    compact_with_the_builtin_summarizer(paths)
    append_entry(paths.memory, "Human", "Next: the release notes.")
    wire = compact_remotely(paths, lambda body: VAGUE)
    assert value not in wire and value not in paths.memory.read_text()
