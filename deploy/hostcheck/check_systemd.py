#!/usr/bin/env python3
"""Run memd's systemd unit under a real systemd and check it end to end.

A minimal Debian rootfs (``mmdebstrap``, cached outside the checkout) boots
with systemd as PID 1 inside ``systemd-nspawn --register=no --keep-unit -b``.
The README's systemd recipe runs in it *literally* (its fenced block, in a
copy of this checkout), then the checks:

- the service is active after READY=1;
- ``systemd-analyze security memd`` on the live unit scores <= 1.5;
- a reload is applied (a lower threshold from memd.toml), and the sandboxed
  service compacts an agent whose own user appends again afterwards; a
  reload of a memd.toml with a problem fails, the reason in the journal;
- the recipe run again and the README's upgrade keep memd.toml and memd.env
  and restart the service;
- as root beside it, ``memd health`` finds the daemon and ``memd compact-now``
  compacts an agent as memd, leaving no root-owned file;
- the watchdog restarts a service that stops answering (SIGSTOP);
- a bad memd.env leaves the unit failed after one start, not restarting;
- a clean stop (exit 0, "stopped" logged);
- the filesystem and inotify checks work inside the unit's sandbox
  (ProcSubset=pid hides /proc/mounts and /proc/sys).

Needs root, systemd-nspawn, mmdebstrap, nsenter, and the Debian mirror (or a
cached rootfs). Prints ``skipped: <why>`` and exits 0 when the machine cannot
run it; exits 1 when a check fails. Standard library only: it runs with any
python3, outside memd's venv.

    sudo python3 deploy/hostcheck/check_systemd.py [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common import (
    CACHE_DIR,
    HOST_CA_BUNDLE,
    Checks,
    checkout_files,
    missing_commands,
    readme_block,
    wait_until,
)

CHECKOUT = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
PACKAGES = "systemd,systemd-sysv,dbus,python3,python3-venv,ca-certificates,procps,util-linux,passwd"
# Inside the container: where the checkout is copied and the host CA bundle bound.
GUEST_SRC = "/root/memd"
GUEST_CA = "/etc/memd-ci/host-ca.crt"
AGENT = "alice"
OTHER_AGENT = "bob"
AGENT_DIR = f"/srv/agents/agents/{AGENT}"


def rootfs_tarball() -> Path:
    """The cached rootfs, built once per package list (a few minutes)."""
    key = hashlib.sha256("|".join((SUITE, PACKAGES, *MIRRORS)).encode()).hexdigest()[:12]
    tarball = CACHE_DIR / f"rootfs-{SUITE}-{key}.tar"
    if tarball.exists():
        return tarball
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(".partial.tar")
    print(f"building the rootfs (cached at {tarball})", flush=True)
    subprocess.run(
        ["mmdebstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(partial), *MIRRORS],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    partial.rename(tarball)
    return tarball


class Container:
    """One booted container, entered with nsenter (it is not registered with machined)."""

    def __init__(self, root: Path, console: Path) -> None:
        self.root = root
        self.console = console
        self.process: subprocess.Popen[bytes] | None = None
        self.leader = 0

    def boot(self) -> None:
        pip_cache = Path.home() / ".cache" / "pip"
        pip_cache.mkdir(parents=True, exist_ok=True)
        with self.console.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    "systemd-nspawn",
                    "--register=no",
                    "--keep-unit",
                    "-b",
                    "-D",
                    str(self.root),
                    f"--machine=memd-ci-{os.getpid()}",
                    f"--bind-ro={HOST_CA_BUNDLE}:{GUEST_CA}",
                    f"--bind={pip_cache}:/root/.cache/pip",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.leader = wait_until(self._find_leader, 60, "the container's PID 1")
        state = wait_until(self._booted, 120, "the container's boot")
        print(f"container booted (PID 1 = host pid {self.leader}, {state})", flush=True)

    def _find_leader(self) -> int | None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"systemd-nspawn exited; see {self.console}")
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        pids = children.read_text().split() if children.exists() else []
        return int(pids[0]) if pids else None

    def _booted(self) -> str | None:
        state = self.run("systemctl is-system-running", check=False).stdout.strip()
        return state if state in {"running", "degraded"} else None

    def run(
        self, command: str, *, check: bool = True, timeout: float = 120, cwd: str = "/"
    ) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "PIP_CERT": GUEST_CA,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "SYSTEMD_PAGER": "",
        }
        result = subprocess.run(
            [
                "nsenter",
                "-t",
                str(self.leader),
                "-a",
                "--",
                "/bin/bash",
                "-c",
                f"cd {cwd} && {command}",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"in the container, `{command}` exited {result.returncode}:\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def journal(self) -> list[dict[str, object]]:
        """memd's JSON log lines from the journal (non-JSON lines are systemd's own)."""
        text = self.run("journalctl -u memd -o cat --no-pager", check=False).stdout
        events = []
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return events

    def journal_text(self) -> str:
        return self.run("journalctl -u memd --no-pager", check=False).stdout

    def shutdown(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)  # nspawn asks the container's systemd to halt
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def booted_container(keep: bool) -> Iterator[Container]:
    work = Path(tempfile.mkdtemp(prefix="memd-systemd-check-"))
    root = work / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(rootfs_tarball())], check=True)
    # A copy of the checkout, as a user would have it (pip builds in it).
    target = root / GUEST_SRC.lstrip("/")
    target.mkdir(parents=True)
    for relative in checkout_files(CHECKOUT):
        source = CHECKOUT / relative
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
    container = Container(root, work / "console.log")
    try:
        container.boot()
        try:
            yield container
        except BaseException:
            # What the operator would look at first.
            print("memd's journal, last lines:", flush=True)
            tail = container.run("journalctl -u memd --no-pager -n 40", check=False).stdout
            print(tail, flush=True)
            raise
    finally:
        container.shutdown()
        if keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def memory_entry(role: str, text: str) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    return f"### {role} — {stamp}\n\n{text}\n\n---\n\n"


def append_as_agent(box: Container, entries: list[str]) -> subprocess.CompletedProcess[str]:
    """Append like an agent does (open per append, O_APPEND), as the agent's own user."""
    payload = "".join(entries).replace("'", "'\\''")
    return box.run(
        f"runuser -u {AGENT} -- sh -c 'umask 0007; mkdir -p {AGENT_DIR}; "
        f"printf %s '\"'\"'{payload}'\"'\"' >> {AGENT_DIR}/MEMORY.md'",
        check=False,
    )


