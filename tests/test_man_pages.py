"""Man pages (issue 54): roff with the ``man`` macros, gzipped or not, read
into plain text with the page's outline and its own units: headings,
sentences under them, a tagged paragraph's description about its term, list
items, code lines and table rows; a gzip bomb refused before it is inflated;
man pages found by name ("tcp.7.gz", "notes.1") wherever files are read."""

from __future__ import annotations

import gzip
import time
from pathlib import Path, PurePath

import pytest

from rag.errors import DocumentError
from rag.ingest.chunking import Chunker
from rag.ingest.files import find_files
from rag.ingest.formats import (LOADERS, STOPS_EARLY, SUPPORTED_SUFFIXES, family_of, format_suffix, is_supported,
                                load_document)
from rag.ingest.formats.document import LoadedDocument, TextOverLimit
from rag.ingest.formats.man import load_man
from tests.unit_contract import checked_units


def _man(source: str, **kw) -> LoadedDocument:
    return load_man("page.7", ".man", source.encode("utf-8"), **kw)


_units = checked_units


PAGE = r""".\" Copyright and licence: a comment
'\" t
.TH TCP 7 2023-02-05 "Linux man-pages 6.03"
.SH NAME
tcp \- TCP protocol
.SH SYNOPSIS
.nf
.B #include <netinet/tcp.h>
.PP
.IB tcp_socket " = socket(AF_INET, SOCK_STREAM, 0);"
.fi
.SH DESCRIPTION
This is an implementation of the TCP protocol.
It provides a reliable,
stream-oriented connection.
.SS /proc interfaces
.TP
.IR tcp_keepalive_time " (integer; default: 7200; since Linux 2.2)"
.\" Since Linux 2.1.43
The number of seconds a connection needs to be idle before TCP begins
sending out keep-alive probes.
Keep-alives are sent only when the
.B SO_KEEPALIVE
socket option is enabled.
.IP
Note that tracking mechanisms may time out sooner.
.TP
.B tcp_frto
Enables F-RTO. Values:
.RS
.TP
.B 1
Basic version.
.TP
.B 2
Enhanced version.
.RE
.IP
Both are off by default.
.PP
See
.BR ip (7)
for more.
"""


def test_a_page_reads_as_text_with_its_outline_title_and_units():
    doc = _man(PAGE)
    assert doc.title == "TCP(7) — TCP protocol"
    assert [(level, h) for _, level, h in doc.headings] == [
        (1, "NAME"), (1, "SYNOPSIS"), (1, "DESCRIPTION"), (2, "/proc interfaces")]
    assert all(doc.text[at:at + len(h)] == h for at, _, h in doc.headings)
    assert _units(doc) == [
        ("heading", "NAME", "NAME"),
        ("text", "tcp - TCP protocol", "NAME"),
        ("heading", "SYNOPSIS", "SYNOPSIS"),
        ("code", "#include <netinet/tcp.h>", "SYNOPSIS"),
        ("code", "tcp_socket = socket(AF_INET, SOCK_STREAM, 0);", "SYNOPSIS"),
        ("heading", "DESCRIPTION", "DESCRIPTION"),
        ("text", "This is an implementation of the TCP protocol.", "DESCRIPTION"),
        ("text", "It provides a reliable, stream-oriented connection.", "DESCRIPTION"),
        ("heading", "/proc interfaces", "/proc interfaces"),
        ("definition", ("The number of seconds a connection needs to be idle before TCP begins sending out "
                        "keep-alive probes. Keep-alives are sent only when the SO_KEEPALIVE socket option is enabled."),
         "tcp_keepalive_time (integer; default: 7200; since Linux 2.2)"),
        ("definition", "Note that tracking mechanisms may time out sooner.",
         "tcp_keepalive_time (integer; default: 7200; since Linux 2.2)"),
        ("definition", "Enables F-RTO. Values:", "tcp_frto"),
        ("definition", "Basic version.", "tcp_frto > 1"),
        ("definition", "Enhanced version.", "tcp_frto > 2"),
        ("definition", "Both are off by default.", "tcp_frto"),
        ("text", "See ip(7) for more.", "/proc interfaces"),
    ]
    # The term stands on its own line, its description right under it; no roff is left.
    assert "\ntcp_keepalive_time (integer; default: 7200; since Linux 2.2)\nThe number of seconds" in doc.text
    assert not any(mark in doc.text for mark in ("\\f", ".TP", "\\(", ".IR", "Copyright"))


