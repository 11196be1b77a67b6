from __future__ import annotations

import os
import sqlite3
import stat
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import memd.state
from memd.state import (
    AgentRecord,
    LedgerEntry,
    StateStore,
    state_db_path,
)


def record(agent: str, tokens: int = 100, **changes: object) -> AgentRecord:
    fields: dict[str, object] = dict(
        agent=agent,
        dev=1,
        ino=2,
        size=400,
        safe_offset=300,
        safe_tokens=80,
        tokens=tokens,
        threshold_tokens=1000,
        updated_at=1_700_000_000.5,
    )
    fields.update(changes)
    return AgentRecord(**fields)  # type: ignore[arg-type]


def entry(agent: str, started_at: float, error: str | None = None) -> LedgerEntry:
    return LedgerEntry(
        agent=agent,
        started_at=started_at,
        duration_s=1.25,
        archive=None if error else f"history_{int(started_at)}.md",
        tokens_before=5000,
        tokens_after=None if error else 700,
        model="builtin",
        cost_usd=None if error else 0.0012,
        error=error,
        trigger="daemon",
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "agents").mkdir(parents=True)
    return ws


def test_ledger_written_elsewhere_names_other_processes_compactions(
    tmp_path: Path, workspace: Path
) -> None:
    """What a polling daemon hands its poller: the agents of ledger rows another
    connection committed after the mark (compact-now's), once each; its own
    (trigger ``daemon``) are passed over, and the mark moves past them all."""
    import dataclasses

    def by_hand(agent: str, started_at: float) -> LedgerEntry:
        return dataclasses.replace(entry(agent, started_at), trigger="compact-now")

    with (
        StateStore.open(tmp_path / "s", workspace) as daemon,
        StateStore.open(tmp_path / "s", workspace) as cli,
    ):
        cli.record_compaction(by_hand("before", 1.0))
        mark = daemon.ledger_mark()
        assert daemon.ledger_written_elsewhere(mark) == (mark, [])
        daemon.record_compaction(entry("own", 2.0))  # its own commit: nothing moves
        assert daemon.ledger_written_elsewhere(mark) == (mark, [])
        cli.record_compaction(by_hand("b", 3.0))
        cli.record_compaction(entry("other daemon row", 4.0))
        cli.record_compaction(by_hand("a", 5.0))
        cli.record_compaction(by_hand("b", 6.0))
        moved, agents = daemon.ledger_written_elsewhere(mark)
        assert agents == ["b", "a"]
        assert moved.last_id > mark.last_id
        assert daemon.ledger_written_elsewhere(moved) == (moved, [])
        cli.record_compaction(by_hand("c", 7.0))
        assert daemon.ledger_written_elsewhere(moved)[1] == ["c"]


def test_ledger_written_elsewhere_follows_a_rebuilt_db(tmp_path: Path, workspace: Path) -> None:
    """The DB file replaced under the daemon (deleted, rebuilt by another process):
    its handle follows the path, and the new file's ids start over, so its rows
    are read from the start, not from the old file's last id."""
    import dataclasses

    with StateStore.open(tmp_path / "s", workspace) as daemon:
        for n in range(3):
            daemon.record_compaction(entry("own", float(n)))
        mark = daemon.ledger_mark()
        assert mark.last_id == 3
        path = daemon.path
        assert path is not None
        for leftover in path.parent.glob(path.name + "*"):
            leftover.unlink()
        with StateStore.open(tmp_path / "s", workspace) as cli:
            cli.record_compaction(dataclasses.replace(entry("new", 9.0), trigger="compact-now"))
        moved, agents = daemon.ledger_written_elsewhere(mark)
        assert agents == ["new"]
        assert moved.last_id == 1


def test_last_compactions_from_the_ledger(tmp_path: Path, workspace: Path) -> None:
    """What a daemon takes for an agent with no row yet: each named agent's newest
    compaction that wrote an archive, whatever its name holds."""
    names = ["a", 'o\'brien "x"', "ünï 名前", "none"]
    with StateStore.open(tmp_path / "s", workspace) as store:
        store.record_compaction(entry("a", 10.0))
        store.record_compaction(entry("a", 30.0, error="summarizer: timeout"))
        store.record_compaction(entry("a", 20.0))
        store.record_compaction(entry(names[1], 5.0))
        store.record_compaction(entry(names[2], 7.0))
        store.record_compaction(entry("other", 9.0))
        assert store.agents() == []  # no row to put them in
        assert store.last_compactions(names) == {"a": 21.25, names[1]: 6.25, names[2]: 8.25}
        assert store.last_compactions([]) == {}


