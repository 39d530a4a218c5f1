#!/usr/bin/env bash
# The one-user TTFT bench (`rag bench ttft`) at 1, 2 and 4 s on two trees, alternating (before, after)
# under four conditions of the machine, in one run, and their figures side by side (issue 58):
#
#   quiet      nothing else runs
#   one-core   the bench pinned to one core (taskset)
#   neighbour  a CPU-bound process pinned to one of the bench's cores for the whole run
#   on-off     the same neighbour, started and stopped every NEIGHBOUR_PERIOD seconds (default 60)
#
#   rag/bench/neighbour_side_by_side.sh BEFORE_REF [OUT_DIR]
#
# BEFORE_REF is checked out in a git worktree; "after" is this tree. Each run starts from a copy of the
# same calibrated profile (RAG_CACHE_DIR per run, so no run learns from another) and reads one index.
# QUESTIONS (default: the Python docs' answer set) and CONDITIONS (default: all four) may be set.
# Needs the Python 3.11 documentation (apt-get install python3.11-doc) and taskset (util-linux).
# About 50 minutes on 2 cores (the index of the corpus is built on the first run, 8 more). TABLE_ONLY=1 prints the table of OUT_DIR again.
set -euo pipefail
before_ref=${1:?usage: neighbour_side_by_side.sh BEFORE_REF [OUT_DIR]}
after_root=$(cd "$(dirname "$0")/../.." && pwd)
out=${2:-$(mktemp -d /tmp/neighbour.XXXX)}
before_root="$out/before-tree"
questions=${QUESTIONS:-$after_root/rag/bench/data/python_docs_answers.jsonl}
conditions=${CONDITIONS:-quiet one-core neighbour on-off}
period=${NEIGHBOUR_PERIOD:-60}
corpus=/usr/share/doc/python3.11/html/_sources
python=${PYTHON:-$(command -v python3)}  # the venv's, active or named: both trees run on its packages
"$python" -c 'import rag' 2>/dev/null || { echo "$python cannot import rag: activate the venv, or set PYTHON" >&2; exit 1; }
mkdir -p "$out"
cores=$("$python" -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')
first=${cores%% *}
last=${cores##* }

spin() {  # a CPU-bound process pinned to the last core until killed
  exec taskset -c "$last" "$python" -c 'while True: pass'
}

neighbour_on_off() {  # the neighbour for $period seconds, then nothing for $period, over and over
  while :; do
    spin & local child=$!
    sleep "$period"; kill "$child"; wait "$child" 2>/dev/null || true
    sleep "$period"
  done
}

helper=""  # the neighbour of the run going on (a process, or the loop that starts and stops one)
stop_neighbour() {
  if [ -n "$helper" ]; then
    pkill -P "$helper" 2>/dev/null || true; kill "$helper" 2>/dev/null || true; wait "$helper" 2>/dev/null || true
  fi
  helper=""
}

run() {  # run CONDITION SIDE: one bench run under that condition
  local condition=$1 side=$2 root=$before_root pin=()
  [ "$side" = after ] && root=$after_root
  rm -rf "$out/cache.$condition.$side"; cp -r "$out/base-cache" "$out/cache.$condition.$side"
  case $condition in
    quiet) ;;
    one-core) pin=(taskset -c "$first") ;;
    neighbour) spin & helper=$! ;;
    on-off) neighbour_on_off & helper=$! ;;
    *) echo "unknown condition $condition" >&2; exit 2 ;;
  esac
  echo "== $condition ($side)" >&2
  (cd "$root" && RAG_CACHE_DIR="$out/cache.$condition.$side" HF_HUB_OFFLINE=1 "${pin[@]}" "$python" -m rag.cli \
      bench ttft --corpus "$corpus" --include 'library/*' --index "$out/index" --questions "$questions" \
      --targets 1,2,4 --json) > "$out/$condition.$side.json" 2> "$out/$condition.$side.log" || true
  stop_neighbour
}

if [ "${TABLE_ONLY:-}" != 1 ]; then
  [ -d "$corpus/library" ] || { echo "the ttft corpus $corpus is missing: apt-get install python3.11-doc" >&2; exit 1; }
  git -C "$after_root" worktree add --detach --force "$before_root" "$before_ref" >/dev/null
  trap 'stop_neighbour; git -C "$after_root" worktree remove --force "$before_root"' EXIT
  if [ ! -d "$out/base-cache/profiles" ]; then  # the index, and one calibration both sides start from
    echo "== index and calibration" >&2
    (cd "$after_root" && RAG_CACHE_DIR="$out/base-cache" HF_HUB_OFFLINE=1 "$python" -m rag.cli bench ttft \
        --corpus "$corpus" --include 'library/*' --index "$out/index" --questions "$after_root/rag/bench/data/python_docs_dev.jsonl" --targets 2 \
        --no-learn --json) > "$out/prepare.json" 2> "$out/prepare.log"
  fi
  for condition in $conditions; do
    for side in before after; do run "$condition" "$side"; done
  done
fi

"$python" - "$out" "$before_ref" $conditions <<'PY'
import json, sys
from pathlib import Path

out, ref, conditions = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]

def report(path):
    text = path.read_text() if path.exists() else ""
    return json.loads(text[text.index("{"):]) if "{" in text else None

print(f"before: {ref}; after: this tree; {out}")
print("| condition | target s | side | p95 ÷ target | p50 ÷ target | median error | passages |")
print("|---|---|---|---|---|---|---|")
for condition in conditions:
    runs = {side: report(out / f"{condition}.{side}.json") for side in ("before", "after")}
    targets = sorted({t["target_s"] for r in runs.values() if r for t in r["summary"]["targets"]})
    for target in targets:
        for side, r in runs.items():
            if r is None:
                print(f"| {condition} | {target:g} | {side} | failed, see {condition}.{side}.log | | | |")
                continue
            t = next(t for t in r["summary"]["targets"] if t["target_s"] == target)
            print(f"| {condition} | {target:g} | {side} | {t['p95_ratio']:.2f} | {t['p50_ratio']:.2f} | "
                  f"{100 * t['pred_err_p50']:.0f} % | {t['mean_chunks']:.1f} |")
PY
