"""The LLM summarizer: one litellm ``completion`` call per summary, with our own retries.

litellm is imported lazily, on the first summary, because importing it takes
seconds and (unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set) fetches a price
map from the network; it also rewrites ``TIKTOKEN_CACHE_DIR``, which our own
offline tokenizer depends on, so that variable is restored after the import.

Errors are reported as one line naming the agent and a reason built from the
exception's *type and status code* only: provider messages can echo request
content or credentials, so they never reach our messages or logs.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
import re
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from memd.core.chunking import (
    WINDOW_SAFETY,
    Chunk,
    ChunkPlan,
    RequestLimits,
    Window,
    cut_at_line,
    request_limits,
)
from memd.core.config import SummarizerConfig
from memd.core.plan import ChunkBudget, chunk_budget, plan_chunks_of
from memd.core.privacy import Privacy, Redactor
from memd.core.prompts import (
    ChatMessage,
    CountText,
    build_rolling_messages,
    previous_summary_body,
    rolling_user_prompt,
    since_last_summary,
)
from memd.core.reply_check import reply_fault
from memd.core.summary import SummaryRequest, SummaryResult
from memd.core.summary_plan import degenerate_floor
from memd.errors import MemdError, SummarizerError
from memd.llm_guard import AttemptAbandoned, AttemptGuard, guarded_client, run_attempt
from memd.logs import guard_warnings, silence_request_loggers
from memd.modelinfo import window_for
from memd.redaction_key import process_key
from memd.settings import tiktoken_cache_dir_kept

_RETRYABLE_STATUS: Final = frozenset({408, 409, 425, 429})
_RETRYABLE_TYPE_NAMES: Final = frozenset(
    {
        "Timeout",
        "APITimeoutError",
        "APIConnectionError",
        "ServiceUnavailableError",
        "InternalServerError",
        "BadGatewayError",
        "RateLimitError",
    }
)
_BACKOFF_BASE_S: Final = 1.0
_BACKOFF_MAX_S: Final = 30.0

_import_lock = threading.Lock()
_litellm: ModuleType | None = None


def import_litellm() -> ModuleType:
    """Import litellm once, offline, without letting it change TIKTOKEN_CACHE_DIR."""
    global _litellm
    # The tokenizer's loading lock too: litellm rewrites TIKTOKEN_CACHE_DIR on
    # import, which a tokenizer load in another thread depends on meanwhile.
    from memd.tokenizer import loading_lock

    with _import_lock, loading_lock:
        if _litellm is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            with tiktoken_cache_dir_kept():
                import litellm
            # No "Give Feedback / Get Help" banners on stderr for every error.
            litellm.suppress_debug_info = True
            # litellm's debug logs carry request bodies (memory content) and
            # httpx's request lines carry URLs (some providers put the key in
            # the query string): neither may reach memd's logs.  The import may
            # come before or after configure_logging, which does the same.
            silence_request_loggers()
            # A warning's text may quote a reply (memory content): never shown.
            guard_warnings()
            # Replies are read through a transport that enforces each attempt's
            # wall-clock deadline and size cap (memd.llm_guard).
            if litellm.client_session is None:
                litellm.client_session = guarded_client()
            _litellm = litellm
        return _litellm


@functools.lru_cache(maxsize=64)
def litellm_provider(model: str) -> str | None:
    """The provider litellm sends ``model`` to: its ``provider/`` prefix, or for a
    bare name (``gpt-4o``) the one litellm infers from its model lists; None when
    litellm cannot tell (it would refuse the request) or cannot be imported.

    The privacy rule's resolver (:func:`memd.core.privacy.is_local_summarizer`):
    it asks only for a bare name with a local ``api_base``, so litellm is imported
    for that alone (seconds, offline).  Loopback and ``local_hosts`` are never one
    of the public endpoints litellm also routes by, so the name alone decides."""
    try:
        litellm = import_litellm()
        provider = litellm.get_llm_provider(model=model)[1]
    except Exception:
        return None  # unknown: the caller judges the model remote
    return provider if isinstance(provider, str) and provider else None


def warm_up() -> bool:
    """Import litellm ahead of the first summary (the daemon does it after READY).

    False on failure, which is not reported here: the first summary imports
    again and says why.
    """
    try:
        import_litellm()
    except Exception:
        return False
    return True


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def is_retryable(exc: BaseException) -> bool:
    """Timeouts, rate limits, 5xx and connection errors; never 4xx such as 401/400."""
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    status = _status_of(exc)
    if status is not None:
        return status in _RETRYABLE_STATUS or status >= 500
    return type(exc).__name__ in _RETRYABLE_TYPE_NAMES


def describe_failure(exc: BaseException, timeout_s: float) -> str:
    """A reason safe to log: exception type and status code, never its message."""
    name = type(exc).__name__
    status = _status_of(exc)
    if isinstance(exc, TimeoutError) or name in {"Timeout", "APITimeoutError"}:
        return f"timed out after {timeout_s:g}s ({name})"
    if status == 401:
        return f"authentication failed ({name}, HTTP 401): check summarizer.api_key"
    if status == 429:
        return f"rate limited ({name}, HTTP 429)"
    if status is not None:
        return f"{name} (HTTP {status})"
    return name


# A reply is JSON around at most max_tokens tokens; escaping can blow a token
# up to a few dozen bytes. Anything beyond is not a summary.
_MAX_REPLY_OVERHEAD: Final = 1 << 20
_MAX_REPLY_BYTES_PER_TOKEN: Final = 64


def _deadline_reason(timeout_s: float) -> str:
    return f"timed out after {timeout_s:g}s (no complete reply by the wall-clock deadline)"


def _attempt_failure(exc: Exception, guard: AttemptGuard, timeout_s: float) -> tuple[str, bool]:
    """(reason, retryable) of a failed attempt, preferring what the guard saw."""
    if guard.tripped == "deadline":
        return _deadline_reason(timeout_s), True
    if guard.tripped is not None:
        return guard.tripped, False
    if guard.connect_error is not None:
        return guard.connect_error, True
    return describe_failure(exc, timeout_s), is_retryable(exc)


def backoff_delay(attempt: int, rng: random.Random, base_s: float = _BACKOFF_BASE_S) -> float:
    """Exponential backoff with jitter: uniform in [c/2, c], c = min(cap, base * 2**attempt).

    Half the ceiling is kept so a retry never fires at once; the random half
    spreads the retries of many agents hitting the same rate limit.
    """
    ceiling = min(_BACKOFF_MAX_S, base_s * (2**attempt))
    return rng.uniform(ceiling / 2, ceiling)


def retry_after_s(exc: BaseException) -> float | None:
    """The server's ``Retry-After`` in seconds (numeric form), when sane."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return seconds if seconds is not None and 0 <= seconds <= _BACKOFF_MAX_S else None


