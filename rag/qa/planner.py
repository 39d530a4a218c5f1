"""Planning one request's prompt: which retrieved chunks go in, cut how,
in what order, after which history, so that the predicted time to first
token meets the target and the prompt never exceeds the context window.

Question, candidates, conversation history, options and cost model in; a
:class:`PlannedPrompt` out. Only the backend's template and tokenizer are
used (and its prefix cache, when it has one, to count what is cached for
the prompt's cache scope, as the engine will count it), so the planner is
tested on the deterministic fake backend.

Does not: retrieve, generate or store anything.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple, Sequence

import numpy as np

from engine.backend import Backend, LoadAware, PassageKV, PrefixCache, scoped
from engine.backend import check_fits as fits_the_context  # the engine's own check, not a second one
from engine.errors import ContextOverflow
from engine.scheduler import Ahead
from prompt_budget import (
    BudgetRequest,
    PastTurn,
    Candidate,
    Quote,
    answer_lead,
    answer_opening,
    ContextPassage,
    ContextTooSmall,
    PrefillCostModel,
    PromptShape,
    build_messages,
    canonical_order,
    format_passage,
    passage_body,
    plan_budget,
    turns_to_skip,
)
from prompt_budget.budgeter import Plan, passage_room
from prompt_budget.layout import evidence_block
from prompt_budget.focus import best_window, focus_cap
from prompt_budget.trim import sentence_ends, trim_to_tokens

from ..conversations.memory import History
from ..errors import Overloaded, QuestionTooLong
from ..index.collection_names import named
from ..index.store import Hit
from ..text.language import terms_in
from .answer import Budget, BudgetDecision
from .evidence import Evidence, Ranked
from .options import AskOptions
from .passages import exact_reuse, for_collection

HISTORY_PASSAGE_ROOM = 512  # tokens kept for passages when old turns crowd the window
KEEP_AT_MOST = 8  # passages one question asks the engine to store
# A passage whose exact KV the engine holds goes ahead of unheld ones at most this share of the best
# score more relevant (RRF scores: about 3 ranks of one ranking): near-equal, so nearly free wins.
PREFER_HELD = 0.05
# Under load a question whose prompt alone would start at most this share past its target is
# answered, late and without passages, rather than refused: a client told 429 waits its
# Retry-After and then the whole time to a first token again. Measured (8 clients, fresh server
# with an upload): with accurate waits 2 of 24 were refused for starting 0.05-0.2 s late.
LATE_GRACE = 0.2


@dataclass(frozen=True)
class LoadPlan:
    """What the engine's load adds to a request's time to first token:
    what the engine reports it meets (:class:`~engine.scheduler.Ahead`:
    the wait before its prompt is evaluated, the slowdown and the decode
    step of the others beside it, the cells they hold), and the requests
    this process knows are on their way to the engine after it."""

    wait_s: float = 0.0
    slowdown: float = 1.0
    behind: int = 0  # requests that arrived before this plan and are planned after it
    step_s: float = 0.0
    cells: int = 0
    coming: float = 0.0  # requests expected to arrive before its first token (see ``arrivals``)

    @classmethod
    def of(cls, ahead: Ahead, behind: int = 0, coming: float = 0.0) -> "LoadPlan":
        """The plan for what the engine reported, ``behind`` and ``coming``."""
        return cls(ahead.wait_s, ahead.slowdown, max(behind, 0), ahead.step_s, ahead.cells, max(coming, 0.0))

    def others(self, n_cached: int) -> int:
        """Cells other sequences hold beside a prompt with ``n_cached`` of its tokens held."""
        return Ahead(cells=self.cells).others(n_cached)


class _Frame(NamedTuple):
    """What a prompt's passages are chosen within (see ``PromptPlanner._frame``)."""

    cached: int
    safety: float
    planned_at: float
    idle: BudgetRequest
    request: BudgetRequest
    busy: bool
    loaded: Callable[[int, int], float]


