"""The web page in a real headless browser: Debian's Chromium driven by
Playwright (no browser download), against a real server on 127.0.0.1 that
started with no index, the real model answering. Screenshots are saved
under pytest's temporary folder (artifacts, not part of the repository)."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from rag import Pipeline
from rag.service import LoopbackServer, ServiceSettings, create_app
from rag.service.page_driver import CHROMIUM_ARGS, find_chromium, open_page
from tests.support.samples import make_pdf

from .conftest import CORPUS, write_corpus

CHROMIUM = find_chromium()
KEY = "browser-key"
# A shell instruction in the page's text: a command in backticks, a rag subcommand, pip.
COMMAND = re.compile(r"`|\brag (ingest|ask|search|serve|server|chat|calibrate|doctor|bench)\b|pip install")
PDF = make_pdf(["The first page talks about llamas.", "The second page talks about alpacas."])

pytestmark = [
    pytest.mark.model,
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary: `apt-get install chromium` (.ci/run does)"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedder, backend):
    """A keyed server over an index that does not exist yet, as `rag serve` starts."""
    root = tmp_path_factory.mktemp("web")
    p = Pipeline.open(root / "index", embedder=embedder, backend=backend, conversations=root / "c.sqlite")
    p.prepare(need_index=False)
    s = LoopbackServer(create_app(p, ServiceSettings(api_keys=[KEY])))  # the default limits, as `rag serve` has
    yield s
    s.stop()
    p.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture
def page(browser, server):
    """The page in a new tab, past its key prompt (it loads without a key, then asks for one)."""
    errors: list[str] = []
    p = open_page(browser, server.url, KEY, errors, viewport={"width": 1280, "height": 900})
    yield p
    p.context.close()
    assert not errors, errors  # no script failed on the way


def _api(server, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", headers={"Authorization": f"Bearer {KEY}"}, timeout=120, **kw)


def _drop(page, files: dict[str, bytes | str]) -> None:
    """Drop ``files`` on the drop zone, as a drag from the desktop does."""
    page.evaluate(
        """(files) => {
            const data = new DataTransfer();
            for (const [name, content] of Object.entries(files)) data.items.add(new File([content], name));
            const drop = document.getElementById("drop");
            drop.dispatchEvent(new DragEvent("dragover", {dataTransfer: data, bubbles: true, cancelable: true}));
            drop.dispatchEvent(new DragEvent("drop", {dataTransfer: data, bubbles: true, cancelable: true}));
        }""",
        {k: v if isinstance(v, str) else v.decode("latin-1") for k, v in files.items()},
    )


def _watch_answer(page) -> None:
    """Record what the newest turn showed each time it changed, to see the answer stream in."""
    page.evaluate(
        """() => {
            window.seen = [];
            new MutationObserver(() => {
                const turn = [...document.querySelectorAll(".turn")].pop();
                if (turn) window.seen.push([turn.dataset.state, turn.querySelector(".answer-text").textContent.length]);
            }).observe(document.getElementById("thread"), {subtree: true, childList: true, characterData: true,
                                                          attributes: true});
        }""")


def _ask(page, question: str) -> None:
    page.fill("#question", question)
    page.click("#ask-button")
    page.wait_for_selector(".turn:last-child[data-state=done]", timeout=120_000)


def test_upload_ask_stream_open_the_source_and_see_the_costs(page, server, shots):
    _drop(page, {"cooking.rst": CORPUS["guide/cooking.rst"], "decode.txt": CORPUS["decode.txt"],
                 "blob.txt": bytes(range(256)) * 4})
    page.wait_for_selector("#uploads li.failed .error")
    assert "blob.txt" in page.inner_text("#uploads li.failed .error")  # its one-line reason, from the server
    page.wait_for_function("() => document.querySelectorAll('#document-list li').length === 2")
    listed = {d["source"]: d["chunks"] for d in _api(server, "GET", "/v1/documents").json()["documents"]}
    for name, chunks in listed.items():
        row = page.locator("#document-list li", has_text=name)
        assert row.locator(".doc-chunks").inner_text() == f"{chunks} chunk{'s' if chunks != 1 else ''}"
    page.screenshot(path=str(shots / "1-uploaded.png"), full_page=True)

    _watch_answer(page)
    _ask(page, "How long should bread dough rise?")
    seen = page.evaluate("window.seen")
    final = page.inner_text(".turn:last-child .answer-text")
    streaming = [n for state, n in seen if state == "streaming" and n > 0]
    assert streaming and min(streaming) < len(final), seen  # text showed before the answer was whole
    assert int(page.get_attribute(".turn:last-child", "data-pieces")) >= 2
    sources = page.locator(".turn:last-child .sources li")
    assert any("cooking.rst" in text for text in sources.all_inner_texts())
    page.screenshot(path=str(shots / "2-answer.png"), full_page=True)

    page.locator(".turn:last-child .source-link", has_text="cooking.rst").first.click()
    mark = page.wait_for_selector("#viewer[open] mark#passage")
    passage = mark.inner_text()
    assert len(passage) > 20 and passage.strip() in CORPUS["guide/cooking.rst"]
    assert mark.is_visible()
    page.screenshot(path=str(shots / "3-source.png"))
    page.keyboard.press("Escape")
    page.wait_for_selector("#viewer:not([open])", state="attached")

    # The evidence, shown above the answer, opens its source at the sentence, highlighted.
    quote = page.locator(".turn:last-child blockquote.evidence q").first.inner_text()
    assert quote and " ".join(quote.split()) in " ".join(CORPUS["guide/cooking.rst"].split())
    page.locator(".turn:last-child .evidence-link").first.click()
    strong = page.wait_for_selector("#viewer[open] mark#passage mark#evidence")
    assert " ".join(strong.inner_text().split()) == " ".join(quote.split()) and strong.is_visible()
    page.screenshot(path=str(shots / "3b-evidence.png"))
    page.keyboard.press("Escape")
    page.wait_for_selector("#viewer:not([open])", state="attached")

    assert page.is_visible("#why-body")
    figure = lambda name: page.inner_text(f'#why-figures dd[data-figure="{name}"]')  # noqa: E731
    assert int(figure("prompt tokens")) == int(figure("cached")) + int(figure("prefilled"))
    assert re.fullmatch(r"\d+\.\d\d s", figure("TTFT in this page"))
    assert page.locator("#tokens-chart svg rect").count() >= 1
    assert page.locator("#ttft-chart svg .marker").count() >= 2  # predicted and measured at least
    rows = page.locator("#decisions tbody tr")
    assert rows.count() >= 1 and rows.filter(has_text="chosen").count() >= 1
    assert page.locator("#passages-chart svg circle").count() >= 1
    page.click("#profile-refresh")
    view = _api(server, "GET", "/v1/profile").json()
    page.wait_for_function(f"() => document.querySelectorAll('#profile-chart svg circle').length === {len(view['points'])}")
    page.locator("#why").screenshot(path=str(shots / "4-why-it-was-fast.png"))


def test_a_pdf_source_opens_at_its_page_in_the_browser_viewer(page, server):
    page.set_input_files("#file-input", files=[{
        "name": "animals.pdf", "mimeType": "application/pdf",
        "buffer": PDF}])
    page.wait_for_selector("#document-list li:has-text('animals.pdf')")
    _ask(page, "What does the page about alpacas say?")
    link = page.locator(".turn:last-child .source-link", has_text="animals.pdf").first
    page_number = re.search(r"page (\d+)", link.inner_text()).group(1)
    link.click()
    frame = page.wait_for_selector("#viewer[open] iframe.pdf")
    src = frame.get_attribute("src")
    assert src.startswith("blob:") and src.endswith(f"#page={page_number}")
    assert frame.get_attribute("data-type") == "application/pdf"  # what the server sent, shown by the PDF viewer
    assert int(frame.get_attribute("data-bytes")) == len(PDF)
    page.keyboard.press("Escape")


def test_conversations_continue_list_and_reset(page, server, shots):
    if page.locator("#document-list li").count() == 0:
        page.set_input_files("#file-input", files=[{"name": "decode.txt", "mimeType": "text/plain",
                                                     "buffer": CORPUS["decode.txt"].encode()}])
        page.wait_for_selector("#document-list li")
    page.select_option("#session-select", "new")
    _ask(page, "What limits decode?")
    session = page.eval_on_selector("#session-select", "s => s.value")
    assert session.startswith("web-")
    page.wait_for_selector(f'#session-list li[data-session="{session}"]')
    _ask(page, "And what does it re-read?")
    assert page.locator("#thread .turn").count() == 2
    page.reload()
    page.wait_for_selector(f'#session-list li[data-session="{session}"]')
    assert "2 turns" in page.inner_text(f'#session-list li[data-session="{session}"]')
    page.click(f'#session-list li[data-session="{session}"] button:has-text("Continue")')
    page.wait_for_function("() => document.querySelectorAll('#thread .turn').length === 2")
    assert page.locator("#thread .turn .question").all_inner_texts()[0].endswith("What limits decode?")
    page.screenshot(path=str(shots / "5-conversation.png"), full_page=True)
    page.click(f'#session-list li[data-session="{session}"] button:has-text("Reset")')
    page.wait_for_selector(f'#session-list li[data-session="{session}"]', state="detached")
    assert _api(server, "GET", f"/v1/sessions/{session}").status_code == 404


def test_keyboard_only_at_a_phone_width_in_dark_mode(browser, server, shots):
    context = browser.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark")
    page = context.new_page()
    try:
        page.goto(f"{server.url}/")
        page.wait_for_selector("#key-dialog[open]")
        page.keyboard.type(KEY)  # the key field has the focus
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.querySelectorAll('#document-list li').length > 0")
        for _ in range(12):  # Tab from the top of the page to the question
            if page.evaluate("document.activeElement.id") == "question":
                break
            page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.id") == "question"
        page.keyboard.type("What limits decode?")
        page.keyboard.press("Enter")
        page.wait_for_selector(".turn[data-state=done]", timeout=120_000)
        assert page.evaluate("document.activeElement.id") == "question"  # ready for the next one
        page.focus(".turn .source-link")
        page.keyboard.press("Enter")
        page.wait_for_selector("#viewer[open] mark#passage")
        page.keyboard.press("Escape")
        page.wait_for_selector("#viewer:not([open])", state="attached")
        page.wait_for_timeout(300)  # the charts are drawn again for the narrow width
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 390  # nothing wider than the phone
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert sum(int(c) for c in re.findall(r"\d+", background)[:3]) < 3 * 60, background  # dark
        page.screenshot(path=str(shots / "6-phone-dark.png"), full_page=True)
    finally:
        context.close()


def _refuse_first(page, path: str, method: str, retry_after: str = "1") -> list[int]:
    """Answer the page's first ``method`` call to ``path`` 429 with
    Retry-After, pass the rest on to the server; the statuses it saw."""
    seen: list[int] = []

    def handle(route):
        if route.request.method != method:
            return route.continue_()
        if not seen:
            seen.append(429)
            return route.fulfill(status=429, headers={"Retry-After": retry_after}, content_type="application/json",
                                 body='{"error": {"message": "2 questions in flight from this caller", '
                                      '"type": "rate_limited"}}')
        seen.append(0)  # passed on
        return route.continue_()

    page.route(f"**{path}", handle)
    return seen


def test_the_page_waits_out_a_429_and_tries_again_for_uploads_and_questions(page, server):
    uploads = _refuse_first(page, "/v1/documents", "POST")
    page.set_input_files("#file-input", files=[{"name": "retried.txt", "mimeType": "text/plain",
                                                 "buffer": CORPUS["decode.txt"].encode()}])
    page.wait_for_selector("#document-list li:has-text('retried.txt'), #uploads li.failed")
    assert page.locator("#uploads li.failed").count() == 0, page.inner_text("#uploads")
    assert uploads == [429, 0]  # refused once, sent again after its Retry-After
    asks = _refuse_first(page, "/v1/ask", "POST")
    page.fill("#question", "What limits decode?")
    page.click("#ask-button")
    page.wait_for_selector(".turn:last-child:is([data-state=done], [data-state=failed])", timeout=120_000)
    assert page.get_attribute(".turn:last-child", "data-state") == "done", page.inner_text(".turn:last-child")
    assert asks == [429, 0]


def test_twenty_files_dropped_on_the_page_are_all_indexed(page, server):
    names = {f"drop{i:02}.md": f"# Drop {i}\n\nNote {i} is about llamas.\n" for i in range(20)}
    _drop(page, names)
    page.wait_for_function(
        """(names) => document.querySelector('#uploads li.failed') || names.every((n) =>
               [...document.querySelectorAll('#document-list .doc-name')].some((e) => e.textContent === n))""",
        arg=list(names), timeout=300_000)
    assert page.locator("#uploads li.failed").count() == 0, page.inner_text("#uploads")
    listed = {d["source"] for d in _api(server, "GET", "/v1/documents").json()["documents"]}
    assert set(names) <= listed


@contextlib.contextmanager
def _own_server(root: Path, embedder, backend, conversations: Path | None = None) -> Iterator[LoopbackServer]:
    """A keyed server of its own over the index ``root / "index"`` (none yet, unless built before)."""
    p = Pipeline.open(root / "index", embedder=embedder, backend=backend,
                      conversations=conversations or root / "c.sqlite")
    p.prepare(need_index=False)
    s = LoopbackServer(create_app(p, ServiceSettings(api_keys=[KEY])))
    try:
        yield s
    finally:
        s.stop()
        p.close()


def test_a_question_asked_while_the_first_upload_is_indexed_waits_for_it(browser, tmp_path, embedder, backend, shots):
    with _own_server(tmp_path, embedder, backend) as server:
        errors: list[str] = []
        page = open_page(browser, server.url, KEY, errors, viewport={"width": 1280, "height": 900})
        try:
            held = []  # the upload, held in the browser until the question is asked: the worst case
            page.route("**/v1/documents", lambda route: held.append(route) if route.request.method == "POST"
                       else route.continue_())
            _drop(page, {"owls.md": "# Owls\n\nOwls hunt at night and sleep through the day.\n"})
            page.fill("#question", "When do owls hunt?")
            page.click("#ask-button")  # at once: no document is indexed yet
            waiting = page.wait_for_selector(".turn:last-child .waiting")
            assert "owls.md" in waiting.inner_text() and "to be indexed" in waiting.inner_text()
            page.screenshot(path=str(shots / "7-asked-while-indexing.png"), full_page=True)
            for _ in range(100):  # the route's handler runs while Playwright waits
                if held:
                    break
                page.wait_for_timeout(50)
            assert len(held) == 1
            held[0].continue_()
            page.wait_for_selector(".turn:last-child:is([data-state=done], [data-state=failed])", timeout=120_000)
            assert page.get_attribute(".turn:last-child", "data-state") == "done", page.inner_text(".turn:last-child")
            assert "owls.md" in " ".join(page.locator(".turn:last-child .sources li").all_inner_texts())
            assert page.locator(".turn .waiting").count() == 0  # gone once the answer began
            page.wait_for_selector("#document-list li:has-text('owls.md')")
            text = page.inner_text("body")
            assert not COMMAND.search(text), COMMAND.search(text)
        finally:
            page.context.close()
        assert not errors, errors


def test_the_conversations_panel_lists_only_the_conversations_of_the_index_served(browser, tmp_path, embedder,
                                                                                  backend):
    store = tmp_path / "shared.sqlite"  # one conversation store, two indexes: A's is asked in process
    other = Pipeline.open(tmp_path / "a" / "index", embedder=embedder, backend=backend, conversations=store)
    try:
        other.ingest([write_corpus(tmp_path / "a" / "corpus", {"decode.txt": CORPUS["decode.txt"]})])
        other.ask("What limits decode?", session="asked-of-index-a", max_tokens=4)
    finally:
        other.close()
    with _own_server(tmp_path / "b", embedder, backend, store) as server:
        errors: list[str] = []
        page = open_page(browser, server.url, KEY, errors, viewport={"width": 1280, "height": 900})
        try:
            page.set_input_files("#file-input", files=[{"name": "prefill.md", "mimeType": "text/markdown",
                                                         "buffer": CORPUS["prefill.md"].encode()}])
            page.wait_for_selector("#document-list li:has-text('prefill.md')")
            page.select_option("#session-select", "new")
            _ask(page, "What does prefill read?")
            mine = page.eval_on_selector("#session-select", "s => s.value")
            page.wait_for_selector(f'#session-list li[data-session="{mine}"]')
            page.reload()  # the panel as a newcomer to this server sees it
            page.wait_for_selector(f'#session-list li[data-session="{mine}"]')
            listed = page.eval_on_selector_all("#session-list li", "items => items.map((li) => li.dataset.session)")
            assert listed == [mine]
            options = page.eval_on_selector_all("#session-select option", "os => os.map((o) => o.value)")
            assert "asked-of-index-a" not in options and "asked-of-index-a" not in page.inner_text("body")
        finally:
            page.context.close()
        assert not errors, errors


def test_the_collection_picker_shows_one_collection_and_uploads_go_to_it(page, server):
    """Issue 46: the page lists the collections the key may read; picking one
    lists its documents alone, and a file dropped then is uploaded into it."""
    r = _api(server, "POST", "/v1/documents", params={"collection": "picked"},
             files={"file": ("first.md", b"The picked collection's first note.")})
    assert r.status_code == 200, r.text
    page.reload()
    page.wait_for_selector("#collection-select option[value=picked]", state="attached")
    assert "picked (1)" in page.inner_text("#collection-select")
    page.select_option("#collection-select", "picked")
    page.wait_for_selector("#document-list li:has-text('first.md')")
    _drop(page, {"second.md": "The picked collection's second note."})
    page.wait_for_selector("#document-list li:has-text('second.md'), #uploads li.failed", timeout=120_000)
    assert page.locator("#uploads li.failed").count() == 0, page.inner_text("#uploads")
    picked = {d["source"] for d in _api(server, "GET", "/v1/documents", params={"collection": "picked"}).json()["documents"]}
    default = _api(server, "GET", "/v1/documents").json()
    assert picked == {"first.md", "second.md"}
    assert not {"first.md", "second.md"} & {d["source"] for d in default.get("documents", [])}
