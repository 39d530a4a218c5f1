"""``rag collections list``, ``create NAME`` and ``delete NAME``: the named
sets of documents an index holds (``rag ingest --collection NAME`` also
makes one; ``rag ask --collection NAME`` draws on it alone).

Does not: ingest or answer (``documents`` and ``ask`` do).
"""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console

from .common import INDEX_OPTION, app, command_pipeline, echo_json, err, settings, user_errors

collections_app = typer.Typer(help="The collections of documents in the index.", no_args_is_help=True)
app.add_typer(collections_app, name="collections")


@collections_app.command("list")
def list_collections(
    index: Optional[str] = INDEX_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print them as JSON."),
) -> None:
    """Every collection of the index with the documents it holds."""
    with user_errors():
        found = command_pipeline(settings(index=index)).collections()
    if as_json:
        echo_json({"collections": [{"name": name, "documents": n} for name, n in sorted(found.items())]})
        return
    if not found:
        err().print("no collections: the index is empty (rag ingest PATH --collection NAME makes one)")
    console = Console(highlight=False)
    for name, n in sorted(found.items()):
        console.print(f"{name}\t{n} document{'s' if n != 1 else ''}", markup=False)


@collections_app.command("create")
def create_collection(
    name: str = typer.Argument(..., help="The collection to make, holding no documents yet."),
    index: Optional[str] = INDEX_OPTION,
) -> None:
    """Make collection NAME, empty, for documents to be ingested or
    uploaded into (one that exists already is left as it is)."""
    with user_errors():
        new = command_pipeline(settings(index=index)).create_collection(name)
    err().print(f"created the collection {name}" if new else f"the collection {name} exists already; left as it is")


@collections_app.command("delete")
def delete_collection(
    name: str = typer.Argument(..., help="The collection to delete, with every document in it."),
    index: Optional[str] = INDEX_OPTION,
) -> None:
    """Delete collection NAME and its documents' chunks from the index, at
    once (the files on disk stay)."""
    with user_errors():  # none such: DocumentNotFound, one line and exit 1
        removed = command_pipeline(settings(index=index)).remove_collection(name)
    err().print(f"deleted the collection {name}: {removed} document{'s' if removed != 1 else ''}")
