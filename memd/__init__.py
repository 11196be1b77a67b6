"""memd: a memory-compaction daemon for AI agents."""

__version__ = "0.1.0"
