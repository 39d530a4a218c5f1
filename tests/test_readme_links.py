"""The READMEs hold together: every relative link in README.md and in the
packages' READMEs reaches a file that exists, and every #anchor a heading
there (GitHub's rule); README.md stays short and its Quick start is the two
commands, the second being what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 450

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) or ![alt](target), the text possibly over several lines; an optional "title".
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def readmes() -> list[Path]:
    """README.md and every README.md inside the repository's packages (a top-level folder with an
    __init__.py), never in hidden folders such as .venv."""
    found = [README]
    for package in sorted(p.parent for p in ROOT.glob("*/__init__.py")):
        if package.name.startswith("."):
            continue
        found += sorted(p for p in package.rglob("README.md")
                        if not any(part.startswith(".") for part in p.relative_to(ROOT).parts))
    return found


def prose(text: str) -> str:
    """The Markdown without code blocks or inline code, where a link is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than '-' and '_' removed,
    each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    return "".join(c for c in text.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a file's headings make, repeated headings numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = anchor(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of a Markdown file that reaches no file, or no heading of that file,
    named by the file's path under root."""
    broken = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # http:, https:, mailto: ... not checked here
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{path.relative_to(root)}: {target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{path.relative_to(root)}: {target}: no heading makes #{fragment}")
    return broken


def test_the_anchor_rule_is_githubs():
    assert anchor("Serving: `rag bench serve`") == "serving-rag-bench-serve"
    assert anchor("A pool of engines: `rag bench serve --engines 2`") == "a-pool-of-engines-rag-bench-serve---engines-2"
    assert anchor("A pool of engines, and several front-ends") == "a-pool-of-engines-and-several-front-ends"
    assert anchor("Tuned constants of the timing path") == "tuned-constants-of-the-timing-path"
    assert anchor("rag/qa: questions to answers") == "ragqa-questions-to-answers"


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "README.md").write_text("# Pkg\n\n## Two words\n\n## Two words\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Top\n\n[ok](pkg/README.md#two-words) [ok](pkg/README.md#two-words-1) [ok](#top)\n"
        "[gone](pkg/NOPE.md) [bad](pkg/README.md#three-words) [bad](#bottom)\n"
        "`[code](not/checked.md)` [web](https://example.org/x)\n\n```sh\n[fenced](nor/this.md)\n```\n")
    assert broken_links(page, tmp_path) == [
        "README.md: pkg/NOPE.md: no such file",
        "README.md: pkg/README.md#three-words: no heading makes #three-words",
        "README.md: #bottom: no heading makes #bottom",
    ]


def test_every_relative_link_and_anchor_of_the_readmes_works():
    pages = readmes()
    assert len(pages) >= 5, f"README.md and the packages' READMEs: {pages}"
    broken = [line for page in pages for line in broken_links(page)]
    assert not broken, "\n".join(broken)


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail beside its code"


def quick_start_commands() -> list[str]:
    """The command lines of README.md's Quick start code blocks (as tests/test_cli.py reads them)."""
    section = README.read_text(encoding="utf-8").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:sh|bash|console)?\n(.*?)```", section, re.S)
    return [line for block in blocks for line in block.strip().splitlines() if line.strip()]


def test_quick_start_is_two_commands_and_ci_runs_the_second():
    commands = quick_start_commands()
    assert len(commands) == 2, commands
    install, test = commands
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert test in ci_lines, "the second Quick start command is the line .ci/run runs"
    assert test.endswith("&& pytest") and "'.[test]'" in test
    # Both set up the same way (a venv, the pinned CPU torch); the first then asks the sample corpus.
    setup = test.split(" && pip install -e ", 1)[0]
    assert install.startswith(setup + " && pip install . && rag ask "), install
