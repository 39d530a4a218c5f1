"""Grounded citations: an answer cites only what its prompt showed.

A small model invents citations ("[4] (preload-cache.md)" with three
passages shown), or runs on into prompt text ("Question: ..."). After
generation, and piece by piece while streaming, :class:`GroundedText`
removes every passage number that was not in the prompt and every file name
that appears nowhere in it, and stops the answer at a stop sequence (text
that only a prompt has). Streamed text and the final answer are the same
text: the final answer is what was streamed.

A citation is ``[n]``, ``[n, m]`` or ``[n-m]``; its numbers are kept if
the prompt numbered that many passages, the rest removed (``[1, 5]`` with
three passages -> ``[1]``; ``[5]`` -> nothing). A file name is a word with
a document extension (``notes.md``, ``library/os.rst.txt``); it is kept if
the prompt's sources or passage text name it, else removed, with the
parentheses around it. A link (``https://example.org/guide.html``) is not a
file name and stays whole, streamed or not.

Does not: judge whether a cited passage supports the sentence, or change
what was generated (the engine's tokens and timings stay as they were).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..ingest import CODE_SUFFIXES, SUPPORTED_SUFFIXES

# Text that starts a part of the prompt: an answer that reaches it has
# stopped answering and begun writing a prompt. Chosen on `rag bench answers`
# (see README, "Answer accuracy").
STOP_SEQUENCES = ("\nQuestion:", "\nContext:", "<|im_start|>", "<|im_end|>", "<end_of_turn>")

_CITATION = re.compile(r"([ \t]*)\[\s*(\d+(?:\s*(?:,|-|–)\s*\d+)*)\s*\]")
# The documents' own suffixes (what ingest reads), but for source code's: "Node.js" or "x.go" in an
# answer is a name of a thing far more often than a file it cites.
_EXTENSIONS = tuple(sorted(s.lstrip(".") for s in SUPPORTED_SUFFIXES - CODE_SUFFIXES))
# A name starts a run of name characters (or at its "("), never inside one: inside "x/guide.html#a"
# only the whole run is a name. A link ("https://host/guide.html") is no file name: the prompt cannot
# show it, and removing its path mangled the link.
_FILE = re.compile(r"([ \t]*)((?:\(|(?<![\w./-])(?!(?<=:)//))[\w./-]*\w\.(?:" + "|".join(_EXTENSIONS)
                   + r")\b\)?)", re.IGNORECASE)
# An opening that cannot be a citation, a number or a path yet: a word of letters, a list marker
# ("1.", "2)") or a run of markup ("::", "..", "**", "-"). The small model opens a few answers so
# (2 of 48 in two runs of rag bench serve, 8 clients), and holding the opening cost each of them a
# decode step: up to a second where the next step evaluated another request's prompt.
_OPENING_WORD = re.compile(r"[ \t]*(?:[^\W\d_]+|\d{1,2}[.)]|[:.*#>\-]+)$")
_HELD_BRACKET = 24  # an open "[" further back than this is not a citation still being written
# What may still grow into a file name the prompt did not show: an opening parenthesis and a run of
# ASCII name characters, at most _HELD_NAME of them. Text in other scripts (CJK has no spaces) and
# the head of a longer run (a URL, a long identifier) are shown as they come; the word they belong
# to is still judged whole when it ends, and an invented name loses what was not shown yet.
_HELD_TAIL = re.compile(r"\(?[A-Za-z0-9_./-]*$")
_WORD_TAIL = re.compile(r"\(?[\w./-]*$")  # the unfinished word, as _FILE reads a name
# Chosen, not measured: longer than the names prompts show (the bundled samples' longest source is
# 21 characters, "prefill-and-decode.md"), short enough that a URL streams with a short lag.
_HELD_NAME = 32
# The end of a run cut short that may still be the extension of a name ("guide.htm", "os.rst.t"): the
# cut goes back before it, or the part shown would be judged alone ("guide.htm", at its end, reads as a
# whole name). Extensions have at most 8 characters; 3 such parts bound how much more is held.
_OPEN_EXTENSION = re.compile(r"(?:\.\w{0,8}){1,3}$")
# What goes before a run carried to the next piece, so that it is judged as _FILE judges the whole
# text: ":" where the run follows one, "://" where the run is a link's, cut short to _HELD_NAME.
_LINK = "://"


@dataclass(frozen=True)
class Grounding:
    """What a prompt showed: ``passages`` numbered 1..n, the ``sources``
    they came from and the prompt's ``text``."""

    passages: int
    sources: tuple[str, ...] = ()
    text: str = ""
    _names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = {s.lower() for s in self.sources} | {s.rsplit("/", 1)[-1].lower() for s in self.sources}
        object.__setattr__(self, "_names", frozenset(names))

    def clean(self, text: str) -> tuple[str, list[str]]:
        """``text`` less the citations this prompt did not show, and those
        removed, in order.

        ``Grounding(2, ("a.md",)).clean("See [3] (b.md) and [1].") -> ("See and [1].", ["[3]", "(b.md)"])``
        """
        removed: list[str] = []
        text = _CITATION.sub(lambda m: self._numbers(m, removed), text)
        text = _FILE.sub(lambda m: self._file(m, removed), text)
        return text, removed

    def _numbers(self, match: re.Match, removed: list[str]) -> str:
        space, inside = match.group(1), match.group(2)
        numbers = [int(n) for n in re.findall(r"\d+", inside)]
        if all(1 <= n <= self.passages for n in numbers):
            return match.group(0)
        removed.append(match.group(0)[len(space):])
        kept = [str(n) for n in numbers if 1 <= n <= self.passages]
        if kept and not ("-" in inside or "–" in inside):
            return f"{space}[{', '.join(kept)}]"
        return ""  # with the space before it: "See [4]." -> "See."

    def _file(self, match: re.Match, removed: list[str]) -> str:
        space, whole = match.group(1), match.group(2)
        name = whole.strip("()").lower()
        if name in self._names or name.rsplit("/", 1)[-1] in self._names or name in self.text.lower():
            return match.group(0)
        removed.append(whole)
        # Only the parentheses that enclose the name go with it.
        if whole.startswith("(") and not whole.endswith(")"):
            return space + "("
        if whole.endswith(")") and not whole.startswith("("):
            return ")"
        return ""


