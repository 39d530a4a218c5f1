"""``rag keys new HOLDER``: a new API key for ``rag serve``'s key file
(``RAG_SERVE_KEYS_FILE``), printed once with the file's entry for it.

Does not: write the key file (the entry is for the person keeping it).
"""

from __future__ import annotations

import json
from typing import List

import typer

from ..errors import RagError
from ..index.collection_names import EVERY_COLLECTION_NAME, check_collection_name
from .common import app, err, user_errors

keys_app = typer.Typer(help="API keys for rag serve's key file (RAG_SERVE_KEYS_FILE).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("new")
def new(
    holder: str = typer.Argument(..., help="Who holds the key: a name for the key file, e.g. alice or "
                                         "alice@example.org (letters, digits, '.', '_', '@', '-')."),
    collection: List[str] = typer.Option(
        [], "--collection", help="NAME:read or NAME:write (repeatable; '*' for every collection)."),
) -> None:
    """Make a random key; print it (once: only its hash is kept) and the key
    file's TOML entry for HOLDER."""
    from ..service.keys import check_holder, new_key

    with user_errors():
        rights: dict[str, str] = {}
        for given in collection:
            name, _, right = given.rpartition(":")
            if right not in ("read", "write") or not name:
                raise RagError(f"--collection {given!r}: write NAME:read or NAME:write")
            rights[name if name == EVERY_COLLECTION_NAME else check_collection_name(name, "--collection")] = right
        check_holder(holder, f"holder {holder!r}")  # as the key file's reader will check it
        key, digest = new_key()
    err().print("the key (shown once; give it to its holder, keep only the entry below):", style="bold")
    typer.echo(key)
    entry = ", ".join(f'"{name}" = "{right}"' for name, right in rights.items())
    err().print("its entry in the key file:", style="bold")
    # A name with '.' or '@' is quoted: bare, TOML would read alice.b as a table inside a table.
    table = holder if holder.replace("-", "").replace("_", "").isalnum() else json.dumps(holder)
    typer.echo(f'[keys.{table}]\nsha256 = "{digest}"\ncollections = {{ {entry} }}')
