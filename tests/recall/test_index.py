from __future__ import annotations

import math
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.daemon_proc import DaemonProcess
from support.memfiles import AgentWorkspace, append_entry

from memd.compaction import CompactionOptions, ProvidedSummary, compact_agent
from memd.core.memfile import parse
from memd.core.recall import parse_since
from memd.recall.index import (
    LIVE_SOURCE,
    SCHEMA_VERSION,
    RecallIndex,
    RecallIndexError,
    recall_db_path,
)
from memd.recall.service import RecallService
from memd.workspace import AgentPaths

CHILD = Path(__file__).parent.parent / "support" / "recall_child.py"
FAST = CompactionOptions(drain_quiet_s=0.05, drain_max_s=1.0)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


def compact(paths: AgentPaths, state_dir: Path, summary: str = "Summary.") -> Path:
    service = RecallService.open(state_dir, paths.workspace)
    assert service is not None
    try:
        archive = compact_agent(paths, ProvidedSummary(summary), FAST, manual=True).archive
        service.index_archive(paths, archive)  # handed on, as the daemon does
        return archive
    finally:
        service.index.close()


def search(state_dir: Path, ws: AgentWorkspace, agent: str, question: str, **kw: object) -> list:
    with RecallIndex.open(state_dir, ws.root) as index:
        return index.search(agent, question, **kw)  # type: ignore[arg-type]


