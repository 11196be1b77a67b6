"""``--poll`` at fleet scale: memd's one-thread stat poller, its CPU per pass, the whole daemon.

Three parts, for N agents (default 10,000) at the default 1 s interval, each
printing the load average (the machine is shared: CPU time per syscall grows
with it, so compare the ratios measured in one run):

``passes``: the CPU of one pass, interleaved in one thread over the same
fleet: memd's pass with the files held open (a local disk), with every path
stat'ed (no fds to spare, or a network share), the pass memd had before issue
13, and three floors: a Python loop of one bare ``os.lseek`` (what memd's pass
does to each held MEMORY.md) and one of one bare ``os.fstat`` per held file,
and one of one bare ``os.stat`` per full path. One thread, so the kernel takes
no reference and no position lock per call: in the daemon (several threads)
the same lseek loop costs about twice as much, which ``daemon`` shows.

``watcher``: the poller on its own thread vs watchdog's PollingObserver (used
before; one emitter thread per folder, so measured at a smaller fleet,
default 1,000, and compared per agent): threads and fds added, idle CPU of the
process and of memd's polling thread alone (its own CPU clock), and append ->
callback latency (p50/p99 over appends to random agents).

``daemon``: the whole daemon with ``[watch] poll = true`` in this process:
threads, fds, idle CPU by thread, the cyclic GC's collections in the idle
window, and each append -> the count that includes it, against poll interval
+ debounce + 300 ms.

    python bench/bench_poll.py [--part passes|watcher|daemon|all] [--agents 10000]
        [--descriptors 0..1] [--anchor-agents 1000] [--idle-s 10] [--rounds 50]
        [--fleet idle|fresh|replaced ...] [--fresh]

The fleet (``--fleet``, more than one: each measured in turn, in one run):
``idle``, the default: MEMORY.md files last written an hour ago; ``fresh``
(``--fresh``): written just now and each appended to once after the watches
are up (reported changed), as a fleet that all wrote in the last 10 minutes
(before, each such file was hot: fstat'ed every pass for ``HOT_S``);
``replaced``: each replaced once by a rename after the watches are up (a fleet
of writers that save by rename, or that another process compacted: each hot,
fstat'ed every pass), measured once every replacement was seen (``VERIFY_S``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memd.watcher import Watcher


class LatencySink:
    def __init__(self) -> None:
        self.expected: dict[str, float] = {}
        self.latencies: list[float] = []
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)

    def agents_changed(self, name: str | None) -> None:
        pass

    def descriptor_changed(self, agent: str) -> None:
        pass  # the poller reports MEMORY.md changes as both

    def memory_changed(self, agent: str) -> None:
        now = time.monotonic()
        with self.lock:
            started = self.expected.pop(agent, None)
            if started is not None:
                self.latencies.append(now - started)
                self.arrived.notify_all()


def thread_cpu(name: str) -> float | None:
    """CPU seconds of the live thread called ``name`` (its own CPU clock), or None."""
    for thread in threading.enumerate():
        if thread.name == name and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return None


def threads_cpu() -> dict[str, float]:
    """CPU seconds of every live thread, by name (summed over threads of one name)."""
    seen: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            cpu = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except OSError:  # ended meanwhile
            continue
        seen[thread.name] = seen.get(thread.name, 0.0) + cpu
    return seen


def stat_floor(folders: dict[str, Path], runs: int = 5) -> float:
    """Seconds of CPU for one bare os.stat of every MEMORY.md (best of ``runs``)."""
    paths = [str(folder / "MEMORY.md") for folder in folders.values()]
    best = float("inf")
    for _ in range(runs):
        start = time.thread_time()
        for path in paths:
            os.stat(path)
        best = min(best, time.thread_time() - start)
    return best


# Unless ``--descriptors``: 0 (none, the default fleet) or 1 (every agent has
# a memd-agent.json, as memd_swarms.attach writes by default).
DESCRIPTORS = {"share": 0.0}


# When the fleet's MEMORY.md files were last written (None: now, ``--fresh``).
IDLE_SINCE: dict[str, float | None] = {"at": time.time() - 3600}
# What happens to every file once watched (``--fleet``): "" nothing (idle),
# "fresh" an append, "replaced" a rename over it.
STIR = {"how": ""}
ENTRY = b"### user \xe2\x80\x94 2026-12-01T10:00:00\n\nhello\n\n---\n\n"


def stir_fleet(folders: dict[str, Path]) -> float:
    """Change every agent's MEMORY.md as ``--fleet`` says, once its watch is up;
    how long until the poller has seen every change (seconds at most)."""
    from memd.poller import VERIFY_S

    how = STIR["how"]
    if not how:
        return 0.0
    for folder in folders.values():
        memory = folder / "MEMORY.md"
        if how == "fresh":
            with memory.open("ab") as f:
                f.write(ENTRY)
        else:
            new = folder / "MEMORY.md.new"
            new.write_bytes(memory.read_bytes() + ENTRY)
            os.replace(new, memory)
    # A replacement of a file that is not hot shows in its turn (VERIFY_S).
    return VERIFY_S + 2.0 if how == "replaced" else 2.0


def make_fleet(root: Path, count: int) -> dict[str, Path]:
    folders = {}
    every = 0 if DESCRIPTORS["share"] <= 0 else max(1, round(1 / DESCRIPTORS["share"]))
    for n in range(count):
        folder = root / "agents" / f"agent{n:05d}"
        folder.mkdir(parents=True)
        (folder / "MEMORY.md").write_bytes(b"# Agent Memory\n\n")
        # Idle agents: last written before the poller's HOT_S (600 s), as a fleet
        # that has not written for 10 minutes (a file written within it is
        # watched hot: fstat'ed each pass, as after a report).
        written = IDLE_SINCE["at"]
        if written is not None:
            os.utime(folder / "MEMORY.md", (written, written))
        if every and n % every == 0:
            descriptor = {
                "format": "memd-agent",
                "version": 1,
                "agent": folder.name,
                "model": "gpt-4o-mini",
                "context_length": 128_000,
                "reserved": {"unit": "text", "text": "You are a helpful agent."},
                "writer": "bench_poll",
            }
            (folder / "memd-agent.json").write_text(json.dumps(descriptor))
        folders[folder.name] = folder
    return folders


def measure(
    kind: str, count: int, idle_s: float, appends: int, interval_s: float
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="memd-bench-poll-") as tmp:
        root = Path(tmp)
        folders = make_fleet(root, count)
        sink = LatencySink()
        threads_before = threading.active_count()
        fds_before = len(os.listdir("/proc/self/fd"))
        if kind == "memd":
            watcher = Watcher(root, sink, kind="polling", poll_interval_s=interval_s)
            watcher.start()
            watcher.sync(folders)
            stop = watcher.stop
        else:  # the anchor: watchdog's PollingObserver, one emitter per folder
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers.polling import PollingObserver

            observer = PollingObserver(timeout=interval_s)

            class Handler(FileSystemEventHandler):
                def __init__(self, agent: str) -> None:
                    self.agent = agent

                def on_modified(self, event: object) -> None:
                    sink.memory_changed(self.agent)

            for agent, folder in folders.items():
                observer.schedule(Handler(agent), str(folder), recursive=False)
            observer.start()

            def stop() -> None:
                observer.stop()
                observer.join()

        try:
            threads = threading.active_count() - threads_before
            time.sleep(2 * interval_s)  # first snapshots taken
            time.sleep(stir_fleet(folders) + 2 * interval_s)
            cpu0, wall0 = time.process_time(), time.monotonic()
            thread0 = thread_cpu("memd-poll")
            time.sleep(idle_s)
            thread1 = thread_cpu("memd-poll")
            wall = time.monotonic() - wall0
            idle_cpu = (time.process_time() - cpu0) / wall
            fds = len(os.listdir("/proc/self/fd")) - fds_before
            poll_cpu = (
                float("nan") if thread0 is None or thread1 is None else (thread1 - thread0) / wall
            )
            floor = stat_floor(folders) / interval_s
            names = random.Random(7).sample(sorted(folders), min(appends, count))
            for agent in names:
                with sink.lock:
                    sink.expected[agent] = time.monotonic()
                with (folders[agent] / "MEMORY.md").open("ab") as f:
                    f.write(ENTRY)
                with sink.lock:
                    sink.arrived.wait_for(lambda a=agent: a not in sink.expected, timeout=10)
                time.sleep(random.Random(len(sink.latencies)).uniform(0, interval_s))
            lat = sorted(sink.latencies) or [float("nan")]
        finally:
            stop()
        return {
            "agents": count,
            "threads": threads,
            "idle_cpu": idle_cpu,
            "fds": fds,
            "poll_cpu": poll_cpu,
            "floor": floor,
            "p50": statistics.median(lat),
            "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "missed": len(names) - len(sink.latencies),
        }


def measure_daemon(count: int, idle_s: float, appends: int, interval_s: float) -> dict[str, Any]:
    """The whole daemon with ``[watch] poll = true``, in this process: threads,
    idle CPU, and each append -> the count that includes it (what the issue's
    "event -> count" means), against poll interval + debounce + 300 ms."""
    import queue

    from memd.daemon import Daemon, DaemonOptions
    from memd.daemon.entries import CountUpdate
    from memd.settings import LoadedConfig, build_config

    with tempfile.TemporaryDirectory(prefix="memd-bench-poll-daemon-") as tmp:
        root = Path(tmp)
        folders = make_fleet(root / "ws", count)
        config, _ = build_config(
            {
                "trigger": {"context_length": 10**8},
                "watch": {"poll": True, "poll_interval_s": interval_s},
            },
            {},
        )
        debounce_s = config.trigger.debounce_ms / 1000
        # Whole reconcile periods: the periodic work (the reconcile, the archive
        # survey) runs once per reconcile_s; a shorter window catches it or not.
        reconcile_s = config.watch.reconcile_s
        idle_s = max(1, round(idle_s / reconcile_s)) * reconcile_s
        updates: queue.SimpleQueue[CountUpdate] = queue.SimpleQueue()
        threads_before = threading.active_count()
        idents_before = {t.ident for t in threading.enumerate()}
        fds_before = len(os.listdir("/proc/self/fd"))
        daemon = Daemon(
            LoadedConfig(config, None, root / "ws", ()),
            DaemonOptions(state_dir=root / "state", install_signal_handlers=False),
            count_updates=updates,
        )
        runner = threading.Thread(target=daemon.run, name="bench-daemon", daemon=True)
        runner.start()
        try:
            if not daemon.ready.wait(600):
                raise RuntimeError("the daemon did not reach READY")
            # Past the start-up work that follows READY (first flush of every
            # row, the recall index's catch-up, first passes, the first archive
            # survey 1 s after READY and the state flush that writes what it
            # found: on a fresh state DB every row again, ~0.1 s of CPU at
            # 10,000 agents): wait until a second of CPU costs less than a tenth
            # of a second, at most 60 s.
            first_wait = max(3.0, 3 * interval_s, 2.0 + config.daemon.state_flush_s)
            settle(60, first_wait)
            seen_within = stir_fleet(folders)
            if seen_within:
                # Every change seen and counted, the counts flushed.
                settle(seen_within + 120, seen_within + first_wait)
                while True:
                    try:
                        updates.get_nowait()
                    except queue.Empty:
                        break
            threads = threading.active_count() - threads_before - 1  # not the runner
            thread_names = [
                t.name
                for t in threading.enumerate()
                if t.ident not in idents_before and t is not runner
            ]
            cpu0, wall0 = time.process_time(), time.monotonic()
            before = threads_cpu()
            gc_before = [generation["collections"] for generation in gc.get_stats()]
            time.sleep(idle_s)
            gc_after = [generation["collections"] for generation in gc.get_stats()]
            after = threads_cpu()
            wall = time.monotonic() - wall0
            idle_cpu = (time.process_time() - cpu0) / wall
            by_thread = {name: (cpu - before.get(name, 0.0)) / wall for name, cpu in after.items()}
            poll_cpu = by_thread.get("memd-poll", float("nan"))
            fds = len(os.listdir("/proc/self/fd")) - fds_before
            rng = random.Random(11)
            latencies: list[float] = []
            missed = 0
            for agent in rng.sample(sorted(folders), min(appends, count)):
                memory = folders[agent] / "MEMORY.md"
                with memory.open("ab") as f:
                    f.write(ENTRY)
                appended, size = time.time(), memory.stat().st_size
                deadline = time.monotonic() + 10
                while True:
                    try:
                        update = updates.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        missed += 1
                        break
                    if update.agent == agent and (update.size or 0) >= size:
                        latencies.append(update.at - appended)
                        break
                time.sleep(rng.uniform(0, interval_s))
        finally:
            daemon.handle_exit(signal.SIGTERM, None)
            runner.join(60)
        lat = sorted(latencies) or [float("nan")]
        return {
            "agents": count,
            "threads": threads,
            "fds": fds,
            "idle_cpu": idle_cpu,
            "idle_s": idle_s,
            "poll_cpu": poll_cpu,
            "p50": statistics.median(lat),
            "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "max": lat[-1],
            "target": interval_s + debounce_s + 0.3,
            "missed": missed,
            "by_thread": by_thread,
            "thread_names": thread_names,
            "gc": [n1 - n0 for n0, n1 in zip(gc_before, gc_after, strict=True)],
        }


def settle(at_most_s: float, first_s: float) -> None:
    """Sleep ``first_s``, then until a second of this process's CPU costs less than a
    tenth of a second (``at_most_s`` in all)."""
    settle_until = time.monotonic() + at_most_s
    time.sleep(first_s)
    while time.monotonic() < settle_until:
        cpu = time.process_time()
        time.sleep(1.0)
        if time.process_time() - cpu < 0.1:
            break


def legacy_pass(root: Path, folders: dict[str, Path]) -> Callable[[], None]:
    """The pass before issue 13's work, for a ratio in the same run: every
    MEMORY.md stat'ed by its full path into an (inode, size, mtime, ctime)
    tuple kept on an object per agent, ``agents/`` listed every pass, each
    descriptor stat'ed every fifth pass."""

    class Polled:
        __slots__ = ("descriptor", "descriptor_seen", "memory", "memory_seen")

        def __init__(self, folder: Path) -> None:
            self.memory = os.path.join(str(folder), "MEMORY.md")
            self.descriptor = os.path.join(str(folder), "memd-agent.json")
            self.memory_seen = signature(self.memory)
            self.descriptor_seen = signature(self.descriptor)

    def signature(path: str) -> tuple[int, int, int, int] | None:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    agents = root / "agents"
    polled = [(name, Polled(folder)) for name, folder in folders.items()]
    state = {"passes": 0, "root": frozenset(os.listdir(agents))}

    def one_pass() -> None:
        state["passes"] = int(state["passes"]) + 1
        listing = frozenset(os.listdir(agents))
        _changed = listing ^ state["root"]
        state["root"] = listing
        check_descriptor = int(state["passes"]) % 5 == 0
        for _key, item in polled:
            seen = signature(item.memory)
            if seen != item.memory_seen:
                item.memory_seen = seen
            if check_descriptor:
                descriptor = signature(item.descriptor)
                if descriptor != item.descriptor_seen:
                    item.descriptor_seen = descriptor

    return one_pass