def main_pid(box: Container) -> int:
    return int(box.run("systemctl show memd -p MainPID --value").stdout.strip() or 0)


def run_checks(box: Container, checks: Checks) -> None:
    recipe = readme_block(CHECKOUT / "README.md", "### systemd")
    print("running the README's systemd recipe, literally:\n" + recipe, flush=True)
    box.run("set -euo pipefail\n" + recipe, cwd=GUEST_SRC, timeout=900)

    def active() -> str | None:
        state = box.run("systemctl is-active memd", check=False).stdout.strip()
        if state == "failed":
            raise RuntimeError("memd failed to start:\n" + box.journal_text()[-3000:])
        return state if state == "active" else None

    wait_until(active, 180, "memd active (READY=1)")
    ready = [event for event in box.journal() if event.get("event") == "ready"]
    checks.record("active after READY", bool(ready), f"{len(ready)} ready line(s)")

    security = box.run("systemd-analyze security memd.service --no-pager", check=False).stdout
    match = re.search(r"Overall exposure level for memd\.service:\s*([0-9.]+)", security)
    score = float(match.group(1)) if match else 99.0
    checks.record("systemd-analyze security (live) <= 1.5", score <= 1.5, f"{score}")

    # Two agents, each isolated as the README says (its second block, run
    # literally for alice and with the name changed for bob).
    per_agent = readme_block(CHECKOUT / "README.md", "### systemd", nth=1)
    box.run("set -euo pipefail\n" + per_agent, timeout=120)
    box.run("set -euo pipefail\n" + per_agent.replace(AGENT, OTHER_AGENT), timeout=120)
    wait_until(active, 180, "memd active after adding the agents")
    filler = " ".join(f"word{n}" for n in range(60))
    first = append_as_agent(box, [memory_entry("user", f"turn {n}: {filler}") for n in range(40)])
    checks.record("agent appends its MEMORY.md", first.returncode == 0, first.stderr.strip())

    # Reload: a threshold low enough for the file above (default: 180,000 tokens).
    before = len([e for e in box.journal() if e.get("event") == "reloaded"])
    box.run("sed -i 's/^context_length = 200000$/context_length = 1000/' /etc/memd/memd.toml")
    box.run("grep -q '^context_length = 1000$' /etc/memd/memd.toml")
    box.run("systemctl reload memd")
    wait_until(
        lambda: len([e for e in box.journal() if e.get("event") == "reloaded"]) > before or None,
        60,
        "the reload",
    )

    def compacted() -> list[str] | None:
        names = box.run(f"ls {AGENT_DIR}/archive 2>/dev/null", check=False).stdout.split()
        return names or None

    archives = wait_until(compacted, 90, f"a compaction of {AGENT}")
    # The archive is linked before the commit; "compacted" is logged after it.
    events = wait_until(
        lambda: [e for e in box.journal() if e.get("event") == "compacted"] or None,
        60,
        "the compaction's log line",
    )
    checks.record(
        "reload applied; the sandboxed service compacted the agent",
        bool(events) and bool(archives),
        f"archives {archives}",
    )
    # A memd.toml with a problem: `systemctl reload` fails (it exited 0 with
    # `kill -HUP`), the journal names the key, the daemon runs on with its config.
    pid_before = main_pid(box)
    box.run("sed -i 's/^threshold = 0.9$/threshold = 7/' /etc/memd/memd.toml")
    box.run("grep -q '^threshold = 7$' /etc/memd/memd.toml")
    refused = box.run("systemctl reload memd", check=False)
    refusal = [line for line in box.journal_text().splitlines() if "trigger.threshold" in line]
    still = box.run("systemctl is-active memd", check=False).stdout.strip()
    box.run("sed -i 's/^threshold = 7$/threshold = 0.9/' /etc/memd/memd.toml")
    applied = box.run("systemctl reload memd", check=False)
    checks.record(
        "systemctl reload fails on a bad memd.toml, the reason in the journal, memd runs on",
        refused.returncode != 0
        and bool(refusal)
        and still == "active"
        and main_pid(box) == pid_before
        and applied.returncode == 0,
        f"reload exit {refused.returncode} then {applied.returncode}, {still}; "
        + (refusal[-1][-200:] if refusal else "no journal line names trigger.threshold"),
    )

    after = append_as_agent(box, [memory_entry("user", "after the compaction: still appending")])
    tail = box.run(f"tail -c 200 {AGENT_DIR}/MEMORY.md", check=False).stdout
    checks.record(
        "the agent's user appends after the compaction",
        after.returncode == 0 and "still appending" in tail,
        after.stderr.strip() or "appended",
    )
    archive = f"{AGENT_DIR}/archive/{archives[0]}"
    readable = box.run(f"runuser -u {AGENT} -- cat {archive} >/dev/null", check=False)
    removable = box.run(f"runuser -u {AGENT} -- rm -f {archive}", check=False)
    checks.record(
        "the agent reads its own archive and cannot delete it",
        readable.returncode == 0 and removable.returncode != 0,
        f"read exit {readable.returncode}, rm exit {removable.returncode}",
    )
    leaks = [
        path
        for path in (f"{AGENT_DIR}/MEMORY.md", archive)
        if box.run(f"runuser -u {OTHER_AGENT} -- cat {path}", check=False).returncode == 0
    ]
    checks.record("another agent reads nothing of it", not leaks, f"readable: {leaks}")

    # An upgrade as the README says (its "Upgrading" block, after the install
    # recipe again, both literally): the tuned memd.toml (the reload above) and
    # the operator's memd.env stay, and the daemon restarts on the new code.
    box.run("echo '# the operator line' >> /etc/memd/memd.env")
    before_upgrade = main_pid(box)
    box.run("set -euo pipefail\n" + recipe, cwd=GUEST_SRC, timeout=900)
    upgrade = readme_block(CHECKOUT / "README.md", "### Upgrading")
    box.run("set -euo pipefail\n" + upgrade, cwd=GUEST_SRC, timeout=900)
    wait_until(active, 180, "memd active after the upgrade")
    kept = box.run(
        "grep -q '^context_length = 1000$' /etc/memd/memd.toml "
        "&& grep -q '^# the operator line$' /etc/memd/memd.env",
        check=False,
    )
    after_upgrade = main_pid(box)
    checks.record(
        "the recipe again and the upgrade keep memd.toml and memd.env, and restart memd",
        kept.returncode == 0 and after_upgrade not in (0, before_upgrade),
        f"config kept: {kept.returncode == 0}; pid {before_upgrade} -> {after_upgrade}",
    )

    # Root beside the service (docs/operations.md): `memd health` finds the
    # daemon through memd's pointer, and `compact-now` acts as memd, with memd's
    # groups (an agent's folder opens to memd only through the agent's group).
    memd_cli = "LITELLM_LOCAL_MODEL_COST_MAP=True /opt/memd/venv/bin/memd"
    health = box.run(f"{memd_cli} health --workspace /srv/agents", check=False, timeout=120)
    checks.record(
        "root's memd health finds the running daemon",
        health.returncode == 0,
        (health.stdout + health.stderr).strip()[-300:],
    )
    compact = box.run(
        f"{memd_cli} compact-now {AGENT} --workspace /srv/agents --summary 'the summary'",
        check=False,
        timeout=120,
    )
    root_owned = box.run(f"find {AGENT_DIR} /var/lib/memd -user root", check=False).stdout.split()
    checks.record(
        "root's memd compact-now acts as memd and leaves no root-owned file",
        compact.returncode == 0 and not root_owned,
        (compact.stdout + compact.stderr).strip()[-300:] + f"; root-owned: {root_owned}",
    )

    # Filesystem and inotify checks inside the unit's /proc sandbox.
    journal = box.journal_text()
    checks.record(
        "no /proc read failure under ProcSubset=pid",
        "cannot read /proc" not in journal,
        "journal clean" if "cannot read /proc" not in journal else "cannot read /proc in journal",
    )
    doctor = box.run(
        "systemd-run --wait --pipe --quiet -p User=memd -p ProcSubset=pid -p ProtectProc=invisible "
        "-E MEMD_WORKSPACE=/srv/agents -E LITELLM_LOCAL_MODEL_COST_MAP=True "
        "/opt/memd/venv/bin/memd doctor",
        check=False,
        timeout=180,
    )
    lines = [line for line in doctor.stdout.splitlines() if "filesystem" in line]
    fs_ok = bool(lines) and not any("cannot read" in line for line in lines)
    checks.record(
        "filesystem check works in the sandbox",
        fs_ok and "no inotify here" not in doctor.stdout,
        (lines[0].strip() if lines else doctor.stdout[-300:] + doctor.stderr[-300:]),
    )

    # Watchdog: a stopped process stops pinging; systemd kills and restarts it.
    # (A drop-in shortens WatchdogSec=60 and the abort timeout for the check.)
    box.run(
        "mkdir -p /etc/systemd/system/memd.service.d && printf '%s\\n' '[Service]' "
        "'WatchdogSec=6' 'TimeoutAbortSec=5' 'RestartSec=1' "
        "> /etc/systemd/system/memd.service.d/ci-watchdog.conf && systemctl daemon-reload "
        "&& systemctl restart memd"
    )
    wait_until(active, 180, "memd active after the restart")
    stopped_pid = main_pid(box)
    box.run(f"kill -STOP {stopped_pid}")

    def restarted() -> int | None:
        pid = main_pid(box)
        return pid if pid not in (0, stopped_pid) and active() else None

    new_pid = wait_until(restarted, 90, "the watchdog restart")
    restarts = box.run("systemctl show memd -p NRestarts --value").stdout.strip()
    checks.record(
        "watchdog restarts a stopped daemon",
        "Watchdog timeout" in box.journal_text() or "watchdog timeout" in box.journal_text(),
        f"pid {stopped_pid} -> {new_pid}, NRestarts={restarts}",
    )

    # A bad memd.env (read at start): memd exits 2 and the unit is `failed`, not
    # `activating (auto-restart)` again every RestartSec= forever (1 s in this
    # drop-in); the error is in the journal once, and the restart counter (reset
    # by this manual restart) stays at 0.
    box.run("cp /etc/memd/memd.env /root/memd.env.good")
    box.run("echo MEMD_TRIGGER_CONTEXT_LENGTH=lots >> /etc/memd/memd.env")
    box.run("systemctl restart memd", check=False, timeout=200)

    def settled() -> str | None:
        state = box.run("systemctl is-active memd", check=False).stdout.strip()
        return state if state in {"failed", "active"} else None

    try:
        ended = wait_until(settled, 60, "memd to fail on a bad memd.env")
    except TimeoutError:
        ended = box.run("systemctl is-active memd", check=False).stdout.strip()
    shown = box.run("systemctl show memd -p NRestarts -p ExecMainStatus -p SubState").stdout
    fields = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    said = box.journal_text().count("MEMD_TRIGGER_CONTEXT_LENGTH (trigger.context_length)")
    checks.record(
        "a bad memd.env leaves the unit failed after one start (no restart loop)",
        ended == "failed"
        and fields.get("ExecMainStatus") == "2"
        and fields.get("NRestarts") == "0"
        and said == 1,
        f"{ended} ({fields.get('SubState')}), exit {fields.get('ExecMainStatus')}, "
        f"NRestarts={fields.get('NRestarts')}, error lines {said}",
    )
    box.run("cp /root/memd.env.good /etc/memd/memd.env && systemctl reset-failed memd")
    box.run("systemctl start memd", timeout=200)
    wait_until(active, 180, "memd active after the bad memd.env")

    stopped_before = len([e for e in box.journal() if e.get("event") == "stopped"])
    box.run("systemctl stop memd", timeout=200)
    shown = box.run("systemctl show memd -p Result -p ExecMainStatus").stdout
    fields = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    stops = len([e for e in box.journal() if e.get("event") == "stopped"])
    checks.record(
        "clean stop",
        fields.get("Result") == "success"
        and fields.get("ExecMainStatus") == "0"
        and stops > stopped_before,
        f"Result={fields.get('Result')} status={fields.get('ExecMainStatus')}",
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the container's files")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("skipped: needs root (systemd-nspawn)")
        return 0
    missing = missing_commands(("systemd-nspawn", "mmdebstrap", "nsenter", "tar"))
    if missing:
        print(
            f"skipped: missing {', '.join(missing)} (apt-get install systemd-container mmdebstrap)"
        )
        return 0
    checks = Checks("systemd")
    try:
        with booted_container(args.keep) as box:
            run_checks(box, checks)
    except (RuntimeError, subprocess.SubprocessError, OSError, TimeoutError) as exc:
        checks.record("run to the end", False, str(exc).strip()[-2000:])
    return checks.report()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
