"""The Prometheus endpoint as one stage: started with :meth:`MetricsStage.start`
(after the initial count: it starts a thread), its close pushed on the exit
stack; the counter and the runner publish to its :class:`~memd.metrics.Metrics`.

Off when ``[metrics] port`` is 0; a port that cannot be bound is said once and
the daemon runs without metrics.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from memd.core.config import MetricsConfig
from memd.daemon.entries import EntryCounter
from memd.daemon.runner import Runner
from memd.errors import describe_error
from memd.logs import get_logger

if TYPE_CHECKING:
    from memd.metrics import MetricsServer

_log = get_logger("memd.daemon")


class MetricsStage:
    def __init__(self, config: MetricsConfig, counter: EntryCounter, runner: Runner) -> None:
        self._config = config
        self._counter = counter
        self._runner = runner
        self.server: MetricsServer | None = None

    def start(self, stack: contextlib.ExitStack) -> None:
        port = self._config.port
        if port <= 0:
            return
        try:
            from memd.metrics import start_metrics_server

            server = start_metrics_server(port, self._config.bind)
        except Exception as exc:
            _log.warning("metrics server not started", port=port, error=describe_error(exc))
            return
        self.server = server
        self._counter.metrics = self._runner.metrics = server.metrics
        stack.callback(self._close, server)

    @staticmethod
    def _close(server: MetricsServer) -> None:
        with contextlib.suppress(Exception):
            server.close()


__all__ = ["MetricsStage"]
