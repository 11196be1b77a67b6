"""``memd run`` read without Typer (memd.cli.run_argv): the same values, the same exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer

from memd.cli import commands_run
from memd.cli.app import build_app
from memd.cli.run_argv import FLAGS, VALUE_OPTIONS, RunArgs, read_run_args

PLAIN = [
    [],
    ["--poll"],
    ["--no-poll", "--demo"],
    ["-w", "/srv/ws", "-c", "memd.toml", "--state-dir", "st"],
    ["--workspace=ws", "--config=c.toml", "--state-dir=st", "--log-format=json"],
    ["--log-format", "console", "--log-level", "debug"],
    ["--log-level=warning", "--log-format", "auto", "--poll"],
    ["-w", "dir with spaces", "--log-level", "error"],
    ["-w", "~/not/expanded"],
]

# Forms Typer reads (or refuses) itself, with its own messages.
LEFT_TO_TYPER = [
    ["--help"],
    ["--poll", "--no-poll"],
    ["--poll", "--poll"],
    ["-w", "a", "--workspace", "b"],
    ["-w"],
    ["-w", "--poll"],
    ["-w=x"],
    ["-wx"],
    ["--workspace="],
    ["--log-format", "yaml"],
    ["--log-level", "INFO"],
    ["--demo=yes"],
    ["--", "--poll"],
    ["agent"],
    [""],
    ["--pol"],
]


def typer_reads(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> RunArgs:
    """The parameters the Typer command hands to run_daemon for ``memd run ARGV``."""
    seen: list[RunArgs] = []

    def record(*args: object) -> int:
        seen.append(RunArgs(*args))  # type: ignore[arg-type]
        return 0

    monkeypatch.setattr(commands_run, "run_daemon", record)
    build_app("run")(args=["run", *argv], prog_name="memd", standalone_mode=False)
    (args,) = seen
    return args


@pytest.mark.parametrize("argv", PLAIN, ids=" ".join)
def test_plain_forms_are_read_as_typer_reads_them(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = read_run_args(argv)
    assert parsed is not None
    assert parsed == typer_reads(argv, monkeypatch)


@pytest.mark.parametrize("argv", LEFT_TO_TYPER, ids=repr)
def test_other_forms_are_left_to_typer(argv: list[str]) -> None:
    assert read_run_args(argv) is None


def test_the_tables_are_the_typer_commands_options() -> None:
    group = typer.main.get_command(build_app("run"))
    assert isinstance(group, typer.core.TyperGroup)
    command = group.commands["run"]
    flags, valued = {}, {}
    for param in command.params:
        assert param.param_type_name == "option"
        assert not param.multiple and param.envvar is None
        if getattr(param, "is_flag", False):
            for opt in param.opts:
                flags[opt] = (param.name, True)
            for opt in param.secondary_opts:
                flags[opt] = (param.name, False)
        else:
            assert not param.secondary_opts
            valued.update(dict.fromkeys(param.opts, param.name))
    assert flags == FLAGS
    assert valued == VALUE_OPTIONS
    assert set(RunArgs.__dataclass_fields__) == {p.name for p in command.params}


def run_memd(argv: list[str]) -> subprocess.CompletedProcess[str]:
    script = (
        "import sys\n"
        "from memd.cli.app import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "finally:\n"
        "    print('TYPER', 'typer' in sys.modules, file=sys.stderr)\n"
    )
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True)


def test_run_does_not_import_typer_and_ends_as_the_typer_command(tmp_path: Path) -> None:
    # A workspace that does not exist: the daemon refuses it in one line, exit 2,
    # read plainly or by Typer (a repeated flag is left to it).
    argv = ["run", "-w", str(tmp_path / "nowhere"), "--state-dir", str(tmp_path / "state")]
    plain = run_memd(argv)
    typed = run_memd([*argv, "--poll", "--poll"])
    assert plain.returncode == typed.returncode == 2
    assert plain.stderr.replace("False", "True") == typed.stderr
    assert "does not exist" in plain.stderr and "TYPER False" in plain.stderr
    helped = run_memd(["run", "--help"])
    assert helped.returncode == 0 and "--poll" in helped.stdout
    assert "TYPER True" in helped.stderr


def test_a_ctrl_c_before_the_daemon_takes_signals_exits_130_as_with_typer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memd.cli import run_argv
    from memd.cli.app import main

    def interrupted(*_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(run_argv, "run_daemon", interrupted)
    monkeypatch.setattr(commands_run, "run_daemon", interrupted)
    with pytest.raises(SystemExit) as plain:
        main(["run", "--poll"])
    with pytest.raises(SystemExit) as typed:
        build_app("run")(args=["run", "--poll"], prog_name="memd", standalone_mode=True)
    assert plain.value.code == typed.value.code == 130