def measure_passes(count: int, rounds: int) -> dict[str, float]:
    """CPU per pass (ms, mean of ``rounds`` interleaved): memd's pass with files
    held open and with every path stat'ed, the previous pass, and two floors:
    a Python loop of one bare ``os.fstat`` per held MEMORY.md and one of one
    bare ``os.stat`` per full path."""
    from memd.poller import SETTLE_S, StatPoller

    with tempfile.TemporaryDirectory(prefix="memd-bench-poll-passes-") as tmp:
        root = Path(tmp)
        folders = make_fleet(root, count)
        passes: dict[str, Callable[[], None]] = {}
        pollers = []
        for name, budget in (("memd, files held open", None), ("memd, paths stat'ed", 0)):
            poller = StatPoller(lambda name: None, lambda agent: None, 1.0, fd_budget=budget)
            poller.watch_root(root / "agents")
            for agent, folder in folders.items():
                poller.watch(agent, folder)
            poller.poll_once()
            passes[name] = poller.poll_once
            pollers.append(poller)
        # Past SETTLE_S, where agents/ is listed on every pass after its stat moved.
        time.sleep(SETTLE_S + 0.1)
        for poller in pollers:
            poller.poll_once()
        if stir_fleet(folders):
            for poller in pollers:  # every file's turn: each change seen
                for _ in range(poller.verify_every + 1):
                    poller.poll_once()
        passes["previous pass (before issue 13)"] = legacy_pass(root, folders)
        paths = [str(folder / "MEMORY.md") for folder in folders.values()]
        # The held poller's own fds (a second set would not fit RLIMIT_NOFILE).
        held = [pollers[0].held_fds(agent)[0] for agent in folders]
        fds = [fd for fd in held if fd >= 0]

        def fstat_floor() -> None:
            for fd in fds:
                os.fstat(fd)

        def lseek_floor() -> None:
            for fd in fds:
                os.lseek(fd, 0, os.SEEK_END)

        def stat_floor() -> None:
            for path in paths:
                os.stat(path)

        passes["floor: bare os.lseek loop"] = lseek_floor
        passes["floor: bare os.fstat loop"] = fstat_floor
        passes["floor: bare os.stat loop"] = stat_floor
        spent: dict[str, float] = dict.fromkeys(passes, 0.0)
        try:
            for _ in range(rounds):
                for name, one_pass in passes.items():
                    start = time.thread_time()
                    one_pass()
                    spent[name] += time.thread_time() - start
        finally:
            for poller in pollers:
                poller.stop()
        return {name: total / rounds for name, total in spent.items()}


