"""Evidence chosen without the model: units of passages, what each is
about, their ranking, and the picked sentences' spans, passages and length
(pure logic; the documents are excerpts of the Python 3.11 docs as the
bench indexes them, and the embedder a small deterministic fake)."""

from __future__ import annotations

import re
from dataclasses import replace
import zlib

import numpy as np
import pytest

from pathlib import Path, PurePath

from rag.index.lexical import tokenize
from rag.index.store import Hit
from rag.ingest.formats import load_document
from rag.ingest.formats.document import units_within
from rag.qa.evidence import MAX_WORDS, Evidence, Ranked, rank
from tests.python_doc_excerpts import FUNCTOOLS, TEXTWRAP, SHUTIL


def make_hit(document: str, start: int, end: int | None = None, *, source: str = "library/doc.rst.txt",
             context: str = "", location: dict | None = None, chunk_id: str | None = None) -> Hit:
    """A hit on ``document[start:end]``, as the index returns it: with the
    units the document's reader found in it at ingest."""
    end = len(document) if end is None else end
    loaded = load_document(source, PurePath(source.removesuffix(".txt")).suffix or ".txt", document.encode())
    assert loaded.text == document
    return Hit(chunk_id=chunk_id or f"{source}:{start}", source=source, score=0.5, text=document[start:end],
               char_start=start, char_end=end, location=location, context=context,
               units=units_within(loaded.units, document, start, end))


def shown(evidence: list[Evidence]) -> str:
    return " ".join(f"{e.about} {e.text}" for e in evidence)


def words(evidence: list[Evidence]) -> int:
    return sum(len(e.about.split()) + len(e.text.split()) for e in evidence)


def test_a_hit_without_stored_units_is_one_unit_and_the_evidence_parses_no_markup():
    hit = Hit(chunk_id="c", source="notes.txt", score=0.5, text="  .. note:: Keep the lid on. It stays hot.  ")
    ranked = rank("Why keep the lid on?", [hit])
    assert [u.text for u in ranked.units] == [".. note:: Keep the lid on. It stays hot."]
    # The units come from ingest: nothing in rag/qa reaches a format's reader.
    qa = Path(rank.__code__.co_filename).parent
    assert not [p.name for p in qa.glob("*.py") if "ingest.formats" in p.read_text()]


# -- picking: spans, passages, length -----------------------------------------


def test_picked_evidence_spans_the_document_and_narrows_its_lines():
    document = "Preface line.\n\n" + FUNCTOOLS
    start = document.index(".. decorator::")
    hit = make_hit(document, start, location={"lines": [20, 40]}, context="functools — Higher-order functions")
    ranked = rank("What is the default maxsize of functools.lru_cache?", [hit])
    evidence = ranked.pick([hit], {0: 1})
    assert evidence and "128" in shown(evidence)
    for e in evidence:
        assert document[e.start:e.end] == e.text and e.start >= start > 0
        first = 20 + hit.text.count("\n", 0, e.start - start)
        assert e.location == {"lines": [first, first + e.text.count("\n")]}
        assert e.passage == 1 and e.source == hit.source and e.chunk_id == hit.chunk_id
        assert Evidence.from_dict(e.to_dict()) == e
    assert list(evidence[0].to_dict()) == ["text", "passage", "source", "location", "start", "end", "about",
                                           "chunk_id", "score"]


def test_a_long_sentence_is_cut_to_its_best_window_within_the_limit():
    filler = " ".join(f"word{i}" for i in range(200))
    document = f"Prefix.\n\n{filler} the answer is 4711 {filler}.\n"
    hit = make_hit(document, 9, context="Notes > A very long heading " + "about many things " * 10)
    evidence = rank("What is the answer?", [hit]).pick([hit], {0: 3})
    assert len(evidence) == 1 and words(evidence) <= MAX_WORDS
    assert "4711" in evidence[0].text and "answer" in evidence[0].text
    assert document[evidence[0].start:evidence[0].end] == evidence[0].text
    about = evidence[0].about.split()
    assert evidence[0].passage == 3 and 0 < len(about) < 34  # the long about gave way first, but stays


@pytest.mark.parametrize("max_words", [1, 2, 5, 12, 30, 60])
def test_evidence_never_exceeds_the_word_limit(max_words):
    hits = [make_hit(FUNCTOOLS, 0), make_hit(TEXTWRAP, 0, source="library/textwrap.rst.txt")]
    for question in ("What is the default maxsize of functools.lru_cache?", "default width of textwrap.wrap",
                     "Which class wraps text?"):
        evidence = rank(question, hits).pick(hits, {0: 1, 1: 2}, max_words=max_words)
        assert evidence and words(evidence) <= max_words