@dataclass(frozen=True)
class PlannedPrompt:
    """The prompt to send and what went into it.

    ``user`` is the last user message as it is kept in the history;
    ``turns_shown`` the recent turns replayed; ``planned_at_s`` the seconds
    since the question was received when the budget was planned (the
    budget counts them as spent).
    """

    text: str
    hits: tuple[Hit, ...]
    budget: Budget
    user: str
    turns_shown: int
    planned_at_s: float
    passages: tuple[str, ...] = ()  # the passages as shown, in prompt order (for an engine that splices)
    to_keep: tuple[str, ...] = ()  # passages worth storing: chosen and not stored, or left out for time
    evidence: tuple[Evidence, ...] = ()  # the sentences of its passages that best answer the question
    lead: str = ""  # the start of the answer written into the prompt (the evidence quoted), if any


def lead_for(place: str, quotes: Sequence[Quote]) -> str:
    """The start of the answer written into the prompt for evidence ``place``:
    the quotes introduced for the model (``prefill``, ``both``), the quotes as
    the answer's own opening that the reader sees (``open``), else none."""
    if place in ("prefill", "both"):
        return answer_lead(quotes)
    return answer_opening(quotes) if place == "open" else ""


def load_plan(backend: Backend, cost: PrefillCostModel, deadline: float | None, behind: int = 0,
              coming: float = 0.0) -> LoadPlan:
    """What the engine's current load adds for a question due at ``deadline``
    with ``behind`` other requests already arrived and waiting to be planned
    after it and ``coming`` more expected before its first token: the
    engine's own report of what it meets (nothing for an engine that does
    not report one)."""
    ahead = backend.ahead(deadline, cost.prefill_s) if isinstance(backend, LoadAware) else Ahead()
    return LoadPlan.of(ahead, behind, coming)


def under_load(idle: BudgetRequest, load: LoadPlan, bare_s: float, idle_bare_s: float,
               refuse_late: bool) -> tuple[BudgetRequest, bool]:
    """The budget request ``idle`` as ``load`` changes it, and whether the
    engine is busy; ``bare_s`` and ``idle_bare_s`` are the seconds of the
    prompt without passages under this load and on an idle engine. Raises
    Overloaded when ``refuse_late`` and only the load keeps even that prompt
    from starting within ``LATE_GRACE`` of the target."""
    target = idle.target_ttft
    # Refused only for what is still ahead (the load), not for time already spent here.
    bare = load.wait_s + bare_s
    request = replace(idle, overhead_s=idle.overhead_s + load.wait_s)
    busy = load.wait_s > 0 or load.slowdown > 1 or load.behind > 0 or load.coming > 0
    if busy and (target is None or bare <= target * (1 + LATE_GRACE)):
        # Under load an answer on time (or nearly) without passages beats a later one with them
        # (one that is late anyway keeps its least context).
        request = replace(request, min_k=0)
    if busy and target is not None and (load.behind or load.coming):
        # Those who arrived before this plan, or are expected before its first token, are planned
        # after it: leave each the time of a question without passages, so a burst is answered by
        # all, not richly by its first.
        request = replace(request, target_ttft=max(target - (load.behind + load.coming) * bare_s, 1e-3))
    # Refused only when the load is why: a question that misses the target on an idle
    # engine too is answered late (retrying would not help), never "busy" (issue 27).
    if refuse_late and target is not None and bare > target * (1 + LATE_GRACE) and busy and idle_bare_s <= target:
        raise Overloaded(f"the engine is busy: even without passages the answer would start in {bare:.1f} s, "
                         f"past the {target:g} s target", bare - target)
    return request, busy


def too_long(prompt_tokens: int, max_tokens: int, n_ctx: int) -> QuestionTooLong:
    """The error for a question that cannot fit the context window at all."""
    return QuestionTooLong(
        f"the question is too long: {prompt_tokens} prompt tokens + {max_tokens} answer tokens exceed "
        f"the model's context of {n_ctx} tokens; shorten the question or lower --max-tokens"
    )


def must_fit(prompt_tokens: int, max_tokens: int, n_ctx: int) -> None:
    """Nothing when a prompt of ``prompt_tokens`` leaves ``max_tokens`` of
    a context of ``n_ctx`` to answer, by the engine's own check
    (:func:`engine.backend.check_fits`, the one every engine makes before
    it works); else QuestionTooLong, in the user's words."""
    try:
        fits_the_context(prompt_tokens, max_tokens, n_ctx)
    except ContextOverflow:
        raise too_long(prompt_tokens, max_tokens, n_ctx) from None