def test_one_db_per_workspace(tmp_path: Path, workspace: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    a = state_db_path(tmp_path / "s", workspace)
    assert a != state_db_path(tmp_path / "s", other)
    # A relative or unresolved spelling of the same workspace maps to the same DB.
    assert a == state_db_path(tmp_path / "s", workspace / "agents" / "..")
    assert a.name.endswith(".sqlite3") and len(a.stem) == 16


def test_roundtrip_agents_ledger_heartbeat(tmp_path: Path, workspace: Path) -> None:
    state_dir = tmp_path / "deep" / "missing" / "state"
    with StateStore.open(state_dir, workspace) as store:
        assert store.warnings == []
        assert store.agents() == [] and store.get_agent("a") is None
        assert store.read_heartbeat() is None
        a = record("a", state="running", last_error="boom", last_compaction_at=5.0)
        b = record("b", consecutive_failures=3, next_attempt_at=99.5, state="breaker_open")
        store.upsert_agents([b, a])
        store.record_compaction(entry("a", 10.0))
        store.record_compaction(entry("a", 20.0, error="summarizer: timeout"))
        store.record_compaction(entry("b", 15.0))
        store.write_heartbeat(pid=123, started_at=1.0, healthy=True, detail="ok", agents=2, ts=50)
    # Reopen: everything persisted. A compaction recorded in the ledger is the
    # agent's last one in its row too (a compact-now beside the daemon: status).
    with StateStore.open(state_dir, workspace) as store:
        a = a._replace(last_compaction_at=10.0 + entry("a", 10.0).duration_s)
        b = b._replace(last_compaction_at=15.0 + entry("b", 15.0).duration_s)
        assert store.agents() == [a, b]
        assert store.get_agent("b") == b
        history = store.history("a")
        assert [h.started_at for h in history] == [20.0, 10.0]  # newest first
        assert history[0].error == "summarizer: timeout" and not history[0].ok
        assert history[1] == entry("a", 10.0) and history[1].ok
        assert store.history("a", limit=1) == history[:1]
        beat = store.read_heartbeat()
        assert beat is not None and (beat.pid, beat.healthy, beat.agents) == (123, True, 2)
        assert beat.is_fresh(now=55, max_age_s=15) and not beat.is_fresh(now=70, max_age_s=15)
        store.upsert_agents([record("a", tokens=999)])  # replaces, but the last
        # compaction's time never goes back (the writer may know only its own)
        assert store.get_agent("a") == record("a", tokens=999, last_compaction_at=11.25)
        store.clear_heartbeat(pid=999)  # someone else's pid: kept
        assert store.read_heartbeat() is not None
        store.clear_heartbeat(pid=123, now=60)
        stopped = store.read_heartbeat()  # kept, marked stopped: health says when
        assert stopped is not None and stopped.stopped and stopped.ts == 60


def test_remove_and_forget(tmp_path: Path, workspace: Path) -> None:
    with StateStore.open(tmp_path / "s", workspace) as store:
        store.upsert_agents([record("a"), record("b")])
        store.record_compaction(entry("a", 1.0))
        store.record_compaction(entry("b", 1.0))
        store.remove_agent("a")
        assert store.get_agent("a") is None and len(store.history("a")) == 1
        assert store.forget_agent("b") == 2
        assert store.get_agent("b") is None and store.history("b") == []
        assert [r.agent for r in store.agents()] == []


def test_ledger_is_pruned_per_agent(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memd.state, "LEDGER_KEEP_PER_AGENT", 5)
    with StateStore.open(tmp_path / "s", workspace) as store:
        store.record_compaction(entry("other", 0.0))
        for i in range(12):
            store.record_compaction(entry("a", float(i)))
        assert [h.started_at for h in store.history("a", limit=100)] == [
            11.0,
            10.0,
            9.0,
            8.0,
            7.0,
        ]
        assert len(store.history("other")) == 1


def test_private_modes_and_wal(tmp_path: Path, workspace: Path) -> None:
    state_dir = tmp_path / "state"
    with StateStore.open(state_dir, workspace) as store:
        store.upsert_agents([record("a")])
        assert store.path is not None
        assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
        mode = sqlite3.connect(store.path).execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"


def test_garbage_db_is_moved_aside_and_rebuilt(tmp_path: Path, workspace: Path) -> None:
    state_dir = tmp_path / "state"
    with StateStore.open(state_dir, workspace) as store:
        store.upsert_agents([record("a")])
        path = store.path
    assert path is not None
    garbage = os.urandom(8192)
    path.write_bytes(garbage)
    with StateStore.open(state_dir, workspace) as store:
        assert store.path == path
        assert len(store.warnings) == 1 and "corrupt" in store.warnings[0]
        assert store.agents() == []  # rebuilt empty, and usable
        store.upsert_agents([record("b")])
        assert [r.agent for r in store.agents()] == ["b"]
    aside = sorted(state_dir.glob(f"{path.name}.corrupt-*"))
    assert [p.name for p in aside if not p.name.endswith(("-wal", "-shm"))] != []
    kept = next(p for p in aside if not p.name.endswith(("-wal", "-shm")))
    assert kept.read_bytes() == garbage  # kept for inspection, not deleted


def test_damaged_pages_are_detected(tmp_path: Path, workspace: Path) -> None:
    # A valid SQLite header with garbage after it passes "is it a database" but
    # not the integrity check.
    state_dir = tmp_path / "state"
    with StateStore.open(state_dir, workspace) as store:
        store.upsert_agents([record(f"agent{i}") for i in range(300)])
        path = store.path
    assert path is not None
    data = bytearray(path.read_bytes())
    assert len(data) > 8192
    data[4096:] = b"\xff" * (len(data) - 4096)
    path.write_bytes(bytes(data))
    with StateStore.open(state_dir, workspace) as store:
        assert store.warnings and "corrupt" in store.warnings[0]
        assert store.agents() == []


@pytest.mark.parametrize("version", [0, -3, "'abc'", "x'07'", 7.5])
def test_a_schema_version_no_memd_wrote_is_rebuilt(
    tmp_path: Path, workspace: Path, version: object
) -> None:
    # Older than any memd's, or not a number: a damaged DB, moved aside as before
    # (only a number above SCHEMA_VERSION means a newer memd's, see below).
    path = state_db_path(tmp_path, workspace)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute(f"INSERT INTO schema_version VALUES ({version})")
    conn.commit()
    conn.close()
    with StateStore.open(tmp_path, workspace) as store:
        assert "schema version" in store.warnings[0] and "corrupt" in store.warnings[0]
        store.upsert_agents([record("a")])
    assert len(memd.state.corrupt_copies(path)) == 1


def test_unusable_state_dir_falls_back_to_memory(tmp_path: Path, workspace: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with StateStore.open(blocker, workspace) as store:
        assert store.path is None
        assert "in-memory" in store.warnings[0]
        store.upsert_agents([record("a")])
        assert store.get_agent("a") == record("a")


@pytest.mark.parametrize("command", [("status",), ("history", "a"), ("health",), ("doctor",)])
def test_an_unusable_state_dir_is_one_warning_line(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """review16e F3: open() both logged the warning and returned it for the CLI to
    print, so every command said it twice, once as a bare unprefixed line."""
    ws = tmp_path / "ws"
    (ws / "agents" / "a").mkdir(parents=True)
    (ws / "agents" / "a" / "MEMORY.md").write_text("### Human — 2026-01-01 00:00:00\nhi\n\n")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    offline = ["--offline"] if command == ("doctor",) else []
    args = [*command, "--workspace", str(ws), "--state-dir", str(blocker / "state"), *offline]
    proc = subprocess.run(
        [sys.executable, "-m", "memd", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in proc.stderr
    said = [line for line in proc.stderr.splitlines() if "not a folder" in line]
    if command == ("doctor",):
        # doctor says it as its own `fail state dir` line, on stdout
        assert said == [] and "fail state dir:" in proc.stdout, proc
        return
    # A state dir under a file is bad input: refused in one line (it fell back to
    # an in-memory state DB a daemon's status never sees; tests/cli/test_state_dir_file.py).
    assert proc.returncode == 2 and proc.stderr.splitlines() == said, proc.stderr
    assert len(said) == 1 and said[0].startswith("memd: error: state dir "), proc.stderr


def test_threads_share_one_store(tmp_path: Path, workspace: Path) -> None:
    with StateStore.open(tmp_path / "s", workspace) as store:

        def work(n: int) -> None:
            for i in range(50):
                store.record_compaction(entry(f"t{n}", float(i)))
                store.upsert_agents([record(f"t{n}", tokens=i)])
                store.agents()

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(len(store.history(f"t{n}", limit=1000)) for n in range(4)) == 200
        assert {r.tokens for r in store.agents()} == {49}


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from memd.state import AgentRecord, StateStore
    state_dir, workspace, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    store = StateStore.open(state_dir, workspace)
    print("ready", flush=True)
    for i in range(1, rounds + 1):
        store.upsert_agents(
            AgentRecord(f"agent{n}", 1, n, i, i, i, i, 10_000, time.time()) for n in range(20)
        )
        store.write_heartbeat(pid=1, started_at=0.0, healthy=True, detail="", agents=20, ts=i)
    store.close()
    """
)


def test_concurrent_writer_and_reader_processes(tmp_path: Path, workspace: Path) -> None:
    state_dir = tmp_path / "state"
    rounds = 300
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(state_dir), str(workspace), str(rounds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "ready"
    seen: list[int] = []
    with StateStore.open(state_dir, workspace) as reader:
        deadline = time.monotonic() + 60
        while writer.poll() is None and time.monotonic() < deadline:
            records = reader.agents()
            if records:
                # Each upsert is one transaction: a reader never sees a half-written round.
                assert len(records) == 20
                assert len({r.tokens for r in records}) == 1
                seen.append(records[0].tokens)
            reader.read_heartbeat()
        assert writer.wait(timeout=60) == 0
        final = reader.agents()
    assert seen == sorted(seen)  # never goes backwards
    assert len(set(seen)) > 1  # really read while the writer was writing
    assert {r.tokens for r in final} == {rounds}


OPENER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memd.state import StateStore
    store = StateStore.open(Path(sys.argv[1]), Path(sys.argv[2]))
    store.agents()
    print(len(store.warnings))
    """
)


def test_two_processes_rebuild_a_corrupt_db_once(tmp_path: Path, workspace: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    path = state_db_path(state_dir, workspace)
    path.write_bytes(b"this is not sqlite" * 500)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(state_dir), str(workspace)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    warnings = sorted(int(p.communicate(timeout=60)[0]) for p in procs)
    assert warnings == [0, 0, 1]  # exactly one of them rebuilt it
    assert len([p for p in state_dir.iterdir() if ".corrupt-" in p.name]) == 1


def test_corruption_while_open_is_rebuilt(tmp_path: Path, workspace: Path) -> None:
    store = StateStore.open(tmp_path / "s", workspace)
    store.upsert_agents([record(f"a{i}") for i in range(200)])
    assert store.path is not None
    size = store.path.stat().st_size
    with store.path.open("r+b") as handle:  # damaged in place, same inode
        handle.write(os.urandom(size))
    for suffix in ("-wal", "-shm"):
        companion = Path(f"{store.path}{suffix}")
        if companion.exists():
            companion.write_bytes(os.urandom(companion.stat().st_size))
    assert store.agents() == []  # noticed, moved aside, rebuilt: no exception
    assert "corrupt" in store.warnings[-1]
    store.upsert_agents([record("z")])
    assert [r.agent for r in store.agents()] == ["z"]
    store.close()


def test_follows_a_rebuild_by_another_process(tmp_path: Path, workspace: Path) -> None:
    daemon = StateStore.open(tmp_path / "s", workspace)
    daemon.upsert_agents([record("a")])
    path = daemon.path
    assert path is not None
    # Another process finds the file corrupt, moves it aside and rebuilds it.
    path.rename(path.with_name("moved-away"))
    with StateStore.open(tmp_path / "s", workspace) as cli:
        assert cli.agents() == []
        # The long-running handle now writes where readers look.
        daemon.upsert_agents([record("b")])
        assert [r.agent for r in cli.agents()] == ["b"]
    # Even a deleted DB file is recreated on the next write.
    path.unlink()
    daemon.write_heartbeat(pid=1, started_at=0, healthy=True, detail="", agents=0, ts=1)
    with StateStore.open(tmp_path / "s", workspace) as cli:
        assert cli.read_heartbeat() is not None
    daemon.close()


def test_a_record_maps_to_and_from_the_counter_and_the_job(tmp_path: Path) -> None:
    from memd.core.jobs import AgentJob, JobState
    from memd.counting import count_file
    from memd.tokenizer import TokenCounter

    memory = tmp_path / "MEMORY.md"
    memory.write_text("### Human — 2026-01-01T00:00:00\n\nhello there\n\n---\n\n" * 50)
    tracked, _ = count_file(memory, None, TokenCounter("cl100k_base").count_bytes)
    job = AgentJob(state=JobState.BACKOFF, consecutive_failures=2, last_error="boom")
    row = AgentRecord.of(
        "a", tracked, job, threshold_tokens=900, count_error=None, encoding="cl100k_base", now=5.0
    )
    assert (row.tokens, row.state, row.last_error, row.consecutive_failures) == (
        tracked.tokens,
        "error",  # the stored spelling of a backoff
        "boom",
        2,
    )
    assert row.to_tracked(tracked.size) == tracked  # same size: the whole count, mtime kept
    assert row.to_tracked(tracked.size + 10).mtime_ns == 0  # grew: re-verified when extended
    failed = AgentRecord.of(
        "a", None, AgentJob(), threshold_tokens=900, count_error="EACCES", encoding="x", now=5.0
    )
    assert (failed.tokens, failed.state, failed.last_error) == (0, "error", "EACCES")


# The agents table exactly as schema 2 (memd before archive figures) created it.
_SCHEMA_2_AGENTS = """
CREATE TABLE agents (
    agent TEXT PRIMARY KEY, dev INTEGER NOT NULL, ino INTEGER NOT NULL,
    size INTEGER NOT NULL, safe_offset INTEGER NOT NULL, safe_tokens INTEGER NOT NULL,
    tokens INTEGER NOT NULL, threshold_tokens INTEGER NOT NULL, updated_at REAL NOT NULL,
    state TEXT NOT NULL, last_error TEXT, last_compaction_at REAL,
    consecutive_failures INTEGER NOT NULL, next_attempt_at REAL,
    mtime_ns INTEGER NOT NULL DEFAULT 0, encoding TEXT NOT NULL DEFAULT '',
    window_start INTEGER NOT NULL DEFAULT 0, window_digest BLOB
)"""


def _write_schema_2_db(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (2)")
    conn.execute(_SCHEMA_2_AGENTS)
    conn.execute(
        "CREATE TABLE ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, agent TEXT NOT NULL,"
        " started_at REAL NOT NULL, duration_s REAL NOT NULL, archive TEXT,"
        " tokens_before INTEGER, tokens_after INTEGER, model TEXT, cost_usd REAL,"
        " error TEXT, trigger TEXT NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE heartbeat (id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER NOT NULL,"
        " started_at REAL NOT NULL, healthy INTEGER NOT NULL, detail TEXT NOT NULL,"
        " agents INTEGER NOT NULL, ts REAL NOT NULL)"
    )
    conn.execute(
        "INSERT INTO agents VALUES ('alpha',1,2,400,300,80,100,1000,1700000000.5,"
        "'breaker_open','boom',5.0,3,99.5,123456789,'cl100k_base',10,x'0102')"
    )
    conn.execute(
        "INSERT INTO ledger (agent, started_at, duration_s, archive, tokens_before,"
        " tokens_after, model, cost_usd, error, trigger)"
        " VALUES ('alpha', 10.0, 1.25, 'history_10.md', 5000, 700, 'builtin', 0.0012, NULL,"
        " 'daemon')"
    )
    conn.execute("INSERT INTO heartbeat VALUES (1, 123, 1.0, 1, 'ok', 1, 50.0)")
    conn.commit()
    conn.close()


def test_a_schema_2_db_is_upgraded_with_its_rows(tmp_path: Path, workspace: Path) -> None:
    state_dir = tmp_path / "s"
    _write_schema_2_db(state_db_path(state_dir, workspace))
    with StateStore.open(state_dir, workspace) as store:
        assert store.warnings == []  # upgraded, not moved aside as corrupt
        alpha = store.get_agent("alpha")
        assert alpha == record(
            "alpha",
            state="breaker_open",
            last_error="boom",
            last_compaction_at=5.0,
            consecutive_failures=3,
            next_attempt_at=99.5,
            mtime_ns=123456789,
            encoding="cl100k_base",
            window_start=10,
            window_digest=b"\x01\x02",
        )
        # Figures schema 2 did not have: "not surveyed yet", never a made-up zero.
        assert alpha.archives is None and alpha.archive_stats is None
        assert (alpha.window_source, alpha.reserved_tokens, alpha.estimated) == ("", 0, False)
        assert [h.archive for h in store.history("alpha")] == ["history_10.md"]
        beat = store.read_heartbeat()
        assert beat is not None and beat.pid == 123
        # And the new columns take writes after the upgrade.
        store.upsert_agents(
            [
                record(
                    "alpha",
                    archives=3,
                    archive_bytes=4096,
                    archive_mtime_ns=7,
                    window_source="memd-agent.json",
                    reserved_tokens=250,
                    estimated=True,
                )
            ]
        )
    with StateStore.open(state_dir, workspace) as store:
        again = store.get_agent("alpha")
        assert again is not None and again.estimated is True
        assert again.archive_stats is not None and again.archive_stats.count == 3
        assert (again.archive_bytes, again.window_source, again.reserved_tokens) == (
            4096,
            "memd-agent.json",
            250,
        )
    conn = sqlite3.connect(state_db_path(state_dir, workspace))
    assert conn.execute("SELECT version FROM schema_version").fetchone() == (
        memd.state.SCHEMA_VERSION,
    )
    conn.close()


def _write_schema_3_db(path: Path) -> None:
    """What memd with schema 3 (before erasure tombstones) left: schema 2 plus its
    upgrade step, with a row using the columns 3 added and a cached count."""
    _write_schema_2_db(path)
    conn = sqlite3.connect(path)
    for statement in memd.state._MIGRATIONS[2]:
        conn.execute(statement)
    conn.execute(
        "CREATE TABLE file_counts (agent TEXT PRIMARY KEY, dev INTEGER NOT NULL,"
        " ino INTEGER NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,"
        " encoding TEXT NOT NULL, tokens INTEGER NOT NULL)"
    )
    conn.execute("INSERT INTO file_counts VALUES ('alpha', 1, 2, 400, 7, 'cl100k_base', 100)")
    conn.execute("UPDATE agents SET archives = 3, archive_bytes = 4096")
    conn.execute("UPDATE schema_version SET version = 3")
    conn.commit()
    conn.close()


def test_a_schema_3_db_is_upgraded_with_its_rows_and_takes_tombstones(
    tmp_path: Path, workspace: Path
) -> None:
    state_dir = tmp_path / "s"
    _write_schema_3_db(state_db_path(state_dir, workspace))
    with StateStore.open(state_dir, workspace) as store:
        assert store.warnings == []  # upgraded, not moved aside as corrupt
        alpha = store.get_agent("alpha")
        assert alpha is not None and alpha.last_error == "boom" and alpha.archives == 3
        assert [h.archive for h in store.history("alpha")] == ["history_10.md"]
        key = memd.state.FileKey(1, 2, 400, 7, "cl100k_base")
        assert store.cached_count("alpha", key) == 100
        # The new tables work on the upgraded file.
        assert store.forget_agent("alpha", erased_at_ns=10) == 2
        assert store.tombstoned(["alpha", "beta"]).keys() == {"alpha"}
    conn = sqlite3.connect(state_db_path(state_dir, workspace))
    assert conn.execute("SELECT version FROM schema_version").fetchone() == (
        memd.state.SCHEMA_VERSION,
    )
    conn.close()
    assert not list(state_dir.glob("*.corrupt-*"))


def test_tombstone_keeps_an_erased_agent_out_until_lifted(tmp_path: Path, workspace: Path) -> None:
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("gone"), record("kept")])
        store.record_compaction(entry("gone", 1.0))
        assert store.forget_agent("gone", erased_at_ns=123, survivor=(4, 5)) == 2
        stone = store.tombstoned(["gone", "kept"])["gone"]
        assert (stone.erased_at_ns, stone.survivor_dev, stone.survivor_ino) == (123, 4, 5)
        assert stone.key == store.key_of("gone") and "gone" not in stone.key
        # A daemon's stale writes are dropped; the other agent's go through.
        store.upsert_agents([record("gone", tokens=5), record("kept", tokens=6)])
        store.record_compaction(entry("gone", 2.0))
        store.save_counts([("gone", memd.state.FileKey(1, 2, 3, 4, "e"), 9)])
        assert store.get_agent("gone") is None and store.history("gone") == []
        assert store.cached_count("gone", memd.state.FileKey(1, 2, 3, 4, "e")) is None
        assert store.get_agent("kept") == record("kept", tokens=6)
        # A stale lift (an older erasure) does not end a newer one.
        assert not store.lift_tombstone(memd.state.Tombstone(stone.key, 1))
        assert store.lift_tombstone(stone)
        store.upsert_agents([record("gone", tokens=5)])
        assert store.get_agent("gone") == record("gone", tokens=5)


def test_an_upsert_updates_the_row_in_place(tmp_path: Path, workspace: Path) -> None:
    # The live flush rewrites counted rows several times a second: updated where
    # they are (INSERT OR REPLACE deleted and re-inserted each under a new rowid,
    # rewriting about twice the pages), every column replaced all the same.
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("a", window_digest=b"d" * 16, archives=3), record("b")])
        conn = store._conn
        before = dict(conn.execute("SELECT agent, rowid FROM agents").fetchall())
        changed = record("a", tokens=7, last_error="x", window_digest=None, archives=None)
        store.upsert_agents([changed])
        after = dict(conn.execute("SELECT agent, rowid FROM agents").fetchall())
        assert after == before
        assert store.get_agent("a") == changed


def test_forget_leaves_no_trace_in_the_db_file_or_wal(tmp_path: Path, workspace: Path) -> None:
    planted = "PLANTED-7c1e-secret"
    with StateStore.open(tmp_path, workspace) as store:
        for i in range(40):  # many versions of the row: upserts leave old cells behind
            store.upsert_agents([record("erasable-agent", tokens=i, last_error=f"{planted} {i}")])
            store.upsert_agents([record(f"other{i}")])
            store.record_compaction(entry("erasable-agent", float(i), error=f"{planted} {i}"))
        path = store.path
        assert path is not None
        # Another connection reading (a `memd status`) does not stop the scrub.
        with StateStore.open(tmp_path, workspace) as reader:
            assert reader.get_agent("erasable-agent") is not None
            store.forget_agent("erasable-agent", erased_at_ns=1)
        raw = path.read_bytes() + Path(f"{path}-wal").read_bytes()
        assert b"erasable-agent" not in raw and planted.encode() not in raw
        assert len(store.agents()) == 40  # the others are all there


def test_corrupt_copies_lose_the_agent_or_go(tmp_path: Path, workspace: Path) -> None:
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("victim", last_error="PLANTED"), record("bystander")])
        path = store.path
        assert path is not None
    readable = path.with_name(f"{path.name}.corrupt-20260101-000000")
    readable.write_bytes(path.read_bytes())
    broken = path.with_name(f"{path.name}.corrupt-20260101-000001")
    broken.write_bytes(b"\x00garbage victim PLANTED" * 100)
    Path(f"{broken}-wal").write_bytes(b"victim")
    untouched = path.with_name(f"{path.name}.corrupt-20260101-000002")
    untouched.write_bytes(b"\x00garbage" * 100)
    assert memd.state.erase_from_corrupt_copies(path, "victim") == (1, 2)
    assert not broken.exists() and not Path(f"{broken}-wal").exists()
    assert not untouched.exists()  # cannot be cleaned (not a DB): deleted too
    assert b"victim" not in readable.read_bytes() and b"PLANTED" not in readable.read_bytes()
    conn = sqlite3.connect(readable)
    assert conn.execute("SELECT agent FROM agents").fetchall() == [("bystander",)]
    conn.close()


