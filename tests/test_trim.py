"""Trimming at sentence boundaries."""

from prompt_budget.trim import sentence_ends, trim_to_tokens


def words(text: str) -> int:
    return len(text.split())


def test_sentence_ends():
    assert sentence_ends("A b. C d.") == [4, 9]
    assert sentence_ends("No end") == [6]


def test_trim_keeps_whole_sentences_within_the_budget():
    text = "One two three. Four five six seven. Eight nine."
    assert trim_to_tokens(text, 100, words) == text
    assert trim_to_tokens(text, 8, words) == "One two three. Four five six seven."
    assert trim_to_tokens(text, 3, words) == "One two three."
    # Whole sentences would fill only 3 of 4: under the 85 % floor, words are taken.
    assert trim_to_tokens(text, 4, words) == "One two three. Four"


def test_trim_takes_words_when_sentences_would_waste_the_budget():
    text = "Heading. " + " ".join(f"w{i}" for i in range(50)) + "."
    assert trim_to_tokens(text, 20, words) == "Heading. " + " ".join(f"w{i}" for i in range(19))


def test_trim_falls_back_to_words_when_no_sentence_fits():
    assert trim_to_tokens("alpha beta gamma delta.", 2, words) == "alpha beta"
    assert trim_to_tokens("alpha beta", 0, words) == ""