def check_fits(backend: Backend, question: str, max_tokens: int) -> None:
    """QuestionTooLong when ``question`` alone, with nothing else in its
    prompt, cannot fit ``backend``'s context with ``max_tokens`` to answer."""
    must_fit(len(backend.tokenize(backend.render(build_messages(question, [])))), max_tokens, backend.n_ctx)


class ShownForms:
    """The forms (whole or a focused window) in which recent prompts showed
    each chunk, by cache scope and chunk id, bounded: a chunk held by the
    engine in a window cut for another target is found again in that form,
    by prompts of the scope it is held for (a window another scope's
    question cut is never held for this one). Thread safe."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._forms: OrderedDict[tuple[str, str], ContextPassage] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, chunk_id: str, scope: str = "") -> ContextPassage | None:
        """The form ``chunk_id`` was last shown in by a prompt of cache
        ``scope``, or None (a use keeps it longer)."""
        with self._lock:
            form = self._forms.get((scope, chunk_id))
            if form is not None:
                self._forms.move_to_end((scope, chunk_id))
            return form

    def note(self, shown: Sequence[tuple[str, ContextPassage]], scope: str = "") -> None:
        """Remember these ``(chunk id, passage as shown)`` of a prompt of cache ``scope``."""
        with self._lock:
            for chunk_id, passage in shown:
                self._forms[(scope, chunk_id)] = passage
                self._forms.move_to_end((scope, chunk_id))
            while len(self._forms) > self.size:
                self._forms.popitem(last=False)


class PromptPlanner:
    """Plans prompts for ``backend``'s template, tokenizer and cache
    (``forms``: where the chunks recent prompts showed are remembered)."""

    def __init__(self, backend: Backend, forms: ShownForms | None = None) -> None:
        self.backend = backend
        self.forms = forms

    def _tokens(self, text: str) -> int:
        return len(self.backend.tokenize(text))

    def _cached(self, tokens: Sequence[int], scope: str = "") -> int:
        """Leading ``tokens`` the engine holds for a prompt of cache ``scope``."""
        backend = self.backend
        return backend.cached_prefix(tokens, **scoped(scope)) if isinstance(backend, PrefixCache) else 0

    def plan(
        self,
        question: str,
        hits: Sequence[Hit],
        options: AskOptions,
        *,
        target_ttft: float | None,
        cost: PrefillCostModel,
        elapsed: Callable[[], float],
        history: History = History(None, (), ()),
        load: LoadPlan = LoadPlan(),
        ranked: Ranked | None = None,
    ) -> PlannedPrompt:
        """The prompt for ``question`` with ``history`` and the chunks the
        budgeter chose from ``hits`` (best first); ``elapsed()`` is the
        seconds since the question was received, ``load`` what the engine's
        load adds. Raises QuestionTooLong when not even the question fits
        with ``options.max_tokens`` to answer, and Overloaded when
        ``options.refuse_late`` and not even the question alone can meet the
        target under this load. ``ranked``: the evidence units of ``hits``
        (``rag.qa.evidence``); the best of those the prompt shows are quoted
        where ``options.evidence`` says, their tokens costed."""
        max_tokens = options.max_tokens
        past = self._turns_in_view(question, history, max_tokens)
        place = options.evidence if ranked is not None else "off"
        # The default collection's prompts stay as before; a named one heads its passages and each names it.
        collection = named(options.collection)
        scope = options.cache_scope  # what the engine will find cached for it: its own scope's cells only
        render = self._renderer(question, history.summary, past, place, collection)
        frame = self._frame(render, hits, options, target_ttft, cost, elapsed, load, ranked, place, collection)
        passages, candidates, path = self._candidates(question, hits, frame.request, frame.loaded,
                                                      lambda kept: cost.splice_seconds(kept) + load.step_s,
                                                      render, frame.cached, ranked, collection, scope)
        plan, candidates, cut = self._budgeted(candidates, path, hits, frame, cost, max_tokens)
        picked = self._picked(plan, passages, self._evidence_starts(ranked, hits, passages))
        text, shown, chosen, tokens = self._fitted(picked, hits, render, max_tokens, options.passage_order, path)
        bare = len(tokens)
        evidence, quotes, text, tokens = self._quoted(ranked, hits, chosen, shown, render, place, text, tokens,
                                                      max_tokens)
        held, extra_s = self._held_after_splice(tokens, shown, chosen, plan, candidates, frame.cached, path, cost,
                                                load, collection, scope)
        seconds = frame.loaded(max(len(tokens) - held, 0), held) + extra_s
        overhead, safety = frame.request.overhead_s, frame.safety
        budget = Budget(
            target_ttft=target_ttft, predicted_ttft_s=overhead + seconds, candidates=len(hits),
            chosen=len(chosen), planned_ttft_s=overhead + safety * seconds,
            feasible=target_ttft is None or overhead + safety * seconds <= target_ttft,
            safety=safety, decisions=_decisions(plan, hits, candidates, chosen), cached_tokens=frame.cached,
            load_wait_s=load.wait_s, cut_for_load=cut, turns_left_out=len(history.turns) - len(past),
            predicted_prefill_s=seconds, behind=load.behind, coming=round(load.coming, 2),
            evidence_s=round(ranked.seconds, 4) if ranked is not None else 0.0, evidence_tokens=len(tokens) - bare)
        if self.forms is not None:
            self.forms.note([(hits[i].chunk_id, p) for i, p in zip(chosen, shown)], scope)
        user = build_messages(question, shown, evidence=quotes if place in ("last", "both") else (),
                              collection=collection)
        return PlannedPrompt(text, tuple(hits[i] for i in chosen), budget, user[-1].content, len(past),
                             frame.planned_at, tuple(passage_body(p) for p in shown),
                             self._to_keep(hits, plan, candidates, collection), tuple(evidence), lead_for(place, quotes))

    def _frame(self, render: Callable[..., str], hits: Sequence[Hit], options: AskOptions, target_ttft: float | None,
               cost: PrefillCostModel, elapsed: Callable[[], float], load: LoadPlan, ranked: Ranked | None, place: str,
               collection: str | None) -> "_Frame":
        """What the passages are chosen within: the prompt without them (a
        QuestionTooLong where even that cannot fit), its cached tokens, the
        budget request on an idle engine and as the load changes it (an
        Overloaded where ``options.refuse_late`` and only the load keeps it
        from its target), and the prefill seconds under that load."""
        backend, max_tokens = self.backend, options.max_tokens
        fixed_tokens = backend.tokenize(render([]))
        evidence_room = self._evidence_room(ranked, hits, place, len(fixed_tokens), max_tokens, collection)
        # Before any refusal for load: no wait makes it fit, so it is a 413, never a 429 (issue 27).
        must_fit(len(fixed_tokens), max_tokens, backend.n_ctx)
        cached = self._cached(fixed_tokens, options.cache_scope)
        safety = cost.safety_factor(n_cached=cached)
        planned_at = elapsed()  # the seconds spent so far, the prompt's fixed part tokenized: counted as spent
        idle = BudgetRequest(
            fixed_tokens=len(fixed_tokens) + evidence_room, n_ctx=backend.n_ctx, reserve_tokens=max_tokens,
            target_ttft=target_ttft, cached_tokens=cached, overhead_s=planned_at + cost.overhead() + options.expected_wait_s,
            safety=safety, min_k=options.min_k, max_k=options.max_k, relevance_floor=options.relevance_floor,
        )

        def loaded(n_new: int, n_cached: int) -> float:
            return load.slowdown * cost.predict(PromptShape(n_new, n_cached, load.others(n_cached)))

        new = max(len(fixed_tokens) - cached, 0)
        request, busy = under_load(idle, load, cost.overhead() + loaded(new, cached),
                                   cost.overhead() + cost.predict(PromptShape(new, cached)), options.refuse_late)
        return _Frame(cached, safety, planned_at, idle, request, busy, loaded)

    @staticmethod
    def _budgeted(candidates: Sequence[Candidate], path: Sequence[int], hits: Sequence[Hit], frame: "_Frame",
                  cost: PrefillCostModel, max_tokens: int) -> tuple[Plan, list[Candidate], int]:
        """The budget's choice among ``candidates`` (held passages first,
        along ``path``), the candidates as it took them, and how many fewer
        it chose for the load than an idle engine would have."""
        request = frame.request
        if path and hits:
            request = replace(request, prefer_stored=PREFER_HELD * abs(hits[0].score))
        try:
            plan, candidates = held_budget(candidates, path, request, frame.loaded)
            cut = 0
            if frame.busy:
                cut = max(len(plan_budget(candidates, frame.idle, cost.prefill_s).chosen) - len(plan.chosen), 0)
        except ContextTooSmall as exc:
            raise too_long(exc.fixed_tokens, max_tokens, exc.n_ctx) from None
        return plan, candidates, cut

    def _renderer(self, question: str, summary: str | None, past: Sequence, place: str, collection: str | None
                  ) -> Callable[..., str]:
        """The prompt text for a choice of passages (and evidence quotes, shown where ``place`` says)."""
        backend = self.backend

        def render(shown: Sequence[ContextPassage], quotes: Sequence[Quote] = ()) -> str:
            text = backend.render(build_messages(question, shown, summary=summary, turns=past, collection=collection,
                                                 evidence=quotes if place in ("last", "both") else ()))
            return text + (lead_for(place, quotes))

        return render

    def _held_after_splice(self, tokens: Sequence[int], shown: Sequence[ContextPassage], chosen: Sequence[int],
                           plan, candidates, cached: int, path: bool, cost: PrefillCostModel,
                           load: LoadPlan, collection: str | None = None, scope: str = "") -> tuple[int, float]:
        """Prompt tokens the engine will not evaluate (cached for cache
        ``scope``, or stored passages' KV of ``collection`` reused) and the
        seconds reusing them costs. Spliced passages are loaded, not
        evaluated: they cost their load time and count as cached."""
        if path:  # held exact passages count only where they follow on from the cache: ask for this prompt
            held, _ = self.backend.held_prefix(tokens, [passage_body(p) for p in shown],
                                               **for_collection(collection), **scoped(scope))
            held = max(held, cached)
            extra_s = cost.splice_seconds(held - cached) + load.step_s if held > cached else 0.0
        else:
            spliced = [candidates[i] for i in chosen if i not in plan.trim and candidates[i].spliced]
            held = cached + sum(c.spliced for c in spliced)
            extra_s = sum(c.splice_s for c in spliced)
        if held == cached:
            # Nothing spliced: the whole prompt may share more with one the engine holds than its part
            # before the passages did (the passages' heading: 74 tokens cached where 66 were planned).
            held = max(self._cached(tokens, scope), cached)
        return held, extra_s

    def _evidence_room(self, ranked: Ranked | None, hits: Sequence[Hit], place: str, fixed: int,
                       max_tokens: int, collection: str | None = None) -> int:
        """Prompt tokens to keep for the evidence, costed before the passages
        are chosen as if from the best units of all ``hits`` (what is quoted
        in the end comes from those chosen, and is counted again); none
        where it would not fit beside the best passage: never a refusal, nor
        an empty prompt, on its account."""
        if ranked is None or place == "off" or not hits:
            return 0
        quotes = [Quote(e.passage, e.text, e.about) for e in ranked.pick(hits, {i: i + 1 for i in range(len(hits))})]
        if not quotes:
            return 0
        quoted = evidence_block(quotes) if place in ("last", "both") else ""
        room = self._tokens(quoted + (lead_for(place, quotes)))
        first = self._block_tokens(1, as_shown(hits[0], collection))
        return room if fixed + room + first <= self.backend.n_ctx - max_tokens else 0

    def _quoted(self, ranked: Ranked | None, hits: Sequence[Hit], chosen: Sequence[int],
                shown: Sequence[ContextPassage], render, place: str, text: str, tokens: list[int],
                max_tokens: int) -> tuple[list[Evidence], list[Quote], str, list[int]]:
        """The evidence of the passages ``shown`` (``chosen`` from ``hits``),
        and the prompt with it quoted where ``place`` says: the quotes, text
        and tokens (none quoted, and ``text`` and ``tokens`` as they were,
        when it is ``off`` or the quotes would not fit the window: the
        passages keep the room)."""
        if ranked is None:
            return [], [], text, tokens
        evidence = ranked.pick(hits, {i: n for n, i in enumerate(chosen, start=1)},
                               shown={i: p.text for i, p in zip(chosen, shown)})
        quotes = [Quote(e.passage, e.text, e.about) for e in evidence]
        if place == "off" or not quotes:
            return evidence, [], text, tokens
        quoted = render(shown, quotes)
        quoted_tokens = self.backend.tokenize(quoted)
        if len(quoted_tokens) + max_tokens > self.backend.n_ctx:
            return evidence, [], text, tokens
        return evidence, quotes, quoted, quoted_tokens

    def _turns_in_view(self, question: str, history: History, max_tokens: int) -> list[PastTurn]:
        """The recent turns that fit beside the passages: turns the summary
        has not caught up with yet must still leave room for passages, so
        the oldest are left out of this prompt."""
        past = list(history.turns)
        if not past:
            return past
        backend, n_ctx = self.backend, self.backend.n_ctx
        bare = self._tokens(backend.render(build_messages(question, [], summary=history.summary)))
        room = n_ctx - max_tokens - bare - min(HISTORY_PASSAGE_ROOM, n_ctx // 4)
        return past[turns_to_skip(list(history.turn_tokens), room):]

    def _block_tokens(self, number: int, passage: ContextPassage) -> int:
        return self._tokens(format_passage(number, passage) + "\n\n")

    def _stored(self, passages: Sequence[ContextPassage], collection: str | None = None) -> list[int]:
        """The tokens of each passage (of ``collection``) the engine would splice from its store."""
        backend = self.backend
        if not passages or not isinstance(backend, PassageKV) or backend.splice_fresh is None:
            return [0] * len(passages)
        return backend.stored_passages([passage_body(p) for p in passages], **for_collection(collection))

    def _to_keep(self, hits: Sequence[Hit], plan, candidates: Sequence[Candidate], collection: str | None = None
                 ) -> tuple[str, ...]:
        """Passages to store for next time: those chosen that were not
        stored, then those left out for time, best first (whole, as retrieved)."""
        if not isinstance(self.backend, PassageKV) or self.backend.splice_fresh is None:
            return ()
        worth = [i for i in plan.chosen if not candidates[i].spliced]
        worth += [i for i, reason in plan.dropped if reason in ("ttft", "max_k") and not candidates[i].spliced]
        return tuple(passage_body(as_shown(hits[i], collection)) for i in worth[:KEEP_AT_MOST])

    def _held_path(self, variants: Sequence[Sequence[ContextPassage]], render, cached: int,
                   collection: str | None = None, scope: str = "") -> list[tuple[int, ContextPassage, int]]:
        """The passages that, first in a prompt in this order, the engine
        holds the exact KV of, following on from the ``cached`` prefix:
        each as an index, the form it is held in (one of ``variants``, e.g.
        whole or focused, each a list over the candidates) and the prompt
        tokens it adds to what is held; best first at each place; only those
        held for ``collection`` (as prompts name it) and cache ``scope``.
        Empty for an engine without exact passage reuse."""
        backend, named_kw = self.backend, for_collection(collection) | scoped(scope)
        if not variants or not variants[0] or exact_reuse(backend) is None:
            return []
        forms: dict[int, list[ContextPassage]] = {}
        for variant in variants:
            hints = backend.held_passages([passage_body(v) for v in variant], **named_kw)
            for i, (p, hinted) in enumerate(zip(variant, hints)):
                if hinted and p not in forms.setdefault(i, []):
                    forms[i].append(p)
        forms = {i: f for i, f in forms.items() if f}
        path: list[tuple[int, ContextPassage, int]] = []
        held = cached
        while forms:
            found = None
            for i, candidates in sorted(forms.items()):  # best first
                for form in candidates:
                    shown = [p for _, p, _ in path] + [form]
                    reach, inside = backend.held_prefix(backend.tokenize(render(shown)),
                                                        [passage_body(p) for p in shown], **named_kw)
                    if inside == len(shown):
                        found = (i, form, max(reach - held, 0))
                        held = max(reach, held)
                        break
                if found:
                    break
            if found is None:
                break
            path.append(found)
            del forms[found[0]]
        return path

    def _candidates(self, question: str, hits: Sequence[Hit], request: BudgetRequest,
                    cost: Callable[[int, int], float], splice_seconds: Callable[[int], float],
                    render, cached: int, ranked: Ranked | None = None, collection: str | None = None,
                    scope: str = "") -> tuple[list[ContextPassage], list[Candidate], list[int]]:
        """The passages of ``hits`` (each focused on the question when the
        room is too small for three whole ones, unless the engine holds it
        stored whole, or holds its exact KV whole or focused: then it costs
        its load, not its prefill), their budget candidates, with what the
        engine holds of each (for cache ``scope``), and the held exact path
        (see :meth:`_held_path`) in prompt order."""
        passages = [as_shown(h, collection) for h in hits]
        sizes = [self._block_tokens(n, p) for n, p in enumerate(passages, start=1)]
        cap = focus_cap(passage_room(request, cost), int(np.median(sizes))) if sizes else None
        focused = passages
        if cap is not None:
            langs = sorted({h.lang for h in hits})
            terms = set(terms_in(question, langs))
            spans = self._evidence_spans(ranked)
            focused = [self._focused(p, terms, cap, n, spans.get(n - 1), langs)
                       for n, p in enumerate(passages, start=1)]
        variants = [passages, focused] if cap is not None else [passages]
        if self.forms is not None and exact_reuse(self.backend) is not None:
            variants.append([self.forms.get(h.chunk_id, scope) or p for h, p in zip(hits, passages)])
        path = self._held_path(variants, render, cached, collection, scope)
        if path:
            held = {i: (form, extra) for i, form, extra in path}
            passages = [held[i][0] if i in held else f for i, f in enumerate(focused)]
            sizes = [self._block_tokens(n, p) for n, p in enumerate(passages, start=1)]
            stored = [min(held[i][1], size) if i in held else 0 for i, size in enumerate(sizes)]
        else:
            stored = self._stored(passages, collection)
            if cap is not None:
                passages = [p if kept else f for p, f, kept in zip(passages, focused, stored)]
                sizes = [self._block_tokens(n, p) for n, p in enumerate(passages, start=1)]
                stored = self._stored(passages, collection)
        candidates = [
            Candidate(tokens=size, score=h.score, source=h.source, start=h.char_start, end=h.char_end,
                      spliced=kept, splice_s=splice_seconds(kept) if kept else 0.0)
            for size, h, kept in zip(sizes, hits, stored)
        ]
        return passages, candidates, [i for i, _, _ in path]

    @staticmethod
    def _evidence_spans(ranked: Ranked | None) -> dict[int, tuple[int, int]]:
        """Each candidate's best evidence unit, as a span of its text."""
        spans: dict[int, tuple[int, int]] = {}
        for unit in ranked.units if ranked is not None else ():
            spans.setdefault(unit.hit, (unit.start, unit.end))
        return spans

    def _evidence_starts(self, ranked: Ranked | None, hits: Sequence[Hit],
                         passages: Sequence[ContextPassage]) -> dict[int, int]:
        """Where in each whole passage its best evidence unit's line begins
        (by candidate index): a passage cut to fit is cut from there, not
        from its head, so the sentence that answers stays in the prompt."""
        return {i: hits[i].text.rfind("\n", 0, start) + 1 for i, (start, _) in self._evidence_spans(ranked).items()
                if passages[i].text == hits[i].text}

    def _picked(self, plan, passages: Sequence[ContextPassage],
                starts: dict[int, int] | None = None) -> list[tuple[int, ContextPassage]]:
        """The chosen passages in relevance order, trimmed where the plan
        says: from the line of their best evidence where ``starts`` has it,
        else from their head."""
        picked: list[tuple[int, ContextPassage]] = []
        for i in plan.chosen:
            p = passages[i]
            if i in plan.trim:
                number = len(picked) + 1
                keep = trim_to_tokens(p.text[(starts or {}).get(i, 0):], plan.trim[i],
                                      lambda t: self._block_tokens(number, replace(p, text=t)))
                if not keep.strip():
                    continue  # not even one word fits: leave it out
                p = replace(p, text=keep)
            picked.append((i, p))
        return picked

    def _fitted(self, picked: list[tuple[int, ContextPassage]], hits: Sequence[Hit], render, max_tokens: int,
                passage_order: str = "source", first: Sequence[int] = ()):
        """The prompt text, its passages in prompt order, their indices in
        ``hits`` and its tokens (``passage_order`` as in
        :class:`AskOptions`; the held exact path ``first``, as far as it
        was picked, goes ahead of the rest). Token counts of separately tokenized
        parts can differ slightly from the whole: the real prompt is checked
        and the least relevant passages dropped until it fits."""
        n_ctx = self.backend.n_ctx
        while True:
            if passage_order == "relevance_first":
                order = list(range(len(picked)))  # picked is best first
            elif passage_order == "relevance_last":
                order = list(range(len(picked)))[::-1]
            else:
                order = canonical_order([(hits[i].source, hits[i].position) for i, _ in picked])
            order = held_first(order, [i for i, _ in picked], first)
            shown = [picked[j][1] for j in order]
            text = render(shown)
            tokens = self.backend.tokenize(text)
            n = len(tokens)
            if n + max_tokens <= n_ctx or not picked:
                break
            picked.pop()
        must_fit(n, max_tokens, n_ctx)
        return text, shown, [picked[j][0] for j in order], tokens

    def _focused(self, passage: ContextPassage, terms: set[str], cap: int, number: int,
                 evidence: tuple[int, int] | None = None, langs: Sequence[str] = ()) -> ContextPassage:
        """``passage`` cut to the run of its sentences that shares the most
        terms with the question (read in ``langs``), in at most ``cap`` prompt tokens; one that
        holds its best ``evidence`` unit (a span of its text) wins."""
        if self._block_tokens(number, passage) <= cap:
            return passage
        room = cap - self._block_tokens(number, replace(passage, text=""))
        text = passage.text
        ends = sentence_ends(text)
        starts = [0, *ends[:-1]]
        units = [text[a:b] for a, b in zip(starts, ends)]
        sizes = [self._tokens(u) for u in units]
        scores = [len(terms.intersection(terms_in(u, langs))) for u in units]
        if evidence is not None:  # outweighs every overlap count
            scores = [s + (len(terms) + 1) * (a < evidence[1] and evidence[0] < b)
                      for s, a, b in zip(scores, starts, ends)]
        start, end = best_window(scores, sizes, room)
        window = "".join(units[start:end]).strip()
        if not window:  # one sentence longer than the room: its head
            window = trim_to_tokens(text, room, self._tokens)
        return replace(passage, text=window)


def as_shown(hit: Hit, collection: str | None) -> ContextPassage:
    """``hit`` as a prompt shows it, whole: with its collection where it is a named one."""
    return ContextPassage(hit.source, hit.text, hit.page, collection)


def held_budget(candidates: list[Candidate], path: Sequence[int], request: BudgetRequest,
                cost: Callable[[int, int], float]):
    """The budget plan for ``candidates`` and the candidates it was made
    with: a passage of the held ``path`` counts as held only while every
    one before it in the path is taken whole (after a gap it is evaluated),
    so the plan is made again without that saving until it holds."""
    while True:
        plan = plan_budget(candidates, request, cost)
        gap = next((k for k, i in enumerate(path) if i not in plan.chosen or i in plan.trim), len(path))
        after = [i for i in path[gap + 1:] if candidates[i].spliced]
        if not after:
            return plan, candidates
        candidates = [replace(c, spliced=0, splice_s=0.0) if i in after else c for i, c in enumerate(candidates)]


def held_first(order: Sequence[int], picked: Sequence[int], first: Sequence[int]) -> list[int]:
    """``order`` (positions in ``picked``, a list of candidate indices) with
    the picked ones of the held path ``first`` ahead, in path order, up to
    the first of it not picked (those after it are held only behind it).

    ``held_first([0, 1, 2], [7, 5, 9], [9, 7, 4, 5]) -> [2, 0, 1]``
    """
    where = {i: j for j, i in enumerate(picked)}
    lead = []
    for i in first:
        if i not in where:
            break
        lead.append(where[i])
    return lead + [j for j in order if j not in lead]


def _decisions(plan, hits: Sequence[Hit], candidates: Sequence[Candidate], chosen: Sequence[int]) -> tuple[BudgetDecision, ...]:
    """What the budget did with every candidate, as the answer reports it."""
    return tuple(
        BudgetDecision(
            chunk_id=hits[d.index].chunk_id, source=hits[d.index].source,
            tokens=d.tokens if d.chosen else candidates[d.index].tokens, score=hits[d.index].score,
            ttft_s=d.ttft_s, chosen=d.index in chosen, spliced=d.spliced and d.index in chosen,
            # A chunk the plan chose can still fall out when the whole prompt is checked.
            reason=d.reason if d.index in chosen or not d.chosen else "context", trimmed=d.trimmed,
        )
        for d in plan.decisions
    )