def test_a_schema_4_db_with_rows_gets_the_new_ledger_columns(
    tmp_path: Path, workspace: Path
) -> None:
    state_dir = tmp_path / "s"
    path = state_db_path(state_dir, workspace)
    _write_schema_3_db(path)
    # What a schema-4 memd left: schema 3 plus its own step, and a row it wrote.
    conn = sqlite3.connect(path)
    for statement in memd.state._MIGRATIONS[3]:
        conn.execute(statement)
    conn.execute("UPDATE schema_version SET version = 4")
    conn.execute(
        "INSERT INTO ledger (agent, started_at, duration_s, archive, tokens_before,"
        " tokens_after, model, cost_usd, error, trigger) VALUES ('alpha', 20.0, 2.5,"
        " 'history_20.md', 30000, 1619, 'openai/gpt-4o-mini', 0.002, NULL, 'daemon')"
    )
    conn.commit()
    conn.close()
    with StateStore.open(state_dir, workspace) as store:
        assert store.warnings == []  # migrated, not moved aside as corrupt
        newest, oldest = store.history("alpha")
        assert (newest.archive, newest.tokens_before, newest.tokens_after) == (
            "history_20.md",
            30000,
            1619,
        )
        assert oldest.archive == "history_10.md"
        alpha = store.get_agent("alpha")
        assert alpha is not None and alpha.archives == 3
        # Columns an old row never had read as unknown, not as zero.
        assert newest.tokens_produced is None and newest.tokens_appended is None
        assert newest.fallback is False and newest.pinned is None and newest.calls is None
        assert store.spending_since(15.0) == [(20.0, 0, 0.002)]  # builtin rows cost nothing
        # The new columns and table take writes on the migrated file.
        new = LedgerEntry(
            "alpha", 30.0, 1.0, "history_30.md", 6000, 900, "builtin", 0.0, None,
            "daemon", tokens_produced=800, tokens_appended=100, fallback=True, pinned=12,
            evicted=3, calls=1,
        )  # fmt: skip
        store.record_compaction(new)
        assert store.history("alpha")[0] == new
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchone() == (
        memd.state.SCHEMA_VERSION,
    )
    conn.close()
    with StateStore.open(state_dir, workspace) as store:  # the fast path: nothing to do
        assert store.warnings == [] and len(store.history("alpha")) == 3


