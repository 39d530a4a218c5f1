"""From a question's candidates to a request running on the engine: the
prompt is planned with the engine's cost model and the load it will meet,
then submitted. Plans are made and submitted one at a time, so each sees the
load of those before it and a burst is not all planned for an idle engine;
questions still being retrieved count as work ahead, and one that arrived a
moment earlier but is planned later does not go ahead of those planned
before it.

Does not: retrieve, store turns or stream the answer (``pipeline``).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

from engine.backend import Backend, Generation, scoped

from ..conversations import Conversation, ConversationMemory, kv_key
from ..index.collection_names import named
from ..index.store import Hit
from .engine_setup import EngineSetup
from .options import AskOptions
from .passages import for_collection, splicing, takes_passages
from .arrivals import Arrival, Arrivals
from .evidence import Ranked
from .planner import ShownForms, PlannedPrompt, PromptPlanner, load_plan


# Deadlines this close are a question of which retrieval finished first, not of urgency.
ORDER_SLACK_S = 0.25


def deadline_of(received: float, target: float | None) -> float | None:
    """When the first token is due: ``target`` seconds after ``received`` (None: no target)."""
    return None if target is None else received + target


class Dispatcher:
    """Plans and submits each question's prompt, for the engine of ``engine_setup``."""

    def __init__(self, engine_setup: EngineSetup, memory: ConversationMemory, backend: Callable[[], Backend]) -> None:
        self.engine_setup, self.memory, self._backend = engine_setup, memory, backend
        self._planning = threading.Lock()
        self._last_deadline: float | None = None  # of the prompt submitted last (guarded by _planning)
        self._arrivals = Arrivals()  # questions received and not yet submitted or answered
        self._forms = ShownForms()  # how recent prompts showed each chunk (exact passage reuse finds them)

    def arrived(self) -> Arrival:
        """Count a question from its arrival until its prompt is submitted
        (``arrival.planned()``, which :meth:`submit` says) and until it ends (``with arrival:``): the
        plans made meanwhile reserve room for it, and for those expected to
        come at the rate of questions asked while others were answered."""
        return self._arrivals.arrive()

    def plan(self, question: str, hits: list[Hit], options: AskOptions, target: float | None, received: float,
             conversation: Conversation | None, deadline: float | None = None,
             ranked: Ranked | None = None) -> PlannedPrompt:
        """The prompt, planned for the engine (its prompt served in the order
        of ``deadline``, by default ``target`` seconds after ``received``),
        with the evidence ``ranked`` quoted where ``options`` say."""
        deadline = deadline if deadline is not None else deadline_of(received, target)
        history = self.memory.history(conversation)
        engine = self._backend()
        cost = self.engine_setup.costs.model
        behind = max(self._arrivals.unplanned - 1, 0)  # other questions on their way, less this one
        now = time.perf_counter()
        coming = self._arrivals.expected(deadline - now, now) if deadline is not None else 0.0
        return PromptPlanner(engine, self._forms).plan(
            question, hits, options, target_ttft=target, cost=cost, elapsed=lambda: time.perf_counter() - received,
            history=history, load=load_plan(engine, cost, deadline, behind, coming), ranked=ranked,
        )

    def submit(self, question: str, hits: list[Hit], options: AskOptions, target: float | None, received: float,
               conversation: Conversation | None, ranked: Ranked | None = None, arrival: Arrival | None = None,
               stop: Sequence[str] = ()) -> tuple[PlannedPrompt, Generation]:
        """Plan the prompt and submit it, before the next question is planned;
        ``arrival`` (the question's, from :meth:`arrived`) stops counting as
        on its way as it is submitted; the engine ends the answer at any of
        ``stop``."""
        with self._planning:
            deadline = self._in_plan_order(deadline_of(received, target))
            prompt = self.plan(question, hits, options, target, received, conversation, deadline, ranked)
            generation = self._generate(self._backend(), prompt, options, deadline, options.session, stop)
            if arrival is not None:
                # Before the lock is free. The in-process engine puts the request in its load as
                # generate returns, so the next plan counts this question once (in the load), not
                # twice. A RemoteBackend reports no load, and plans for it count no load at all.
                arrival.planned()
            return prompt, generation

    def _in_plan_order(self, deadline: float | None) -> float | None:
        """The deadline a prompt is served by: its own, or the latest one
        submitted before it when that is later by less than ``ORDER_SLACK_S``.
        Each plan counts the prompts submitted before it as ahead; one
        received a moment earlier but planned later (its retrieval took
        longer) would otherwise go first and make the earlier plan late."""
        if deadline is None:
            return None
        last = self._last_deadline
        if last is not None and 0 < last - deadline < ORDER_SLACK_S:
            deadline = last
        self._last_deadline = deadline if last is None else max(last, deadline)
        return deadline

    @staticmethod
    def _generate(backend: Backend, prompt: PlannedPrompt, options: AskOptions, deadline: float | None,
                  session: str | None, stop: Sequence[str] = ()) -> Generation:
        """Submit ``prompt`` to ``backend`` under the cache scope of
        ``options`` (it starts from no other scope's cells beyond the system
        prompt, and what it leaves is that scope's); an engine that keeps
        passages splices those it holds for the prompt's collection and is
        asked to keep the rest for next time, under that collection."""
        engine = splicing(backend)
        collection = for_collection(named(options.collection))  # what the engine keys the passages by
        asked = dict(max_tokens=options.max_tokens, deadline=deadline, stop=tuple(stop),
                     session=kv_key(session) if session is not None else None, **scoped(options.cache_scope))
        passage_engine = takes_passages(backend)
        if passage_engine is not None:
            generation = passage_engine.generate(prompt.text, passages=tuple(prompt.passages), **collection, **asked)
        else:
            generation = backend.generate(prompt.text, **asked)
        if engine is not None and prompt.to_keep:
            engine.keep_passages(tuple(prompt.to_keep), **collection)
        return generation
