"""Grounded citations: an answer never cites a passage number or a file its
prompt did not show, whether it is read streamed or whole."""

from __future__ import annotations

import pytest

from rag.qa.citations import Grounding, GroundedText, grounded

SHOWN = Grounding(2, ("library/os.rst.txt", "notes.md"), "Context: run setup.py first")
INVENTED = "Use os.getcwd() [1, 5] (os.rst.txt), see [4] (preload-cache.md) and setup.py [2-7]. Done [2]."
CLEAN = "Use os.getcwd() [1] (os.rst.txt), see and setup.py. Done [2]."


def test_invented_numbers_and_files_are_removed_and_listed():
    text, removed = SHOWN.clean(INVENTED)
    assert text == CLEAN
    assert removed == ["[1, 5]", "[4]", "[2-7]", "(preload-cache.md)"]


def test_what_the_prompt_showed_is_kept():
    text = "It is 42 [1] [2] [1, 2] (notes.md) and library/os.rst.txt, like setup.py."
    assert SHOWN.clean(text) == (text, [])


def test_with_no_passages_every_number_goes():
    assert Grounding(0).clean("I do not know [1].") == ("I do not know.", ["[1]"])


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(INVENTED)])
def test_a_stream_shows_the_same_text_however_it_is_cut(size):
    pieces = [INVENTED[i:i + size] for i in range(0, len(INVENTED), size)]
    guard = GroundedText(SHOWN)
    shown = "".join(guard.feed(p) for p in pieces) + guard.finish()
    assert shown == CLEAN
    # Nothing invented is ever shown, not even for a moment.
    assert "5]" not in shown and "[4" not in shown and "preload" not in shown


def test_the_opening_word_is_shown_at_once_and_later_words_when_settled():
    guard = GroundedText(SHOWN)
    assert guard.feed("The") == "The"  # the first text the reader sees waits for no second token
    assert guard.feed(" notes") == ""  # may still become "notes.md"
    assert guard.feed(".md say [4]") + guard.finish() == " notes.md say"
    guard = GroundedText(SHOWN)
    assert guard.feed("preload") == "preload"
    assert guard.feed("-cache.md says [1]") + guard.finish() == " says [1]"  # the invented name goes
    assert guard.removed == ["preload-cache.md"]
    for opening in ("[4]", "(preload-cache.md)", "\nQuestion:", "2024"):
        assert GroundedText(SHOWN).feed(opening) == ""  # what may be invented or a stop still waits
    for opening in ("1.", "2)", "::", "..", "**"):  # a list marker or markup: nothing to judge yet
        assert GroundedText(SHOWN).feed(opening) == opening
    guard = GroundedText(SHOWN)
    assert guard.feed("1.") + guard.feed(" See [4]") + guard.finish() == "1. See"


def test_text_without_spaces_is_shown_as_it_comes_not_at_the_end():
    # CJK has no spaces: waiting for one held the whole answer back until it ended.
    cjk = "プレフィルはプロンプト全体を一度に読み、KVキャッシュを満たします。デコードは一度に一つずつです。"
    guard = GroundedText(SHOWN)
    before = "".join(guard.feed(cjk[i:i + 2]) for i in range(0, len(cjk), 2))
    assert before == cjk and guard.finish() == ""
    # A URL or a long identifier: held only as far as it could still become a file name the
    # prompt did not show (its last 32 characters), not until the space after it.
    for word in ("https://example.org/docs/engine/prefill-and-decode/why-the-first-token-waits",
                 "os_environ_get_or_default_for_every_single_setting_of_the_engine"):
        text = "See " + word
        guard = GroundedText(SHOWN)
        before = "".join(guard.feed(text[i:i + 3]) for i in range(0, len(text), 3))
        assert len(before) >= len(text) - 32 and before + guard.feed(" ok") + guard.finish() == text + " ok"


def test_a_long_invented_name_shown_in_part_is_judged_whole():
    name = "docs/engine/prefill-and-decode/notes-on-the-cache.md"  # longer than what is held
    guard = GroundedText(SHOWN)
    text = "Read " + name + " first [1]."
    shown = "".join(guard.feed(text[i:i + 4]) for i in range(0, len(text), 4)) + guard.finish()
    assert shown.startswith("Read docs/") and shown.endswith(" first [1].")
    assert "notes-on-the-cache.md" not in shown and len(guard.removed) == 1  # the rest of it went
    guard = GroundedText(Grounding(1, (name,)))  # a name the prompt showed stays whole
    shown = "".join(guard.feed(text[i:i + 4]) for i in range(0, len(text), 4)) + guard.finish()
    assert shown == text and guard.removed == []
    guard = GroundedText(SHOWN)  # a name in another script: shown as it comes, its extension removed
    assert guard.feed("読む") + guard.feed("説明書") + guard.feed(".md") + guard.feed("。") + guard.finish() == "読む説明書。"


def test_an_answer_stops_where_prompt_text_begins():
    text, _ = grounded(["It is 70.", "\nQuest", "ion: what else", "?"], SHOWN)
    assert text == "It is 70."
    guard = GroundedText(SHOWN)
    assert guard.feed("It is 70.\nQue") == "It is 70."  # the start of a stop sequence is held back
    assert guard.feed("ry") + guard.finish() == "\nQuery" and not guard.stopped  # not a stop after all


def test_the_pipeline_removes_invented_citations_streamed_and_whole(tmp_path, corpus, embedder):
    from engine.fake import FakeBackend
    from rag import Pipeline

    reply = "Dough rises for an hour [1] [9] (preload-cache.md).\nQuestion: and more?"
    p = Pipeline.open(tmp_path / "index", embedder=embedder, backend=FakeBackend(n_ctx=4096, reply=reply),
                      profile_dir=tmp_path / "profiles")
    p.ingest([corpus])
    # The model's own text, without the quoted evidence an answer opens with by default.
    stream = p.stream("How long should bread dough rise?", max_tokens=64, no_target=True, max_k=2, evidence="last")
    pieces = list(stream)
    answer = stream.answer
    assert answer.answer == "".join(pieces).strip() == "Dough rises for an hour [1]."
    assert answer.ungrounded == ("[9]", "(preload-cache.md)")
    assert answer.to_dict()["ungrounded_citations"] == ["[9]", "(preload-cache.md)"]
    assert answer.timings.decode_tokens > 0  # drained past the stop: the engine still reported


URL = "https://example.org/docs/guide.html#anchor-with-a-long-name"
# Not a file name (no word boundary after ".html"), longer than the held window, so a stream must
# cut it somewhere: at "guide.htm" the cut part alone would read as an invented name.
IDENTIFIER = "docs/engine/guide.html_backup_copy_from_the_last_release_v2"


@pytest.mark.parametrize("run", [URL, IDENTIFIER])
def test_a_long_run_comes_out_whole_however_it_is_cut(run):
    text = f"See {run} (preload-cache.md) or notes.md [1]."
    whole, removed = SHOWN.clean(text)
    assert whole == f"See {run} or notes.md [1]." and removed == ["(preload-cache.md)"]
    cuts = [[text[:i], text[i:]] for i in range(1, len(text))]
    cuts += [[text[i:i + size] for i in range(0, len(text), size)] for size in (1, 2, 3, 5, 7, 11)]
    for pieces in cuts:
        guard = GroundedText(SHOWN)
        shown = "".join(guard.feed(p) for p in pieces) + guard.finish()
        assert (shown, guard.removed) == (whole, removed), pieces
