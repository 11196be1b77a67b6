"""Retention on real files: through the pinned folder, under the lock, never the new archive."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from support.memfiles import AgentWorkspace, append_entry

from memd.agentdir import AgentDir
from memd.compaction import CompactionOptions, ProvidedSummary, compact_agent, prune_agent
from memd.core.memfile import parse
from memd.core.retention import RetentionLimits
from memd.core.summary_block import archive_note, parse_summary
from memd.errors import LockTimeout
from memd.retention import PruneResult, list_archives, prune_locked
from memd.workspace import AgentPaths

DAY = 86_400.0
NOW = time.time()
SUMMARY = "The user prefers tea; memd ships on Friday; the config lives in /srv/memd/memd.toml."


def plant_archives(
    paths: AgentPaths, ages_days: list[float], enc: tuple[int, ...] = ()
) -> list[str]:
    """Archives named by day (oldest first), with mtimes ``ages_days`` ago."""
    paths.archive_dir.mkdir(exist_ok=True)
    names = []
    for index, age in enumerate(ages_days):
        name = f"history_2026-01-{index + 1:02d}_10-00-00.md" + (".enc" if index in enc else "")
        path = paths.archive_dir / name
        path.write_bytes(b"x" * (1000 * (index + 1)))
        os.utime(path, (NOW - age * DAY, NOW - age * DAY))
        names.append(name)
    return names


def remaining(paths: AgentPaths) -> list[str]:
    return sorted(p.name for p in paths.archive_dir.iterdir())


def test_prune_locked_deletes_by_policy_and_leaves_other_files(ws: AgentWorkspace) -> None:
    paths = ws.create_agent("alpha", entries=2)
    names = plant_archives(paths, [40, 20, 10, 1], enc=(1,))
    (paths.archive_dir / "README.txt").write_text("an operator's note")
    (paths.archive_dir / "history_elsewhere.md").symlink_to(paths.memory)
    with AgentDir.open(paths) as pinned:
        assert {a.name for a in list_archives(pinned)} == set(names)  # the symlink is not one
        result = prune_locked(pinned, RetentionLimits(max_age_days=30, max_archives=2), NOW)
    assert result.deleted == (names[0], names[1])  # by age, then the oldest beyond 2
    assert result.deleted_bytes == 3000 and result.kept == 2
    assert remaining(paths) == sorted([*names[2:], "README.txt", "history_elsewhere.md"])
    assert paths.memory.exists()


def test_dry_run_changes_nothing_and_creates_nothing(ws: AgentWorkspace) -> None:
    paths = ws.create_agent("alpha")
    names = plant_archives(paths, [40, 1])
    result = prune_agent(paths, RetentionLimits(max_age_days=30), dry_run=True, now=NOW)
    assert [a.name for a in result.plan.delete] == [names[0]] and result.deleted == ()
    assert remaining(paths) == names
    assert not paths.private_dir.exists()


def test_prune_takes_the_compaction_lock(ws: AgentWorkspace) -> None:
    paths = ws.create_agent("alpha")
    names = plant_archives(paths, [40, 1])
    paths.private_dir.mkdir()
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a compaction in flight
        with pytest.raises(LockTimeout):
            prune_agent(paths, RetentionLimits(max_age_days=30), lock_wait_s=0.2, now=NOW)
        assert remaining(paths) == names
    finally:
        os.close(fd)
    result = prune_agent(paths, RetentionLimits(max_age_days=30), lock_wait_s=1, now=NOW)
    assert result.deleted == (names[0],)
    assert remaining(paths) == [names[1]]


def test_compaction_prunes_after_its_commit_but_never_its_own_archive(
    ws: AgentWorkspace,
) -> None:
    paths = ws.create_agent("alpha", entries=6)
    old = plant_archives(paths, [3, 2, 1])
    options = CompactionOptions(
        lock_wait_s=5,
        drain_quiet_s=0.05,
        drain_max_s=2,
        require_shrink=False,
        retention=RetentionLimits(max_archives=1),
    )
    outcome = compact_agent(paths, ProvidedSummary(SUMMARY), options, manual=True)
    assert remaining(paths) == [outcome.archive.name]  # the new one sorts after the planted
    assert outcome.pruned is not None and sorted(outcome.pruned.deleted) == old
    # The re-seeded block tells the truth about the raw turns.
    block = parse(paths.memory.read_bytes()).entries[0]
    parsed = parse_summary(block.summary_text)
    assert parsed.archive_note == archive_note(RetentionLimits(max_archives=1))
    assert "at most 1 archives" in block.summary_text
    assert parsed.latest_archive == f"archive/{outcome.archive.name}"

    # A second compaction keeps only its own archive again; the note is not doubled.
    append_entry(paths.memory, "Human", "one more turn " * 30)
    second = compact_agent(paths, ProvidedSummary(SUMMARY), options, manual=True)
    assert remaining(paths) == [second.archive.name]
    text = parse(paths.memory.read_bytes()).entries[0].summary_text
    assert text.count("memd-archive:") == 1
    # Its provenance line names no earlier archive: retention deleted it.
    assert parse_summary(text).earlier_archives == 0
    assert parse_summary(text).latest_archive == f"archive/{second.archive.name}"

    # Without a count limit, the earlier archive is still named.
    append_entry(paths.memory, "Human", "and another turn " * 30)
    roomy = dataclasses.replace(options, retention=RetentionLimits(max_archives=5))
    compact_agent(paths, ProvidedSummary(SUMMARY), roomy, manual=True)
    text = parse(paths.memory.read_bytes()).entries[0].summary_text
    assert parse_summary(text).earlier_archives == 1 and len(remaining(paths)) == 2


def test_without_retention_the_block_says_kept_until_deleted(ws: AgentWorkspace) -> None:
    paths = ws.create_agent("alpha", entries=6)
    options = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, require_shrink=False)
    outcome = compact_agent(paths, ProvidedSummary(SUMMARY), options, manual=True)
    assert outcome.pruned is None
    text = parse(paths.memory.read_bytes()).entries[0].summary_text
    assert "raw turns are archived verbatim in archive/ (kept until deleted)" in text


def test_prune_error_does_not_undo_the_compaction(
    ws: AgentWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memd.compaction as compaction

    def broken(*_args: object, **_kwargs: object) -> PruneResult:
        raise PermissionError(13, "Permission denied", "archive")

    monkeypatch.setattr(compaction, "prune_locked", broken)
    paths = ws.create_agent("alpha", entries=6)
    plant_archives(paths, [3])
    options = CompactionOptions(
        lock_wait_s=5, drain_quiet_s=0.05, require_shrink=False, retention=RetentionLimits(1)
    )
    outcome = compact_agent(paths, ProvidedSummary(SUMMARY), options, manual=True)
    assert outcome.prune_error is not None and "Permission denied" in outcome.prune_error
    assert outcome.archive.exists() and len(remaining(paths)) == 2


def test_an_archive_folder_symlinked_out_of_the_agent_is_refused(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    paths = ws.create_agent("alpha")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "history_2026-01-01_10-00-00.md").write_text("not the agent's")
    paths.archive_dir.symlink_to(outside)
    with pytest.raises(Exception, match="outside the agent's own folder"):
        prune_agent(paths, RetentionLimits(max_archives=0, max_age_days=0.0001), now=NOW + DAY)
    assert (outside / "history_2026-01-01_10-00-00.md").exists()


@pytest.fixture
def local_zone() -> Iterator[None]:
    """Lets a test change the process's local time zone (TZ + tzset); restored after."""
    saved = os.environ.get("TZ")
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = saved
        time.tzset()


