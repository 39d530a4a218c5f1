"""Planning engine memory before a model is loaded.

A model's KV cache grows with the context it is given: for every layer, every
KV head and every position it keeps a key and a value vector,

    KV bytes = layers x kv_heads x (key_dim x bytes_k + value_dim x bytes_v) x n_ctx

(the usual ``2 x layers x kv_heads x head_dim x bytes_per_value x context``
when keys and values share one size). The shape comes from the GGUF's own
metadata; free memory from the GPU driver (``nvidia-smi``) or the kernel
(``/proc/meminfo``). :func:`check_fits` says, before llama.cpp tries to
allocate, whether weights plus KV cache fit, and names a context that would.

Does not: load the model or allocate anything.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..errors import EngineSettingsError, InsufficientMemory, ModelFileError

# Bytes per stored value of each KV cache type llama.cpp offers here; q8_0
# stores blocks of 32 values as 32 int8 plus one f16 scale (34 bytes).
KV_TYPE_BYTES = {"f16": 2.0, "q8_0": 34 / 32}
KV_TYPES = tuple(KV_TYPE_BYTES)
# llama.cpp pads the context it allocates to a multiple of 256 tokens.
CONTEXT_STEP = 256
# Room left for compute buffers and the driver's own use, on top of weights
# and KV: a tenth of the need, and at least this much.
MIN_HEADROOM_BYTES = 256 << 20


@dataclass(frozen=True)
class ModelShape:
    """What sizes a model's KV cache, read from its GGUF metadata."""

    architecture: str
    n_layers: int
    n_head: int
    n_head_kv: int
    key_dim: int
    value_dim: int
    n_ctx_train: int

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> "ModelShape":
        """The shape from GGUF key/value metadata (as llama.cpp lists it);
        ModelFileError naming the missing key if the file does not say."""
        arch = metadata.get("general.architecture")
        if not arch:
            raise ModelFileError("the model's metadata has no general.architecture")

        def number(key: str, default: int | None = None) -> int:
            raw = metadata.get(f"{arch}.{key}")
            if raw is None:
                if default is None:
                    raise ModelFileError(f"the model's metadata has no {arch}.{key}")
                return default
            return int(float(raw))

        n_head = number("attention.head_count")
        head_dim = number("embedding_length") // max(n_head, 1)
        return cls(
            architecture=arch,
            n_layers=number("block_count"),
            n_head=n_head,
            n_head_kv=number("attention.head_count_kv", n_head),
            key_dim=number("attention.key_length", head_dim),
            value_dim=number("attention.value_length", head_dim),
            n_ctx_train=number("context_length", 0),
        )

    def kv_bytes_per_token(self, kv_type: str = "f16") -> float:
        """KV cache bytes for one position of context, all layers."""
        per_value = kv_type_bytes(kv_type)
        return self.n_layers * self.n_head_kv * (self.key_dim + self.value_dim) * per_value

    def kv_bytes(self, n_ctx: int, kv_type: str = "f16") -> int:
        """KV cache bytes for a context of ``n_ctx`` tokens (padded as llama.cpp pads it)."""
        return int(self.kv_bytes_per_token(kv_type) * padded_context(n_ctx))


def kv_type_bytes(kv_type: str) -> float:
    """Bytes per value of a KV cache type; EngineSettingsError for one not offered."""
    try:
        return KV_TYPE_BYTES[kv_type]
    except KeyError:
        raise EngineSettingsError(f"KV cache type {kv_type!r} is not one of {', '.join(KV_TYPES)}") from None


