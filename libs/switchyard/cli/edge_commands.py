"""`sy edge hash-key`: the SHA-256 an operator puts in the edge's API key file."""

from __future__ import annotations

import secrets
from typing import Annotated

import typer

from switchyard.apikeys import hash_key

app = typer.Typer(help="The HTTP edge.", no_args_is_help=True)


@app.command("hash-key")
def hash_key_command(
    key: Annotated[str | None, typer.Argument(help="the API key; omitted = generate one")] = None,
) -> None:
    """Print `key` (a new random one if omitted) and the hash to store for it."""
    key = key or f"sk-sy-{secrets.token_urlsafe(24)}"
    typer.echo(f"key:  {key}")
    typer.echo(f"hash: {hash_key(key)}")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="edge")