class GroundedText:
    """Streaming filter: :meth:`feed` each generated piece and show what it
    returns; :meth:`finish` returns the rest. Text that could still become
    a citation, a file name or a stop sequence is held back until it is
    known (of a file name, its last ``_HELD_NAME`` ASCII characters: text
    without spaces is not held until a space); :attr:`stopped` turns true
    at a stop sequence (stop generating then), :attr:`removed` lists the
    citations removed."""

    def __init__(self, grounding: Grounding, stops: Sequence[str] = STOP_SEQUENCES) -> None:
        self.grounding = grounding
        self.stops = tuple(s for s in stops if s)
        self.removed: list[str] = []
        self.stopped = False
        self._held = ""
        self._shown = False
        self._word = ""  # the word shown before it ended (its tail): what follows may still complete it
        self._lead = ""  # what came before that word, as far as judging it goes (see _LINK)

    def feed(self, piece: str) -> str:
        """The text that can be shown now, ``piece`` included as far as it is known."""
        if self.stopped:
            return ""
        self._held += piece
        cut = self._stop_at(self._held)
        if cut is not None:
            self._held = self._held[:cut]
            self.stopped = True
            return self.finish()
        safe = self._safe_end(self._held)
        if not self._shown and _OPENING_WORD.match(self._held):
            # The answer's first word, letters only, is shown at once: holding
            # it until the next token costs every reader one decode step (a
            # third of a second on a busy engine) of time to first text. Should
            # it grow into an invented file name, the rest of that name is removed.
            out, self._held = self._held, ""
            self._carry(self._lead + self._word + out)
            self._shown = True
            return out
        out, self._held = self._held[:safe], self._held[safe:]
        out = self._clean(out)
        self._shown = self._shown or bool(out)
        return out

    def finish(self) -> str:
        """The text still held, cleaned: call once generation ended."""
        out, self._held = self._held, ""
        return self._clean(out)

    def _clean(self, text: str) -> str:
        if not text:
            return ""  # the word shown last may still go on
        # The word shown last, and what came before it, are judged again with what follows: a name
        # is judged whole. What was shown stays; a removed name takes the rest of itself with it.
        lead, shown = self._lead, self._lead + self._word
        whole, removed = self.grounding.clean(shown + text)
        out = whole[len(shown):] if whole.startswith(shown) else whole[len(lead):]
        self.removed += removed
        self._carry(whole)
        return out

    def _carry(self, text: str) -> None:
        """Keep the unfinished word at the end of ``text`` (judged text, ``_lead`` first) for the next piece."""
        start = _WORD_TAIL.search(text).start()
        before, word = text[:start], text[start:]
        link = before.endswith(":")
        if len(word) > _HELD_NAME:  # cut short: say only whether the run is a link's
            self._lead = _LINK if link and word.startswith("//") else ""
        else:
            self._lead = ":" if link else ""
        self._word = word[-_HELD_NAME:]

    def _stop_at(self, text: str) -> int | None:
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def _safe_end(self, text: str) -> int:
        """How much of ``text`` is settled: not the tail that may be a file
        name still being written (see ``_HELD_TAIL``), not an open ``[`` and
        not the start of a stop sequence."""
        # That tail, and the spaces before it: a citation or a name is removed with the spaces before it.
        tail = _HELD_TAIL.search(text).start()
        word = max(tail, len(text) - _HELD_NAME)
        extension = _OPEN_EXTENSION.search(text, tail, word) if word > tail else None
        if extension:  # a run cut short: not where an extension may still be written
            word = extension.start()
        bracket = text.rfind("[", 0, word + 1)
        if bracket >= 0 and "]" not in text[bracket:word] and len(text) - bracket <= _HELD_BRACKET:
            word = bracket  # inside a citation still being written, or just closed
        end = len(text[:word].rstrip(" \t"))
        for stop in self.stops:  # a tail that may begin a stop sequence
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    end = min(end, len(text) - n)
                    break
        return max(end, 0)


def grounded(pieces: Iterable[str], grounding: Grounding) -> tuple[str, list[str]]:
    """The whole text of ``pieces`` as a stream would show it, and the citations removed."""
    guard = GroundedText(grounding)
    out = []
    for piece in pieces:
        out.append(guard.feed(piece))
        if guard.stopped:
            break
    out.append(guard.finish())
    return "".join(out), guard.removed
