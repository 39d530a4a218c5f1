"""The in-process llama.cpp backend: several requests at once in one context.

Loads a GGUF model once, renders prompts with the model's own chat template,
and runs every request on one llama.cpp context with several sequences and a
unified KV cache (``loop``): the decode steps of all requests share
one batch, prompts are evaluated in chunks between them, earliest deadline
first (``scheduler``). The system prompt is computed once and shared into
every sequence without a copy. After an answer, the KV state of its session
is saved (the KV of its sequence only, about 22.5 KiB a token for
SmolLM2-135M) into a :class:`~engine.llama_cpp.snapshots.SnapshotCache`, and a later
prompt that starts with it has it restored instead of evaluated. The tokens
not evaluated are reported as ``cached_tokens``. Every request names its
cache scope (``engine.backend``): an idle sequence's prompt, a session's
snapshot and a passage's exact segment are found again only by a prompt of
the scope that left them; the system prompt by every prompt. It offloads
every layer to the GPU when llama.cpp was built with GPU support, and
otherwise runs one thread per physical core.

Does not: choose prompts or decide what a session is.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Callable, Generator, Sequence

import numpy as np

from ..backend import DEFAULT_COLLECTION, Generation, Message, Timings, check_fits
from .loop import EngineLoop
from .requests import Request, Trace
from ..errors import ContextOverflow, EngineSettingsError, ModelFileError
from .snapshots import SnapshotCache
from ..tokens import common_prefix
from .internals import chat_formatter, load_llama, model_pointer, vocab_pointer
from .selfcheck import built_features, engine_verdict, system_info
from .native import NativeContext
from .memory import ModelShape, kv_type_bytes, nvidia_devices, plan_memory
from ..models import default_model_path, model_file, model_identity, read_metadata
from .passage_kv import PassageStore, find_spans
from .passage_shelf import PassageShelf
from ..scheduler import Ahead, Cost, Load, ahead_of
from ..settings import DEFAULT_N_CTX, EngineSettings

def physical_cores() -> int:
    """Physical CPU cores this process may run on (hyper-threads not counted)."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores: set[tuple[str, str]] = set()
    try:
        physical = core = ""
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    physical = value.strip()
                elif key == "core id":
                    core = value.strip()
                    cores.add((physical, core))
    except OSError:
        pass
    return max(1, min(allowed, len(cores) or allowed))


def _build_kind(system_info: str, gpu_offload: bool) -> str:
    for marker, kind in (("CUDA", "CUDA"), ("METAL", "Metal"), ("VULKAN", "Vulkan"), ("HIP", "ROCm"), ("SYCL", "SYCL")):
        if marker in system_info.upper():
            return kind
    return "GPU" if gpu_offload else "CPU"


# What LlamaCppBackend takes beside the fields of EngineSettings (its keyword overrides).
OWN_KEYWORDS = ("model_path", "settings", "snapshots", "snapshot_dir", "check_dir", "notice", "extra_bufts")


def engine_settings(settings: EngineSettings | None, overrides: dict[str, object]) -> EngineSettings:
    """``settings`` (default: the defaults) with the keyword ``overrides``
    of a :class:`LlamaCppBackend` validated in; a TypeError that names what
    it takes for a keyword that is not one."""
    try:
        return (settings or EngineSettings()).changed(**overrides)
    except TypeError as exc:
        raise TypeError(f"LlamaCppBackend(): {exc}; besides them it takes {', '.join(OWN_KEYWORDS)}") from None


