"""The command line's side of the resident server: find the server of this
set-up, or start one in the background and wait until it answers, then ask,
search and keep conversations through it over its Unix socket, offering the
part of :class:`~rag.qa.pipeline.Pipeline` that ``rag ask``, ``rag chat``
and ``rag search`` use, so they print the same thing either way.

Does not: import the index, the engine, numpy or the models (a question
through a running server imports none of them; ``search`` imports the
index's ``Hit``, and numpy with it); serve (``server`` does).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Generator, Iterator

import httpx

from ..conversations.store import Conversation, Turn
from ..errors import RagError
from ..qa.answer import Answer
from ..qa.options import AskOptions
from ..qa.stream import AnswerStream
from ..retrieval.scope import Scope
from ..settings import Settings
from .address import CODE, EXIT_ALREADY_RUNNING, SETTINGS_VARIABLE, Address, held, server_settings

START_WAIT_S = 900  # a first start may index the sample corpus; Ctrl-C ends the wait sooner
PROBE = httpx.Timeout(30.0, connect=5.0)
ANSWER = httpx.Timeout(None, connect=5.0)  # an answer takes as long as it takes; Ctrl-C stops it


def _http(address: Address, timeout: httpx.Timeout = PROBE) -> httpx.Client:
    # Plain HTTP over a Unix socket: no TLS, so no certificates to load (loading them took 70-110 ms here).
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(address.socket), verify=False), base_url="http://rag",
                        timeout=timeout)


def probe(address: Address) -> dict | None:
    """The status of the server at ``address`` (``GET /v1/resident``), or
    None when none answers there: no socket, or a stale one (refused)."""
    if not address.socket.exists():
        return None
    try:
        with _http(address) as http:
            r = http.get("/v1/resident")
    except (httpx.ConnectError, httpx.RemoteProtocolError):
        return None
    except httpx.TransportError as exc:
        pid = address.pid()
        raise RagError(f"the rag server{f' (pid {pid})' if pid else ''} at {address.socket} does not answer "
                       f"({type(exc).__name__}); stop it with `rag server stop`, or use --no-server") from None
    return r.json() if r.status_code == 200 else None


def ensure_running(address: Address, settings: Settings, notice: Callable[[str], None]) -> dict:
    """The status of the server at ``address``, started in the background
    first if none runs (one client starts it while the others wait for it);
    a RagError saying why when it cannot start."""
    info = probe(address)
    if info is not None:
        return info
    with held(address.start_lock, wait_s=START_WAIT_S, what="start lock"):
        info = probe(address)
        if info is not None:
            return info
        process = None
        if not address.alive():  # nobody holds the server's lock: whatever socket is left is stale
            with contextlib.suppress(FileNotFoundError):
                address.socket.unlink()
            process = _spawn(address, settings)
        info = _wait_ready(address, process)
    for line in _log_lines(address):
        if line.startswith("note: "):
            notice(line.removeprefix("note: "))
    return info


def _spawn(address: Address, settings: Settings) -> subprocess.Popen:
    env = dict(os.environ)
    env[SETTINGS_VARIABLE] = server_settings(settings).model_dump_json()
    # The server runs this very code, wherever it was imported from.
    env["PYTHONPATH"] = os.pathsep.join([str(CODE.parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    fd = os.open(address.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        return subprocess.Popen([sys.executable, "-m", "rag.resident.server", address.key], env=env,
                                stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd=address.folder,
                                start_new_session=True)  # its own session: Ctrl-C in this shell does not reach it
    finally:
        os.close(fd)


def _wait_ready(address: Address, process: subprocess.Popen | None) -> dict:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        info = probe(address)
        if info is not None:
            return info
        if process is not None and process.poll() is not None:
            if process.returncode != EXIT_ALREADY_RUNNING:
                raise _start_failure(address, process.returncode)
            process = None  # another one is starting: wait for it
        elif process is None and not address.alive():
            raise _start_failure(address, None)
        time.sleep(0.05)
    raise RagError(f"the rag server did not answer within {START_WAIT_S} s; its log: {address.log}")


def _log_lines(address: Address) -> list[str]:
    try:
        return address.log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _start_failure(address: Address, status: int | None) -> RagError:
    errors = [line.removeprefix("error: ") for line in _log_lines(address) if line.startswith("error: ")]
    if errors:
        return RagError(errors[-1])
    how = f"exited with status {status}" if status is not None else "stopped"
    return RagError(f"the rag server {how} while starting; its log: {address.log}")


def _error(response: httpx.Response) -> RagError:
    """The one-line error a failed response carries (the service's JSON errors)."""
    try:
        return RagError(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return RagError(f"the rag server answered {response.status_code}; its log may say why")


class ResidentClient:
    """A running resident server, used like the parts of a Pipeline that the
    question commands use: :meth:`stream`, :meth:`search`,
    :meth:`conversation`, :meth:`reset`, :attr:`background_log`."""

    via = "server"

    def __init__(self, address: Address, settings: Settings, info: dict) -> None:
        self.address, self.settings, self.info = address, settings, info
        self.server_pid: int = info["pid"]
        self._http = _http(address, ANSWER)
        self._sessions: set[str] = set()  # the conversations this client asked in

    @classmethod
    def connect(cls, settings: Settings, notice: Callable[[str], None] = lambda message: None) -> "ResidentClient":
        """The server of the set-up ``settings`` describe, started if none
        runs; ``notice`` is told what it noted while starting."""
        address = Address.of(settings)
        return cls(address, settings, ensure_running(address, settings, notice))

    @contextlib.contextmanager
    def _request(self, method: str, path: str, **kwargs) -> Iterator[httpx.Response]:
        try:
            with self._http.stream(method, path, **kwargs) as response:
                yield response
        except httpx.TransportError as exc:
            raise RagError(f"the rag server (pid {self.server_pid}) stopped answering ({type(exc).__name__}); "
                           f"its log: {self.address.log}; try again, or use --no-server") from None

    def _json(self, method: str, path: str, **kwargs) -> tuple[int, dict]:
        with self._request(method, path, **kwargs) as r:
            r.read()
        if r.status_code >= 400 and r.status_code != 404:
            raise _error(r)
        return r.status_code, r.json()

    # -- what the question commands use of a Pipeline ---------------------------

    def prepare(self) -> None:
        """Nothing to load here: the server has."""

    def stream(self, question: str, options: AskOptions) -> AnswerStream:
        """The answer to ``question``, streamed from the server as the
        pipeline's :meth:`~rag.qa.pipeline.Pipeline.stream` would give it:
        iterate for text, then read ``.answer``. Closing it early (Ctrl-C)
        hangs up, which stops the generation on the server."""
        if options.session is not None:
            self._sessions.add(options.session)
        return AnswerStream(self._answer(self._ask_body(question, options)))

    def _ask_body(self, question: str, options: AskOptions) -> dict:
        target = options.target(self.settings.target_ttft)
        body = {"question": question, "stream": True, "session": options.session, "max_tokens": options.max_tokens,
                "max_k": options.max_k, "candidates": options.candidates,
                "retrieval": options.retrieval or self.settings.retrieval}
        if options.scope != Scope():
            body["scope"] = options.scope.model_dump(mode="json")
        return body | ({"no_target": True} if target is None else {"target_ttft_s": target})

    def _answer(self, body: dict) -> Generator[str, None, Answer]:
        with self._request("POST", "/v1/ask", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise _error(r)
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line.removeprefix("data: "))
                if "delta" in event:
                    yield event["delta"]
                elif "answer" in event:
                    return Answer.from_dict(event["answer"])
                elif "error" in event:
                    raise RagError(event["error"]["message"])
        raise RagError(f"the rag server ended the answer without its sources and timings; its log: {self.address.log}")

    def search(self, query: str, k: int = 5, *, mode: str | None = None, scope: Scope | None = None) -> list:
        """The ``k`` chunks that best match ``query``, as
        :meth:`~rag.qa.pipeline.Pipeline.search` gives them."""
        from ..index.store import Hit  # numpy comes with it; a question does not need it

        body = {"query": query, "k": k, "retrieval": mode or self.settings.retrieval}
        if scope is not None and scope != Scope():
            body["scope"] = scope.model_dump(mode="json")
        status, d = self._json("POST", "/v1/search", json=body)
        if status == 404:
            raise RagError("this rag server cannot search; stop it with `rag server stop`")
        return [Hit(**r) for r in d["results"]]

    def conversation(self, session: str) -> Conversation:
        """A view of the stored conversation ``session``: its summary and
        recent turns (the prompts they were asked with stay on the server)."""
        status, d = self._json("GET", f"/v1/sessions/{session}")
        if status == 404:
            return Conversation(session)
        turns = tuple(Turn(t["number"], t["question"], "", t["answer"], 0, tuple(t.get("sources") or ()))
                      for t in d["turns"])
        return Conversation(session, summary=d.get("summary", ""), turns=turns, folded=d.get("folded", 0))

    def reset(self, session: str) -> None:
        """Forget conversation ``session`` on the server (nothing to forget is no error)."""
        self._json("DELETE", f"/v1/sessions/{session}")

    @property
    def background_log(self) -> list[dict[str, object]]:
        """The server's latest background work (summaries, prefills) for the
        conversations this client asked in, oldest first: what a pipeline in
        this process would have logged."""
        if not self._sessions:
            return []
        log = self._json("GET", "/v1/resident/background")[1]["background"]
        return [e for e in log if e.get("session") in self._sessions]

    def background_busy(self) -> bool:
        """False: the server finishes background work on its own time."""
        return False

    def wait_idle(self) -> float:
        """Nothing to wait for here (the server keeps running)."""
        return 0.0

    def close(self) -> None:
        self._http.close()


def servers(settings: Settings) -> list[dict]:
    """The status of every server living in the runtime folder of
    ``settings``; one that lives but does not answer (yet) is
    ``{"key", "pid", "answering": False}``."""
    found = []
    for address in Address.every(settings):
        if not address.alive():
            continue
        try:
            info = probe(address)
        except RagError:
            info = None
        found.append(info | {"answering": True} if info else
                     {"key": address.key, "pid": address.pid(), "answering": False, "socket": str(address.socket)})
    return found


def stop(address: Address, wait_s: float = 60) -> int | None:
    """Stop the server at ``address`` once its answers in progress are done
    (SIGTERM when it does not answer); its pid, or None if none lived."""
    if not address.alive():
        return None
    pid = address.pid()
    try:
        with _http(address) as http:
            http.post("/v1/resident/stop")
    except httpx.TransportError:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while address.alive():
        if time.monotonic() > deadline:
            raise RagError(f"the rag server (pid {pid}) did not stop within {wait_s:.0f} s")
        time.sleep(0.05)
    return pid