def test_tagged_paragraphs_tq_terms_ip_tags_items_and_numbered_items():
    doc = _man(r""".SH OPTIONS
.TP
.B \-a
.TQ
.B \-\-all
Do not ignore entries starting with a dot.
.IP "\fB\-l\fP" 4
Use a long listing format.
.IP \(bu 2
First point.
Still the first.
.IP \(bu
Second point.
.IP
Its second paragraph.
.IP 1. 4
Numbered.
.IP * 2
Starred.
.TP
.B \-\-orphan
.PP
Back to prose.
""")
    assert _units(doc)[1:] == [
        ("definition", "Do not ignore entries starting with a dot.", "-a, --all"),
        ("definition", "Use a long listing format.", "-l"),
        ("item", "First point. Still the first.", "OPTIONS"),
        ("item", "Second point.", "OPTIONS"),
        ("item", "Its second paragraph.", "OPTIONS"),
        ("item", "Numbered.", "OPTIONS"),
        ("item", "Starred.", "OPTIONS"),
        ("definition", "--orphan", "--orphan"),  # a term with no description is a unit itself
        ("text", "Back to prose.", "OPTIONS"),
    ]
    assert "-a\n--all\nDo not ignore" in doc.text and "• First point. Still the first." in doc.text
    assert "1. Numbered." in doc.text and "• Starred." in doc.text


def test_nesting_a_list_inside_a_definition_and_re_to_a_level():
    doc = _man(r""".SH OPTIONS
.TP
.B mode
One of:
.RS
.IP \(bu 2
fast
.RS
.TP
.B deep
Nested twice.
.RE 1
.PP
Out at the margin.
""")
    assert _units(doc)[1:] == [
        ("definition", "One of:", "mode"),
        ("item", "fast", "mode"),
        ("definition", "Nested twice.", "mode > deep"),
        ("text", "Out at the margin.", "OPTIONS"),
    ]


def test_font_macros_alternate_without_spaces_and_escapes_become_characters():
    doc = _man(r""".SH X
.BR open (2),
.IR path " and " flags ;
.B bold words
.I it
.RB [ \-v ]
.BI \-o " file"
.SM SMALL
.SB BOLDSMALL
\fBb\fP \fIi\fR \f(CWcw\fP \fCc\fR \f[B]bb\f[] x\-y \(em \(en \(aq \(dq \(lq\(rq \(bu \e \&.dot a\|b\^c \(co \(rg
\*(lqq\*(rq \[em] \[u00E9] \(:a \*[lq]x\*[rq] \s-1small\s0 \(zz\[unknown]\X'ps: x'\kxkept \%hyph \N'65' \~nbsp
""")
    text = doc.text.split("\n")[-1]
    assert text == ("open(2), path and flags; bold words it [-v] -o file SMALL BOLDSMALL b i cw c bb x-y — – "
                    "' \" “” • \\ .dot abc © ® “q” — é ä “x” small kept hyph A nbsp")


def test_code_blocks_keep_their_lines_and_spaces():
    doc = _man(r""".SH EXAMPLES
Run:
.PP
.in +4n
.EX
$ ls \-l
    indented   line

last line
.EE
.in
.nf
no\-fill line
.fi
Prose again.
""")
    assert _units(doc)[1:] == [
        ("text", "Run:", "EXAMPLES"),
        ("code", "$ ls -l", "EXAMPLES"),
        ("code", "indented   line", "EXAMPLES"),
        ("code", "last line", "EXAMPLES"),
        ("code", "no-fill line", "EXAMPLES"),
        ("text", "Prose again.", "EXAMPLES"),
    ]
    assert "$ ls -l\n    indented   line\n\nlast line" in doc.text


def test_breaks_spaces_requests_comments_continuations_and_control_lines():
    doc = _man(r""".SH A
.ad l
.nh
.hy 0
.ft B
.ps 10
.ne 5
.PD 0
one \" a comment
two\c
.B three
four \
five
.br
six
.sp
seven
'br
eight
.\" a comment line
.FOO bar baz
.INDENT 0.0
""")
    assert _units(doc)[1:] == [
        ("text", "one twothree four five", "A"),
        ("text", "six", "A"),
        ("text", "seven", "A"),
        ("text", "eight bar baz", "A"),  # an unknown macro: its words kept, "0.0" dropped
    ]
    assert "one twothree four five\nsix\n\nseven\neight bar baz" in doc.text


def test_links_and_mail_addresses():
    doc = _man(r""".SH SEE ALSO
The
.UR https://example.org/
project page
.UE .
Write to
.MT bugs@example.org
.ME ,
or
.UR https://example.net/
.UE
""")
    assert doc.text.endswith("The project page <https://example.org/>. Write to bugs@example.org, "
                             "or https://example.net/")


