"""Retention (pure): which of an agent's archives a policy deletes.

Values in, values out: the archives (name, size, mtime), the limits, the time
now and the names that must stay (the archive a compaction just wrote). The
shell (:mod:`memd.retention`) lists the folder, calls :func:`plan_prune` and
unlinks what it returns, under the agent's compaction lock.

Rules, each limit 0 meaning "no limit":

* ``max_age_days``: an archive last modified longer ago than that goes;
* ``max_archives``: beyond that many, the oldest go;
* ``max_total_mb``: while the archives' bytes exceed that, the oldest go.

"Oldest" is by the instant each archive was written (:func:`creation_order`).
Its name, ``history_<ts>[_N].md[.enc]``, carries the *local* wall-clock time of
the process that wrote it, with no UTC offset: after a DST fall-back (the same
local hour twice) or with the daemon and ``memd compact-now`` in different time
zones, name order is not write order. The archive's mtime is an instant (the
bytes are written the moment the name is read, and nothing rewrites an archive
but an erasure, which keeps its times), so it tells the offset the name was
written in, when that offset is believable: the pruning process's own zone at
that instant (``local_offset``, given by the shell), or one another archive
agrees on. A file copied back without its times (cp without -p, a restore, an
editor's save) has an mtime hours after its name, which reads as some other
offset; taken at its word, it would be the newest and a newer archive would go
in its place. A protected archive is never deleted, but it counts toward the
count and the bytes: with ``max_archives = 1`` a compaction keeps only the
archive it just wrote. Anything in ``archive/`` that is not an archive name is not ours to
judge and is never listed here.
"""

from __future__ import annotations

import bisect
import calendar
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
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

# Every UTC offset in use is a whole quarter hour between -12:00 and +14:00.
_OFFSET_STEP_S = 900
_MIN_OFFSET_S = -12 * 3600
_MAX_OFFSET_S = 14 * 3600
# How far an archive's mtime may sit from its name's second beyond the offset:
# the name is read just before (encrypted) or just after (plain) the bytes are
# written and fsynced. Under half a quarter hour, so no offset is ever ambiguous.
_ANCHOR_SLACK_S = 300

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


def _wall_clock(name: str) -> int | None:
    """The name's local date and time as seconds, read as if it were UTC."""
    match = _NAME_RE.fullmatch(name)
    if match is None:
        return None
    date, clock = match["stamp"].split("_")
    try:
        year, month, day = (int(part) for part in date.split("-"))
        hour, minute, second = (int(part) for part in clock.split("-"))
        return calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        return None


def _anchored_offset(wall: int, mtime: float) -> int | None:
    """The UTC offset the name was written in, when the mtime pins it down."""
    gap = wall - mtime
    offset = round(gap / _OFFSET_STEP_S) * _OFFSET_STEP_S
    if _MIN_OFFSET_S <= offset <= _MAX_OFFSET_S and abs(gap - offset) <= _ANCHOR_SLACK_S:
        return offset
    return None


LocalOffset = Callable[[float], int]
"""The pruning process's UTC offset in seconds at an instant (its zone, DST included)."""


def creation_order(
    archives: Iterable[ArchiveInfo], local_offset: LocalOffset | None = None
) -> list[ArchiveInfo]:
    """``archives`` oldest first, by the instant each was written.

    * a name whose mtime matches it up to a believable UTC offset (the usual
      case): the name's time at that offset, then the ``_N`` suffix, then the
      mtime. Believable: ``local_offset(mtime)``, the pruning process's zone
      then (a DST fall-back), or an offset at least one other archive's mtime
      also matches (``memd compact-now`` run in another zone, twice or more);
    * a name whose mtime does not (the file was copied or touched since), or
      matches at an offset nothing confirms (copied back a few hours after its
      name, its mtime reads as a zone it was never written in): the name read
      at the offset of the nearest anchored archive by name, or as UTC when
      there is none (plain name order, as memd always sorted);
    * anything else named ``history_*``: its mtime, the only instant it has.

    Without ``local_offset`` (zone unknown) only offsets two archives agree on
    anchor. An archive written in another zone, alone of its zone, is read at
    its neighbours' offset: its mtime cannot be told from a copy's.
    """
    listed = list(archives)
    walls = [_wall_clock(info.name) for info in listed]
    candidates = [
        None if wall is None else _anchored_offset(wall, info.mtime)
        for info, wall in zip(listed, walls, strict=True)
    ]
    agreeing = Counter(offset for offset in candidates if offset is not None)

    def believable(info: ArchiveInfo, offset: int | None) -> int | None:
        if offset is None:
            return None
        if agreeing[offset] >= 2:
            return offset
        if local_offset is not None and local_offset(info.mtime) == offset:
            return offset
        return None

    offsets = [believable(info, offset) for info, offset in zip(listed, candidates, strict=True)]
    anchors = sorted(
        (wall, offset)
        for wall, offset in zip(walls, offsets, strict=True)
        if wall is not None and offset is not None
    )

    def key(item: tuple[ArchiveInfo, int | None, int | None]) -> tuple[float, int, float, str]:
        info, wall, offset = item
        if wall is None:
            return (info.mtime, 0, info.mtime, info.name)
        if offset is None:
            offset = _nearest_offset(anchors, wall)
        return (float(wall - offset), _suffix(info.name), info.mtime, info.name)

    return [item[0] for item in sorted(zip(listed, walls, offsets, strict=True), key=key)]


def _nearest_offset(anchors: Sequence[tuple[int, int]], wall: int) -> int:
    if not anchors:
        return 0
    at = bisect.bisect_left(anchors, (wall, _MIN_OFFSET_S))
    nearby = anchors[max(at - 1, 0) : at + 1]
    return min(nearby, key=lambda anchor: abs(anchor[0] - wall))[1]


def _suffix(name: str) -> int:
    match = _NAME_RE.fullmatch(name)
    return int(match["n"] or 0) if match is not None else 0


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
    local_offset: LocalOffset | None = None,
) -> PrunePlan:
    """What ``limits`` delete among ``archives`` at time ``now``; ``protect`` stays.

    ``local_offset``: see :func:`creation_order` (the shell passes its zone's)."""
    ordered = creation_order((a for a in archives if is_archive_name(a.name)), local_offset)
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
    "LocalOffset",
    "PrunePlan",
    "RetentionLimits",
    "archive_order",
    "creation_order",
    "is_archive_name",
    "plan_prune",
]