def set_local_zone(zone: str) -> None:
    os.environ["TZ"] = zone
    time.tzset()


def test_a_dst_fall_back_on_disk_prunes_the_oldest_written(
    ws: AgentWorkspace, local_zone: None
) -> None:
    """Archives as a New York daemon leaves them across 2026-11-01's repeated 01:00-02:00:
    the oldest by write time goes, not the one whose name sorts first. The prune
    believes each mtime because it is New York's offset at that instant."""
    set_local_zone("America/New_York")
    paths = ws.create_agent("alpha")
    paths.archive_dir.mkdir()
    zone = ZoneInfo("America/New_York")
    names = []
    for hour, minute in ((5, 50), (6, 10), (6, 40)):  # 01:50 EDT, 01:10 EST, 01:40 EST
        at = datetime(2026, 11, 1, hour, minute, tzinfo=UTC)
        name = at.astimezone(zone).strftime("history_%Y-%m-%d_%H-%M-%S.md")
        (paths.archive_dir / name).write_bytes(b"raw turns\n")
        os.utime(paths.archive_dir / name, (at.timestamp(), at.timestamp()))
        names.append(name)
    with AgentDir.open(paths) as pinned:
        result = prune_locked(pinned, RetentionLimits(max_archives=2), NOW, protect=[names[2]])
    assert result.deleted == (names[0],)
    assert remaining(paths) == sorted(names[1:])


