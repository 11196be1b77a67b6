"""Retention (pure): which of an agent's archives a policy deletes.

Values in, values out: the archives (name, size, mtime), the limits, the time
now and the names that must stay (the archive a compaction just wrote). The
shell (:mod:`memd.retention`) lists the folder, calls :func:`plan_prune` and
unlinks what it returns, under the agent's compaction lock.

Rules, each limit 0 meaning "no limit":

* ``max_age_days``: an archive last modified longer ago than that goes;
* ``max_archives``: beyond that many, the oldest go;
* ``max_total_mb``: while the archives' bytes exceed that, the oldest go.

"Oldest" is by name (``history_<ts>[_N].md[.enc]`` sorts by the time it was
written, the ``_N`` collision suffix after the plain name), then mtime. A
protected archive is never deleted, but it counts toward the count and the
bytes: with ``max_archives = 1`` a compaction keeps only the archive it just
wrote. Anything in ``archive/`` that is not an archive name is not ours to
judge and is never listed here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

ARCHIVE_PREFIX = "history_"
PLAIN_SUFFIX = ".md"
ENCRYPTED_SUFFIX = ".md.enc"
_DAY_S = 86_400.0
MIB = 1024 * 1024

# history_YYYY-MM-DD_HH-MM-SS[_N].md[.enc]; any other history_*.md still
# counts (an older or hand-made name), sorted by its text.
_NAME_RE = re.compile(
    r"history_(?P<stamp>\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})(?:_(?P<n>\d+))?\.md(?:\.enc)?"
)

REASON_AGE = "max_age_days"
REASON_COUNT = "max_archives"
REASON_SIZE = "max_total_mb"


def is_archive_name(name: str) -> bool:
    """``history_*.md`` or ``history_*.md.enc`` (encrypted at rest)."""
    return name.startswith(ARCHIVE_PREFIX) and (
        name.endswith(PLAIN_SUFFIX) or name.endswith(ENCRYPTED_SUFFIX)
    )


def archive_order(name: str) -> tuple[str, int, str]:
    """Sort key: oldest first (the time in the name, then the ``_N`` suffix)."""
    match = _NAME_RE.fullmatch(name)
    if match is None:
        return (name.removeprefix(ARCHIVE_PREFIX), 0, name)
    return (match["stamp"], int(match["n"] or 0), name)


@dataclass(frozen=True, slots=True)
class RetentionLimits:
    max_archives: int = 0
    max_age_days: float = 0.0
    max_total_mb: float = 0.0

    @property
    def active(self) -> bool:
        return bool(self.max_archives or self.max_age_days or self.max_total_mb)

    @property
    def max_age_s(self) -> float:
        return self.max_age_days * _DAY_S

    @property
    def max_total_bytes(self) -> int:
        return int(self.max_total_mb * MIB)

    def describe(self) -> str:
        """For the summary block and ``memd prune``: ``kept 30 days, at most 10 archives``."""
        parts = []
        if self.max_age_days:
            parts.append(f"kept {_number(self.max_age_days)} days")
        if self.max_archives:
            parts.append(f"at most {self.max_archives} archives")
        if self.max_total_mb:
            parts.append(f"at most {_number(self.max_total_mb)} MB")
        return ", ".join(parts) if parts else "kept until deleted"


NO_LIMITS = RetentionLimits()


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True, slots=True)
class ArchiveInfo:
    name: str
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class PrunePlan:
    """Archives to delete (oldest first) and why; what stays."""

    delete: tuple[ArchiveInfo, ...]
    keep: tuple[ArchiveInfo, ...]
    reasons: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(info.size for info in self.delete)

    def all_reasons(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for reasons in self.reasons.values():
            for reason in reasons:
                seen[reason] = None
        return tuple(seen)


def plan_prune(
    archives: Iterable[ArchiveInfo],
    limits: RetentionLimits,
    now: float,
    protect: Iterable[str] = (),
) -> PrunePlan:
    """What ``limits`` delete among ``archives`` at time ``now``; ``protect`` stays."""
    ordered = sorted(
        (a for a in archives if is_archive_name(a.name)),
        key=lambda a: (*archive_order(a.name), a.mtime),
    )
    protected = frozenset(protect)
    reasons: dict[str, list[str]] = {}

    def drop(info: ArchiveInfo, reason: str) -> None:
        reasons.setdefault(info.name, []).append(reason)

    if limits.max_age_days:
        cutoff = now - limits.max_age_s
        for info in ordered:
            if info.name not in protected and info.mtime < cutoff:
                drop(info, REASON_AGE)
    if limits.max_archives:
        remaining = [a for a in ordered if a.name not in reasons]
        excess = len(remaining) - limits.max_archives
        for info in remaining:
            if excess <= 0:
                break
            if info.name not in protected:
                drop(info, REASON_COUNT)
                excess -= 1
    if limits.max_total_mb:
        remaining = [a for a in ordered if a.name not in reasons]
        total = sum(a.size for a in remaining)
        for info in remaining:
            if total <= limits.max_total_bytes:
                break
            if info.name not in protected:
                drop(info, REASON_SIZE)
                total -= info.size
    return PrunePlan(
        delete=tuple(a for a in ordered if a.name in reasons),
        keep=tuple(a for a in ordered if a.name not in reasons),
        reasons={name: tuple(why) for name, why in reasons.items()},
    )


__all__ = [
    "ENCRYPTED_SUFFIX",
    "NO_LIMITS",
    "REASON_AGE",
    "REASON_COUNT",
    "REASON_SIZE",
    "ArchiveInfo",
    "PrunePlan",
    "RetentionLimits",
    "archive_order",
    "is_archive_name",
    "plan_prune",
]
