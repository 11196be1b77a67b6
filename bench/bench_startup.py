"""Restart → READY at fleet scale (issue 13 item 5), against its floor.

    python bench/bench_startup.py                   # 30,000 agents, 3 restarts
    python bench/bench_startup.py --agents 10000 --repeats 5

Builds a workspace of small MEMORY.md files, runs ``memd run`` once (cold: every
file counted, the state DB written at the clean stop), then restarts it with
the files unchanged and times process start → the ``ready`` log line. The cold
start waits until the folders just built are older than memd's racy-timestamp
window (a folder changed within 2 s of its listing is listed again at the next
start, as a folder of a live fleet would not be: only the first restart did). The
anchor is a process doing the least any start-up must: the interpreter with
memd's imports, a stat of every MEMORY.md and an inotify watch on every agent
folder (raw ``inotify_add_watch``). Prints both (medians) and their ratio
(target: within 3x), and the load average before and after.

With ``MEMD_BENCH_PROFILE=DIR`` each restart runs under cProfile (main thread,
start to stop) and leaves ``DIR/restart-N.prof``; its times are then not the
daemon's own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_daemon import HEADER, Proc, entry, write_config
from bench_status import compile_memd

from memd.workspace import _RACY_NS

# What the anchor imports: the modules `memd run` has loaded by READY.
_ANCHOR = r"""
import ctypes, os, sys
import memd.cli.app, memd.daemon.lifecycle, memd.compaction, memd.state, memd.tokenizer
import memd.watcher, memd.scheduler, memd.recall.service
agents = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
mask = 0x2 | 0x8 | 0x80 | 0x40 | 0x100 | 0x200 | 0x400 | 0x800
with os.scandir(agents) as found:
    for item in found:
        os.stat(item.path + "/MEMORY.md")
        if libc.inotify_add_watch(fd, os.fsencode(item.path), mask) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")
"""


def build(ws: Path, agents: int) -> None:
    template = HEADER + "".join(entry("Human" if n % 2 == 0 else "AI", n) for n in range(4))
    for n in range(agents):
        folder = ws / "agents" / f"agent{n:05d}"
        folder.mkdir(parents=True)
        (folder / "MEMORY.md").write_text(template.replace("{name}", f"agent{n:05d}"))


def time_ready(
    ws: Path, state: Path, config: Path, profile: Path | None = None
) -> tuple[float, int]:
    python_args = None if profile is None else ["-m", "cProfile", "-o", str(profile)]
    proc = Proc(ws, state, config, python_args=python_args)
    try:
        ready_at, line = proc.wait_event("ready", 600)
        return ready_at - proc.started, int(line.get("agents", -1))
    finally:
        proc.stop()


def time_anchor(ws: Path) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", _ANCHOR, str(ws / "agents")], check=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    profiles = os.environ.get("MEMD_BENCH_PROFILE")
    if profiles:
        Path(profiles).mkdir(parents=True, exist_ok=True)
    compile_memd()  # memd as installed, for the daemon and the anchor alike
    load_before = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="memd-bench-startup-"))
    try:
        ws, state = root / "ws", root / "state"
        build(ws, args.agents)
        config = write_config(root / "memd.toml", trigger={"context_length": 10**6})
        newest = os.stat(ws / "agents" / f"agent{args.agents - 1:05d}").st_ctime_ns
        time.sleep(max(0.0, (newest + _RACY_NS) / 1e9 - time.time()))
        cold, agents = time_ready(ws, state, config)
        restarts, anchors = [], []
        for repeat in range(args.repeats):
            # Interleaved, so both see the same machine load and page cache.
            anchors.append(time_anchor(ws))
            profile = Path(profiles) / f"restart-{repeat}.prof" if profiles else None
            seconds, agents = time_ready(ws, state, config, profile)
            restarts.append(seconds)
        restart, anchor = statistics.median(restarts), statistics.median(anchors)
        print(
            f"{agents} agents: cold start → READY {cold:.2f} s; restart → READY with unchanged "
            f"files {restart:.2f} s (median of {args.repeats}: "
            f"{', '.join(f'{s:.2f}' for s in restarts)}); anchor (interpreter + memd's "
            f"imports + stat of every file + a watch per agent) {anchor:.2f} s; "
            f"ratio {restart / anchor:.2f}x (target ≤ 3x); {os.cpu_count()} CPUs, load average "
            f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
