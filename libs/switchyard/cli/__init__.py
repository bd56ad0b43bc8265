"""The `sy` command line."""

from rich.console import Console

# Shared by the command modules: what a command prints, and its progress and errors.
console = Console()
err = Console(stderr=True)
