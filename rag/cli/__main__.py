"""``python -m rag.cli``: the ``rag`` command."""

from . import main

main()
