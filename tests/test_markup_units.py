"""The units of plain text, Markdown, reStructuredText and AsciiDoc, read
once over the whole document at ingest (rag.ingest.formats.markup): their
spans, kinds and what each is about (pure logic; the documents are excerpts
of the Python 3.11 docs and of Git's manuals, as the bench indexes them)."""

from __future__ import annotations

import time

import pytest

from rag.ingest.formats import load_document
from rag.ingest.formats.document import UNIT_KINDS, Unit
from rag.ingest.formats.markup import dialect_of, find_headings, markup_units, read_markup
from rag.ingest.formats.text import load_text
from tests.python_doc_excerpts import FUNCTOOLS, TEXTWRAP

GIT_STASH = """\
git-stash(1)
============

OPTIONS
-------
-a::
--all::
	This option is only valid for `push` and `save` commands.
+
All ignored and untracked files are also stashed and then cleaned
up with `git clean`.

-u::
--include-untracked::
	All untracked files are stashed.
	Then cleaned.

EXAMPLES
--------

Pulling into a dirty tree::

When you are in the middle of something, you learn that there are
upstream changes.
+
----------------------------------------------------------------
$ git stash
$ git pull
----------------------------------------------------------------

Nothing more.
"""


def texts(text: str, suffix: str = ".txt") -> list[str]:
    return [text[u.start:u.end] for u in markup_units(text, suffix)]


def unit_at(text: str, offset: int, suffix: str = ".txt") -> Unit:
    """The unit of ``text`` that holds character ``offset``."""
    return next(u for u in markup_units(text, suffix) if u.start <= offset < u.end)


def about_of(text: str, offset: int, suffix: str = ".txt") -> str:
    return unit_at(text, offset, suffix).about


def seen(text: str, suffix: str = ".txt") -> list[tuple[str, str, str]]:
    """``(kind, text, about)`` of each unit."""
    return [(u.kind, text[u.start:u.end], u.about) for u in markup_units(text, suffix)]


# -- units (as split_units found them at ask time) ----------------------------


def test_prose_is_split_at_sentence_ends_but_not_after_abbreviations_or_inside_dotted_names():
    text = ("Use os.path.join to join paths, e.g. ``a`` and ``b``.  It calls str.join etc. and more!\n"
            "Written by J. Smith vs. others; see: below.  Really? Yes")
    assert texts(text) == [
        "Use os.path.join to join paths, e.g. ``a`` and ``b``.",
        "It calls str.join etc. and more!",
        "Written by J. Smith vs. others; see: below.",  # never split at ';' or ':'
        "Really?",
        "Yes",
    ]
    assert {u.kind for u in markup_units(text)} == {"text"}


def test_units_are_stripped_ordered_and_their_spans_point_into_the_text():
    text = "  First one.   Second one.  \n\n\n   Third.  "
    assert texts(text) == ["First one.", "Second one.", "Third."]
    for document, suffix in [(text, ".txt"), (FUNCTOOLS, ".rst"), (TEXTWRAP, ".txt"), (GIT_STASH, ".txt")]:
        units = markup_units(document, suffix)
        assert units and all(u.kind in UNIT_KINDS for u in units)
        for unit, after in zip(units, units[1:] + [None]):
            piece = document[unit.start:unit.end]
            assert piece == piece.strip() and any(c.isalnum() for c in piece)
            assert after is None or unit.end <= after.start  # in order, never overlapping


def test_blank_lines_end_a_unit():
    assert texts("A sentence without end\n\nanother without end") == ["A sentence without end",
                                                                      "another without end"]


def test_directives_headings_rows_items_and_code_lines_are_units_of_their_own():
    units = seen(FUNCTOOLS, ".rst")
    kinds = {text: kind for kind, text, _ in units}
    assert units[0][:2] == ("heading", FUNCTOOLS.split("\n")[0])  # the heading, not its underline
    assert not any(set(text) <= set("=-~") for _, text, _ in units)
    signature = ".. decorator:: lru_cache(user_function)\n               lru_cache(maxsize=128, typed=False)"
    assert kinds[signature] == "signature"
    assert kinds["Decorator to wrap a function with a memoizing callable that saves up to the\n   *maxsize* most "
                 "recent calls."] == "text"
    assert kinds["@lru_cache(maxsize=32)"] == kinds["def get_pep(num):"] == "code"  # a literal block, line by line
    assert not any(text.startswith(":synopsis:") for _, text, _ in units)  # a directive's option is no unit
    sheet = "Region | Units\nCity: Oslo; Units: 700\nCity: Bergen; Units: 300"
    assert seen(sheet) == [("text", "Region | Units", ""), ("row", "City: Oslo; Units: 700", ""),
                           ("row", "City: Bergen; Units: 300", "")]
    items = "Options:\n\n* *level* - Set the root logger level.\n  It is optional.\n* *format* - Use it.\n"
    assert seen(items) == [("text", "Options:", ""),
                           ("item", "* *level* - Set the root logger level.\n  It is optional.", ""),
                           ("item", "* *format* - Use it.", "")]
    markdown = "# Install\n\nRun it. Then stop.\n\n```\npip install x\n```\n"
    assert seen(markdown, ".md") == [("heading", "# Install", ""), ("text", "Run it.", "Install"),
                                     ("text", "Then stop.", "Install"), ("code", "pip install x", "Install")]


