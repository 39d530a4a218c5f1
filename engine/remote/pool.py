"""A pool of engines behind one Backend: several OpenAI-compatible servers
(llama-server or vLLM replicas, usually each on its own GPU host) serving
the same model, each request routed to one of them.

* **Routing.** :meth:`EnginePool.route` picks an engine for a prompt by the
  pool's policy (``engine.remote.routing``): by default the one holding the
  longest prefix of the prompt in its cache, unless its predicted first
  token misses the deadline and another's does not. The caller plans the
  prompt for that engine (its own cost profile, its own load) and then
  generates through the :class:`Route`, so the budget and the engine agree.
* **Load.** Each :class:`Member` counts what it is serving (prompt tokens
  still to evaluate, answer tokens still to come) and reports it as an
  ``engine.scheduler.Load``, the same account the in-process engine gives.
* **Health and failover.** A thread checks every engine's ``/health``; an
  engine that fails a check or a request is taken out of the pool and
  rejoins when a check passes again (its backend opened anew: a restarted
  server holds nothing cached). A request whose engine fails before the
  first piece of its answer is retried on another engine; its prompt is
  evaluated there again and its timings say so (``failovers``, and the
  cached tokens the new engine reports). An engine that fails once the
  answer has started ends that request with an EngineUnreachable naming it:
  text already shown cannot be taken back. An engine that stops answering
  fails its requests after ``stall_timeout_s`` of silence.

Does not: start or stop engines, keep cost profiles (the caller passes
predictions in: ``rag.qa.engines``), or mix models: every engine must serve
the same model with the same tokenizer, and a pool refuses one that does not.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Callable, Generator, Sequence

import httpx

from ..backend import Backend, Generation, Message, Timings, check_fits
from ..errors import EngineSettingsError, EngineUnreachable
from .routing import Decision, EngineView, check_policy, choose
from ..scheduler import Load, Work

BUSY_BUDGET = 512  # prompt tokens a server evaluates in a step while others decode (llama-server's -b)
DEFAULT_PREFILL_S_PER_TOKEN = 0.005  # until an engine has answered once
DEFAULT_DECODE_STEP_S = 0.02
SESSIONS_REMEMBERED = 10_000  # sessions whose last engine the pool remembers

Estimate = Callable[["Member", int, int], float]  # (engine, cached tokens, prompt tokens) -> seconds to first token


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:240]


class Member:
    """One engine of a pool: its URL, its backend once reachable, whether it
    is healthy, and the requests in flight on it. A Backend itself (with a
    prefix cache and a load), so a prompt is planned for it as for any
    engine; its template and tokenizer are the pool's, so planning goes on
    when this engine dies in the middle of it."""

    def __init__(self, pool: "EnginePool", key: int, url: str) -> None:
        root = url.rstrip("/")
        self.url = root[: -len("/v1")] if root.endswith("/v1") else root
        self.key = key
        self.backend: Backend | None = None
        self.healthy = False
        self.reason = "not opened yet"
        self.served = 0
        self.failures = 0
        self.last_used = 0
        self.slots = 1
        self.prefill_s_per_token = DEFAULT_PREFILL_S_PER_TOKEN
        self.decode_step_s = DEFAULT_DECODE_STEP_S
        self._pool = pool
        self._work: dict[int, Work] = {}
        self._lock = threading.Lock()

    def _require(self) -> Backend:
        backend = self.backend
        if backend is None:
            raise EngineUnreachable(f"{self.url}: this engine is out of the pool ({self.reason})")
        return backend

    # -- the Backend protocol ----------------------------------------------

    @property
    def name(self) -> str:
        """The engine's own name (``remote:<model>@<url>``)."""
        return self.backend.name if self.backend is not None else f"remote@{self.url}"

    @property
    def n_ctx(self) -> int:
        """The pool's context window (the smallest of its engines')."""
        return self._pool.n_ctx

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt under the model's template (asked of any healthy engine, this one first)."""
        return self._pool.ask_any(lambda b: b.render(messages), prefer=self)

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens (asked of any healthy engine, this one first)."""
        return self._pool.ask_any(lambda b: b.tokenize(text), prefer=self)

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 session: str | None = None, deadline: float | None = None, background: bool = False,
                 stop: Sequence[str] = ()) -> Generation:
        """This engine's completion of ``prompt``, counted in its load while it runs."""
        backend = self._require()
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        work = Work(0, deadline if deadline is not None else math.inf, time.perf_counter(),
                    max(len(tokens) - self.cached_prefix(tokens), 1), max_tokens, background=background)
        # Counted from now, not from the first read: a request routed meanwhile sees this one's load.
        with self._lock:
            key = next(self._pool.counter)
            self._work[key] = replace(work, key=key)
            self.last_used = key
        try:
            inner = backend.generate(tokens, max_tokens=max_tokens, temperature=temperature, session=session,
                                     deadline=deadline, background=background, stop=stop)
        except BaseException:
            self._untrack(key)
            raise
        return Generation(self._tracked(inner, key), engine=backend.name, release=lambda: self._release(inner, key))

    def _release(self, inner: Generation, key: int) -> None:
        inner.close()  # closed before it was read: the engine lets it go too
        self._untrack(key)

    def _untrack(self, key: int) -> None:
        with self._lock:
            self._work.pop(key, None)

    def _tracked(self, inner: Generation, key: int) -> Generator[str, None, Timings]:
        try:
            with inner:
                for piece in inner:
                    with self._lock:
                        w = self._work.get(key)
                        if w is not None:
                            self._work[key] = replace(w, to_prefill=0, generating=True,
                                                      to_decode=max(w.to_decode - 1, 0))
                    yield piece
                timings = inner.timings
        finally:
            self._untrack(key)
        self._learn(timings)
        return timings

    def _learn(self, t: Timings) -> None:
        """Keep this engine's recent prefill and decode speeds, for routing."""
        with self._lock:
            self.served += 1
            if t.prefill_tokens >= 16 and t.prefill_s > 0:
                self.prefill_s_per_token = 0.7 * self.prefill_s_per_token + 0.3 * t.prefill_s / t.prefill_tokens
            if t.decode_tokens >= 4 and t.decode_s > 0:
                self.decode_step_s = 0.7 * self.decode_step_s + 0.3 * t.decode_s / t.decode_tokens

    def profile_key(self) -> dict[str, object]:
        """The engine's own key: its URL, model, build and context."""
        return self._require().profile_key()

    def describe(self) -> dict[str, object]:
        """The engine's facts, with its health."""
        facts = self.backend.describe() if self.backend is not None else {"url": self.url}
        return facts | {"healthy": self.healthy, "reason": None if self.healthy else self.reason,
                        "served": self.served, "failures": self.failures}

    def close(self) -> None:
        """Close the connection to the engine."""
        if self.backend is not None:
            self.backend.close()

    # -- PrefixCache and LoadAware -----------------------------------------

    def cached_prefix(self, tokens: Sequence[int]) -> int:
        """Leading ``tokens`` this engine should find cached (0 when it is out)."""
        backend = self.backend
        return backend.cached_prefix(tokens) if backend is not None and hasattr(backend, "cached_prefix") else 0

    def prefill(self, tokens: Sequence[int], *, session: str, pin: bool = False) -> Timings:
        """Have this engine evaluate ``tokens`` now, so they are cached there."""
        return self._require().prefill(tokens, session=session, pin=pin)

    def forget(self, session: str) -> None:
        """Drop what this engine keeps for ``session``."""
        if self.backend is not None and hasattr(self.backend, "forget"):
            self.backend.forget(session)

    def cache_stats(self) -> dict[str, object]:
        """What this engine's cache holds, as far as the client knows."""
        backend = self.backend
        return backend.cache_stats() if backend is not None and hasattr(backend, "cache_stats") else {}

    @property
    def in_flight(self) -> int:
        """Requests this engine serves now."""
        with self._lock:
            return len(self._work)

    def load(self) -> Load:
        """What a new request meets here: everything in flight goes before
        it (a server takes requests in arrival order, whatever the deadline),
        each decode step as long as this engine's recent ones."""
        with self._lock:
            work = sorted(self._work.values(), key=lambda w: w.arrival)
        work = [replace(w, deadline=-math.inf) for w in work]  # ahead of any new request
        active, waiting = work[: self.slots], work[self.slots:]
        steps = ((max(len(active), 1), self.decode_step_s),)
        return Load(tuple(active), tuple(waiting), self.slots, BUSY_BUDGET, BUSY_BUDGET, BUSY_BUDGET, steps)

    def nominal_first_token(self, cached: int, n: int) -> float:
        """Seconds to this engine's first token by its recent speeds alone
        (for callers without a cost profile)."""
        with self._lock:
            ahead = sum(w.to_prefill for w in self._work.values())
        return (ahead + max(n - cached, 1)) * self.prefill_s_per_token


