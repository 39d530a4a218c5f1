"""``rag bench ttft --plot FILE``: a ``rag bench ttft`` object drawn with
matplotlib, as SVG or PNG by the file's suffix.

One chart: the questions in the order they were asked along x (a second
pass continues after the first), seconds along y; per target, in one
colour, the target as a line, the measured TTFT as dots and the predicted
TTFT as crosses. The title says the run's configuration.

Does not: measure anything, or draw by hand: matplotlib (the ``bench``
extra) renders, on the Agg canvas, so no display is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RagError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = (".svg", ".png")
MEASURED, PREDICTED = "o", "x"  # the markers of the measured and the predicted TTFT


def check_plot_path(path: Path) -> None:
    """A RagError (one line) unless ``path`` ends in .svg or .png and
    matplotlib can be imported: checked before a bench runs, not after."""
    if path.suffix.lower() not in FORMATS:
        raise RagError(f"--plot {path}: the file must end in .svg or .png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RagError("--plot needs matplotlib: pip install 'rag-budget[bench]' (or pip install matplotlib)") from None


def _title(config: dict) -> str:
    splice = config.get("splice_fresh")
    return (f"rag bench ttft: {config['questions']} questions, {config.get('passes', 1)} pass(es), "
            f"{config['max_tokens']} answer tokens\n"
            f"engine {config['engine']}, learning {'on' if config['learn'] else 'off'}, "
            f"passage KV reuse {'off' if splice is None else f'R={splice}'}"
            + (", neighbour for the first half" if config.get("busy_first_half") else ""))


def ttft_figure(result: dict) -> Figure:
    """The chart of a ``rag bench ttft`` object (its rows: ``target_s``,
    ``pass``, ``question``, ``ttft_s``, ``predicted_ttft_s``): per target a
    line at the target, a dot per measured TTFT and a cross per prediction,
    against the question's place in the order asked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    config, rows = result["config"], result["rows"]
    per_pass = config["questions"]
    figure = Figure(figsize=(9, 5), layout="constrained")
    FigureCanvasAgg(figure)  # Agg: drawn without a display
    ax = figure.add_subplot()
    for n, target in enumerate(config["targets"]):
        mine = [r for r in rows if r["target_s"] == target]
        if not mine:
            continue
        colour = f"C{n % 10}"
        x = [(r["pass"] - 1) * per_pass + r["question"] for r in mine]
        ax.plot([min(x) - 0.5, max(x) + 0.5], [target, target], linestyle="--", color=colour, linewidth=1,
                label=f"target {target:g} s", gid=f"target-{n}")
        ax.plot(x, [r["ttft_s"] for r in mine], linestyle="none", marker=MEASURED, color=colour,
                label=f"measured at {target:g} s", gid=f"measured-{n}")
        ax.plot(x, [r["predicted_ttft_s"] for r in mine], linestyle="none", marker=PREDICTED, color=colour,
                label=f"predicted at {target:g} s", gid=f"predicted-{n}")
    passes = config.get("passes", 1)
    ax.set_xlabel("question, in the order asked" + (f" ({passes} passes of {per_pass})" if passes > 1 else ""))
    ax.set_ylabel("time to first token, s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncols=max(1, len(config["targets"])), loc="upper left")
    ax.set_title(_title(config), fontsize="medium", loc="left")
    return figure


def plot_ttft(result: dict, path: Path) -> Path:
    """Draw ``result`` (a ``rag bench ttft`` object) into ``path``, SVG or
    PNG by its suffix; a RagError for another suffix, a missing matplotlib,
    or a file that cannot be written."""
    check_plot_path(path)
    figure = ttft_figure(result)
    try:
        figure.savefig(path, format=path.suffix.lower().lstrip("."), dpi=120)
    except OSError as exc:
        raise RagError(f"--plot {path}: {exc.strerror or exc}") from None
    return path