def test_code_lines_of_fences_doctests_literal_blocks_and_code_directives():
    rst = ("Usage\n=====\n\n.. code-block:: python\n\n   import os\n   os.sep\n\n"
           ">>> 1 + 1\n2\n\nAfter it.\n")
    assert seen(rst, ".rst") == [("heading", "Usage", ""), ("code", "import os", "Usage"), ("code", "os.sep", "Usage"),
                                 ("code", ">>> 1 + 1", "Usage"), ("code", "2", "Usage"), ("text", "After it.", "Usage")]


# -- what a unit is about (as about_of found it at ask time) -----------------


def test_about_is_the_enclosing_signature_with_its_continuation_lines():
    at = FUNCTOOLS.index("If *maxsize*")
    assert about_of(FUNCTOOLS, at) == "lru_cache(user_function) lru_cache(maxsize=128, typed=False)"
    assert about_of(FUNCTOOLS, FUNCTOOLS.index("@lru_cache(maxsize=32)")).startswith("lru_cache(")
    assert about_of(FUNCTOOLS, FUNCTOOLS.index("Decorator to wrap")) == about_of(FUNCTOOLS, at)
    # Backslash continuations are joined too.
    assert about_of(TEXTWRAP, TEXTWRAP.index("Wraps")).startswith('wrap(text, width=70, *, initial_indent="",'
                                                                  ' subsequent_indent=""')
    # A nested directive encloses its own body; the directive line itself is about what is above it.
    assert about_of(TEXTWRAP, TEXTWRAP.index("(default: ``True``)")) == "break_long_words"
    assert about_of(TEXTWRAP, TEXTWRAP.index(".. attribute::")) == "TextWrapper(**kwargs)"
    signature = unit_at(FUNCTOOLS, FUNCTOOLS.index(".. decorator::"))
    assert signature.kind == "signature" and signature.about.startswith("functools — Higher-order")


def test_a_directive_that_is_not_an_api_does_not_enclose():
    text = ".. function:: f(x)\n\n   Does y.\n\n   .. note::\n\n      Beware of z.\n"
    assert about_of(text, text.index("Beware")) == "f(x)"
    text = "Section\n-------\n\n.. function:: f(x)\n\n   Does y.\n\nPlain text after it.\n"
    assert about_of(text, text.index("Plain")) == "Section"
    assert about_of(text, text.index("Does y")) == "f(x)"


def test_about_is_the_heading_above_or_nothing():
    text = "Intro.\n\nCommand-Line Interface\n----------------------\n\nThe server listens to port 8000.\n"
    assert about_of(text, text.index("The server")) == "Command-Line Interface"
    assert about_of(text, 0) == ""
    assert about_of("# Setup\n\nRun it.\n", 9, ".md") == "Setup"
    assert about_of("Just prose.", 0) == ""
    # A heading is about the heading it lies under.
    nested = "Top\n===\n\nSub\n---\n\nText.\n\nOther\n-----\n"
    assert [(k, t, a) for k, t, a in seen(nested) if k == "heading"] == [
        ("heading", "Top", ""), ("heading", "Sub", "Top"), ("heading", "Other", "Top")]


def test_a_labelled_list_definition_is_one_unit_about_its_terms():
    # AsciiDoc, as Git's option lists are written; reStructuredText's "Example::" before a literal block is not a term.
    text = "OPTIONS\n-------\n\n-u::\n--include-untracked::\n\tAll untracked files are stashed.\n\tThen cleaned.\n"
    assert seen(text) == [("heading", "OPTIONS", ""),
                          ("definition", "All untracked files are stashed.\n\tThen cleaned.", "-u, --include-untracked")]
    rst = "Usage\n=====\n\nExample::\n\n   run(x)\n"
    assert about_of(rst, rst.index("run(x)")) == "Usage" and unit_at(rst, rst.index("run(x)")).kind == "code"


def test_a_row_that_says_its_headers_is_about_the_heading_above_it():
    sheet = "Sheet1\n======\n\nCity: Oslo; Pop: 700k\nCity: Bergen; Pop: 290k"
    assert seen(sheet)[1:] == [("row", "City: Oslo; Pop: 700k", "Sheet1"), ("row", "City: Bergen; Pop: 290k", "Sheet1")]


