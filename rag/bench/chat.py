"""``rag bench chat``: follow-up conversations answered by rag-budget and
by a naive pipeline side by side, request after request in one run.

The naive pipeline is what a simple chat-over-documents loop does: k chunks
in score order in the system message, then the full history replayed, no
summary, no session state; so its prefix changes every turn.

:func:`run` is the whole of ``rag bench chat``: the corpus indexed, a
pipeline with its own conversation store, the conversations asked.

Does not: assert anything; the figures are for people to read and compare.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Optional, Sequence

from engine.backend import Message
from prompt_budget import ContextPassage
from prompt_budget.layout import SYSTEM_PROMPT, PastTurn, history_messages, passage_blocks

from ..errors import RagError
from ..qa.pipeline import Pipeline
from ..evaluation.stats import mean, percentile
from . import setup
from .setup import Harness


def load_conversations(path) -> list[list[str]]:
    """The follow-up question lists of a chat bench file (JSON with
    ``conversations: [{"questions": [...]}, ...]``)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        conversations = [list(map(str, c["questions"])) for c in data["conversations"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RagError(f"{path}: not a chat bench file ({exc})") from None
    if not conversations or not all(conversations):
        raise RagError(f"{path}: no conversations with questions")
    return conversations


def chat_schedule(sessions: int, turns: int, interleave: bool) -> list[tuple[int, int]]:
    """(session, turn) pairs in the order they are asked: one conversation
    after another, or with ``interleave`` round-robin (A1 B1 C1 A2 ...).

    ``chat_schedule(2, 2, True) -> [(0, 1), (1, 1), (0, 2), (1, 2)]``
    """
    if interleave:
        return [(s, t) for t in range(1, turns + 1) for s in range(sessions)]
    return [(s, t) for s in range(sessions) for t in range(1, turns + 1)]


def naive_messages(question: str, passages: Sequence[ContextPassage], history: Sequence[tuple[str, str]]) -> list[Message]:
    """The naive pipeline's prompt: the system prompt with the passages, the
    whole history as questions and answers, then the question."""
    system = Message("system", f"{SYSTEM_PROMPT}\n\nContext:\n\n{passage_blocks(passages)}")
    return [system, *history_messages([PastTurn(q, a) for q, a in history]), Message("user", question)]


def _naive_turn(pipeline: Pipeline, question: str, history: list[tuple[str, str]], k: int, max_tokens: int):
    """One turn of the naive pipeline. Returns (answer, timings, turns
    dropped to fit the window, chunks)."""
    backend = pipeline.backend
    received = time.perf_counter()
    hits = pipeline.search(question, k=k)
    passages = [ContextPassage(h.source, h.text, h.page) for h in hits]
    replayed = list(history)
    while True:
        tokens = backend.tokenize(backend.render(naive_messages(question, passages, replayed)))
        if len(tokens) + max_tokens <= backend.n_ctx or not replayed:
            break
        replayed.pop(0)  # even the naive pipeline must fit the window
    generation = backend.generate(tokens, max_tokens=max_tokens)
    text, _ = generation.result()
    return text.strip(), generation.timings_since(received), len(history) - len(replayed), len(hits)


def bench_chat(
    pipeline: Pipeline,
    conversations: Sequence[Sequence[str]],
    *,
    turns: int = 10,
    sessions: int = 3,
    interleave: bool = False,
    max_tokens: int = 64,
    target_ttft: float | None = None,
    naive_k: int = 8,
    naive: bool = True,
    back_to_back: bool = False,
    run_id: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    """Multi-turn conversations answered by rag-budget (sessions, summary,
    KV snapshots, budgeted context) and by a naive pipeline in the same run,
    request after request; per turn the prompt, cached and prefilled tokens
    and TTFT of both, and their ratio. ``back_to_back``: each question is
    asked as soon as the answer before it is out, whatever background work
    (folding turns into summaries) is still running, as a busy service
    meets it; else a user is assumed to read first and background work to
    be done. ``naive`` False leaves the naive pipeline out."""
    if sessions < 1 or turns < 1:
        raise RagError("--sessions and --turns must be at least 1")
    if sessions > len(conversations):
        raise RagError(f"only {len(conversations)} conversations in the bench file; ask for at most that many --sessions")
    if turns > min(len(c) for c in conversations[:sessions]):
        raise RagError(f"the conversations have at most {min(len(c) for c in conversations[:sessions])} questions; lower --turns")
    run_id = run_id or uuid.uuid4().hex[:8]
    ids = [f"bench-{run_id}-{s}" for s in range(sessions)]
    naive_history: list[list[tuple[str, str]]] = [[] for _ in range(sessions)]
    rows: list[dict[str, object]] = []
    schedule = chat_schedule(sessions, turns, interleave)
    for done, (s, t) in enumerate(schedule, start=1):
        question = conversations[s][t - 1]
        # A user reads an answer before asking the next question; the
        # background fold of older turns runs then. Its time is reported.
        waited = 0.0 if back_to_back else pipeline.wait_idle()
        started = time.perf_counter()
        first: float | None = None
        with pipeline.stream(question, session=ids[s], max_tokens=max_tokens, target_ttft=target_ttft) as stream:
            for _ in stream:  # the first text is what the person would see first
                if first is None:
                    first = time.perf_counter()
            ours = stream.answer
        wall = time.perf_counter() - started
        rows.append(_our_row(s, t, ours, wall, waited) | {"seen_ttft_s": round(first - started, 4) if first else None})
        if not naive:
            if progress:
                progress(done, len(schedule))
            continue
        answer, tn, dropped, k = _naive_turn(pipeline, question, naive_history[s], naive_k, max_tokens)
        naive_history[s].append((question, answer))
        rows.append({
            "system": "naive", "session": s, "turn": t, "prompt_tokens": tn.prompt_tokens,
            "cached_tokens": tn.cached_tokens, "prefill_tokens": tn.prefill_tokens,
            "restored_tokens": tn.restored_tokens, "ttft_s": round(tn.ttft_s, 4), "chunks": k,
            "turns_shown": len(naive_history[s]) - 1 - dropped, "turns_dropped": dropped,
            "decode_tokens": tn.decode_tokens,
        })
        if progress:
            progress(done, len(schedule))
    pipeline.wait_idle()
    summary = _chat_summary(rows, turns, [e for e in pipeline.background_log
                                          if str(e.get("session", "")).startswith(f"bench-{run_id}")])
    return {
        "bench": "chat",
        "config": {
            "turns": turns, "sessions": sessions, "interleave": interleave, "max_tokens": max_tokens,
            "target_ttft_s": target_ttft, "naive_k": naive_k, "naive": naive, "back_to_back": back_to_back,
            "history_mode": pipeline.memory.history_mode,
            "history": {"recent_tokens": pipeline.components.history.recent_tokens, "keep_tokens": pipeline.components.history.keep_tokens,
                        "summary_tokens": pipeline.components.history.summary_tokens},
            "engine": pipeline.backend.name, "n_ctx": pipeline.backend.n_ctx, "index": str(pipeline.index_location),
        },
        "rows": rows,
        "summary": summary,
    }


def _our_row(session: int, turn: int, ours, wall: float, waited: float) -> dict[str, object]:
    """rag-budget's row for one turn: its tokens, times and what the budget chose."""
    tm = ours.timings
    return {
        "system": "ours", "session": session, "turn": turn, "prompt_tokens": tm.prompt_tokens,
        "cached_tokens": tm.cached_tokens, "prefill_tokens": tm.prefill_tokens,
        "restored_tokens": tm.restored_tokens, "restore_s": round(tm.restore_s, 4),
        "snapshot_s": round(tm.snapshot_s, 4), "ttft_s": round(tm.ttft_s, 4),
        "predicted_ttft_s": round(ours.budget.predicted_ttft_s, 4), "chunks": ours.budget.chosen,
        "turns_shown": ours.turns_shown, "decode_tokens": tm.decode_tokens, "wall_s": round(wall, 4),
        "background_wait_s": round(waited, 4), "target_s": ours.budget.target_ttft,
    }


def _chat_summary(rows: list[dict[str, object]], turns: int, background: list[dict[str, object]]) -> dict[str, object]:
    """Per turn, the means over sessions of both systems and their TTFT
    ratio; over the run, cached shares, TTFT ratios and background work."""
    per_turn = []
    for t in range(1, turns + 1):
        entry: dict[str, object] = {"turn": t}
        for system in ("ours", "naive"):
            mine = [r for r in rows if r["system"] == system and r["turn"] == t]
            for field in ("prompt_tokens", "cached_tokens", "prefill_tokens", "ttft_s"):
                entry[f"{system}_{field}"] = round(mean(r[field] for r in mine), 3)
        entry["ttft_ratio"] = round(entry["naive_ttft_s"] / entry["ours_ttft_s"], 3) \
            if entry["ours_ttft_s"] and entry["naive_ttft_s"] else None
        per_turn.append(entry)

    def cached_ratio(system: str) -> float:
        mine = [r for r in rows if r["system"] == system and r["turn"] >= 2]
        return round(mean(r["cached_tokens"] / r["prompt_tokens"] for r in mine), 3)

    ours_all = [r for r in rows if r["system"] == "ours"]
    naive_all = [r for r in rows if r["system"] == "naive"]
    folds = [e for e in background if e.get("kind") == "summary"]
    prefills = [e for e in background if e.get("kind") == "prefill"]
    over = [r["ttft_s"] / r["target_s"] for r in ours_all if r.get("target_s")]
    seen = [r["seen_ttft_s"] / r["target_s"] for r in ours_all if r.get("target_s") and r.get("seen_ttft_s")]
    return {
        "ours_cached_ratio": cached_ratio("ours"),
        "naive_cached_ratio": cached_ratio("naive") if naive_all else None,
        "ttft_ratio_last_turn": per_turn[-1]["ttft_ratio"],
        "ttft_ratio_overall": round(sum(r["ttft_s"] for r in naive_all) / sum(r["ttft_s"] for r in ours_all), 3)
        if naive_all else None,
        "ours_turns_over_1_1_target": sum(1 for x in over if x > 1.1),
        "ours_p95_ttft_over_target": percentile(over, 0.95),
        # Seen: from the call to the first piece of text, planning and retrieval included.
        "ours_p95_seen_over_target": percentile(seen, 0.95) if seen else None,
        "ours_turns_seen_over_1_1_target": sum(1 for x in seen if x > 1.1),
        "ours_max_seen_ttft_s": max((r["seen_ttft_s"] for r in ours_all if r.get("seen_ttft_s")), default=None),
        "ours_mean_ttft_s": round(mean(r["ttft_s"] for r in ours_all), 3),
        "naive_mean_ttft_s": round(mean(r["ttft_s"] for r in naive_all), 3),
        "summaries": len(folds),
        "summary_methods": sorted({str(e.get("method")) for e in folds if e.get("method")}),
        "summary_s_total": round(sum(float(e["seconds"]) for e in folds), 3),
        "background_prefill_s_total": round(sum(float(e["seconds"]) for e in prefills if "seconds" in e), 3),
        "background_prefill_errors": [str(e["error"]) for e in prefills if "error" in e],
        "background_wait_s_total": round(sum(float(r["background_wait_s"]) for r in ours_all), 3),
        "per_turn": per_turn,
    }


def run(h: Harness, corpus: Path, include: Sequence[str], *, conversations: Optional[Path] = None,
        index: Optional[Path] = None, model: Optional[Path] = None, turns: int = 10, sessions: int = 3,
        interleave: bool = False, max_tokens: int = 64, target_ttft: float | None = None, history: str = "prompted",
        back_to_back: bool = False, naive: bool = True) -> dict[str, object]:
    """``rag bench chat``: ``corpus`` indexed, then the scripts of
    ``conversations`` (default: the bundled Python-docs set) asked through
    a pipeline with its own conversation store and RAM-only snapshots, so
    a bench leaves nothing behind (:func:`bench_chat`)."""
    scripts = load_conversations(conversations or setup.BENCH_DATA / "python_docs_chat.json")
    with tempfile.TemporaryDirectory(prefix="rag-bench-chat-") as tmp:
        pipeline = setup.bench_pipeline(h, corpus, include, index, model, kv_dir=False, history_mode=history,
                                        conversations=Path(tmp) / "conversations.sqlite")
        pipeline.prepare()  # calibrate, if needed, before anything is timed
        with h.counting("turns") as update:
            result = bench_chat(pipeline, scripts, turns=turns, sessions=sessions, interleave=interleave,
                                max_tokens=max_tokens, target_ttft=target_ttft, naive=naive,
                                back_to_back=back_to_back, progress=update)
        pipeline.close()
    return result


def main() -> None:
    """``python -m rag.bench.chat``: ``rag bench chat`` on its own."""
    setup.command_alone("chat")


if __name__ == "__main__":
    main()
