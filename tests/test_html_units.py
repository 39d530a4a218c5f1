"""The HTML reader's units (issue 54): each heading, sentence, list item,
definition, table row and code line of a page, with what it is about,
read once at ingest."""

from __future__ import annotations

import random
import time

from rag.ingest.formats import load_document
from rag.ingest.formats.document import UNIT_KINDS, LoadedDocument
from rag.ingest.formats.html import MAX_ABOUT_CHARS, parse_html


def _units(doc: LoadedDocument) -> list[tuple[str, str, str]]:
    """``(kind, text, about)`` of each unit, in order."""
    return [(u.kind, doc.text[u.start:u.end], u.about) for u in doc.units]


def _check(doc: LoadedDocument) -> None:
    """The contract of :class:`Unit`: in order, apart, inside the text, stripped."""
    end = 0
    for unit in doc.units:
        assert end <= unit.start < unit.end <= len(doc.text), unit
        piece = doc.text[unit.start:unit.end]
        assert piece == piece.strip() and piece, unit
        assert unit.kind in UNIT_KINDS
        assert "\n" not in unit.about and len(unit.about) <= MAX_ABOUT_CHARS
        end = unit.end


def test_a_definition_is_about_its_term_one_unit_per_paragraph():
    doc = parse_html("<h1>Settings</h1><dl><dt>log_min_duration (integer)</dt>"
                     "<dd><p>Logs slow statements. For example, 250ms logs all that run 250ms or longer.</p>"
                     "<p>The default is -1.</p></dd>"
                     "<dt>checkpoint_timeout</dt><dt>\n  checkpoint_secs </dt><dd>Time between checkpoints.</dd></dl>")
    _check(doc)
    assert _units(doc) == [
        ("heading", "Settings", ""),
        ("definition", "Logs slow statements. For example, 250ms logs all that run 250ms or longer.",
         "log_min_duration (integer)"),
        ("definition", "The default is -1.", "log_min_duration (integer)"),
        ("definition", "Time between checkpoints.", "checkpoint_timeout, checkpoint_secs"),
    ]
    assert "log_min_duration (integer)" in doc.text  # the term is shown, as its definitions' about


def test_lists_code_and_tables_inside_a_definition_are_about_its_term():
    doc = parse_html("<h2>Options</h2><dl><dt>mode</dt><dd><p>One of:</p><ul><li>fast</li><li>safe</li></ul>"
                     "<pre>mode = fast\n</pre><table><tr><td>a</td><td>b</td></tr></table>"
                     "<dl><dt>inner</dt><dd>Nested.</dd></dl><p>Back to mode.</p></dd></dl><p>After.</p>")
    _check(doc)
    assert _units(doc) == [
        ("heading", "Options", ""),
        ("definition", "One of:", "mode"),
        ("item", "fast", "mode"),
        ("item", "safe", "mode"),
        ("code", "mode = fast", "mode"),
        ("row", "a | b", "mode"),
        ("definition", "Nested.", "inner"),  # a nested list: its innermost term
        ("definition", "Back to mode.", "mode"),
        ("text", "After.", "Options"),
    ]


def test_a_sphinx_api_entry_is_a_definition_about_its_signature():
    doc = parse_html('<h1>API</h1><dl class="py method"><dt class="sig sig-object py" id="Sphinx.connect">'
                     '<span class="sig-name descname"><span class="pre">connect</span></span>'
                     '<span class="sig-paren">(</span><em class="sig-param">event</em>'
                     '<span class="sig-paren">)</span><a class="headerlink" href="#Sphinx.connect">¶</a></dt>'
                     '<dd><p>Register <em>callback</em> for event. Returns a listener ID.</p></dd></dl>')
    _check(doc)
    assert _units(doc)[1] == ("definition", "Register callback for event. Returns a listener ID.", "connect(event)")
    assert "¶" not in doc.text  # a permalink is shown on hover only


def test_a_table_row_carries_its_header_cells_and_is_about_the_caption():
    doc = parse_html("<h2>Codes</h2><table><caption>Stop words</caption>"
                     "<thead><tr><th><p>Language</p></th><th>Code</th></tr></thead>"
                     "<tbody><tr><td><p>English</p></td><td>en</td></tr><tr><td>German<td>de</tbody></table>")
    _check(doc)
    assert "Language | Code\nLanguage: English; Code: en\nLanguage: German; Code: de" in doc.text
    assert _units(doc)[1:] == [
        ("text", "Stop words", "Codes"),
        ("row", "Language | Code", "Stop words"),
        ("row", "Language: English; Code: en", "Stop words"),
        ("row", "Language: German; Code: de", "Stop words"),
    ]


def test_a_header_row_of_th_cells_without_thead_heads_the_rows():
    doc = parse_html("<table><tr><th>Name</th><th>Default</th></tr><tr><td>port</td><td></td></tr>"
                     "<tr><td>host</td><td>localhost</td></tr></table>")
    assert [t for k, t, _ in _units(doc) if k == "row"] == ["Name | Default", "Name: port",
                                                            "Name: host; Default: localhost"]


def test_a_table_without_header_joins_its_cells():
    doc = parse_html("<h3>Files</h3><table><tr><td>exim_monitor</td><td>source of the <b>monitor</b></td></tr>"
                     "<tr><td>src</td><td>the rest</td></tr></table>")
    _check(doc)
    assert doc.text == "Files\n\nexim_monitor | source of the monitor\nsrc | the rest"
    assert _units(doc)[1:] == [("row", "exim_monitor | source of the monitor", "Files"),
                               ("row", "src | the rest", "Files")]


