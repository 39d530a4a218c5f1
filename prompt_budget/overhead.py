"""What a prompt's time to first token costs beyond the prefill of its new
tokens: the fixed overhead of a request, and what splicing stored passages
adds in place of their prefill. Each is the median of recent measurements.

Does not: lock (the cost model that owns it guards it) or measure.
"""

from __future__ import annotations

from typing import Iterable

from .recent import Recent

# Reading back a stored passage's KV: about 20 ms for 945 tokens of
# SmolLM2-135M from a snapshot here; used until this machine has spliced one.
PRIOR_SPLICE_S_PER_TOKEN = 25e-6
# Seconds to first token outside prefill assumed before any was measured (a request's own bookkeeping).
PRIOR_OVERHEAD_S = 0.02


class Overheads:
    """Recent seconds outside prefill, and recent splice costs."""

    def __init__(self, overheads: Iterable[float] = (), splice_reads: Iterable[float] = (),
                 splice_pieces: Iterable[float] = (), *, recent: int = 64) -> None:
        self.fixed = Recent(overheads, recent)
        # A spliced prompt costs reading its stored cells back (seconds per token) and, for each
        # stored passage, one more evaluation call: llama.cpp takes a sequence's tokens only right
        # after its last cell, so the prompt is evaluated in pieces between its passages.
        self.splice_reads = Recent(splice_reads, recent)
        self.splice_pieces = Recent(splice_pieces, recent)

    def overhead(self, default: float = PRIOR_OVERHEAD_S) -> float:
        """The median of recent non-prefill seconds to first token."""
        return self.fixed.median(default)

    def observe_overhead(self, seconds: float) -> None:
        """Record time to first token that prefill does not explain (a negative one is ignored)."""
        if seconds >= 0:
            self.fixed.add(seconds)

    def splice_seconds(self, tokens: int, passages: int, call_s: float) -> float:
        """Predicted seconds that ``tokens`` of ``passages`` stored passages
        add to a prompt in place of their prefill: reading and placing the
        tokens, and one more evaluation call per passage (the medians of
        recent splices; before any, a prior load rate and ``call_s``, the
        fixed cost of one evaluation call)."""
        if tokens <= 0 or passages <= 0:
            return 0.0
        return tokens * self.splice_reads.median(PRIOR_SPLICE_S_PER_TOKEN) + passages * self.splice_pieces.median(call_s)

    def observe_splice(self, tokens: int, passages: int, read_s: float, extra_s: float) -> None:
        """Record a spliced prompt: ``read_s`` spent reading and placing
        ``tokens`` of ``passages`` stored passages, and ``extra_s`` its
        evaluation took beyond a plain prefill of its new tokens."""
        if tokens > 0 and read_s >= 0:
            self.splice_reads.add(read_s / tokens)
        if passages > 0:
            self.splice_pieces.add(max(extra_s, 0.0) / passages)
