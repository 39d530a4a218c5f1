"""A backend for a model served over HTTP by an OpenAI-compatible engine.

Serving engines (llama.cpp's llama-server, vLLM) batch many users and keep
their own prefix caches, so this backend asks the server rather than
guessing: the chat template through ``/apply-template`` (llama-server) or the
chat form of ``/tokenize`` (vLLM); token counts through the server's
``/tokenize``; prefill, cache and decode figures from the response, as
llama-server's ``timings`` (``prompt_n``, ``prompt_ms``, ``cache_n``,
``predicted_n``, ``predicted_ms``) or, failing that, OpenAI-style
``usage.prompt_tokens_details.cached_tokens`` (vLLM with
``--enable-prompt-tokens-details``) and vLLM's per-request ``metrics``
(``--enable-per-request-metrics``). Where a server reports no prefill time,
the time to the first streamed token stands in for it, so the budgeter still
learns from every answer.

Prompts are sent as token ids to ``/v1/completions``, so what the budgeter
counted is exactly what the server evaluates. The server's cache is its own:
:meth:`RemoteBackend.cached_prefix` predicts it from the prompts this client
sent last (one per server slot), which is what llama-server keeps.

Behind vLLM's router (``router``) the address is several workers, and each
response's figures are those of the worker that answered; no response says
which one (vllm-router 0.1.17 adds no header naming it, and llama-server's
body names the model, not the worker), so what the budget learns is the
pool's as a whole. The prompts remembered are then one per slot of every
worker the router lists (``/list_workers``), since ``cache_aware`` sends a
prompt back to the worker that holds its prefix.

A prompt's cache scope (``engine.backend``) goes to vLLM as its
per-request ``cache_salt``: vLLM mixes the salt into the hash of a prompt's
first KV block, so a prompt reuses only blocks that prompts of the same
salt computed (the system prompt too, unlike the in-process engine: each
scope computes it once). The local user's scope ("") sends none, so a
keyless set-up's requests are as before. llama-server has no such field:
its prefix cache serves any prompt from any slot, and a scope is not
carried there (the engine README says what that leaves open). The prompts
remembered for :meth:`RemoteBackend.cached_prefix` keep their scope, and
predict what each server does: vLLM reuses only a prompt's own scope's.

Does not: start or stop the server (a router this backend was given is
stopped with it), route, retry, or keep session state on it (``session``
and ``pin`` are accepted and answered by the server's prefix cache alone).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from typing import Generator, Sequence

import httpx

from ..backend import Generation, Message, Timings, check_fits
from ..errors import ContextOverflow, EngineUnreachable
from ..scheduler import Ahead, Cost
from ..settings import DEFAULT_REPEAT_PENALTY
from ..tokens import common_prefix
from .in_flight import InFlight

DEFAULT_TIMEOUT_S = 600.0
# vllm-router sends requests other than completions (/tokenize, /apply-template) to a worker
# without its retry: one that meets a dead worker answers 502 until the router's health check
# takes it out (--health-check-interval-secs 2 x --health-failure-threshold 1, see router.py).
GATEWAY_ERRORS = (502, 503)
GATEWAY_RETRY_S = 8.0


def response_timings(n: int, reported: dict, usage: dict, metrics: dict, ttft: float, total: float,
                     pieces: int) -> Timings:
    """The timings of an answer to an ``n``-token prompt from the figures its
    response carried: llama-server's ``timings`` first; else OpenAI ``usage``
    (cached tokens: vLLM with ``--enable-prompt-tokens-details``) with
    vLLM's per-request ``metrics`` (``--enable-per-request-metrics``: queue,
    first-token and generation times, ms); else the client's own clock,
    ``ttft`` and ``total`` seconds, standing in for them."""
    if "prompt_n" in reported:
        prefill = min(int(reported["prompt_n"]), n)
        cached = int(reported.get("cache_n", n - prefill))
        if cached + prefill != n:  # counts that disagree: what it evaluated wins
            cached = n - prefill
        return Timings(
            prompt_tokens=n, cached_tokens=cached, prefill_tokens=prefill, ttft_s=ttft,
            prefill_s=float(reported.get("prompt_ms", 0.0)) / 1000.0,
            decode_tokens=int(reported.get("predicted_n", pieces)),
            decode_s=float(reported.get("predicted_ms", 0.0)) / 1000.0, total_s=total,
        )
    details = usage.get("prompt_tokens_details") or {}
    cached = min(int(details.get("cached_tokens") or 0), n)
    decoded = int(usage.get("completion_tokens") or pieces)
    if metrics.get("time_to_first_token_ms") is not None:
        # vLLM's own clock: the first token's time from scheduling (the prefill), the queue before it.
        return Timings(
            prompt_tokens=n, cached_tokens=cached, prefill_tokens=n - cached, ttft_s=ttft,
            prefill_s=float(metrics["time_to_first_token_ms"]) / 1000.0, decode_tokens=decoded,
            decode_s=float(metrics.get("generation_time_ms") or 0.0) / 1000.0, total_s=total,
            queue_s=float(metrics.get("queue_time_ms") or 0.0) / 1000.0,
        )
    # No engine counters: the first token's wait is the prefill, the rest decode.
    return Timings(
        prompt_tokens=n, cached_tokens=cached, prefill_tokens=n - cached, ttft_s=ttft,
        prefill_s=ttft, decode_tokens=decoded, decode_s=max(total - ttft, 0.0), total_s=total,
    )


class RemoteBackend:
    """A :class:`~engine.backend.Backend` for an OpenAI-compatible server at ``base_url``."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        n_ctx: int | None = None,
        repeat_penalty: float = DEFAULT_REPEAT_PENALTY,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        owned=None,
    ) -> None:
        # A process serving base_url that this backend stops at close (a router it was started for).
        self._owned = owned
        self.workers: list[str] = []  # behind a router, its workers (set below)
        # The root of the server: "http://host:8080" and ".../v1" both work.
        root = base_url.rstrip("/")
        self.base_url = root[: -len("/v1")] if root.endswith("/v1") else root
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport)
        self.repeat_penalty = repeat_penalty
        self._props = self._optional_get("/props") or {}
        self.kind = "llama-server" if "default_generation_settings" in self._props else "openai"
        models = (self._optional_get("/v1/models") or {}).get("data") or []
        if model is None:
            if not models:
                raise EngineUnreachable(f"{self.base_url} lists no model at /v1/models; name one with --engine-model")
            model = str(models[0].get("id"))
        self.model = model
        self._n_ctx = n_ctx or self._server_context(models)
        if not self._n_ctx:
            raise EngineUnreachable(
                f"{self.base_url} does not say its context size; give it as Pipeline(n_ctx=...) or RemoteBackend(n_ctx=...)"
            )
        # Behind a router: its workers (vllm-router's /list_workers; a plain server has none).
        self.workers = [str(u) for u in (self._optional_get("/list_workers") or {}).get("urls") or []]
        # The prompts this client sent last, one per slot of each worker, each with the cache scope
        # it was sent for: what the prefix caches hold, as far as this client can know.
        self._recent: deque[tuple[list[int], str]] = deque(maxlen=self.parallel)
        self.in_flight = InFlight(self.parallel)  # what a new request meets there, as far as this client knows
        self._lock = threading.Lock()

    # -- talking to the server ---------------------------------------------

    def _request(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        """The answer to an idempotent request (a template, tokens): behind a
        router, one that met a dead worker (502/503) is asked again for up
        to :data:`GATEWAY_RETRY_S`, until the router has taken it out."""
        waited, pause = 0.0, 0.1
        while True:
            try:
                response = self._http.request(method, path, json=body)
            except httpx.HTTPError as exc:
                raise EngineUnreachable(f"{self.base_url}{path}: the engine server did not answer ({exc})") from None
            if response.status_code in GATEWAY_ERRORS and self.workers and waited < GATEWAY_RETRY_S:
                time.sleep(pause)
                waited, pause = waited + pause, min(pause * 2, 1.0)
                continue
            if response.status_code >= 400:
                raise EngineUnreachable(
                    f"{self.base_url}{path}: the engine server answered {response.status_code}: {response.text[:300]}"
                )
            return response

    def _post(self, path: str, body: dict) -> dict:
        response = self._request("POST", path, body)
        try:
            return response.json()
        except ValueError:
            raise EngineUnreachable(f"{self.base_url}{path}: the engine server answered something that is not JSON") from None

    def _optional_get(self, path: str) -> dict | None:
        """The JSON at ``path``, or None where the server has no such endpoint."""
        try:
            response = self._http.get(path)
        except httpx.HTTPError as exc:
            raise EngineUnreachable(f"{self.base_url}: the engine server did not answer ({exc})") from None
        if response.status_code >= 400:
            return None
        try:
            return response.json()
        except ValueError:
            return None

    def _server_context(self, models: list[dict]) -> int:
        settings = self._props.get("default_generation_settings") or {}
        if settings.get("n_ctx"):
            return int(settings["n_ctx"])
        for entry in models:
            if entry.get("id") == self.model and entry.get("max_model_len"):
                return int(entry["max_model_len"])  # vLLM
        return 0

    @property
    def parallel(self) -> int:
        """Requests the address serves at once: the server's slots (llama-server's
        ``total_slots``), times the workers behind a router (all alike: the
        router's workers serve the same model); 1 where the server does not say."""
        return int(self._props.get("total_slots") or 1) * max(len(self.workers), 1)

    def ahead(self, deadline: float | None, cost: Cost) -> Ahead:
        """What a request sent now meets: the wait for a free slot behind
        the requests this client has in flight there (see ``in_flight``);
        ``deadline`` and ``cost`` change nothing (the server orders its
        requests by arrival)."""
        return self.in_flight.ahead()

    def router_facts(self) -> dict[str, object]:
        """``{"router": "vllm-router", "workers": [...]}`` behind a router, else ``{}``."""
        return {"router": "vllm-router", "workers": list(self.workers)} if self.workers else {}

    # -- the Backend protocol ----------------------------------------------

    @property
    def name(self) -> str:
        """``remote:<model>@<url>``."""
        return f"remote:{self.model}@{self.base_url}"

    @property
    def n_ctx(self) -> int:
        """The server's context window per request, in tokens."""
        return self._n_ctx

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text for ``messages`` under the server's chat template."""
        chat = [{"role": m.role, "content": m.content} for m in messages]
        if self.kind == "llama-server":
            return str(self._post("/apply-template", {"messages": chat})["prompt"])
        # vLLM: its /tokenize applies the template to messages; decode it back.
        tokens = self._post("/tokenize", {"model": self.model, "messages": chat, "add_generation_prompt": True})["tokens"]
        return str(self._post("/detokenize", {"model": self.model, "tokens": tokens})["prompt"])

    def tokenize(self, text: str) -> list[int]:
        """The server model's tokens for ``text``: special tokens parsed, no BOS added."""
        if self.kind == "llama-server":
            found = self._post("/tokenize", {"content": text, "add_special": False, "parse_special": True})
        else:
            found = self._post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})
        return [int(t["id"]) if isinstance(t, dict) else int(t) for t in found["tokens"]]

    @property
    def scopes_apart(self) -> bool:
        """Whether the server keeps cache scopes apart (vLLM's ``cache_salt``); llama-server does not."""
        return self.kind != "llama-server"

    def cached_prefix(self, tokens: Sequence[int], cache_scope: str = "") -> int:
        """Leading ``tokens``, a prompt of ``cache_scope``, the server should
        find in its prefix cache: the longest prefix shared with a prompt
        this client sent recently (of the same scope, where the server keeps
        scopes apart; the last token is always evaluated again)."""
        import numpy as np

        if not tokens:
            return 0
        want = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            best = max((common_prefix(np.asarray(p, dtype=np.int64), want) for p, scope in self._recent
                        if scope == cache_scope or not self.scopes_apart), default=0)
        return min(best, len(tokens) - 1)

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        session: str | None = None,
        deadline: float | None = None,
        background: bool = False,
        stop: Sequence[str] = (),
        cache_scope: str = "",
    ) -> Generation:
        """The server's completion of ``prompt``, streamed; its timings are
        the server's own figures where it reports them. The server ends it at
        any of ``stop`` (OpenAI's ``stop``; the server withholds that text).
        ``cache_scope`` goes to vLLM as the request's ``cache_salt`` (none
        for ""); llama-server cannot take it (see the module).

        Raises ContextOverflow before sending if the prompt plus
        ``max_tokens`` exceed the server's context window, and
        EngineUnreachable while streaming if the server fails.
        """
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        check_fits(len(tokens), max_tokens, self.n_ctx)
        return Generation(self._stream(tokens, max_tokens, temperature, tuple(s for s in stop if s), cache_scope),
                          engine=self.name)

    def _body(self, tokens: list[int], max_tokens: int, temperature: float, stop: tuple[str, ...] = (),
              cache_scope: str = "") -> dict:
        body: dict[str, object] = {
            "model": self.model,
            "prompt": tokens,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if stop:  # the server stops itself: no token decoded after it, and its timings say so
            body["stop"] = list(stop)
        if temperature <= 0:
            body["top_k"] = 1
        if self.kind == "llama-server":
            body |= {"cache_prompt": True, "repeat_penalty": self.repeat_penalty}
        else:
            body["repetition_penalty"] = self.repeat_penalty
            if cache_scope:  # vLLM reuses only blocks computed under the same salt (none: as before scopes)
                body["cache_salt"] = cache_scope
        return body

    def _stream(self, tokens: list[int], max_tokens: int, temperature: float,
                stop: tuple[str, ...] = (), cache_scope: str = "") -> Generator[str, None, Timings]:
        with self.in_flight.holding() as ahead:
            timings = yield from self._streamed(tokens, max_tokens, temperature, stop, cache_scope)
            if timings.prefill_s < timings.ttft_s:  # the server's own clock: the rest is the wait for it
                self.in_flight.learn_wait(ahead, timings.ttft_s - timings.prefill_s)
            return timings

    def _streamed(self, tokens: list[int], max_tokens: int, temperature: float,
                  stop: tuple[str, ...], cache_scope: str) -> Generator[str, None, Timings]:
        started = time.perf_counter()
        ttft: float | None = None
        pieces = 0
        reported: dict = {}
        usage: dict = {}
        metrics: dict = {}
        try:
            body = self._body(tokens, max_tokens, temperature, stop, cache_scope)
            with self._http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise EngineUnreachable(
                        f"{self.base_url}/v1/completions: the engine server answered {response.status_code}: "
                        f"{response.text[:300]}"
                    )
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        event = json.loads(data)
                    except ValueError:
                        raise EngineUnreachable(f"{self.base_url}: the engine server sent a malformed event") from None
                    if event.get("error"):
                        raise EngineUnreachable(f"{self.base_url}: the engine server failed: {event['error']}")
                    reported = event.get("timings") or reported
                    usage = event.get("usage") or usage
                    metrics = event.get("metrics") or metrics  # vLLM's --enable-per-request-metrics
                    for choice in event.get("choices") or []:
                        text = choice.get("text") or ""
                        if text:
                            if ttft is None:
                                ttft = time.perf_counter() - started
                            pieces += 1
                            yield text
        except httpx.HTTPError as exc:
            raise EngineUnreachable(f"{self.base_url}/v1/completions: the stream broke off ({exc})") from None
        total = time.perf_counter() - started
        with self._lock:
            self._recent.append((tokens, cache_scope))
        return response_timings(len(tokens), reported, usage, metrics, ttft if ttft is not None else total, total,
                                pieces)

    def prefill(self, tokens: Sequence[int], *, session: str, pin: bool = False, cache_scope: str = "") -> Timings:
        """Have the server evaluate ``tokens`` (one answer token, discarded),
        so that its prefix cache holds them for the next prompt (of
        ``cache_scope``, where the server keeps scopes apart)."""
        tokens = [int(t) for t in tokens]
        if not tokens or len(tokens) >= self.n_ctx:
            raise ContextOverflow(f"cannot prefill {len(tokens)} tokens in a context window of {self.n_ctx}")
        _, timings = Generation(self._stream(tokens, 1, 0.0, (), cache_scope), engine=self.name).result()
        return Timings(timings.prompt_tokens, timings.cached_tokens, timings.prefill_tokens, timings.ttft_s,
                       timings.prefill_s, 0, 0.0, timings.ttft_s)

    def forget(self, session: str) -> None:
        """Nothing to drop: the server's cache is not per session."""

    def cache_stats(self) -> dict[str, object]:
        """What the client knows of the server's cache: the prompts it sent
        last (the server keeps its own figures)."""
        with self._lock:
            return {"where": "server", "recent_prompts": len(self._recent), "slots": self._recent.maxlen,
                    "recent_tokens": sum(len(p) for p, _ in self._recent)}

    def profile_key(self) -> dict[str, object]:
        """The server, its model and build, and the context: what changes its prefill rates."""
        settings = self._props.get("default_generation_settings") or {}
        return {
            "engine": f"remote:{self.kind}",
            # Behind a router its workers, not its address: a router started for one process has a port of its own.
            "url": ",".join(sorted(self.workers)) if self.workers else self.base_url,
            "model": self.model,
            "model_path": self._props.get("model_path"),
            "build": self._props.get("build_info"),
            "n_ctx": self.n_ctx,
            "slots": self._props.get("total_slots") or settings.get("n_slots"),
        }

    def describe(self) -> dict[str, object]:
        """Engine facts for ``rag doctor``, as far as the server tells them
        (behind a router: the router, its workers, and the facts of the one
        that answered ``/props``)."""
        return {
            "engine": f"remote ({self.kind})",
            **self.router_facts(),
            "url": self.base_url,
            "model": self.model,
            "build": self._props.get("build_info") or "unknown",
            "device": "server",
            "n_gpu_layers": "server's",
            "model_path": self._props.get("model_path") or self.model,
            "model_bytes": None,
            "n_ctx": self.n_ctx,
            "n_threads": "server's",
            "n_batch": "server's",
            "slots": self._props.get("total_slots"),
        }

    def close(self) -> None:
        """Close the HTTP connection pool, and stop the router this backend started."""
        self._http.close()
        if self._owned is not None:
            self._owned.stop()
            self._owned = None