@pytest.mark.parametrize("version", [memd.state.SCHEMA_VERSION + 2, 8, 1000])
def test_a_newer_schema_is_refused_and_left_as_it_is(
    tmp_path: Path, workspace: Path, version: int
) -> None:
    # A newer memd's DB (an older memd's `status` beside a newer daemon, a
    # downgrade): one line naming the file and both versions; never moved aside
    # or rebuilt, which would lose the ledger, spending and erasures of the newer
    # memd (review 13b, R6). 8 counts as newer unless it is the dev layout.
    path = state_db_path(tmp_path, workspace)
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("a")])
        store.record_compaction(entry("a", 1.0))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = ?", (version,))
    conn.execute("ALTER TABLE ledger ADD COLUMN something_new TEXT")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    for _ in range(2):
        with pytest.raises(memd.state.NewerStateDB) as raised:
            StateStore.open(tmp_path, workspace)
        assert str(raised.value) == (
            f"state DB {path} is schema {version}, written by a newer memd;"
            f" this memd reads up to {memd.state.SCHEMA_VERSION}"
        )
        assert raised.value.exit_code != 0
    assert path.read_bytes() == before and memd.state.corrupt_copies(path) == []
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM ledger").fetchone() == (1,)
    conn.close()


def test_a_running_store_whose_file_turns_newer_refuses_without_a_rebuild(
    tmp_path: Path, workspace: Path
) -> None:
    # The daemon follows its path to a new file (another process replaced it):
    # a newer memd's is refused at each use, never moved aside.
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("a")])
        path = store.path
        assert path is not None
        newer = tmp_path / "newer.sqlite3"
        conn = sqlite3.connect(newer)
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (42)")
        conn.commit()
        conn.close()
        moved = memd.state._move_aside(path)  # with its WAL, as a rebuild does
        newer.rename(path)
        for _ in range(2):
            with pytest.raises(memd.state.StateError, match="is schema 42, written by a newer"):
                store.get_agent("a")
        assert memd.state.corrupt_copies(path) == [moved]
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(42,)]
        conn.close()