class Route:
    """One request's engine: plan the prompt for :attr:`engine`, then
    :meth:`generate` through the route, which retries on another engine of
    the pool if this one fails before answering. Without a pool it is the
    backend itself."""

    def __init__(self, engine: Backend, *, pool: "EnginePool | None" = None, decision: Decision | None = None,
                 estimate: Estimate | None = None, cached: int = 0, session: str | None = None) -> None:
        self.engine = engine
        self.answered_by = engine  # the engine that answered in the end
        self.failovers = 0
        self.decision, self.cached, self.estimate, self.session = decision, cached, estimate, session
        self._pool = pool

    def generate(self, prompt: str | Sequence[int], **options) -> Generation:
        """The completion of ``prompt`` (options as ``Backend.generate``) on this route's engine."""
        if self._pool is None:
            return self.engine.generate(prompt, **options)
        return self._pool.generate_on(self, prompt, **options)

    def report(self) -> dict[str, object] | None:
        """Where the request went and why (None without a pool): the engine
        that answered, the one it was planned for, the policy and reason,
        the prompt tokens expected cached there, and the failovers."""
        if self._pool is None:
            return None
        return {"url": getattr(self.answered_by, "url", self.answered_by.name),
                "planned_for": getattr(self.engine, "url", self.engine.name),
                "policy": self.decision.policy if self.decision else None,
                "reason": self.decision.reason if self.decision else None,
                "expected_cached_tokens": self.cached, "failovers": self.failovers}


