"""The daemon: single-purpose services linked one way (see :mod:`memd.daemon.lifecycle`).

* :mod:`~memd.daemon.registry`: the agents (scan, refused names, add/remove, recovery),
  each rescan published;
* :mod:`~memd.daemon.watches`: the watcher's one driver, following the published agent set;
* :mod:`~memd.daemon.counter`: watcher hints on a queue → debounce → counts;
* :mod:`~memd.daemon.runner`: job decisions → the scheduler; outcomes → ledger, metrics;
* :mod:`~memd.daemon.flusher`: registry snapshots → state DB, heartbeat, ``STATUS=``;
* :mod:`~memd.daemon.recall`, :mod:`~memd.daemon.metrics`: the recall index and the
  metrics endpoint, each started with ``start(exit_stack)``;
* :mod:`~memd.daemon.wiring`: every service built from the config, linked one way;
* :mod:`~memd.daemon.checks`: what start-up and reload say about the surroundings;
* :mod:`~memd.daemon.lifecycle`: signals, ordered start-up and shutdown, reload fan-out.
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
