"""The LLM slots: a bound on summaries in flight, waited for before the agent's lock
is taken, and a shutdown that lets the waiting ones go without starting them."""

from __future__ import annotations

import threading

import pytest
from support.daemon_proc import wait_until

from memd.core.memfile import parse
from memd.core.summary import SummaryRequest, SummaryResult
from memd.daemon.llm_slots import LlmSlots
from memd.errors import (
    CompactionAborted,
    SummaryNotStarted,
    SummarySettingsChanged,
)


class Recording:
    model = "recording"

    def __init__(self) -> None:
        self.calls = 0

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        return SummaryResult(text=f"summary of {request.agent}", model=self.model)


def _request(agent: str) -> SummaryRequest:
    return SummaryRequest(agent, parse(b""), max_tokens=10)


def test_reserved_summarizer_keeps_model_and_result() -> None:
    inner = Recording()
    slots = LlmSlots(1)
    with slots.reserved("a", inner) as bound:
        assert bound.model == "recording"
        assert bound.summarize(_request("a")).text == "summary of a"
    with slots.reserved("b", inner) as bound:  # the slot came back
        assert bound.summarize(_request("b")).text == "summary of b"
    assert inner.calls == 2


def test_the_slot_is_taken_before_the_block_and_given_back_when_the_summary_returns() -> None:
    # The block is the transaction: it takes the agent's lock only once the slot
    # is there, and its file work after the summary (commit, drain) runs without it.
    slots = LlmSlots(1)
    inner = Recording()
    with slots.reserved("a", inner) as bound:
        assert slots._free == 0  # held from the start of the block
        bound.summarize(_request("a"))
        assert slots._free == 1  # back as soon as the summary returned


def test_a_reserved_slot_never_spent_is_given_back() -> None:
    # Under threshold once locked, nothing to compact, a busy lock: no summary.
    slots = LlmSlots(1)
    with slots.reserved("a", Recording()):
        pass
    with pytest.raises(RuntimeError), slots.reserved("b", Recording()):
        raise RuntimeError("the transaction failed before its summary")
    with slots.reserved("c", Recording()) as bound:
        assert bound.summarize(_request("c")).text == "summary of c"


def test_a_slot_is_returned_when_the_summary_fails() -> None:
    class Failing(Recording):
        def summarize(self, request: SummaryRequest) -> SummaryResult:
            raise RuntimeError("down")

    slots = LlmSlots(1)
    with pytest.raises(RuntimeError), slots.reserved("a", Failing()) as bound:
        bound.summarize(_request("a"))
    with slots.reserved("a", Recording()) as bound:
        assert bound.summarize(_request("a")).text == "summary of a"


def test_a_second_summary_waits_for_its_slot_then_summarizes() -> None:
    # The transaction starts over (MEMORY.md rewritten during its summary): it
    # waits for a slot under the agent's lock (review 16c F2: queued again
    # instead, its restart count started at 0 each time, so in a storm a file
    # rewritten during every summary was summarized again forever).
    slots = LlmSlots(1)
    inner = Recording()
    summarized_again = threading.Event()
    with slots.reserved("a", inner) as bound:
        bound.summarize(_request("a"))  # spends the reserved slot, gives it back
        with slots.reserved("b", Recording()) as other:  # the storm's next job has it

            def summarize_again() -> None:
                bound.summarize(_request("a"))
                summarized_again.set()

            again = threading.Thread(target=summarize_again)
            again.start()
            assert wait_until(lambda: len(slots._cond._waiters) == 1, timeout=10)  # type: ignore[attr-defined]
            assert not summarized_again.is_set()  # waits: never gives up, never overtakes
            other.summarize(_request("b"))  # b's summary ends: its slot goes to a
            again.join(10)
            assert summarized_again.is_set()
    assert inner.calls == 2
    assert slots._free == 1  # every slot back, exactly once


def test_a_second_summary_waiting_for_its_slot_stops_unstarted_on_close() -> None:
    slots = LlmSlots(1)
    inner = Recording()
    errors: list[BaseException] = []
    with slots.reserved("a", inner) as bound:
        bound.summarize(_request("a"))
        with slots.reserved("b", Recording()):

            def summarize_again() -> None:
                try:
                    bound.summarize(_request("a"))
                except BaseException as exc:
                    errors.append(exc)

            again = threading.Thread(target=summarize_again)
            again.start()
            assert wait_until(lambda: len(slots._cond._waiters) == 1, timeout=10)  # type: ignore[attr-defined]
            slots.close()
            again.join(10)
            assert not again.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], SummaryNotStarted)
    assert "'a'" in str(errors[0])
    assert inner.calls == 1  # the second summary never started
    assert slots._free == 1  # no slot taken for it, none given back twice


def test_waiters_beyond_the_slots_wait_then_give_up_on_close() -> None:
    slots = LlmSlots(1)
    errors: list[BaseException] = []
    entered: list[str] = []
    waiting = threading.Event()

    def wait_for_slot() -> None:
        waiting.set()
        try:
            with slots.reserved("b", Recording()):
                entered.append("b")
        except BaseException as exc:
            errors.append(exc)

    with slots.reserved("a", Recording()):
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
    with slots.reserved("a", Recording()):
        slots.close()
        with slots.reserved("b", Recording()):
            ran.append("b")  # both slots held at once
        with slots.reserved("c", Recording()):
            ran.append("c")
    assert ran == ["b", "c"]


def test_settings_changed_while_waiting_give_the_slot_back_unstarted() -> None:
    slots = LlmSlots(1)
    inner = Recording()
    with pytest.raises(SummarySettingsChanged), slots.reserved("a", inner, lambda: False):
        raise AssertionError("the block (the transaction, its lock) must not start")
    assert inner.calls == 0  # nothing was sent
    settings = ["current"]
    with slots.reserved("a", inner, lambda: settings == ["current"]) as bound:
        settings[0] = "reloaded"  # between the slot and the summary
        with pytest.raises(SummarySettingsChanged):
            bound.summarize(_request("a"))
    assert inner.calls == 0
    with slots.reserved("a", inner, lambda: True) as bound:
        assert bound.summarize(_request("a")).text == "summary of a"
