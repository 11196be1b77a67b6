#!/usr/bin/env python3
"""Build memd's image with podman and check the sidecar for real.

Builds the repository's Dockerfile (podman/buildah in the docker format, as
the README says: the OCI format, podman's default, drops HEALTHCHECK; runc as
the runtime: crun refuses hosts with hybrid cgroups), then checks: the image
keeps its health check; it runs as non-root; the tokenizer loads with no
network; `podman healthcheck run` passes for a running daemon and fails once
it stops answering; `memd reload` in the container applies a good config and
refuses a bad one; memd compacts an agent that another container appends to on a shared
volume (same uid, as in deploy/docker-compose.yml) and the agent keeps
appending; SIGTERM stops memd cleanly (exit 0); built with AGENTS_GID, an
agent container of its own uid makes its folder in the agents/ memd made on
a new volume, and reads the archive of its compaction.

When no container registry is reachable, the base image
(`python:3.11-slim`) is replaced by a stand-in made from Debian packages with
mmdebstrap (Python 3.11, pip trusting the host's CA bundle), cached outside
the checkout. Prints ``skipped: <why>`` and exits 0 when the machine cannot
run it; exits 1 when a check fails. Standard library only.

    sudo python3 deploy/hostcheck/check_podman.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import CACHE_DIR, HOST_CA_BUNDLE, Checks, missing_commands, wait_until

CHECKOUT = Path(__file__).resolve().parents[2]
PYTHON_VERSION = "3.11"
BASE_IMAGE = f"docker.io/library/python:{PYTHON_VERSION}-slim"
IMAGE = "localhost/memd-ci:check"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
STANDIN_PACKAGES = "python3,python3-venv,python-is-python3,ca-certificates,passwd"
# runc (crun refuses hybrid cgroups here); cgroupfs and a file event log work
# without systemd as PID 1.
PODMAN = (
    "podman",
    "--runtime",
    "runc",
    "--cgroup-manager",
    "cgroupfs",
    "--events-backend",
    "file",
)
# Default ulimits at 8192: podman would raise nproc beyond what this host lets a
# container set ("error setting rlimit type 6").
ULIMIT = ("--ulimit", "nofile=8192:8192", "--ulimit", "nproc=8192:8192")
UID = "1000"
# A one-off container of the image (an agent, a probe) is no memd sidecar: no
# health check (podman would try to start a systemd timer for it).
ONE_OFF = ("--rm", "--no-healthcheck")
# The isolated sidecar (docs/operations.md): the agents' group, an agent's own uid.
ISOLATED_IMAGE = "localhost/memd-ci:isolated"
AGENTS_GID = "2000"
AGENT_UID = "2001"


def podman(
    *args: str, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"podman {' '.join(args[:3])} exited {result.returncode}: {result.stderr[-2000:]}"
        )
    return result


def have_image(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def ensure_base_image() -> str:
    """The real base image if a registry gives it, else the Debian stand-in."""
    if have_image(BASE_IMAGE):
        return "present"
    try:
        if podman("pull", "-q", BASE_IMAGE, check=False, timeout=60).returncode == 0:
            return "pulled"
    except subprocess.TimeoutExpired:
        pass
    ca_digest = hashlib.sha256(HOST_CA_BUNDLE.read_bytes()).hexdigest()[:8]
    key = hashlib.sha256("|".join((STANDIN_PACKAGES, *MIRRORS)).encode()).hexdigest()[:12]
    tarball = CACHE_DIR / f"standin-python{PYTHON_VERSION}-{key}-{ca_digest}.tar"
    if not tarball.exists():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".partial.tar")
        print(f"no registry: building a stand-in {BASE_IMAGE} from Debian packages", flush=True)
        subprocess.run(
            [
                "mmdebstrap",
                "--variant=minbase",
                f"--include={STANDIN_PACKAGES}",
                f"--customize-hook=copy-in {HOST_CA_BUNDLE} /etc/ssl/certs/",
                "--customize-hook=printf '[global]\\ncert = /etc/ssl/certs/ca-certificates.crt\\n'"
                ' > "$1/etc/pip.conf"',
                "bookworm",
                str(partial),
                *MIRRORS,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        partial.rename(tarball)
    podman("import", "--change", 'CMD ["python3"]', str(tarball), BASE_IMAGE)
    return "stand-in from Debian packages"


def build_image(image: str = IMAGE, *extra: str) -> None:
    podman(
        "build",
        # The README's podman build: the OCI format has no health check field.
        "--format",
        "docker",
        "--runtime",
        "runc",
        "--pull=never",
        *ULIMIT,
        "--build-arg",
        f"PYTHON_VERSION={PYTHON_VERSION}",
        "--build-arg",
        f"MEMD_UID={UID}",
        "--build-arg",
        f"MEMD_GID={UID}",
        *extra,
        "-t",
        image,
        str(CHECKOUT),
        timeout=1200,
    )


def entry(text: str) -> str:
    return f"### user — {time.strftime('%Y-%m-%dT%H:%M:%S')}\n\n{text}\n\n---\n\n"


def image_health_check(image: str) -> list[str]:
    """The image's health check command ([] when it has none)."""
    shown = podman("image", "inspect", image, "--format", "{{json .Config.Healthcheck}}").stdout
    found = json.loads(shown or "null") or {}
    return list(found.get("Test") or [])


