"""The metrics endpoint as a stage: off at port 0, said once when its port is taken,
served and published to once started, closed by the exit stack."""

from __future__ import annotations

import contextlib
import socket
import urllib.request
from pathlib import Path

import structlog
from support.daemon_services import ScriptedCompaction, build_services
from support.memfiles import AgentWorkspace

from memd.core.config import MetricsConfig
from memd.daemon.metrics import MetricsStage
from memd.daemon.runner import Runner


def stage(tmp_path: Path, port: int) -> tuple[MetricsStage, Runner]:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=2)
    s = build_services(ws, ScriptedCompaction())
    assert s.entry_counter is not None
    return MetricsStage(MetricsConfig(port=port), s.entry_counter, s.runner), s.runner


def test_port_zero_serves_nothing(tmp_path: Path) -> None:
    metrics, _runner = stage(tmp_path, 0)
    with contextlib.ExitStack() as stack:
        metrics.start(stack)
        assert metrics.server is None


def test_a_taken_port_is_said_and_the_daemon_goes_on(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        metrics, _runner = stage(tmp_path, taken.getsockname()[1])
        with structlog.testing.capture_logs() as logs, contextlib.ExitStack() as stack:
            metrics.start(stack)
    assert metrics.server is None
    [line] = [line for line in logs if line["event"] == "metrics server not started"]
    assert line["log_level"] == "warning"


def test_served_once_started_and_closed_with_the_stack(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics, runner = stage(tmp_path, port)
    with contextlib.ExitStack() as stack:
        metrics.start(stack)
        assert metrics.server is not None
        # The runner publishes to the served registry.
        assert runner.metrics is metrics.server.metrics
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            assert reply.status == 200
    with socket.socket() as again:  # closed: the port is free again
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
