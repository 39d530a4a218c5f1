"""Evidence: the sentence or two of the retrieved passages that answer the
question, each with what it is about, chosen without the model.

A small model ignores its context; quoting the answering sentence first
helps it (issue 36). On API documentation the sentence that explains rarely
names the thing, the signature above it does, so each unit (a sentence, a
signature, a heading, a table row, a list item, a code line) carries its
``about``: the signature of the directive enclosing it, the terms of the
labelled list item it defines ("-u, --include-untracked"), or the heading
above it, a row's first ``header: value`` pair, else the last heading of
the chunk's context. Units are scored by the share of the question's IDF weight
that their words, their about and their document's title cover, plus, when
an embedder is given, their cosine to the question.

``rank("What is the default maxsize of functools.lru_cache?", hits).pick(hits, {0: 1})`` over
functools.rst -> the directive ``.. decorator:: lru_cache(user_function) / lru_cache(maxsize=128,
typed=False)``, then "Decorator to wrap a function ... the *maxsize* most recent calls." about it.

Does not: read documents or the index, embed by itself, or call the model.
"""

from __future__ import annotations

import bisect
import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from prompt_budget.focus import best_window

from ..index import language
from ..index.store import Hit
from ..ingest.formats.text import clean_heading
from .answer import Evidence

MAX_WORDS = 60  # evidence length, about and text of all its units together (issue 36)
SECOND_SHARE = 0.6  # a second unit must score this share of the best
ABOUT_LINES = 200  # what lies further above a unit (in a chunk and the text before it) is not what it is about
# Code lines repeat names (``@lru_cache(maxsize=32)``) and headings name topics, without saying what they mean.
FORM_WEIGHT = 0.5
FLOOR_MAX_TERMS = 24  # questions of more terms are never declined (see Ranked.declines)
# What a unit's passage adds to its score: the passage's retrieval score (cosine, 0-1) times this.
# Measured (`rag bench answers --evidence-only`, 2 s target, 2026-12-05): at 0, 0.25, 0.5, 1, 2 the
# evidence alone stated the facts of 31, 30, 31, 33, 31 of the 38 questions, and came from a gold
# file for 12, -, 13, 17, 18 of the 20 "how do I" questions; at 1 every answerable question scored
# above every question of the unanswerable set (1.07 against 0.60), so a floor separates them.
PASSAGE_WEIGHT = 1.0

_UNDERLINE = re.compile(r"([=\-~^\"'`#*+<>:._])\1{2,}[ \t]*")
_DIRECTIVE = re.compile(r"([ \t]*)\.\.[ \t]+([\w:.-]+)::[ \t]*(.*)")
_API = re.compile(r"(?:\w+:)?(?:function|decorator|class|method|classmethod|staticmethod|decoratormethod|attribute"
                  r"|property|data|exception|module|cmdoption|option|envvar|describe|opcode|type|member|macro)")
_CODE_DIRECTIVES = frozenset({"code-block", "sourcecode", "code", "testcode", "testoutput", "doctest", "testsetup"})
_OPTION = re.compile(r"[ \t]+:[\w -]+:(?:[ \t].*)?")  # a directive's option, ":synopsis: ..."
_ATX = re.compile(r"#{1,6}[ \t]+(.*)")  # its closing #s are stripped by hand: a regex would backtrack
_FENCE = re.compile(r"[ \t]{0,3}(```|~~~)")
_ITEM = re.compile(r"[ \t]*(?:[-*+\u2022]|\d{1,3}[.)]|#\.)[ \t]+\S")
_PAIR = r"[^\s:;][^:;\n]{0,59}: [^;\n]*"
_ROW = re.compile(rf"[ \t]*{_PAIR}(?:; {_PAIR})+")  # a sheet's row: "City: Oslo; Pop: 700k"
_GRID = re.compile(r"[ \t]*[|+].*[|+][ \t]*")  # a grid table's line: "| *level* | Set the root ... |"
# An AsciiDoc labelled list's term ("--include-untracked::", "start::", "core.editor;;"): what the
# indented definition under it is about (Git's and many man pages' option lists are written so).
_TERM = re.compile(r"(?!\.\.[ \t])(\S[^\n]*?)(?::::|::|;;)[ \t]*")
_SENTENCE_END = re.compile(r"[.!?][\"')\]*]*(?=\s)")
_ABBREVIATIONS = frozenset({"e.g", "i.e", "etc", "vs", "cf", "al", "approx", "mr", "mrs", "dr", "fig", "resp"})
# Words that say what kind of thing is asked for, not about what (lexical's stopwords are gone already);
# in documentation "function", "class" and "module" are markup (".. function::"), not words of the answer.
_QUESTION_WORDS = frozenset(language.terms("many much whether way also any some function class method module"))