def test_a_table_laying_out_a_page_is_read_as_blocks():
    doc = parse_html("<table><tr><td><h1>Guide</h1><p>First. Second.</p></td><td><ul><li>nav</li></ul></td></tr>"
                     "</table>")
    _check(doc)
    assert _units(doc) == [("heading", "Guide", ""), ("text", "First.", "Guide"), ("text", "Second.", "Guide"),
                           ("item", "nav", "Guide")]


def test_each_line_of_pre_is_a_code_unit():
    doc = parse_html("<h2>Example</h2><pre>\nwarn dnslists = sbl.example\n\n     add_header = X-Hit: yes\n</pre>")
    _check(doc)
    assert _units(doc)[1:] == [("code", "warn dnslists = sbl.example", "Example"),
                               ("code", "add_header = X-Hit: yes", "Example")]


def test_headings_are_about_their_parent_and_prose_about_the_nearest_heading():
    doc = parse_html("<title>Guide</title><h1>Install</h1><p>Run it. Then check, e.g. the log.</p>"
                     "<h2>Linux</h2><div>Use apt.<br>Or dnf!</div><h2>BSD</h2><h1>Use</h1>"
                     "<blockquote>Quote.</blockquote>")
    _check(doc)
    assert _units(doc) == [
        ("heading", "Guide", ""),
        ("heading", "Install", ""),
        ("text", "Run it.", "Install"),
        ("text", "Then check, e.g. the log.", "Install"),
        ("heading", "Linux", "Install"),
        ("text", "Use apt.", "Linux"),
        ("text", "Or dnf!", "Linux"),
        ("heading", "BSD", "Install"),
        ("heading", "Use", ""),
        ("text", "Quote.", "Use"),
    ]
    assert [h for _, _, h in doc.headings] == ["Install", "Linux", "BSD", "Use"]


def test_a_list_item_is_one_unit_and_a_nested_list_its_own():
    doc = parse_html("<h1>Steps</h1><ol><li><p>Download it. It is small.</p><p>Unpack.</p>"
                     "<ul><li>on Linux</li><li>on BSD</li></ul></li><li>Run</ol>")
    _check(doc)
    assert _units(doc)[1:] == [
        ("item", "Download it. It is small.\n\nUnpack.", "Steps"),
        ("item", "on Linux", "Steps"),
        ("item", "on BSD", "Steps"),
        ("item", "Run", "Steps"),
    ]


def test_an_epub_chapter_without_its_title_has_units_in_its_own_text():
    doc = parse_html("<html><head><title>Ch 1</title></head><body><h1>One</h1><p>Text.</p></body></html>",
                     show_title=False)
    assert doc.text == "One\n\nText." and doc.title == "Ch 1"
    assert _units(doc) == [("heading", "One", ""), ("text", "Text.", "One")]


def test_load_document_keeps_the_readers_units():
    doc = load_document("p.html", ".html", b"<dl><dt>k</dt><dd>One. Two.</dd></dl>")
    assert _units(doc) == [("definition", "One. Two.", "k")]


def test_a_long_term_is_cut():
    doc = parse_html("<dl><dt>" + "word " * 100 + "</dt><dd>d</dd></dl>")
    assert doc.units[0].about.endswith("…") and len(doc.units[0].about) <= MAX_ABOUT_CHARS


def test_units_of_random_markup_keep_the_contract():
    tags = ["p", "div", "li", "ul", "ol", "dl", "dt", "dd", "table", "tr", "td", "th", "thead", "caption", "pre",
            "h1", "h2", "h3", "blockquote", "span", "b", "br", "a", "script", "code"]
    words = ["alpha", "beta.", "Gamma!", " ", "\n", "e.g.", "x = 1\n  y", "&amp;", "", "¶", "\t",
             "<table><tr><th>H</th><th colspan=2>I", "<tr><td>v", "<td>w. x.", "<dl><dt>term", "<dd>Def. Two."]
    rng = random.Random(54)
    started = time.perf_counter()
    for _ in range(300):
        pieces = []
        for _ in range(rng.randrange(1, 60)):
            roll = rng.random()
            tag = rng.choice(tags)
            if roll < 0.35:
                pieces.append(f"<{tag}>")
            elif roll < 0.55:
                pieces.append(f"</{tag}>")
            elif roll < 0.6:
                pieces.append(f'<{tag} class="headerlink" colspan="{rng.choice(["2", "x", "0"])}"/>')
            else:
                pieces.append(rng.choice(words))
        doc = parse_html("".join(pieces))
        _check(doc)
        for at, _, name in doc.headings:
            assert doc.text.startswith(name.split()[0], at)
    assert time.perf_counter() - started < 2


def test_a_one_row_table_labels_the_prose_after_it_up_to_the_next_heading_or_table():
    html = ("<h2>Options</h2><table><tr><td>message_size_limit</td><td>Type: integer</td><td>Default: 50M</td></tr>"
            "</table><p>Limits the size of a message. The default is 50M.</p><p>Zero means no limit.</p>"
            "<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table><p>After two rows.</p>"
            "<table><tr><td>queue_only</td><td>Default: false</td></tr></table><p>Queues.</p>"
            "<h2>Next</h2><p>Plain prose. Split.</p>")
    doc = parse_html(html)
    _check(doc)
    label = "message_size_limit | Type: integer | Default: 50M"
    assert ("definition", "Limits the size of a message. The default is 50M.", label) in _units(doc)
    assert ("definition", "Zero means no limit.", label) in _units(doc)
    # A table of two rows labels nothing; a heading ends the label.
    assert ("text", "After two rows.", "Options") in _units(doc)
    assert ("definition", "Queues.", "queue_only | Default: false") in _units(doc)
    assert ("text", "Plain prose.", "Next") in _units(doc) and ("text", "Split.", "Next") in _units(doc)
