"""The daemon: single-purpose services linked one way (see :mod:`memd.daemon.lifecycle`).

* :mod:`~memd.daemon.registry`: the agents (scan, refused names, add/remove, recovery),
  each rescan published;
* :mod:`~memd.daemon.watches`: the watcher's one driver, following the published agent set;
* :mod:`~memd.daemon.counter`: watcher hints (and the periodic reconcile's) on a queue
  → debounce → counts, all on the count thread; each tick takes the runner's due wake-ups;
* :mod:`~memd.daemon.runner`: job decisions → the scheduler (compactions) and each
  agent's wake-up time (kept, taken by the counter); outcomes → ledger, metrics;
* :mod:`~memd.daemon.committed`: a committed compaction's outcome, handed on by the
  runner once the agent's lock is let go → recall, archive figures, retention's report;
* :mod:`~memd.daemon.flusher`: registry snapshots → state DB, heartbeat, ``STATUS=``;
* :mod:`~memd.daemon.recall`, :mod:`~memd.daemon.metrics`: the recall index and the
  metrics endpoint;
* :mod:`~memd.daemon.wiring`: every service built from the config, linked one way
  (building opens no file and starts no thread);
* :mod:`~memd.daemon.checks`: what start-up and reload say about the surroundings;
* :mod:`~memd.daemon.lifecycle`: signals, ordered start-up and shutdown, reload fan-out.

Each service is started with ``start(exit_stack, ...)``, which pushes its own stop
(APScheduler 4's pattern); the lifecycle starts each before the stage that feeds
it, so shutdown stops the feeders first and is the reverse of start-up by
construction.

Each service owns its state and its lock: the registry its table (and each
entry's policy), the runner the job states and tallies, the spending guard its
window, the summarizer source the summarizer in use, the counter its
debouncer, the flusher its snapshot-and-write, the archive survey its figures,
the watch service its ticks; an entry's count is written under its own
``count_lock``. The only nestings, always in this order
(so no two locks are ever taken in both orders):

* counter → registry → descriptors (a ``memd-agent.json`` hint re-resolves a policy);
* flusher → registry, and watch service → registry (a snapshot, the agent set);
* runner → spending guard, scheduler, metrics (leaves); the summarizer source's
  lock is a leaf too (taken with no other held);
* an entry's ``count_lock`` → metrics, the count-update queue (leaves).

The registry calls no service while holding its lock, so it ends every chain;
otherwise a service calls the next one only after letting its own lock go
(a count and a flush return what they found; the caller acts on it).
"""

from memd.daemon.entries import AgentEntry
from memd.daemon.lifecycle import EXIT_FORCED, EXIT_OK, Daemon, DaemonOptions, run_daemon
from memd.daemon.runner import CompactFn

__all__ = [
    "EXIT_FORCED",
    "EXIT_OK",
    "AgentEntry",
    "CompactFn",
    "Daemon",
    "DaemonOptions",
    "run_daemon",
]
