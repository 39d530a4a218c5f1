"""``rag bench page``: time to first token as the web page sees it against
the API's own, on one server, interleaved so machine noise hits both.

The page is driven in Chromium by Playwright. Its TTFT runs from the submit
to the frame that first shows streamed text (``performance.now()`` in the
page); the answer it received says the server's own ``ttft_s`` (from the
question's arrival to the first token). Streamed ``/v1/ask`` requests from
an HTTP client give the API's figures: its reported ``ttft_s`` and the
client's time to the first event. Each question is asked once each way; the
two ways take them in different orders (half the list apart), alternating
which goes first, so neither is always the one that finds a question's
vector cached.

:func:`run` is the whole of ``rag bench page``: the corpus indexed, a
server started over it on 127.0.0.1, measured by :func:`bench_page` (which
starts nothing: it is given the URL), and stopped.

Does not: assert anything.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import httpx

from ..errors import RagError
from ..service.page_driver import CHROMIUM_ARGS, find_chromium, open_page
from ..evaluation.stats import percentile
from . import setup
from .setup import Harness

SETTLE_S = 0.3  # pause after each answer, either way, before the next question


def _ask_page(page, question: str, max_tokens: int) -> dict[str, object]:
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#question", question)
    page.click("#ask-button")
    turn = page.wait_for_selector(".turn:last-child:is([data-state=done], [data-state=failed])", timeout=300_000)
    if turn.get_attribute("data-state") != "done":
        return {"how": "page", "status": "error: " + turn.inner_text()[-120:]}
    # The page redraws its charts after an answer: a person reads before asking again.
    page.wait_for_selector(".turn:last-child[data-settled]", timeout=60_000)
    time.sleep(SETTLE_S)
    return {"how": "page", "status": 200, "ttft_ms": float(turn.get_attribute("data-page-ttft-ms")),
            "api_ttft_ms": float(turn.get_attribute("data-api-ttft-ms"))}


def _ask_api(http: httpx.Client, question: str, max_tokens: int) -> dict[str, object]:
    sent = time.perf_counter()
    first, answer = None, None
    with http.stream("POST", "/v1/ask", json={"question": question, "max_tokens": max_tokens, "stream": True}) as r:
        if r.status_code != 200:
            r.read()
            return {"how": "api", "status": r.status_code}
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if "evidence" not in event:  # the first text, not the evidence shown before it
                    first = first if first is not None else time.perf_counter() - sent
                answer = event.get("answer", answer)
    time.sleep(SETTLE_S)  # as long a pause as the page's
    if answer is None:
        return {"how": "api", "status": "error: the stream ended without its answer"}
    return {"how": "api", "status": 200, "ttft_ms": first * 1000, "api_ttft_ms": answer["timings"]["ttft_s"] * 1000}


def _median(rows: list[dict], field: str) -> float | None:
    values = [float(r[field]) for r in rows if r.get(field) is not None]
    return round(percentile(values, 0.5), 1) if values else None


def bench_page(url: str, questions: Sequence[str], *, chromium: str, key: str | None = None, max_tokens: int = 32,
               progress: Callable[[str], None] | None = None) -> dict[str, object]:
    """Ask every question once through the page and once through the API of
    the server at ``url``, interleaved; TTFT medians of both ways, and of
    each way's time above the server's own ``ttft_s``."""
    from playwright.sync_api import sync_playwright

    if not questions:
        raise RagError("bench page: no questions")
    rows: list[dict[str, object]] = []
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with sync_playwright() as pw, httpx.Client(base_url=url, headers=headers, timeout=300) as http:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = open_page(browser, url, key, viewport={"width": 1280, "height": 900})
            _ask_page(page, questions[0], max_tokens)  # warm-up, not counted
            _ask_api(http, questions[-1], max_tokens)
            half = len(questions) // 2
            for i, question in enumerate(questions):
                other = questions[(i + half) % len(questions)]
                ways = [lambda: _ask_page(page, question, max_tokens), lambda: _ask_api(http, other, max_tokens)]
                for ask in ways if i % 2 == 0 else ways[::-1]:
                    row = ask()
                    row["question"] = question if row["how"] == "page" else other
                    rows.append(row)
                if progress:
                    progress(f"question {i + 1}/{len(questions)}")
        finally:
            browser.close()
    for r in rows:
        if r["status"] == 200:
            r["above_server_ms"] = round(float(r["ttft_ms"]) - float(r["api_ttft_ms"]), 1)
    page_rows = [r for r in rows if r["how"] == "page" and r["status"] == 200]
    api_rows = [r for r in rows if r["how"] == "api" and r["status"] == 200]
    return {
        "bench": "page",
        "config": {"url": url, "questions": len(questions), "max_tokens": max_tokens, "keyed": bool(key)},
        "rows": rows,
        "summary": {
            "page_ttft_ms_p50": _median(page_rows, "ttft_ms"),
            "page_server_ttft_ms_p50": _median(page_rows, "api_ttft_ms"),
            "api_ttft_ms_p50": _median(api_rows, "api_ttft_ms"),
            "api_client_ttft_ms_p50": _median(api_rows, "ttft_ms"),
            "page_above_server_ms_p50": _median(page_rows, "above_server_ms"),
            "api_client_above_server_ms_p50": _median(api_rows, "above_server_ms"),
            "errors": sum(1 for r in rows if r["status"] != 200),
        },
    }


def run(h: Harness, corpus: Path, include: Sequence[str], questions: Path, *, index: Optional[Path] = None,
        max_tokens: int = 32, chromium: Optional[Path] = None, model: Optional[Path] = None) -> dict[str, object]:
    """``rag bench page``: ``corpus`` indexed, a server over it (no rate
    limit) on 127.0.0.1, every question of ``questions`` asked through the
    page and through the API (:func:`bench_page`). A RagError, before
    anything starts, if no Chromium or no Playwright is found."""
    from ..service import LoopbackServer, ServiceSettings, create_app

    browser = find_chromium(chromium)
    if browser is None:
        raise RagError("no Chromium found: apt-get install chromium, or pass --chromium PATH")
    try:
        import playwright  # noqa: F401
    except ImportError:
        raise RagError("bench page drives Chromium with Playwright: pip install playwright "
                       "(no `playwright install`: it uses the Chromium above)") from None
    qs = [q.question for q in setup.questions_of(questions)]
    with tempfile.TemporaryDirectory(prefix="rag-bench-page-") as tmp:
        pipeline = setup.bench_pipeline(h, corpus, include, index, model, conversations=Path(tmp) / "c.sqlite",
                                        kv_dir=False)
        pipeline.prepare()
        server = LoopbackServer(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0)))
        try:
            return bench_page(server.url, qs, chromium=browser, max_tokens=max_tokens, progress=h.line)
        finally:
            server.stop()
            pipeline.close()


def main() -> None:
    """``python -m rag.bench.page``: ``rag bench page`` on its own."""
    setup.command_alone("page")


if __name__ == "__main__":
    main()