def test_compaction_indexes_its_archive_raw_entries_only(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    paths = ws.create_agent("alpha", entries=4)
    append_entry(paths.memory, "Human", "The kalomiren report is in the blue cabinet.")
    first = compact(paths, state_dir, summary="Talked about the zebrafish plan.")
    append_entry(paths.memory, "AI", "Second round: the ostrakon file moved.")
    second = compact(paths, state_dir, summary="Another summary about zebrafish.")
    hits = search(state_dir, ws, "alpha", "where is the kalomiren report?")
    assert hits[0].source == first.name and "kalomiren" in hits[0].text
    start, end = hits[0].matches[0]
    assert hits[0].text[start:end].lower() == "kalomiren"
    # The offset points at the entry in the archive, byte for byte.
    data = first.read_bytes()
    entry = parse(data[hits[0].offset : hits[0].offset + hits[0].length]).entries[0]
    assert entry.text == hits[0].text and entry.role == hits[0].role == "Human"
    assert search(state_dir, ws, "alpha", "ostrakon")[0].source == second.name
    # Summary blocks (in the second archive and the live file) are not raw entries.
    assert search(state_dir, ws, "alpha", "zebrafish") == []


def test_rare_shared_word_ranks_first_and_ties_go_to_the_newest(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    paths = ws.create_agent("alpha")
    for index in range(30):
        append_entry(paths.memory, "Human", f"The weekly report number {index} is filed.")
    append_entry(paths.memory, "AI", "Filed under quorlax: the budget spreadsheet.")
    append_entry(paths.memory, "Human", "same words here")
    append_entry(paths.memory, "Human", "same words here")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(paths)
        # One rare word shared, several common ones not: the rare one wins.
        hits = index.search("alpha", "Which report mentions the quorlax?", limit=3)
        assert "quorlax" in hits[0].text
        tied = index.search("alpha", "same words", limit=2)
        assert [h.text for h in tied] == ["same words here"] * 2
        assert tied[0].offset > tied[1].offset  # the later (newer) entry first


def test_common_words_are_left_out_until_the_rare_ones_run_dry(
    ws: AgentWorkspace, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memd.recall.index as index_module

    monkeypatch.setattr(index_module, "COMMON_TERM_FLOOR", 5)
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "quorlax is filed")
    for index in range(20):
        append_entry(paths.memory, "Human", f"report report {index}")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(paths)
        hits = index.search("alpha", "report quorlax", limit=3)
        # Only the entry sharing the rare word: the common one is left out.
        assert [h.text for h in hits] == ["quorlax is filed"]
        start, end = hits[0].matches[0]
        assert hits[0].text[start:end] == "quorlax"
        # A question of common words only still finds them.
        assert len(index.search("alpha", "report", limit=3)) == 3
        # When the rare word matches nothing, the common words are searched.
        assert len(index.search("alpha", "report zzyzx", limit=3)) == 3


def test_punctuation_and_fts_syntax_are_plain_text(ws: AgentWorkspace, state_dir: Path) -> None:
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", 'He said "NEAR" AND -quux: what? col:value')
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(paths)
        for question in ("what?", '"NEAR', "AND -quux:", "col:value *", "NEAR(a b)", "^value"):
            assert index.search("alpha", question), question


def test_live_memory_is_searchable_and_follows_appends(ws: AgentWorkspace, state_dir: Path) -> None:
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "first live fact: the drawbridge code")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(paths)
        (hit,) = index.search("alpha", "drawbridge")
        assert hit.source == LIVE_SOURCE
        append_entry(paths.memory, "AI", "second live fact: the portcullis key")
        assert index.search("alpha", "portcullis") == []  # not refreshed yet
        index.sync_agent(paths)
        assert index.search("alpha", "portcullis")[0].source == LIVE_SOURCE


def test_filters_role_since_and_agents_are_separate(ws: AgentWorkspace, state_dir: Path) -> None:
    alpha = ws.create_agent("alpha")
    beta = ws.create_agent("beta")
    alpha.memory.write_text(
        alpha.memory.read_text()
        + "### Human — 2026-01-01T10:00:00\n\nold marmalade note\n\n---\n\n"
        + "### AI — 2026-06-01T10:00:00\n\nnew marmalade note\n\n---\n\n"
    )
    append_entry(beta.memory, "Human", "beta's marmalade secret")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(alpha)
        index.sync_agent(beta)
        assert {h.text for h in index.search("alpha", "marmalade")} == {
            "old marmalade note",
            "new marmalade note",
        }
        assert [h.text for h in index.search("alpha", "marmalade", role="human")] == [
            "old marmalade note"
        ]
        recent = index.search(
            "alpha", "marmalade", since_epoch=parse_since("2026-03-01").timestamp()
        )
        assert [h.text for h in recent] == ["new marmalade note"]
        assert [h.text for h in index.search("beta", "marmalade")] == ["beta's marmalade secret"]


def test_sync_indexes_missing_drops_vanished_and_reindexes_rewritten(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    paths = ws.create_agent("alpha")
    paths.archive_dir.mkdir()
    archive = paths.archive_dir / "history_2026-01-01_00-00-00.md"
    archive.write_text("### Human — 2026-01-01T00:00:00\n\nthe heliotrope key\n\n---\n\n")
    (paths.archive_dir / "notes.txt").write_bytes(b"\x00not an archive")
    with RecallIndex.open(state_dir, ws.root) as index:
        report = index.sync_agent(paths)
        assert archive.name in report.indexed and len(report.indexed) == 2  # + MEMORY.md
        assert index.search("alpha", "heliotrope")[0].source == archive.name
        assert index.sync_agent(paths).indexed == []  # nothing changed, nothing re-read
        archive.write_text("### Human — 2026-01-01T00:00:00\n\nthe amaranth key\n\n---\n\n")
        index.sync_agent(paths)
        assert index.search("alpha", "heliotrope") == []
        assert index.search("alpha", "amaranth")
        archive.unlink()
        assert index.sync_agent(paths).removed == [archive.name]
        assert index.search("alpha", "amaranth") == []


def _db_bytes(state_dir: Path, ws: AgentWorkspace) -> bytes:
    path = recall_db_path(state_dir, ws.root)
    data = b""
    for suffix in ("", "-wal", "-shm", "-journal"):
        candidate = Path(f"{path}{suffix}")
        if candidate.exists():
            data += candidate.read_bytes()
    return data


def test_erase_leaves_no_trace_in_the_db_wal_or_free_pages(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    alpha = ws.create_agent("alpha")
    beta = ws.create_agent("beta")
    for index in range(200):
        append_entry(alpha.memory, "Human", f"secret {index}: xylophonic{index} qwertzuiop")
    append_entry(beta.memory, "Human", "beta keeps its zanzibarite")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(alpha)
        index.sync_agent(beta)
        # A second connection keeps the WAL alive, as the daemon would.
        with RecallIndex.open(state_dir, ws.root) as reader:
            assert reader.search("alpha", "qwertzuiop")
            assert b"qwertzuiop" in _db_bytes(state_dir, ws)
            assert index.erase_agent("alpha") == 200
            assert b"qwertzuiop" not in _db_bytes(state_dir, ws)
            assert b"xylophonic1" not in _db_bytes(state_dir, ws)
            assert reader.search("alpha", "qwertzuiop") == []
            assert reader.search("beta", "zanzibarite")


def test_scrub_after_a_rewritten_archive_leaves_no_old_text(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    # What erase-by-pattern does: rewrite the archive, re-sync, scrub.
    paths = ws.create_agent("alpha")
    paths.archive_dir.mkdir()
    archive = paths.archive_dir / "history_2026-01-01_00-00-00.md"
    entry = "### Human — 2026-01-01T00:00:00\n\nturn {i}: my pin is {pin}\n\n---\n\n"
    archive.write_text("".join(entry.format(i=i, pin="plumquartz") for i in range(200)))
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(paths)
        archive.write_text("".join(entry.format(i=i, pin="[erased]") for i in range(200)))
        index.sync_agent(paths)
        index.scrub()
        assert index.search("alpha", "erased")
    assert b"plumquartz" not in _db_bytes(state_dir, ws)


def test_older_schema_is_rebuilt_and_newer_refused(ws: AgentWorkspace, state_dir: Path) -> None:
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "the obsidian ledger")
    path = recall_db_path(state_dir, ws.root)
    state_dir.mkdir()
    # What an unversioned draft of the index left behind.
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE sources (agent TEXT, name TEXT)")
    old.execute("INSERT INTO sources VALUES ('alpha', 'MEMORY.md')")
    old.commit()
    old.close()
    with RecallIndex.open(state_dir, ws.root) as index:
        assert any("schema version 0" in note for note in index.notes)
        index.sync_agent(paths)
        assert index.search("alpha", "obsidian")
    newer = sqlite3.connect(path)
    newer.execute(
        "UPDATE recall_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),)
    )
    newer.commit()
    newer.close()
    with pytest.raises(RecallIndexError, match="newer than this memd"):
        RecallIndex.open(state_dir, ws.root)


def test_a_corrupt_index_is_moved_aside_and_rebuilt(ws: AgentWorkspace, state_dir: Path) -> None:
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "the cobalt lantern")
    state_dir.mkdir()
    recall_db_path(state_dir, ws.root).write_bytes(b"this is not a database" * 100)
    with RecallIndex.open(state_dir, ws.root) as index:
        assert any("corrupt" in note for note in index.notes)
        index.sync_agent(paths)
        assert index.search("alpha", "lantern")
    assert list(state_dir.glob("*.corrupt-*"))


def test_crash_between_archive_and_index_is_repaired_at_the_next_start(
    ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    paths = ws.create_agent("alpha", entries=2)
    append_entry(paths.memory, "Human", "the vermilion passphrase is under the mat")
    child = subprocess.run(
        [sys.executable, str(CHILD), str(ws.root), str(state_dir), "alpha", "--crash-before-index"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -9, child.stderr
    (archive,) = paths.archive_dir.iterdir()
    assert b"vermilion" in archive.read_bytes()
    assert search(state_dir, ws, "alpha", "vermilion") == []  # the crash left it unindexed
    config = tmp_path / "memd.toml"
    config.write_text("[trigger]\ncontext_length = 100000\n")
    with DaemonProcess(ws.root, state_dir, config=config) as daemon:
        daemon.wait_ready()
        repaired = daemon.wait_for("recall index repaired")
        assert repaired["agent"] == "alpha" and repaired["indexed"] == [archive.name]
        daemon.wait_for("recall index ready")
        assert daemon.stop() == 0
    (hit,) = search(state_dir, ws, "alpha", "vermilion")
    assert hit.source == archive.name


def test_without_a_crash_the_archive_is_indexed_once_the_compaction_returns(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    paths = ws.create_agent("alpha", entries=2)
    append_entry(paths.memory, "Human", "the saffron doorway")
    child = subprocess.run(
        [sys.executable, str(CHILD), str(ws.root), str(state_dir), "alpha"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    (hit,) = search(state_dir, ws, "alpha", "saffron")
    assert hit.source == child.stdout.strip().splitlines()[-1]
    assert os.stat(recall_db_path(state_dir, ws.root)).st_mode & 0o077 == 0


def test_a_file_over_the_index_bound_is_not_read_nor_retried(
    ws: AgentWorkspace, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memd.recall.index as index_module

    monkeypatch.setattr(index_module, "MAX_INDEX_BYTES", 4096)
    paths = ws.create_agent("huge")
    append_entry(paths.memory, "Human", "needle " + "x" * 8000)  # one giant line
    reads: list[int] = []
    real = index_module.read_to_end
    monkeypatch.setattr(index_module, "read_to_end", lambda fd: reads.append(fd) or real(fd))
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(paths)
        index.sync_agent(paths)  # unchanged: not looked at again
        assert index.search("huge", "needle") == [] and reads == []
        paths.memory.write_text("### Human — 2026-01-01T10:00:00\n\nneedle small\n\n---\n\n")
        index.sync_agent(paths)
        assert index.search("huge", "needle")[0].source == LIVE_SOURCE


def test_a_file_rewritten_between_read_and_write_keeps_its_new_rows(
    ws: AgentWorkspace, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon syncs without the agent's lock: forget --match may rewrite the
    # file, re-index and scrub it between the sync's read and its write. The
    # stale rows must not be written back over the erasure.
    import memd.recall.index as index_module

    paths = ws.create_agent("alpha", entries=2)
    append_entry(paths.memory, "Human", "The vorquellan code is 4111.")
    live = paths.memory
    original_parse = index_module.parse

    def rewritten_meanwhile(data: bytes) -> object:
        document = original_parse(data)
        erased = live.read_bytes().replace(b"vorquellan", b"erased")
        temporary = live.with_name("MEMORY.md.tmp")
        temporary.write_bytes(erased)
        os.replace(temporary, live)  # a new file, as forget --match writes it
        return document

    with RecallIndex.open(state_dir, ws.root) as index:
        monkeypatch.setattr(index_module, "parse", rewritten_meanwhile)
        index.index_file("alpha", live, kind="live")
        monkeypatch.undo()
        assert index.search("alpha", "vorquellan code") == []
        index.index_file("alpha", live, kind="live")  # the next sync reads the new file
        assert index.search("alpha", "erased code")
    assert b"vorquellan" not in recall_db_path(state_dir, ws.root).read_bytes()


def test_an_archive_pruned_by_another_process_while_it_is_indexed_leaves_no_rows(
    ws: AgentWorkspace, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon indexes a committed archive after the transaction has returned,
    # outside the agent's lock. `memd prune` (another process, its own connection)
    # may delete that archive and drop the rows of vanished archives in between:
    # after the indexer checked the file, before it committed. The pruner's read
    # does not wait for the indexer's write (WAL), so it finds nothing to drop;
    # the indexer must take its rows back, and scrub them.
    import memd.recall.index as index_module

    paths = ws.create_agent("alpha")
    paths.archive_dir.mkdir()
    archive = paths.archive_dir / "history_2026-01-01_00-00-00.md"
    entry = "### Human — 2026-01-01T00:00:00\n\nturn {i}: the quillwort ledger\n\n---\n\n"
    archive.write_text("".join(entry.format(i=i) for i in range(50)))
    real_changed = index_module._changed
    dropped: list[list[str]] = []

    indexer = RecallIndex.open(state_dir, ws.root)
    pruner = RecallIndex.open(state_dir, ws.root)

    def pruned_meanwhile(path: Path, read: object) -> bool:
        changed = real_changed(path, read)  # type: ignore[arg-type]
        if path.name == archive.name and not dropped:  # read through the pinned folder
            archive.unlink()  # the prune, under the agent's lock
            dropped.append(pruner.sync_agent(paths, live=False).removed)
        return changed

    with indexer, pruner:
        monkeypatch.setattr(index_module, "_changed", pruned_meanwhile)
        indexer.sync_agent(paths, live=False)
        monkeypatch.undo()
        assert dropped == [[]]  # the pruner saw none of the rows being written
        assert pruner.search("alpha", "quillwort") == []
        assert indexer.sync_agent(paths, live=False).removed == []  # nothing left over
    assert b"quillwort" not in _db_bytes(state_dir, ws)


def test_recall_of_an_agent_whose_memory_md_is_a_fifo_does_not_hang(tmp_path: Path) -> None:
    """An agent (untrusted, it owns its folder) puts a FIFO where MEMORY.md goes.
    ``memd recall`` must answer (or refuse in one line), not block forever in
    open(). The same open serves the daemon's recall socket: each query for that
    agent would hold one of its client slots for good (review 14e, F3)."""
    folder = tmp_path / "ws" / "agents" / "fifo"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "MEMORY.md")
    args = ["recall", "fifo", "hello", "--workspace", str(tmp_path / "ws")]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "memd", *args, "--state-dir", str(tmp_path / "st")],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("memd recall blocked on a FIFO MEMORY.md")
    assert "Traceback" not in proc.stderr


# --- review s7recall: ranking across agents, rows of what is gone ---


def _scored(index: RecallIndex, agent: str, question: str) -> list[tuple[str, float]]:
    return [(hit.text, hit.score) for hit in index.search(agent, question, limit=20)]


def test_an_agents_scores_and_order_do_not_depend_on_other_agents(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    """review s7recall F2: bm25's document frequencies and the common-word cap come
    from every agent's rows, so an agent's scores and order (and which of its words
    are left out as common) tell it whether other agents' memories hold its words."""
    alpha = ws.create_agent("alpha")
    for text in (
        "the vermilion kettle is in the shed",
        "a kettle report went to finance",
        "the quarterly report is late",
        "nobody knows where the vermilion paint went",
    ):
        append_entry(alpha.memory, "Human", text)
    beta = ws.create_agent("beta")
    entry = (
        "### Human — 2026-01-01T10:00:00\n\nbeta's report {i} on the vermilion kettle\n\n---\n\n"
    )
    beta.memory.write_text(
        beta.memory.read_text() + "".join(entry.format(i=i) for i in range(1200))
    )
    question = "where is the vermilion kettle report?"
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(alpha)
        alone = _scored(index, "alpha", question)
        assert len(alone) == 4
        index.sync_agent(beta)
        assert _scored(index, "alpha", question) == alone
        assert len(index.search("beta", question, limit=100)) == 100
        index.erase_agent("beta")
        assert _scored(index, "alpha", question) == alone


_WORDS = re.compile(r"[^\W_]+")


def _bm25(texts: list[str], terms: list[str], text: str) -> float:
    """Reference BM25 (Lucene's idf, FTS5's k1 and b) over ``texts``, counting
    words as FTS5's unicode61 does (a NUL byte is a separator, not a word)."""
    docs = [[w.lower() for w in _WORDS.findall(t)] for t in texts]
    average = sum(len(d) for d in docs) / len(docs)
    words = [w.lower() for w in _WORDS.findall(text)]
    score = 0.0
    for term in terms:
        held = sum(1 for d in docs if term in d)
        count = words.count(term)
        if count:
            idf = math.log(1 + (len(docs) - held + 0.5) / (held + 0.5))
            norm = 1.2 * (1 - 0.75 + 0.75 * len(words) / average)
            score += idf * count * 2.2 / (count + norm)
    return -score


@pytest.mark.parametrize("read_counts_with", ["highlight", "bm25"])
def test_scores_are_bm25_over_the_agents_own_entries(
    ws: AgentWorkspace,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    read_counts_with: str,
) -> None:
    """review s7recall F2: the score is BM25 from the agent's own entry count, average
    length and document frequencies, with each entry's own word counts, however
    they are read (highlight() for a word in few entries, FTS5's bm25() for one in
    many), whatever other agents hold."""
    import memd.recall.index as index_module

    highlight_max = 10**9 if read_counts_with == "highlight" else 0
    monkeypatch.setattr(index_module, "HIGHLIGHT_TF_MAX", highlight_max, raising=False)
    if read_counts_with == "bm25":  # every count worked out, none read again

        def not_whole(*args: object) -> int:
            raise AssertionError("a count from bm25() did not come out whole")

        ranker = getattr(index_module, "_Ranker", None)
        if ranker is not None:
            monkeypatch.setattr(ranker, "_highlighted_count", not_whole)
    texts = [
        "zyx qwv zyx zyx ppp",
        "qwv ppp ppp ppp ppp ppp ppp ppp ppp",
        "zyx",
        "nothing in common here at all",
        "qwv qwv qwv qwv qwv qwv qwv qwv qwv qwv qwv qwv",
    ]
    alpha = ws.create_agent("alpha")
    for text in texts:
        append_entry(alpha.memory, "Human", text)
    beta = ws.create_agent("beta")
    for index in range(300):
        append_entry(beta.memory, "Human", f"zyx {'qwv ' * (index % 7)} filler words {index}")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(beta)
        index.sync_agent(alpha)
        hits = index.search("alpha", "zyx qwv?", limit=10)
        assert {hit.text for hit in hits} == {texts[0], texts[1], texts[2], texts[4]}
        for hit in hits:
            assert hit.score == pytest.approx(_bm25(texts, ["zyx", "qwv"], hit.text), rel=1e-12)
        assert [hit.score for hit in hits] == sorted(hit.score for hit in hits)


def test_an_agents_common_words_are_its_own(
    ws: AgentWorkspace, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review s7recall F2: a word is left out as common when it is common in the
    agent's own entries, not because another agent's entries hold it: which of
    alpha's entries come back must not tell alpha what beta wrote."""
    import memd.recall.index as index_module

    monkeypatch.setattr(index_module, "COMMON_TERM_FLOOR", 5)
    alpha = ws.create_agent("alpha")
    append_entry(alpha.memory, "Human", "the quorlax is filed")
    for index in range(3):
        append_entry(alpha.memory, "Human", f"budget sheet {index}")
    beta = ws.create_agent("beta")
    for index in range(50):
        append_entry(beta.memory, "Human", f"beta's budget {index}")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(alpha)
        alone = [hit.text for hit in index.search("alpha", "budget quorlax", limit=10)]
        assert len(alone) == 4  # "budget" is rare among alpha's 4 entries
        index.sync_agent(beta)
        assert [hit.text for hit in index.search("alpha", "budget quorlax", limit=10)] == alone
        # For beta, holding it in all 50 of its entries, it is common.
        assert index.search("beta", "budget quorlax") != []


def test_a_question_of_common_words_only_ranks_the_newest_entries_holding_them(
    ws: AgentWorkspace, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only common words asked: the best of the newest COMMON_CANDIDATES entries
    holding them (after the filters), not of all of them (100,000s at 1 GB:
    seconds per query)."""
    import memd.recall.index as index_module

    monkeypatch.setattr(index_module, "COMMON_TERM_FLOOR", 5)
    monkeypatch.setattr(index_module, "COMMON_CANDIDATES", 10, raising=False)
    alpha = ws.create_agent("alpha")
    append_entry(alpha.memory, "AI", "report report report report")  # the best match, oldest
    for index in range(30):
        append_entry(alpha.memory, "Human" if index < 25 else "AI", f"report {index} filed")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(alpha)
        hits = index.search("alpha", "report", limit=20)
        assert sorted(hit.text for hit in hits) == sorted(
            f"report {index} filed" for index in range(20, 30)
        )
        # The filters come first: the 6 AI entries are all candidates.
        ai = index.search("alpha", "report", limit=20, role="ai")
        assert ai[0].text == "report report report report" and len(ai) == 6
        # A rare word next to it is still searched over all the agent's entries.
        append_entry(alpha.memory, "Human", "the quorlax report")
        index.sync_agent(alpha)
        assert index.search("alpha", "quorlax report")[0].text == "the quorlax report"


def _counts_as_stored(index: RecallIndex) -> dict[str, tuple[int, int]]:
    def operation(conn: sqlite3.Connection) -> dict[str, tuple[int, int]]:
        return {
            name: (entries, tokens)
            for name, entries, tokens in conn.execute("SELECT name, entries, tokens FROM agents")
        }

    return index._run(operation)


def _counts_recounted(index: RecallIndex) -> dict[str, tuple[int, int]]:
    from memd.recall.index import SEQ_BITS as bits

    def operation(conn: sqlite3.Connection) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for number, name in conn.execute("SELECT id, name FROM agents").fetchall():
            low, high = number << bits, ((number + 1) << bits) - 1
            entries, tokens = conn.execute(
                "SELECT count(*), coalesce(sum(words), 0) FROM entries WHERE id BETWEEN ? AND ?",
                (low, high),
            ).fetchone()
            found[name] = (entries, tokens)
        return found

    return index._run(operation)


def test_each_agents_counts_follow_its_rows_and_its_numbers_are_reused(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    """The agents table holds each agent's entry and token counts (its ranking's N
    and average length): they must follow every write and drop, and an erased
    agent leaves no row. Re-indexing a live file that changed reuses the numbers
    its rows had (the socket re-indexes it before each query)."""
    from memd.recall.index import SEQ_BITS as bits

    alpha = ws.create_agent("alpha")
    beta = ws.create_agent("beta")
    alpha.archive_dir.mkdir()
    archive = alpha.archive_dir / "history_2026-01-01_00-00-00.md"
    archive.write_text(
        "".join(
            f"### Human — 2026-01-01T00:00:0{i}\n\none two three {'four ' * i}\n\n---\n\n"
            for i in range(5)
        )
    )
    append_entry(beta.memory, "Human", "beta's only words")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(alpha)
        index.sync_agent(beta)
        assert _counts_as_stored(index) == _counts_recounted(index)
        assert _counts_as_stored(index)["alpha"] == (5, 15 + 10)
        assert _counts_as_stored(index)["beta"] == (1, 4)  # beta, s, only, words
        for turn in range(30):
            append_entry(alpha.memory, "Human", f"live turn {turn}")
            index.sync_agent(alpha)
        assert _counts_as_stored(index) == _counts_recounted(index)
        assert _counts_as_stored(index)["alpha"] == (35, 25 + 90)

        def highest_sequence(conn: sqlite3.Connection) -> int:
            return int(conn.execute("SELECT max(id) FROM entries").fetchone()[0]) & (
                (1 << bits) - 1
            )

        assert index._run(highest_sequence) < 35 + 30  # not 5 + 1 + 2 + ... + 30
        archive.write_text("### Human — 2026-01-01T00:00:00\n\nrewritten\n\n---\n\n")
        index.sync_agent(alpha)
        assert _counts_as_stored(index)["alpha"] == (31, 1 + 90)
        assert _counts_as_stored(index) == _counts_recounted(index)
        index.erase_agent("alpha")
        assert _counts_as_stored(index) == {"beta": (1, 4)}


# Schema 1 as memd wrote it before the per-agent ranking (review s7recall F2).
_SCHEMA_1 = (
    "CREATE TABLE recall_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE sources ("
    " id INTEGER PRIMARY KEY, agent TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL,"
    " dev INTEGER NOT NULL, ino INTEGER NOT NULL, size INTEGER NOT NULL,"
    " mtime_ns INTEGER NOT NULL, indexed_at REAL NOT NULL, UNIQUE (agent, name))",
    "CREATE TABLE entries ("
    " id INTEGER PRIMARY KEY, source_id INTEGER NOT NULL, agent TEXT NOT NULL,"
    " offset INTEGER NOT NULL, length INTEGER NOT NULL, role TEXT NOT NULL,"
    " ts TEXT NOT NULL, epoch REAL)",
    "CREATE INDEX entries_by_source ON entries (source_id)",
    "CREATE INDEX entries_by_agent ON entries (agent)",
    "CREATE VIRTUAL TABLE entries_fts USING fts5("
    " text, tokenize = 'porter unicode61 remove_diacritics 2')",
    "INSERT INTO recall_meta VALUES ('schema_version', '1')",
)


def test_an_index_of_schema_1_is_rebuilt_from_the_files(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    """An index the previous memd left (schema 1: one id sequence for every agent,
    ranked with FTS5's bm25) is replaced: the daemon's start-up pass (or `memd
    recall`) indexes the archives and MEMORY.md again, and the old rows' text is
    not left in the file's free pages."""
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "the obsidian ledger")
    live = os.stat(paths.memory)
    state_dir.mkdir()
    path = recall_db_path(state_dir, ws.root)
    old = sqlite3.connect(path)
    for statement in _SCHEMA_1:
        old.execute(statement)
    old.execute(
        "INSERT INTO sources VALUES (1, 'alpha', 'MEMORY.md', 'live', ?, ?, ?, ?, 0)",
        (live.st_dev, live.st_ino, live.st_size, live.st_mtime_ns),
    )
    old.execute("INSERT INTO entries VALUES (1, 1, 'alpha', 0, 10, 'Human', 'x', NULL)")
    old.execute("INSERT INTO entries_fts (rowid, text) VALUES (1, ?)", ("stalewords " * 2000,))
    old.commit()
    old.close()
    with RecallIndex.open(state_dir, ws.root) as index:
        assert any("schema version 1 replaced by 2" in note for note in index.notes)
        assert index.search("alpha", "stalewords") == []
        assert index.sync_agent(paths).indexed == [LIVE_SOURCE]  # read again, same identity
        (hit,) = index.search("alpha", "obsidian")
        assert hit.text == "the obsidian ledger" and hit.score < 0
    assert b"stalewords" not in _db_bytes(state_dir, ws)


def test_sync_scrubs_the_rows_of_an_archive_or_memory_found_gone(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    """review s7recall F3: a sync that finds an archive gone (pruned or forgotten by
    another process, deleted by hand) dropped its rows but left their text in the
    index file's FTS segments until some later scrub; so did a MEMORY.md gone."""
    paths = ws.create_agent("alpha")
    paths.archive_dir.mkdir()
    archive = paths.archive_dir / "history_2026-01-01_00-00-00.md"
    entry = "### Human — 2026-01-01T00:00:00\n\nturn {i}: my pin is plumquartz{i}\n\n---\n\n"
    archive.write_text("".join(entry.format(i=i) for i in range(200)))
    for i in range(200):
        append_entry(paths.memory, "Human", f"live turn {i}: the lobster code is zyntherix{i}")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(paths)
        assert b"plumquartz" in _db_bytes(state_dir, ws)
        archive.unlink()
        assert index.sync_agent(paths).removed == [archive.name]
        assert b"plumquartz" not in _db_bytes(state_dir, ws)
        assert index.search("alpha", "zyntherix5")
        paths.memory.unlink()
        assert index.sync_agent(paths).removed == [LIVE_SOURCE]
        assert index.search("alpha", "zyntherix5") == []
    assert b"zyntherix" not in _db_bytes(state_dir, ws)


def test_a_removed_agents_rows_are_erased(ws: AgentWorkspace, state_dir: Path) -> None:
    """review s7recall F3: an agent whose folder was removed kept its rows (and their
    text) in the index for good; the daemon's periodic job erases them. An agent
    not listed yet but whose folder is there is left alone."""
    import shutil

    alpha = ws.create_agent("alpha")
    beta = ws.create_agent("beta")
    newcomer = ws.create_agent("newcomer")
    for paths in (alpha, beta, newcomer):
        append_entry(paths.memory, "Human", f"{paths.agent} keeps the quillfeather{paths.agent}")
    service = RecallService.open(state_dir, ws.root)
    assert service is not None
    try:
        for paths in (alpha, beta, newcomer):
            service.index.sync_agent(paths)
        shutil.rmtree(beta.dir)
        service.drop_gone(ws.root, {"alpha"})
        assert service.index.agents() == ["alpha", "newcomer"]
        assert service.index.search("beta", "quillfeatherbeta") == []
    finally:
        service.stop()
    data = _db_bytes(state_dir, ws)
    assert b"quillfeatherbeta" not in data and b"quillfeatheralpha" in data


def test_the_daemon_erases_the_rows_of_an_agent_removed_while_it_was_down(
    tmp_path: Path,
) -> None:
    """review s7recall F3, through the daemon: its periodic job (first run soon after
    start) erases the rows of an agent whose folder is gone."""
    import shutil

    ws = AgentWorkspace(tmp_path / "ws")
    state_dir = tmp_path / "state"
    alpha = ws.create_agent("alpha")
    beta = ws.create_agent("beta")
    append_entry(beta.memory, "Human", "beta's tellurium flask")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(alpha)
        index.sync_agent(beta)
    shutil.rmtree(beta.dir)
    config = tmp_path / "memd.toml"
    config.write_text("[trigger]\ncontext_length = 100000\n")
    with DaemonProcess(ws.root, state_dir, config=config) as daemon:
        daemon.wait_ready()
        erased = daemon.wait_for("recall rows erased: agent removed")
        assert erased["agents"] == ["beta"] and erased["entries"] == 1
        assert daemon.stop() == 0
    with RecallIndex.open(state_dir, ws.root) as index:
        assert index.agents() == ["alpha"]
    assert b"tellurium" not in _db_bytes(state_dir, ws)


# A tool dump with a NUL byte near its start, then a base64 blob, naming the word
# once, at its end; and a short entry naming it three times.
_DUMP = "binary header \x00 " + "QUJD" * 1000 + " filler zorblat"
_SHORT = "zorblat zorblat zorblat noted"
_TEXTS = [_DUMP, _SHORT, "a zorblat here", "nothing else"]


@pytest.mark.parametrize("passes", ["one for all words", "one per word"])
def test_an_entry_holding_a_nul_byte_is_scored_with_its_real_word_count(
    ws: AgentWorkspace, state_dir: Path, monkeypatch: pytest.MonkeyPatch, passes: str
) -> None:
    """review r8recall F1: a word's count was read as (length(highlight) -
    length(text)) / 2, but SQLite's length() stops at a NUL and highlight()
    leaves out the text from a NUL to the next match: the dump got a count of
    hundreds for one occurrence and outranked the entry holding the word most.
    Both ways of counting a question's rare words are forced."""
    import memd.recall.index as index_module

    one_pass = 0 if passes == "one for all words" else 10**9
    monkeypatch.setattr(index_module, "ONE_PASS_TOKENS", one_pass, raising=False)
    alpha = ws.create_agent("alpha")
    for text in _TEXTS:
        append_entry(alpha.memory, "Human", text)
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(alpha)
        hits = index.search("alpha", "zorblat", limit=10)
        # Beside a second rare word (counts for both from one highlight per entry).
        both = index.search("alpha", "zorblat filler", limit=10)
    assert len(hits) == 3
    expected = {text: _bm25(_TEXTS, ["zorblat"], text) for text in _TEXTS[:3]}
    assert hits[0].text == _SHORT
    for hit in hits:
        assert hit.score == pytest.approx(expected[hit.text], rel=1e-9)
    assert len(both) == 3
    for hit in both:
        assert hit.score == pytest.approx(_bm25(_TEXTS, ["zorblat", "filler"], hit.text), rel=1e-9)


def test_a_hits_text_is_the_whole_entry_even_with_a_nul_byte(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    """review r8recall F2: a hit's text was rebuilt from highlight(), which leaves
    out everything from a NUL byte to the next match (memd recall, --json, the
    socket); it is the entry's whole content, its matches marked where they are."""
    alpha = ws.create_agent("alpha")
    for text in _TEXTS:
        append_entry(alpha.memory, "Human", text)
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(alpha)
        hits = index.search("alpha", "Zorblat filler", limit=10)
    data = alpha.memory.read_bytes()
    assert len(hits) == 3
    for hit in hits:
        (entry,) = parse(data[hit.offset : hit.offset + hit.length]).entries
        assert hit.text == entry.text
        assert [hit.text[start:end] for start, end in hit.matches] == [
            word for word in _WORDS.findall(hit.text) if word in ("zorblat", "filler")
        ]
    dump = next(hit for hit in hits if hit.text.startswith("binary header"))
    assert dump.text == _DUMP and len(dump.matches) == 2


def test_many_rare_words_in_large_entries_do_not_multiply_the_query_cost(
    ws: AgentWorkspace, state_dir: Path
) -> None:
    """review r8recall F3: each rare word's counts were read with a highlight() of
    every entry holding it: 32 such words over 64 large tool dumps cost 28x the
    code before, under the index lock. Each entry's text is read once per question
    (a ratio of CPU times, best of 3, not a time)."""
    alpha = ws.create_agent("alpha")
    rare = [f"zq{k:02d}" for k in range(32)]
    dump = " ".join(f"tok{(k * 7919) % 5000}" for k in range(15000))  # ~120 KB
    with alpha.memory.open("a", encoding="utf-8") as handle:
        for _ in range(64):
            handle.write(f"### AI — 2026-01-01T10:00:00\n\n{' '.join(rare)} {dump}\n\n---\n\n")
    with RecallIndex.open(state_dir, ws.root) as index:
        index.sync_agent(alpha)

        def cpu(question: str) -> float:
            best = math.inf
            for _ in range(3):
                started = time.process_time()
                assert len(index.search("alpha", question, limit=5)) == 5
                best = min(best, time.process_time() - started)
            return best

        one_word = cpu("zq01")
        all_words = cpu(" ".join(rare))
    assert all_words <= 4 * one_word, (all_words, one_word)


def test_a_removed_agent_leaves_no_name_in_the_index(ws: AgentWorkspace, state_dir: Path) -> None:
    """review r8recall F4: an agent whose files went before its folder kept its row in
    ``agents`` (name and counts) for good, and the daemon's removed-agent erasure and
    `memd recall --reindex` looked for agents in ``sources`` only: an agent left with
    no entry loses its row, and a name left by an earlier index is erased too."""
    gone = ws.create_agent("zeldafrobnicate")
    beta = ws.create_agent("beta")
    append_entry(gone.memory, "Human", "the quorlax ledger")
    append_entry(beta.memory, "Human", "beta words")
    service = RecallService.open(state_dir, ws.root)
    assert service is not None
    index = service.index

    def names(conn: sqlite3.Connection) -> list[str]:
        return [row[0] for row in conn.execute("SELECT name FROM agents ORDER BY name")]

    try:
        index.sync_agent(gone)
        index.sync_agent(beta)
        gone.memory.unlink()  # its files removed first (by hand, a script) ...
        assert index.sync_agent(gone).removed == ["MEMORY.md"]  # a query or the start-up pass
        assert index._run(names) == ["beta"]
        shutil.rmtree(gone.dir)  # ... then its folder
        service.drop_gone(ws.root, ["beta"])  # the daemon's periodic job
        assert index._run(names) == ["beta"]
        # A name only in `agents`, as the index before this fix left it.
        index._run(lambda conn: conn.execute("INSERT INTO agents VALUES (99, 'oldorphan', 0, 0)"))
        assert index.agents() == ["beta", "oldorphan"]
        service.drop_gone(ws.root, ["beta"])
        assert index._run(names) == ["beta"] and index.agents() == ["beta"]
    finally:
        service.stop()
    data = _db_bytes(state_dir, ws)
    assert b"zeldafrobnicate" not in data and b"oldorphan" not in data


def test_rare_words_counted_in_one_pass_score_as_counted_one_by_one(
    ws: AgentWorkspace, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review r8recall F3: counted in one highlight() per entry, each matched word
    counts for every question word FTS5 stems alike ("filed", "filing", "files"),
    case and accents folded, as when each word is counted on its own."""
    import memd.recall.index as index_module

    alpha = ws.create_agent("alpha")
    for text in (
        "Filed the report, filing it twice; files FILED",
        "the café report was filed",
        "cafe cafés Café naïve naive",
        "nothing here",
    ):
        append_entry(alpha.memory, "Human", text)
    question = "filed filing files café cafe naive report"

    def scored(one_pass: int) -> list[tuple[str, float, tuple[tuple[int, int], ...]]]:
        monkeypatch.setattr(index_module, "ONE_PASS_TOKENS", one_pass)
        with RecallIndex.open(state_dir, ws.root) as index:
            index.sync_agent(alpha)
            hits = index.search("alpha", question, limit=10)
        return [(hit.text, hit.score, hit.matches) for hit in hits]

    one_by_one = scored(10**9)
    assert len(one_by_one) == 3
    assert scored(0) == one_by_one


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")
def test_recall_index_planted_by_another_uid_is_never_written() -> None:
    """bob makes the state dir first (a /tmp path, or a parent memd made 0777
    under umask 000) and leaves an empty, world-writable index in it: memd
    refuses (one line naming the path), and none of alice's text reaches
    bob's file (review r9leak F2)."""
    from support.two_agents import ALICE, BOB, run_as, shared_root

    from memd.errors import ConfigError
    from memd.workspace import agent_paths

    with shared_root() as root:
        ws = AgentWorkspace(root / "ws")
        alice = ws.create_agent("alice")
        append_entry(alice.memory, "Human", "alice's periwinkle vault code is 4417-XK")
        for path in (alice.dir, alice.memory):
            os.chown(path, ALICE, ALICE)
        alice.dir.chmod(0o770)
        alice.memory.chmod(0o660)
        state_dir = root / "state"
        index_file = recall_db_path(state_dir, ws.root)
        root.chmod(0o1777)
        planted = run_as(
            BOB,
            "/bin/sh",
            "-c",
            f'mkdir -m 777 "{state_dir}" && : > "{index_file}" && chmod 666 "{index_file}"',
        )
        assert planted.returncode == 0, planted.stderr
        with pytest.raises(ConfigError, match=f"state dir {state_dir} is owned by uid {BOB}"):
            RecallIndex.open(state_dir, ws.root)
        # bob's file in a state dir of memd's own (made 0777 by hand, then closed):
        # refused too, and never written.
        os.chown(state_dir, 0, 0)
        state_dir.chmod(0o700)
        with pytest.raises(ConfigError, match=f"recall index {index_file} is owned by uid {BOB}"):
            RecallIndex.open(state_dir, ws.root)
        os.unlink(index_file)
        wal = Path(f"{index_file}-wal")
        wal.touch()
        os.chown(wal, BOB, BOB)
        with pytest.raises(ConfigError, match="recall index .*-wal is owned by uid"):
            RecallIndex.open(state_dir, ws.root)
        wal.unlink()
        # A state dir of memd's that others may write in is refused.
        state_dir.chmod(0o777)
        with pytest.raises(ConfigError, match="has mode 0777.*chmod go-w"):
            RecallIndex.open(state_dir, ws.root)
        state_dir.chmod(0o700)
        with RecallIndex.open(state_dir, ws.root) as index:  # memd's own: used
            index.sync_agent(agent_paths(ws.root, "alice"))
            assert index.search("alice", "periwinkle")
        assert stat.S_IMODE(index_file.stat().st_mode) == 0o600
        read = run_as(BOB, "/bin/sh", "-c", f'cat "{index_file}"* 2>/dev/null || true')
        assert "4417-XK" not in read.stdout


def test_the_state_dirs_parents_memd_makes_are_not_open_to_all_under_umask_000(
    tmp_path: Path,
) -> None:
    """mkdir(parents=True) made the state dir's parents 0777 under umask 000:
    any uid could then rename the state dir away and plant its own before the
    next start (review r9leak F2)."""
    state_dir = tmp_path / "var" / "lib" / "memd"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    previous = os.umask(0)
    try:
        RecallIndex.open(state_dir, workspace).close()
    finally:
        os.umask(previous)
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    for parent in (tmp_path / "var", tmp_path / "var" / "lib"):
        assert stat.S_IMODE(parent.stat().st_mode) == 0o755, parent