@dataclass(frozen=True)
class Unit:
    """One sentence or line of passage ``hit``: ``text`` is
    ``hits[hit].text[start:end]``, ``about`` what it is about ("" if none)."""

    hit: int
    start: int
    end: int
    text: str
    about: str


def split_units(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of the units of ``text`` in order, stripped of
    surrounding whitespace: a directive with its signature's continuation
    lines, a heading, a table row, a list item and a code line are one unit
    each; prose is split after [.!?] and whitespace, not after "e.g", "i.e",
    "etc", "vs" or an initial, never at ':' or ';'. Underlines, blank lines
    and markup without words are no units.

    ``split_units("See os.path.join. It joins, e.g. paths.") -> [(0, 17), (18, 39)]``
    """
    return [(start, end) for start, end, _ in _units(text)]


def _units(text: str) -> list[tuple[int, int, str]]:
    """:func:`split_units`, each with its kind: "text", "signature", "heading", "row" or "code"."""
    spans: list[tuple[int, int, str]] = []
    lines = _lines(text)
    para: list = []  # the paragraph being gathered: [start, end, indent, is a list item]
    literal_after = code_indent = None  # indent of a paragraph ending in "::"; of the literal block it began
    fenced = doctest = False

    def flush() -> None:
        nonlocal literal_after
        if para:
            start, end, indent, item = para
            spans.extend((a, b, "text") for a, b in ([(start, end)] if item else _sentences(text, start, end)))
            literal_after = indent if text[start:end].rstrip().endswith("::") else literal_after
            para.clear()

    i = 0
    while i < len(lines):
        start, end = lines[i]
        line = text[start:end]
        indent = len(line) - len(line.lstrip())
        i += 1
        if _FENCE.match(line):
            flush()
            fenced = not fenced
        elif fenced or (doctest and line.strip()) or line.lstrip().startswith(">>>"):
            flush()
            doctest = not fenced  # a doctest's output lines follow it up to a blank line
            spans.append((start, end, "code"))
        elif not line.strip():
            flush()
            doctest = False
        elif code_indent is not None and indent > code_indent:
            spans.append((start, end, "code"))
        elif literal_after is not None and not para and indent > literal_after:
            code_indent, literal_after = literal_after, None
            spans.append((start, end, "code"))
        else:
            code_indent = literal_after = None
            directive = _DIRECTIVE.fullmatch(line)
            if not para and indent == 0 and i < len(lines) and _is_title(line, text[slice(*lines[i])]):
                spans.append((start, end, "heading"))
                i += 1  # past its underline
            elif _UNDERLINE.fullmatch(line):
                flush()  # an overline or a transition
            elif indent == 0 and _ATX.fullmatch(line) and _heading_like(text, lines, i - 1):
                flush()
                spans.append((start, end, "heading"))
            elif _ROW.fullmatch(line) or _GRID.fullmatch(line):
                flush()
                spans.append((start, end, "row"))
            elif directive or line.lstrip().startswith(".. "):  # else a comment or a link target: no unit
                flush()
                if directive and directive.group(3):
                    last, i = _signature_end(text, lines, i, indent)
                    spans.append((start, lines[last][1], "signature"))
                while i < len(lines) and _OPTION.fullmatch(text[slice(*lines[i])]):
                    i += 1
                if directive and directive.group(2) in _CODE_DIRECTIVES:
                    code_indent = indent
            elif para and not _ITEM.match(line) and indent >= para[2] + para[3]:
                para[1] = end
            else:
                flush()
                para[:] = [start, end, indent, bool(_ITEM.match(line))]
    flush()
    return [(*s, kind) for a, b, kind in spans if (s := _strip(text, a, b))]


def about_of(text: str, offset: int, context: str) -> str:
    """What the unit at ``offset`` of ``text`` is about: the signature of
    the nearest API directive enclosing it (the part after '::', its
    continuation lines joined), the terms of the AsciiDoc labelled list
    item whose indented definition holds it, or the nearest heading above
    it; for a table row its own first ``header: value`` pair; else the last part of
    ``context`` ("A > B" -> "B"); "" if none.

    ``about_of(".. function:: f(x)\\n\\n   Does y.", 22, "") -> "f(x)"``
    """
    return _about(text, offset, context)[0]


def _about(text: str, offset: int, context: str, lines: list[tuple[int, int]] | None = None) -> tuple[str, bool]:
    """:func:`about_of`, and whether it is a directive's signature (``lines``: ``_lines(text)``)."""
    lines = lines or _lines(text)
    here = bisect.bisect_right(lines, (offset, len(text) + 1)) - 1
    line = text[slice(*lines[here])]
    if _ROW.fullmatch(line):
        return line.strip().split("; ", 1)[0], False
    bound = len(line) - len(line.lstrip())  # a line indented less than this encloses the unit
    for k in range(here - 1, max(here - ABOUT_LINES, 0) - 1, -1):
        above = text[slice(*lines[k])]
        if not above.strip():
            continue
        if k > 0 and _is_title(text[slice(*lines[k - 1])], above):
            return clean_heading(text[slice(*lines[k - 1])].strip()), False
        if (atx := _ATX.fullmatch(above)) and atx.group(1).strip(" \t#") and _heading_like(text, lines, k):
            return clean_heading(atx.group(1).rstrip(" \t#")), False
        indent = len(above) - len(above.lstrip())
        if indent < bound and indent == 0 and _is_term(text, lines, k):
            first = k
            while first > 0 and _is_term(text, lines, first - 1):
                first -= 1
            return ", ".join(_TERM.fullmatch(text[slice(*lines[j])]).group(1) for j in range(first, k + 1)), False
        if indent < bound:
            directive = _DIRECTIVE.fullmatch(above)
            if directive and directive.group(3) and _API.fullmatch(directive.group(2)):
                last, _ = _signature_end(text, lines, k + 1, indent)
                signature = text[lines[k][0] + directive.start(3):lines[last][1]]
                return " ".join(signature.replace("\\\n", " ").split()), True
            bound = indent
    return context.rsplit(" > ", 1)[-1].strip(), False


@dataclass(frozen=True)
class Ranked:
    """Units best first, with their ``scores``; ``weights`` holds the
    question's terms and their IDF (to cut a long unit to its best words)."""

    units: tuple[Unit, ...]
    scores: tuple[float, ...]
    seconds: float
    weights: Mapping[str, float] = field(default_factory=dict, compare=False, repr=False)
    langs: tuple[str, ...] = ("en",)  # the languages of the units' passages, in which the question was read

    @property
    def best(self) -> float:
        """The top score, 0.0 if there is no unit."""
        return self.scores[0] if self.scores else 0.0

    def declines(self, floor: float) -> bool:
        """Whether no sentence seems to answer: the best scores under
        ``floor``, for a question of at most :data:`FLOOR_MAX_TERMS` terms (a
        longer one, a pasted log, covers a small share of its words whatever
        the documents hold: the model is asked)."""
        return self.best < floor and len(self.weights) <= FLOOR_MAX_TERMS

    def pick(self, hits: Sequence[Hit], passages: Mapping[int, int], max_words: int = MAX_WORDS,
             max_units: int = 2, min_share: float = SECOND_SHARE,
             shown: Mapping[int, str] | None = None) -> list[Evidence]:
        """The best unit of a hit in ``passages`` (hit index -> 1-based
        passage number; other hits' units are skipped), then the next best
        that scores at least ``min_share`` of it and fits whole, up to
        ``max_units``: never more than ``max_words`` words in all, ``about``
        words counted. A best unit too long alone is cut to its best window
        of words, its ``about`` first. With ``shown`` (hit index -> the text
        a prompt shows of it, when cut), only units inside that text count."""
        chosen: list[Evidence] = []
        used = 0
        for unit, score in zip(self.units, self.scores):
            if len(chosen) >= max_units or max_words < 1:
                break
            if chosen and score < max(min_share * chosen[0].score, 1e-9):
                break
            if unit.hit not in passages or (shown is not None and unit.text not in shown.get(unit.hit, unit.text)):
                continue
            hit, about, (start, end) = hits[unit.hit], unit.about, (unit.start, unit.end)
            if not chosen:
                about, (start, end) = self._fit(hit.text, unit, max_words)
            elif len(about.split()) + len(unit.text.split()) > max_words - used or _repeats(unit, chosen[0]):
                continue
            used += len(about.split()) + len(hit.text[start:end].split())
            chosen.append(Evidence(text=hit.text[start:end], about=about, passage=passages[unit.hit],
                                   source=hit.source, location=_narrow(hit, start, end),
                                   start=hit.char_start + start, end=hit.char_start + end,
                                   chunk_id=hit.chunk_id, score=score))
        return chosen

    def leading(self, hits: Sequence[Hit]) -> tuple[list[Hit], "Ranked"]:
        """``hits`` with the one holding the best unit moved first (the
        budget takes passages in that order, so the sentence that answers
        is in the prompt whenever any passage is), and this ranking with its
        units numbered for that order."""
        if not self.units or self.units[0].hit == 0:
            return list(hits), self
        first = self.units[0].hit
        order = [first] + [i for i in range(len(hits)) if i != first]
        where = {old: new for new, old in enumerate(order)}
        units = tuple(replace(u, hit=where[u.hit]) for u in self.units)
        return [hits[i] for i in order], replace(self, units=units)

    def _fit(self, text: str, unit: Unit, max_words: int) -> tuple[str, tuple[int, int]]:
        # The about gives way first, down to a third of the limit, so that the text keeps most of the
        # room; from its head, which names the thing (a signature's parameters come after its name).
        words = list(re.finditer(r"\S+", text[unit.start:unit.end]))
        about = unit.about.split()
        keep = min(len(about), max(max_words // 3, max_words - len(words)))
        a, b = 0, keep
        c, d = _window([self._weight(w.group()) for w in words], max_words - (b - a))
        return " ".join(about[a:b]), (unit.start + words[c].start(), unit.start + words[d - 1].end())

    def _weight(self, word: str) -> float:
        return sum(self.weights.get(t, 0.0) for t in language.terms_in(word, self.langs))


def rank(question: str, hits: Sequence[Hit], *, embed: Callable[[list[str]], np.ndarray] | None = None,
         query_vector: np.ndarray | None = None, shortlist: int = 6, embed_top: int = 16, weight: float = 0.5,
         text_before: Callable[[Hit], str] | None = None) -> Ranked:
    """The units of the first ``shortlist`` hits, best first (ties in
    reading order), each text once. Lexical score: the share of the
    question's content words' IDF weight (IDF over these units) that a
    unit's text, about and document title cover, its signature's name
    counted twice (so up to 2), halved for code lines and headings. With
    ``embed`` (and ``query_vector``, else the question is embedded), the
    ``embed_top`` best by it are kept and scored cosine + ``weight`` x
    lexical. ``text_before(hit)`` may give the document text that ends where
    the hit starts (the chunk before it), where the signature of a body the
    hit starts inside lies; else another hit that holds it serves."""
    began = time.perf_counter()
    # A dotted name counts by its parts: whole, it is rare, so its IDF would outweigh the words that answer.
    # Sorted, so that sums of weights, and so ties, do not depend on the order of a set.
    # Read in each language of the passages: an English question of French documents meets them in French.
    langs = tuple(sorted({language.known(h.lang) for h in hits[:shortlist]})) or (language.DEFAULT,)
    asked = sorted({t for t in language.terms_in(question, langs) if "." not in t and t not in _QUESTION_WORDS})
    units, kinds, terms, extra, seen = [], [], [], [], set()
    for h, hit in enumerate(hits[:shortlist]):
        before = (text_before(hit) if text_before else "") or _before(hit, hits)
        if before[-1:] and not before[-1:].isspace():
            # The chunker stripped the line break it cut at: the hit's first line is a line of its own.
            before += "\n"
        whole = before + hit.text
        lines = _lines(whole)
        lang = language.known(hit.lang)
        title = _terms(hit.context.split(" > ")[0], lang)
        # A line that repeats a heading of the chunk's context is that heading, however the format wrote it
        # (an HTML page's "12.5.5. Vérifier les dépendances" is a plain line in its text).
        headings = {" ".join(part.lower().split()) for part in hit.context.split(" > ")}
        for start, end, kind in _units(hit.text):
            text = hit.text[start:end]
            key = " ".join(text.lower().split())
            if kind == "heading" or key in headings:
                continue  # what a unit is about, never an answer itself ("# The KV cache")
            if key in seen:
                continue
            seen.add(key)
            about, signed = _about(whole, len(before) + start, hit.context, lines)
            own = text[_DIRECTIVE.match(text).start(3):] if kind == "signature" else ""  # without ".. x::"
            signature = own or (about if signed else "")
            found = _terms(about + "\n" + (own or text), lang)
            # A parameter given a value in a signature states its default: "lru_cache(maxsize=128)" answers
            # "the default maxsize".
            if set(asked) & {t for p in re.findall(r"(\w+)=", signature) for t in _terms(p, lang)}:
                found.update(_terms("default", lang))
            units.append(Unit(h, start, end, text, about))
            kinds.append(kind)
            terms.append(found)
            # Outside the IDF: the title, which every unit of a document shares ("What does subprocess.run
            # return?" -> "... return a CompletedProcess" under "run(...)" in "subprocess — ..."), and the
            # signature's name again, the thing the question asks about.
            extra.append((title, _terms(re.match(r"[\w.]*", signature).group(), lang)))
    df = {t: sum(t in found for found in terms) for t in asked}
    weights = {t: math.log(1 + (len(units) - df[t] + 0.5) / (df[t] + 0.5)) for t in asked}
    total = sum(weights.values()) or 1.0
    lexical = [sum(weights[t] * ((t in found or t in title) + (t in name)) for t in asked) / total
               * (FORM_WEIGHT if kind in ("code", "heading") else 1.0) + PASSAGE_WEIGHT * hits[u.hit].score
               for found, (title, name), kind, u in zip(terms, extra, kinds, units)]
    order = sorted(range(len(units)), key=lambda k: (-lexical[k], k))
    scores = lexical
    if embed is not None and order:
        order = order[:embed_top]
        vector = query_vector if query_vector is not None else embed([question])[0]
        texts = [f"{units[k].about}: {units[k].text}" if units[k].about else units[k].text for k in order]
        cosines = np.asarray(embed(texts), dtype=np.float32) @ np.asarray(vector, dtype=np.float32)
        scores = dict(zip(order, (float(c) + weight * lexical[k] for k, c in zip(order, cosines))))
        order.sort(key=lambda k: (-scores[k], k))
    return Ranked(tuple(units[k] for k in order), tuple(float(scores[k]) for k in order),
                  time.perf_counter() - began, weights, langs)


def _before(hit: Hit, hits: Sequence[Hit]) -> str:
    # Another hit of the same document that overlaps or abuts this one's start.
    for other in hits:
        same = (other.source, other.root) == (hit.source, hit.root)
        if same and other.char_start < hit.char_start <= other.char_end:
            return other.text[: hit.char_start - other.char_start]
    return ""


def _repeats(unit: Unit, first: Evidence) -> bool:
    # A signature line says again what the first unit's about already says.
    return bool(first.about) and " ".join(first.about.split()) in " ".join(unit.text.split())


def _window(scores: list[float], size: int) -> tuple[int, int]:
    """The best window of at most ``size`` words, its matches centred (the
    earliest of equals would end at the last match and lose what follows)."""
    a, b = best_window(scores, [1] * len(scores), size)
    width, hits = b - a, [k for k in range(a, b) if scores[k] > 0]
    if hits:
        a = min(max(0, hits[0] - (width - (hits[-1] + 1 - hits[0])) // 2), len(scores) - width)
    return a, a + width


def _terms(text: str, lang: str) -> set[str]:
    # Identifiers whole (and their parts), plain words stemmed in the passage's language (rag.index.language).
    return set(language.terms(text, lang))


def _lines(text: str) -> list[tuple[int, int]]:
    spans, at = [], 0
    for line in text.split("\n"):
        spans.append((at, at + len(line)))
        at += len(line) + 1
    return spans


def _is_title(line: str, under: str) -> bool:
    # As the loader finds headings: text at the margin over an underline at least as long.
    return (line[:1].strip() != "" and not _UNDERLINE.fullmatch(line) and bool(_UNDERLINE.fullmatch(under))
            and len(under.rstrip()) >= len(line.rstrip()))


def _is_term(text: str, lines: list[tuple[int, int]], k: int) -> bool:
    # A labelled list's term sits at the margin with its definition (or the next term) on the very next
    # line; reStructuredText's "Example::" before a literal block is followed by a blank line.
    line = text[slice(*lines[k])]
    if not _TERM.fullmatch(line) or line[:1].isspace() or k + 1 >= len(lines):
        return False
    return bool(text[slice(*lines[k + 1])].strip())


def _heading_like(text: str, lines: list[tuple[int, int]], k: int) -> bool:
    # A "# ..." line followed by an indented one is a comment in code (a chunk may have cut the code's indent).
    return not text[slice(*lines[k + 1])][:1].isspace() if k + 1 < len(lines) else True


def _signature_end(text: str, lines: list[tuple[int, int]], i: int, indent: int) -> tuple[int, int]:
    """The last line of the signature of the directive on line ``i - 1``
    (indented ``indent``), and the line after it: as in reStructuredText,
    the arguments go on over the lines indented under it up to a blank line
    or an option (``lru_cache(user_function)`` over ``lru_cache(maxsize=128)``)."""
    while i < len(lines):
        line = text[slice(*lines[i])]
        if not line.strip() or len(line) - len(line.lstrip()) <= indent or line.lstrip().startswith(":"):
            break
        i += 1
    return i - 1, i


def _sentences(text: str, start: int, end: int) -> list[tuple[int, int]]:
    spans, at = [], start
    for m in _SENTENCE_END.finditer(text, start, end):
        words = text[at:m.start()].rsplit(None, 1) if m.group()[0] == "." else []
        word = words[-1].lstrip("(\"'*`") if words else ""
        if word.lower() in _ABBREVIATIONS or re.fullmatch(r"[A-Z]", word):
            continue  # "e.g. a", "J. Smith"
        spans.append((at, m.end()))
        at = m.end()
    return spans + [(at, end)]


def _strip(text: str, start: int, end: int) -> tuple[int, int] | None:
    piece = text[start:end]
    if not re.search(r"\w", piece):
        return None
    return start + len(piece) - len(piece.lstrip()), end - len(piece) + len(piece.rstrip())


def _narrow(hit: Hit, start: int, end: int) -> dict | None:
    """The hit's location, its ``lines`` narrowed to those of ``hit.text[start:end]``."""
    location = hit.location
    lines = location.get("lines") if isinstance(location, dict) else None
    if not (isinstance(lines, (list, tuple)) and len(lines) == 2 and all(isinstance(x, int) for x in lines)):
        return location
    first = lines[0] + hit.text.count("\n", 0, start)
    last = first + hit.text.count("\n", start, max(end - 1, start))
    return {**location, "lines": [min(first, lines[1]), min(last, lines[1])]}