# Reasoning models served raw (e.g. deepseek-r1 on Ollama) put their thinking
# inline; some models wrap the whole answer in a code fence.  Neither belongs
# in the agent's memory.
_THINKING_RE: Final = re.compile(r"\A\s*<think>.*?</think>", re.DOTALL)
_OUTER_FENCE_RE: Final = re.compile(r"\A```[\w-]*\n(.*)\n```\Z", re.DOTALL)


def clean_summary_text(content: str) -> str:
    text = _THINKING_RE.sub("", content).strip()
    fenced = _OUTER_FENCE_RE.match(text)
    return fenced.group(1).strip() if fenced else text


def _field(obj: Any, name: str) -> Any:
    """Read a field from a litellm object or a plain dict alike."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _missing_credentials(litellm: ModuleType, kwargs: dict[str, Any]) -> list[str]:
    """Names of the provider's key env vars, when no key is configured or set."""
    try:
        report = litellm.validate_environment(
            model=kwargs["model"], api_key=kwargs.get("api_key"), api_base=kwargs.get("api_base")
        )
    except Exception:
        return []  # unknown to litellm: let the call itself report it
    missing = report.get("missing_keys", []) if isinstance(report, dict) else []
    return [str(name) for name in missing if "KEY" in str(name).upper()]


