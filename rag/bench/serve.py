"""``rag bench serve``: closed-loop clients on 127.0.0.1 against real
servers of one model, for each number of clients and each server set-up.

TTFT is measured by the clients, from the request leaving to the first
streamed piece. A client told 429 waits its Retry-After (at most 2 s) and
counts the request as rejected; a stream that ends without its answer (or
with an error event) counts as an error.

Does not: start servers (the caller passes their URLs) or assert anything.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Callable, Sequence

import httpx

from .stats import percentile


def _ask(http: httpx.Client, body: dict) -> dict[str, object]:
    """One streamed ``/v1/ask``: status, client-side TTFT and the final answer (or what went wrong)."""
    sent = time.perf_counter()
    ttft, answer, status, retry = None, None, None, 0.0
    try:
        with http.stream("POST", "/v1/ask", json=body) as r:
            status = r.status_code
            if status == 429:
                retry = float(r.headers.get("retry-after", "1"))
            elif status == 200:
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if ttft is None:
                        ttft = time.perf_counter() - sent
                    event = json.loads(line[6:])
                    if "answer" in event:
                        answer = event["answer"]
                    elif "error" in event:
                        status = f"error event: {event['error'].get('message', '')[:80]}"
                if status == 200 and answer is None:
                    status = "error: the stream ended without its answer"
            else:
                r.read()
    except (httpx.HTTPError, ValueError) as exc:
        status = f"error: {type(exc).__name__}"
    return {"status": status, "ttft_s": round(ttft, 4) if ttft is not None else None,
            "total_s": round(time.perf_counter() - sent, 4), "answer": answer, "retry_after_s": retry}


def _run(url: str, questions: Sequence[str], clients: int, requests: int, body: dict) -> tuple[list[dict], float]:
    """``requests`` requests from ``clients`` closed-loop clients; their rows and the wall time."""
    results: list[dict[str, object]] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def client(number: int) -> None:
        with httpx.Client(base_url=url, timeout=300) as http:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                outcome = _ask(http, body | {"question": questions[i % len(questions)]})
                answer = outcome.pop("answer")
                row = outcome | {"client": number,
                                 "chunks": answer["budget"]["chosen"] if answer else None,
                                 "decode_tokens": answer["timings"]["decode_tokens"] if answer else 0}
                with lock:
                    results.append(row)
                if row["status"] == 429:
                    time.sleep(min(float(row["retry_after_s"]), 2.0))

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - started


def bench_serve(
    systems: Sequence[tuple[str, str]],
    questions: Sequence[str],
    *,
    clients: Sequence[int] = (1, 4, 8),
    requests: int = 24,
    target_ttft: float = 2.0,
    max_tokens: int = 32,
    progress: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """For each client count and each ``(name, url)`` in ``systems``,
    ``requests`` requests in all: client-side TTFT percentiles, tokens per
    second, served, refused and failed requests, and chunks per answer."""
    runs: list[dict[str, object]] = []
    rows: list[dict[str, object]] = []
    body = {"max_tokens": max_tokens, "target_ttft_s": target_ttft, "stream": True}
    for n in clients:
        for name, url in systems:
            results, wall = _run(url, questions, n, requests, body)
            served = [r for r in results if r["status"] == 200]
            ttfts = [float(r["ttft_s"]) for r in served]
            runs.append({
                "clients": n, "system": name, "target_s": target_ttft,
                "p50_ttft_s": percentile(ttfts, 0.5), "p95_ttft_s": percentile(ttfts, 0.95),
                "tok_s": round(sum(int(r["decode_tokens"]) for r in served) / wall, 2),
                "errors": sum(1 for r in results if r["status"] not in (200, 429)),
                "rejected_429": sum(1 for r in results if r["status"] == 429),
                "over_share": round(sum(1 for x in ttfts if x > target_ttft) / len(ttfts), 3) if ttfts else None,
                "served": len(served),
                "mean_chunks": round(sum(int(r["chunks"]) for r in served) / len(served), 2) if served else None,
                "wall_s": round(wall, 2),
            })
            rows.extend(r | {"clients": n, "system": name} for r in results)
            if progress:
                progress(f"{n} clients, {name}: done")
    return {
        "bench": "serve",
        "config": {"clients": list(clients), "requests": requests, "target_ttft_s": target_ttft,
                   "max_tokens": max_tokens, "systems": [name for name, _ in systems]},
        "rows": rows,
        "summary": {"runs": runs},
    }
