"""memd run commands."""

from memd.cli.app import app

__all__ = ["app"]
