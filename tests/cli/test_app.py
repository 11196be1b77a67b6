"""The CLI's entry point (``memd.cli.app.main``), run as users run it (a
``python -m memd`` subprocess): logging configured for every command but ``run``,
and the last line of defence that keeps tracebacks from users."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ENTRY = "### user — 2026-01-01T00:00:01\n\nhello {name}\n\n---\n\n"


def memd(*args: str, state_dir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    return subprocess.run(
        [sys.executable, "-m", "memd", *args],
        env={**env, "MEMD_STATE_DIR": str(state_dir)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def clean_env() -> dict[str, str]:
    """This shell's environment less its MEMD_* settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}


def one_line_error(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("memd: error:")]
    assert len(errors) == 1, proc.stderr


def make_agent(ws: Path, name: str) -> Path:
    folder = ws / "agents" / name
    folder.mkdir(parents=True)
    (folder / "MEMORY.md").write_text(ENTRY.format(name=name))
    return folder


def test_prune_json_stays_valid_json_when_the_audit_log_cannot_be_written(tmp_path: Path) -> None:
    """The audit log beside the state DB cannot be written (here: a folder at its
    name; also a full disk, or a CLI user who may not write it): the audit's
    warning must go to stderr, not into the JSON on stdout (review 14e, F4)."""
    ws = tmp_path / "ws"
    folder = make_agent(ws, "alpha")
    archive = folder / "archive"
    archive.mkdir()
    for day in (1, 2, 3):
        (archive / f"history_2026-01-0{day}_00-00-00.md").write_text(ENTRY.format(name=day))
    state = tmp_path / "st"
    # Find the audit log's name (the workspace digest) from a first run, then block it.
    memd("status", "--workspace", str(ws), state_dir=state, cwd=tmp_path)
    digests = {p.name.split(".")[0] for p in state.iterdir()}
    assert len(digests) == 1
    (state / f"{digests.pop()}.audit.jsonl").mkdir()
    config = tmp_path / "memd.toml"
    config.write_text("[retention]\nmax_archives = 1\n")
    proc = memd(
        "prune", "--workspace", str(ws), "--config", str(config), "--json",
        state_dir=state, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(list(archive.iterdir())) == 1  # the prune did happen
    json.loads(proc.stdout)
    assert "cannot write the audit log" in proc.stderr


@pytest.mark.parametrize(
    ("config_text", "key"),
    [
        ('workspace = "/tmp/a\\u0000b"\n', "workspace"),
        ('state_dir = "/tmp/a\\u0000b"\n', "state_dir"),
    ],
    ids=["workspace", "state_dir"],
)
def test_a_nul_in_a_configured_path_is_a_one_line_error(
    tmp_path: Path, config_text: str, key: str
) -> None:
    """The OS refuses a path holding a NUL byte ("embedded null byte"): the config
    refuses it first, naming the key; ``config check`` calls it invalid (review 14e, F8)."""
    ws = tmp_path / "ws"
    make_agent(ws, "alpha")
    config = tmp_path / "memd.toml"
    config.write_text(config_text)
    args = ["status", "--config", str(config)]
    if "workspace" not in config_text:
        args += ["--workspace", str(ws)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    proc = subprocess.run(
        [sys.executable, "-m", "memd", *args],
        env={**env, "HOME": str(tmp_path / "st")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    one_line_error(proc)
    assert key in proc.stderr
    check = memd("config", "check", str(config), "--json", state_dir=tmp_path / "st", cwd=tmp_path)
    assert check.returncode != 0
    assert json.loads(check.stdout)["valid"] is False


def test_a_path_too_long_for_the_os_is_a_one_line_error(tmp_path: Path) -> None:
    """ENAMETOOLONG from --config or --workspace: one line naming the file (review 14e, F8)."""
    ws = tmp_path / "ws"
    make_agent(ws, "alpha")
    long = "a" * 5000
    for args in (
        ["status", "--workspace", str(ws), "--config", long],
        ["status", "--workspace", long],
        ["compact-now", "alpha", "--workspace", long, "--summary", "s"],
        ["run", "--workspace", long],  # reaches main's backstop (the pointer's is_dir)
    ):
        proc = memd(*args, state_dir=tmp_path / "st", cwd=tmp_path)
        one_line_error(proc)


def test_ctrl_c_while_a_command_loads_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A Ctrl-C during the first moments of a command (its modules importing, the
    # daemon before its SIGINT handler) reached the user as a traceback.
    import memd.cli.status_argv
    from memd.cli.app import main

    def interrupted(args: list[str]) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(memd.cli.status_argv, "run_status", interrupted)
    code: object = None
    try:
        main(["status"])
    except SystemExit as exited:
        code = exited.code
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C left main as a KeyboardInterrupt: a traceback for the user")
    assert code == 130
    assert "Traceback" not in capsys.readouterr().err


# Review 15b, F6: the last line of defence keeps a daemon bug's traceback in its log.
def test_memd_run_keeps_where_an_unexpected_error_came_from(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import memd.cli.run_argv as run_argv
    from memd.cli.app import main

    def daemon_with_a_bug(*_args: object) -> int:
        return int("not a number")  # a programming error deep in the daemon

    monkeypatch.setattr(run_argv, "run_daemon", daemon_with_a_bug)
    with pytest.raises(SystemExit):
        main(["run", "--workspace", str(tmp_path)])
    err = capsys.readouterr().err
    assert "daemon_with_a_bug" in err, err  # where it came from, for the bug report


# A misspelled MEMD_ section (MEMD_TRIGER_...) was silently ignored: the operator
# believed a setting applied that did not. Every command that loads the config stops.
TYPO = ("MEMD_TRIGER_DEBOUNCE_MS", "200")
TYPO_ERROR = (
    "memd: error: invalid setting MEMD_TRIGER_DEBOUNCE_MS: not a memd setting; "
    "did you mean MEMD_TRIGGER_DEBOUNCE_MS?"
)


@pytest.mark.parametrize("command", [["status"], ["doctor"], ["config", "check"]])
def test_a_misspelled_memd_variable_stops_the_command(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    command: list[str],
) -> None:
    from memd.cli.app import main

    ws = tmp_path / "ws"
    make_agent(ws, "alpha")
    monkeypatch.setenv("MEMD_STATE_DIR", str(tmp_path / "st"))
    monkeypatch.setenv(*TYPO)
    with pytest.raises(SystemExit) as exited:
        main([*command, "--workspace", str(ws)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [TYPO_ERROR]


def test_memd_run_refuses_to_start_with_a_misspelled_memd_variable(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    make_agent(ws, "alpha")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    proc = subprocess.run(
        [sys.executable, "-m", "memd", "run", "--workspace", str(ws)],
        env={**env, "MEMD_STATE_DIR": str(tmp_path / "st"), TYPO[0]: TYPO[1]},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,  # without the check the daemon would start and run until killed
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [TYPO_ERROR]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("status", "-n", "0"), "'--limit' / '-n'"),
        (("history", "a", "-n", "0"), "'--limit' / '-n'"),
        (("compact-now", "a", "--wait", "-1"), "'--wait'"),
        (("status", "--bogus"), "No such option: --bogus"),
        (("archive", "keygen", "--workspace", "ws"), "No such option: --workspace"),
    ],
    ids=["status-n0", "history-n0", "compact-now-wait-negative", "unknown", "keygen-workspace"],
)
def test_a_usage_error_is_one_line_naming_it(
    tmp_path: Path, argv: tuple[str, ...], named: str
) -> None:
    """review16e F5: Click's usage errors were a 5-6 line box (usage, a hint and a
    panel), while memd's own checks of the same kind (`recall -n 0`) are one line."""
    make_agent(tmp_path / "ws", "a")
    proc = memd(*argv, state_dir=tmp_path / "state", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("memd: error: ") and named in line, line
    assert f"(see 'memd {argv[0]}" in line, line


@pytest.mark.parametrize(
    "argv", [("status", "--sort", "size"), ("run", "--log-format", "xml")], ids=["sort", "format"]
)
def test_a_choice_not_offered_is_said_without_pydantics_prefix(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    """Typer checks a Literal option with pydantic: its 'Value error, ' reached the user."""
    proc = memd(*argv, state_dir=tmp_path / "state", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert f"Invalid value for '{argv[1]}': '{argv[2]}' is not one of " in line, line
    assert "Value error" not in line


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("forget", "a", "--yes", "--workspace", ""), "'--workspace' / '-w'"),
        (("compact-now", "a", "--summary", "s", "-w", ""), "'--workspace' / '-w'"),
        (("status", "--workspace="), "'--workspace' / '-w'"),
        (("status", "--config", ""), "'--config' / '-c'"),
        (("run", "--state-dir", ""), "'--state-dir'"),
        (("config", "check", ""), "'FILE'"),
        (("archive", "keygen", ""), "'FILE'"),
        (("archive", "cat", "a", "x", "--key-file", ""), "'--key-file'"),
    ],
    ids=["forget", "compact-now", "status-ws", "status-config", "run", "check", "keygen", "cat"],
)
def test_an_empty_path_is_refused_not_read_as_the_current_folder(
    tmp_path: Path, argv: tuple[str, ...], named: str
) -> None:
    """`--workspace "$WS"` with WS unset was the current folder: forget erased the
    agent of that name there, run kept its state in it, config check and keygen
    said 'config file . is a directory' / 'key file . already exists'."""
    folder = make_agent(tmp_path, "a")  # the current folder is a workspace
    before = (folder / "MEMORY.md").read_bytes()
    proc = memd(*argv, state_dir=tmp_path / "state", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"memd: error: Invalid value for {named}: an empty path"), line
    assert (folder / "MEMORY.md").read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["MEMORY.md"]


@pytest.mark.parametrize("argv", [(), ("config",), ("--help",), ("doctor", "--help")])
def test_help_is_still_help(tmp_path: Path, argv: tuple[str, ...]) -> None:
    proc = memd(*argv, state_dir=tmp_path / "state", cwd=tmp_path)
    assert "Usage: memd" in proc.stdout and proc.stderr == "", proc
    # Asked for: 0; a command group run bare: its help, exit 2 (as before).
    assert proc.returncode == (0 if "--help" in argv else 2)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_is_printed_whatever_the_environment_says(tmp_path: Path, flag: str) -> None:
    """Asked by packaging scripts and bug reports: answered before the configuration
    is read, so even a misspelled MEMD_* variable does not stop it."""
    import memd as memd_package

    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    proc = subprocess.run(
        [sys.executable, "-m", "memd", flag],
        env={**env, "MEMD_LOG_LEVL": "debug"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == f"memd {memd_package.__version__}\n"


def _without_dac_override() -> list[str]:
    """A prefix that runs a command as this root but bound by file permissions, as
    an unprivileged daemon user is (no uid change: the checkout stays reachable)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to drop the permission-override capabilities")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]


@pytest.mark.parametrize("command", ["run", "status", "doctor"])
@pytest.mark.parametrize("unreadable", ["workspace", "agents"])
def test_a_workspace_memd_may_not_read_is_bad_input_named_in_one_line(
    tmp_path: Path, command: str, unreadable: str
) -> None:
    """A workspace (or its agents/) without r-x for memd's user: exit 2 with a line
    saying whose permission is missing, not exit 1 with a bare "Permission denied"
    from the first listing deep inside the command."""
    prefix = _without_dac_override()
    ws = tmp_path / "ws"
    make_agent(ws, "alpha")
    folder = ws if unreadable == "workspace" else ws / "agents"
    folder.chmod(0o000)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, "-m", "memd", command, "--workspace", str(ws)],
            env={**env, "MEMD_STATE_DIR": str(tmp_path / "state")},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        folder.chmod(0o755)
    said = (
        "may not enter it; give it search (x) permission"
        if unreadable == "workspace"
        else "may not read agents/; give it read and search (r-x) permission"
    )
    if command == "doctor":  # doctor reports it among its checks, and fails
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        return
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last == (
        f"memd: error: workspace {ws}: memd (uid 0) {said}, e.g. through the agents' group"
    ), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["status", "run"])
def test_a_workspace_memd_may_only_search_is_not_refused(tmp_path: Path, command: str) -> None:
    """review r8cli F1: memd lists agents/, never the workspace: a workspace it may
    only pass through (0711, a home folder) is no bad input (it was refused, exit 2,
    daemon included, since the check for an unreadable workspace)."""
    prefix = _without_dac_override()
    ws = tmp_path / "ws"
    agent = ws / "agents" / "alpha"
    agent.mkdir(parents=True)
    (agent / "MEMORY.md").write_text("# Memory\n")
    # The workspace belongs to someone else and lets others only through (0711, as a
    # home folder often does); agents/ and everything below it memd may read.
    os.chown(ws, 65534, 65534)
    ws.chmod(0o711)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    env.update(MEMD_STATE_DIR=str(tmp_path / "state"))
    argv = [*prefix, sys.executable, "-m", "memd", command, "--workspace", str(ws)]
    proc = subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if command == "run":
        time.sleep(6)  # refused at once today; a daemon that starts is stopped by SIGINT
        proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert "may not read the workspace" not in err, err
    assert proc.returncode == 0, err


def json_commands() -> list[list[str]]:
    """Every command (and group command) that takes --json, as the app registers them."""
    import typer

    from memd.cli.app import build_app

    found: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        # Typer >= 0.22 carries its own Click: a group is what has commands.
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
        elif any("--json" in getattr(p, "opts", ()) for p in command.params):
            found.append(path)

    walk(typer.main.get_command(build_app()), [])
    return found


# What each --json command needs beside the bad config to reach loading it.
JSON_COMMAND_ARGS = {
    ("status",): [],
    ("doctor",): ["--offline"],
    ("history",): ["alpha"],
    ("recall",): ["alpha", "ledger"],
    ("prune",): [],
    ("audit",): [],
    ("health",): [],
    ("config", "check"): [],
}


def test_every_json_command_is_covered_by_the_bad_config_test() -> None:
    assert sorted(map(tuple, json_commands())) == sorted(JSON_COMMAND_ARGS)


@pytest.mark.parametrize("command", sorted(JSON_COMMAND_ARGS), ids=" ".join)
def test_a_json_command_with_a_bad_config_names_the_error_on_stdout_too(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    command: tuple[str, ...],
) -> None:
    """A script parsing a --json command's stdout got nothing for a bad config:
    the one stderr line and exit 2 stay, and stdout holds {"error", "exit_code"}."""
    from memd.cli.app import main

    ws = tmp_path / "ws"
    make_agent(ws, "alpha")
    bad = tmp_path / "bad.toml"
    bad.write_text('[trigger]\nthreshold = "x"\n')
    monkeypatch.setenv("MEMD_STATE_DIR", str(tmp_path / "st"))
    argv = [*command, *JSON_COMMAND_ARGS[command], "--json", "-w", str(ws), "-c", str(bad)]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert line.startswith("memd: error: invalid config ") and "trigger.threshold" in line, line
    answer = json.loads(out)
    assert answer["error"] == line.removeprefix("memd: error: ")
    assert answer["exit_code"] == 2
    assert not (tmp_path / "st").exists()  # nothing written


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["status", "nosuch", "--json"], 3),
        (["status", "--json", "--sort", "bogus"], 2),
    ],
    ids=["unknown-agent", "usage"],
)
def test_a_json_command_failing_otherwise_says_it_in_the_same_shape(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    argv: list[str],
    code: int,
) -> None:
    from memd.cli.app import main

    ws = tmp_path / "ws"
    make_agent(ws, "alpha")
    monkeypatch.setenv("MEMD_STATE_DIR", str(tmp_path / "st"))
    with pytest.raises(SystemExit) as exited:
        main([*argv, "-w", str(ws)])
    assert exited.value.code == code
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert json.loads(out) == {"error": line.removeprefix("memd: error: "), "exit_code": code}


def test_a_json_command_that_printed_its_answer_prints_no_second_document(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`memd health --json` prints its answer, then exits 1 (no daemon): one document."""
    from memd.cli.app import main

    ws = tmp_path / "ws"
    make_agent(ws, "alpha")
    monkeypatch.setenv("MEMD_STATE_DIR", str(tmp_path / "st"))
    with pytest.raises(SystemExit) as exited:
        main(["health", "--json", "-w", str(ws)])
    assert exited.value.code == 1
    answer = json.loads(capsys.readouterr().out)
    assert answer["healthy"] is False and "error" not in answer


@pytest.mark.parametrize("command", [["run"], ["config", "check"]], ids=" ".join)
def test_a_retry_backoff_starting_above_its_cap_is_refused_naming_both_keys(
    tmp_path: Path, command: list[str]
) -> None:
    ws = tmp_path / "ws"
    make_agent(ws, "alpha")
    config = tmp_path / "memd.toml"
    config.write_text("[daemon]\nretry_base_s = 900\nretry_max_s = 300\n")
    proc = subprocess.run(
        [sys.executable, "-m", "memd", *command, "--workspace", str(ws), "--config", str(config)],
        env={**clean_env(), "MEMD_STATE_DIR": str(tmp_path / "st")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,  # without the check the daemon would start and run until killed
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "retry_base_s (900) is more than retry_max_s (300)" in line and str(config) in line
    assert not (tmp_path / "st").exists()
