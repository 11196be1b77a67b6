"""memd: a memory-compaction daemon for AI agents."""

__version__ = "0.1.0"

# Set by the CLI (memd.cli.app.main) for every command but ``run``: memd.logs,
# once imported, sends warnings to stderr (memd.logs.log_cli_warnings_to_stderr).
CLI_LOGS_TO_STDERR = False