def test_spending_record_round_trip(tmp_path: Path, workspace: Path) -> None:
    from memd.state import SpendingRecord

    with StateStore.open(tmp_path, workspace) as store:
        assert store.read_spending() is None
        record = SpendingRecord(12, 0.5, "summarizer.max_calls_per_hour (12)", 1_700_003_600.0, 1.0)
        store.write_spending(record)
        assert store.read_spending() == record


def test_every_table_naming_an_agent_is_cleared_by_forget(tmp_path: Path, workspace: Path) -> None:
    # A table added later with an `agent` column must join the erasure, or
    # `memd forget` would leave the agent's rows (and name) behind.
    with StateStore.open(tmp_path, workspace) as store:
        assert store.path is not None
        conn = sqlite3.connect(store.path)
        tables = [
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        with_agent = {
            table
            for table in tables
            if any(col[1] == "agent" for col in conn.execute(f"PRAGMA table_info({table})"))
        }
        conn.close()
    assert with_agent == set(memd.state._AGENT_TABLES)


def _write_schema_5_db(path: Path) -> None:
    """What memd with schema 5 (before encrypted-archive counts) left: schema 3 plus
    the steps to 4 and 5, and a surveyed row."""
    _write_schema_3_db(path)
    conn = sqlite3.connect(path)
    for version in (3, 4):
        for statement in memd.state._MIGRATIONS[version]:
            conn.execute(statement)
    conn.execute(
        "UPDATE agents SET archive_mtime_ns = 9, window_source = '[trigger]', estimated = 1"
    )
    conn.execute("UPDATE schema_version SET version = 5")
    conn.commit()
    conn.close()


def test_a_schema_5_db_is_upgraded_with_its_rows(tmp_path: Path, workspace: Path) -> None:
    state_dir = tmp_path / "s"
    _write_schema_5_db(state_db_path(state_dir, workspace))
    with StateStore.open(state_dir, workspace) as store:
        assert store.warnings == []
        alpha = store.get_agent("alpha")
        assert alpha is not None and alpha.last_error == "boom"
        assert (alpha.archives, alpha.archive_bytes, alpha.window_source) == (3, 4096, "[trigger]")
        assert alpha.estimated is True and alpha.encrypted_archives == 0
        stats = alpha.archive_stats
        assert stats is not None and (stats.count, stats.mtime_ns, stats.encrypted) == (3, 9, 0)
        # The new column takes writes, and status reads it.
        store.upsert_agents([alpha._replace(encrypted_archives=2)])
        assert store.fleet_rows("name", None)[0].encrypted_archives == 2
        assert store.get_agent("alpha") == alpha._replace(encrypted_archives=2)


def _write_schema_6_db(path: Path) -> None:
    """What memd with schema 6 (before the agent folder's facts) left: schema 5 plus
    its step to 6, the row encrypted-archive counts and all."""
    _write_schema_5_db(path)
    conn = sqlite3.connect(path)
    for statement in memd.state._MIGRATIONS[5]:
        conn.execute(statement)
    conn.execute("UPDATE agents SET encrypted_archives = 1")
    conn.execute("UPDATE schema_version SET version = 6")
    conn.commit()
    conn.close()


def test_a_schema_6_db_is_upgraded_and_its_agents_folders_are_unknown(
    tmp_path: Path, workspace: Path
) -> None:
    from memd.workspace import FolderFacts

    state_dir = tmp_path / "s"
    _write_schema_6_db(state_db_path(state_dir, workspace))
    with StateStore.open(state_dir, workspace) as store:
        assert store.warnings == []
        alpha = store.get_agent("alpha")
        assert alpha is not None and alpha.last_error == "boom"
        assert (alpha.archives, alpha.encrypted_archives, alpha.estimated) == (3, 1, True)
        assert alpha.folder is None  # never listed by a memd that stored it: list it
        # The new columns take writes and read back as the facts written.
        facts = FolderFacts(ino=77, ctime_ns=1_700_000_000_000_000_000, entries=3)
        store.upsert_agents([alpha._replace(folder_ino=77,
                                                 folder_ctime_ns=facts.ctime_ns,
                                                 folder_entries=3)])  # fmt: skip
        again = store.get_agent("alpha")
        assert again is not None and again.folder == facts
        assert facts.has_private and facts.has_descriptor
    conn = sqlite3.connect(state_db_path(state_dir, workspace))
    assert conn.execute("SELECT version FROM schema_version").fetchone() == (
        memd.state.SCHEMA_VERSION,
    )
    conn.close()


def _write_schema_7_db(path: Path) -> None:
    """What memd with schema 7 (before the count's marks) left: schema 6 plus its
    step to 7, the row's folder facts and all."""
    _write_schema_6_db(path)
    conn = sqlite3.connect(path)
    for statement in memd.state._MIGRATIONS[6]:
        conn.execute(statement)
    conn.execute("UPDATE agents SET folder_ino = 77, folder_ctime_ns = 5, folder_entries = 3")
    conn.execute("UPDATE schema_version SET version = 7")
    conn.commit()
    conn.close()


def test_a_schema_7_db_an_older_memd_wrote_opens_with_its_rows_and_takes_marks(
    tmp_path: Path, workspace: Path
) -> None:
    state_dir = tmp_path / "s"
    path = state_db_path(state_dir, workspace)
    _write_schema_7_db(path)  # what memd 49457fa (the last release) leaves
    with StateStore.open(state_dir, workspace) as store:
        assert store.warnings == []
        alpha = store.get_agent("alpha")
        assert alpha is not None and alpha.last_error == "boom"
        assert (alpha.folder_ino, alpha.folder_entries) == (77, 3)
        assert alpha.marks == () and alpha.to_tracked(alpha.size).marks == ()
        assert len(store.history("alpha")) == 1
        # The side table is added: it takes the marks of a count and gives them back.
        store.upsert_agents([alpha._replace(estimated=False, marks=(10, 3, 250, 70))])
        again = store.get_agent("alpha")
        assert again is not None and again.to_tracked(again.size).marks == (10, 3, 250, 70)
    assert _version_and_agent_columns(path) == (7, SCHEMA_7_AGENT_COLUMNS)
    conn = sqlite3.connect(path)
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert set(memd.state._ADDED_OBJECTS) <= names


# The agents table's columns at schema 7, frozen: what memd 49457fa (the last
# release) and every older memd of schema 7 read and write by name. A change here
# breaks them (a column dropped or renamed) or needs a SCHEMA_VERSION bump, with a
# migration, and never the number 8 (a dev build's; see memd.state).
SCHEMA_7_AGENT_COLUMNS = [
    "agent", "dev", "ino", "size", "safe_offset", "safe_tokens", "tokens",
    "threshold_tokens", "updated_at", "state", "last_error", "last_compaction_at",
    "consecutive_failures", "next_attempt_at", "mtime_ns", "encoding", "window_start",
    "window_digest", "archives", "archive_bytes", "archive_mtime_ns", "window_source",
    "reserved_tokens", "estimated", "encrypted_archives", "folder_ino", "folder_ctime_ns",
    "folder_entries",
]  # fmt: skip


def _version_and_agent_columns(path: Path) -> tuple[int, list[str]]:
    conn = sqlite3.connect(path)
    try:
        (version,) = conn.execute("SELECT version FROM schema_version").fetchone()
        columns = [row[1] for row in conn.execute("PRAGMA table_info(agents)")]
    finally:
        conn.close()
    return version, columns


def test_a_db_this_memd_writes_is_schema_7_with_its_agents_columns(
    tmp_path: Path, workspace: Path
) -> None:
    # An older memd (schema 7) checks the version and reads agents by column name:
    # a DB written here, marks and all, must open there untouched (review 13b, R6).
    assert memd.state.SCHEMA_VERSION == 7
    assert list(memd.state.AGENT_COLUMNS) == SCHEMA_7_AGENT_COLUMNS
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("a", marks=(10, 3, 250, 70))])
        path = store.path
        assert path is not None
    assert _version_and_agent_columns(path) == (7, SCHEMA_7_AGENT_COLUMNS)
    # And one made fresh from _SCHEMA alone (no migration) is the same.
    conn = sqlite3.connect(":memory:")
    for statement in memd.state._SCHEMA.split(";"):
        conn.execute(statement)
    assert [row[1] for row in conn.execute("PRAGMA table_info(agents)")] == SCHEMA_7_AGENT_COLUMNS
    conn.close()


