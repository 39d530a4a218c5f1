"""The language of chunks and questions, and their terms (pure: no model)."""

import numpy as np

from rag.text import language
from rag.index.lexical import LexicalIndex

FRENCH = "Le plafond est la bande passante mémoire, pas le calcul : chaque jeton relit tous les poids du modèle."
ENGLISH = "The ceiling is memory bandwidth, not compute: every token reads all of the model's weights again."


def test_french_is_folded_stemmed_and_its_stop_words_dropped():
    assert language.terms("Le décodage est limité", "fr") == language.terms("le decodage est limite", "fr")
    assert "le" not in language.terms(FRENCH, "fr") and "est" not in language.terms(FRENCH, "fr")
    assert language.stem("limitée", "fr") == language.stem("limité", "fr")


def test_identifiers_stay_whole_and_in_parts_unstemmed():
    assert language.terms("Use os.path.join and lru_cache", "en") == [
        "use", "os.path.join", "os", "path", "join", "lru_cache", "lru", "cache"]


def test_languages_are_detected_and_short_texts_take_the_fallback():
    assert language.detect(FRENCH) == "fr" and language.detect(ENGLISH) == "en"
    assert language.detect("git stash", "fr") == "fr"
    assert language.languages_of([FRENCH * 3, "x = 1"]) == ["fr", "fr"]


def test_a_query_is_read_in_every_language_the_index_holds():
    index = LexicalIndex.build([1, 2], ["La bande passante limite le décodage.", ENGLISH], ["fr", "en"])
    assert index.languages == ("en", "fr")
    # "décodage" stemmed as French ("decodag") only matches where the question is read in French too.
    found = dict(index.search("Qu'est-ce qui limite la vitesse du décodage ?", 2))
    assert 1 in found
    only_english = LexicalIndex.build([1], ["La bande passante limite le décodage."], ["en"])
    assert dict(only_english.search("decodage", 1)) != {} and index.updated([1], [], []).languages == ("en",)


def test_languages_survive_saving(tmp_path):
    index = LexicalIndex.build([5, 6], [FRENCH, ENGLISH], ["fr", "en"])
    index.save(tmp_path / "bm25")
    loaded = LexicalIndex.load(tmp_path / "bm25")
    assert loaded.languages == ("en", "fr") and np.array_equal(loaded.langs, index.langs)


def test_french_evidence_is_found_in_french_and_a_repeated_heading_is_no_answer():
    from rag.index.store import Hit
    from rag.qa.evidence import rank

    text = ("Phase 2 : le décodage\n\nUn jeton par passe avant. Le plafond est la bande passante mémoire, pas le "
            "calcul. C'est pourquoi la quantification accélère le décodage.")
    hit = Hit("c1", "prefill-decode.txt", 0.5, text, context="Préremplissage vs décodage > Phase 2 : le décodage",
              lang="fr")
    ranked = rank("Qu'est-ce qui limite la vitesse du décodage ? Le calcul ou la bande passante ?", [hit])
    assert "bande passante" in ranked.units[0].text
    assert all(u.text != "Phase 2 : le décodage" for u in ranked.units)
