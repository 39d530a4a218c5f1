"""Source code, by file extension: the text as it is, to be split along the
language's structure (langchain-text-splitters' language separators, chosen
by the chunker from ``LoadedDocument.language``), each chunk knowing its line
span. In Python files the classes and functions are the outline (``ast``),
so a chunk is indexed with the names of the definitions around it. Each
line that holds a word is a "code" unit (docstrings and comments too),
about the innermost class or function enclosing it ("" at module level and
in other languages).

Does not: run, import or highlight the code.
"""

from __future__ import annotations

import ast
import posixpath
from typing import Sequence

from .document import LoadedDocument, Segment, Unit
from .text import decode_text
from .units import stripped

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
    return tuple((start, depth, name) for start, _, depth, name in _python_definitions(text))


def _python_definitions(text: str) -> list[tuple[int, int, int, str]]:
    """``(offset, end, depth, name)`` of every class and function of a
    Python source in order of offset, ``end`` the offset just past its last
    line; empty when it does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    starts, at = [], 0
    for line in text.split("\n"):
        starts.append(at)
        at += len(line) + 1
    found: list[tuple[int, int, int, str]] = []

    def visit(node: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "class" if isinstance(child, ast.ClassDef) else "def"
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                last = child.end_lineno or child.lineno
                end = starts[last] if last < len(starts) else len(text)
                found.append((starts[first - 1], end, depth + 1, f"{kind} {child.name}"))
                visit(child, depth + 1)
            else:
                visit(child, depth)

    visit(tree, 0)
    return sorted(found)


def code_units(text: str, definitions: Sequence[tuple[int, int, int, str]] = ()) -> list[Unit]:
    """Each line of ``text`` that holds a word as a "code" unit, stripped,
    about the innermost of ``definitions`` (``(offset, end, depth, name)``
    in order of offset) that encloses it, "" for none.

    ``code_units("def f():\\n    return 1\\n", [(0, 22, 1, "def f")])`` ->
    ``[Unit(0, 8, "code", "def f"), Unit(13, 21, "code", "def f")]``
    """
    units: list[Unit] = []
    enclosing: list[tuple[int, str]] = []  # (end, name) of the definitions open at a line, innermost last
    i, at = 0, 0
    while at <= len(text):
        stop = text.find("\n", at)
        stop = len(text) if stop < 0 else stop
        while i < len(definitions) and definitions[i][0] <= at:
            while enclosing and enclosing[-1][0] <= definitions[i][0]:
                enclosing.pop()
            enclosing.append((definitions[i][1], definitions[i][3]))
            i += 1
        while enclosing and enclosing[-1][0] <= at:
            enclosing.pop()
        if (span := stripped(text, at, stop)) is not None:
            units.append(Unit(*span, "code", enclosing[-1][1] if enclosing else ""))
        at = stop + 1
    return units


def load_code(source: str, suffix: str, data: bytes) -> LoadedDocument:
    """A source file: its text with numbered lines, its language, its
    file name as title and, for Python, its definitions as the outline."""
    text = decode_text(source, data)
    language = LANGUAGES[suffix]
    definitions = _python_definitions(text) if language == "python" else []
    headings = tuple((start, depth, name) for start, _, depth, name in definitions)
    return LoadedDocument(text, (Segment(0, numbered="lines"),), title=posixpath.basename(source), headings=headings,
                          language=language, units=tuple(code_units(text, definitions)))