def run_checks(checks: Checks, tag: str) -> None:
    test = image_health_check(IMAGE)
    checks.record(
        "the image keeps its HEALTHCHECK (docker format)",
        test[1:] == ["memd", "health"],
        f"health check {test}",
    )

    user = podman("run", *ONE_OFF, *ULIMIT, "--entrypoint", "id", IMAGE, "-u").stdout.strip()
    checks.record("runs as non-root", user not in {"", "0"}, f"uid {user}")

    offline = podman(
        "run",
        *ONE_OFF,
        *ULIMIT,
        "--network=none",
        "--entrypoint",
        "python",
        IMAGE,
        "-c",
        "from memd.tokenizer import load_encoding; print(load_encoding('cl100k_base').name)",
        check=False,
    )
    checks.record(
        "tokenizer loads with no network",
        offline.returncode == 0,
        offline.stdout.strip() or offline.stderr[-300:],
    )

    volume, state, name = f"memd-ci-ws-{tag}", f"memd-ci-state-{tag}", f"memd-ci-{tag}"
    podman("volume", "create", volume)
    podman("volume", "create", state)

    def as_agent(
        entrypoint: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """A one-off container as the agent: its uid, the shared volume."""
        return podman(
            "run",
            *ONE_OFF,
            *ULIMIT,
            "--user",
            f"{UID}:{UID}",
            "-v",
            f"{volume}:/workspace",
            "--entrypoint",
            entrypoint,
            IMAGE,
            *args,
            check=check,
        )

    try:
        # The agent's folder, made by "the agent" (same uid as memd, as in the compose file).
        agent_dir = "/workspace/agents/alice"
        as_agent("mkdir", "-p", agent_dir)
        podman(
            "run",
            "-d",
            "--init",
            *ULIMIT,
            "--name",
            name,
            "-v",
            f"{volume}:/workspace",
            "-v",
            f"{state}:/var/lib/memd",
            "-e",
            "MEMD_TRIGGER_CONTEXT_LENGTH=1000",
            # A heartbeat stale after 3 s: the failing health check below.
            "-e",
            "MEMD_DAEMON_STATE_FLUSH_S=1",
            IMAGE,
        )

        def healthy() -> bool | None:
            result = podman("healthcheck", "run", name, check=False)
            return True if result.returncode == 0 else None

        wait_until(healthy, 120, "podman healthcheck run to pass")
        checks.record("podman healthcheck run passes for the running daemon", True)

        # A config change in the running container: `memd reload` says whether
        # the daemon took it (`kill -s HUP` cannot).
        edit = "sed -i 's/^threshold = {}$/threshold = {}/' /etc/memd/memd.toml"
        good = podman("exec", name, "memd", "reload", check=False)
        podman("exec", "-u", "0", name, "sh", "-c", edit.format("0.9", "7"))
        bad = podman("exec", name, "memd", "reload", check=False)
        podman("exec", "-u", "0", name, "sh", "-c", edit.format("7", "0.9"))
        checks.record(
            "memd reload in the container: applied 0, a bad memd.toml refused 2",
            good.returncode == 0 and bad.returncode == 2 and "trigger.threshold" in bad.stderr,
            f"exit {good.returncode} ({good.stdout.strip()[-120:]}), then {bad.returncode} "
            f"({bad.stderr.strip()[-160:]})",
        )

        filler = " ".join(f"word{n}" for n in range(60))
        script = (
            "import sys\n"
            f"path = '{agent_dir}/MEMORY.md'\n"
            "for text in sys.argv[1:]:\n"
            "    with open(path, 'a', encoding='utf-8') as f:\n"
            "        f.write(text)\n"
        )
        entries = [entry(f"turn {n}: {filler}") for n in range(40)]
        as_agent("python", "-c", script, *entries)

        def archived() -> list[str] | None:
            listing = podman("exec", name, "ls", f"{agent_dir}/archive", check=False).stdout.split()
            return listing or None

        archives = wait_until(archived, 90, "a compaction on the shared volume")
        appended = as_agent(
            "python", "-c", script, entry("after the compaction: still here"), check=False
        )
        tail = podman(
            "exec", name, "tail", "-c", "200", f"{agent_dir}/MEMORY.md", check=False
        ).stdout
        checks.record(
            "compaction on a shared volume; the agent keeps appending",
            appended.returncode == 0 and "still here" in tail,
            f"archives {archives}",
        )

        # memd stopped (SIGSTOP): its heartbeat goes stale, the health check fails.
        beat = json.loads(podman("exec", name, "memd", "health", "--json").stdout)
        pid = int(beat["pid"])
        podman("exec", name, "sh", "-c", f"kill -STOP {pid}")
        try:
            unhealthy = wait_until(
                lambda: podman("healthcheck", "run", name, check=False).returncode or None,
                60,
                "podman healthcheck run to fail",
            )
        finally:
            podman("exec", name, "sh", "-c", f"kill -CONT {pid}")
        wait_until(healthy, 60, "podman healthcheck run to pass again")
        checks.record(
            "podman healthcheck run fails while memd does not answer",
            unhealthy != 0,
            f"exit {unhealthy} while stopped, 0 again after SIGCONT",
        )

        podman("stop", "-t", "60", name, timeout=120)
        state_json = json.loads(podman("inspect", name).stdout)[0]["State"]
        logs = podman("logs", name, check=False).stderr + podman("logs", name, check=False).stdout
        stopped = any(
            '"event": "stopped"' in line or '"event":"stopped"' in line
            for line in logs.splitlines()
        )
        checks.record(
            "SIGTERM stops memd cleanly",
            state_json.get("ExitCode") == 0 and stopped,
            f"exit code {state_json.get('ExitCode')}",
        )
    finally:
        podman("rm", "-f", name, check=False)
        podman("volume", "rm", "-f", volume, state, check=False)


def check_isolated_agents(checks: Checks, tag: str) -> None:
    """docs/operations.md's isolated sidecar: the image built with AGENTS_GID,
    memd with group_add of it and of the agent's gid, the agent under a uid of
    its own with group_add AGENTS_GID and umask 0007, on a new volume that memd
    starts first (it makes agents/): the agent makes its own folder, memd
    compacts it, the agent reads its archive."""
    build_image(ISOLATED_IMAGE, "--build-arg", f"AGENTS_GID={AGENTS_GID}")
    volume, state, name = f"memd-ci-iws-{tag}", f"memd-ci-istate-{tag}", f"memd-ci-i{tag}"
    podman("volume", "create", volume)
    podman("volume", "create", state)
    agent_dir = "/workspace/agents/alice"

    def as_agent(script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return podman(
            "run", *ONE_OFF, *ULIMIT, "--user", f"{AGENT_UID}:{AGENT_UID}",
            "--group-add", AGENTS_GID, "-v", f"{volume}:/workspace",
            "--entrypoint", "sh", ISOLATED_IMAGE, "-c", f"umask 0007; {script}",
            check=check,
        )  # fmt: skip

    try:
        podman(
            "run", "-d", "--init", *ULIMIT, "--name", name,
            "--group-add", AGENTS_GID, "--group-add", AGENT_UID,
            "-v", f"{volume}:/workspace", "-v", f"{state}:/var/lib/memd",
            "-e", "MEMD_TRIGGER_CONTEXT_LENGTH=1000", ISOLATED_IMAGE,
        )  # fmt: skip
        wait_until(
            lambda: podman("exec", name, "memd", "health", check=False).returncode == 0 or None,
            120,
            "memd health to pass (isolated agents)",
        )
        made = as_agent(f"mkdir -p {agent_dir}", check=False)
        checks.record(
            "an agent of its own uid makes its folder in agents/ memd made",
            made.returncode == 0,
            made.stderr.strip()[-300:] or "made",
        )
        filler = " ".join(f"word{n}" for n in range(60))
        turns = "".join(entry(f"turn {n}: {filler}") for n in range(40))
        as_agent(f"printf %s '{turns}' >> {agent_dir}/MEMORY.md")

        def archived() -> list[str] | None:
            listing = podman("exec", name, "ls", f"{agent_dir}/archive", check=False).stdout.split()
            return listing or None

        archives = wait_until(archived, 90, "a compaction of the isolated agent")
        read = as_agent(f"cat {agent_dir}/archive/{archives[0]} >/dev/null", check=False)
        checks.record(
            "memd compacts it; the agent reads its archive",
            read.returncode == 0,
            f"archives {archives}; read exit {read.returncode}",
        )
    finally:
        podman("rm", "-f", name, check=False)
        podman("volume", "rm", "-f", volume, state, check=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    if os.geteuid() != 0:
        print("skipped: needs root (podman with runc and cgroupfs)")
        return 0
    missing = missing_commands(("podman", "runc", "mmdebstrap"))
    if missing:
        print(f"skipped: missing {', '.join(missing)} (apt-get install podman runc mmdebstrap)")
        return 0
    checks = Checks("podman")
    try:
        print(f"base image {BASE_IMAGE}: {ensure_base_image()}", flush=True)
        started = time.monotonic()
        build_image()
        checks.record(
            "image builds (podman/buildah, no BuildKit)",
            True,
            f"{time.monotonic() - started:.0f} s",
        )
        run_checks(checks, str(os.getpid()))
        check_isolated_agents(checks, str(os.getpid()))
    except (RuntimeError, subprocess.SubprocessError, OSError, TimeoutError) as exc:
        checks.record("run to the end", False, str(exc).strip()[-2000:])
    return checks.report()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
