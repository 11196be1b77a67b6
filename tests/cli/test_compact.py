"""``memd compact-now`` end to end: real subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.memfiles import AgentWorkspace, append_entry, snapshot_tree, swarms_block
from support.openai_server import OpenAITestServer, echo_summary
from support.other_uid import NOBODY, can_switch_uid, reachable_tmp
from support.systemd_layout import as_alice, memd_as_root, systemd_layout
from support.systemd_layout import unavailable as systemd_layout_unavailable

from memd.audit import audit_path
from memd.core.memfile import parse
from memd.core.summary_block import parse_summary

REPO = Path(__file__).resolve().parents[2]


def memd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memd", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={
            **os.environ,
            # The 1 s drain quiet window is for real late writers; tests have none.
            "MEMD_COMPACTION_DRAIN_QUIET_S": "0.1",
            # These transcripts (a dozen short turns) are far below the turns kept
            # verbatim by default (a tenth of the 180,000-token default threshold):
            # keep none, so compact-now compacts them; the kept tail has its own test.
            "MEMD_SUMMARIZER_KEEP_RECENT_TOKENS": "0",
            **(env or {}),
        },
    )


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    workspace = AgentWorkspace(tmp_path / "ws")
    for name in ("alpha", "beta", "gamma"):
        workspace.create_agent(name, entries=12)
    return workspace


def test_compact_one_agent_with_builtin_summarizer(ws: AgentWorkspace, tmp_path: Path) -> None:
    result = memd(
        "compact-now", "alpha", "--workspace", str(ws.root), "--state-dir", str(tmp_path / "state")
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("alpha: compacted ")
    assert "tokens; archive history_" in result.stdout
    paths = ws.paths("alpha")
    assert len(list(paths.archive_dir.iterdir())) == 1
    doc = parse(paths.memory.read_bytes())
    assert doc.entries[0].is_summary and doc.entries[0].summary_text.strip()
    # The others were not touched.
    assert not ws.paths("beta").archive_dir.exists()
    # The ledger saw it (memd history reads it).
    history = memd(
        "history",
        "alpha",
        "--workspace",
        str(ws.root),
        "--state-dir",
        str(tmp_path / "state"),
        "--json",
    )
    assert history.returncode == 0, history.stderr
    assert "compact-now" in history.stdout


def test_nothing_to_compact_exits_zero_without_archive(ws: AgentWorkspace) -> None:
    first = memd("compact-now", "alpha", "--workspace", str(ws.root), "--summary", "all done")
    assert first.returncode == 0, first.stderr
    second = memd("compact-now", "alpha", "--workspace", str(ws.root))
    assert second.returncode == 0, second.stderr
    assert "nothing to compact" in second.stdout
    assert len(list(ws.paths("alpha").archive_dir.iterdir())) == 1


def test_summary_flag_skips_the_llm(ws: AgentWorkspace) -> None:
    result = memd(
        "compact-now",
        "alpha",
        "--workspace",
        str(ws.root),
        "--summary",
        "Ada likes tea.",
        env={
            "MEMD_SUMMARIZER_MODEL": "openai/never-called",
            "MEMD_SUMMARIZER_API_BASE": "http://127.0.0.1:9",
        },
    )
    assert result.returncode == 0, result.stderr
    doc = parse(ws.paths("alpha").memory.read_bytes())
    block = parse_summary(doc.entries[0].summary_text)
    # Used as given; memd adds only its provenance line (and pins, none here).
    assert block.body == "Ada likes tea."
    assert block.version == 2 and block.latest_archive.startswith("archive/history_")


def test_summary_file_keeps_the_text_off_the_command_line(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    # ps shows a command line to every user: a private summary comes from a file
    # or stdin, and is used as given, as --summary's text is.
    text = tmp_path / "summary.txt"
    text.write_text("Ada's home address is 4 Elm Row.\n", encoding="utf-8")
    result = memd("compact-now", "alpha", "--workspace", str(ws.root), "--summary-file", str(text))
    assert result.returncode == 0, result.stderr
    block = parse_summary(parse(ws.paths("alpha").memory.read_bytes()).entries[0].summary_text)
    assert block.body == "Ada's home address is 4 Elm Row."
    piped = subprocess.run(
        [
            sys.executable,
            "-m",
            "memd",
            "compact-now",
            "beta",
            "--workspace",
            str(ws.root),
            "--summary-file",
            "-",
        ],
        input="Bo likes rain.",
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "MEMD_SUMMARIZER_KEEP_RECENT_TOKENS": "0"},
    )
    assert piped.returncode == 0, piped.stderr
    block = parse_summary(parse(ws.paths("beta").memory.read_bytes()).entries[0].summary_text)
    assert block.body == "Bo likes rain."


@pytest.mark.parametrize(
    ("content", "extra", "says"),
    [
        (b"\xff\xfeA", [], "is not UTF-8 text"),
        (b"  \n", [], "the summary file is empty"),
        (b"fine", ["--summary", "also"], "not both"),
        (None, [], "cannot read summary file"),
    ],
)
def test_a_bad_summary_file_is_one_line_and_changes_nothing(
    ws: AgentWorkspace, tmp_path: Path, content: bytes | None, extra: list[str], says: str
) -> None:
    path = tmp_path / "summary.txt"
    if content is not None:
        path.write_bytes(content)
    before = snapshot_tree(ws.root)
    result = memd(
        "compact-now", "alpha", "--workspace", str(ws.root), "--summary-file", str(path), *extra
    )
    assert result.returncode == 2
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert snapshot_tree(ws.root) == before


def test_all_agents(ws: AgentWorkspace) -> None:
    result = memd("compact-now", "--all", "--workspace", str(ws.root), "--summary", "s")
    assert result.returncode == 0, result.stderr
    for name in ("alpha", "beta", "gamma"):
        assert f"{name}: compacted" in result.stdout
        assert len(list(ws.paths(name).archive_dir.iterdir())) == 1


def test_all_agents_says_an_agents_long_error_in_one_line(ws: AgentWorkspace) -> None:
    """A failed agent's error (here a symlinked archive/, its path long) was
    wrapped at 80 columns by the error console: two lines, or more."""
    paths = ws.paths("beta")
    for old in paths.archive_dir.glob("*"):
        old.unlink()
    if paths.archive_dir.exists():
        paths.archive_dir.rmdir()
    (paths.dir / "notes").mkdir()
    paths.archive_dir.symlink_to("notes")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "memd",
            "compact-now",
            "--all",
            "-w",
            str(ws.root),
            "--summary",
            "s",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={
            **env,
            "MEMD_COMPACTION_DRAIN_QUIET_S": "0.1",
            "MEMD_SUMMARIZER_KEEP_RECENT_TOKENS": "0",
        },
    )
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if "warning" not in line]
    assert errors == [
        f"memd: error: agent 'beta': archive folder {paths.archive_dir} is a symlink, "
        "not a real folder; nothing is archived through it"
    ], result.stderr
    assert "alpha: compacted" in result.stdout and "gamma: compacted" in result.stdout


def test_all_agents_goes_on_past_an_agent_whose_budgets_do_not_fit_its_window(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    import json

    # beta declares a 4,096-token window: 3,000 summary tokens do not fit under
    # its low-water mark. That fails beta (in one line), not alpha and gamma.
    (ws.paths("beta").dir / "memd-agent.json").write_text(
        json.dumps({"format": "memd-agent", "version": 1, "agent": "beta", "context_length": 4096}),
        encoding="utf-8",
    )
    env = {"MEMD_SUMMARIZER_SUMMARY_TOKENS": "3000"}
    for dry in ([], ["--dry-run"]):
        result = memd("compact-now", "--all", *dry, "--workspace", str(ws.root), env=env)
        assert result.returncode != 0
        assert "agent 'beta'" in result.stderr and "Traceback" not in result.stderr
        for name in ("alpha", "gamma"):
            assert f"{name}:" in result.stdout, (dry, result.stdout)
    assert not ws.paths("beta").archive_dir.exists()
    assert ws.paths("gamma").archive_dir.exists()


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["compact-now", "nobody"], "unknown agent 'nobody'", 3),
        (["compact-now", "../alpha"], "invalid agent name '../alpha'", 2),
        (["compact-now", "a/b"], "invalid agent name 'a/b'", 2),
    ],
)
def test_bad_agent_is_one_line_error_and_touches_nothing(
    ws: AgentWorkspace, args: list[str], message: str, code: int
) -> None:
    before = snapshot_tree(ws.root)
    result = memd(*args, "--workspace", str(ws.root))
    assert result.returncode == code
    assert result.stderr.strip().count("\n") == 0
    assert message in result.stderr
    assert snapshot_tree(ws.root) == before


def test_missing_workspace(tmp_path: Path) -> None:
    result = memd("compact-now", "alpha", "--workspace", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"memd: error: workspace {tmp_path / 'nope'} does not exist"


def test_bad_config_names_key_and_file(ws: AgentWorkspace, tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[trigger]\nthreshold = 7\n")
    before = snapshot_tree(ws.root)
    result = memd("compact-now", "alpha", "--workspace", str(ws.root), "--config", str(config))
    assert result.returncode == 2
    assert "trigger.threshold" in result.stderr and str(config) in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert snapshot_tree(ws.root) == before


def test_summarizer_failure_exits_at_once_with_reason(ws: AgentWorkspace) -> None:
    paths = ws.paths("alpha")
    before = paths.memory.read_bytes()
    result = memd(
        "compact-now",
        "alpha",
        "--workspace",
        str(ws.root),
        env={
            "MEMD_SUMMARIZER_MODEL": "openai/test-model",
            "MEMD_SUMMARIZER_API_BASE": "http://127.0.0.1:9/v1",
            "MEMD_SUMMARIZER_API_KEY": "sk-test",
            "MEMD_SUMMARIZER_RETRIES": "0",
            "MEMD_SUMMARIZER_TIMEOUT_S": "5",
            # A known window: no "window unknown" warning beside the error line.
            "MEMD_SUMMARIZER_CONTEXT_LENGTH": "8192",
        },
    )
    assert result.returncode != 0
    assert "alpha" in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "sk-test" not in result.stderr
    assert paths.memory.read_bytes() == before
    assert not paths.archive_dir.exists()


def test_wait_gives_up_when_another_compaction_holds_the_lock(ws: AgentWorkspace) -> None:
    paths = ws.paths("alpha")
    paths.private_dir.mkdir(mode=0o700)
    with paths.lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        result = memd(
            "compact-now", "alpha", "--workspace", str(ws.root), "--wait", "0.3", "--summary", "s"
        )
    assert result.returncode == 4
    assert "another compaction holds its lock" in result.stderr
    append_entry(paths.memory, "Human", "after the lock was released")
    result = memd(
        "compact-now", "alpha", "--workspace", str(ws.root), "--wait", "5", "--summary", "s"
    )
    assert result.returncode == 0, result.stderr


def test_all_agents_skips_an_agent_being_compacted_elsewhere_without_failing(
    ws: AgentWorkspace,
) -> None:
    """`--all` on a fleet the daemon is working on: the agent it holds is being
    compacted, not failed; the others are compacted and the exit is 0. Named, the
    same agent is still exit 4 (the operator asked for that one), also among others."""
    paths = ws.paths("beta")
    paths.private_dir.mkdir(mode=0o700)
    with paths.lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        every = memd(
            "compact-now", "--all", "--workspace", str(ws.root), "--wait", "0.2", "--summary", "s"
        )
        named = memd(
            "compact-now", "beta", "--workspace", str(ws.root), "--wait", "0.2", "--summary", "s"
        )
        # Named among others (review r8cli F6: exit 1, a failure): the others are
        # compacted, and the exit says busy.
        among = memd(
            "compact-now", "gamma", "beta", "--workspace", str(ws.root), "--wait", "0.2",
            "--summary", "s",
        )  # fmt: skip
    assert among.returncode == 4, among.stderr
    assert among.stdout.startswith("gamma: ")  # compacted by --all above: nothing left
    assert among.stderr.count("another compaction holds its lock") == 1
    assert every.returncode == 0, every.stderr
    assert "alpha: compacted" in every.stdout and "gamma: compacted" in every.stdout
    assert "beta: skipped (busy: agent 'beta': another compaction holds its lock" in every.stdout
    assert not paths.archive_dir.exists()
    assert named.returncode == 4 and "another compaction holds its lock" in named.stderr


def test_a_lock_timeout_is_not_recorded_as_a_failed_compaction(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    # compact-now could not get the lock (the daemon, or another operation, held
    # it): nothing was tried, so `memd status` and `memd history` show no failure.
    state = str(tmp_path / "state")
    paths = ws.paths("alpha")
    paths.private_dir.mkdir(mode=0o700)
    with paths.lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        result = memd(
            *("compact-now", "alpha", "--workspace", str(ws.root), "--state-dir", state),
            *("--wait", "0.2", "--summary", "s"),
        )
    assert result.returncode == 4
    assert "another compaction holds its lock" in result.stderr
    status = memd("status", "alpha", "--workspace", str(ws.root), "--state-dir", state, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["last_error"] is None
    history = memd("history", "alpha", "--workspace", str(ws.root), "--state-dir", state, "--json")
    assert history.returncode == 0, history.stderr
    assert json.loads(history.stdout) == []


def test_python_dash_m_and_console_script_agree(ws: AgentWorkspace) -> None:
    script = Path(sys.executable).parent / "memd"
    if not script.exists():
        pytest.skip("console script not installed in this environment")
    help_module = memd("--help").stdout
    help_script = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, check=False
    ).stdout
    assert help_module == help_script
    for command in ("run", "compact-now", "status", "forget"):
        assert command in help_module


def test_agents_with_compression_off_are_never_compacted(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    config = tmp_path / "memd.toml"
    config.write_text('[agents."beta"]\ncontext_compression = false\n')
    before = ws.paths("beta").memory.read_bytes()
    named = memd("compact-now", "beta", "--workspace", str(ws.root), "--config", str(config))
    assert named.returncode == 2
    assert "agent 'beta' has context_compression = false" in named.stderr
    everyone = memd(
        "compact-now",
        "--all",
        "--workspace",
        str(ws.root),
        "--config",
        str(config),
        "--summary",
        "s",
    )
    assert everyone.returncode == 0, everyone.stderr
    assert "beta: skipped (context_compression = false)" in everyone.stdout
    assert "alpha: compacted" in everyone.stdout
    assert ws.paths("beta").memory.read_bytes() == before


def _fifo_for_memory(ws: AgentWorkspace, name: str) -> Path:
    memory = ws.paths(name).memory
    memory.unlink()
    os.mkfifo(memory)
    return memory


@pytest.mark.timeout(60)
def test_fifo_memory_is_refused_by_compact_now_and_status(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    _fifo_for_memory(ws, "beta")
    common = ("--workspace", str(ws.root), "--state-dir", str(tmp_path / "state"))
    one = memd("compact-now", "beta", *common)
    assert one.returncode != 0
    assert one.stderr.count("\n") == 1 and "beta" in one.stderr
    assert "not a regular file" in one.stderr and "Traceback" not in one.stderr
    every = memd("compact-now", "--all", *common)
    assert "not a regular file" in every.stderr and "Traceback" not in every.stderr
    assert len(list(ws.paths("alpha").archive_dir.iterdir())) == 1  # the others still compacted
    status = memd("status", "--json", *common)
    assert status.returncode == 0, status.stderr
    rows = {row["agent"]: row for row in __import__("json").loads(status.stdout)}
    assert rows["beta"]["state"] == "error" and "not a regular file" in rows["beta"]["last_error"]
    assert rows["alpha"]["tokens"] > 0


def test_compact_now_all_compacts_the_good_agents_beside_one_it_refuses(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    """An agent folder that is a symlink leaving the workspace is refused (§1). The
    daemon, ``status`` and ``prune`` skip it and go on; so does ``compact-now
    --all`` (review 14e, F6)."""
    good = ws.paths("alpha")
    outside = tmp_path / "outside"
    outside.mkdir()
    entry = "### user — 2026-01-01T00:00:01\n\nhello outside\n\n---\n\n"
    (outside / "MEMORY.md").write_text(entry)
    (ws.root / "agents" / "evil").symlink_to(outside)
    state = ["--state-dir", str(tmp_path / "st")]
    proc = memd(
        "compact-now", "--all", "--summary", "the summary", "--workspace", str(ws.root), *state
    )
    assert "Traceback" not in proc.stderr
    assert "evil" in proc.stderr  # the refused one is reported
    assert list(good.archive_dir.glob("history_*.md")), (proc.stdout, proc.stderr)
    assert (outside / "MEMORY.md").read_text() == entry
    assert proc.returncode == 1  # one agent was not compacted


def test_the_newest_turns_stay_verbatim_by_default(ws: AgentWorkspace, tmp_path: Path) -> None:
    paths = ws.paths("alpha")
    before = paths.memory.read_bytes()
    entries = parse(before).entries
    # A 2,000-token window: threshold 1,800, a tenth of it (180 tokens) kept verbatim.
    env = {"MEMD_TRIGGER_CONTEXT_LENGTH": "2000", "MEMD_SUMMARIZER_KEEP_RECENT_TOKENS": "-1"}
    result = memd("compact-now", "alpha", "--workspace", str(ws.root), env=env)
    assert result.returncode == 0, result.stderr
    doc = parse(paths.memory.read_bytes())
    assert doc.is_summary_entry(doc.entries[0])
    kept = doc.entries[1:]
    assert 0 < len(kept) < len(entries)
    # The kept tail is the newest turns, byte for byte; the archive holds the rest.
    assert [e.raw for e in kept] == [e.raw for e in entries[-len(kept) :]]
    [archive] = list(paths.archive_dir.iterdir())
    assert archive.read_bytes() == before[: entries[-len(kept)].start]
    # Compacting again right away: nothing beyond the kept tail.
    again = memd("compact-now", "alpha", "--workspace", str(ws.root), env=env)
    assert again.returncode == 0, again.stderr
    assert "nothing to compact" in again.stdout and "kept verbatim" in again.stdout
    assert len(list(paths.archive_dir.iterdir())) == 1


@pytest.mark.skipif(not can_switch_uid(), reason="needs root to hand files to another uid")
def test_root_compact_now_leaves_no_root_owned_file_that_locks_the_daemon_out() -> None:
    """The daemon and the agents' files belong to memd's user; the operator runs
    ``sudo memd compact-now AGENT``. Like ``forget`` and ``prune`` it acts as the
    state dir's owner: a root-owned .memd/ (0700), lock, journal or archive/ would
    leave the daemon unable to take that agent's lock (review 14e, F1)."""
    with reachable_tmp("memd-compact-root-") as base:
        ws = AgentWorkspace(base / "ws")
        paths = ws.create_agent("alpha", entries=2)
        state = base / "state"
        state.mkdir(mode=0o700)
        for root, dirs, files in os.walk(base):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), NOBODY, NOBODY)
        result = memd(
            "compact-now", "alpha", "--summary", "the summary",
            "--workspace", str(ws.root), "--state-dir", str(state),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        # The daemon, as memd's user, takes the agent's compaction lock:
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import fcntl, os, sys\n"
                f"os.setegid({NOBODY}); os.seteuid({NOBODY})\n"
                "fd = os.open(sys.argv[1], os.O_RDWR)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n",
                str(paths.private_dir / "lock"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert probe.returncode == 0, probe.stderr
        root_owned = [str(p) for p in paths.dir.rglob("*") if p.stat().st_uid == 0]
        assert root_owned == []


_NO_SYSTEMD_LAYOUT = systemd_layout_unavailable()


@pytest.mark.skipif(_NO_SYSTEMD_LAYOUT is not None, reason=str(_NO_SYSTEMD_LAYOUT))
def test_root_compact_now_and_forget_with_the_daemons_state_dir_in_the_systemd_layout() -> None:
    """docs/operations.md: "As root ... name the state dir"; `sudo memd compact-now`,
    `forget` and `prune` act as the state dir's owner. In the README's layout an
    agent's 0770 folder opens to memd only through the agent's group: the switch
    must take memd's supplementary groups, not keep root's (review r7ops, F2:
    Permission denied on every agent)."""
    with systemd_layout() as layout:
        folder = layout.workspace / "agents" / "alice"
        made = as_alice("/bin/mkdir", str(folder))
        assert made.returncode == 0, made.stderr
        chatter = " ".join(["we talked about the build at some length"] * 10)
        text = "".join(swarms_block("user", f"turn {n}: {chatter}") for n in range(8))
        text += swarms_block("user", "my card is kept in drawer 7")
        wrote = as_alice("/bin/sh", "-c", 'printf %s "$0" >> "$1"', text, str(folder / "MEMORY.md"))
        assert wrote.returncode == 0, wrote.stderr
        where = ("--workspace", str(layout.workspace), "--state-dir", str(layout.state))

        done = memd_as_root(
            layout, "compact-now", "alice", *where,
            "--summary", "The user talked about the build.", "--wait", "5",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        forgot = memd_as_root(layout, "forget", "alice", "--match", "drawer 7", "--yes", *where)
        assert forgot.returncode == 0, forgot.stderr
        files = [*folder.rglob("*"), *layout.state.rglob("*")]
        assert not [str(path) for path in files if path.lstat().st_uid == 0]
        archived = "".join(p.read_text() for p in folder.rglob("*.md"))
        assert "drawer 7" not in archived


# Review 15b, F1: a root compact-now loads what it imports lazily before it acts as
# the state dir's owner.

# Runs `memd ARGS`, with as_owner_of standing in for a switch to a user who cannot
# read this Python's site-packages (a root `pip install --user`, a venv in /root):
# a module first imported inside it fails as it would there.
_CHILD = textwrap.dedent(
    """
    import contextlib, importlib.machinery, json, sys
    import memd.cli.commands_compact as cc
    blocked = []

    class Unreadable:
        def find_spec(self, name, path=None, target=None):
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.origin and "site-packages" in spec.origin:
                blocked.append(name)
                raise ImportError(f"[Errno 13] Permission denied: {spec.origin!r}")
            return None

    @contextlib.contextmanager
    def as_owner_of(directory):
        finder = Unreadable()
        sys.meta_path.insert(0, finder)
        try:
            yield
        finally:
            sys.meta_path.remove(finder)

    cc.as_owner_of = as_owner_of
    from memd.cli.app import main
    try:
        main(sys.argv[1:])
    finally:
        print("BLOCKED=" + json.dumps(blocked), file=sys.stderr)
    """
)


def _compact_now_as_owner(tmp_path: Path, config: str, *extra: str) -> tuple[int, str, list[str]]:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha", entries=60)
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "memd.toml").write_text(config)
    env = {**os.environ, "PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    result = subprocess.run(
        [sys.executable, str(script), "compact-now", "alpha", *extra,
         "--workspace", str(ws.root), "--state-dir", str(state),
         "--config", str(tmp_path / "memd.toml")],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    marker = result.stderr.rsplit("BLOCKED=", 1)
    blocked = json.loads(marker[1].splitlines()[0]) if len(marker) == 2 else ["<no marker>"]
    return result.returncode, result.stdout + result.stderr, blocked


def test_root_compact_now_loads_the_archive_cipher_before_switching(tmp_path: Path) -> None:
    key_file = tmp_path / "master.key"
    subprocess.run(
        [sys.executable, "-c", "from memd.cli.app import main; main()",
         "archive", "keygen", str(key_file)],
        capture_output=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    config = f'[privacy]\nencrypt_archives = true\nkey_file = "{key_file}"\n'
    code, stderr, blocked = _compact_now_as_owner(
        tmp_path, config, "--summary", "the summary of it all, with enough words to keep"
    )
    assert blocked == [], stderr
    assert code == 0, stderr


def test_root_compact_now_loads_litellm_before_switching(tmp_path: Path) -> None:
    # Nothing listens on port 9: with litellm loaded first the call fails on the
    # connection, which this test does not look at; only where litellm was imported.
    config = (
        '[summarizer]\nmodel = "openai/gpt-4o-mini"\n'
        'api_base = "http://127.0.0.1:9/v1"\napi_key = "sk-test"\nretries = 0\nkeep_recent_tokens = 0\n'
    )
    _code, stderr, blocked = _compact_now_as_owner(tmp_path, config)
    assert "compaction" in stderr or "summar" in stderr, stderr  # it got as far
    assert "litellm" not in blocked, stderr
    assert "cannot import litellm" not in stderr


# A root compact-now with a litellm model acts as the state dir's owner, a real
# second uid here. That uid may be unable to read this Python at all (a venv under
# /root, a root `pip install --user`: reproduced by hand with a copy of the venv in
# /root, the compaction failed with "ModuleNotFoundError"): litellm imports ~70
# modules of its own during its first call, which preloading `litellm` does not
# cover. The child stands in for that unreadable Python with a finder that refuses
# every import made while the effective uid is not root, so the test needs neither
# a second venv nor the checkout to be readable by that uid.
_UNREADABLE_AS_OWNER = textwrap.dedent(
    """
    import json, os, sys, threading
    refused = []

    class UnreadableAsOwner:
        def find_spec(self, name, path=None, target=None):
            if os.geteuid() != 0:
                refused.append([threading.current_thread().name, name])
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, UnreadableAsOwner())
    from memd.cli.app import main
    try:
        main(sys.argv[1:])
    finally:
        print("REFUSED=" + json.dumps(refused), file=sys.stderr)
    """
)


def _long_summary(body: dict[str, object]) -> str:
    # echo_summary names a turn it was sent: a reply naming nothing of it is refused.
    return (
        echo_summary(body)
        + "\n"
        + "\n".join(
            f"- fact {i}: the kalomiren report item {i} is kept in drawer {i}." for i in range(120)
        )
    )


@pytest.mark.skipif(not can_switch_uid(), reason="needs root to act as another uid")
def test_root_compact_now_makes_a_litellm_summary_its_owner_could_not_import() -> None:
    with reachable_tmp("memd-compact-litellm-") as base, OpenAITestServer(_long_summary) as server:
        ws = AgentWorkspace(base / "ws")
        paths = ws.create_agent("alpha", entries=60)
        state = base / "state"
        state.mkdir(mode=0o700)
        for root, dirs, files in os.walk(base):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), NOBODY, NOBODY)
        child = base / "child.py"
        child.write_text(_UNREADABLE_AS_OWNER)
        result = subprocess.run(
            [sys.executable, str(child), "compact-now", "alpha",
             "--workspace", str(ws.root), "--state-dir", str(state)],
            capture_output=True, text=True, check=False, timeout=300,
            env={
                **os.environ,
                "PYTHONPATH": str(REPO),
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "MEMD_COMPACTION_DRAIN_QUIET_S": "0.1",
                "MEMD_SUMMARIZER_KEEP_RECENT_TOKENS": "0",
                "MEMD_SUMMARIZER_MODEL": "openai/gpt-4o-mini",
                "MEMD_SUMMARIZER_API_BASE": server.api_base,
                "MEMD_SUMMARIZER_API_KEY": "sk-test",
                "MEMD_SUMMARIZER_RETRIES": "0",
            },
        )  # fmt: skip
        marker = result.stderr.rsplit("REFUSED=", 1)
        refused = json.loads(marker[1].splitlines()[0]) if len(marker) == 2 else [["", "?"]]
        # litellm logs a reply in a thread pool of its own ("litellm-logging_0"), which
        # may still run once the summary is made and memd acts as the owner again: an
        # import it cannot make there is caught by litellm (memd registers no callback,
        # and prices the reply itself in the calling thread). memd's threads (the main
        # one, the request's "memd-summarizer-attempt") must never be refused.
        needed = [
            name for thread, name in refused if thread == "MainThread" or thread.startswith("memd-")
        ]
        assert needed == [], result.stderr
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        assert len(server.requests) >= 1
        (archive,) = paths.archive_dir.iterdir()
        assert "kalomiren report item 7" in paths.memory.read_text()
        # Still acting as the owner for every file: none of them is root's.
        assert [str(p) for p in base.rglob("*") if p.stat().st_uid == 0] == [str(child)]
        assert archive.stat().st_uid == NOBODY


LATE = "### AI \u2014 2026-01-01T00:00:00\n\nalpha late turn " + "z" * 120 + "\n\n---\n\n"


def _compact_now_in_process(
    ws: AgentWorkspace,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    fsync_eio: bool = False,
    drain_enospc: int = 0,
) -> tuple[int, str, str]:
    """compact-now alpha in this process, a late writer appending one turn to the old
    MEMORY.md just after the swap, and a fault after the commit: the folder's fsync
    after the replace fails with EIO once (``fsync_eio``), or the late turn's append
    to the new file fails with ENOSPC ``drain_enospc`` times. (exit code, out, err)"""
    import errno

    from memd.cli.app import main

    memory = ws.paths("alpha").memory
    real_replace, real_fsync, real_write = os.replace, os.fsync, os.write
    fsync_fails = [False]
    drain_fails = [drain_enospc]

    def replace(src: object, dst: object, **kwargs: object) -> None:
        late = open(memory, "a", encoding="utf-8") if dst == "MEMORY.md" else None
        real_replace(src, dst, **kwargs)  # type: ignore[arg-type]
        if late is not None:
            late.write(LATE)  # to the old file: the swap has just happened
            late.close()
            fsync_fails[0] = fsync_eio

    def fsync(fd: int) -> None:
        if fsync_fails[0]:
            fsync_fails[0] = False
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    def write(fd: int, data: object) -> int:
        if drain_fails[0] > 0 and bytes(data) == LATE.encode():  # type: ignore[call-overload]
            drain_fails[0] -= 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)  # type: ignore[arg-type]

    monkeypatch.setenv("MEMD_COMPACTION_DRAIN_QUIET_S", "0.05")
    monkeypatch.setenv("MEMD_SUMMARIZER_KEEP_RECENT_TOKENS", "0")
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "write", write)
    state = str(tmp_path / "state")
    args = ["compact-now", "alpha", "--workspace", str(ws.root), "--state-dir", state]
    try:
        main([*args, "--summary", "Ada likes tea."])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        monkeypatch.undo()
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("fault", ["fsync-eio", "drain-enospc"])
def test_a_compaction_that_committed_but_did_not_finish_is_retried_at_once(
    ws: AgentWorkspace,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fault: str,
) -> None:
    """The compaction committed, then a step after the swap failed once (a transient
    EIO on the folder's fsync, ENOSPC moving the late turn): compact-now said "the
    next run finishes it" and exited 6, the late turn left in .memd/drain.md. It
    runs the journal's roll-forward once at once: the late turn is in MEMORY.md,
    once, and it says what happened."""
    code, out, err = _compact_now_in_process(
        ws,
        tmp_path,
        monkeypatch,
        capsys,
        fsync_eio=fault == "fsync-eio",
        drain_enospc=1 if fault == "drain-enospc" else 0,
    )
    assert code == 0, err
    assert out.startswith(
        "alpha: compacted; a step after its commit failed, a second try finished it"
    )
    assert err.startswith("memd: warning: agent 'alpha': compaction committed (")
    assert err.strip().endswith("; retried at once: finished") and err.count("\n") == 1
    assert "next run" not in out + err
    paths = ws.paths("alpha")
    data = paths.memory.read_bytes()
    assert data.count(LATE.encode()) == 1 and data.endswith(LATE.encode())
    assert len(list(paths.archive_dir.iterdir())) == 1
    assert not (paths.private_dir / "drain.md").exists()