def test_what_an_older_memd_does_to_an_agents_row_drops_its_marks(
    tmp_path: Path, workspace: Path
) -> None:
    # An older memd writes rows with INSERT OR REPLACE and knows nothing of
    # count_marks: the marks of a count it replaced (or of an agent it forgot) go
    # with the row, never to be read beside another count.
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("a", marks=(10, 3, 250, 70)), record("b", marks=(5, 1))])
        path = store.path
        assert path is not None
        conn = sqlite3.connect(path)
        conn.execute(
            "INSERT OR REPLACE INTO agents (agent, dev, ino, size, safe_offset, safe_tokens,"
            " tokens, threshold_tokens, updated_at, state, consecutive_failures)"
            " VALUES ('a', 1, 2, 900, 800, 200, 210, 1000, 5.0, 'idle', 0)"
        )
        conn.execute("DELETE FROM agents WHERE agent = 'b'")  # an older `forget`
        conn.commit()
        assert conn.execute("SELECT count(*) FROM count_marks").fetchone() == (0,)
        conn.close()
        a = store.get_agent("a")
        assert a is not None and a.tokens == 210 and a.marks == ()


def _write_dev_schema_8_db(path: Path) -> None:
    """What a dev build of 48ea21b left: schema 7 plus agents.marks (raw int64 pairs)."""
    _write_schema_7_db(path)
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE agents ADD COLUMN marks BLOB")
    conn.execute(
        "UPDATE agents SET marks = ?, estimated = 0", (struct.pack("<4q", 10, 3, 250, 70),)
    )
    conn.execute(
        "INSERT INTO agents (agent, dev, ino, size, safe_offset, safe_tokens, tokens,"
        " threshold_tokens, updated_at, state, consecutive_failures, marks)"
        " VALUES ('beta', 1, 2, 400, 300, 80, 100, 1000, 5.0, 'idle', 0, 'not a blob')"
    )
    conn.execute("UPDATE schema_version SET version = 8")
    conn.commit()
    conn.close()


def test_a_dev_schema_8_db_is_brought_back_to_7_with_its_marks(
    tmp_path: Path, workspace: Path
) -> None:
    state_dir = tmp_path / "s"
    path = state_db_path(state_dir, workspace)
    _write_dev_schema_8_db(path)
    with StateStore.open(state_dir, workspace) as store:
        assert store.warnings == []
        alpha = store.get_agent("alpha")
        assert alpha is not None and alpha.last_error == "boom" and alpha.folder_entries == 3
        assert alpha.marks == (10, 3, 250, 70)  # copied over, in this format
        beta = store.get_agent("beta")
        assert beta is not None and beta.marks == ()  # not a blob: left behind
        assert len(store.history("alpha")) == 1
    assert _version_and_agent_columns(path) == (7, SCHEMA_7_AGENT_COLUMNS)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT agent, marks FROM count_marks").fetchall() == [
        ("alpha", b"\x01" + struct.pack("<4q", 10, 3, 250, 70))
    ]
    # The triggers are on the rebuilt table.
    conn.execute("DELETE FROM agents WHERE agent = 'alpha'")
    assert conn.execute("SELECT count(*) FROM count_marks").fetchone() == (0,)
    conn.close()


def test_a_dev_schema_8_db_whose_undo_fails_is_left_as_it_was(
    tmp_path: Path, workspace: Path
) -> None:
    # One transaction: a step that fails (here the rebuilt table's name is taken)
    # leaves schema 8, its agents.marks and no count_marks row.
    state_dir = tmp_path / "s"
    path = state_db_path(state_dir, workspace)
    _write_dev_schema_8_db(path)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE agents_7 (x)")
    conn.commit()
    conn.close()
    with StateStore.open(state_dir, workspace) as store:
        assert store.path is None  # fell back to memory, said so
        assert "agents_7" in store.warnings[0]
    assert _version_and_agent_columns(path) == (8, [*SCHEMA_7_AGENT_COLUMNS, "marks"])
    conn = sqlite3.connect(path)
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "count_marks" not in names
    assert conn.execute("SELECT count(*) FROM agents WHERE marks IS NOT NULL").fetchone() == (2,)
    conn.close()


def test_a_count_is_stored_with_its_marks_and_restored_with_them(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.memfiles import append_entry
    from support.tokens import CL100K

    from memd.core.jobs import AgentJob
    from memd.counting import count_file

    monkeypatch.setattr("memd.counting.MARK_MIN_TOKENS", 16)
    memory = tmp_path / "MEMORY.md"
    memory.write_bytes(b"")
    tracked = None
    for n in range(40):
        append_entry(memory, "Human", f"turn {n}: " + "some words " * 20)
        tracked, _kind = count_file(memory, tracked, CL100K.count_bytes, junction_cut=True)
    assert tracked is not None and len(tracked.marks) >= 8
    record = AgentRecord.of(
        "alpha", tracked, AgentJob(), threshold_tokens=1, count_error=None,
        encoding="cl100k_base", now=0.0,
    )  # fmt: skip
    with StateStore.open(tmp_path / "s", workspace) as store:
        store.upsert_agents([record])
        stored = store.get_agent("alpha")
    assert stored is not None
    restored = stored.to_tracked(memory.stat().st_size)
    assert restored.marks == tracked.marks and restored.tokens == tracked.tokens
    conn = sqlite3.connect(state_db_path(tmp_path / "s", workspace))
    (blob,) = conn.execute("SELECT marks FROM count_marks WHERE agent = 'alpha'").fetchone()
    conn.close()
    assert blob[0] == memd.state.MARKS_FORMAT == 1  # a versioned format
    assert memd.state.unpack_marks(blob) == tracked.marks


@pytest.mark.parametrize(
    "blob",
    [
        b"\x01" + struct.pack("<3q", 1, 2, 3),  # no whole pairs
        b"\x01",  # no pair at all
        b"\x02" + struct.pack("<2q", 10, 3),  # another format
        struct.pack("<2q", 10, 3),  # the dev build's raw pairs
        "0123456789abcdef0",  # SQLite keeps any type in any column
        17,
        1.5,
    ],
)
def test_marks_that_do_not_read_as_marks_are_none(
    tmp_path: Path, workspace: Path, blob: object
) -> None:
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("a", marks=(10, 3, 250, 70))])
        _set_marks(store, "a", blob)
        stored = store.get_agent("a")
        assert stored is not None and stored.marks == () and stored.tokens == 100
        assert [r.agent for r in store.agents()] == ["a"]


def test_marks_are_stored_as_written_but_not_those_of_an_estimated_count(
    tmp_path: Path, workspace: Path
) -> None:
    # The store keeps marks as a cache, as written: which ones fit their count is
    # decided where the count is restored (memd.counting.fitting_marks, tested in
    # tests/test_counting.py). An estimated count's marks are never read back.
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("a", marks=(10, 3, 250, 70))])
        stored = store.get_agent("a")
        assert stored is not None and stored.marks == (10, 3, 250, 70)
        store.upsert_agents([record("a", marks=(10, 3, 250, 70), estimated=True)])
        stored = store.get_agent("a")
        assert stored is not None and stored.marks == ()


