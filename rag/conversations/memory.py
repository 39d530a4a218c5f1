"""Keeping conversations going: remembering answered turns, showing them
to the prompt planner, and folding old turns into the summary in the
background.

A fold runs on one worker thread after an answer is out. It gives way to
questions: the summariser stops when a question is in
progress, and the fold is tried again after the next answer. A fold never
puts its prefill in front of a question: the new stable prefix (system
prompt, new summary, kept turns) is prefilled first, as background work,
and only then is the fold stored, so until that moment questions keep the
old layout, which is still cached.

Does not: decide what goes into a prompt (the planner does) or store rows
(``store`` does).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Literal, Sequence

from engine.backend import Backend, Message, PrefixCache, Scheduled, Timings, scoped
from engine.errors import EngineError
from prompt_budget import HistoryPolicy, PastTurn, system_message, turns_to_fold
from prompt_budget.layout import history_messages

from ..errors import RagError
from .store import Conversation, Conversations, Turn
from .summarise import Interrupted, summarise

HistoryMode = Literal["prompted", "qa"]
BACKGROUND_LOG_SIZE = 256  # entries kept: a long-running server must not grow without bound
# Prefills of a fold's new layout at most: the first, then again for the turns answered while the one
# before ran (measured: three conversations asked back to back, the first question after a fold
# prefilled the turn answered meanwhile, 380-490 tokens, and started 2.2-2.7 s after a 2 s target).
FOLD_PREFILLS = 3


def kv_key(session: str) -> str:
    """The engine's snapshot key of a conversation."""
    return f"session:{session}"


def folded_key(session: str) -> str:
    """The snapshot key of a conversation's next layout, prefilled before its fold is stored."""
    return f"session:{session}#folded"


def stable_prefix(backend: Backend, messages: Sequence[Message]) -> list[int]:
    """The tokens every prompt that continues ``messages`` with a user turn
    starts with, under ``backend``'s template."""
    from engine.tokens import common_prefix
    import numpy as np

    a = backend.tokenize(backend.render([*messages, Message("user", "a")]))
    b = backend.tokenize(backend.render([*messages, Message("user", "b")]))
    return a[: common_prefix(np.asarray(a, dtype=np.int32), np.asarray(b, dtype=np.int32))]


@dataclass(frozen=True)
class History:
    """A conversation as the prompt planner sees it: the summary, the recent
    turns as they are replayed, and the prompt tokens each of them takes."""

    summary: str | None
    turns: tuple[PastTurn, ...]
    turn_tokens: tuple[int, ...]