def test_units_of_hits_not_in_the_prompt_are_skipped_and_passages_numbered():
    other = make_hit(TEXTWRAP, 0, source="library/textwrap.rst.txt")
    hits = [make_hit(SHUTIL, 0, source="library/shutil.rst.txt"), other]
    ranked = rank("Which shutil function deletes an entire directory tree?", hits)
    assert ranked.units[0].hit == 0
    evidence = ranked.pick(hits, {1: 1})  # the prompt kept only the second hit, as passage 1
    assert evidence and all(e.source == "library/textwrap.rst.txt" and e.passage == 1 for e in evidence)
    evidence = ranked.pick(hits, {0: 2, 1: 1})
    assert evidence[0].passage == 2 and "rmtree" in shown(evidence)
    assert ranked.pick(hits, {}) == []


def test_a_second_unit_only_when_it_scores_near_the_best_and_fits():
    hits = [make_hit(SHUTIL, 0, source="library/shutil.rst.txt")]
    ranked = rank("Which shutil function deletes an entire directory tree?", hits)
    assert len(ranked.pick(hits, {0: 1}, max_units=1)) == 1
    assert len(ranked.pick(hits, {0: 1}, min_share=1.01)) == 1
    two = ranked.pick(hits, {0: 1})
    assert len(two) <= 2 and all(e.score >= 0.6 * two[0].score for e in two)
    # The signature line is no second unit when the first already says it as its about.
    gzip = ".. function:: open(filename, mode='rb')\n\n   Open a gzip-compressed file in binary or text mode.\n"
    hits = [make_hit(gzip, 0, context="gzip — Support for gzip files")]
    evidence = rank("Which function opens a gzip-compressed file?", hits).pick(hits, {0: 1})
    assert [e.about for e in evidence] == ["open(filename, mode='rb')"]


# -- ranking ------------------------------------------------------------------


HTTP_SERVER = """\
Command-line usage
------------------

:mod:`http.server` can also be invoked directly using the ``-m`` switch
of the interpreter.  Similar to the previous example, this serves files relative
to the current directory::

        python -m http.server

The server listens to port 8000 by default. The default can be overridden
by passing the desired port number as an argument::

        python -m http.server 9000
"""
SUBPROCESS = """\
.. function:: run(args, *, stdin=None, input=None, stdout=None, stderr=None,\\
                  capture_output=False, shell=False, cwd=None, timeout=None)

   Run the command described by *args*.  Wait for command to complete, then
   return a :class:`CompletedProcess` instance.
"""
OS = "Use :func:`subprocess.run` to run a command.  Most users should use :func:`subprocess.run` instead.\n"
HEAPQ = """\
.. function:: heappush(heap, item)

   Push the value *item* onto the *heap*, maintaining the heap invariant.


.. function:: heappop(heap)

   Pop and return the smallest item from the *heap*, maintaining the heap
   invariant.  If the heap is empty, :exc:`IndexError` is raised.
"""
GETPASS = """\
The :mod:`getpass` module provides two functions:

.. function:: getpass(prompt='Password: ', stream=None)

   Prompt the user for a password without echoing.  The user is prompted using
   the string *prompt*, which defaults to ``'Password: '``.

.. function:: getuser()

   Return the "login name" of the user.
"""


@pytest.mark.parametrize("question, documents, fact", [
    ("What is the default maxsize of functools.lru_cache?", {"functools": FUNCTOOLS}, "128"),
    ("What is the default width used by textwrap.wrap?", {"textwrap": TEXTWRAP}, "width=70"),
    ("Which shutil function deletes an entire directory tree?", {"shutil": SHUTIL, "textwrap": TEXTWRAP},
     "rmtree"),
    ("On which port does python -m http.server listen by default?", {"http.server": HTTP_SERVER}, "8000"),
    ("What does subprocess.run return?", {"os": OS, "subprocess": SUBPROCESS}, "CompletedProcess"),
    ("Which heapq function pushes an item onto a heap?", {"heapq": HEAPQ}, "heappush"),
    ("How do I prompt the user for a password without echoing it?", {"getpass": GETPASS}, "getpass("),
])
def test_the_fact_is_in_the_evidence_of_python_docs(question, documents, fact):
    hits = [make_hit(text, 0, source=f"library/{title}.rst.txt", context=f"{title} — Module")
            for title, text in documents.items()]
    evidence = rank(question, hits).pick(hits, {i: i + 1 for i in range(len(hits))})
    assert fact in shown(evidence) and words(evidence) <= MAX_WORDS


def test_a_chunk_that_starts_inside_a_body_keeps_the_signature_its_reader_found_above_it():
    start = SHUTIL.index("Delete an entire")
    cut = make_hit(SHUTIL, start, context="shutil — High-level file operations > Directory and files operations")
    given = rank("Which shutil function deletes an entire directory tree?", [cut]).pick([cut], {0: 1})
    assert given[0].about.startswith("rmtree(path") and given[0].text.startswith("Delete an entire")