def test_tables_header_by_rule_by_bold_format_or_none():
    doc = _man(""".SH T
.TS
tab(:);
l l.
Signal:Value
_
SIGHUP:1
SIGINT:T{
Interrupt
.br
from keyboard
T}
.TE
.TS
lb lb
l l.
Name\tPort
VNC\t5900
.TE
.TS
l l.
a\tb
c\t\\^
.TE
.TS
l l l.
\tsource\tdest
_
shared\ts1\td1
.TE
""")
    assert [u for u in _units(doc) if u[0] == "row"] == [
        ("row", "Signal | Value", "T"),
        ("row", "Signal: SIGHUP; Value: 1", "T"),
        ("row", "Signal: SIGINT; Value: Interrupt from keyboard", "T"),
        ("row", "Name | Port", "T"),
        ("row", "Name: VNC; Port: 5900", "T"),
        ("row", "a | b", "T"),
        ("row", "c", "T"),
        ("row", "source | dest", "T"),
        ("row", "shared; source: s1; dest: d1", "T"),  # a row's own label, under no header, alone
    ]


def test_conditionals_strings_and_the_pages_own_macros():
    doc = _man(r""".ie \n(.g .ds Aq \(aq
.el .ds Aq '
.ds lq \&"\"
.ds rq \&"\"
.de q
\\$3\*(lq\\$1\*(rq\\$2
..
.if t \{\
.ft CW
TYPESET ONLY
\}
.if n \{\
.SH NROFF
\}
.if !'\*(Aq'x' shown
.de1 INDENT
.RS \\$1
..
.de UNINDENT
.RE
..
.TP
.B term
.INDENT 7.0
Described \*(Aqinside\*(Aq.
.UNINDENT
The magic
.q "TZif" ,
here.
.ig
Never shown.
..
""")
    assert "TYPESET" not in doc.text and "Never" not in doc.text
    assert _units(doc) == [
        ("heading", "NROFF", "NROFF"),
        ("text", "shown", "NROFF"),
        ("definition", "Described 'inside'.", "term"),
        ("definition", "The magic \"TZif\", here.", "term"),
    ]


def test_so_only_page_points_to_its_page_and_mdoc_reads_plainly():
    assert _man(".so man3/stdin.3\n").text == "See stdin(3)."
    doc = _man(r""".Dd $Mdocdate$
.Dt LS 1
.Os
.Sh NAME
.Nm ls
.Nd list directory contents
.Sh SYNOPSIS
.Nm
.Op Fl ABC
.Ar file ...
.Sh DESCRIPTION
.Bl -tag -width Ds
.It Fl a
Include dot files.
.Pp
See
.Xr stat 2 .
.It Fl l
Long format.
.El
.Bl -bullet
.It
One bullet.
.El
.Bd -literal
$ ls -a
.Ed
""")
    assert doc.title == "LS(1) — list directory contents"
    assert [h for _, _, h in doc.headings] == ["NAME", "SYNOPSIS", "DESCRIPTION"]
    assert _units(doc)[1:] == [
        ("text", "ls - list directory contents", "NAME"),
        ("heading", "SYNOPSIS", "SYNOPSIS"),
        ("text", "ls [-ABC] file ...", "SYNOPSIS"),
        ("heading", "DESCRIPTION", "DESCRIPTION"),
        ("definition", "Include dot files.", "-a"),
        ("definition", "See stat(2).", "-a"),
        ("definition", "Long format.", "-l"),
        ("item", "One bullet.", "DESCRIPTION"),
        ("code", "$ ls -a", "DESCRIPTION"),
    ]


def test_gzipped_pages_read_as_the_plain_page_one_member_or_several():
    plain = PAGE.encode()
    assert load_man("tcp.7.gz", ".man", gzip.compress(plain)) == load_man("tcp.7", ".man", plain)
    halves = gzip.compress(plain[:500]) + gzip.compress(plain[500:])
    assert load_man("tcp.7.gz", ".man", halves).text == load_man("tcp.7", ".man", plain).text