class ConversationMemory:
    """Remembers turns in a store (:class:`Conversations`) and folds old ones
    into the summary on a background thread.

    ``history_mode`` "prompted" replays a turn as it was prompted, passages
    included (append-only, so its KV stays cached); "qa" replays only the
    question and answer. ``index()``: the :func:`~rag.conversations.store.index_key`
    of the index the turns are answered from, recorded with each session
    (None: none recorded).
    """

    def __init__(
        self,
        store: Callable[[], Conversations],
        backend: Callable[[], Backend],
        policy: Callable[[], HistoryPolicy],
        *,
        history_mode: HistoryMode = "prompted",
        index: Callable[[], str | None] = lambda: None,
    ) -> None:
        if history_mode not in ("prompted", "qa"):
            raise RagError(f"history_mode must be 'prompted' or 'qa', not {history_mode!r}")
        self._store, self._backend, self._policy, self._index = store, backend, policy, index
        self.history_mode: HistoryMode = history_mode
        self._questions = 0  # in progress: background work gives way to them
        self._questions_lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rag-history")
        self._pending: list[Future] = []
        self._pending_lock = threading.Lock()
        self._superseded: set[str] = set()  # sessions whose folded layout's snapshot the next answer replaces
        self._turns: dict[str, list] = {}  # session -> [lock, holders]: one question of a session at a time
        self._turns_lock = threading.Lock()
        self.log: deque[dict[str, object]] = deque(maxlen=BACKGROUND_LOG_SIZE)

    @contextlib.contextmanager
    def question(self) -> Iterator[None]:
        """Mark a question as in progress, so background work gives way."""
        with self._questions_lock:
            self._questions += 1
        try:
            yield
        finally:
            with self._questions_lock:
                self._questions -= 1

    def answering(self) -> bool:
        """Whether a question is being answered now (from reading its
        history to storing its answer)."""
        with self._questions_lock:
            return self._questions > 0

    def _busy(self) -> bool:
        """Whether background work should give way now: a question is in
        progress and the engine cannot put it first by itself."""
        if isinstance(self._backend(), Scheduled):
            return False  # its scheduler runs background work only when nothing else waits
        with self._questions_lock:
            return self._questions > 0

    @contextlib.contextmanager
    def turn(self, session: str | None) -> Iterator[None]:
        """Hold ``session`` for one question, from reading its history to
        storing the answer, so a session's questions are answered one at a
        time, each seeing the ones before (no session: nothing to hold):
        against this process's other threads here, against other processes
        sharing the store by the store's own turn lock."""
        if session is None:
            yield
            return
        with self._turns_lock:
            entry = self._turns.setdefault(session, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0], self._store().turn_lock(session):
                yield
        finally:
            with self._turns_lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._turns[session]

    # -- reading -------------------------------------------------------------

    def load(self, session: str) -> Conversation:
        """The stored conversation ``session``."""
        return self._store().load(session)

    def sessions(self) -> list[dict[str, object]]:
        """The stored conversations of this memory's index (see
        :meth:`Conversations.sessions`), newest first."""
        index = self._index()
        return self._store().sessions(index=index) if index is not None else self._store().sessions()

    def turn_tokens(self, turn: Turn) -> int:
        """Prompt tokens ``turn`` takes when replayed."""
        if self.history_mode == "prompted":
            return turn.tokens
        backend = self._backend()
        return len(backend.tokenize(turn.question)) + len(backend.tokenize(turn.answer)) + 10

    def history(self, conversation: Conversation | None) -> History:
        """What the planner needs of ``conversation`` (empty for none)."""
        if conversation is None:
            return History(None, (), ())
        turns = tuple(
            PastTurn(t.prompted if self.history_mode == "prompted" else t.question, t.answer)
            for t in conversation.turns
        )
        return History(conversation.summary, turns, tuple(self.turn_tokens(t) for t in conversation.turns))

    # -- writing ---------------------------------------------------------------

    def remember(self, session: str, question: str, user: str, answer: str, sources: Sequence[dict],
                 timings: Timings, cache_scope: str = "") -> int:
        """Store an answered turn at the end of ``session`` and return its
        number; schedule a fold in the background if one is due, its
        summary and prefill run in the conversation's ``cache_scope``
        (``AskOptions.cache_scope``: the cells are its holder's alone)."""
        backend = self._backend()
        # The template adds a few tokens around each message.
        tokens = len(backend.tokenize(user)) + len(backend.tokenize(answer)) + 10
        store = self._store()
        number = store.append_next(session, question, user, answer, tokens, tuple(sources), timings.to_dict(),
                                   index=self._index())
        conversation = store.load(session)
        self._drop_superseded(session, backend)
        if turns_to_fold([self.turn_tokens(t) for t in conversation.turns], self._policy()):
            with self._pending_lock:
                self._pending = [f for f in self._pending if not f.done()]
                self._pending.append(self._worker.submit(self._fold_logged, session, cache_scope))
        return number

    def _drop_superseded(self, session: str, backend: Backend) -> None:
        # The first answer after a fold saved the session's snapshot over the folded layout, so the
        # snapshot prefilled for that layout holds nothing it does not: kept, it would stay until reset.
        with self._pending_lock:
            if session not in self._superseded:
                return
            self._superseded.discard(session)
        if isinstance(backend, PrefixCache):
            backend.forget(folded_key(session))

    def reset(self, session: str) -> None:
        """Forget ``session``: its turns, summary and KV snapshot."""
        self.wait_idle()
        self._store().reset(session)
        with self._pending_lock:
            self._superseded.discard(session)
        backend = self._backend()
        if isinstance(backend, PrefixCache):
            backend.forget(kv_key(session))
            backend.forget(folded_key(session))

    # -- background ----------------------------------------------------------

    def _fold_logged(self, session: str, scope: str = "") -> None:
        """A fold whose failure is logged (the history stays unfolded, tried
        again after the next answer), never raised from whatever waits for
        background work next (a reset of another session, close)."""
        try:
            self._fold(session, scope)
        except Exception as exc:  # noqa: BLE001 - background work: its failure is an entry of the log
            self.log.append({"session": session, "kind": "summary", "error": f"{type(exc).__name__}: {exc}"})

    def _fold(self, session: str, scope: str = "") -> None:
        """Fold the oldest turns of ``session`` into its summary: summarise
        them, prefill the layout the fold leads to, then store the fold
        between two of the session's questions."""
        store, backend, policy = self._store(), self._backend(), self._policy()
        conversation = store.load(session)
        n = turns_to_fold([self.turn_tokens(t) for t in conversation.turns], policy)
        if not n:
            return
        started = time.perf_counter()
        try:
            summary, method = summarise(backend, conversation.summary, conversation.turns[:n], policy.summary_tokens,
                                        self._busy, scope)
        except Interrupted:
            # A question came in: it goes first; the fold is retried after its answer.
            self.log.append({"session": session, "kind": "summary", "interrupted": True,
                             "seconds": time.perf_counter() - started})
            return
        seconds = time.perf_counter() - started
        tokens = len(backend.tokenize(summary))
        through = conversation.turns[n - 1].number
        folded = False
        for tries_left in reversed(range(FOLD_PREFILLS + 1)):
            # Stored between two questions of the session, never while one has read the old layout and
            # not yet stored its answer (the new layout would lack that turn), and only once the new
            # layout is held: else it is prefilled (again, for the turns answered meanwhile) first.
            with self.turn(session):
                prefix = self._folded_prefix(session, summary, through)
                if self._held(prefix, scope) or not tries_left:
                    folded = store.fold(
                        session, through=through, summary=summary,
                        expected_version=conversation.summary_version, method=method, tokens=tokens,
                        seconds=seconds,
                    )
                    if folded:
                        with self._pending_lock:
                            self._superseded.add(session)
                    break
            self._prefill_folded(session, prefix, scope)
        self.log.append({"session": session, "kind": "summary", "method": method, "turns": n,
                         "tokens": tokens, "seconds": seconds, "stored": folded})

    def _folded_prefix(self, session: str, summary: str, through: int) -> list[int] | None:
        """The stable prefix ``session`` will have once the turns up to
        ``through`` are folded into ``summary``, with the turns stored by
        now; None where none is prefilled ahead (an engine without a prefix
        cache, or a prefix of half the context or more)."""
        backend = self._backend()
        if not isinstance(backend, PrefixCache):
            return None
        current = self.load(session)
        kept = self.history(replace(current, summary=summary,
                                    turns=tuple(t for t in current.turns if t.number > through)))
        prefix = stable_prefix(backend, [system_message(kept.summary), *history_messages(kept.turns)])
        return prefix if len(prefix) < backend.n_ctx // 2 else None

    def _held(self, prefix: list[int] | None, scope: str = "") -> bool:
        """Whether the engine holds ``prefix`` whole for ``scope`` (or none is to be held)."""
        return prefix is None or self._backend().cached_prefix(prefix, **scoped(scope)) >= len(prefix) - 1

    def _prefill_folded(self, session: str, prefix: list[int], scope: str = "") -> None:
        """Prefill ``prefix``, the layout a fold leads to, as background work
        behind every question, so the first question that sees the fold
        finds it cached. Questions meanwhile still see the old layout."""
        if self._busy():
            return
        try:
            t = self._backend().prefill(prefix, session=folded_key(session), **scoped(scope))
        except EngineError as exc:  # checked again; after the last try the fold is stored all the same
            self.log.append({"session": session, "kind": "prefill", "error": str(exc)})
            return
        self.log.append({"session": session, "kind": "prefill", "tokens": t.prefill_tokens,
                         "seconds": t.total_s + t.snapshot_s})

    def busy(self) -> bool:
        """Whether a fold is still running or waiting to run."""
        with self._pending_lock:
            return any(not f.done() for f in self._pending)

    def wait_idle(self) -> float:
        """Wait for background folds to finish; the seconds waited."""
        started = time.perf_counter()
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for future in pending:
            future.result()
        return time.perf_counter() - started

    def close(self) -> None:
        """Finish background work and stop the worker."""
        self.wait_idle()
        self._worker.shutdown(wait=True)