class EnginePool:
    """A :class:`~engine.backend.Backend` over the engines at ``urls``,
    opened with ``opener(url)`` (a ``RemoteBackend`` usually), routed by
    ``policy`` (see ``engine.remote.routing``), health-checked every
    ``health_interval_s`` seconds (0: never; requests still take failed
    engines out). Raises EngineUnreachable when no engine can be opened, and
    EngineSettingsError when engines serve different models."""

    def __init__(self, urls: Sequence[str], opener: Callable[[str], Backend], *, policy: str = "affinity",
                 health_interval_s: float = 2.0, health_timeout_s: float = 2.0) -> None:
        if not urls:
            raise EngineSettingsError("a pool needs at least one engine URL")
        self.policy = check_policy(policy)
        self.counter = itertools.count(1)  # orders requests for load accounting and tie-breaks
        self.members = [Member(self, key, url) for key, url in enumerate(urls)]
        self.events: deque[dict[str, object]] = deque(maxlen=256)
        self._opener, self._turns, self._lock = opener, itertools.count(), threading.Lock()
        self._model: object = None
        self._homes: dict[str, int] = {}  # session -> the engine that answered it last
        self._n_ctx = 0
        for member in self.members:
            self._open(member)
        opened = [m for m in self.members if m.healthy]
        if not opened:
            raise EngineUnreachable("no engine of the pool answered: " + "; ".join(f"{m.url}: {m.reason}" for m in self.members))
        self._http = httpx.Client(timeout=health_timeout_s)
        self._stop = threading.Event()
        self._watcher = None
        if health_interval_s > 0:
            self._watcher = threading.Thread(target=self._watch, args=(health_interval_s,), daemon=True,
                                             name="rag-engine-health")
            self._watcher.start()

    # -- membership and health ---------------------------------------------

    def _open(self, member: Member) -> None:
        """Open ``member``'s backend and let it (re)join, if it serves the pool's model."""
        try:
            backend = self._opener(member.url)
        except EngineUnreachable as exc:
            member.reason = _one_line(exc)
            return
        facts = backend.describe()
        model = facts.get("model_path") or facts.get("model")
        with self._lock:
            if self._model is None:
                self._model, self._n_ctx = model, backend.n_ctx
            elif model != self._model or backend.n_ctx < self._n_ctx:
                backend.close()
                member.reason = (f"serves {model} with a context of {backend.n_ctx}; the pool serves "
                                 f"{self._model} with {self._n_ctx}")
                raise EngineSettingsError(f"{member.url}: {member.reason}")
            old, member.backend = member.backend, backend
            member.slots = int(facts.get("slots") or 1)
            member.healthy, member.reason = True, ""
        if old is not None and member.in_flight == 0:
            old.close()  # with requests still on it, it is left to them (and the garbage collector)
        self.events.append({"at": time.time(), "engine": member.url, "event": "up"})

    def mark_down(self, member: Member, reason: str) -> None:
        """Take ``member`` out of the pool until a health check passes again."""
        with self._lock:
            was = member.healthy
            member.healthy, member.reason = False, reason
            member.failures += 1
        if was:
            self.events.append({"at": time.time(), "engine": member.url, "event": "down", "reason": reason})

    def check(self, member: Member) -> bool:
        """Ask ``member``'s ``/health`` now: take it out if it fails, let it
        rejoin if it passes; whether it is healthy afterwards."""
        try:
            ok = self._http.get(f"{member.url}/health").status_code == 200
            why = "its /health did not answer 200"
        except httpx.HTTPError as exc:
            ok, why = False, f"health check failed ({_one_line(exc) or type(exc).__name__})"
        if ok and not member.healthy:
            try:
                self._open(member)
            except EngineSettingsError:
                pass
        elif not ok and member.healthy:
            self.mark_down(member, why)
        return member.healthy

    def _watch(self, interval: float) -> None:
        while not self._stop.wait(interval):
            for member in self.members:
                self.check(member)

    def healthy(self, prefer: Member | None = None) -> list[Member]:
        """The engines in the pool now (``prefer`` first)."""
        found = [m for m in self.members if m.healthy and m.backend is not None]
        return sorted(found, key=lambda m: m is not prefer)

    def health(self) -> list[dict[str, object]]:
        """Each engine: URL, healthy or why not, requests in flight, served and failed."""
        return [{"url": m.url, "healthy": m.healthy, "reason": None if m.healthy else m.reason,
                 "in_flight": m.in_flight, "served": m.served, "failures": m.failures} for m in self.members]

    def _nobody(self) -> EngineUnreachable:
        return EngineUnreachable("no engine of the pool is answering: "
                                 + "; ".join(f"{m.url}: {m.reason}" for m in self.members))

    def ask_any(self, call: Callable[[Backend], object], prefer: Member | None = None):
        """``call(backend)`` on the first healthy engine that answers
        (``prefer`` first), taking out those that fail."""
        for member in self.healthy(prefer):
            try:
                return call(member._require())
            except EngineUnreachable as exc:
                self.mark_down(member, _one_line(exc))
        raise self._nobody()

    # -- routing and failover ----------------------------------------------

    def engines(self) -> list[Member]:
        """Every engine of the pool, healthy ones first."""
        return sorted(self.members, key=lambda m: not m.healthy)

    def route(self, tokens: Sequence[int], *, deadline: float | None = None, estimate: Estimate | None = None,
              session: str | None = None, exclude: Sequence[int] = ()) -> Route:
        """The route of a prompt starting with ``tokens`` and due at
        ``deadline`` (a ``time.perf_counter()`` instant), among the healthy
        engines not in ``exclude``; ``estimate`` predicts each one's first
        token (default: its recent speeds); ``session`` names the
        conversation, whose last engine wins a tie. EngineUnreachable if
        none is left."""
        candidates = [m for m in self.healthy() if m.key not in exclude]
        if not candidates:
            raise self._nobody()
        predict = estimate or (lambda m, cached, n: m.nominal_first_token(cached, n))
        home = self._homes.get(session) if session is not None else None
        views = []
        for m in candidates:
            cached = m.cached_prefix(tokens)
            views.append(EngineView(m.key, cached, predict(m, cached, len(tokens)), m.in_flight, m.last_used,
                                    home=m.key == home))
        budget = None if deadline is None else deadline - time.perf_counter()
        decision = choose(views, self.policy, budget_s=budget, turn=next(self._turns))
        chosen = self.members[decision.key]
        cached = next(v.cached for v in views if v.key == decision.key)
        return Route(chosen, pool=self, decision=decision, estimate=estimate, cached=cached, session=session)

    def _remember(self, session: str | None, member: Member) -> None:
        """``member`` answered ``session`` last (a bounded memory of sessions)."""
        if session is None:
            return
        with self._lock:
            self._homes.pop(session, None)
            self._homes[session] = member.key
            while len(self._homes) > SESSIONS_REMEMBERED:
                self._homes.pop(next(iter(self._homes)))

    def generate_on(self, route: Route, prompt: str | Sequence[int], *, max_tokens: int = 256,
                    temperature: float = 0.0, session: str | None = None, deadline: float | None = None,
                    background: bool = False, stop: Sequence[str] = ()) -> Generation:
        """The completion of ``prompt`` on ``route``'s engine, retried on
        another if it fails before the first piece of the answer."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        check_fits(len(tokens), max_tokens, self.n_ctx)
        options = dict(max_tokens=max_tokens, temperature=temperature, session=session, deadline=deadline,
                       background=background, stop=tuple(stop))
        return Generation(self._failover(route, tokens, options), engine=self.name)

    def _failover(self, route: Route, tokens: list[int], options: dict) -> Generator[str, None, Timings]:
        member, tried = route.engine, []
        while True:
            shown = False
            try:
                with member.generate(tokens, **options) as generation:
                    for piece in generation:
                        shown = True
                        yield piece
                self._remember(route.session, member)
                return replace(generation.timings, failovers=route.failovers)
            except EngineUnreachable as exc:
                self.mark_down(member, _one_line(exc))
                if shown:
                    raise EngineUnreachable(f"engine {member.url} failed in the middle of the answer and was taken "
                                            f"out of the pool ({_one_line(exc)}); ask again") from None
                tried.append(member.key)
                nxt = self.route(tokens, deadline=options["deadline"], estimate=route.estimate, session=route.session,
                                 exclude=tried)
                member = nxt.engine
                route.failovers += 1
                route.answered_by = member

    # -- the Backend protocol ----------------------------------------------

    @property
    def name(self) -> str:
        """``pool:<model>@<n> engines``."""
        return f"pool:{self._model}@{len(self.members)} engines"

    @property
    def n_ctx(self) -> int:
        """The smallest context window of the pool's engines."""
        return self._n_ctx

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt under the model's template, from any healthy engine."""
        return self.ask_any(lambda b: b.render(messages))

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens, from any healthy engine."""
        return self.ask_any(lambda b: b.tokenize(text))

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 session: str | None = None, deadline: float | None = None, background: bool = False,
                 stop: Sequence[str] = ()) -> Generation:
        """The completion of ``prompt`` on the engine the policy routes it
        to (by the engines' recent speeds), with failover."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        return self.route(tokens, deadline=deadline, session=session).generate(
            tokens, max_tokens=max_tokens, temperature=temperature, session=session, deadline=deadline,
            background=background, stop=stop)

    def cached_prefix(self, tokens: Sequence[int]) -> int:
        """The longest prefix of ``tokens`` any healthy engine holds."""
        return max((m.cached_prefix(tokens) for m in self.healthy()), default=0)

    def prefill(self, tokens: Sequence[int], *, session: str, pin: bool = False) -> Timings:
        """Evaluate ``tokens`` where the policy routes them, or with ``pin``
        (the system prompt, which every request needs) on every healthy
        engine; the timings of the first."""
        targets = self.healthy() if pin else [self.route(tokens, session=session).engine]
        timings = [m.prefill(tokens, session=session, pin=pin) for m in targets]
        if not pin:
            self._remember(session, targets[0])
        return timings[0]

    def forget(self, session: str) -> None:
        """Drop what every engine keeps for ``session``."""
        for member in self.members:
            member.forget(session)

    def cache_stats(self) -> dict[str, object]:
        """Each engine's cache, by URL."""
        return {"engines": {m.url: m.cache_stats() for m in self.members}}

    def profile_key(self) -> dict[str, object]:
        """The pool as a whole (each engine keeps its own profile under its own key)."""
        return {"engine": "pool", "model": self._model, "members": [m.url for m in self.members], "n_ctx": self.n_ctx}

    def describe(self) -> dict[str, object]:
        """The pool's facts for ``rag doctor``, and each engine's."""
        return {"engine": f"pool of {len(self.members)} ({self.policy})", "url": ", ".join(m.url for m in self.members),
                "model_path": self._model, "n_ctx": self.n_ctx, "healthy": sum(m.healthy for m in self.members),
                "engines": [m.describe() for m in self.members]}

    def close(self) -> None:
        """Stop the health checks and close every engine's connections."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self._http.close()
        for member in self.members:
            member.close()
