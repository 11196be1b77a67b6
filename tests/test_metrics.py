from __future__ import annotations

import urllib.request

import prometheus_client
import prometheus_client.parser
import pytest

from memd.metrics import Metrics, start_metrics_server


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in prometheus_client.parser.text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def test_scrape_over_http() -> None:
    server = start_metrics_server(0, "127.0.0.1")
    try:
        assert server.port > 0
        m = server.metrics
        m.set_agent("alpha", tokens=900, threshold_tokens=1000)
        m.set_agent("beta", tokens=10, threshold_tokens=1000)
        m.record_compaction("alpha", "ok", llm_seconds=3.2, cost_usd=0.25)
        m.record_compaction("alpha", "ok", llm_seconds=1.0, cost_usd=0.5)
        m.record_compaction("alpha", "error", llm_seconds=120.0)
        m.set_watcher_lag(0.04)
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200
            text = response.read().decode()
    finally:
        server.close()
    assert sample(text, "memd_agent_tokens", agent="alpha") == 900
    assert sample(text, "memd_agent_fill_ratio", agent="alpha") == pytest.approx(0.9)
    assert sample(text, "memd_agent_fill_ratio", agent="beta") == pytest.approx(0.01)
    assert sample(text, "memd_compactions_total", agent="alpha", result="ok") == 2
    assert sample(text, "memd_compactions_total", agent="alpha", result="error") == 1
    assert sample(text, "memd_llm_latency_seconds_count") == 3
    assert sample(text, "memd_llm_latency_seconds_bucket", le="5.0") == 2
    assert sample(text, "memd_llm_cost_usd_total") == pytest.approx(0.75)
    assert sample(text, "memd_watcher_lag_seconds") == pytest.approx(0.04)
    assert sample(text, "memd_process_resident_memory_bytes") is not None


def test_own_registry_and_removal() -> None:
    a, b = Metrics(process=False), Metrics(process=False)  # no "duplicated timeseries" clash
    a.set_agent("x", 5, 10)
    assert sample(b.render().decode(), "memd_agent_tokens", agent="x") is None
    assert sample(prometheus_client.generate_latest().decode(), "memd_agent_tokens") is None
    a.remove_agent("x")
    a.remove_agent("never-seen")
    assert sample(a.render().decode(), "memd_agent_tokens", agent="x") is None


def test_port_in_use_raises() -> None:
    server = start_metrics_server(0, "127.0.0.1")
    try:
        with pytest.raises(OSError):
            start_metrics_server(server.port, "127.0.0.1")
    finally:
        server.close()