def test_marks_stamped_with_another_file_are_not_restored(tmp_path: Path, workspace: Path) -> None:
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("a", marks=(10, 3, 250, 70))])
        assert store.path is not None
        conn = sqlite3.connect(store.path)
        conn.execute("UPDATE count_marks SET ino = 99")  # another inode's marks
        conn.commit()
        conn.close()
        stored = store.get_agent("a")
        assert stored is not None and stored.marks == ()


def _set_marks(store: StateStore, agent: str, value: object) -> None:
    assert store.path is not None
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE count_marks SET marks = ? WHERE agent = ?", (value, agent))
    conn.commit()
    conn.close()


def _count_marks_writes(path: Path) -> sqlite3.Connection:
    """A connection whose ``SELECT n FROM marks_writes`` counts count_marks' changes."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE marks_writes (n INTEGER)")
    conn.execute("INSERT INTO marks_writes VALUES (0)")
    for event in ("INSERT", "UPDATE", "DELETE"):
        conn.execute(
            f"CREATE TRIGGER marks_{event.lower()} AFTER {event} ON count_marks"
            " BEGIN UPDATE marks_writes SET n = n + 1; END"
        )
    conn.commit()
    return conn


def test_marks_are_written_only_when_they_change(tmp_path: Path, workspace: Path) -> None:
    # A live flush rewrites a growing file's row on every append; its marks only
    # change every 1/128 of its tokens: their row is written then, not each time.
    with StateStore.open(tmp_path, workspace) as store:
        assert store.path is not None
        watch = _count_marks_writes(store.path)
        marks = (10, 3, 250, 70)

        def writes() -> int:
            return int(watch.execute("SELECT n FROM marks_writes").fetchone()[0])

        store.upsert_agents([record("a", marks=marks), record("b")])
        assert writes() == 1
        for tokens in range(101, 120):  # appends: the same marks, object or equal copy
            same = marks if tokens % 2 else tuple(list(marks))
            store.upsert_agents([record("a", tokens=tokens, marks=same), record("b", tokens)])
        assert writes() == 1
        store.upsert_agents([record("a", marks=(*marks, 290, 78))])  # a mark added
        assert writes() == 2
        store.upsert_agents([record("a", ino=3, marks=(*marks, 290, 78))])  # another file
        assert writes() == 3
        store.upsert_agents([record("a", ino=3)])  # none now (a recount, estimated)
        assert writes() == 4
        store.upsert_agents([record("a", ino=3)])
        assert writes() == 4
        stored = store.get_agent("a")
        assert stored is not None and stored.marks == ()
        watch.close()


def test_a_store_reads_what_is_in_count_marks_before_skipping_a_write(
    tmp_path: Path, workspace: Path
) -> None:
    # "Unchanged" is judged against the table as it is: a new handle (a restart),
    # a row that does not decode, a file replaced under a running store.
    marks = (10, 3, 250, 70)
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("a", marks=marks), record("b", marks=marks)])
        _set_marks(store, "b", "garbage")
    with StateStore.open(tmp_path, workspace) as store:
        assert store.path is not None
        watch = _count_marks_writes(store.path)
        store.upsert_agents([record("a", marks=marks), record("b", marks=marks)])
        assert watch.execute("SELECT n FROM marks_writes").fetchone() == (1,)  # b's only
        watch.close()
        b = store.get_agent("b")
        assert b is not None and b.marks == marks
        # Replaced under the store (another process rebuilt it, a backup put back):
        # the store follows the path and writes the marks there.
        path = store.path
        copy = tmp_path / "copy.sqlite3"
        conn = sqlite3.connect(path)
        conn.execute("VACUUM INTO ?", (str(copy),))
        conn.execute("DELETE FROM count_marks")
        conn.commit()
        conn.close()
        conn = sqlite3.connect(copy)
        conn.execute("DELETE FROM count_marks")
        conn.commit()
        conn.close()
        copy.rename(path)
        store.upsert_agents([record("a", marks=marks)])
        a = store.get_agent("a")
        assert a is not None and a.marks == marks


def test_every_way_an_agent_row_goes_takes_its_marks(tmp_path: Path, workspace: Path) -> None:
    marks = (10, 3, 250, 70)
    with StateStore.open(tmp_path, workspace) as store:
        assert store.path is not None
        names = ["removed", "forgotten", "erased", "kept"]
        store.upsert_agents([record(name, marks=marks) for name in names])
        store.remove_agent("removed")  # its folder went
        store.forget_agent("forgotten")
        store.forget_agent("erased", erased_at_ns=1)  # `memd forget`: tombstoned
        conn = sqlite3.connect(store.path)
        assert conn.execute("SELECT agent FROM count_marks").fetchall() == [("kept",)]
        conn.close()
        # Back after each: the marks are written again, not taken as still there.
        store.lift_tombstone(next(iter(store.tombstones().values())))
        store.upsert_agents([record(name, marks=marks) for name in names])
        assert [r.marks for r in store.agents()] == [marks] * 4
    # A corrupt copy of the DB loses the agent's marks row with its other rows.
    path = state_db_path(tmp_path, workspace)
    copy = path.with_name(f"{path.name}.corrupt-20260101-000000")
    copy.write_bytes(path.read_bytes())
    assert memd.state.erase_from_corrupt_copies(path, "kept") == (1, 0)
    conn = sqlite3.connect(copy)
    assert ("kept",) not in conn.execute("SELECT agent FROM count_marks").fetchall()
    conn.close()


_WRONG_TYPES = [
    ("tokens", "'abc'"),
    ("safe_offset", "1.5"),
    ("dev", "NULL"),
    ("next_attempt_at", "'soon'"),
    ("last_compaction_at", "x'00'"),
    ("consecutive_failures", "'two'"),  # '2' would be stored as 2 (column affinity)
    ("state", "x'69646c65'"),
    ("window_digest", "'text'"),
    ("archives", "'many'"),
    ("estimated", "0.5"),
    ("encoding", "x'07'"),
]


@pytest.mark.parametrize(("column", "value"), _WRONG_TYPES)
def test_a_row_with_a_wrongly_typed_value_is_left_out_and_named(
    tmp_path: Path, workspace: Path, column: str, value: str
) -> None:
    # SQLite keeps any type in any column: a damaged or hand-edited row must not
    # reach the restore (review 13b, R3: a traceback before READY, every restart).
    with StateStore.open(tmp_path, workspace) as store:
        store.upsert_agents([record("bad", marks=(10, 3, 250, 70)), record("good")])
        assert store.path is not None
        conn = sqlite3.connect(store.path)
        if column == "dev":  # NOT NULL: a table an editor rebuilt without it
            conn.execute("PRAGMA writable_schema = ON")
            conn.execute(
                "UPDATE sqlite_master SET sql = replace(sql, 'dev INTEGER NOT NULL',"
                " 'dev INTEGER') WHERE name = 'agents'"
            )
            conn.commit()
            conn.close()
            conn = sqlite3.connect(store.path)
        conn.execute(f"UPDATE agents SET {column} = {value} WHERE agent = 'bad'")
        conn.commit()
        conn.close()
        store.close()
    with StateStore.open(tmp_path, workspace) as store:
        bad: list[memd.state.BadRow] = []
        assert [r.agent for r in store.agents(bad)] == ["good"]
        assert [(b.agent, b.column) for b in bad] == [("bad", column)]
        assert store.get_agent("bad") is None and store.get_agent("good") is not None
        # Written anew by the daemon, the row is whole again.
        store.upsert_agents([record("bad")])
        assert [r.agent for r in store.agents()] == ["bad", "good"]


def test_every_column_has_a_type_the_read_checks() -> None:
    assert set(memd.state._COLUMN_TYPES) == set(memd.state.AGENT_COLUMNS)
    for column, _value in _WRONG_TYPES:
        assert column in memd.state.AGENT_COLUMNS


# The first memd's state DB (6ee46b0, 2026-11-30): schema 1, before the restart
# checks of schema 2 (mtime, encoding, window) were added to ``agents``.
_SCHEMA_1 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE agents (
    agent TEXT PRIMARY KEY, dev INTEGER NOT NULL, ino INTEGER NOT NULL,
    size INTEGER NOT NULL, safe_offset INTEGER NOT NULL, safe_tokens INTEGER NOT NULL,
    tokens INTEGER NOT NULL, threshold_tokens INTEGER NOT NULL, updated_at REAL NOT NULL,
    state TEXT NOT NULL, last_error TEXT, last_compaction_at REAL,
    consecutive_failures INTEGER NOT NULL, next_attempt_at REAL
);
CREATE TABLE ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT, agent TEXT NOT NULL, started_at REAL NOT NULL,
    duration_s REAL NOT NULL, archive TEXT, tokens_before INTEGER, tokens_after INTEGER,
    model TEXT, cost_usd REAL, error TEXT, trigger TEXT NOT NULL
);
CREATE INDEX ledger_by_agent ON ledger (agent, id);
CREATE TABLE heartbeat (
    id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER NOT NULL, started_at REAL NOT NULL,
    healthy INTEGER NOT NULL, detail TEXT NOT NULL, agents INTEGER NOT NULL, ts REAL NOT NULL
);
INSERT INTO schema_version VALUES (1);
INSERT INTO agents VALUES ('alpha', 1, 2, 400, 300, 80, 100, 1000, 5.0, 'breaker_open',
    'boom', 5.0, 3, 99.5);
INSERT INTO ledger (agent, started_at, duration_s, archive, tokens_before, tokens_after,
    model, cost_usd, error, trigger) VALUES
    ('alpha', 1.0, 2.0, 'history_10.md', 900, 100, 'm', 0.01, NULL, 'daemon');
"""


