"""The LLM slots: a bound on summaries in flight, and a shutdown that lets the
waiting ones go without starting them."""

from __future__ import annotations

import threading

import pytest

from memd.core.memfile import parse
from memd.core.summary import SummaryRequest, SummaryResult
from memd.daemon.llm_slots import LlmSlots
from memd.errors import CompactionAborted, SummaryNotStarted, SummarySettingsChanged


class Recording:
    model = "recording"

    def __init__(self) -> None:
        self.calls = 0

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        return SummaryResult(text=f"summary of {request.agent}", model=self.model)


def _request(agent: str) -> SummaryRequest:
    return SummaryRequest(agent, parse(b""), max_tokens=10)


def test_bound_summarizer_keeps_model_and_result() -> None:
    inner = Recording()
    bound = LlmSlots(1).bound(inner)
    assert bound.model == "recording"
    assert bound.summarize(_request("a")).text == "summary of a"
    assert bound.summarize(_request("b")).text == "summary of b"  # the slot came back
    assert inner.calls == 2


def test_a_slot_is_returned_when_the_summary_fails() -> None:
    class Failing(Recording):
        def summarize(self, request: SummaryRequest) -> SummaryResult:
            raise RuntimeError("down")

    slots = LlmSlots(1)
    with pytest.raises(RuntimeError):
        slots.bound(Failing()).summarize(_request("a"))
    assert slots.bound(Recording()).summarize(_request("a")).text == "summary of a"


def test_waiters_beyond_the_slots_wait_then_give_up_on_close() -> None:
    slots = LlmSlots(1)
    errors: list[BaseException] = []
    entered: list[str] = []
    waiting = threading.Event()

    def wait_for_slot() -> None:
        waiting.set()
        try:
            with slots.held("b"):
                entered.append("b")
        except BaseException as exc:
            errors.append(exc)

    with slots.held("a"):
        waiter = threading.Thread(target=wait_for_slot)
        waiter.start()
        assert waiting.wait(10)
        waiter.join(0.05)
        assert waiter.is_alive()  # no slot for it yet
        slots.close()
        waiter.join(10)
        assert not waiter.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], SummaryNotStarted)
    assert isinstance(errors[0], CompactionAborted)  # the transaction rolls back as for any abort
    assert "'b'" in str(errors[0])
    assert entered == []  # never held a slot


def test_after_close_a_job_that_finds_a_slot_free_still_runs() -> None:
    # SIGTERM lets in-flight compactions commit: one that reaches its summary
    # after the stop began, with a slot free, is not refused.
    slots = LlmSlots(2)
    ran: list[str] = []
    with slots.held("a"):
        slots.close()
        with slots.held("b"):
            ran.append("b")  # both slots held at once
        with slots.held("c"):
            ran.append("c")
    assert ran == ["b", "c"]


def test_settings_changed_while_waiting_give_the_slot_back_unstarted() -> None:
    slots = LlmSlots(1)
    inner = Recording()
    with pytest.raises(SummarySettingsChanged):
        slots.bound(inner, lambda: False).summarize(_request("a"))
    assert inner.calls == 0  # nothing was sent
    assert slots.bound(inner, lambda: True).summarize(_request("a")).text == "summary of a"
