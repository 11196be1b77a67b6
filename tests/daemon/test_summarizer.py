"""The summarizer source: built once when first needed (again after a reload),
stopped at shutdown even when built after it (or replaced by a reload while a
job still uses it), stood in for by the
builtin summarizer after ``fallback_after`` failures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.daemon_services import ScriptedCompaction, build_services
from support.memfiles import AgentWorkspace

from memd.core.config import MemdConfig
from memd.daemon.summarizer import SummarizerSource
from memd.settings import build_config


class Remote:
    def __init__(self, model: str) -> None:
        self.model = model
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


def config_of(**summarizer: Any) -> MemdConfig:
    return build_config({"summarizer": {"model": "openai/x", **summarizer}}, {})[0]


def source(config: MemdConfig, built: list[Remote]) -> SummarizerSource:
    def factory(config: MemdConfig, _count: Callable[[str], int]) -> Remote:
        built.append(Remote(config.summarizer.model))
        return built[-1]

    return SummarizerSource(config, factory, lambda text: len(text.split()))  # type: ignore[arg-type]


def test_built_once_and_rebuilt_after_a_reload() -> None:
    # Not metered: what a summary spends comes back in its result or error
    # (tests/daemon/test_spending.py), the summarizer is handed no call-back.
    built: list[Remote] = []
    summarizers = source(config_of(), built)
    assert summarizers.model is None  # nothing built before it is needed
    assert summarizers.get() is summarizers.get() is built[0]
    summarizers.reconfigure(config_of(model="openai/y"))
    assert summarizers.get() is built[1] and summarizers.model == "openai/y"


def test_only_a_reload_that_changes_the_summarizer_or_privacy_bumps_the_generation() -> None:
    summarizers = source(config_of(), [])
    summarizers.reconfigure(config_of())
    assert summarizers.generation == 0  # a reload that changed nothing
    summarizers.reconfigure(config_of(model="ollama/llama3.1"))
    assert summarizers.generation == 1
    redacting = config_of(model="ollama/llama3.1")
    redacting = redacting.model_copy(
        update={"privacy": redacting.privacy.model_copy(update={"redact_local": True})}
    )
    summarizers.reconfigure(redacting)
    assert summarizers.generation == 2


def test_stopped_before_it_is_built_it_is_built_stopped() -> None:
    built: list[Remote] = []
    summarizers = source(config_of(), built)
    summarizers.stop()
    assert summarizers.get().stopped  # type: ignore[attr-defined]
    first = built[0]
    summarizers.reconfigure(config_of())
    summarizers.get()
    assert first.stopped and built[1].stopped


def test_the_builtin_stands_in_after_fallback_after_failures() -> None:
    summarizers = source(config_of(fallback_after=2), [])
    chosen, fallback = summarizers.for_agent("alpha", failures=1)
    assert chosen.model == "openai/x" and not fallback
    chosen, fallback = summarizers.for_agent("alpha", failures=2)
    assert chosen.model == "builtin" and fallback
    never = source(config_of(fallback_after=0), [])
    assert never.for_agent("alpha", failures=50)[0].model == "openai/x"


def test_a_reload_hands_in_the_new_tokenizers_count() -> None:
    counts: list[Callable[[str], int]] = []

    def factory(config: MemdConfig, count: Callable[[str], int]) -> Remote:
        counts.append(count)
        return Remote(config.summarizer.model)

    def words(text: str) -> int:
        return len(text.split())

    def chars(text: str) -> int:
        return len(text)

    summarizers = SummarizerSource(config_of(fallback_after=1), factory, words)  # type: ignore[arg-type]
    summarizers.get()
    summarizers.reconfigure(config_of(fallback_after=1))  # the tokenizer kept
    summarizers.get()
    summarizers.reconfigure(config_of(fallback_after=1), chars)  # a new tokenizer
    summarizers.get()
    assert counts == [words, words, chars]


def test_shutdown_after_a_reload_stops_the_retries_of_the_summarizer_in_flight(
    tmp_path: Path,
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    s = build_services(ws, ScriptedCompaction("ok"))
    built: list[Remote] = []

    def factory(_config: Any, _count: Any) -> Remote:
        built.append(Remote("openai/remote"))
        return built[-1]

    s.runner.summarizers._factory = factory
    s.fill("alice", 20)
    s.hint("alice")
    s.settle()
    assert s.scheduler.submitted == ["compact:alice"]

    def sighup_then_sigterm(_paths: Any) -> None:
        # While the summary is in flight: `systemctl reload memd` (any change,
        # here none at all), then `systemctl stop memd`.
        s.runner.reconfigure(s.runner.config)
        s.runner.stop()

    s.compact.during = sighup_then_sigterm
    s.scheduler.run_queued()
    (in_flight,) = built
    # The summarizer the job was given must be told to stop retrying.
    assert in_flight.stopped
