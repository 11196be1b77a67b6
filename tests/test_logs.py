from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from support.memfiles import AgentWorkspace, append_entry
from support.openai_server import OpenAITestServer
from support.wire import options_for

from memd.core.config import MemdConfig, PrivacyConfig, SummarizerConfig
from memd.logs import configure_logging, get_logger, resolve_format

pytestmark = pytest.mark.usefixtures("restore_logging")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def test_json_when_not_a_tty_with_agent_field() -> None:
    buf = io.StringIO()
    assert configure_logging("auto", "info", buf) == "json"
    get_logger().info("counted", agent="alice", tokens=12)  # as the daemon logs
    get_logger().debug("hidden")
    [line] = _lines(buf)
    assert line["event"] == "counted" and line["agent"] == "alice" and line["tokens"] == 12
    assert line["level"] == "info" and "timestamp" in line


def test_stdlib_loggers_of_dependencies_are_routed_through() -> None:
    buf = io.StringIO()
    configure_logging("json", "info", buf)
    logging.getLogger("apscheduler.scheduler").warning("job %s missed", "x")
    logging.getLogger("watchdog.observers").info("chatty")  # quietened at info
    logging.getLogger("watchdog.observers").warning("queue overflow")
    lines = _lines(buf)
    assert [(rec["logger"], rec["event"]) for rec in lines] == [
        ("apscheduler.scheduler", "job x missed"),
        ("watchdog.observers", "queue overflow"),
    ]


@pytest.mark.parametrize("level", ["debug", "info"])
def test_litellm_and_httpx_stay_quiet_at_every_level_and_reload(level: str) -> None:
    # litellm logs request bodies (memory content) at DEBUG, httpx logs URLs at INFO.
    buf = io.StringIO()
    configure_logging("json", level, buf)
    configure_logging("json", level, buf)  # a reload
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        assert logging.getLogger(name).level == logging.CRITICAL
        logging.getLogger(name).error("POST Request Sent from LiteLLM: -d '{messages}'")
    logging.getLogger("httpx").info("HTTP Request: POST https://x/?key=k")
    assert _lines(buf) == []


def test_debug_level_lets_dependencies_speak_and_reconfigure_does_not_duplicate() -> None:
    buf = io.StringIO()
    configure_logging("json", "debug", buf)
    configure_logging("json", "debug", buf)
    logging.getLogger("watchdog.observers").debug("event")
    assert len(_lines(buf)) == 1


def test_console_format_on_a_tty() -> None:
    out = _Tty()
    assert resolve_format("auto", out) == "console"
    assert configure_logging("auto", "info", out) == "console"
    get_logger().warning("slow", agent="bob")
    text = out.getvalue()
    assert "slow" in text and "agent" in text and "bob" in text
    assert not text.lstrip().startswith("{")


def test_exceptions_are_rendered_in_json() -> None:
    buf = io.StringIO()
    configure_logging("json", "info", buf)
    try:
        raise ValueError("bad")
    except ValueError:
        get_logger().exception("handler failed", agent="x")
    [line] = _lines(buf)
    assert "ValueError: bad" in str(line["exception"])


def test_importing_logs_does_not_import_litellm() -> None:
    code = "import memd.logs, sys; print('litellm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_debug_check_follows_the_level() -> None:
    import logging

    from memd.logs import debug_check

    logger = logging.getLogger("memd.test.debug_check")
    enabled = debug_check("memd.test.debug_check")
    logger.setLevel(logging.INFO)
    assert not enabled()
    logger.setLevel(logging.DEBUG)  # a reload with --log-level debug
    assert enabled()


def test_a_reload_at_debug_level_never_logs_what_the_summarizer_is_sent(
    agent_ws: AgentWorkspace, capfd: pytest.CaptureFixture[str]
) -> None:
    # Review 14f, F4: the reload's configure_logging set the LiteLLM loggers
    # back to DEBUG, which import_litellm (run once) had pinned to CRITICAL.
    from memd.compaction import compact_agent
    from memd.llm import LiteLLMSummarizer, import_litellm

    marker = "the vault combination is 31-7-22 MARKER4242"
    paths = agent_ws.create_agent("chatty")
    for index in range(6):
        append_entry(paths.memory, "Human" if index % 2 else "AI", f"{marker} turn {index}")
    stream = io.StringIO()
    try:
        configure_logging("json", "debug", stream=stream)  # `memd run --log-level debug`
        import_litellm()  # the daemon warms litellm up after READY
        configure_logging("json", "debug", stream=stream)  # SIGHUP: the reload does this
        with OpenAITestServer() as server:
            config = MemdConfig(
                summarizer=SummarizerConfig(
                    model="openai/test-model",
                    api_base=server.api_base,
                    api_key=SecretStr("sk-test-5f3a9c"),
                    timeout_s=5,
                    retries=0,
                    max_tokens=2000,
                    context_length=32_000,
                ),
                privacy=PrivacyConfig(redact_local=True),
            )
            options = options_for(config, b"k" * 32, summary_max_tokens=2000)
            compact_agent(paths, LiteLLMSummarizer(config.summarizer), options)
            assert server.requests
    finally:
        for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    captured = capfd.readouterr()
    assert "MARKER4242" not in stream.getvalue()
    assert "MARKER4242" not in captured.err + captured.out


