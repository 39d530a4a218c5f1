"""Evidence: the sentence, item, definition or row of the retrieved
passages that answers the question, with what it is about, chosen without
the model.

A small model ignores its context; quoting the answering unit first helps
it (issue 36). The units are the documents' own, as their readers found
them at ingest and the index stored them with each chunk (issue 54): a
sentence about its heading, a list item, a definition's description about
its term ("checkpoint_timeout (integer)"), a table row with its header
cells, a code line, an API signature and the sentences about it. Units are
scored by the share of the question's IDF weight that their words, their
about and their document's title cover (a unit longer than the evidence's
word limit by its best window), plus, when an embedder is given, their
cosine to the question.

``rank("What is the default maxsize of functools.lru_cache?", hits).pick(hits, {0: 1})`` over
functools.rst -> the signature ``lru_cache(user_function) / lru_cache(maxsize=128, typed=False)``,
then "Decorator to wrap a function ... the *maxsize* most recent calls." about it.

Does not: read documents, parse markup or the index, embed by itself, or call the model.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from prompt_budget.focus import best_window

from ..text import language
from ..index.records import Unit as StoredUnit
from ..index.store import Hit
from .answer import Evidence

MAX_WORDS = 60  # evidence length, about and text of all its units together (issue 36)
SECOND_SHARE = 0.6  # a second unit must score this share of the best
# Code lines repeat names (``@lru_cache(maxsize=32)``) and headings name topics, without saying what they mean.
FORM_WEIGHT = 0.5
FLOOR_MAX_TERMS = 24  # questions of more terms are never declined (see Ranked.declines)
# What a unit's passage adds to its score: the passage's retrieval score (cosine, 0-1) times this.
# Measured (`rag bench answers --evidence-only`, 2 s target, 2026-12-05): at 0, 0.25, 0.5, 1, 2 the
# evidence alone stated the facts of 31, 30, 31, 33, 31 of the 38 questions, and came from a gold
# file for 12, -, 13, 17, 18 of the 20 "how do I" questions; at 1 every answerable question scored
# above every question of the unanswerable set (1.07 against 0.60), so a floor separates them.
PASSAGE_WEIGHT = 1.0

# What a unit whose about names an API entry is about: the name before its parameters ("lru_cache" of
# "lru_cache(maxsize=128, typed=False)"), counted twice; a parameter given a value states its default.
_NAME = re.compile(r"[\w.-]*")
_CALL = re.compile(r"[\w.]+\(")
_PARAMETER = re.compile(r"(\w+)=")
# Words that say what kind of thing is asked for, not about what (lexical's stopwords are gone already);
# in documentation "function", "class" and "module" are markup (".. function::"), not words of the answer.
_QUESTION_WORDS = frozenset(language.terms("many much whether way also any some function class method module"))
_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Unit:
    """One unit of passage ``hit``: ``text`` is ``hits[hit].text[start:end]``,
    ``about`` what it is about ("" if none), ``kind`` what its reader found
    it to be ("text", "item", "definition", "row", "code", "signature")."""

    hit: int
    start: int
    end: int
    text: str
    about: str
    kind: str = "text"


@dataclass(frozen=True)
class Ranked:
    """Units best first, with their ``scores``; ``weights`` holds the
    question's terms and their IDF (to cut a long unit to its best words)."""

    units: tuple[Unit, ...]
    scores: tuple[float, ...]
    seconds: float
    weights: Mapping[str, float] = field(default_factory=dict, compare=False, repr=False)
    langs: tuple[str, ...] = ("en",)  # the languages of the units' passages, in which the question was read
    unheard: tuple[str, ...] = ()  # words of the question its documents never use (set by the pipeline)

    @property
    def best(self) -> float:
        """The top score, 0.0 if there is no unit."""
        return self.scores[0] if self.scores else 0.0

    def declines(self, floor: float) -> bool:
        """Whether the documents seem not to answer: the best unit scores
        under ``floor``, or the question names a rare word its documents
        never use (``unheard``: "nftables" of the man pages, "Roundcube" of
        Exim's); for a question of at most :data:`FLOOR_MAX_TERMS` terms (a
        longer one, a pasted log, covers a small share of its words whatever
        the documents hold: the model is asked). A ``floor`` of 0 never
        declines. On the tuning halves of issue 54 a score floor alone could
        not tell them apart (unanswerable questions scored up to 1.15,
        answerable ones from 0.67); the unheard word did (bench README)."""
        if floor <= 0 or len(self.weights) > FLOOR_MAX_TERMS:
            return False
        return self.best < floor or bool(self.unheard)

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
         query_vector: np.ndarray | None = None, shortlist: int = 6, embed_top: int = 16,
         weight: float = 0.5) -> Ranked:
    """The stored units of the first ``shortlist`` hits, best first (ties in
    reading order), each text once; a hit stored without units is one unit.
    Lexical score: the share of the question's content words' IDF weight
    (IDF over these units) that a unit's words (a long unit's best window of
    :data:`MAX_WORDS`), its about and its document's title cover, the name
    its about gives an API entry counted twice (so up to 2), halved for code
    lines, plus :data:`PASSAGE_WEIGHT` times its passage's score. With
    ``embed`` (and ``query_vector``, else the question is embedded), the
    ``embed_top`` best by it are kept and scored cosine + ``weight`` x
    lexical."""
    began = time.perf_counter()
    # A dotted name counts by its parts: whole, it is rare, so its IDF would outweigh the words that answer.
    # Sorted, so that sums of weights, and so ties, do not depend on the order of a set.
    # Read in each language of the passages: an English question of French documents meets them in French.
    langs = tuple(sorted({language.known(h.lang) for h in hits[:shortlist]})) or (language.DEFAULT,)
    asked = sorted({t for t in language.terms_in(question, langs) if "." not in t and t not in _QUESTION_WORDS})
    units, terms, extra, seen = [], [], [], set()
    for h, hit in enumerate(hits[:shortlist]):
        lang = language.known(hit.lang)
        title = _terms(hit.context.split(" > ")[0], lang)
        # A unit that repeats a heading of the chunk's context is that heading, however its reader wrote it
        # (an HTML page's "12.5.5. Vérifier les dépendances" may be a plain line of its text).
        headings = {" ".join(part.lower().split()) for part in hit.context.split(" > ")}
        for stored in _units_of(hit):
            text = hit.text[stored.start:stored.end]
            key = " ".join(text.lower().split())
            if stored.kind == "heading" or key in headings or key in seen:
                continue  # a heading is what a unit is about, never an answer itself ("# The KV cache")
            seen.add(key)
            # A unit its reader found nothing above is about the last heading of its chunk's context.
            about = " ".join((stored.about or hit.context.rsplit(" > ", 1)[-1]).split())
            api = text if stored.kind == "signature" else about if _CALL.match(about) else ""
            named = about if stored.kind in ("definition", "signature") or api else ""
            found = _terms(f"{about}\n{text}", lang)
            if set(asked) & {t for p in _PARAMETER.findall(api) for t in _terms(p, lang)}:
                # A parameter given a value in a signature states its default: "lru_cache(maxsize=128)"
                # answers "the default maxsize".
                found.update(_terms("default", lang))
            units.append(Unit(h, stored.start, stored.end, text, about, stored.kind))
            terms.append(found)
            # Outside the IDF: the title, which every unit of a document shares ("What does subprocess.run
            # return?" -> "... return a CompletedProcess" under "run(...)" in "subprocess — ..."), and the
            # name of the entry the unit is about, the thing the question asks about.
            extra.append((title, _terms(_NAME.match(api or named).group(), lang)))
    df = {t: sum(t in found for found in terms) for t in asked}
    weights = {t: math.log(1 + (len(units) - df[t] + 0.5) / (df[t] + 0.5)) for t in asked}
    total = sum(weights.values()) or 1.0
    lexical = []
    for k, (found, (title, name), unit) in enumerate(zip(terms, extra, units)):
        if len(unit.text.split()) + len(unit.about.split()) > MAX_WORDS:
            # Scored as it would be shown: its best window (a long definition covers many words of
            # many questions, but only a window of it is quoted).
            found = _window_terms(unit, weights, langs)
        covered = sum(weights[t] * ((t in found or t in title) + (t in name)) for t in asked) / total
        form = FORM_WEIGHT if unit.kind == "code" else 1.0
        lexical.append(covered * form + PASSAGE_WEIGHT * hits[unit.hit].score)
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


