from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest

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
    logging.getLogger("LiteLLM").error("provider down")
    lines = _lines(buf)
    assert [(rec["logger"], rec["event"]) for rec in lines] == [
        ("apscheduler.scheduler", "job x missed"),
        ("LiteLLM", "provider down"),
    ]


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