_MIN_CHUNK_TOKENS: Final = 128
_TRUNCATED: Final = "summary truncated (finish_reason=length)"


class _Truncated(SummarizerError):
    """The model ran out of output tokens (DESIGN §2: a failure, never a summary)."""


_logger = logging.getLogger("memd.summarizer")


def _estimate_tokens(text: str) -> int:
    # No tokenizer given (tests, tools): a conservative estimate, never low.
    return len(text) // 3 + 1


class _Outbound:
    """One summary's requests: their redaction (and how many secrets it replaced)
    and how many went out, against the allowance a spending cap leaves
    (``allowed``; None: no cap, retries and re-asks as configured).

    One per summary: the summarizer object is shared by concurrent compactions.
    """

    def __init__(self, redactor: Redactor | None, allowed: int | None = None) -> None:
        self.redactor = redactor
        self.replaced = 0
        self.allowed = allowed
        self.sent = 0
        # What the priced replies cost (a failed request has no price).
        self.cost_usd = 0.0

    def may_send(self) -> bool:
        return self.allowed is None or self.sent < self.allowed

    def text(self, text: str) -> str:
        if self.redactor is None or not text:
            return text
        redaction = self.redactor.redact(text)
        self.replaced += redaction.count
        return redaction.text


class LiteLLMSummarizer:
    """Summaries from any litellm model (``openai/…``, ``anthropic/…``, ``ollama/…``).

    Every turn is read: the transcript is cut into chunks that fit the model's
    window and summarized in rolling calls, at most ``max_calls`` of them; when
    more would be needed the result says how far it got (a partial compaction).
    """

    def __init__(
        self,
        config: SummarizerConfig,
        count_text: CountText | None = None,
        *,
        window: Window | None = None,
        sleep: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
        backoff_base_s: float = _BACKOFF_BASE_S,
    ) -> None:
        self._config = config
        self._count_text: CountText = count_text or _estimate_tokens
        self.window = window or window_for(config)
        # Set by stop(): no new attempt starts and a backoff wait ends at once.
        self._stopping = threading.Event()
        self._sleep = sleep if sleep is not None else self._stopping.wait
        self._rng = rng if rng is not None else random.Random()
        self._backoff_base_s = backoff_base_s

    @property
    def model(self) -> str:
        return self._config.model

    def limits(self, summary_tokens: int) -> RequestLimits:
        return request_limits(self.window.tokens, self._config.max_tokens, summary_tokens)

    def redactor(self, request: SummaryRequest) -> Redactor | None:
        """What redacts every text this model is sent; None when it is local (README "Privacy")."""
        privacy = request.privacy or Privacy(process_key())
        return privacy.outbound(self._config.model, self._config.api_base, litellm_provider)

    def plan(self, request: SummaryRequest) -> tuple[ChunkPlan, str, RequestLimits]:
        """The chunks this request needs: (plan, summary so far to start from, limits)."""
        return self._plan(request, _Outbound(self.redactor(request)))

    def budget(self, request: SummaryRequest) -> ChunkBudget:
        """The room this model's window leaves each request for ``request``'s turns."""
        return self._budget(request, _Outbound(self.redactor(request)))[0]

    def _plan(
        self, request: SummaryRequest, outbound: _Outbound
    ) -> tuple[ChunkPlan, str, RequestLimits]:
        # The chunks, as the core plans them (memd.core.plan: what the
        # transaction keeps verbatim and carries is decided by the same module).
        budget, previous, limits = self._budget(request, outbound)
        plan = plan_chunks_of(request.document, budget, self._count_text, outbound.text, previous)
        return plan, previous if budget.previous_inline else "", limits

    def _budget(
        self, request: SummaryRequest, outbound: _Outbound
    ) -> tuple[ChunkBudget, str, RequestLimits]:
        # Texts are redacted before they are measured and cut: a placeholder
        # is not as long as the secret it replaces.
        count = self._count_text
        limits = self.limits(request.max_tokens)
        previous = outbound.text(previous_summary_body(since_last_summary(request.document)))
        overhead = (
            count(
                build_rolling_messages(
                    "",
                    [],
                    summary_max_tokens=limits.output_tokens,
                    instructions=request.instructions,
                    part=99,
                    parts=99,
                )[0]["content"]
            )
            + count(build_rolling_messages("", [], summary_max_tokens=1)[1]["content"])
            + 16
        )
        max_calls = self._config.max_calls
        if request.max_calls is not None:
            max_calls = max(1, min(max_calls, request.max_calls))
        budget = chunk_budget(limits, overhead, count(previous) if previous else 0, max_calls)
        if budget.chunk_tokens < _MIN_CHUNK_TOKENS:
            # The least a request asks for (the smallest max_tokens, no previous
            # summary inline): when even that leaves no room, lowering
            # max_tokens cannot help, only a bigger window can.
            least = request_limits(self.window.tokens, 0, 0)
            if chunk_budget(least, overhead, 0, max_calls).chunk_tokens < _MIN_CHUNK_TOKENS:
                needed = math.ceil(
                    (overhead + 2 * least.output_tokens + _MIN_CHUNK_TOKENS) / WINDOW_SAFETY
                )
                raise SummarizerError(
                    f"summarizer {self.model!r}: its window ({self.window.tokens} tokens, from "
                    f"{self.window.source}) is too small for memd's prompt ({overhead} tokens) "
                    f"and a transcript; raise summarizer.context_length (at least {needed})"
                )
            raise SummarizerError(
                f"summarizer {self.model!r}: its window ({self.window.tokens} tokens, from "
                f"{self.window.source}) leaves no room for the transcript; raise "
                "summarizer.context_length or lower summarizer.max_tokens"
            )
        return budget, previous, limits

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Rolling calls over the planned chunks; each bounded by ``timeout_s`` and ``retries``.

        Worst case wall time per call: ``(retries + 1) * timeout_s`` plus the
        backoff sleeps between attempts (exponential from 1 s, capped at 30 s).
        """
        agent = request.agent
        try:
            litellm = import_litellm()
        except Exception as exc:
            raise SummarizerError(
                f"summarizer for agent {agent!r}: cannot import litellm ({type(exc).__name__})"
            ) from None
        if self.window.source == "default":
            _logger.warning(
                "summarizer %r: window unknown, assuming %d tokens; set summarizer.context_length",
                self.model,
                self.window.tokens,
            )
        outbound = _Outbound(self.redactor(request), request.max_calls)
        try:
            return self._summarize(request, agent, litellm, outbound)
        except MemdError as exc:
            # A failure says what it spent (the daemon's spending caps count
            # every request, re-asks and retries included): values, no call-back.
            exc.model_calls = outbound.sent
            exc.model_cost_usd = outbound.cost_usd
            raise

    def _summarize(
        self, request: SummaryRequest, agent: str, litellm: ModuleType, outbound: _Outbound
    ) -> SummaryResult:
        plan, summary, limits = self._plan(request, outbound)
        read_tokens = self._count_text(summary) if summary else 0
        cost: float | None = 0.0
        input_tokens = output_tokens = 0
        # A summary block alone, sent whole (no turn after it): the transaction
        # compacts it only when it is over its budget, so it is asked for once,
        # to be written shorter (held to the budget by the transaction).
        shorten = not plan.chunks and bool(summary.strip())
        chunks = (Chunk((), 0, 0),) if shorten else plan.chunks
        parts = len(chunks)
        stopped_at: int | None = None
        for part, chunk in enumerate(chunks, start=1):
            if part > 1 and self._stopping.is_set():
                # memd is stopping: the chunks summarized so far commit as a
                # partial compaction (the rest stays raw for the next one)
                # instead of every remaining call delaying the stop.
                done = chunks[part - 2].end
                if done <= 0:
                    raise SummarizerError(
                        f"summarizer {self.model!r} failed for agent {agent!r}: memd is "
                        "stopping; the summary is not finished (nothing changed)"
                    )
                stopped_at = done
                break
            messages = build_rolling_messages(
                summary,
                chunk.texts,
                summary_max_tokens=limits.output_tokens,
                instructions=request.instructions,
                part=part,
                parts=parts,
                shorten=shorten,
            )
            # A cut-off answer is asked once more for a summary half as long;
            # a second cut-off answer fails the compaction (nothing changes).
            retry_messages = build_rolling_messages(
                summary,
                chunk.texts,
                summary_max_tokens=limits.output_tokens // 2,
                instructions=request.instructions,
                part=part,
                parts=parts,
                shorten=shorten,
            )
            result = self._call_once_more_if_cut(
                messages, limits.output_tokens, agent, litellm, retry_messages, outbound
            )
            if (
                self._count_text(result.text) > limits.output_tokens
                and outbound.may_send()
                and not self._stopping.is_set()
            ):
                # A complete answer over its budget is asked once more, for a
                # summary half as long; one still over is cut at a line below
                # (marked), never refused: it is a summary, only too long.
                shorter = self._call_once_more_if_cut(
                    retry_messages, limits.output_tokens, agent, litellm, retry_messages, outbound
                )
                cost = None if cost is None or result.cost_usd is None else cost + result.cost_usd
                input_tokens += result.input_tokens or 0
                output_tokens += result.output_tokens or 0
                result = shorter
            read_tokens += chunk.tokens
            reply_tokens = self._count_text(result.text)
            # Judged against what it was given: the chunk, or the summary to shorten.
            given = read_tokens if shorten else chunk.tokens
            if reply_tokens < degenerate_floor(given, limits.output_tokens):
                what = "summary to shorten" if shorten else "chunk"
                raise SummarizerError(
                    f"summarizer {self.model!r} failed for agent {agent!r}: reply refused as "
                    f"degenerate ({reply_tokens} tokens for a {given}-token {what})"
                )
            # Judged against what this request sent: a refusal, sections left
            # empty, the prompt echoed back (review r9summary F3, F4).
            fault = reply_fault(
                result.text,
                summary + "\n\n" + "\n\n".join(chunk.texts),
                (
                    messages[0]["content"],
                    rolling_user_prompt("", [], part, parts, shorten=shorten),
                ),
                material_tokens=chunk.tokens + (self._count_text(summary) if summary else 0),
            )
            if fault is not None:
                raise SummarizerError(
                    f"summarizer {self.model!r} failed for agent {agent!r}: reply refused as "
                    f"degenerate: {fault}"
                )
            # A model may overshoot max_tokens as we count them: never carry
            # more than the planned room into the next request (cut at a line
            # boundary, marked).
            summary = cut_at_line(result.text, limits.output_tokens, self._count_text)
            cost = None if cost is None or result.cost_usd is None else cost + result.cost_usd
            input_tokens += result.input_tokens or 0
            output_tokens += result.output_tokens or 0
        return SummaryResult(
            text=summary,
            model=self.model,
            cost_usd=cost,
            input_tokens=input_tokens or None,
            output_tokens=output_tokens or None,
            summarized_until=stopped_at if stopped_at is not None else plan.summarized_until,
            calls=outbound.sent,  # every request, re-asks and retries included
            redacted=outbound.replaced,
            redacted_pii=outbound.redactor is not None and outbound.redactor.pii,
            given_as_written=outbound.redactor is None,
            read_tokens=read_tokens,
        )

    def _completion_kwargs(self, messages: list[ChatMessage], max_tokens: int) -> dict[str, Any]:
        config = self._config
        kwargs: dict[str, Any] = {
            "model": config.model,
            "messages": messages,
            "temperature": config.temperature,
            "max_tokens": max_tokens,
            "timeout": config.timeout_s,
            # Retries are ours (counted, with backoff); neither litellm nor the
            # provider SDK underneath may retry on their own.
            "num_retries": 0,
            "max_retries": 0,
            # Parameters a provider does not support (e.g. temperature on some
            # reasoning models) are dropped rather than failing the summary.
            "drop_params": True,
        }
        if config.api_base:
            kwargs["api_base"] = config.api_base
        api_key = config.api_key.get_secret_value()
        if api_key:
            kwargs["api_key"] = api_key  # else: the provider's usual env var
        return kwargs

    def _call_once_more_if_cut(
        self,
        messages: list[ChatMessage],
        max_tokens: int,
        agent: str,
        litellm: ModuleType,
        shorter: list[ChatMessage],
        outbound: _Outbound | None = None,
    ) -> SummaryResult:
        try:
            return self._call(messages, max_tokens, agent, litellm, outbound)
        except _Truncated:
            pass  # out of the except block: the second error chains nothing
        return self._call(shorter, max_tokens, agent, litellm, outbound)

    def _call(
        self,
        messages: list[ChatMessage],
        max_tokens: int,
        agent: str,
        litellm: ModuleType,
        outbound: _Outbound | None = None,
    ) -> SummaryResult:
        if outbound is not None:
            # The last gate before the wire: the summary so far (a model's
            # reply), instructions and anything a caller built itself.
            messages = [{**m, "content": outbound.text(m["content"])} for m in messages]
        kwargs = self._completion_kwargs(messages, max_tokens)
        missing = _missing_credentials(litellm, kwargs)
        if missing:
            # litellm would report this as a retryable "HTTP 500"; say what to set.
            raise SummarizerError(
                f"summarizer {self.model!r} failed for agent {agent!r}: no API key "
                f"(set summarizer.api_key or {' / '.join(missing)})"
            )
        # Each attempt and all of them together are bounded by the wall clock,
        # whatever the server does (a reply trickling in byte by byte included):
        # worst case (retries + 1) * timeout_s, backoff sleeps included.
        attempts = self._config.retries + 1
        timeout_s = self._config.timeout_s
        overall_deadline = time.monotonic() + timeout_s * attempts
        max_reply = _MAX_REPLY_OVERHEAD + _MAX_REPLY_BYTES_PER_TOKEN * int(kwargs["max_tokens"])
        reason = ""
        for attempt in range(attempts):
            if attempt and self._stopping.is_set():
                raise SummarizerError(
                    f"summarizer {self.model!r} failed for agent {agent!r}: memd is stopping; "
                    f"not retrying ({reason})"
                )
            if outbound is not None:
                if outbound.sent and self._stopping.is_set():
                    # The next chunk or a re-ask of a summary under way: a stop
                    # must not wait for every remaining call (TimeoutStopSec).
                    raise SummarizerError(
                        f"summarizer {self.model!r} failed for agent {agent!r}: memd is "
                        "stopping; the summary is not finished (nothing changed)"
                    )
                if not outbound.may_send():
                    raise SummarizerError(
                        f"summarizer {self.model!r} failed for agent {agent!r}: the spending "
                        f"cap leaves {outbound.allowed} model requests for this compaction, "
                        f"all used{f' ({reason})' if reason else ''}; nothing changed"
                    )
                outbound.sent += 1
            guard = AttemptGuard(
                deadline=min(time.monotonic() + timeout_s, overall_deadline),
                max_reply_bytes=max_reply,
            )
            server_says: float | None = None
            try:
                response = run_attempt(lambda: litellm.completion(**kwargs), guard)
            except AttemptAbandoned:
                reason, retryable = _deadline_reason(timeout_s), True
            except Exception as exc:
                reason, retryable = _attempt_failure(exc, guard, timeout_s)
                server_says = retry_after_s(exc)
            else:
                if outbound is not None:
                    # Priced before it is judged: a cut-off reply was paid for too.
                    outbound.cost_usd += self._cost_of(response, litellm) or 0.0
                return self._result_of(response, agent, litellm)
            if retryable and attempt + 1 < attempts:
                # A rate limiter that says when to come back knows best.
                delay = max(
                    backoff_delay(attempt, self._rng, self._backoff_base_s), server_says or 0
                )
                if time.monotonic() + delay < overall_deadline:
                    self._sleep(delay)
                    continue
                reason += f"; no time left for a retry within {timeout_s * attempts:g}s"
            tried = f" after {attempt + 1} attempts" if attempt else ""
            # ``from None``: the provider exception's text may hold content.
            raise SummarizerError(
                f"summarizer {self.model!r} failed for agent {agent!r}{tried}: {reason}"
            ) from None
        raise AssertionError("unreachable: the loop returns or raises")

    def stop(self) -> None:
        """memd is stopping: the attempt in flight may finish, no retry starts."""
        self._stopping.set()

    def _result_of(self, response: Any, agent: str, litellm: ModuleType) -> SummaryResult:
        def fail(reason: str) -> SummarizerError:
            return SummarizerError(
                f"summarizer {self.model!r} failed for agent {agent!r}: {reason}"
            )

        choices = _field(response, "choices") or []
        if not choices:
            raise fail("response has no choices")
        choice = choices[0]
        finish_reason = _field(choice, "finish_reason")
        if finish_reason == "length":
            raise _Truncated(
                f"summarizer {self.model!r} failed for agent {agent!r}: {_TRUNCATED}: raise "
                "summarizer.max_tokens or ask for a shorter summary"
            )
        content = _field(_field(choice, "message"), "content")
        if content is None:
            raise fail("response content is null")
        text = clean_summary_text(content) if isinstance(content, str) else ""
        if not text:
            raise fail("response content is empty")
        usage = _field(response, "usage")
        input_tokens = _field(usage, "prompt_tokens") if usage is not None else None
        output_tokens = _field(usage, "completion_tokens") if usage is not None else None
        return SummaryResult(
            text=text,
            model=self.model,
            cost_usd=self._cost_of(response, litellm),
            input_tokens=input_tokens if isinstance(input_tokens, int) else None,
            output_tokens=output_tokens if isinstance(output_tokens, int) else None,
        )

    @staticmethod
    def _cost_of(response: Any, litellm: ModuleType) -> float | None:
        """USD cost when litellm knows the model's prices; ``None`` otherwise."""
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:
            return None
        return float(cost) if isinstance(cost, int | float) and cost >= 0 else None