def _share(value: float) -> str:
    return "-" if value != value else f"{value:.1%}"  # NaN: not measured


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--anchor-agents", type=int, default=1_000)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--appends", type=int, default=40)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument(
        "--part",
        choices=["passes", "watcher", "daemon", "all"],
        default="all",
        help=(
            "passes: CPU per pass vs the previous pass and the stat floors, interleaved; "
            "watcher: the poller alone vs watchdog; daemon: the whole daemon with --poll"
        ),
    )
    parser.add_argument("--rounds", type=int, default=50, help="interleaved passes (passes)")
    parser.add_argument(
        "--descriptors",
        type=float,
        default=0.0,
        help="share of agents with a memd-agent.json (memd_swarms writes one per agent)",
    )
    parser.add_argument(
        "--fleet",
        action="append",
        choices=["idle", "fresh", "replaced"],
        help="idle (default): written an hour ago; fresh: written now and each appended "
        "to once watched; replaced: each replaced by a rename once watched (each hot). "
        "Give more than one to measure each in turn in one run",
    )
    parser.add_argument("--fresh", action="store_true", help="the same as --fleet fresh")
    args = parser.parse_args(argv)
    DESCRIPTORS["share"] = args.descriptors
    fleets = list(dict.fromkeys((args.fleet or []) + (["fresh"] if args.fresh else [])))
    for fleet in fleets or ["idle"]:
        IDLE_SINCE["at"] = None if fleet != "idle" else time.time() - 3600
        STIR["how"] = "" if fleet == "idle" else fleet
        print(f"== fleet: {fleet}", flush=True)
        run(args)
    return 0