def test_compactions_in_different_time_zones_prune_by_write_time(
    ws: AgentWorkspace, local_zone: None
) -> None:
    """The daemon (TZ=UTC in its unit) and an operator's compact-now (Los Angeles,
    twice: archives that agree on an offset confirm it) name archives in their own
    local time; retention keeps the three written last."""
    paths = ws.create_agent("alpha", entries=6)
    options = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, require_shrink=False)
    written = []
    for zone in ("UTC", "America/Los_Angeles", "America/Los_Angeles"):
        set_local_zone(zone)
        written.append(compact_agent(paths, ProvidedSummary(SUMMARY), options, manual=True))
        append_entry(paths.memory, "Human", "one more turn " * 30)
    # The Los Angeles name reads hours earlier than the UTC one written before it.
    assert written[1].archive.name < written[0].archive.name
    set_local_zone("UTC")
    pruning = dataclasses.replace(options, retention=RetentionLimits(max_archives=3))
    last = compact_agent(paths, ProvidedSummary(SUMMARY), pruning, manual=True)
    assert last.pruned is not None and last.pruned.deleted == (written[0].archive.name,)
    assert remaining(paths) == sorted(
        [written[1].archive.name, written[2].archive.name, last.archive.name]
    )


def test_an_archive_copied_back_later_is_pruned_by_its_name(
    ws: AgentWorkspace, local_zone: None
) -> None:
    """review16b F4: an archive copied back hours after it was written (cp without
    -p) has a fresh mtime that reads as another UTC offset; the prune, in the
    zone it was written in, does not believe it and deletes it as the oldest."""
    set_local_zone("UTC")
    paths = ws.create_agent("alpha")
    paths.archive_dir.mkdir()
    names = []
    # Named 10:00, 11:00, 12:00, 13:10; the 10:00 one copied back at 13:02.
    for clock, mtime_clock in (
        ("10-00", "13-02"),
        ("11-00", "11-00"),
        ("12-00", "12-00"),
        ("13-10", "13-10"),
    ):
        name = f"history_2026-12-02_{clock}-00.md"
        hour, minute = (int(part) for part in mtime_clock.split("-"))
        mtime = datetime(2026, 12, 2, hour, minute, tzinfo=UTC).timestamp()
        (paths.archive_dir / name).write_bytes(b"raw turns\n")
        os.utime(paths.archive_dir / name, (mtime, mtime))
        names.append(name)
    with AgentDir.open(paths) as pinned:
        result = prune_locked(pinned, RetentionLimits(max_archives=3), NOW, protect=[names[3]])
    assert result.deleted == (names[0],)
