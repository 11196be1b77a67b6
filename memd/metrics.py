"""Optional Prometheus metrics (``[metrics] port``), on a registry of memd's own.

A private :class:`CollectorRegistry` (not prometheus-client's global one)
keeps tests and embedders independent, and keeps the process/platform
collectors out unless asked for. The daemon owns one :class:`Metrics` and
calls its small methods; :func:`start_metrics_server` serves it over HTTP.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.process_collector import ProcessCollector

# LLM calls take from well under a second (local model) to minutes.
LLM_LATENCY_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
# The ``result`` label values of ``memd_compactions``.
COMPACTION_RESULTS = ("ok", "error", "nothing", "aborted")


class Metrics:
    """Every metric memd exports. Thread-safe (prometheus-client metrics are)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = True) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        # Agents erased by `memd forget`: no series of theirs until they write again.
        self._erased: set[str] = set()
        self._erased_lock = threading.Lock()
        if process:
            ProcessCollector(namespace="memd", registry=self.registry)
        self.agent_tokens = Gauge(
            "memd_agent_tokens",
            "Current token count of the agent's MEMORY.md.",
            ["agent"],
            registry=self.registry,
        )
        self.agent_threshold_tokens = Gauge(
            "memd_agent_threshold_tokens",
            "Token count at which the agent is compacted.",
            ["agent"],
            registry=self.registry,
        )
        self.agent_fill_ratio = Gauge(
            "memd_agent_fill_ratio",
            "tokens / threshold (1.0 = compaction due).",
            ["agent"],
            registry=self.registry,
        )
        self.compactions = Counter(
            "memd_compactions",
            "Compaction attempts by result (ok, error, nothing, aborted).",
            ["agent", "result"],
            registry=self.registry,
        )
        self.llm_latency = Histogram(
            "memd_llm_latency_seconds",
            "Duration of summarizer calls.",
            buckets=LLM_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.llm_cost = Counter(
            "memd_llm_cost_usd",
            "Summarizer cost in US dollars, when litellm knows the price.",
            registry=self.registry,
        )
        self.spending_holds = Counter(
            "memd_spending_cap_holds",
            "Compactions held back by a spending cap, by the cap's config key.",
            ["cap"],
            registry=self.registry,
        )
        self.spending_held = Gauge(
            "memd_spending_cap_holding",
            "1 while the cap holds compactions back (until its window passes), else 0.",
            ["cap"],
            registry=self.registry,
        )
        self.spending_calls = Gauge(
            "memd_summarizer_calls_last_hour",
            "Summarizer model requests in the last hour (summarizer.max_calls_per_hour).",
            registry=self.registry,
        )
        self.spending_usd = Gauge(
            "memd_summarizer_usd_last_day",
            "Summarizer cost in USD in the last 24 hours (summarizer.max_usd_per_day).",
            registry=self.registry,
        )
        self.fallbacks = Counter(
            "memd_summarizer_fallbacks",
            "Compactions made by the builtin summarizer because the model kept failing.",
            ["agent"],
            registry=self.registry,
        )
        self.watcher_lag = Gauge(
            "memd_watcher_lag_seconds",
            "Delay between a file change and its updated token count.",
            registry=self.registry,
        )

    def set_agent(self, agent: str, tokens: int, threshold_tokens: int) -> None:
        # Under the lock: an erasure cannot land between the check and the set.
        with self._erased_lock:
            if agent in self._erased:
                return
            self.agent_tokens.labels(agent=agent).set(tokens)
            self.agent_threshold_tokens.labels(agent=agent).set(threshold_tokens)
            self.agent_fill_ratio.labels(agent=agent).set(tokens / max(1, threshold_tokens))

    def remove_agent(self, agent: str) -> None:
        """Drop a deleted agent's series (its compaction counters stay: they are history)."""
        for gauge in (self.agent_tokens, self.agent_threshold_tokens, self.agent_fill_ratio):
            with contextlib.suppress(KeyError):
                gauge.remove(agent)

    def erase_agent(self, agent: str) -> None:
        """``memd forget``: every series naming the agent goes (its compaction counts
        too), and none comes back until :meth:`restore_agent`."""
        with self._erased_lock:
            self._erased.add(agent)
            self.remove_agent(agent)
            for result in COMPACTION_RESULTS:
                with contextlib.suppress(KeyError):
                    self.compactions.remove(agent, result)

    def restore_agent(self, agent: str) -> None:
        """The erased agent writes again: its series may come back."""
        with self._erased_lock:
            self._erased.discard(agent)

    def record_compaction(
        self,
        agent: str,
        result: str,
        *,
        llm_seconds: float | None = None,
        cost_usd: float | None = None,
    ) -> None:
        with self._erased_lock:
            if agent in self._erased:
                return
            self.compactions.labels(agent=agent, result=result).inc()
        if llm_seconds is not None:
            self.llm_latency.observe(llm_seconds)
        if cost_usd:
            self.llm_cost.inc(cost_usd)

    def record_hold(self, cap: str) -> None:
        self.spending_holds.labels(cap=cap).inc()
        self.spending_held.labels(cap=cap).set(1)

    def set_spending(self, calls_last_hour: int, usd_last_day: float, holding: str | None) -> None:
        """The figures against the caps; ``holding``: the cap key holding now, if any."""
        self.spending_calls.set(calls_last_hour)
        self.spending_usd.set(usd_last_day)
        for cap in ("summarizer.max_calls_per_hour", "summarizer.max_usd_per_day"):
            self.spending_held.labels(cap=cap).set(1 if cap == holding else 0)

    def set_watcher_lag(self, seconds: float) -> None:
        self.watcher_lag.set(max(0.0, seconds))

    def render(self) -> bytes:
        """The exposition text (what a scrape returns)."""
        return generate_latest(self.registry)


@dataclass
class MetricsServer:
    metrics: Metrics
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_metrics_server(
    port: int, bind: str = "127.0.0.1", metrics: Metrics | None = None
) -> MetricsServer:
    """Serve ``metrics`` (a new :class:`Metrics` if None) on ``bind:port`` (0 = any free port)."""
    served = Metrics() if metrics is None else metrics
    server, thread = start_http_server(port, addr=bind, registry=served.registry)
    return MetricsServer(served, server, thread)


__all__ = [
    "COMPACTION_RESULTS",
    "LLM_LATENCY_BUCKETS",
    "Metrics",
    "MetricsServer",
    "start_metrics_server",
]