def run(args: argparse.Namespace) -> None:
    """The parts ``args`` asks for, on one kind of fleet."""
    if args.part in ("passes", "all"):
        costs = measure_passes(args.agents, args.rounds)
        load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
        print(
            f"one pass over {args.agents} agents ({args.descriptors:.0%} with a "
            f"memd-agent.json), CPU, mean of {args.rounds} interleaved; load average {load}"
        )
        held = costs["memd, files held open"]
        for name, cost in costs.items():
            print(
                f"  {name:<34} {cost * 1e3:7.2f} ms  {cost / args.agents * 1e6:5.2f} µs/agent  "
                f"{cost / args.interval_s:6.2%} of a core at {args.interval_s:g} s  "
                f"memd held / this = {held / cost:.2f}"
            )
        if args.part == "passes":
            return
    if args.part in ("daemon", "all"):
        row = measure_daemon(args.agents, args.idle_s, args.appends, args.interval_s)
        load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
        print(
            f"memd daemon with --poll, {row['agents']} agents "
            f"({args.descriptors:.0%} with a memd-agent.json), "
            f"poll interval {args.interval_s:g} s, "
            f"load average {load}: {row['threads']} threads, {row['fds']} fds; idle CPU "
            f"{row['idle_cpu']:.1%} of a core over {row['idle_s']:g} s "
            f"(polling thread {_share(row['poll_cpu'])}); "
            f"append -> count p50 {row['p50']:.2f} s, p99 {row['p99']:.2f} s, "
            f"max {row['max']:.2f} s (target poll interval + debounce + 300 ms = "
            f"{row['target']:.2f} s, p99 ratio {row['p99'] / row['target']:.2f}), "
            f"missed {row['missed']}"
        )
        print(f"  threads: {', '.join(sorted(row['thread_names']))}")
        busiest = sorted(row["by_thread"].items(), key=lambda item: -item[1])
        print(
            "  idle CPU by thread: "
            + ", ".join(f"{name} {share:.2%}" for name, share in busiest if share >= 0.0001)
        )
        print(
            "  cyclic GC collections in the idle window (generation 0, 1, 2): "
            + ", ".join(str(n) for n in row["gc"])
        )
        if args.part == "daemon":
            return
    rows = [
        (
            "memd stat poller",
            measure("memd", args.agents, args.idle_s, args.appends, args.interval_s),
        ),
        (
            "watchdog PollingObserver",
            measure("watchdog", args.anchor_agents, args.idle_s, args.appends, args.interval_s),
        ),
    ]
    load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    print(
        f"poll interval {args.interval_s:g} s, {os.cpu_count()} cores, load average {load}, "
        f"{args.descriptors:.0%} of agents with a memd-agent.json"
    )
    columns = ("agents", "threads", "fds", "idle CPU", "thread", "floor", "p50", "p99", "missed")
    print(f"{'watcher':<26}" + "".join(f" {name:>8}" for name in columns))
    for name, row in rows:
        print(
            f"{name:<26} {row['agents']:>8} {row['threads']:>8} {row['fds']:>8} "
            f"{row['idle_cpu']:>8.1%} "
            f"{_share(row['poll_cpu']):>8} {row['floor']:>8.1%} "
            f"{row['p50']:>7.2f}s {row['p99']:>7.2f}s {row['missed']:>8}"
        )
    memd, anchor = rows[0][1], rows[1][1]
    print(
        f"memd's polling thread: {memd['poll_cpu'] / memd['agents'] * 1e6:.2f} µs per agent "
        f"per pass, {memd['poll_cpu'] / memd['floor']:.2f}x the bare-stat floor "
        f"({memd['floor'] / memd['agents'] * 1e6:.2f} µs per stat)"
    )
    per_agent_memd = memd["idle_cpu"] / memd["agents"]
    per_agent_anchor = anchor["idle_cpu"] / anchor["agents"]
    if per_agent_memd > 0:
        print(f"idle CPU per agent: watchdog / memd = {per_agent_anchor / per_agent_memd:.1f}x")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
