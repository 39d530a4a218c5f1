"""Source code, by file extension: the text as it is, to be split along the
language's structure (langchain-text-splitters' language separators, chosen
by the chunker from ``LoadedDocument.language``), each chunk knowing its line
span. In Python files the classes and functions are the outline (``ast``),
so a chunk is indexed with the names of the definitions around it.

Does not: run, import or highlight the code.
"""

from __future__ import annotations

import ast
import posixpath

from .document import LoadedDocument, Segment
from .text import decode_text

# Extension -> langchain_text_splitters.Language value.
LANGUAGES = {
    ".py": "python", ".pyi": "python", ".js": "js", ".mjs": "js", ".cjs": "js", ".jsx": "js", ".ts": "ts",
    ".tsx": "ts", ".go": "go", ".rs": "rust", ".java": "java", ".kt": "kotlin", ".kts": "kotlin", ".scala": "scala",
    ".c": "c", ".h": "c", ".cpp": "cpp", ".cc": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp", ".cs": "csharp",
    ".rb": "ruby", ".php": "php", ".swift": "swift", ".lua": "lua", ".hs": "haskell", ".ex": "elixir",
    ".exs": "elixir", ".ps1": "powershell", ".proto": "proto", ".sol": "sol",
}
CODE_SUFFIXES = frozenset(LANGUAGES)


def python_outline(text: str) -> tuple[tuple[int, int, str], ...]:
    """``(offset, depth, "class Name" | "def name")`` of every class and
    function of a Python source, in order; empty when it does not parse.

    ``python_outline("class A:\\n    def f(self): pass\\n") -> ((0, 1, "class A"), (9, 2, "def f"))``
    """
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    starts, at = [], 0
    for line in text.split("\n"):
        starts.append(at)
        at += len(line) + 1
    found: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "class" if isinstance(child, ast.ClassDef) else "def"
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                found.append((starts[first - 1], depth + 1, f"{kind} {child.name}"))
                visit(child, depth + 1)
            else:
                visit(child, depth)

    visit(tree, 0)
    return tuple(sorted(found))


def load_code(source: str, suffix: str, data: bytes) -> LoadedDocument:
    """A source file: its text with numbered lines, its language, its
    file name as title and, for Python, its definitions as the outline."""
    text = decode_text(source, data)
    language = LANGUAGES[suffix]
    headings = python_outline(text) if language == "python" else ()
    return LoadedDocument(text, (Segment(0, numbered="lines"),), title=posixpath.basename(source), headings=headings,
                          language=language)