def test_a_compaction_whose_retry_fails_too_says_who_finishes_it(
    ws: AgentWorkspace,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The disk stays full for the retry too: one error line that says so and who
    finishes it; the late turn is kept for that roll-forward (never lost, never twice)."""
    from memd.compaction import recover_agent

    code, _out, err = _compact_now_in_process(ws, tmp_path, monkeypatch, capsys, drain_enospc=2)
    assert code == 6
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "committed" in lines[0] and "retried at once: No space left on device" in lines[0]
    assert "running daemon finishes it" in lines[0]
    paths = ws.paths("alpha")
    assert LATE.encode() not in paths.memory.read_bytes()
    assert recover_agent(paths, quiet_s=0.05) is not None  # the roll-forward, later
    assert paths.memory.read_bytes().count(LATE.encode()) == 1


@pytest.mark.parametrize("dry_run", [False, True], ids=["compact", "dry-run"])
def test_compact_now_on_unparsable_memory_says_the_bytes_do_not_parse(
    tmp_path: Path, dry_run: bool
) -> None:
    """review16e F4: near-Swarms turns without the `---` terminators, 10x over the
    threshold and not one entry: compact-now said "no raw entries since the last
    summary" for a file with no summary; the daemon's reason says why."""
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("a", entries=0)
    turns = "".join(
        f"### Human — 2026-01-05T09:{i % 60:02d}:00\n\nturn {i} "
        + "lorem ipsum dolor " * 40
        + "\n\n"
        for i in range(200)
    )
    paths.memory.write_text(turns)
    before = paths.memory.read_bytes()
    proc = memd(
        "compact-now",
        "a",
        *(["--dry-run"] if dry_run else []),
        "--workspace",
        str(ws.root),
        "--state-dir",
        str(tmp_path / "st"),
        env={"MEMD_TRIGGER_CONTEXT_LENGTH": "4000"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        f"a: nothing to compact: the {len(before):,} bytes after the last complete entry "
        "cannot be parsed (they are kept verbatim; fix or remove them)\n"
    )
    assert paths.memory.read_bytes() == before


def test_a_whole_compaction_that_keeps_the_newest_turns_is_not_reported_partial(
    tmp_path: Path,
) -> None:
    """review r8docs F1: every compaction keeping the newest turns verbatim (the
    default) said "partial: newer turns stay raw for the next compaction", in its
    line and the audit log, though the summarizer read every turn it was given:
    partial is a summarizer stopped short, not the kept tail."""
    ws = AgentWorkspace(tmp_path / "ws")
    memory = ws.create_agent("alpha").memory
    for index in range(200):
        words = " ".join(f"w{index}x{k}" for k in range(40))
        append_entry(memory, "Human" if index % 2 == 0 else "AI", f"Turn {index}. {words}")
    config = tmp_path / "memd.toml"
    config.write_text("[trigger]\ncontext_length = 16000\n")
    args = ("-w", str(ws.root), "-c", str(config), "--state-dir", str(tmp_path / "state"))
    kept = {"MEMD_SUMMARIZER_KEEP_RECENT_TOKENS": "-1"}  # the default: a tenth kept
    done = memd("compact-now", "alpha", *args, env=kept)
    assert done.returncode == 0 and "compacted" in done.stdout, done.stderr
    assert "partial" not in done.stdout, done.stdout
    # The newest turns were kept verbatim: the file still ends with the last turn.
    assert memory.read_text(encoding="utf-8").rstrip().endswith("---")
    assert "Turn 199." in memory.read_text(encoding="utf-8")
    records = [
        json.loads(line)
        for line in audit_path(tmp_path / "state", ws.root).read_text().splitlines()
    ]
    compacted = [record for record in records if record.get("event") == "compaction"]
    assert compacted and compacted[-1]["partial"] is False, records
