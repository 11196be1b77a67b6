"""Each agent's archive figures: restored from the state DB, refreshed when a
compaction commits, surveyed for what other processes did (a listing only where
the folder's mtime moved)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest
from support.memfiles import AgentWorkspace

from memd.core.config import MemdConfig
from memd.daemon.archives import ArchiveSurvey
from memd.daemon.entries import AgentEntry
from memd.daemon.registry import AgentRegistry
from memd.workspace import NO_ARCHIVES, ArchiveStats


def registered(tmp_path: Path) -> tuple[AgentRegistry, AgentEntry]:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=2)
    registry = AgentRegistry(
        ws.root, MemdConfig(), recover=lambda _p, _key: None, context_length_of=None
    )
    registry.start(contextlib.ExitStack())
    entry = registry.make_entry("alice")
    assert entry is not None
    registry.register([entry], set())
    entry.dirty = False
    return registry, entry


def archive(entry: AgentEntry, stamp: str, size: int = 10) -> Path:
    entry.paths.archive_dir.mkdir(exist_ok=True)
    path = entry.paths.archive_dir / f"history_{stamp}.md"
    path.write_bytes(b"x" * size)
    return path


def test_a_committed_archive_is_counted_at_once_even_with_an_unchanged_mtime(
    tmp_path: Path,
) -> None:
    registry, entry = registered(tmp_path)
    survey = ArchiveSurvey(registry)
    first = archive(entry, "20261202T000000")
    survey.survey()
    assert entry.archives is not None and entry.archives.count == 1 and entry.dirty
    entry.dirty = False
    mtime = entry.paths.archive_dir.stat().st_mtime_ns
    archive(entry, "20261202T000001", size=30)
    os.utime(entry.paths.archive_dir, ns=(mtime, mtime))  # a coarse clock: same mtime
    survey.survey()
    assert entry.archives.count == 1 and not entry.dirty  # the survey trusts the mtime
    survey.archived(entry.paths)  # a commit lists the folder again
    assert entry.archives.count == 2 and entry.archives.total_bytes == 40 and entry.dirty
    assert first.exists()


def test_restored_figures_are_kept_until_the_next_survey(tmp_path: Path) -> None:
    registry, entry = registered(tmp_path)

    class Record:
        archive_stats = ArchiveStats(5, 500, 1, 0)

    ArchiveSurvey.restore(entry, Record())  # type: ignore[arg-type]
    assert entry.archives == ArchiveStats(5, 500, 1, 0)
    ArchiveSurvey(registry).survey()  # no archive/ folder: none
    assert entry.archives is not None and entry.archives.count == 0 and entry.dirty


def test_the_survey_refreshes_only_the_folders_whose_mtime_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, entry = registered(tmp_path)
    survey = ArchiveSurvey(registry)
    survey.survey()  # never surveyed: refreshed, no archive/ yet
    assert entry.archives == NO_ARCHIVES
    refreshed: list[str] = []
    real_refresh = survey.refresh

    def refresh(entry: AgentEntry, *, relist: bool = False) -> None:
        refreshed.append(entry.name)
        real_refresh(entry, relist=relist)

    monkeypatch.setattr(survey, "refresh", refresh)
    survey.survey()
    assert refreshed == []  # still no archive/: probed, nothing listed
    archive(entry, "20261202T000000", size=7)
    survey.survey()
    assert refreshed == ["alice"] and entry.archives.count == 1
    survey.survey()
    assert refreshed == ["alice"]  # unchanged mtime: no listing, no lock
    shutil.rmtree(entry.paths.archive_dir)
    survey.survey()
    assert refreshed == ["alice", "alice"] and entry.archives == NO_ARCHIVES


def test_the_survey_without_an_agents_folder_refreshes_each_agent(tmp_path: Path) -> None:
    registry, entry = registered(tmp_path)
    archive(entry, "20261202T000000")
    (tmp_path / "ws" / "agents").rename(tmp_path / "ws" / "elsewhere")
    ArchiveSurvey(registry).survey()
    assert entry.archives == NO_ARCHIVES
