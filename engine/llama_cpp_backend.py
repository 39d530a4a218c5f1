"""The in-process llama.cpp backend, through llama-cpp-python.

Loads a GGUF model once, renders prompts with the model's own chat template,
streams tokens, and reads every request's timings from llama.cpp's own
performance counters. It offloads every layer to the GPU when llama.cpp was
built with GPU support, and otherwise runs one thread per physical core.

Prefix reuse: llama-cpp-python keeps the KV cache of the previous request
and evaluates only the tokens after the longest common prefix. Beyond the
last request, the KV state of each session is saved after its answer (the
KV of sequence 0 only, about 22.5 KiB a token for SmolLM2-135M, not
llama-cpp-python's ``save_state``, which also copies a 512 x vocabulary
logits array, 100 MB here) into a :class:`~engine.kv_snapshots.SnapshotCache`;
a prompt whose longest cached prefix is in a snapshot rather than in the live
KV cache has that snapshot restored first. The tokens not evaluated are
reported as ``cached_tokens``, read from llama.cpp's own counters.

Does not: choose prompts or decide what a session is.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Generator, Sequence

import numpy as np

from .backend import Generation, Message, Timings, check_fits
from .errors import ContextOverflow, EngineSettingsError, ModelFileError
from .kv_snapshots import Snapshot, SnapshotCache, common_prefix
from .llama_internals import LiveState
from .memory import ModelShape, kv_type_bytes, nvidia_devices, plan_memory
from .models import check_gguf, default_model_path, model_identity, read_metadata

DEFAULT_N_CTX = 4096
DEFAULT_N_BATCH = 512


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


class LlamaCppBackend:
    """A :class:`~engine.backend.Backend` running a GGUF model in this process."""

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        n_batch: int = DEFAULT_N_BATCH,
        n_gpu_layers: int | None = None,
        flash_attn: bool | None = None,
        kv_type: str = "f16",
        check_memory: bool = True,
        repeat_penalty: float = 1.1,
        snapshots: SnapshotCache | None = None,
        snapshot_dir: str | os.PathLike[str] | None = None,
        snapshot_ram_bytes: int = 512 << 20,
        snapshot_disk_bytes: int = 2 << 30,
    ) -> None:
        import llama_cpp

        self._llama_cpp = llama_cpp
        self.model_path = check_gguf(Path(model_path)) if model_path else default_model_path()
        self.gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
        self.n_gpu_layers = n_gpu_layers if n_gpu_layers is not None else (-1 if self.gpu_offload else 0)
        self.n_threads = n_threads or physical_cores()
        self.n_batch = n_batch
        kv_type_bytes(kv_type)  # EngineSettingsError for a type not offered
        if kv_type != "f16" and flash_attn is False:
            # llama.cpp quantises the V cache only inside flash attention.
            raise EngineSettingsError(f"a {kv_type} KV cache needs flash attention; drop --no-flash-attn or use f16")
        self.kv_type = kv_type
        # On by default: on a 2-core CPU it prefilled 1.2-1.5x faster (decode
        # 6% slower only at a 2k context; README, rag bench engine), and TTFT
        # is what the budget spends; on a GPU it saves memory and time too.
        self.flash_attn = True if flash_attn is None else flash_attn
        self.shape = ModelShape.from_metadata(read_metadata(self.model_path))
        self.memory_plan = (plan_memory(self.shape, self.model_path, n_ctx, kv_type=kv_type, offloaded_layers=self.offloaded_layers)
                            if check_memory else None)
        # Greedy decoding of a small model loops on itself without a penalty.
        self.repeat_penalty = repeat_penalty
        kv_ggml = getattr(llama_cpp, f"GGML_TYPE_{kv_type.upper()}")
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(self.model_path),
                n_ctx=n_ctx,
                n_batch=n_batch,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                n_gpu_layers=self.n_gpu_layers,
                flash_attn=self.flash_attn,
                type_k=kv_ggml,
                type_v=kv_ggml,
                no_perf=False,  # keep llama.cpp's timing counters: Timings come from them
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise ModelFileError(f"{self.model_path}: llama.cpp could not load this model ({exc})") from None
        template = self._llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise ModelFileError(f"{self.model_path}: the model has no chat template in its metadata")
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self._live = LiveState(self._llm)
        self._formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self._live.token_text(self._llm.token_eos()),
            bos_token=self._live.token_text(self._llm.token_bos()),
        )
        self._lock = threading.Lock()
        if snapshots is None:
            # On disk, one folder per model, build and context: a state is
            # only meaningful to the set-up that wrote it.
            key = json.dumps(self.profile_key(), sort_keys=True)
            disk = Path(snapshot_dir) / hashlib.sha256(key.encode()).hexdigest()[:16] if snapshot_dir else None
            snapshots = SnapshotCache(snapshot_ram_bytes, disk, snapshot_disk_bytes)
        self.snapshots = snapshots

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
        """The context window in tokens."""
        return int(self._llm.n_ctx())

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text for ``messages`` under the model's chat template,
        ending where the assistant's answer begins."""
        return self._formatter(messages=[{"role": m.role, "content": m.content} for m in messages]).prompt

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens for ``text``; the template's special tokens are
        parsed as such, and no BOS is added (templates write their own)."""
        return self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def cached_prefix(self, tokens: Sequence[int]) -> int:
        """Leading ``tokens`` that will not be evaluated again: those shared
        with the live KV cache or, if longer, with a saved snapshot."""
        live = self._live_prefix(tokens)
        _, saved = self.snapshots.best(tokens)
        return max(live, self._reusable(saved, len(tokens), exact=False))

    def _live_prefix(self, tokens: Sequence[int]) -> int:
        common = common_prefix(self._live.held(), np.asarray(tokens, dtype=np.int32))
        return self._reusable(common, len(tokens), exact=self._live.has_logits_for(len(tokens)))

    @staticmethod
    def _reusable(common: int, n_prompt: int, *, exact: bool) -> int:
        # Mirrors Llama.generate: a prompt held whole is sampled from at once
        # only with live logits; otherwise its last token is evaluated again.
        if n_prompt and common >= n_prompt:
            return n_prompt if exact else n_prompt - 1
        return common

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        session: str | None = None,
    ) -> Generation:
        """The completion of ``prompt`` (text or tokens), streamed. With
        ``session``, the state after the answer is saved under that key.

        Raises ContextOverflow before any work if the prompt plus
        ``max_tokens`` exceed the context window.
        """
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        check_fits(len(tokens), max_tokens, self.n_ctx)
        return Generation(self._stream(tokens, max_tokens, temperature, session), engine=self.name)

    def prefill(self, tokens: Sequence[int], *, session: str, pin: bool = False) -> Timings:
        """Evaluate ``tokens`` (reusing any cached prefix) and save the state
        under ``session``; ``pin`` keeps it from eviction."""
        tokens = list(tokens)
        if not tokens or len(tokens) >= self.n_ctx:
            raise ContextOverflow(f"cannot prefill {len(tokens)} tokens in a context window of {self.n_ctx}")
        live = self._live
        with self._lock:
            started = time.perf_counter()
            live.reset_counters()
            restored, restore_s = self._restore(tokens)
            common = common_prefix(live.held(), np.asarray(tokens, dtype=np.int32))
            if common < len(tokens):
                live.truncate(common)
                self._llm.eval(tokens[common:])
            n, seconds = live.evaluated()
            total = time.perf_counter() - started
            snapshot_s = self._save(session, pin=pin)
        return Timings(len(tokens), len(tokens) - n, n, total, seconds, 0, 0.0, total,
                       restored_tokens=restored, restore_s=restore_s, snapshot_s=snapshot_s)

    def forget(self, session: str) -> None:
        """Drop the saved state of ``session`` (RAM and disk)."""
        self.snapshots.discard(session)

    def cache_stats(self) -> dict[str, object]:
        """Entries and bytes of the snapshot store, in RAM and on disk."""
        return self.snapshots.stats()

    def _restore(self, tokens: Sequence[int]) -> tuple[int, float]:
        """Load the snapshot sharing the longest prefix with ``tokens`` when
        it shares more than the live KV cache does; returns the prefix it
        brought and the seconds it took (0, 0.0 when none was loaded)."""
        key, saved = self.snapshots.best(tokens)
        if key is None or saved <= common_prefix(self._live.held(), np.asarray(tokens, dtype=np.int32)):
            return 0, 0.0
        started = time.perf_counter()
        snap = self.snapshots.get(key)
        if snap is None or len(snap.tokens) > self.n_ctx:
            return 0, 0.0
        if not self._live.load(snap.tokens, snap.data):
            # Not a state of this model and context: forget it, prefill instead.
            self.snapshots.discard(key)
            return 0, time.perf_counter() - started
        return min(saved, len(snap.tokens)), time.perf_counter() - started

    def _save(self, session: str | None, *, pin: bool = False) -> float:
        """Save the live KV state under ``session``; returns the seconds it took."""
        if session is None:
            return 0.0
        started = time.perf_counter()
        saved = self._live.save()
        if saved is not None:
            self.snapshots.put(session, Snapshot(*saved), pin=pin)
        return time.perf_counter() - started

    def _stream(
        self, tokens: list[int], max_tokens: int, temperature: float, session: str | None
    ) -> Generator[str, None, Timings]:
        live = self._live
        started = time.perf_counter()  # before the lock: waiting behind others is part of TTFT
        with self._lock:
            queue_s = time.perf_counter() - started
            live.reset_counters()
            restored, restore_s = self._restore(tokens)
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            ttft = None
            prefill_tokens, prefill_s = 0, 0.0
            generated = 0
            sampler = {"temp": temperature, "top_k": 1} if temperature <= 0 else {"temp": temperature}
            for token in self._llm.generate(tokens, repeat_penalty=self.repeat_penalty, **sampler):
                if ttft is None:
                    ttft = time.perf_counter() - started
                    prefill_tokens, prefill_s = live.evaluated()
                if live.is_end_of_generation(token):
                    break
                generated += 1
                piece = decoder.decode(self._llm.detokenize([token], special=False))
                if piece:
                    yield piece
                if generated >= max_tokens:
                    break
            tail = decoder.decode(b"", final=True)
            if tail:
                yield tail
            total = time.perf_counter() - started
            _, all_s = live.evaluated()
            # After the answer is out: the state is saved for the session's next turn.
            snapshot_s = self._save(session)
        cached = len(tokens) - prefill_tokens
        return Timings(
            prompt_tokens=len(tokens),
            cached_tokens=cached,
            prefill_tokens=prefill_tokens,
            ttft_s=ttft if ttft is not None else total,
            prefill_s=prefill_s,
            decode_tokens=generated,
            decode_s=max(all_s - prefill_s, 0.0),
            total_s=total,
            restored_tokens=min(restored, cached),
            restore_s=restore_s,
            snapshot_s=snapshot_s,
            queue_s=queue_s,
        )

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
        }

    def describe(self) -> dict[str, object]:
        """Engine facts for ``rag doctor``."""
        lc = self._llama_cpp
        system_info = lc.llama_print_system_info().decode("utf-8", "replace").strip()
        return {
            "engine": "llama.cpp (llama-cpp-python)",
            "llama_cpp_python": lc.__version__,
            "build": _build_kind(system_info, self.gpu_offload),
            "device": "GPU" if self.gpu_offload and self.n_gpu_layers != 0 else "CPU",
            "gpu_offload_supported": self.gpu_offload,
            "n_gpu_layers": self.n_gpu_layers,
            "offloaded_layers": f"{self.offloaded_layers}/{self.shape.n_layers}",
            "gpus": [{"name": d.name, "total_bytes": d.total_bytes, "free_bytes": d.free_bytes} for d in nvidia_devices()],
            "flash_attn": self.flash_attn,
            "kv_type": self.kv_type,
            "kv_cache_bytes": self.shape.kv_bytes(self.n_ctx, self.kv_type),
            "memory_plan": self.memory_plan,
            "model_path": str(self.model_path),
            "model_bytes": self.model_path.stat().st_size,
            "n_ctx": self.n_ctx,
            "n_threads": self.n_threads,
            "n_batch": self.n_batch,
            "system_info": system_info,
        }

    def close(self) -> None:
        """Free the llama.cpp model and context."""
        with self._lock:
            llm, self._llm = self._llm, None
        if llm is not None:
            llm.close()