def _units_of(hit: Hit) -> Sequence[StoredUnit]:
    """The hit's stored units; one "text" unit of its whole text when it has none (a hit made by hand)."""
    if hit.units:
        return hit.units
    stripped = hit.text.strip()
    start = hit.text.find(stripped[:1]) if stripped else 0
    return (StoredUnit(start, start + len(stripped)),) if stripped else ()


def _window_terms(unit: Unit, weights: Mapping[str, float], langs: tuple[str, ...]) -> set[str]:
    """The question's terms that the about and the best window of ``unit``'s
    words cover (the window that ``Ranked.pick`` would quote)."""
    words = [w.group() for w in _WORD.finditer(unit.text)]
    per_word = [{t for t in language.terms_in(w, langs) if t in weights} for w in words]
    size = max(MAX_WORDS - min(len(unit.about.split()), MAX_WORDS // 3), 1)
    a, b = _window([sum(weights[t] for t in found) for found in per_word], size)
    covered = set().union(*per_word[a:b]) if b > a else set()
    return covered | {t for t in language.terms_in(unit.about, langs) if t in weights}


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
    # Identifiers whole (and their parts), plain words stemmed in the passage's language (rag.text.language).
    return set(language.terms(text, lang))


def _narrow(hit: Hit, start: int, end: int) -> dict | None:
    """The hit's location, its ``lines`` narrowed to those of ``hit.text[start:end]``."""
    location = hit.location
    lines = location.get("lines") if isinstance(location, dict) else None
    if not (isinstance(lines, (list, tuple)) and len(lines) == 2 and all(isinstance(x, int) for x in lines)):
        return location
    first = lines[0] + hit.text.count("\n", 0, start)
    last = first + hit.text.count("\n", start, max(end - 1, start))
    return {**location, "lines": [min(first, lines[1]), min(last, lines[1])]}
