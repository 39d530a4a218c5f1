"""Benchmarks that print figures (``rag bench NAME``).

Each returns DESIGN.md's bench object: ``{"bench": NAME, "config": {...},
"rows": [...], "summary": {...}}``.

Does not: assert anything; the figures are for people to read and compare.
"""

from __future__ import annotations

import json
from typing import Callable, Sequence

from prompt_budget.cost import quantile

from .evaluate import Question
from .pipeline import Pipeline


def bench_ttft(
    pipeline: Pipeline,
    questions: Sequence[Question],
    targets: Sequence[float],
    *,
    max_tokens: int = 16,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    """Answer every question under every TTFT target and report how well
    the measured TTFT met the target and how well it was predicted."""
    rows: list[dict[str, object]] = []
    total, done = len(questions) * len(targets), 0
    for target in targets:
        for number, q in enumerate(questions, start=1):
            answer = pipeline.ask(q.question, target_ttft=target, max_tokens=max_tokens)
            t, b = answer.timings, answer.budget
            rows.append(
                {
                    "target_s": target, "question": number, "ttft_s": round(t.ttft_s, 4),
                    "predicted_ttft_s": round(b.predicted_ttft_s, 4), "planned_ttft_s": round(b.planned_ttft_s or 0, 4),
                    "feasible": b.feasible, "chosen": b.chosen, "prompt_tokens": t.prompt_tokens,
                    "cached_tokens": t.cached_tokens, "prefill_tokens": t.prefill_tokens, "prefill_s": round(t.prefill_s, 4),
                    "ratio": round(t.ttft_s / target, 4),
                    "pred_err": round(abs(b.predicted_ttft_s - t.ttft_s) / t.ttft_s, 4),
                }
            )
            done += 1
            if progress:
                progress(done, total)
    summary = []
    for target in targets:
        mine = [r for r in rows if r["target_s"] == target]
        ratios = [r["ratio"] for r in mine]
        errors = [r["pred_err"] for r in mine]
        summary.append(
            {
                "target_s": target,
                # Infeasible: even one chunk could not be planned within the target.
                "feasible": all(r["feasible"] for r in mine),
                "infeasible_requests": sum(1 for r in mine if not r["feasible"]),
                "requests": len(mine),
                "p50_ratio": round(quantile(ratios, 0.5), 3),
                "p95_ratio": round(quantile(ratios, 0.95), 3),
                "over_share": round(sum(1 for x in ratios if x > 1.0) / len(ratios), 3),
                "mean_chunks": round(sum(r["chosen"] for r in mine) / len(mine), 2),
                "mean_prompt_tokens": round(sum(r["prompt_tokens"] for r in mine) / len(mine), 1),
                "pred_err_p50": round(quantile(errors, 0.5), 3),
                "pred_err_p95": round(quantile(errors, 0.95), 3),
            }
        )
    return {
        "bench": "ttft",
        "config": {
            "targets": list(targets), "questions": len(questions), "max_tokens": max_tokens,
            "learn": pipeline.learn, "engine": pipeline.backend.name, "index": str(pipeline.index_dir),
        },
        "rows": rows,
        "summary": {"targets": summary},
    }


def load_conversations(path) -> list[list[str]]:
    """The follow-up question lists of a chat bench file (JSON with
    ``conversations: [{"questions": [...]}, ...]``)."""
    from pathlib import Path

    from .errors import RagError

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


def _naive_turn(pipeline: Pipeline, question: str, history: list[tuple[str, str]], k: int, max_tokens: int):
    """One turn of the naive pipeline: k chunks in score order before the
    full history, no summary, no session state. Returns (answer, row)."""
    import time

    from engine.backend import Message, Timings
    from prompt_budget import ContextPassage, format_passage
    from prompt_budget.layout import SYSTEM_PROMPT

    backend = pipeline.backend
    received = time.perf_counter()
    hits = pipeline.search(question, k=k)
    context = "\n\n".join(format_passage(n, ContextPassage(h.source, h.text, h.page)) for n, h in enumerate(hits, 1))
    replayed = list(history)
    while True:
        messages = [Message("system", f"{SYSTEM_PROMPT}\n\nContext:\n\n{context}")]
        for q, a in replayed:
            messages += [Message("user", q), Message("assistant", a)]
        messages.append(Message("user", question))
        tokens = backend.tokenize(backend.render(messages))
        if len(tokens) + max_tokens <= backend.n_ctx or not replayed:
            break
        replayed.pop(0)  # even the naive pipeline must fit the window
    engine_start = time.perf_counter()
    pieces, timings = [], None
    for item in backend.generate(tokens, max_tokens=max_tokens):
        if isinstance(item, Timings):
            timings = item
        else:
            pieces.append(item)
    assert timings is not None
    timings = timings.shifted(engine_start - received)
    return "".join(pieces).strip(), timings, len(history) - len(replayed), len(hits)


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
    run_id: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    """Multi-turn conversations answered by rag-budget (sessions, summary,
    KV snapshots, budgeted context) and by a naive pipeline in the same run,
    request after request; per turn the prompt, cached and prefilled tokens
    and TTFT of both, and their ratio."""
    import time
    import uuid

    from .errors import RagError

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
        waited = pipeline.wait_idle()
        started = time.perf_counter()
        ours = pipeline.ask(question, session=ids[s], max_tokens=max_tokens, target_ttft=target_ttft)
        wall = time.perf_counter() - started
        tm = ours.timings
        rows.append({
            "system": "ours", "session": s, "turn": t, "prompt_tokens": tm.prompt_tokens,
            "cached_tokens": tm.cached_tokens, "prefill_tokens": tm.prefill_tokens,
            "restored_tokens": tm.restored_tokens, "restore_s": round(tm.restore_s, 4),
            "snapshot_s": round(tm.snapshot_s, 4), "ttft_s": round(tm.ttft_s, 4),
            "predicted_ttft_s": round(ours.budget.predicted_ttft_s, 4), "chunks": ours.budget.chosen,
            "turns_shown": ours.turns_shown, "decode_tokens": tm.decode_tokens, "wall_s": round(wall, 4),
            "background_wait_s": round(waited, 4),
        })
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

    def mean(values):
        values = list(values)
        return sum(values) / len(values) if values else 0.0

    per_turn = []
    for t in range(1, turns + 1):
        entry: dict[str, object] = {"turn": t}
        for system in ("ours", "naive"):
            mine = [r for r in rows if r["system"] == system and r["turn"] == t]
            for field in ("prompt_tokens", "cached_tokens", "prefill_tokens", "ttft_s"):
                entry[f"{system}_{field}"] = round(mean(r[field] for r in mine), 3)
        entry["ttft_ratio"] = round(entry["naive_ttft_s"] / entry["ours_ttft_s"], 3) if entry["ours_ttft_s"] else None
        per_turn.append(entry)

    def cached_ratio(system: str) -> float:
        mine = [r for r in rows if r["system"] == system and r["turn"] >= 2]
        return round(mean(r["cached_tokens"] / r["prompt_tokens"] for r in mine), 3)

    ours_all = [r for r in rows if r["system"] == "ours"]
    naive_all = [r for r in rows if r["system"] == "naive"]
    folds = [e for e in pipeline.background_log if e.get("kind") == "summary" and str(e.get("session", "")).startswith(f"bench-{run_id}")]
    prefills = [e for e in pipeline.background_log if e.get("kind") == "prefill" and str(e.get("session", "")).startswith(f"bench-{run_id}")]
    last = per_turn[-1]
    summary = {
        "ours_cached_ratio": cached_ratio("ours"),
        "naive_cached_ratio": cached_ratio("naive"),
        "ttft_ratio_last_turn": last["ttft_ratio"],
        "ttft_ratio_overall": round(sum(r["ttft_s"] for r in naive_all) / sum(r["ttft_s"] for r in ours_all), 3),
        "ours_mean_ttft_s": round(mean(r["ttft_s"] for r in ours_all), 3),
        "naive_mean_ttft_s": round(mean(r["ttft_s"] for r in naive_all), 3),
        "summaries": len(folds),
        "summary_methods": sorted({str(e.get("method")) for e in folds if e.get("method")}),
        "summary_s_total": round(sum(float(e["seconds"]) for e in folds), 3),
        "background_prefill_s_total": round(sum(float(e["seconds"]) for e in prefills), 3),
        "background_wait_s_total": round(sum(float(r["background_wait_s"]) for r in ours_all), 3),
        "per_turn": per_turn,
    }
    return {
        "bench": "chat",
        "config": {
            "turns": turns, "sessions": sessions, "interleave": interleave, "max_tokens": max_tokens,
            "target_ttft_s": target_ttft, "naive_k": naive_k, "history_mode": pipeline.history_mode,
            "history": {"recent_tokens": pipeline.history.recent_tokens, "keep_tokens": pipeline.history.keep_tokens,
                        "summary_tokens": pipeline.history.summary_tokens},
            "engine": pipeline.backend.name, "n_ctx": pipeline.backend.n_ctx, "index": str(pipeline.index_dir),
        },
        "rows": rows,
        "summary": summary,
    }


def _percentile(values: Sequence[float], q: float) -> float | None:
    return round(quantile(values, q), 3) if values else None


def bench_serve(
    pipeline: Pipeline,
    questions: Sequence[str],
    *,
    clients: Sequence[int] = (1, 4, 8),
    requests: int = 24,
    target_ttft: float = 2.0,
    max_tokens: int = 32,
    progress: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """Closed-loop clients on 127.0.0.1 against a real server on one model:
    for each client count, with and without load-aware budgeting, ``requests``
    requests in all; TTFT is measured by the clients, to the first streamed
    piece. A client told 429 waits its Retry-After (at most 2 s) and counts
    the request as rejected."""
    import threading
    import time

    import httpx

    from .service import LoopbackServer, ServiceSettings, create_app

    settings = ServiceSettings(rate_limit_per_minute=0)
    app = create_app(pipeline, settings)
    server = LoopbackServer(app)
    runs: list[dict[str, object]] = []
    rows: list[dict[str, object]] = []
    try:
        for n in clients:
            for load_aware in (False, True):
                settings.load_aware = load_aware
                results: list[dict[str, object]] = []
                lock = threading.Lock()
                counter = iter(range(requests))

                def client(number: int) -> None:
                    with httpx.Client(base_url=server.url, timeout=300) as http:
                        while True:
                            with lock:
                                i = next(counter, None)
                            if i is None:
                                return
                            q = questions[i % len(questions)]
                            body = {"question": q, "max_tokens": max_tokens, "target_ttft_s": target_ttft, "stream": True}
                            sent = time.perf_counter()
                            ttft, answer, status = None, None, None
                            try:
                                with http.stream("POST", "/v1/ask", json=body) as r:
                                    status = r.status_code
                                    if status == 429:
                                        retry = float(r.headers.get("retry-after", "1"))
                                    else:
                                        for line in r.iter_lines():
                                            if not line.startswith("data: "):
                                                continue
                                            if ttft is None:
                                                ttft = time.perf_counter() - sent
                                            event = json.loads(line[6:])
                                            if "answer" in event:
                                                answer = event["answer"]
                            except httpx.HTTPError as exc:
                                status = f"error: {type(exc).__name__}"
                            row = {"clients": n, "load_aware": load_aware, "client": number, "status": status,
                                   "ttft_s": round(ttft, 4) if ttft is not None else None,
                                   "total_s": round(time.perf_counter() - sent, 4),
                                   "chunks": answer["budget"]["chosen"] if answer else None,
                                   "decode_tokens": answer["timings"]["decode_tokens"] if answer else 0}
                            with lock:
                                results.append(row)
                            if status == 429:
                                time.sleep(min(retry, 2.0))

                started = time.perf_counter()
                threads = [threading.Thread(target=client, args=(c,)) for c in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - started
                served = [r for r in results if r["status"] == 200 and r["ttft_s"] is not None]
                ttfts = [float(r["ttft_s"]) for r in served]
                runs.append({
                    "clients": n, "load_aware": load_aware, "target_s": target_ttft,
                    "p50_ttft_s": _percentile(ttfts, 0.5), "p95_ttft_s": _percentile(ttfts, 0.95),
                    "tok_s": round(sum(int(r["decode_tokens"]) for r in served) / wall, 2),
                    "errors": sum(1 for r in results if r["status"] not in (200, 429)),
                    "rejected_429": sum(1 for r in results if r["status"] == 429),
                    "over_share": round(sum(1 for x in ttfts if x > target_ttft) / len(ttfts), 3) if ttfts else None,
                    "served": len(served),
                    "mean_chunks": round(sum(int(r["chunks"]) for r in served) / len(served), 2) if served else None,
                    "wall_s": round(wall, 2),
                })
                rows.extend(results)
                if progress:
                    progress(f"{n} clients, load-aware {'on' if load_aware else 'off'}: done")
    finally:
        server.stop()
    return {
        "bench": "serve",
        "config": {"clients": list(clients), "requests": requests, "target_ttft_s": target_ttft,
                   "max_tokens": max_tokens, "engine": pipeline.backend.name, "index": str(pipeline.index_dir)},
        "rows": rows,
        "summary": {"runs": runs},
    }
