"""A deterministic stand-in backend for unit tests of pure logic.

Tokens are runs of non-space characters and single spaces; "prefill" costs
``seconds_per_token`` for each token after the longest common prefix with the
previous prompt or a saved session state of the prompt's cache scope (a
pinned state is every scope's, as the real engine's system prompt is), and
nothing is slept: the timings are computed, not measured.
Never use it where a test claims to exercise the real engine.
"""

from __future__ import annotations

import re
from typing import Generator, Sequence

from .backend import Generation, Message, Timings, check_fits

_TOKEN = re.compile(r"\S+|\s")


class FakeBackend:
    """A :class:`~engine.backend.Backend` with a formula instead of a model."""

    def __init__(self, n_ctx: int = 2048, seconds_per_token: float = 0.005, reply: str = "fake answer") -> None:
        self._n_ctx = n_ctx
        self.seconds_per_token = seconds_per_token
        self.reply = reply
        self._vocab: dict[str, int] = {}
        self._cached: list[int] = []
        self._cached_scope = ""  # the cache scope of the previous prompt
        self.saved: dict[str, list[int]] = {}  # session -> the tokens its state holds
        self.scopes: dict[str, str | None] = {}  # session -> the cache scope of its state (None: every scope's)

    @property
    def name(self) -> str:
        return "fake"

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    def render(self, messages: Sequence[Message]) -> str:
        """``<|role|>content`` per message, then ``<|assistant|>``."""
        return "".join(f"<|{m.role}|>\n{m.content}\n" for m in messages) + "<|assistant|>\n"

    def tokenize(self, text: str) -> list[int]:
        """One id per run of non-space characters or single whitespace character."""
        return [self._vocab.setdefault(piece, len(self._vocab)) for piece in _TOKEN.findall(text)]

    @staticmethod
    def _common(held: Sequence[int], tokens: Sequence[int]) -> int:
        n = 0
        for a, b in zip(held, tokens[:-1]):
            if a != b:
                break
            n += 1
        return n

    def cached_prefix(self, tokens: Sequence[int], cache_scope: str = "") -> int:
        """Leading tokens shared with the previous prompt or a saved state of
        ``cache_scope`` (or pinned), the last one excepted."""
        held = [self._cached] if self._cached_scope == cache_scope else []
        held += [s for key, s in self.saved.items() if self.scopes.get(key, "") in (cache_scope, None)]
        return max([0] + [self._common(s, tokens) for s in held])

    def generate(
        self, prompt: str | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
        session: str | None = None, deadline: float | None = None, background: bool = False,
        stop: Sequence[str] = (), cache_scope: str = "",
    ) -> Generation:
        """The fixed reply, word by word, up to the word that completes one
        of ``stop``; Timings from the formula."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        check_fits(len(tokens), max_tokens, self._n_ctx)
        return Generation(self._stream(tokens, max_tokens, session, tuple(s for s in stop if s), cache_scope),
                          engine=self.name)

    def _stream(self, tokens: list[int], max_tokens: int, session: str | None,
                stop: tuple[str, ...] = (), scope: str = "") -> Generator[str, None, Timings]:
        cached = self.cached_prefix(tokens, scope)
        prefill = len(tokens) - cached
        words = self.reply.split(" ")[:max_tokens]
        said = ""
        for i, w in enumerate(words):
            piece = w if i == 0 else " " + w
            yield piece
            said += piece
            if any(s in said for s in stop):
                words = words[: i + 1]
                break
        self._cached, self._cached_scope = tokens + self.tokenize(self.reply), scope
        if session is not None:
            self.saved[session], self.scopes[session] = list(self._cached), scope
        prefill_s = prefill * self.seconds_per_token
        decode_s = len(words) * self.seconds_per_token
        return Timings(len(tokens), cached, prefill, prefill_s, prefill_s, len(words), decode_s, prefill_s + decode_s)

    def prefill(self, tokens: Sequence[int], *, session: str, pin: bool = False, cache_scope: str = "") -> Timings:
        """Hold ``tokens`` as ``session``'s state, of ``cache_scope`` (every
        scope's when ``pin``); Timings from the formula."""
        tokens = list(tokens)
        cached = min(self.cached_prefix(tokens + [-1], cache_scope), len(tokens))
        self._cached, self._cached_scope = tokens, cache_scope
        self.saved[session], self.scopes[session] = tokens, None if pin else cache_scope
        s = (len(tokens) - cached) * self.seconds_per_token
        return Timings(len(tokens), cached, len(tokens) - cached, s, s, 0, 0.0, s)

    def forget(self, session: str) -> None:
        self.saved.pop(session, None)
        self.scopes.pop(session, None)

    def cache_stats(self) -> dict[str, object]:
        return {"ram_entries": len(self.saved)}

    def profile_key(self) -> dict[str, object]:
        return {"engine": "fake", "seconds_per_token": self.seconds_per_token, "n_ctx": self._n_ctx}

    def describe(self) -> dict[str, object]:
        return {"engine": "fake", "n_ctx": self._n_ctx}

    def close(self) -> None:
        """Nothing to release."""