def probe(config: SummarizerConfig) -> float:
    """Make one real 1-token request to the configured model; its wall time in seconds.

    For ``memd doctor``: a TCP connect proves little (a proxy, a wrong path, a
    bad key all connect). Raises :class:`SummarizerError` with the reason.
    """
    try:
        litellm = import_litellm()
    except Exception as exc:
        raise SummarizerError(f"cannot import litellm ({type(exc).__name__})") from None
    kwargs: dict[str, Any] = {
        "model": config.model,
        "messages": [{"role": "user", "content": "Reply with the single word OK."}],
        "max_tokens": 1,
        "timeout": config.timeout_s,
        "num_retries": 0,
        "max_retries": 0,
        "drop_params": True,
    }
    if config.api_base:
        kwargs["api_base"] = config.api_base
    if config.api_key.get_secret_value():
        kwargs["api_key"] = config.api_key.get_secret_value()
    guard = AttemptGuard(
        deadline=time.monotonic() + config.timeout_s, max_reply_bytes=_MAX_REPLY_OVERHEAD
    )
    started = time.monotonic()
    try:
        run_attempt(lambda: litellm.completion(**kwargs), guard)
    except AttemptAbandoned:
        raise SummarizerError(_deadline_reason(config.timeout_s)) from None
    except Exception as exc:
        raise SummarizerError(_attempt_failure(exc, guard, config.timeout_s)[0]) from None
    return time.monotonic() - started