def test_damaged_binary_and_non_utf8_pages_are_refused_with_one_line():
    data = gzip.compress(PAGE.encode())
    with pytest.raises(DocumentError, match="cut short"):
        load_man("a.7.gz", ".man", data[: len(data) // 2])
    with pytest.raises(DocumentError, match="damaged gzip"):
        load_man("a.7.gz", ".man", data[:10] + b"\xff" * 50 + data[60:])
    with pytest.raises(DocumentError, match="not UTF-8"):
        load_man("a.7", ".man", ".SH NAME\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(DocumentError, match="binary"):
        load_man("a.7.gz", ".man", gzip.compress(b"\x00\x01\x02" * 100))
    with pytest.raises(DocumentError, match="no text to index"):
        load_document("a.7", ".7", b'.\\" only a comment\n.TH A 7\n')


def test_a_gzip_bomb_is_refused_without_being_inflated():
    bomb = gzip.compress(b"\0" * (8 << 20))  # 8 MiB of zeros in about 8 KB
    started = time.perf_counter()
    with pytest.raises(TextOverLimit):
        load_man("bomb.1.gz", ".man", bomb, max_chars=10_000)
    with pytest.raises(DocumentError, match="passes 2,097,152 characters"):
        load_document("bomb.1.gz", format_suffix("bomb.1.gz"), gzip.compress(b"a" * (3 << 20)))
    assert time.perf_counter() - started < 2


def test_text_that_grows_past_the_limit_is_refused_as_it_is_written():
    doubling = ".ds a xxxxxxxxxx\n" + "".join(f".ds {chr(98 + i)} \\*{chr(97 + i)}\\*{chr(97 + i)}\n"
                                              for i in range(24))
    with pytest.raises(TextOverLimit):
        _man(doubling + "\\*y\n", max_chars=100_000)
    header_each_row = ".TS\nl l.\n" + "H" * 1000 + "\tK\n_\n" + "x\ty\n" * 1000 + ".TE\n"
    with pytest.raises(TextOverLimit):
        _man(header_each_row, max_chars=100_000)
    recursion = ".de a\n.a\n.a\nword\n..\n.a\n"
    started = time.perf_counter()
    assert "word" in _man(recursion).text  # expanded to a bounded depth and count
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("name, suffix", [
    ("tcp.7.gz", ".man"), ("proc.5", ".man"), ("config.5ssl.gz", ".man"), ("ls.1", ".man"), ("LS.1.GZ", ".man"),
    ("notes.1", ".man"), ("x.8", ".man"), ("Foo.3pm.gz", ".man"), ("docs/man/tcp.7.gz", ".man"), (".7", ".man"),
    ("x.man", ".man"), ("x.9", ".9"), ("x.0", ".0"), ("v1.12", ".12"), ("a.tar.gz", ".gz"), ("x.gz", ".gz"),
    ("Guide.PDF", ".pdf"), ("notes.md", ".md"), (".md", ".md"), ("README", ""), ("x.", ""), ("tcp.7.txt", ".txt"),
])
def test_format_suffix(name, suffix):
    assert format_suffix(name) == suffix


def test_the_registry_reads_man_pages_by_name_and_stops_at_the_limit():
    assert family_of("tcp.7.gz") == family_of(".7") == family_of(".man") == "man"
    assert family_of(".xlsx") == "xlsx" and family_of(".gz") is None
    assert is_supported(PurePath("a/tcp.7.gz")) and is_supported(PurePath("notes.1"))
    assert not is_supported(PurePath("a.tar.gz")) and not is_supported(PurePath("x.9"))
    assert LOADERS[".man"] is load_man and load_man in STOPS_EARLY
    assert ".man" in SUPPORTED_SUFFIXES and not {".1", ".7", ".gz"} & SUPPORTED_SUFFIXES  # "3.1" is no file name
    with pytest.raises(DocumentError, match=r"unsupported file type \.gz; .*man pages \(name\.1 to name\.8"):
        load_document("a.tar.gz", ".gz", b"x")


def test_load_document_reads_a_man_page_and_its_chunks_keep_the_units():
    data = PAGE.encode("utf-8")
    doc = load_document("man/tcp.7", format_suffix("man/tcp.7"), data)
    assert doc == load_document("tcp.7.gz", format_suffix("tcp.7.gz"), gzip.compress(data))
    assert doc.title == "TCP(7) — TCP protocol" and len(doc.units) == 16
    chunks = Chunker(lambda text: len(text.split())).split(doc)
    found = [(u.kind, u.about) for c in chunks for u in c.units if u.kind == "definition"]
    assert ("definition", "tcp_keepalive_time (integer; default: 7200; since Linux 2.2)") in found
    assert all(c.text == doc.text[c.start:c.end] for c in chunks)


def test_find_files_picks_man_pages_up(tmp_path: Path):
    for name in ("tcp.7.gz", "notes.1", "config.5ssl.gz", "a.tar.gz", "plain.md"):
        (tmp_path / name).write_bytes(b"x")
    found = find_files([tmp_path])
    assert {f.source for f in found.files} == {"tcp.7.gz", "notes.1", "config.5ssl.gz", "plain.md"}
    assert dict(found.unsupported) == {".gz": 1}
