"""Recall over archived history: the FTS5 index, the agent socket."""
