"""Plain text, Markdown, reStructuredText and AsciiDoc read once, whole, at
ingest: the section headings of the outline and the document's own units,
each with what it is about.

The units (see :class:`~.document.Unit`):

- a heading ("heading", about its parent heading);
- an API directive's signature with its continuation lines (``.. function::
  wrap(text, width=70, \\`` ...: "signature", about what encloses the
  directive); what the directive's body holds is about that signature,
  joined to one line;
- the description of a definition item: an AsciiDoc labelled list's
  (``term::``, ``term;;``, several terms on consecutive lines joined ", ",
  blocks attached with ``+``), a reStructuredText definition list's (a
  term over its indented description), field list's (``:name: body``) and
  option list's (``-f FILE, --file=FILE  Read it.``), Markdown's ``Term``
  over ``: description``: each paragraph one "definition", about the terms;
- a list item, its continuation lines included ("item");
- a table's body row ("row"): a Markdown pipe table's, a reStructuredText
  grid or simple table's (a grid row over several lines whole), about the
  header (its cells joined " | "; about what encloses the table when it has
  none); a ``header: value; ...`` row, which says its headers itself, about
  what encloses it;
- a code line ("code"): in a fence, a doctest, a literal block after
  ``::``, a code directive's body, an AsciiDoc listing or literal block;
- else prose, split into sentences ("text").

What encloses a unit: the innermost definition item or API directive it lies
in (by indentation in reStructuredText and plain text; by AsciiDoc's list
rules), else the nearest heading above it ("" if none).

The dialect is Markdown by the file's suffix; reStructuredText for ``.rst``
or a text with directives or roles; AsciiDoc for a text with a labelled
list's term over its description, a list continuation (a lone ``+``), a
preprocessor line (``ifdef::x[]``), an ``== Title``, a block attribute
(``[source,sh]``, ``[[anchor]]``) or a ``linkgit:``; else plain text, read
by reStructuredText's indentation rules. In AsciiDoc ``term::`` over a blank
line is a term (its description may follow a blank line); elsewhere it
introduces a literal block.

Every pattern runs over one line, or is matched by hand where a pattern
would backtrack over a long line; the text is read in one pass of its
lines, with lookups by bisection.

Where it is done: ``markup_titles`` finds the titles (the outline),
``markup_reader`` reads the units of reStructuredText, Markdown and plain
text, ``asciidoc_reader`` AsciiDoc's, with the line syntax of
``markup_syntax`` and ``asciidoc_syntax``; this module says which dialect a
text is written in and puts the outline and the units together.

Does not: render markup (units are spans of the text as written) or decode files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .asciidoc_reader import AsciidocReader
from .document import Unit
from .markup_reader import MarkupReader
from .markup_syntax import MAX_HEADING_CHARS, clean_heading
from .markup_titles import find_titles

__all__ = ["MARKDOWN_SUFFIXES", "DIALECTS", "MAX_HEADING_CHARS", "Markup", "clean_heading", "dialect_of",
           "find_headings", "markup_units", "read_markup"]

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
DIALECTS = ("markdown", "rst", "asciidoc", "plain")

# What says a text is reStructuredText, or AsciiDoc (a term over its definition, a list continuation, a
# conditional or include line, a link to a git manual page).
_RST_SIGNS = re.compile(r"^[ \t]*\.\.[ \t]+[\w:.-]+::|:(?:func|mod|class|meth|ref|doc|attr|exc|data|term|option):`",
                        re.MULTILINE)
_ADOC_SIGNS = re.compile(r"^(?:[^\s.][^\n]*(?:::|;;)[ \t]*\n[ \t]*\S|\+[ \t]*\n\S|(?:ifn?def|endif|include)::\S*\["
                         r"|={1,5} \S|\[(?:source|verse|NOTE|TIP|WARNING|IMPORTANT|CAUTION|listing|literal|quote)\b"
                         r"|\[\[[\w-]+\]\][ \t]*$)|linkgit:", re.MULTILINE)


def dialect_of(text: str, suffix: str = ".txt") -> str:
    """Which markup ``text`` is written in: "markdown" (by its suffix),
    "rst", "asciidoc" or "plain" (see the module's notes).

    ``dialect_of("-u::\\n\\tAll untracked files.\\n") -> "asciidoc"``
    """
    suffix = suffix.lower()
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown"
    if suffix == ".rst" or _RST_SIGNS.search(text):
        return "rst"
    if _ADOC_SIGNS.search(text):
        return "asciidoc"
    return "plain"


@dataclass(frozen=True)
class Markup:
    """What :func:`read_markup` found: the ``dialect``, the outline
    (``(offset, level, heading)`` in order) and the units in order."""

    dialect: str
    headings: tuple[tuple[int, int, str], ...]
    units: tuple[Unit, ...]


def read_markup(text: str, suffix: str = ".txt") -> Markup:
    """The outline and the units of a ``.txt``, ``.md``, ``.markdown`` or
    ``.rst`` text (its line endings ``\\n``).

    ``read_markup("Usage\\n=====\\n\\nRun it. Then stop.\\n").units`` -> the heading
    "Usage" (about ""), then "Run it." and "Then stop." about "Usage".
    """
    dialect = dialect_of(text, suffix)
    lines = text.split("\n")
    titles = find_titles(lines, dialect)
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    headings = tuple((starts[t.first], t.level, t.title) for t in titles)
    reader = AsciidocReader if dialect == "asciidoc" else MarkupReader
    units = reader(text, lines, starts, titles, headings, dialect).read()
    return Markup(dialect, headings, tuple(units))


def markup_units(text: str, suffix: str = ".txt") -> list[Unit]:
    """The units of a ``.txt``, ``.md``, ``.markdown`` or ``.rst`` text:
    :func:`read_markup`'s.

    ``markup_units("-u::\\n--include-untracked::\\n\\tAll untracked files are stashed.\\n")``
    -> ``[Unit(30, 62, "definition", "-u, --include-untracked")]``
    """
    return list(read_markup(text, suffix).units)


def find_headings(text: str, *, markdown: bool, dialect: str | None = None) -> tuple[tuple[int, int, str], ...]:
    """``(offset, level, heading)`` of the headings of ``text``, in order.

    Headings are the underlined titles of reStructuredText and of Markdown's
    setext form (a line of text over a line of one repeated punctuation
    character at least as long), for Markdown the ``#`` headings outside
    code fences, for AsciiDoc its two-line titles (not overlined; none
    inside a listing or literal block) and ``== Title`` lines. Levels follow
    reStructuredText's rule: each underline style gets the next level the
    first time it is seen (AsciiDoc's are fixed: ``=`` 1, ``-`` 2, ``~`` 3 ...).

    ``find_headings("Title\\n=====\\n\\nBody", markdown=False) -> ((0, 1, "Title"),)``
    """
    dialect = "markdown" if markdown else (dialect or dialect_of(text))
    lines = text.split("\n")
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    return tuple((starts[t.first], t.level, t.title) for t in find_titles(lines, dialect))
