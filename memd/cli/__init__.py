"""The ``memd`` command line (typer + rich). Each command lives in its own module."""