def test_the_first_memds_schema_1_db_is_upgraded_with_its_rows(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    path = state_db_path(state_dir, workspace)
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_1)
    conn.close()
    with StateStore.open(state_dir, workspace) as store:
        # Its breaker state and compaction history kept, as for schema 2 to 6.
        assert store.warnings == []
        alpha = store.get_agent("alpha")
        assert alpha is not None and alpha.state == "breaker_open"
        assert [entry.archive for entry in store.history("alpha")] == ["history_10.md"]
    assert memd.state.corrupt_copies(path) == []
    assert os.path.exists(path)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["memd", "run", "--workspace", "/srv/agents"], True),
        (["/usr/local/bin/memd", "--log-level", "info", "run"], True),
        (["memd", "mcp", "--agent", "a"], False),  # memd, but not a daemon
        (["tail", "-f", "/var/log/memd.log"], False),  # a reused pid, say
        (["vim", "run", "/srv/memd/notes"], False),  # "run" before memd
    ],
)
def test_is_memd_daemon_reads_the_process_arguments(args: list[str], expected: bool) -> None:
    """review16g F3: the pointer's and the socket listener's pid count as a daemon only
    when the process is a `memd run` (a loose "memd" anywhere also took `memd mcp`)."""
    # The arguments after -c's script are what /proc shows for the shell.
    proc = subprocess.Popen(
        ["/bin/sh", "-c", "echo up; read x", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # exec'd
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[3:-1] == [a.encode() for a in args]
        assert memd.state.is_memd_daemon(proc.pid) is expected
    finally:
        proc.kill()
        proc.wait()
    assert memd.state.is_memd_daemon(proc.pid) is False  # gone


def test_the_last_reload_is_kept_and_read_back(tmp_path: Path, workspace: Path) -> None:
    from memd.state import ReloadOutcome

    with StateStore.open(tmp_path / "s", workspace) as store:
        assert store.read_last_reload() is None  # no reload yet
        refused = ReloadOutcome(41, 1_000, ok=False, errors=2)
        store.write_last_reload(refused)
        assert store.read_last_reload() == refused
        applied = ReloadOutcome(
            41, 2_000, ok=True, changed=("trigger",), audit_error="No space left on device"
        )
        store.write_last_reload(applied)  # replaces the one before
        assert store.read_last_reload() == applied
    # Another process (memd reload) reads what the daemon wrote.
    with StateStore.open(tmp_path / "s", workspace) as reader:
        assert reader.read_last_reload() == applied


def test_an_older_memds_db_has_no_last_reload_and_takes_one(
    tmp_path: Path, workspace: Path
) -> None:
    from memd.state import ReloadOutcome

    state_dir = tmp_path / "s"
    path = state_db_path(state_dir, workspace)
    _write_schema_7_db(path)  # what memd before the last reload record left
    with StateStore.open(state_dir, workspace) as store:
        assert store.read_last_reload() is None
        store.key_of("alpha")  # its erasure salt, in the same table
        store.write_last_reload(ReloadOutcome(7, 5, ok=True))
        assert store.read_last_reload() == ReloadOutcome(7, 5, ok=True)
    # Still schema 7: an older memd opens it and reads only its own key there.
    assert _version_and_agent_columns(path)[0] == 7
    conn = sqlite3.connect(path)
    keys = sorted(row[0] for row in conn.execute("SELECT key FROM state_meta"))
    conn.close()
    assert keys == ["erasure_salt", "last_reload"]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (b'{"format":2,"pid":7,"started_ns":5,"ok":true}', "written by a newer memd (format 2"),
        (b'{"format":1,"pid":"7","started_ns":5,"ok":true}', "not a format 1 record"),
        (b'{"format":1,"pid":7,"started_ns":5,"ok":1}', "not a format 1 record"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff\xfe", "not a JSON object"),
    ],
)
def test_a_last_reload_record_that_does_not_read_is_one_error_saying_why(
    tmp_path: Path, workspace: Path, value: bytes, said: str
) -> None:
    from memd.state import StateError

    with StateStore.open(tmp_path / "s", workspace) as store:
        conn = sqlite3.connect(state_db_path(tmp_path / "s", workspace))
        conn.execute("INSERT INTO state_meta VALUES ('last_reload', ?)", (value,))
        conn.commit()
        conn.close()
        with pytest.raises(StateError) as raised:
            store.read_last_reload()
    message = str(raised.value)
    assert "last reload record: " in message and said in message
    assert "\n" not in message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another uid")
def test_a_state_dir_another_uid_owns_or_may_write_in_is_refused(tmp_path: Path) -> None:
    """Review r9leak F2: a state dir another uid made first (a /tmp path) is not
    used: one line naming it and the fix, and no file is written in it."""
    from memd.errors import ConfigError

    shared = tmp_path / "tmp"  # a /tmp: anyone makes folders there
    shared.mkdir()
    shared.chmod(0o1777)
    state_dir = shared / "state"
    state_dir.mkdir(mode=0o777)
    state_dir.chmod(0o777)
    os.chown(state_dir, 31002, 31002)
    with pytest.raises(ConfigError, match=f"state dir {state_dir} is owned by uid 31002"):
        StateStore.open(state_dir, tmp_path / "ws")
    os.chown(state_dir, 0, 0)
    with pytest.raises(ConfigError, match="has mode 0777: other users could plant"):
        StateStore.open(state_dir, tmp_path / "ws")
    assert list(state_dir.iterdir()) == []
    # memd's user's own state dir where only root could have put it (/var/lib/memd):
    # root, a command beside the daemon, takes it.
    shared.chmod(0o755)
    state_dir.chmod(0o700)
    os.chown(state_dir, 31002, 31002)
    StateStore.open(state_dir, tmp_path / "ws").close()


def test_limit_waits_bounds_every_later_wait_for_another_process_lock(tmp_path: Path) -> None:
    """A daemon stopping while a `sqlite3` shell holds the DB in a transaction
    waited BUSY_TIMEOUT_S on each write left (final flush, heartbeat): half a
    minute. After limit_waits, the writes together wait at most what it gave."""
    ws = tmp_path / "ws"
    ws.mkdir()
    store = StateStore.open(tmp_path / "state", ws)
    assert store.path is not None
    holder = sqlite3.connect(store.path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("CREATE TABLE held(x)")
        store.limit_waits(0)
        with pytest.raises(memd.state.StateError, match="database is locked"):
            store.write_heartbeat(
                os.getpid(), started_at=0.0, healthy=True, detail="", agents=0, ts=time.time()
            )
        # What each operation now waits: the budget left, here none at all.
        assert store._conn.execute("PRAGMA busy_timeout").fetchone() == (0,)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        store.close()
