"""The Python API keeps its word (issue 56): a renamed keyword still works,
with a DeprecationWarning naming its new name, and a keyword nobody takes is
a TypeError that names those taken, not an internal class's complaint."""

from __future__ import annotations

import warnings

import pytest

from rag.errors import RagError
from rag.qa.options import AskOptions
from rag.qa.pipeline import Pipeline


def test_index_dir_still_opens_the_index_with_a_warning_naming_index_location(tmp_path):
    with pytest.warns(DeprecationWarning, match="'index_dir' is renamed 'index_location'") as caught:
        pipeline = Pipeline.open(index_dir=tmp_path / "idx")
    assert pipeline.index_location == tmp_path / "idx"
    assert caught[0].filename == __file__  # the warning points at the caller's line
    with pytest.warns(DeprecationWarning, match="index_location"):
        assert Pipeline(index_dir=tmp_path / "other").index_location == tmp_path / "other"


def test_both_names_at_once_is_refused(tmp_path):
    with pytest.raises(TypeError, match="old name of 'index_location'"):
        Pipeline.open(index_dir=tmp_path / "a", index_location=tmp_path / "b")


@pytest.mark.parametrize("call", [Pipeline.open, Pipeline])
def test_an_unknown_keyword_names_the_keywords_taken(call, tmp_path):
    with pytest.raises(TypeError) as raised:
        call(tmp_path / "idx", kv_ram=1)
    message = str(raised.value)
    assert "unexpected keyword argument 'kv_ram'" in message
    assert "kv_ram_bytes" in message and "history_mode" in message and "Components" not in message


def test_an_unknown_option_of_a_question_names_the_options():
    with pytest.raises(TypeError, match=r"'max_token'.*max_tokens"):
        AskOptions.of(max_token=3)
    with pytest.raises(RagError, match="max_token"):  # what a front end shows its user, as before
        AskOptions.of(max_token=3)


def test_the_current_keywords_warn_nothing(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Pipeline.open(tmp_path / "idx", learn=False)
        AskOptions.of(max_tokens=3)