class LlamaCppBackend:
    """A :class:`~engine.backend.Backend` (with a :class:`~engine.backend.PrefixCache`
    and a load estimate) running a GGUF model in this process for up to
    ``slots`` requests at once, as its :class:`~engine.settings.EngineSettings`
    say. ``n_ctx`` is the most one request may take; ``kv_cells`` the cells
    all of them share (default: twice ``n_ctx``)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        settings: EngineSettings | None = None,
        *,
        snapshots: SnapshotCache | None = None,
        snapshot_dir: str | os.PathLike[str] | None = None,
        check_dir: str | os.PathLike[str] | None = None,
        notice: Callable[[str], None] | None = None,
        extra_bufts: bool | None = None,
        **overrides,
    ) -> None:
        """The GGUF ``model_path`` (default: the bundled model) under
        ``settings`` (default: :class:`~engine.settings.EngineSettings`'s
        defaults), with ``overrides`` (its fields: ``n_ctx=1024, slots=2``)
        on top. Session KV is saved into ``snapshots``, else a cache kept
        under ``snapshot_dir`` (None: RAM only). The verdict of llama.cpp's
        self-check is kept in ``check_dir``; ``extra_bufts`` given (the engine
        bench) is used unchecked. Raises EngineSettingsError for settings
        that cannot work, InsufficientMemory, ModelFileError."""
        import llama_cpp

        self._llama_cpp = llama_cpp
        self.settings = engine_settings(settings, overrides)
        self.model_path = model_file(model_path) if model_path else default_model_path()
        self.gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
        self._configure(self.settings)
        self.shape = ModelShape.from_metadata(read_metadata(self.model_path))
        self.memory_plan = (plan_memory(self.shape, self.model_path, self.kv_cells, kv_type=self.kv_type,
                                        offloaded_layers=self.offloaded_layers) if self.settings.check_memory else None)
        # Before this process loads anything: a build that dies on this CPU
        # (AMX under a hypervisor) may only kill a child (``selfcheck``).
        self.verdict = None if extra_bufts is not None else engine_verdict(
            self.model_path, n_gpu_layers=self.n_gpu_layers, n_threads=self.n_threads,
            folder=Path(check_dir) if check_dir else None, notice=notice)
        self.extra_bufts = extra_bufts if extra_bufts is not None else self.verdict.extra_bufts
        self._llm = self._load_model()
        self._formatter = chat_formatter(self._llm, self.model_path)
        self._open_stores(snapshots, snapshot_dir)
        self._start_loop()

    def _configure(self, s: EngineSettings) -> None:
        """The set-up ``s`` describes, resolved on this machine."""
        self.n_gpu_layers = s.gpu_layers if s.gpu_layers is not None else (-1 if self.gpu_offload else 0)
        self.n_threads = s.n_threads or physical_cores()
        self.n_batch = s.n_batch
        self._n_ctx = s.n_ctx or DEFAULT_N_CTX
        self.slots = s.slots
        self.kv_cells = max(s.kv_cells or 2 * self._n_ctx, self._n_ctx)
        kv_type_bytes(s.kv_type)  # EngineSettingsError for a type not offered
        if s.kv_type != "f16" and s.flash_attn is False:
            # llama.cpp quantises the V cache only inside flash attention.
            raise EngineSettingsError(f"a {s.kv_type} KV cache needs flash attention; drop --no-flash-attn or use f16")
        self.kv_type = s.kv_type
        # On by default: on a 2-core CPU it prefilled 1.2-1.5x faster (decode
        # 6% slower only at a 2k context; README, rag bench engine), and TTFT
        # is what the budget spends; on a GPU it saves memory and time too.
        self.flash_attn = True if s.flash_attn is None else s.flash_attn

    def _open_stores(self, snapshots: SnapshotCache | None, snapshot_dir: str | os.PathLike[str] | None) -> None:
        """The session snapshots and the passage store. On disk, one folder
        per model, build and context: a state is only meaningful to the
        set-up that wrote it."""
        s = self.settings
        identity = json.dumps(self.profile_key(), sort_keys=True)
        disk = Path(snapshot_dir) / hashlib.sha256(identity.encode()).hexdigest()[:16] if snapshot_dir else None
        self.snapshots = snapshots if snapshots is not None else \
            SnapshotCache(s.snapshot_ram_bytes, disk, s.snapshot_disk_bytes)
        self.passages = PassageStore.open(identity, disk / "passages" if disk else None, s.passage_ram_bytes,
                                          s.passage_disk_bytes, fresh=s.splice_fresh, exact=s.exact_passages)

    def _start_loop(self) -> None:
        """The llama.cpp context (``slots`` sequences, the system prompt's and
        a spare) and the engine loop that serves it."""
        llama_cpp, s = self._llama_cpp, self.settings
        self._ctx = NativeContext(model_pointer(self._llm), n_ctx=self.kv_cells, n_seq_max=self.slots + 2,
                                  n_batch=self.n_batch, n_threads=self.n_threads, flash_attn=self.flash_attn,
                                  kv_type=getattr(llama_cpp, f"GGML_TYPE_{self.kv_type.upper()}"))
        vocab = vocab_pointer(self._llm)
        self.loop = EngineLoop(
            self._ctx, slots=self.slots, kv_cells=self._ctx.n_ctx, snapshots=self.snapshots,
            detokenize=lambda t: self._llm.detokenize([t], special=False),
            is_end=lambda t: bool(llama_cpp.llama_vocab_is_eog(vocab, t)), repeat_penalty=s.repeat_penalty,
            busy_step_tokens=s.busy_step_tokens, passages=self.passages,
        )
        self.shelf = PassageShelf(self.loop, self.passages, self.tokenize)

    def _load_model(self):
        """The model, with llama-cpp-python's tokenizer and metadata; its own
        context is a token one (the engine's context is made apart)."""
        try:
            return load_llama(self.model_path, extra_bufts=self.extra_bufts, n_ctx=64, n_batch=1,
                              n_gpu_layers=self.n_gpu_layers)
        except (ValueError, RuntimeError) as exc:
            raise ModelFileError(f"{self.model_path}: llama.cpp could not load this model ({exc})") from None

    @property
    def offloaded_layers(self) -> int:
        """Transformer layers that run on the GPU."""
        if not self.gpu_offload or self.n_gpu_layers == 0:
            return 0
        n = self.shape.n_layers
        return n if self.n_gpu_layers < 0 else min(self.n_gpu_layers, n)

    @property
    def name(self) -> str:
        """``llama.cpp:<model file name>``."""
        return f"llama.cpp:{self.model_path.name}"

    @property
    def n_ctx(self) -> int:
        """The context window of one request, in tokens."""
        return self._n_ctx

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text for ``messages`` under the model's chat template,
        ending where the assistant's answer begins."""
        return self._formatter(messages=[{"role": m.role, "content": m.content} for m in messages]).prompt

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens for ``text``; the template's special tokens are
        parsed as such, and no BOS is added (templates write their own)."""
        return self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    # -- generation ----------------------------------------------------------------

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
        passages: Sequence[str] = (),
        collection: str = DEFAULT_COLLECTION,
        trace: Trace | None = None,
        cache_scope: str = "",
    ) -> Generation:
        """The greedy completion of ``prompt`` (text or tokens), streamed.
        It starts from cached cells of its ``cache_scope`` only, beyond the
        shared system prompt, and what it leaves (its idle sequence, its
        session's snapshot, its exact segments) is that scope's.
        With ``session``, the state after the answer is saved under that key.
        ``deadline`` (a ``time.perf_counter()`` instant) orders it among the
        others, earliest first; ``background`` work waits for all of them.
        The answer ends at the token whose text completes one of ``stop``
        (that text streamed, no token decoded after it). ``passages`` are
        the texts of retrieved passages inside the prompt (see
        :meth:`stored_passages`), of ``collection``: those stored for that
        collection are spliced in, and it is the collection the prompt's
        exact segments are kept for. A ``trace`` records the answer's
        tokens and logits (measurements).

        Raises ContextOverflow before any work if the prompt plus
        ``max_tokens`` exceed the context window.
        """
        if temperature > 0:
            raise EngineSettingsError("this engine decodes greedily; temperature must be 0")
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        check_fits(len(tokens), max_tokens, self.n_ctx)
        if not tokens:
            raise ContextOverflow("an empty prompt has nothing to answer")
        spans = tuple(s for s in find_spans(tokens, [self.tokenize(p) for p in passages]) if s is not None) \
            if passages and self.passages.enabled else ()
        request = Request(0, tokens, max(max_tokens, 1), session=session, background=background,
                          deadline=math.inf if deadline is None else deadline, spans=spans,
                          collection=collection, cache_scope=cache_scope, trace=trace,
                          stops=tuple(s for s in stop if s))
        # Submitted now, not when first read, so that the load the next request is planned for includes it.
        self.loop.submit(request)
        return Generation(self._run(request), engine=self.name, release=lambda: self._release(request),
                          cancel=lambda: self._release(request, wait_s=0))

    def _release(self, request: Request, wait_s: float = 30.0) -> None:
        if not request.released.is_set():
            self.loop.cancel(request, wait_s)

    def _run(self, request: Request) -> Generator[str, None, Timings]:
        try:
            while True:
                kind, value = self.loop.next_event(request)  # an error, not a wait for ever, if the loop died
                if kind == "piece":
                    yield value
                elif kind == "done":
                    return value
                else:
                    raise value
        finally:
            self._release(request)  # a consumer that stopped early frees its sequence

    def load(self) -> Load:
        """The engine as a new request would find it now."""
        return self.loop.load()

    def ahead(self, deadline: float | None, cost: Cost) -> Ahead:
        """What a request due at ``deadline`` meets behind the loop's queue
        now, its prefill costed by ``cost`` (see :func:`~engine.scheduler.ahead_of`)."""
        return ahead_of(self.loop.load(), deadline, cost)

    # -- the prefix cache ----------------------------------------------------------

    def cached_prefix(self, tokens: Sequence[int], cache_scope: str = "") -> int:
        """Leading ``tokens``, a prompt of ``cache_scope``, that will not be
        evaluated again: those of the shared system prompt or, if longer, of
        a saved snapshot or an idle sequence of that scope (the last token is
        always evaluated, for its logits)."""
        if not tokens:
            return 0
        want = np.asarray(tokens, dtype=np.int32)
        held = [common_prefix(np.asarray(self.loop.system, dtype=np.int32), want),
                self.snapshots.best(tokens, cache_scope)[1]]
        held += [common_prefix(prompt, want) for prompt in self.loop.held_prompts(cache_scope)]
        return min(max(held), len(tokens) - 1)

    def prefill(self, tokens: Sequence[int], *, session: str, pin: bool = False, cache_scope: str = "") -> Timings:
        """Evaluate ``tokens`` (reusing any cached prefix of ``cache_scope``)
        and save the state under ``session``, for prompts of that scope;
        ``pin`` makes them the system prefix every request shares, whatever
        its scope (and keeps their snapshot from eviction)."""
        tokens = list(tokens)
        if not tokens or len(tokens) >= self.n_ctx:
            raise ContextOverflow(f"cannot prefill {len(tokens)} tokens in a context window of {self.n_ctx}")
        request = self.loop.submit(Request(0, tokens, 0, session=session, pin=pin, background=not pin,
                                           cache_scope=cache_scope))
        kind, value = self.loop.next_event(request)
        if kind == "error":
            raise value
        return value

    # -- stored passages -------------------------------------------------------------

    @property
    def splice_fresh(self) -> int | None:
        """Tokens at the head of a spliced passage evaluated again (None: splicing is off)."""
        return self.passages.fresh

    @property
    def exact_passages(self) -> bool:
        """Whether prompts reuse the exact KV of passages held from earlier prompts."""
        return self.passages.exact

    def held_passages(self, texts: Sequence[str], *, collection: str = DEFAULT_COLLECTION,
                      cache_scope: str = "") -> list[bool]:
        """For each passage text (as :meth:`stored_passages` takes it):
        whether an exact segment of ``collection`` kept for ``cache_scope``
        may hold it (a hint for the planner; :meth:`held_prefix` says what a
        prompt really finds)."""
        return self.shelf.held(texts, collection, cache_scope)

    def held_prefix(self, tokens: Sequence[int], texts: Sequence[str], *,
                    collection: str = DEFAULT_COLLECTION, cache_scope: str = "") -> tuple[int, int]:
        """Leading ``tokens`` (a prompt of ``collection`` and ``cache_scope``
        holding the passages ``texts``, in order) that will not be
        evaluated: the cached prefix of that scope, then the exact segments
        held for that collection and scope that follow on from it; and how
        many of the passages lie inside that."""
        return self.shelf.held_prefix(tokens, texts, self.cached_prefix(tokens, cache_scope), collection, cache_scope)

    def stored_passages(self, texts: Sequence[str], *, collection: str = DEFAULT_COLLECTION) -> list[int]:
        """For each passage text (as a prompt shows it, less its number) of
        ``collection``: the prompt tokens that would be spliced from the
        store instead of evaluated; 0 for one not stored for that
        collection, or when splicing is off. The same for every cache scope:
        a stored passage holds nothing but its text behind the system prompt
        (``passage_kv``)."""
        return self.shelf.stored(texts, collection)

    def keep_passages(self, texts: Sequence[str], *, collection: str = DEFAULT_COLLECTION) -> int:
        """Evaluate and keep these passages of ``collection`` while the
        engine is otherwise idle (giving way to any request); how many were
        queued."""
        return self.shelf.keep(texts, collection)

    def precompute_passages(self, texts: Sequence[str], progress=None, *,
                            collection: str = DEFAULT_COLLECTION) -> dict[str, int]:
        """Evaluate and keep every passage of ``texts`` (of ``collection``)
        not stored yet, now; ``progress(done, total)`` after each. Returns
        the passages computed, those already stored, and the bytes the store
        holds."""
        return self.shelf.precompute(texts, progress, collection)

    def forget_prompts(self) -> None:
        """Drop the prompts idle sequences hold (the system prompt, saved
        snapshots and stored passages stay): the next prompt is evaluated
        as if first seen. For measurements."""
        self.loop.forget_prompts()

    def forget(self, session: str) -> None:
        """Drop the saved state of ``session`` (RAM and disk)."""
        self.snapshots.discard(session)

    def cache_stats(self) -> dict[str, object]:
        """Entries and bytes of the snapshot and passage stores, and what the engine did."""
        return self.snapshots.stats() | self.passages.stats() | self.engine_stats()

    def engine_stats(self) -> dict[str, object]:
        """Sequences and cells, steps run, the tokens decoded and prefilled in
        them, the requests holding a sequence and waiting for one after the
        last step (warming left out), and the passages waiting for or being
        warmed into the store; ``system_retries``: failed loads of a shared
        system prompt lost and not yet back (0: not lost)."""
        published = self.loop.published
        return {"slots": self.slots, "kv_cells": self.kv_cells, "system_tokens": len(self.loop.system),
                "system_retries": self.loop.system_retries,
                "requests_active": len(published.active), "requests_waiting": len(published.waiting),
                "passage_warm_queue": self.loop.splicer.warm_size() + self.loop.warming(), **self.loop.stats.counters}

    def profile_key(self) -> dict[str, object]:
        """Model file identity, llama.cpp build, GPU layers, context, threads,
        batch, and flash attention and KV type where they differ from
        llama.cpp's own defaults (off, f16)."""
        lc = self._llama_cpp
        system_info = lc.llama_print_system_info().decode("utf-8", "replace")
        return {
            "engine": "llama.cpp",
            "model": model_identity(self.model_path),
            "build": f"{lc.__version__}+{hashlib.sha256(system_info.encode()).hexdigest()[:12]}",
            "n_gpu_layers": self.n_gpu_layers,
            "n_ctx": self.n_ctx,
            "n_threads": self.n_threads,
            "n_batch": self.n_batch,
            # Named only when set away from llama.cpp's defaults, so profiles
            # measured before these options existed still match.
            **({"flash_attn": True} if self.flash_attn else {}),
            **({"kv_type": self.kv_type} if self.kv_type != "f16" else {}),
            **({"extra_bufts": False} if not self.extra_bufts else {}),
        }

    def describe(self) -> dict[str, object]:
        """Engine facts for ``rag doctor``."""
        lc = self._llama_cpp
        info = system_info()
        return {
            "engine": "llama.cpp (llama-cpp-python)",
            "llama_cpp_python": lc.__version__,
            "build": _build_kind(info, self.gpu_offload),
            "device": "GPU" if self.gpu_offload and self.n_gpu_layers != 0 else "CPU",
            "gpu_offload_supported": self.gpu_offload,
            "n_gpu_layers": self.n_gpu_layers,
            "offloaded_layers": f"{self.offloaded_layers}/{self.shape.n_layers}",
            "gpus": [{"name": d.name, "total_bytes": d.total_bytes, "free_bytes": d.free_bytes} for d in nvidia_devices()],
            "flash_attn": self.flash_attn,
            "kv_type": self.kv_type,
            "kv_cache_bytes": self.shape.kv_bytes(self.kv_cells, self.kv_type),
            "memory_plan": self.memory_plan,
            "model_path": str(self.model_path),
            "model_bytes": self.model_path.stat().st_size,
            "n_ctx": self.n_ctx,
            "n_threads": self.n_threads,
            "n_batch": self.n_batch,
            "slots": self.slots,
            "kv_cells": self.kv_cells,
            # "lost, N failed loads": no shared prefix, no passage warmed or spliced, until it loads again.
            "system_prompt": self.loop.system_state() if self.loop.alive() else "none: the engine loop ended",
            "system_info": info,
            "built_cpu_features": " ".join(built_features(info)),
            "extra_buffer_types": self.extra_bufts,
            "extra_buffer_types_why": (self.verdict.reason if self.verdict else
                                       f"set {'on' if self.extra_bufts else 'off'} by the caller, not checked"),
        }

    def close(self) -> None:
        """Stop the engine (its snapshots and stored passages written to disk
        first) and free the llama.cpp context and model."""
        if self._llm is None:
            return
        self.loop.stop()
        self.snapshots.flush()
        self.passages.cache.flush()
        self._ctx.close()
        llm, self._llm = self._llm, None
        llm.close()
