"""Retention decisions (pure): which archives go, never the protected one, oldest first."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given
from hypothesis import strategies as st

from memd.core.retention import (
    REASON_AGE,
    REASON_COUNT,
    REASON_SIZE,
    ArchiveInfo,
    RetentionLimits,
    archive_order,
    creation_order,
    is_archive_name,
    plan_prune,
)

DAY = 86_400.0
NOW = 1_800_000_000.0


def archive(
    day: int, size: int = 100, n: int = 0, enc: bool = False, age_days: float = 0
) -> ArchiveInfo:
    suffix = f"_{n}" if n else ""
    name = f"history_2026-01-{day:02d}_10-00-00{suffix}.md" + (".enc" if enc else "")
    return ArchiveInfo(name, size, NOW - age_days * DAY)


def test_names() -> None:
    assert is_archive_name("history_2026-01-01_10-00-00.md")
    assert is_archive_name("history_2026-01-01_10-00-00_2.md.enc")
    assert is_archive_name("history_old-style.md")
    for other in ("notes.md", "history_x.md.tmp", "history_x.txt", "archive.tmp", "x.md.enc"):
        assert not is_archive_name(other)
    ordered = sorted(
        [
            "history_2026-01-01_10-00-00_10.md",
            "history_2026-01-01_10-00-00_2.md.enc",
            "history_2026-01-01_10-00-00.md",
            "history_2025-12-31_23-59-59.md",
        ],
        key=archive_order,
    )
    assert ordered == [
        "history_2025-12-31_23-59-59.md",
        "history_2026-01-01_10-00-00.md",
        "history_2026-01-01_10-00-00_2.md.enc",
        "history_2026-01-01_10-00-00_10.md",
    ]


NEW_YORK = ZoneInfo("America/New_York")
LOS_ANGELES = ZoneInfo("America/Los_Angeles")


def written(at_utc: datetime, zone: ZoneInfo, n: int = 0, write_s: float = 0.4) -> ArchiveInfo:
    """An archive as memd writes it at ``at_utc`` in ``zone``: named by the local
    wall clock (no offset), its mtime the instant its bytes landed."""
    local = at_utc.astimezone(zone)
    suffix = f"_{n}" if n else ""
    name = "history_" + local.strftime("%Y-%m-%d_%H-%M-%S") + suffix + ".md"
    return ArchiveInfo(name, 100, at_utc.timestamp() - write_s)


def zone_offset(zone: ZoneInfo) -> Callable[[float], int]:
    """The pruning process's UTC offset in ``zone``, as the shell's local_utc_offset."""

    def offset(instant: float) -> int:
        utcoffset = datetime.fromtimestamp(instant, zone).utcoffset()
        assert utcoffset is not None
        return int(utcoffset.total_seconds())

    return offset


def test_a_dst_fall_back_hour_is_ordered_by_when_archives_were_written() -> None:
    # America/New_York, 2026-11-01: 01:00-02:00 happens twice (EDT, then EST).
    first = written(datetime(2026, 11, 1, 5, 50, tzinfo=UTC), NEW_YORK)  # 01:50 EDT
    second = written(datetime(2026, 11, 1, 6, 10, tzinfo=UTC), NEW_YORK)  # 01:10 EST
    newest = written(datetime(2026, 11, 1, 6, 40, tzinfo=UTC), NEW_YORK)  # 01:40 EST
    assert first.name.endswith("01-50-00.md") and second.name.endswith("01-10-00.md")
    in_new_york = zone_offset(NEW_YORK)
    assert creation_order([newest, second, first], in_new_york) == [first, second, newest]
    # The archive just written is protected; the one to go is the oldest, 01:50 EDT,
    # not the 01:10 EST one that sorts first by name.
    plan = plan_prune(
        [first, second, newest],
        RetentionLimits(max_archives=2),
        NOW,
        protect=[newest.name],
        local_offset=in_new_york,
    )
    assert [a.name for a in plan.delete] == [first.name]
    assert [a.name for a in plan.keep] == [second.name, newest.name]


def test_the_same_local_second_twice_in_a_fall_back() -> None:
    edt = written(datetime(2026, 11, 1, 5, 30, tzinfo=UTC), NEW_YORK)
    est = written(datetime(2026, 11, 1, 6, 30, tzinfo=UTC), NEW_YORK, n=1)
    between = written(datetime(2026, 11, 1, 6, 0, tzinfo=UTC), NEW_YORK)  # 01:00 EST
    assert creation_order([est, between, edt], zone_offset(NEW_YORK)) == [edt, between, est]


def test_daemon_and_compact_now_in_different_time_zones() -> None:
    # The daemon runs with TZ=UTC (its unit), an operator's compact-now in Los
    # Angeles, twice: two archives agreeing on an offset confirm it.
    start = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
    daemon_early = written(start, ZoneInfo("UTC"))  # history_…_10-00-00
    operator = written(start + timedelta(minutes=30), LOS_ANGELES)  # history_…_02-30-00
    again = written(start + timedelta(minutes=40), LOS_ANGELES)  # history_…_02-40-00
    daemon_late = written(start + timedelta(hours=1), ZoneInfo("UTC"))  # history_…_11-00-00
    archives = [daemon_late, again, operator, daemon_early]
    in_utc = zone_offset(ZoneInfo("UTC"))
    assert creation_order(archives, in_utc) == [daemon_early, operator, again, daemon_late]
    plan = plan_prune(
        archives,
        RetentionLimits(max_archives=3),
        NOW,
        protect=[daemon_late.name],
        local_offset=in_utc,
    )
    assert [a.name for a in plan.delete] == [daemon_early.name]
    # The size limit drops the same one first.
    limit = RetentionLimits(max_total_mb=350 / 1024 / 1024)
    plan = plan_prune(archives, limit, NOW, local_offset=in_utc)
    assert [a.name for a in plan.delete] == [daemon_early.name]
    # The pruning process in Los Angeles believes the operator's archives alone
    # and the daemon's two because they agree: the same order.
    assert creation_order(archives, zone_offset(LOS_ANGELES)) == creation_order(archives, in_utc)


def test_a_copied_back_archive_is_not_taken_for_the_newest() -> None:
    # review16b F4: one time zone (UTC) all along; the 10:00 archive was copied
    # back from a backup at 13:02 (cp without -p), the others keep their times.
    # Its mtime read against its name looks like an archive written at UTC-3.
    def at(stamp: str) -> float:
        return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()

    a = ArchiveInfo("history_2026-12-02_10-00-00.md", 100, at("2026-12-02 13:02:10"))
    b = ArchiveInfo("history_2026-12-02_11-00-00.md", 100, at("2026-12-02 11:00:00"))
    c = ArchiveInfo("history_2026-12-02_12-00-00.md", 100, at("2026-12-02 12:00:00"))
    d = ArchiveInfo("history_2026-12-02_13-10-00.md", 100, at("2026-12-02 13:10:00"))
    for local_offset in (None, zone_offset(ZoneInfo("UTC"))):
        plan = plan_prune(
            [a, b, c, d],
            RetentionLimits(max_archives=3),
            now=at("2026-12-02 13:10:01"),
            protect=[d.name],
            local_offset=local_offset,
        )
        # Before 0f2ae88 the 10:00 archive went; with it, the 11:00 one did.
        assert [x.name for x in plan.delete] == [a.name]


def test_archives_whose_mtime_no_longer_matches_their_name() -> None:
    # Copied back from a backup without their times: every mtime is the restore's.
    restored = [ArchiveInfo(f"history_2026-01-0{day}_10-00-00.md", 100, NOW) for day in (3, 1, 2)]
    assert [a.name[8:18] for a in creation_order(restored)] == [
        "2026-01-01",
        "2026-01-02",
        "2026-01-03",
    ]
    # One copied archive among archives written in Los Angeles is read in the
    # offset of its neighbour: it sits where it was written, not by its name as UTC.
    start = datetime(2026, 3, 2, 18, 0, tzinfo=UTC)
    before = written(start, LOS_ANGELES)  # 10:00 PST
    copied = dataclasses.replace(written(start + timedelta(hours=1), LOS_ANGELES), mtime=NOW)
    after = written(start + timedelta(hours=2), LOS_ANGELES)  # 12:00 PST
    daemon = written(start + timedelta(minutes=90), ZoneInfo("UTC"))  # 19:30 UTC
    in_utc = zone_offset(ZoneInfo("UTC"))  # the daemon's zone
    assert creation_order([daemon, after, copied, before], in_utc) == [
        before,
        copied,
        daemon,
        after,
    ]
    # A hand-made name has no time in it: its mtime is the only instant.
    odd = ArchiveInfo("history_notes.md", 100, start.timestamp() + 1)
    assert creation_order([after, odd, before]) == [before, odd, after]


def test_no_limits_delete_nothing() -> None:
    archives = [archive(d, age_days=400) for d in range(1, 10)]
    plan = plan_prune(archives, RetentionLimits(), NOW)
    assert plan.delete == () and len(plan.keep) == 9


def test_max_archives_keeps_the_newest_and_the_protected() -> None:
    archives = [archive(d) for d in range(1, 6)]
    plan = plan_prune(archives, RetentionLimits(max_archives=2), NOW)
    assert [a.name[8:18] for a in plan.delete] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert all(plan.reasons[a.name] == (REASON_COUNT,) for a in plan.delete)
    # With max_archives = 1 a compaction keeps only the archive it just wrote,
    # even if (clock skew) its name sorts before older ones.
    plan = plan_prune(archives, RetentionLimits(max_archives=1), NOW, protect=[archives[0].name])
    assert [a.name for a in plan.keep] == [archives[0].name]


def test_encrypted_archives_count() -> None:
    archives = [archive(1), archive(2, enc=True), archive(3)]
    plan = plan_prune(archives, RetentionLimits(max_archives=1), NOW)
    assert [a.name for a in plan.delete] == [archives[0].name, archives[1].name]


def test_age_and_size_and_reasons() -> None:
    archives = [archive(1, age_days=40), archive(2, age_days=20, size=700), archive(3, size=400)]
    plan = plan_prune(archives, RetentionLimits(max_age_days=30, max_total_mb=0.001), NOW)
    assert plan.reasons == {
        archives[0].name: (REASON_AGE,),
        archives[1].name: (REASON_SIZE,),
    }
    assert plan.bytes == 800
    assert plan.all_reasons() == (REASON_AGE, REASON_SIZE)


def test_non_archives_are_never_listed() -> None:
    plan = plan_prune(
        [ArchiveInfo("notes.md", 10, 0.0), archive(1, age_days=99)],
        RetentionLimits(max_age_days=1),
        NOW,
    )
    assert [a.name for a in plan.delete] == [archive(1).name] and plan.keep == ()


def test_describe() -> None:
    assert RetentionLimits().describe() == "kept until deleted"
    assert (
        RetentionLimits(max_archives=10, max_age_days=30, max_total_mb=0.5).describe()
        == "kept 30 days, at most 10 archives, at most 0.5 MB"
    )


_archive_sets = st.lists(
    st.builds(
        archive,
        day=st.integers(1, 28),
        size=st.integers(0, 5000),
        n=st.integers(0, 3),
        enc=st.booleans(),
        age_days=st.floats(0, 100),
    ),
    max_size=25,
    unique_by=lambda a: a.name,
)
_limits = st.builds(
    RetentionLimits,
    max_archives=st.integers(0, 10),
    max_age_days=st.sampled_from([0, 0.5, 1, 7, 30, 90]),
    max_total_mb=st.sampled_from([0, 0.001, 0.005, 0.01, 1]),
)


@given(archives=_archive_sets, limits=_limits, data=st.data())
def test_properties(
    archives: list[ArchiveInfo], limits: RetentionLimits, data: st.DataObject
) -> None:
    names = [a.name for a in archives]
    protect = set(data.draw(st.lists(st.sampled_from(names), max_size=2))) if names else set()
    plan = plan_prune(archives, limits, NOW, protect)
    deleted = {a.name for a in plan.delete}
    kept = [a for a in plan.keep]
    # A partition of the input; never the protected ones.
    assert deleted | {a.name for a in kept} == set(names)
    assert not deleted & {a.name for a in kept}
    assert not deleted & protect
    # Every limit holds afterwards, unless only protected archives are left to break it.
    free = [a for a in kept if a.name not in protect]
    if limits.max_archives and len(kept) > limits.max_archives:
        assert not free
    if limits.max_total_mb and sum(a.size for a in kept) > limits.max_total_bytes:
        assert not free
    if limits.max_age_days:
        assert all(a.mtime >= NOW - limits.max_age_s for a in free)
    # Oldest first: an archive deleted for count or size was written before every
    # free kept one.
    written = {a.name: index for index, a in enumerate(creation_order(archives))}
    for gone in plan.delete:
        if REASON_AGE in plan.reasons[gone.name]:
            continue
        assert all(written[gone.name] < written[k.name] for k in free)
    # Nothing deleted without a limit; applying the plan again deletes nothing more.
    if not limits.active:
        assert not deleted
    assert plan_prune(kept, limits, NOW, protect).delete == ()
