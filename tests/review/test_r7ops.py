"""Review r7ops: memd run as a systemd service / docker sidecar, as an operator would.

Each test is a defect confirmed on a real systemd (PID 1 in systemd-nspawn,
Debian 12, the README's recipe run literally) or podman; strict xfail until fixed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The shipped systemd layout (memd.sysusers.conf, memd.tmpfiles.conf, the
# README's per-agent snippet), with ids of their own.
AGENTS_GID = 31000
ALICE = 31001  # uid and its user private group
MEMD = 31100


@pytest.fixture()
def systemd_layout() -> Iterator[tuple[Path, Path, Path]]:
    """(workspace, state dir, dir holding passwd/group naming memd as a member of
    alice's group), as the README's recipe leaves a host; removed after."""
    base = Path(tempfile.mkdtemp(prefix="memd-r7ops-", dir="/tmp"))
    try:
        base.chmod(0o755)
        workspace = base / "srv-agents"
        (workspace / "agents").mkdir(parents=True)
        os.chown(workspace, MEMD, AGENTS_GID)
        workspace.chmod(0o750)
        os.chown(workspace / "agents", 0, AGENTS_GID)
        (workspace / "agents").chmod(0o1770)
        state = base / "var-lib-memd"  # StateDirectory=memd, StateDirectoryMode=0700
        state.mkdir()
        os.chown(state, MEMD, MEMD)
        state.chmod(0o700)
        etc = base / "etc"
        etc.mkdir()
        passwd = Path("/etc/passwd").read_text()
        group = Path("/etc/group").read_text()
        (etc / "passwd").write_text(
            passwd
            + f"r7memd:x:{MEMD}:{MEMD}::/nonexistent:/usr/sbin/nologin\n"
            + f"r7alice:x:{ALICE}:{ALICE}::/nonexistent:/usr/sbin/nologin\n"
        )
        (etc / "group").write_text(
            group
            + f"r7agents:x:{AGENTS_GID}:r7memd,r7alice\n"
            + f"r7alice:x:{ALICE}:r7memd\n"
            + f"r7memd:x:{MEMD}:\n"
        )
        yield workspace, state, etc
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_alice(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        user=ALICE,
        group=ALICE,
        extra_groups=[AGENTS_GID],
        umask=0o007,  # the agents' units run with UMask=0007
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )


def memd_as_root_on_this_host(etc: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`sudo memd ARGS` on a host whose user database has the README's users:
    /etc/passwd and /etc/group are bind-mounted over in a private mount namespace
    (the host's own files are not touched)."""
    script = 'mount --bind "$1" /etc/passwd && mount --bind "$2" /etc/group && shift 2 && exec "$@"'
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(etc / "passwd"),
            str(etc / "group"),
            sys.executable,
            "-m",
            "memd",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd="/",
    )


@pytest.mark.xfail(
    strict=True,
    reason="r7ops F5: the README has no upgrade procedure, and re-running its systemd install "
    "recipe (the only one) replaces /etc/memd/memd.env (the API key) and memd.toml with the "
    "examples and leaves the old daemon running (enable --now does not restart it)",
)
def test_systemd_recipe_can_be_rerun_for_an_upgrade_or_an_upgrade_is_documented() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deploy" / "hostcheck"))
    from common import readme_block

    readme = Path(__file__).resolve().parents[2] / "README.md"
    recipe = readme_block(readme, "### systemd")
    clobbering = [
        line
        for line in recipe.splitlines()
        if "/etc/memd/" in line
        and line.lstrip().startswith(("install ", "cp "))
        and not any(guard in line for guard in ("||", " -b ", "--backup", "-n ", "--no-clobber"))
    ]
    text = readme.read_text(encoding="utf-8")
    production = text[text.index("## Running it in production") : text.index("## Troubleshooting")]
    documented = "upgrad" in production.lower()
    assert documented or not clobbering, clobbering