# --- review r6leak F1: a warning's text never reaches the log ---------------------

REPO = Path(__file__).resolve().parents[1]
SECRET = "pw Hunter2Secret!7"


class _PartsServer:
    """An OpenAI-compatible server whose reply's content is a list of parts
    (as some servers send it), holding what the model wrote: memory content."""

    def __init__(self, reply_text: str) -> None:
        text = reply_text

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                data = json.dumps(
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "created": 1,
                        "model": "m",
                        "choices": [
                            {
                                "index": 0,
                                "message": {
                                    "role": "assistant",
                                    "content": [{"type": "text", "text": text}],
                                },
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


@pytest.fixture
def parts_server() -> Iterator[_PartsServer]:
    server = _PartsServer(f"Summary: the zebra plan; {SECRET}")
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def test_reply_content_never_reaches_stderr(
    tmp_path: Path, ws: AgentWorkspace, parts_server: _PartsServer
) -> None:
    ws.create_agent("alpha", entries=20)
    append_entry(ws.paths().memory, "Human", f"remember: {SECRET}")
    config = tmp_path / "memd.toml"
    config.write_text(
        "[summarizer]\n"
        'model = "openai/gpt-4o-mini"\n'
        f'api_base = "{parts_server.api_base}"\n'
        'api_key = "sk-test"\n'
        "retries = 0\n"
        "keep_recent_tokens = 0\n"
        "timeout_s = 20\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    env["PYTHONPATH"] = str(REPO)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "memd",
            "compact-now",
            "alpha",
            "-w",
            str(ws.root),
            "-c",
            str(config),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode != 0  # the reply is not a usable summary
    assert "Hunter2Secret" not in proc.stderr, proc.stderr
    assert "Hunter2Secret" not in proc.stdout


def test_a_dependencys_warning_is_logged_without_its_text() -> None:
    buf = io.StringIO()
    configure_logging("json", "info", buf)
    with warnings.catch_warnings():
        configure_logging("json", "info", buf)  # installs the guard inside this block
        warnings.warn_explicit(
            f"serializer saw input_value='{SECRET}'",
            UserWarning,
            "/opt/venv/lib/python3.11/site-packages/somelib/main.py",
            42,
        )
    [line] = _lines(buf)
    assert "Hunter2Secret" not in buf.getvalue()
    assert line["logger"] == "py.warnings" and line["level"] == "warning"
    assert "UserWarning from somelib" in str(line["event"])


def test_memds_own_warning_keeps_its_text() -> None:
    import memd.core

    buf = io.StringIO()
    with warnings.catch_warnings():
        configure_logging("json", "info", buf)
        warnings.warn_explicit("the window is small", UserWarning, memd.core.__file__, 7)
    [line] = _lines(buf)
    assert "the window is small" in str(line["event"])


def test_a_warning_another_module_routed_to_logging_loses_its_text() -> None:
    """detect-secrets turns on logging.captureWarnings at import: logging's own
    showwarning then writes ``file:line: Category: text`` to py.warnings."""
    buf = io.StringIO()
    with warnings.catch_warnings():
        configure_logging("json", "info", buf)
        logging.captureWarnings(True)
        try:
            warnings.showwarning = logging._showwarning  # type: ignore[attr-defined]
            warnings.warn_explicit(
                f"input_value='{SECRET}'", UserWarning, "/x/site-packages/pydantic/main.py", 3
            )
        finally:
            logging.captureWarnings(False)
    assert "Hunter2Secret" not in buf.getvalue()
    [line] = _lines(buf)
    assert "UserWarning from pydantic" in str(line["event"])
