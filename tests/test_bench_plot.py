"""``rag bench ttft --plot FILE``: measured and predicted TTFT against the
target per question, drawn by matplotlib as SVG or PNG. The drawing is
checked on a made-up bench object (pure logic); one run on the real model
writes a plot of its two questions."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET

import pytest

from rag.errors import RagError

from .conftest import assert_clean_error

pytest.importorskip("matplotlib", reason="the bench extra is not installed")

from rag.evaluation.plot import MEASURED, PREDICTED, check_plot_path, plot_ttft, ttft_figure  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def bench_object(targets=(0.5, 2.0), questions=3, passes=1) -> dict:
    """A ``rag bench ttft`` object as the bench returns it, its TTFTs made up."""
    rows = [{"pass": p, "target_s": t, "question": q, "ttft_s": t * (0.5 + 0.1 * q),
             "predicted_ttft_s": t * (0.6 + 0.05 * q)}
            for p in range(1, passes + 1) for t in targets for q in range(1, questions + 1)]
    config = {"targets": list(targets), "questions": questions, "max_tokens": 16, "passes": passes, "learn": True,
              "engine": "llama.cpp (in process)", "splice_fresh": None, "busy_first_half": False}
    return {"bench": "ttft", "config": config, "rows": rows, "summary": {"targets": []}}


def _lines(figure, marker: str):
    return [line for line in figure.axes[0].get_lines() if line.get_marker() == marker]


def test_the_figure_has_a_line_per_target_and_a_dot_and_a_cross_per_answer():
    result = bench_object(targets=(0.5, 2.0), questions=3, passes=2)
    figure = ttft_figure(result)
    measured, predicted = _lines(figure, MEASURED), _lines(figure, PREDICTED)
    assert [len(line.get_xdata()) for line in measured] == [6, 6]  # two passes of three questions per target
    assert [list(line.get_ydata()) for line in predicted][1] == [r["predicted_ttft_s"] for r in result["rows"]
                                                                 if r["target_s"] == 2.0]
    targets = [line for line in figure.axes[0].get_lines() if line.get_linestyle() == "--"]
    assert sorted(set(line.get_ydata()[0] for line in targets)) == [0.5, 2.0]
    assert list(measured[0].get_xdata()) == [1, 2, 3, 4, 5, 6]  # the second pass continues after the first
    title = figure.axes[0].get_title(loc="left")
    assert "3 questions" in title and "2 pass" in title and "learning on" in title


def test_the_svg_holds_every_marker(tmp_path):
    path = plot_ttft(bench_object(targets=(1.0, 4.0), questions=5), tmp_path / "ttft.svg")
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    groups = {g.get("id"): g for g in root.iter(f"{SVG}g")}
    for n in range(2):
        assert len(groups[f"measured-{n}"].findall(f".//{SVG}use")) == 5
        assert len(groups[f"predicted-{n}"].findall(f".//{SVG}use")) == 5
        assert f"target-{n}" in groups


def test_a_png_by_its_suffix(tmp_path):
    path = plot_ttft(bench_object(), tmp_path / "ttft.PNG")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_another_suffix_or_no_matplotlib_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(RagError, match=r"must end in \.svg or \.png"):
        check_plot_path(tmp_path / "ttft.jpg")
    with pytest.raises(RagError, match="cannot|No such|directory"):
        plot_ttft(bench_object(), tmp_path / "missing" / "ttft.svg")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(RagError, match="needs matplotlib"):
        check_plot_path(tmp_path / "ttft.svg")


def test_bench_ttft_plots_its_questions(run, corpus, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "What limits decode?", "gold": ["decode.txt"]}\n'
                         '{"question": "How long does bread rise?", "gold": ["guide/cooking.rst"]}\n')
    args = ["bench", "ttft", "--corpus", corpus, "--questions", questions, "--index", tmp_path / "index"]
    assert_clean_error(run(*args, "--plot", tmp_path / "ttft.gif"), "--plot", ".svg or .png")
    plot = tmp_path / "ttft.svg"
    result = run(*args, "--targets", "3", "--max-tokens", "2", "--plot", plot, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["bench"] == "ttft" and f"plot: {plot}" in result.stderr
    groups = {g.get("id"): g for g in ET.parse(plot).getroot().iter(f"{SVG}g")}
    assert len(groups["measured-0"].findall(f".//{SVG}use")) == 2
    assert len(groups["predicted-0"].findall(f".//{SVG}use")) == 2
