"""``memd status`` read without Typer (memd.cli.status_argv): the same values, the same output."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer

from memd.cli import commands_status
from memd.cli.app import build_app, main
from memd.cli.status_argv import FLAGS, VALUE_OPTIONS, StatusArgs, read_status_args
from memd.state import AgentRecord, StateStore

PLAIN = [
    [],
    ["--json"],
    ["alpha"],
    ["alpha", "--json", "-w", "/srv/ws"],
    ["--workspace", "ws", "--state-dir", "st", "-c", "memd.toml"],
    ["--workspace=ws", "--state-dir=st", "--config=c.toml", "--sort=tokens", "--limit=3"],
    ["--all", "--sort", "attention"],
    ["-n", "20", "--sort", "name", "--json"],
    ["--limit", "007", "--sort", "used"],
    ["--sort", "archives", "-w", "dir with spaces", "agent-1"],
    ["-w", "~/not/expanded"],
]

# Forms Typer reads (or refuses) itself, with its own messages.
LEFT_TO_TYPER = [
    ["--help"],
    ["--json", "--json"],
    ["-w", "a", "--workspace", "b"],
    ["-w"],
    ["-w", "--json"],
    ["-w=x"],  # "=x" to click
    ["-wx"],
    ["--workspace="],
    ["--sort", "bogus"],
    ["--sort", "Name"],
    ["--limit", "0"],
    ["--limit", "+5"],
    ["--limit", "5_0"],
    ["--limit", "٣"],
    ["--no-json"],
    ["--json=yes"],
    ["--", "alpha"],
    ["-"],
    ["alpha", "beta"],
    [""],
    ["--jso"],
]


def typer_reads(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> StatusArgs:
    """The parameters the Typer command hands to status_command for ``memd status ARGV``."""
    seen: list[StatusArgs] = []

    def record(
        agent: str | None,
        workspace: Path | None,
        config: Path | None,
        state_dir: Path | None,
        as_json: bool,
        **options: object,
    ) -> None:
        seen.append(StatusArgs(agent, workspace, config, state_dir, as_json, **options))  # type: ignore[arg-type]

    monkeypatch.setattr(commands_status, "status_command", record)
    build_app("status")(args=["status", *argv], prog_name="memd", standalone_mode=False)
    (args,) = seen
    return args


@pytest.mark.parametrize("argv", PLAIN, ids=" ".join)
def test_plain_forms_are_read_as_typer_reads_them(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = read_status_args(argv)
    assert parsed is not None
    assert parsed == typer_reads(argv, monkeypatch)


@pytest.mark.parametrize("argv", LEFT_TO_TYPER, ids=repr)
def test_other_forms_are_left_to_typer(argv: list[str]) -> None:
    assert read_status_args(argv) is None


def test_the_tables_are_the_typer_commands_options() -> None:
    group = typer.main.get_command(build_app("status"))
    assert isinstance(group, typer.core.TyperGroup)
    command = group.commands["status"]
    flags, valued, arguments = {}, {}, []
    for param in command.params:
        if param.param_type_name == "argument":
            arguments.append(param.name)
            continue
        assert not param.secondary_opts and not param.multiple and param.envvar is None
        for opt in param.opts:
            (flags if getattr(param, "is_flag", False) else valued)[opt] = param.name
    assert flags == FLAGS
    assert valued == VALUE_OPTIONS
    assert arguments == ["agent"]
    assert set(StatusArgs.__dataclass_fields__) == {p.name for p in command.params}


@pytest.fixture
def fleet(tmp_path: Path) -> list[str]:
    """A workspace a live daemon watches (its state DB): the base arguments."""
    workspace, state_dir = tmp_path / "ws", tmp_path / "state"
    for i in range(6):
        (workspace / "agents" / f"agent{i}").mkdir(parents=True)
        (workspace / "agents" / f"agent{i}" / "MEMORY.md").write_text("# Agent Memory\n")
    now = time.time()
    records = [
        AgentRecord(f"agent{i}", 1, i, 3, 3, 3, i * 400, 1000, now, archives=i % 3,
                    archive_bytes=100 * i, archive_mtime_ns=1, window_source="[trigger]",
                    state="error" if i == 4 else "idle", last_error="x" if i == 4 else None,
                    last_compaction_at=now - i)
        for i in range(6)
    ]  # fmt: skip
    with StateStore.open(state_dir, workspace) as store:
        store.upsert_agents(records)
        store.write_heartbeat(os.getpid(), now - 60, True, "", len(records), now)
    return ["status", "-w", str(workspace), "--state-dir", str(state_dir)]


@pytest.mark.parametrize(
    "extra", [["--json"], [], ["--all", "--sort", "used"], ["agent4", "--json"], ["-n", "2"]]
)
def test_output_is_the_typer_commands_byte_for_byte(
    capsys: pytest.CaptureFixture[str], fleet: list[str], extra: list[str]
) -> None:
    with pytest.raises(SystemExit) as fast:
        main([*fleet, *extra])
    fast_out = capsys.readouterr()
    with pytest.raises(SystemExit) as slow:
        build_app("status")(args=[*fleet, *extra], prog_name="memd", standalone_mode=True)
    slow_out = capsys.readouterr()
    assert (fast.value.code, fast_out.out, fast_out.err) == (0, slow_out.out, slow_out.err)
    assert slow.value.code == 0
    assert fast_out.out


def test_status_json_does_not_import_typer_and_help_still_does(fleet: list[str]) -> None:
    script = (
        "import sys\n"
        "from memd.cli.app import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "finally:\n"
        "    print('TYPER', 'typer' in sys.modules, file=sys.stderr)\n"
    )
    plain = subprocess.run(
        [sys.executable, "-c", script, *fleet, "--json"], capture_output=True, text=True
    )
    assert plain.returncode == 0, plain.stderr
    assert "TYPER False" in plain.stderr
    helped = subprocess.run(
        [sys.executable, "-c", script, *fleet, "--help"], capture_output=True, text=True
    )
    assert helped.returncode == 0 and "--sort" in helped.stdout
    assert "TYPER True" in helped.stderr


def test_a_reader_that_goes_away_ends_it_quietly_with_1(fleet: list[str]) -> None:
    """`memd status --json | head -1`: exit 1 and no traceback, as Typer's standalone mode."""
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert reader.stdin is not None
    # Enough rows that the output outlives the pipe's buffer after the reader left.
    script = (
        "import sys\n"
        "from memd.cli import status_view\n"
        "from memd.cli.app import main\n"
        "def write(self, texts):\n"
        "    for _ in range(64):\n"
        "        sys.stdout.write('x' * 65536 + '\\n')\n"
        "status_view._JsonArray.write = write\n"
        "main(sys.argv[1:])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *fleet, "--json"],
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
        text=True,
    )
    reader.stdin.close()
    reader.wait()
    assert result.returncode == 1
    assert result.stderr == ""
