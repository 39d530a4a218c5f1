"""A text's language, and its words as BM25 and the evidence count them.

A chunk's language is detected once, at ingest (``py3langid``, its model
an npz file inside the package, read without pickle, limited to the languages below), and stored with it.
Its terms are then that language's: lower case, accents folded
("décodage" and "decodage" are one word), that language's stop words left
out (bm25s's lists; English keeps the project's own, which also drops
question words), plain words stemmed with that language's Snowball
stemmer (``PyStemmer``); identifiers (``os.path.join``, ``lru_cache``)
are kept whole and in parts, never stemmed.

A question is tokenized in every language its index holds, since an English
question may be asked of French documents and a term counts only where it
is spelt as the documents spell it.

``terms("Le décodage est limité par la bande passante", "fr")
-> ["decodag", "limit", "band", "pass"]``

Does not: read or store anything; choose a language for a whole document
(see ``detect``).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Iterable, Sequence

DEFAULT = "en"
# Languages with both a Snowball stemmer and a stop-word list: ISO 639-1 -> (stemmer, bm25s's list).
LANGUAGES: dict[str, tuple[str, str]] = {
    "en": ("english", "STOPWORDS_EN"), "fr": ("french", "STOPWORDS_FRENCH"), "de": ("german", "STOPWORDS_GERMAN"),
    "es": ("spanish", "STOPWORDS_SPANISH"), "it": ("italian", "STOPWORDS_ITALIAN"),
    "pt": ("portuguese", "STOPWORDS_PORTUGUESE"), "nl": ("dutch", "STOPWORDS_DUTCH"),
    "sv": ("swedish", "STOPWORDS_SWEDISH"), "da": ("danish", "STOPWORDS_DANISH"),
    "no": ("norwegian", "STOPWORDS_NORWEGIAN"), "ru": ("russian", "STOPWORDS_RUSSIAN"),
}
# English: the list BM25 was measured with on the Python docs (before issue 44), question words included.
_ENGLISH = frozenset(
    "a an and are as at be but by can do does for from has have how i if in into is it its me my no not of on "
    "or so such than that the their then there these they this to was what when where which while who why will "
    "with you your".split()
)
# Question words the lists leave in: they say what kind of thing is asked, not about what.
_QUESTION_WORDS = {"fr": "quel quelle quels quelles comment pourquoi combien quoi faut peut".split()}
MIN_DETECT_WORDS = 8  # fewer words than this say too little: the caller's fallback language is taken
QUESTION_WORDS = 3  # a question is short, and all there is to tell its language by
_WORD = re.compile(r"\w+(?:\.\w+)*")
_PARTS = re.compile(r"[._]+")


def fold(text: str) -> str:
    """Lower case with accents removed (NFKD, combining marks dropped).

    ``fold("Décodage, ÉTÉ") -> "decodage, ete"``
    """
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


# A word said less often than this on wordfreq's Zipf scale (3: once in a million words) is a name, a
# product or jargon ("nftables", "Kubernetes", "XOAUTH2"), not a way of saying a thing ("tiny", "enlarge"):
# chosen on the tuning halves of issue 54 (rag/bench/README.md).
RARE_ZIPF = 3.0


def rare(word: str, lang: str = DEFAULT) -> bool:
    """Whether ``word`` is rare in language ``lang``: a name or jargon
    rather than a common word (``wordfreq``'s frequency under
    :data:`RARE_ZIPF`, of the word and of its stem: "copes" is said less
    than "cope"; a word it does not know is rare).

    ``rare("nftables") -> True``; ``rare("enlarge") -> False``; ``rare("copes") -> False``
    """
    from wordfreq import zipf_frequency  # its word lists load on first use

    lang = known(lang)
    folded = word.lower()
    return all(zipf_frequency(form, lang) < RARE_ZIPF for form in {folded, stem(folded, lang)})


def known(lang: str | None) -> str:
    """``lang`` if it is one of :data:`LANGUAGES`, else :data:`DEFAULT`."""
    return lang if lang in LANGUAGES else DEFAULT


@functools.lru_cache(maxsize=None)
def stop_words(lang: str) -> frozenset[str]:
    """The folded stop words of ``lang`` (one of :data:`LANGUAGES`)."""
    if lang == "en":
        return _ENGLISH
    import bm25s.stopwords

    words = getattr(bm25s.stopwords, LANGUAGES[lang][1])
    return frozenset(fold(w) for w in (*words, *_QUESTION_WORDS.get(lang, ())))


@functools.lru_cache(maxsize=None)
def _stemmer(lang: str):
    import Stemmer

    return Stemmer.Stemmer(LANGUAGES[lang][0])


@functools.lru_cache(maxsize=65536)
def stem(word: str, lang: str) -> str:
    """``word`` (folded) stemmed by ``lang``'s Snowball stemmer.

    ``stem("encoded", "en") -> "encod"``; ``stem("limitee", "fr") -> "limit"``
    """
    return _stemmer(lang).stemWord(word)


def terms(text: str, lang: str = DEFAULT) -> list[str]:
    """The terms of ``text`` in ``lang`` (unknown: English), in order:
    words folded, stop words out, plain words stemmed, identifiers whole and
    in parts (their parts unstemmed).

    ``terms("Use os.path.join", "en") -> ["use", "os.path.join", "os", "path", "join"]``
    """
    lang = known(lang)
    stops = stop_words(lang)
    out: list[str] = []
    for word in _WORD.findall(fold(text)):
        if "." in word or "_" in word:
            out.append(word)
            out.extend(p for p in _PARTS.split(word) if len(p) > 1 and p not in stops)
        elif len(word) > 1 and word not in stops:
            out.append(word if word.isdigit() else stem(word, lang))
    return out


def terms_in(text: str, langs: Iterable[str]) -> list[str]:
    """The terms of ``text`` in the first of ``langs`` (sorted; English
    alone when empty), repeats kept as a query counts them, then those of
    each other language that the first did not yield (a query asked of an
    index holding several languages)."""
    order = sorted(set(langs)) or [DEFAULT]
    out = terms(text, order[0])
    seen = set(out)
    for lang in order[1:]:
        for t in terms(text, lang):
            if t not in seen:
                seen.add(t)
                out.append(t)
    return out


@functools.lru_cache(maxsize=1)
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)  # npz, no pickle
    identifier.set_languages(sorted(LANGUAGES))
    return identifier


def detect(text: str, fallback: str = DEFAULT, *, sure: float = 0.0, min_words: int = MIN_DETECT_WORDS) -> str:
    """The language of ``text`` among :data:`LANGUAGES` (``py3langid``);
    ``fallback`` for a text of fewer than ``min_words`` words,
    or where the detector gives the language a probability under ``sure``.

    ``detect("Le plafond est la bande passante mémoire, pas le calcul.") -> "fr"``
    """
    if len(text.split()) < min_words:
        return known(fallback)
    lang, probability = _identifier().classify(text[:4000])
    return known(lang) if probability >= sure else known(fallback)


CHUNK_WORDS = 40  # a chunk of fewer words takes its document's language
CHUNK_SURE = 0.95  # a chunk's own language only where the detector is this sure (code reads as anything)


def languages_of(chunks: Sequence[str]) -> list[str]:
    """The language of each chunk of one document: the document's (detected
    on its first chunks together), or the chunk's own where it is long
    enough and clearly another (a French page quoting an English manual)."""
    document = detect(" ".join(chunks)[:4000])
    return [detect(c, document, sure=CHUNK_SURE) if len(c.split()) >= CHUNK_WORDS else document for c in chunks]
