"""What a person waits for at the terminal: ``rag ask QUESTION`` as a new
process, from its start to the first answer text on its stdout (taken here,
outside the process), beside the TTFT the engine reports and the one the
command reports seeing (its footer), for the first call (no server running),
a call with the server running, and ``--no-server``; and the import time of
the client path (``python -X importtime``) with the heavy modules it leaves
out. With ``--base DIR`` (a checkout of the code before the resident server,
``git archive d1160d8 | tar -x -C DIR``) also ``rag ask`` as it was.

Run once, under the CPU lock, from the repository root (README "Resident server"):

    flock /work/notes/cpu.lock python tests/tools/measure_resident.py --index DIR [--base DIR] [--runs 3]

It sets its own runtime folder (a new temporary one) and stops every server
it started.

Does not: build the index (``rag ingest data/ --index DIR`` first).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ["What does the KV cache store?", "Why is decode slower than prefill?",
             "How does rag-budget decide how many chunks go into the prompt?"]
HEAVY = ("torch", "sentence_transformers", "transformers", "llama_cpp", "faiss", "numpy", "fastapi", "uvicorn",
         "rag.qa.pipeline", "rag.index.store")
FOOTER = re.compile(r"TTFT\s+([\d.]+)\s+s.*?(?:seen\s+([\d.]+)\s+s)?\)", re.S)


def run_ask(code: Path, env: dict, question: str, index: str, *extra: str) -> dict:
    """One ``rag ask`` process: wall seconds to the first stdout byte and to
    its end, and the TTFT figures of its footer."""
    command = [sys.executable, "-c", "from rag.cli import main; main()", "ask", question, "--index", index, *extra]
    env = env | {"PYTHONPATH": str(code)}
    began = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=code)
    first = process.stdout.read(1)
    first_at = time.perf_counter()
    rest, err = process.communicate()
    ended = time.perf_counter()
    if process.returncode != 0 or not first:
        raise SystemExit(f"rag ask failed ({process.returncode}): {err.decode()[-2000:]}")
    m = FOOTER.search(err.decode())
    return {"wall_first_s": first_at - began, "wall_total_s": ended - began,
            "engine_ttft_s": float(m.group(1)) if m else None,
            "seen_ttft_s": float(m.group(2)) if m and m.group(2) else None}


def stop_servers(env: dict) -> None:
    subprocess.run([sys.executable, "-m", "rag.cli", "server", "stop", "--all"], env=env, cwd=ROOT,
                   capture_output=True, check=True)


def client_imports(env: dict, index: str) -> tuple[float, list[str]]:
    """Seconds of imports of ``rag ask`` through a running server (the sum of
    top-level cumulative import times) and the heavy modules it imported."""
    command = [sys.executable, "-X", "importtime", "-c", "from rag.cli import main; main()", "ask",
               QUESTIONS[0], "--index", index, "--max-tokens", "8"]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    total, names = 0, []
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            names.append(m.group(3))
            if len(m.group(2)) == 1:  # a top-level import: its cumulative time counts once
                total += int(m.group(1))
    return total / 1e6, [h for h in HEAVY if h in names]


def show(label: str, rows: list[dict]) -> None:
    for n, r in enumerate(rows, start=1):
        seen = "-" if r["seen_ttft_s"] is None else f"{r['seen_ttft_s']:.2f}"
        over = r["wall_first_s"] - r["engine_ttft_s"]
        print(f"| {label} | {n} | {r['wall_first_s']:.2f} | {r['engine_ttft_s']:.2f} | {seen} | {over:+.2f} | "
              f"{r['wall_total_s']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", required=True, help="an index of data/ (rag ingest data/ --index DIR)")
    parser.add_argument("--base", type=Path, help="a checkout of the code before the resident server")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    index = str(Path(args.index).resolve())
    runtime = tempfile.mkdtemp(prefix="rag-measure-", dir="/tmp")
    env = dict(os.environ) | {"XDG_RUNTIME_DIR": runtime, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RAG_NO_SERVER", None)
    questions = [QUESTIONS[n % len(QUESTIONS)] for n in range(args.runs)]
    print("| call | run | wall to first text s | engine TTFT s | seen TTFT s | wall - engine TTFT s | wall total s |")
    print("|---|---|---|---|---|---|---|")
    try:
        if args.base:
            show("before (d1160d8), in process", [run_ask(args.base, env, q, index) for q in questions])
        show("--no-server", [run_ask(ROOT, env, q, index, "--no-server") for q in questions])
        first = []
        for q in questions:
            stop_servers(env)
            first.append(run_ask(ROOT, env, q, index))
        show("first (starts the server)", first)
        show("second (server running)", [run_ask(ROOT, env, q, index) for q in questions])
        seconds, heavy = client_imports(env, index)
        print(f"\nclient path imports: {seconds:.3f} s (sum of top-level cumulative import times); "
              f"heavy modules imported: {heavy or 'none'} of {', '.join(HEAVY)}")
    finally:
        stop_servers(env)


if __name__ == "__main__":
    main()