def padded_context(n_ctx: int) -> int:
    """``n_ctx`` rounded up to llama.cpp's allocation step."""
    return -(-max(n_ctx, 1) // CONTEXT_STEP) * CONTEXT_STEP


def headroom(need: int) -> int:
    """Bytes kept free beside ``need`` for compute buffers."""
    return max(need // 10, MIN_HEADROOM_BYTES)


def largest_context(shape: ModelShape, free_bytes: int, weight_bytes: int, kv_type: str = "f16") -> int:
    """The largest context (a multiple of the allocation step, at most the
    training context, 0 if none) whose KV cache fits in ``free_bytes``
    beside ``weight_bytes`` with headroom."""
    # need + headroom(need) <= free  <=>  need <= min(free - MIN_HEADROOM, free / 1.1)
    most = min(free_bytes - MIN_HEADROOM_BYTES, int(free_bytes / 1.1)) - weight_bytes
    if most <= 0:
        return 0
    n = int(most // shape.kv_bytes_per_token(kv_type)) // CONTEXT_STEP * CONTEXT_STEP
    return min(n, shape.n_ctx_train) if shape.n_ctx_train else n


def check_fits(
    shape: ModelShape, n_ctx: int, *, kv_type: str, weight_bytes: int, free_bytes: int, where: str
) -> int:
    """The bytes weights plus KV cache of ``n_ctx`` need in ``where``;
    InsufficientMemory, naming a context that would fit, if ``free_bytes``
    cannot hold them with headroom."""
    kv = shape.kv_bytes(n_ctx, kv_type)
    need = weight_bytes + kv
    if need + headroom(need) <= free_bytes:
        return need
    fits = largest_context(shape, free_bytes, weight_bytes, kv_type)
    hint = f"n_ctx={fits} would fit" if fits else "no context fits beside the weights; offload fewer layers"
    if kv_type == "f16" and fits:
        q8 = largest_context(shape, free_bytes, weight_bytes, "q8_0")
        if q8 > fits:
            hint += f" (n_ctx={q8} with the q8_0 KV cache)"
    raise InsufficientMemory(
        f"a context of {n_ctx} tokens needs a {kv_type} KV cache of {_gib(kv)} "
        f"({shape.n_layers} layers x {shape.n_head_kv} KV heads x {shape.key_dim}+{shape.value_dim} dims) "
        f"beside {_gib(weight_bytes)} of weights, but {where} has {_gib(free_bytes)} free; {hint}"
    )


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class Device:
    """One GPU as its driver reports it."""

    name: str
    total_bytes: int
    free_bytes: int


def nvidia_devices() -> list[Device]:
    """The NVIDIA GPUs ``nvidia-smi`` lists, with their memory; empty when
    there is no driver or it does not answer."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    devices = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            devices.append(Device(parts[0], int(parts[1]) << 20, int(parts[2]) << 20))
    return devices


def available_ram() -> int | None:
    """Bytes of RAM the kernel says are available to a new allocation, or
    None where ``/proc/meminfo`` cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        return None
    return None


def plan_memory(shape: ModelShape, model_path: Path, n_ctx: int, *, kv_type: str, offloaded_layers: int) -> dict[str, object]:
    """Where the weights of ``model_path`` and the KV cache of ``n_ctx``
    will live and how much they need; InsufficientMemory before any
    allocation if they do not fit."""
    weights = model_path.stat().st_size
    devices = nvidia_devices() if offloaded_layers else []
    kv = shape.kv_bytes(n_ctx, kv_type)
    plan: dict[str, object] = {"kv_cache_bytes": kv, "kv_bytes_per_token": shape.kv_bytes_per_token(kv_type)}
    if offloaded_layers and devices:
        # The offloaded share of the weights, and the KV of those layers (offload_kqv).
        share = offloaded_layers / shape.n_layers
        free = sum(d.free_bytes for d in devices)
        where = f"the GPU ({', '.join(d.name for d in devices)})"
        need = check_fits(shape, n_ctx, kv_type=kv_type, weight_bytes=int(weights * share), free_bytes=free, where=where)
        return plan | {"where": "gpu", "need_bytes": need, "free_bytes": free}
    free_ram = available_ram()
    if free_ram is None or offloaded_layers:
        # A GPU this process cannot ask about (Metal, ROCm): llama.cpp decides.
        return plan | {"where": "gpu" if offloaded_layers else "cpu", "need_bytes": weights + kv, "free_bytes": free_ram}
    need = check_fits(shape, n_ctx, kv_type=kv_type, weight_bytes=weights, free_bytes=free_ram, where="RAM")
    return plan | {"where": "cpu", "need_bytes": need, "free_bytes": free_ram}
