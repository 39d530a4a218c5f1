"""The seam between rag-budget and an inference engine.

A backend turns chat messages into a prompt with the model's own template,
counts tokens with the model's own tokenizer, and streams a completion while
measuring it. Everything above this seam (the budgeter, the pipeline, the
interfaces) talks only to :class:`Backend`; a second engine is a new module
that implements it.

Does not: choose what goes into the prompt, retrieve, or keep conversations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator, Literal, Protocol, Sequence, runtime_checkable

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class Message:
    """One chat message, before the model's template is applied."""

    role: Role
    content: str


@dataclass(frozen=True)
class Timings:
    """What the engine measured for one request.

    Invariant: ``cached_tokens + prefill_tokens == prompt_tokens``.
    ``prefill_s`` and ``decode_s`` are the engine's own counters; ``ttft_s``
    and ``total_s`` are wall-clock seconds from the start of the request.
    """

    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    ttft_s: float
    prefill_s: float
    decode_tokens: int
    decode_s: float
    total_s: float
    restored_tokens: int = 0  # of cached_tokens, those read back from a saved snapshot
    restore_s: float = 0.0  # spent reading that snapshot back (inside ttft_s)
    snapshot_s: float = 0.0  # spent saving the state after the answer (after total_s)
    queue_s: float = 0.0  # spent waiting for the engine behind other requests (inside ttft_s)

    def to_dict(self) -> dict[str, int | float]:
        """The ``timings`` object of the ``rag ask --json`` contract."""
        return asdict(self)

    def shifted(self, seconds: float) -> "Timings":
        """These timings with ``seconds`` of work before the engine call added
        to the wall-clock figures (``ttft_s`` and ``total_s``)."""
        return Timings(
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            prefill_tokens=self.prefill_tokens,
            ttft_s=self.ttft_s + seconds,
            prefill_s=self.prefill_s,
            decode_tokens=self.decode_tokens,
            decode_s=self.decode_s,
            total_s=self.total_s + seconds,
            restored_tokens=self.restored_tokens,
            restore_s=self.restore_s,
            snapshot_s=self.snapshot_s,
            queue_s=self.queue_s,
        )


class ContextOverflow(ValueError):
    """The prompt plus the reserved answer tokens do not fit the context window."""


@runtime_checkable
class Backend(Protocol):
    """An inference engine that rag-budget can prompt and measure."""

    @property
    def name(self) -> str:
        """A short identifier of the engine and model, for reports."""
        ...

    @property
    def n_ctx(self) -> int:
        """The context window in tokens: prompt plus answer never exceed it."""
        ...

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text for ``messages`` under the model's chat template,
        ending where the assistant's answer begins."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens for ``text`` as a whole prompt (special tokens
        in the text are parsed as such)."""
        ...

    def cached_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the engine would reuse from its KV
        cache or its saved snapshots, not evaluating them again, if they were
        prompted now."""
        ...

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        session: str | None = None,
    ) -> Iterator[str | Timings]:
        """Stream the completion of ``prompt`` (text, or tokens as
        :meth:`tokenize` gives them): text pieces as they are decoded, then
        exactly one :class:`Timings` as the last item.

        The longest prefix of the prompt held in the KV cache or in a saved
        snapshot is not evaluated again. With a ``session`` key, the state
        after the answer is saved under that key for the session's next
        prompt, which will start with this one.

        Raises :class:`ContextOverflow` before any work if the prompt plus
        ``max_tokens`` exceed :attr:`n_ctx`.
        """
        ...

    def prefill(self, tokens: Sequence[int], *, session: str, pin: bool = False) -> Timings:
        """Evaluate ``tokens`` now (reusing any cached prefix) and save the
        state under ``session``, so a later prompt that starts with them
        finds them cached; ``pin`` keeps it from eviction (the system
        prompt's state)."""
        ...

    def forget(self, session: str) -> None:
        """Drop the saved state of ``session``, if any."""
        ...

    def cache_stats(self) -> dict[str, object]:
        """What the engine's snapshot store holds: entries and bytes in RAM
        and on disk, and its caps."""
        ...

    def profile_key(self) -> dict[str, object]:
        """What changes this engine's prefill rates (model file, build,
        offload, context, threads, batch): equal keys may share a profile."""
        ...

    def info(self) -> dict[str, object]:
        """Facts about the engine for ``rag doctor``: build, device, model
        path and size, context, threads."""
        ...


def complete(backend: Backend, prompt: str | Sequence[int], *, max_tokens: int = 256) -> tuple[str, Timings]:
    """Run ``backend.generate`` to the end: the whole text and its Timings."""
    pieces: list[str] = []
    timings: Timings | None = None
    for item in backend.generate(prompt, max_tokens=max_tokens):
        if isinstance(item, Timings):
            timings = item
        else:
            pieces.append(item)
    if timings is None:
        raise RuntimeError(f"{backend.name} ended a generation without reporting its timings")
    return "".join(pieces), timings