# -- definitions (issue 54) ---------------------------------------------------


def test_a_description_is_one_unit_so_its_default_stays_with_it():
    definition = "Maximum time between checkpoints. The default is five minutes."
    for text, suffix in [(f"checkpoint_timeout::\n\t{definition}\n", ".txt"),
                         (f"checkpoint_timeout (integer)\n    {definition}\n", ".rst"),
                         (f"checkpoint_timeout\n: {definition}\n", ".md"),
                         (f":checkpoint_timeout: {definition}\n", ".rst")]:
        units = seen(text, suffix)
        assert units[-1] == ("definition", definition, units[-1][2]) and units[-1][2].startswith("checkpoint_timeout")


def test_asciidoc_items_their_terms_inline_descriptions_and_attached_blocks():
    units = seen(GIT_STASH)
    assert ("definition", "This option is only valid for `push` and `save` commands.", "-a, --all") in units
    # A block attached with "+" is the item's, though at the margin.
    assert ("definition", "All ignored and untracked files are also stashed and then cleaned\nup with `git clean`.",
            "-a, --all") in units
    assert about_of(GIT_STASH, GIT_STASH.index("Then cleaned")) == "-u, --include-untracked"
    # A description after a blank line; a listing attached to it, line by line.
    assert about_of(GIT_STASH, GIT_STASH.index("When you are")) == "Pulling into a dirty tree"
    assert ("code", "$ git pull", "Pulling into a dirty tree") in units
    # A paragraph at the margin after a blank line ends the list.
    assert units[-1] == ("text", "Nothing more.", "EXAMPLES")
    # "term;;" and a description on the term's line; nested lists (":::") and their attached blocks.
    text = ("`araxis`;;   Use Araxis Merge.\n`bc`;;\n\tUse Beyond Compare.\n\n"
            "--diff-merges=<fmt>::\n\tSpecify the format.\n+\n--diff-merges=off:::\n--no-diff-merges:::\n\tDisable.\n"
            "+\nSubject to change.\n\n--cc::\n\tDense.\n")
    assert seen(text) == [("definition", "Use Araxis Merge.", "araxis"), ("definition", "Use Beyond Compare.", "bc"),
                          ("definition", "Specify the format.", "--diff-merges=<fmt>"),
                          ("definition", "Disable.", "--diff-merges=off, --no-diff-merges"),
                          ("definition", "Subject to change.", "--diff-merges=off, --no-diff-merges"),
                          ("definition", "Dense.", "--cc")]


def test_asciidoc_open_blocks_preprocessor_lines_and_listing_blocks():
    text = ("write::\n\tWrite a file:\n+\n--\n\t--bitmap::\n\t\tWrite a bitmap.\n\n\tLater words.\n--\n\n"
            "-p::\n\tGenerate patch.\nifdef::git-diff[]\n\tThis is the default.\nendif::git-diff[]\n\n"
            "EXAMPLES\n--------\n\n----\n$ git bisect good\n----\n\nText.\n")
    units = seen(text)
    assert units[:3] == [("definition", "Write a file:", "write"), ("definition", "Write a bitmap.", "--bitmap"),
                         ("definition", "Later words.", "--bitmap")]
    assert ("definition", "This is the default.", "-p") in units
    assert ("code", "$ git bisect good", "EXAMPLES") in units and units[-1] == ("text", "Text.", "EXAMPLES")
    # A one-line listing block is no title.
    assert [h for _, _, h in find_headings(text, markdown=False)] == ["EXAMPLES"]


def test_restructuredtext_definition_field_and_option_lists():
    text = ("Options\n=======\n\n-v, --verbose   Be verbose. Really.\n-f FILE         Read from FILE,\n"
            "                or from stdin.\n--long\n    Described below. The default is no.\n\n"
            ":Author: Me and you.\n:Version: 1.0\n\n``'r'``\n   open for reading\n``'w'``\n   open for writing\n\n"
            "term (integer)\n    First paragraph. Two sentences.\n\n    Second paragraph.\n\n    * an item\n")
    assert seen(text, ".rst")[1:] == [
        ("definition", "Be verbose. Really.", "-v, --verbose"),
        ("definition", "Read from FILE,\n                or from stdin.", "-f FILE"),
        ("definition", "Described below. The default is no.", "--long"),
        ("definition", "Me and you.", "Author"), ("definition", "1.0", "Version"),
        ("definition", "open for reading", "'r'"), ("definition", "open for writing", "'w'"),
        ("definition", "First paragraph. Two sentences.", "term (integer)"),
        ("definition", "Second paragraph.", "term (integer)"), ("item", "* an item", "term (integer)")]