def test_overlapping_hits_give_each_text_once_and_ranking_is_deterministic():
    hits = [make_hit(FUNCTOOLS, 0), make_hit(FUNCTOOLS, FUNCTOOLS.index(".. decorator::"))]
    ranked = rank("What is the default maxsize of functools.lru_cache?", hits)
    keys = [" ".join(u.text.split()) for u in ranked.units]
    assert len(keys) == len(set(keys))
    again = rank("What is the default maxsize of functools.lru_cache?", hits)
    assert again.units == ranked.units and again.scores == ranked.scores
    assert list(ranked.scores) == sorted(ranked.scores, reverse=True) and ranked.best == ranked.scores[0]
    assert ranked.seconds >= 0


def test_shortlist_limits_the_hits_read_and_nothing_gives_nothing():
    hits = [make_hit(TEXTWRAP, 0), make_hit(SHUTIL, 0, source="library/shutil.rst.txt")]
    assert {u.hit for u in rank("directory tree", hits, shortlist=1).units} == {0}
    empty = rank("anything", [])
    assert empty.units == () and empty.best == 0.0 and empty.pick([], {}) == []


# A deterministic stand-in for the sentence embedder: bags of words over a
# few synonym classes, so "terminate" lies near "exit" but shares no word.
SYNONYMS = {"terminate": "exit", "quit": "exit", "stop": "exit", "end": "exit", "leave": "exit"}


def fake_embed(calls: list[list[str]]):
    def embed(batch: list[str]) -> np.ndarray:
        calls.append(list(batch))
        vectors = np.zeros((len(batch), 64), dtype=np.float32)
        for row, text in enumerate(batch):
            for word in re.findall(r"[a-z]+", text.lower()):
                vectors[row, zlib.crc32(SYNONYMS.get(word, word).encode()) % 64] += 1.0
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
    return embed


def test_with_an_embedder_the_cosine_adds_to_the_lexical_score():
    document = ("Process control\n===============\n\nThe interpreter reads the program and the program runs.\n\n"
                ".. function:: exit(code=0)\n\n   Exit the interpreter with the given status.\n")
    hit = make_hit(document, 0)
    question = "How do I terminate the interpreter?"
    lexical = rank(question, [hit])  # "interpreter" alone: the first sentence that has it wins
    assert lexical.units[0].text.startswith("The interpreter reads")
    calls: list[list[str]] = []
    embed = fake_embed(calls)
    ranked = rank(question, [hit], embed=embed, embed_top=3)
    assert calls[0] == [question] and len(calls[1]) == 3  # the question, then the 3 best units
    assert ranked.units[0].about + ": " + ranked.units[0].text in calls[1]  # embedded as "about: text"
    assert ranked.units[0].text.startswith("Exit the interpreter") and len(ranked.units) == 3
    # The score is the cosine plus the weighted lexical share.
    vector = embed([question])[0]
    unit = ranked.units[0]
    cosine = float(embed([f"{unit.about}: {unit.text}"])[0] @ vector)
    share = dict(zip(lexical.units, lexical.scores))[unit]
    assert ranked.scores[0] == pytest.approx(cosine + 0.5 * share, abs=1e-6)
    # A given query vector is used as it is.
    calls.clear()
    again = rank(question, [hit], embed=embed, query_vector=vector, embed_top=3)
    assert len(calls) == 1 and again.units == ranked.units


def test_question_words_match_identifiers_and_plurals_in_either_case():
    assert {"lru", "cache"} <= set(tokenize("functools.LRU_CACHE")) & set(tokenize("lru_cache(maxsize=128)"))
    document = ".. function:: heappush(heap, item)\n\n   Push the value *item* onto the *heap*.\n"
    hit = make_hit(document, 0)
    ranked = rank("Which function PUSHES items onto heaps?", [hit])
    assert ranked.best > 0.5 and isinstance(ranked, Ranked)


def test_a_rare_word_the_documents_never_use_declines_whatever_the_score():
    hit = make_hit(SHUTIL, 0, source="library/shutil.rst.txt")
    ranked = rank("Which shutil function deletes an entire directory tree?", [hit])
    assert ranked.best > 1.0 and not ranked.declines(0.55)
    heard_not = replace(ranked, unheard=("Kubernetes",))
    assert heard_not.declines(0.55) and not heard_not.declines(0.0)  # floor 0: the model is always asked
    many = replace(heard_not, weights={f"t{i}": 1.0 for i in range(30)})
    assert not many.declines(0.55)  # a pasted log is always asked
