#!/usr/bin/env bash
# Run `rag bench ttft`, `rag bench chat --interleave` and `rag bench serve --clients 8` on two trees,
# alternating (before, after, for each bench), in one run on one machine, and print their figures
# side by side. A refactoring that says "behaviour unchanged" is checked with it (issue 45).
#
#   rag/bench/side_by_side.sh BEFORE_REF [OUT_DIR]
#
# BEFORE_REF is checked out in a git worktree; "after" is this tree. Each runs as
# `python -m rag.cli` from its own root with this venv's packages. Needs the Python 3.11
# documentation (apt-get install python3.11-doc) as the ttft corpus. About 15 minutes on 2 cores
# (the first run also builds the corpus's index). TABLE_ONLY=1 prints the table of OUT_DIR again.
set -euo pipefail
before_ref=${1:?usage: side_by_side.sh BEFORE_REF [OUT_DIR]}
after_root=$(cd "$(dirname "$0")/../.." && pwd)
out=${2:-$(mktemp -d /tmp/side-by-side.XXXX)}
before_root="$out/before-tree"
mkdir -p "$out"
if [ "${TABLE_ONLY:-}" != 1 ]; then
  git -C "$after_root" worktree add --detach --force "$before_root" "$before_ref" >/dev/null
  trap 'git -C "$after_root" worktree remove --force "$before_root"' EXIT
fi
corpus=/usr/share/doc/python3.11/html/_sources
[ -d "$corpus/library" ] || { echo "the ttft corpus $corpus is missing: apt-get install python3.11-doc" >&2; exit 1; }

bench() {  # bench NAME ARGS...: run on both trees, one after the other
  local name=$1; shift
  for side in before after; do
    local root=$before_root; [ "$side" = after ] && root=$after_root
    echo "== $name ($side)" >&2
    (cd "$root" && HF_HUB_OFFLINE=1 python -m rag.cli bench "$@" --json) > "$out/$name.$side.json" 2> "$out/$name.$side.log"
  done
}
if [ "${TABLE_ONLY:-}" != 1 ]; then
bench ttft ttft --corpus "$corpus" --include 'library/*' --questions "$after_root/rag/bench/data/python_docs_dev.jsonl" --targets 1,2
bench chat chat --turns 4 --sessions 2 --interleave
bench serve serve --clients 8 --requests 16
fi
python - "$out" "$before_ref" <<'PY'
import json, sys
from pathlib import Path

out, ref = Path(sys.argv[1]), sys.argv[2]

def last_json(path):
    # The --json report is the last JSON document on stdout.
    text = path.read_text()
    return json.loads(text[text.index("{"):]) if text.strip().startswith("{") else json.loads(text.splitlines()[-1])

LABELS = ("target_s", "system", "clients")  # what names one row of a summary's list

def flat(prefix, value, rows):
    # The summary's figures, a list of runs by what names each (a target, a system); rows per request are left out.
    if isinstance(value, dict):
        for k, v in value.items():
            if k != "rows":
                flat(f"{prefix}.{k}" if prefix else k, v, rows)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for v in value:
            label = " ".join(f"{k}={v[k]}" for k in LABELS if k in v)
            flat(f"{prefix}[{label}]", {k: x for k, x in v.items() if k not in LABELS}, rows)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and not prefix.startswith("config"):
        rows[prefix] = value

print(f"| bench | figure | before ({ref}) | after |\n|---|---|---|---|")
for name in ("ttft", "chat", "serve"):
    before, after = {}, {}
    flat("", last_json(out / f"{name}.before.json"), before)
    flat("", last_json(out / f"{name}.after.json"), after)
    for key in sorted(set(before) | set(after)):
        print(f"| {name} | {key} | {before.get(key, '')} | {after.get(key, '')} |")
PY
echo "reports and logs: $out" >&2
