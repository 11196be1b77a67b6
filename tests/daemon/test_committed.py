"""The stages after a committed compaction, handed its outcome by the runner: the
new archive indexed, the figures surveyed, what retention pruned reported and
dropped; a failing stage never keeps the next from running nor fails the commit."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import structlog
from support.memfiles import AgentWorkspace

from memd.audit import AuditLog, read_audit
from memd.core.config import MemdConfig
from memd.core.retention import ArchiveInfo, PrunePlan, RetentionLimits
from memd.daemon.archives import ArchiveSurvey
from memd.daemon.committed import AfterCommit, Replacements
from memd.daemon.entries import AgentEntry
from memd.daemon.recall import RecallStage
from memd.daemon.registry import AgentRegistry
from memd.daemon.retention import RetentionService
from memd.retention import PruneResult
from memd.workspace import AgentPaths


class BrokenRecall(RecallStage):
    """A recall index failing in a way it does not report itself (a bug)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.asked: list[str] = []

    def index_archive(self, paths: AgentPaths, archive: Path) -> None:
        self.asked.append(f"index {archive.name}")
        raise RuntimeError("disk on fire")

    def drop_pruned(self, paths: AgentPaths, result: PruneResult) -> None:
        self.asked.append(f"drop {','.join(result.deleted)}")
        raise RuntimeError("disk on fire")


class Outcome:
    """What the transaction returns, as far as the stages after it read it."""

    def __init__(self, archive: Path, pruned: PruneResult | None) -> None:
        self.archive = archive
        self.pruned = pruned


def stages(
    tmp_path: Path, replacements: Replacements | None = None
) -> tuple[AfterCommit, BrokenRecall, AgentEntry, Path]:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    config = MemdConfig()
    registry = AgentRegistry(
        ws.root, config, recover=lambda _paths, _key: None, context_length_of=None
    )
    registry.start(contextlib.ExitStack())
    entries = [e for name in sorted(registry.scan()) if (e := registry.make_entry(name))]
    registry.register(entries, set())
    recall = BrokenRecall(None, ws.root, config, registry)
    archives = ArchiveSurvey(registry)
    audit_file = tmp_path / "w.audit.jsonl"
    retention = RetentionService(registry, archives, recall, AuditLog(audit_file, "daemon"), config)
    return AfterCommit(recall, archives, retention, replacements), recall, entries[0], audit_file


def pruned_one(agent: str) -> PruneResult:
    gone = ArchiveInfo("history_old.md", 9, 0.0)
    plan = PrunePlan(delete=(gone,), keep=(), reasons={gone.name: ("max_archives",)})
    return PruneResult(agent, RetentionLimits(1), plan, deleted=(gone.name,), deleted_bytes=9)


def test_a_failing_recall_index_keeps_neither_the_survey_nor_the_prune_report_from_running(
    tmp_path: Path,
) -> None:
    after, recall, entry, audit_file = stages(tmp_path)
    entry.paths.archive_dir.mkdir()
    archive = entry.paths.archive_dir / "history_new.md"
    archive.write_text("turns\n")
    with structlog.testing.capture_logs() as logs:
        after.committed(entry.paths, Outcome(archive, pruned_one("alice")))  # type: ignore[arg-type]
    assert recall.asked == ["index history_new.md", "drop history_old.md"]
    assert entry.archives is not None and entry.archives.count == 1  # surveyed all the same
    [line] = [line for line in logs if line["event"] == "archives pruned"]
    assert line["trigger"] == "compaction" and line["archives"] == ["history_old.md"]
    # The compaction's own audit record names its prune: none written here.
    assert not audit_file.exists() or read_audit(audit_file).records == []


def test_without_a_prune_only_the_archive_is_handed_on(tmp_path: Path) -> None:
    after, recall, entry, _audit = stages(tmp_path)
    archive = entry.paths.archive_dir / "history_new.md"
    nothing = PruneResult("alice", RetentionLimits(1), PrunePlan((), (), {}), (), 0)
    for pruned in (None, nothing):
        with structlog.testing.capture_logs() as logs:
            after.committed(entry.paths, Outcome(archive, pruned))  # type: ignore[arg-type]
        assert [line["event"] for line in logs] == []
    assert recall.asked == ["index history_new.md"] * 2


def test_a_commit_hands_the_replacement_to_the_watch_stage_first(tmp_path: Path) -> None:
    # memd's own rename over MEMORY.md goes to the watch stage as an event, before
    # the stages that may take long or fail (the recall index here fails).
    replacements = Replacements()
    after, recall, entry, _audit = stages(tmp_path, replacements)
    entry.paths.archive_dir.mkdir()
    after.committed(entry.paths, Outcome(entry.paths.archive_dir / "history_new.md", None))  # type: ignore[arg-type]
    assert recall.asked == ["index history_new.md"]
    stop = threading.Event()
    assert replacements.take(stop) == ["alice"]
    after.replaced(entry.paths)  # a job that failed, maybe past its commit point
    after.replaced(entry.paths)
    assert replacements.take(stop) == ["alice"]  # once, whatever the number of puts
    stop.set()
    assert replacements.take(stop) == []