def test_markdown_has_no_indented_definition_lists():
    text = "A line\n    indented under it.\n"
    assert seen(text, ".md") == [("text", "A line\n    indented under it.", "")]


# -- tables -------------------------------------------------------------------


def test_a_pipe_table_row_is_about_its_header():
    text = ("# Settings\n\n| Name | Default |\n|------|--------:|\n| timeout | 5min |\n| `level` | 2 |\n\nAfter.\n")
    assert seen(text, ".md") == [("heading", "# Settings", ""), ("row", "| timeout | 5min |", "Name | Default"),
                                 ("row", "| `level` | 2 |", "Name | Default"), ("text", "After.", "Settings")]


def test_a_grid_table_row_over_several_lines_is_one_unit_about_its_header():
    text = """\
Comparisons
-----------

+------------+---------------------+-------+
| Operation  | Meaning             | Notes |
|            | (in words)          |       |
+============+=====================+=======+
| ``<``      | strictly less than  |       |
+------------+---------------------+-------+
| ``is not`` | negated object      | \\(1)  |
|            | identity            |       |
+------------+---------------------+-------+
"""
    rows = [(k, t, a) for k, t, a in seen(text, ".rst") if k == "row"]
    assert rows == [
        ("row", "| ``<``      | strictly less than  |       |", "Operation | Meaning (in words) | Notes"),
        ("row", "| ``is not`` | negated object      | \\(1)  |\n|            | identity            |       |",
         "Operation | Meaning (in words) | Notes")]
    headerless = "Section\n-------\n\n+-----+-----+\n| a   | b   |\n+-----+-----+\n"
    assert seen(headerless, ".rst")[1:] == [("row", "| a   | b   |", "Section")]


def test_a_simple_table_row_is_about_its_header_and_goes_on_over_a_blank_first_column():
    text = """\
=========  =======================================
Character  Meaning
=========  =======================================
``'r'``    open for reading (default)
``'w'``    open for writing, truncating the file
           first
=========  =======================================
"""
    assert seen(text, ".rst") == [
        ("row", "``'r'``    open for reading (default)", "Character | Meaning"),
        ("row", "``'w'``    open for writing, truncating the file\n           first", "Character | Meaning")]


# -- dialects, headings and the loader -----------------------------------------


def test_the_dialect_is_told_by_the_suffix_and_the_markup():
    assert dialect_of("anything", ".md") == "markdown"
    assert dialect_of(FUNCTOOLS) == "rst" and dialect_of("x", ".rst") == "rst"
    assert dialect_of(GIT_STASH) == "asciidoc"
    assert dialect_of("Usage\n=====\n\nExample::\n\n   run(x)\n") == "plain"


def test_asciidoc_titles_after_anchors_and_no_titles_inside_listings():
    text = ("git-merge-tree(1)\n=================\n\n[[NEWMERGE]]\nDESCRIPTION\n-----------\n\n"
            "------------\n$ git fetch origin\n\nmore\n------------\n\nOPTIONS\n-------\n\n== Summary\n")
    assert [(level, h) for _, level, h in find_headings(text, markdown=False)] == [
        (1, "git-merge-tree(1)"), (2, "DESCRIPTION"), (2, "OPTIONS"), (2, "Summary")]


def test_load_text_and_load_document_give_the_units_read_at_ingest():
    data = FUNCTOOLS.encode()
    doc = load_text("library/functools.rst.txt", ".txt", data)
    assert doc.units == read_markup(FUNCTOOLS, ".txt").units and doc.headings == read_markup(FUNCTOOLS).headings
    assert doc.title == "functools — Higher-order functions and operations on callable objects"
    assert load_document("library/functools.rst.txt", ".txt", data).units == doc.units
    markdown = load_document("README.md", ".md", b"# Install\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert [(u.kind, u.about) for u in markdown.units] == [("heading", ""), ("row", "a | b")]


@pytest.mark.parametrize("text", [
    "".join(" " * k + "x\n" for k in range(3000)),  # a term over a term over a term ...
    ("a" + " " * 900 + "b::\n\tdef\n") * 1000,  # terms with long runs of spaces (clean_heading)
    ("a" + ":" * 900 + "b::\n\tdef\n") * 1000,  # and of colons (a role's pattern)
    "#" + " " * 100_000 + "x\n" + "| a " * 20_000 + "\n|" + "---|" * 20_000 + "\n",
    "k: v; " * 30_000 + "\n" + ".. " + "a:" * 50_000 + "x\n" + ":" + "a" * 100_000 + " b\n",
    "+\n--\n" * 20_000 + "----\n" * 20_000,
])
def test_hostile_texts_are_read_in_linear_time(text):
    for suffix in (".txt", ".md", ".rst"):
        began = time.perf_counter()
        markup_units(text, suffix)
        assert time.perf_counter() - began < 2.0
