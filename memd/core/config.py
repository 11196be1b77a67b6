"""The configuration model and per-agent policy resolution (pure).

Loading (TOML file, ``MEMD_*`` env vars, flags) lives in :mod:`memd.settings`;
this module only defines what a valid configuration is.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from memd.core.descriptor import DESCRIPTOR_NAME, RESERVED_MAX_SHARE, AgentWindow
from memd.core.retention import NO_LIMITS, RetentionLimits
from memd.core.summary_plan import SummaryBudgets, summary_budgets
from memd.core.tokens import DEFAULT_MAX_PIECE_BYTES, ENCODING_NAMES

# Upper bounds: a value past these is a typo, and one past 2**63 cannot even
# be stored in the state database (the daemon would then never compact).
MAX_CONTEXT_TOKENS = 100_000_000
_DAY_S = 86_400.0


def _no_nul(value: str) -> str:
    # The OS refuses a path holding a NUL byte, with a bare "embedded null byte"
    # ValueError far from the config: refused here, where the error names the key.
    if "\x00" in value:
        raise ValueError("a path cannot contain a NUL byte")
    return value


# A path key's text (workspace, state_dir, privacy.key_file, recall.socket).
PathText = Annotated[str, AfterValidator(_no_nul)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)


class TriggerConfig(_Section):
    threshold: float = Field(0.9, gt=0, le=1, description="fraction of context_length")
    context_length: int = Field(200_000, gt=0, le=MAX_CONTEXT_TOKENS, description="tokens")
    max_tokens: int = Field(
        0, ge=0, le=MAX_CONTEXT_TOKENS, description="absolute cap in tokens (0 = off)"
    )
    debounce_ms: int = Field(500, ge=0, le=600_000)
    max_wait_ms: int = Field(5_000, ge=0, le=3_600_000, description="debounce ceiling")
    low_water: float = Field(
        0.6, gt=0, lt=1, description="a compaction must end below low_water × threshold"
    )


class TokenizerConfig(_Section):
    encoding: str = Field("cl100k_base", min_length=1)
    max_piece_bytes: int = Field(
        DEFAULT_MAX_PIECE_BYTES,
        ge=64 << 10,
        le=64 << 20,
        description="a run this long with no safe cut is estimated, not merged by BPE",
    )

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        if value not in ENCODING_NAMES:
            raise ValueError(f"unknown encoding; use one of: {', '.join(sorted(ENCODING_NAMES))}")
        return value


class SummarizerConfig(_Section):
    model: str = Field("builtin", min_length=1)
    api_base: str = ""
    api_key: SecretStr = SecretStr("")
    temperature: float = Field(0.2, ge=0, le=2)
    max_tokens: int = Field(4000, gt=0, le=200_000)
    timeout_s: float = Field(120, gt=0, le=3600)
    retries: int = Field(2, ge=0, le=10)
    summary_instructions: str = ""
    context_length: int = Field(
        0, ge=0, le=10_000_000, description="the summarizer model's window (0 = derive)"
    )
    max_calls: int = Field(8, ge=1, le=1_000, description="model calls per compaction")
    fallback_after: int = Field(
        3, ge=0, le=1_000, description="failures of a remote model before the builtin (0 = never)"
    )
    summary_tokens: int = Field(
        0, ge=0, le=1_000_000, description="summary budget (0 = a share of the threshold)"
    )
    pinned_tokens: int = Field(
        0, ge=0, le=1_000_000, description="pinned facts budget (0 = a share of the threshold)"
    )
    keep_recent_tokens: int = Field(
        -1,
        ge=-1,
        le=1_000_000,
        description="newest turns kept verbatim (-1 = a tenth of the threshold, 0 = off)",
    )
    max_calls_per_hour: int = Field(
        0, ge=0, le=1_000_000, description="model requests per hour, workspace-wide (0 = no cap)"
    )
    max_usd_per_day: float = Field(
        0.0, ge=0, le=1_000_000, description="USD per 24 h as litellm prices it (0 = no cap)"
    )


class CompactionConfig(_Section):
    drain_quiet_s: float = Field(1.0, ge=0, le=60, description="old-inode quiet period")
    drain_max_s: float = Field(10.0, ge=0, le=600)
    lock_wait_s: float = Field(300.0, ge=0, le=_DAY_S, description="compact-now default --wait")
    max_restarts: int = Field(3, ge=0, le=20, description="re-summarize when prefix changed")

    @field_validator("drain_quiet_s", "drain_max_s")
    @classmethod
    def _drain_has_a_window(cls, value: float) -> float:
        # Either at 0 ends the drain at its first pass (it ends once the old file
        # was quiet that long, or that long after it started): a writer that
        # opened MEMORY.md just before the swap and writes a moment later would
        # write to a file memd has let go of, its turn lost (DESIGN §2.1).
        if value == 0:
            raise ValueError(
                "must be more than 0: 0 ends the drain at its first pass, and a turn a "
                "writer that opened MEMORY.md just before the swap writes a moment later "
                "is lost"
            )
        return value


class WatchConfig(_Section):
    poll: bool = False
    poll_interval_s: float = Field(1.0, gt=0, le=3600)
    reconcile_s: float = Field(30.0, gt=0, le=86_400)


class DaemonConfig(_Section):
    max_concurrent_llm: int = Field(2, ge=1, le=256, description="summaries in flight")
    # Compactions in flight (snapshot, commit, drain wait): the pool the LLM
    # slots are taken from, so never fewer than max_concurrent_llm.
    max_concurrent_io: int = Field(32, ge=1, le=1024, description="compactions in flight")
    retry_base_s: float = Field(5.0, gt=0, le=_DAY_S)
    retry_max_s: float = Field(600.0, gt=0, le=7 * _DAY_S)
    cooldown_s: float = Field(60.0, ge=0, le=_DAY_S)
    # Appends that arrived during a compaction: compact again, but not sooner.
    min_interval_s: float = Field(1.0, ge=0, le=3600)
    breaker_failures: int = Field(5, ge=1, le=1000)
    breaker_reset_s: float = Field(1800.0, gt=0, le=7 * _DAY_S)
    state_flush_s: float = Field(5.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _backoff_starts_under_its_cap(self) -> DaemonConfig:
        # The backoff is retry_base_s doubling up to retry_max_s: a base above the
        # cap is a typo (a swapped pair, a unit slip) that made every retry wait
        # the base, the cap never applied.
        if self.retry_base_s > self.retry_max_s:
            raise ValueError(
                f"retry_base_s ({self.retry_base_s:g}) is more than retry_max_s "
                f"({self.retry_max_s:g}): the retry backoff starts at retry_base_s and "
                "doubles up to retry_max_s; lower retry_base_s or raise retry_max_s"
            )
        return self


class LogConfig(_Section):
    format: Literal["auto", "json", "console"] = "auto"
    level: Literal["debug", "info", "warning", "error"] = "info"


class MetricsConfig(_Section):
    port: int = Field(0, ge=0, le=65535, description="0 = off")
    bind: str = "127.0.0.1"


class RecallConfig(_Section):
    socket: PathText = Field(
        "",
        description='agents\' recall socket: "" = <workspace>/.memd-recall.sock, "off" = none',
    )


class RetentionConfig(_Section):
    """How long raw archives are kept (0 = no limit); per agent in ``[agents."glob"]``."""

    max_archives: int = Field(0, ge=0, le=1_000_000, description="archives kept per agent")
    max_age_days: float = Field(0, ge=0, le=36_500, description="archives older are deleted")
    max_total_mb: float = Field(
        0, ge=0, le=100_000_000, description="MiB of archives kept per agent"
    )

    def limits(self) -> RetentionLimits:
        return RetentionLimits(self.max_archives, self.max_age_days, self.max_total_mb)


def _is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text.strip("[]"), strict=False)
    except ValueError:
        return False
    return True


_PATTERN_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,47}")


class PrivacyConfig(_Section):
    """What leaves the machine: redaction before a summarizer call (README "Privacy")."""

    redact: bool = Field(
        True, description="replace credentials before text goes to a remote summarizer"
    )
    redact_pii: bool | Literal["auto"] = Field(
        "auto", description="also emails, phones, card numbers, national ids (auto = remote only)"
    )
    redact_local: bool = Field(
        False,
        description="redact for local summarizers too (a loopback proxy to a remote provider)",
    )
    local_hosts: tuple[str, ...] = Field(
        (), description="api_base hosts that count as local besides loopback and unix sockets"
    )
    patterns: dict[str, str] = Field(
        default_factory=dict, description="name -> regex of your own secrets"
    )
    encrypt_archives: bool = Field(
        False, description="write archives as authenticated ciphertext (history_<ts>.md.enc)"
    )
    # A path, never the key: the key file is made by `memd archive keygen FILE`.
    key_file: PathText = Field("", description="master key file (also MEMD_PRIVACY_KEY_FILE)")

    @field_validator("redact_pii", mode="before")
    @classmethod
    def _pii_mode(cls, value: Any) -> Any:
        text = str(value).strip().lower() if isinstance(value, str) else value
        choices = {"auto": "auto", "true": True, "false": False, "1": True, "0": False}
        if isinstance(text, bool) or text in ("auto", True, False):
            return text
        if isinstance(text, str) and text in choices:
            return choices[text]
        raise ValueError('must be true, false or "auto"')

    @field_validator("local_hosts", mode="before")
    @classmethod
    def _hosts_from_text(cls, value: Any) -> Any:
        # MEMD_PRIVACY_LOCAL_HOSTS="gpu-box, llm.lan"
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("local_hosts")
    @classmethod
    def _hosts_are_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for host in value:
            if not host or any(c.isspace() or c in "@?#:" for c in host.strip("[]")):
                if not _is_network(host):
                    raise ValueError(f"{host!r} is not a host name, address or network")
            elif "/" in host and not _is_network(host):
                raise ValueError(f"{host!r} is not a network (e.g. 10.1.0.0/16)")
        return tuple(host.strip("[]").lower() for host in value)

    @field_validator("patterns", mode="before")
    @classmethod
    def _patterns_from_text(cls, value: Any) -> Any:
        # MEMD_PRIVACY_PATTERNS='{"ticket_secret": "TS-[0-9]{8}"}'
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("must be a JSON object of name -> regex") from None
        return value

    @field_validator("patterns")
    @classmethod
    def _patterns_compile(cls, value: dict[str, str]) -> dict[str, str]:
        for name, pattern in value.items():
            if not _PATTERN_NAME_RE.fullmatch(name):
                raise ValueError(
                    f"pattern name {name!r}: use letters, digits, '_' or '-' (at most 48), "
                    "starting with a letter"
                )
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(
                    f"pattern {name!r} is not a valid regular expression: {exc.msg} "
                    f"at position {exc.pos}"
                ) from None
            if compiled.fullmatch(""):
                raise ValueError(f"pattern {name!r} matches the empty string")
        return value


class AgentOverride(_Section):
    model: str | None = None
    threshold: float | None = Field(None, gt=0, le=1)
    context_length: int | None = Field(None, gt=0, le=MAX_CONTEXT_TOKENS)
    max_tokens: int | None = Field(None, ge=0, le=MAX_CONTEXT_TOKENS)
    summary_instructions: str | None = None
    context_compression: bool | None = None
    # The summary budgets for these agents ([summarizer] keys of the same names).
    summary_tokens: int | None = Field(None, ge=0, le=1_000_000)
    pinned_tokens: int | None = Field(None, ge=0, le=1_000_000)
    keep_recent_tokens: int | None = Field(None, ge=-1, le=1_000_000)
    max_archives: int | None = Field(None, ge=0, le=1_000_000)
    max_age_days: float | None = Field(None, ge=0, le=36_500)
    max_total_mb: float | None = Field(None, ge=0, le=100_000_000)


class MemdConfig(_Section):
    workspace: PathText = ""
    state_dir: PathText = ""
    trigger: TriggerConfig = TriggerConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    summarizer: SummarizerConfig = SummarizerConfig()
    compaction: CompactionConfig = CompactionConfig()
    watch: WatchConfig = WatchConfig()
    daemon: DaemonConfig = DaemonConfig()
    log: LogConfig = LogConfig()
    metrics: MetricsConfig = MetricsConfig()
    recall: RecallConfig = RecallConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    retention: RetentionConfig = RetentionConfig()
    agents: dict[str, AgentOverride] = Field(default_factory=dict)

    @field_validator("agents")
    @classmethod
    def _globs_that_can_match(cls, agents: dict[str, AgentOverride]) -> dict[str, AgentOverride]:
        # A table no agent can match was silently never applied.
        for pattern in agents:
            if not pattern.strip():
                raise ValueError(f'[agents."{pattern}"]: an empty glob matches no agent')
            if "/" in pattern:
                raise ValueError(
                    f'[agents."{pattern}"]: a glob holding "/" matches no agent (it matches '
                    'the name of an agent\'s folder under agents/, which holds no "/")'
                )
        return agents


@dataclass(frozen=True, slots=True)
class AgentPolicy:
    """Everything memd decides about an agent, after overrides: a value, the same
    for every agent matched by the same ``[agents."glob"]`` tables with the same
    declared window (the daemon shares one object among them)."""

    context_length: int
    threshold: float
    max_tokens: int
    threshold_tokens: int
    compress: bool
    summary_instructions: str
    low_water_tokens: int
    #: Where context_length came from: "default", "[trigger]", "[agents.\"glob\"]",
    #: "model <name>" or "memd-agent.json" (shown by ``memd status``).
    window_source: str = "default"
    #: Tokens the agent sends beside its memory in every request (its descriptor).
    reserved_tokens: int = 0
    #: How long its archives are kept (``[retention]``, then ``[agents."glob"]``).
    retention: RetentionLimits = NO_LIMITS
    #: Summary budgets (``[summarizer]``, then ``[agents."glob"]``): 0 (and -1 for
    #: the recent turns) = a share of the threshold.
    summary_tokens: int = 0
    pinned_tokens: int = 0
    keep_recent_tokens: int = -1

    def budgets(self) -> SummaryBudgets:
        """Summary, pinned and recent-turn budgets under this agent's low-water
        mark; raises :class:`BudgetError` when explicit ones cannot fit."""
        return summary_budgets(
            self.threshold_tokens,
            self.low_water_tokens,
            summary_tokens=self.summary_tokens,
            pinned_tokens=self.pinned_tokens,
            recent_tokens=self.keep_recent_tokens,
        )


ContextLengthLookup = Callable[[str], int | None]


def resolve_policy(
    config: MemdConfig,
    agent: str,
    context_length_of: ContextLengthLookup | None = None,
    window: AgentWindow | None = None,
) -> AgentPolicy:
    """Apply ``[agents."glob"]`` tables in file order (later tables win).

    ``window`` is what the agent declared in its ``memd-agent.json``. Its context
    length replaces the fleet-wide ``[trigger] context_length``, but a matching
    ``[agents."glob"]`` table that sets ``context_length`` (or a ``model`` memd
    can derive it from) wins: set means written, even at the default value
    (tables keep unset keys as None). What it reserves per request always comes
    off the threshold.
    """
    trigger = config.trigger
    context_length = trigger.context_length
    source = "[trigger]" if "context_length" in trigger.model_fields_set else "default"
    threshold = trigger.threshold
    max_tokens = trigger.max_tokens
    instructions = config.summarizer.summary_instructions
    summary_tokens = config.summarizer.summary_tokens
    pinned_tokens = config.summarizer.pinned_tokens
    keep_recent_tokens = config.summarizer.keep_recent_tokens
    compress = True
    retention = config.retention.limits()
    for pattern, override in config.agents.items():
        if not fnmatch.fnmatchcase(agent, pattern):
            continue
        if override.model is not None and context_length_of is not None:
            derived = context_length_of(override.model)
            if derived:
                context_length = derived
                source = f"model {override.model}"
        if override.context_length is not None:
            context_length = override.context_length
            source = f'[agents."{pattern}"]'
        if override.threshold is not None:
            threshold = override.threshold
        if override.max_tokens is not None:
            max_tokens = override.max_tokens
        if override.summary_instructions is not None:
            instructions = override.summary_instructions
        if override.context_compression is not None:
            compress = override.context_compression
        if override.summary_tokens is not None:
            summary_tokens = override.summary_tokens
        if override.pinned_tokens is not None:
            pinned_tokens = override.pinned_tokens
        if override.keep_recent_tokens is not None:
            keep_recent_tokens = override.keep_recent_tokens
        retention = _retention_override(retention, override)
    reserved = 0
    if window is not None:
        if source in ("default", "[trigger]"):
            context_length, source = window.context_length, DESCRIPTOR_NAME
        reserved = min(window.reserved_tokens, int(context_length * RESERVED_MAX_SHARE))
    threshold_tokens = max(1, int(threshold * context_length) - reserved)
    if max_tokens > 0:
        threshold_tokens = min(threshold_tokens, max_tokens)
    return AgentPolicy(
        context_length=context_length,
        threshold=threshold,
        max_tokens=max_tokens,
        threshold_tokens=threshold_tokens,
        compress=compress,
        summary_instructions=instructions,
        low_water_tokens=max(1, int(threshold_tokens * trigger.low_water)),
        window_source=source,
        reserved_tokens=reserved,
        retention=retention,
        summary_tokens=summary_tokens,
        pinned_tokens=pinned_tokens,
        keep_recent_tokens=keep_recent_tokens,
    )


def matching_overrides(config: MemdConfig, agent: str) -> tuple[str, ...]:
    """The ``[agents."glob"]`` tables that apply to ``agent``, in file order: with
    the declared window, all :func:`resolve_policy` reads of the agent."""
    if not config.agents:
        return ()
    return tuple(pattern for pattern in config.agents if fnmatch.fnmatchcase(agent, pattern))


def _retention_override(limits: RetentionLimits, override: AgentOverride) -> RetentionLimits:
    # Set means written: `max_archives = 0` in an agent's table lifts the limit for it.
    return RetentionLimits(
        limits.max_archives if override.max_archives is None else override.max_archives,
        limits.max_age_days if override.max_age_days is None else override.max_age_days,
        limits.max_total_mb if override.max_total_mb is None else override.max_total_mb,
    )


def resolve_retention(config: MemdConfig, agent: str) -> RetentionLimits:
    """Only the agent's retention limits (``memd prune`` needs no window)."""
    limits = config.retention.limits()
    for pattern, override in config.agents.items():
        if fnmatch.fnmatchcase(agent, pattern):
            limits = _retention_override(limits, override)
    return limits
