"""Where the resident server of a set-up lives.

A set-up is what a server loads: the index (or the sample corpus), the
model, the engine options, the folders of conversations and caches, and the
code that serves it. Its *key* is a hash of those settings, resolved as any
shell would resolve them, so two shells with the same set-up find the same
server and a server of another set-up is never reused by mistake. Values
each request carries itself (the TTFT target, the retrieval mode) are not
part of it.

In the user's runtime folder (private: mode 0700, owned by the user), each
key has

    KEY.sock    the server's Unix socket (mode 0600)
    KEY.lock    held (flock) by the server while it lives; holds its pid
    KEY.start   held by the one client starting it, so two shells start one
    KEY.log     the server's output (its errors say why it did not start)

Does not: start, serve or talk to a server (``client`` and ``server`` do).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import RagError
from ..index.location import folder_of, index_exists
from ..settings import Settings

PROTOCOL = 1  # bumped whenever what a client and a server say to each other changes
SETTINGS_VARIABLE = "RAG_RESIDENT_SETTINGS"  # the resolved settings, as JSON, from the client to the server it starts
EXIT_ALREADY_RUNNING = 3  # a server's exit status when one of its key already lives
CODE = Path(__file__).resolve().parent.parent  # the rag package that serves: another checkout is another set-up
# Settings that do not decide what a server loads: each request carries its own, or only the client reads them.
PER_REQUEST = {name: Settings.model_fields[name].default for name in ("target_ttft", "retrieval", "max_file_mb", "no_server")}
NOT_IN_KEY = ("server_idle_s", "runtime_dir")
SOCKET_PATH_MAX = 107  # bytes in sockaddr_un.sun_path, less its final NUL


def _model(model: Path | None) -> Path | None:
    """A model file made absolute; a packaged model's name as it is."""
    from engine.models import PACKAGED_MODELS

    return None if model is None else model if str(model) in PACKAGED_MODELS else model.resolve()


def server_settings(settings: Settings) -> Settings:
    """``settings`` as the resident server runs them, the same from any
    shell: every folder absolute and explicit, the model file absolute, and
    the values each request carries at their defaults."""
    resolved = {
        "index": _resolved_index(settings.index),
        "model": _model(settings.model),
        "data_dir": settings.data_folder.resolve(),
        "cache_dir": settings.cache_folder.resolve(),
        "conversations": _resolved_conversations(settings.conversations_path),
        "runtime_dir": settings.runtime_folder.resolve(),
    }
    return settings.model_copy(update=resolved | PER_REQUEST)


def _resolved_conversations(store):
    """A conversation file made absolute; a database URL as it is."""
    return store if isinstance(store, str) else Path(store).resolve()


def _resolved_index(index):
    """An index folder made absolute; a database URL (or None) as it is."""
    folder = folder_of(index) if index is not None else None
    return folder.resolve() if folder is not None else index


def settings_key(settings: Settings) -> str:
    """The key of the set-up ``settings`` describe: 16 hex digits of a hash
    over the resolved settings that decide what a server loads, whether it
    answers from the sample corpus (no index built yet), the protocol and
    the code's location. The same settings give the same key, resolved
    again or not."""
    resolved = server_settings(settings)
    identity = resolved.model_dump(mode="json", exclude=set(NOT_IN_KEY))
    identity["sample"] = resolved.index is None and not index_exists(resolved.index_folder)
    identity["protocol"], identity["code"] = PROTOCOL, str(CODE)
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def private_folder(folder: Path) -> Path:
    """``folder``, created with mode 0700 if missing; a RagError if another
    user owns it or others may enter it (a socket there could be theirs)."""
    try:
        with contextlib.suppress(FileExistsError):  # a file there is refused below, as not a folder
            folder.mkdir(mode=0o700, parents=True)
        info = folder.lstat()
    except OSError as exc:
        raise RagError(f"cannot create the runtime folder {folder}: {exc.strerror}; set RAG_RUNTIME_DIR to a "
                       "folder of your own, or use --no-server") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise RagError(f"{folder} is not a folder of yours; set RAG_RUNTIME_DIR to one, or use --no-server")
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)  # ours, only too open: close it rather than refuse
    return folder


@dataclass(frozen=True)
class Address:
    """Where the server of one set-up (``key``) lives, in ``folder``."""

    folder: Path
    key: str

    @classmethod
    def of(cls, settings: Settings) -> "Address":
        """The address of the server for ``settings``, its folder made private;
        a RagError when the socket's path would be too long for the system."""
        address = cls(private_folder(settings.runtime_folder), settings_key(settings))
        if len(os.fsencode(address.socket)) > SOCKET_PATH_MAX:
            raise RagError(f"the socket path {address.socket} is over {SOCKET_PATH_MAX} bytes; "
                           "set RAG_RUNTIME_DIR to a shorter folder")
        return address

    @classmethod
    def every(cls, settings: Settings) -> list["Address"]:
        """The addresses of every server that ever lived in the runtime folder of ``settings``."""
        folder = private_folder(settings.runtime_folder)
        return [cls(folder, p.stem) for p in sorted(folder.glob("*.lock"))]

    @property
    def socket(self) -> Path:
        return self.folder / f"{self.key}.sock"

    @property
    def lock(self) -> Path:
        return self.folder / f"{self.key}.lock"

    @property
    def start_lock(self) -> Path:
        return self.folder / f"{self.key}.start"

    @property
    def log(self) -> Path:
        return self.folder / f"{self.key}.log"

    def alive(self) -> bool:
        """Whether a server process of this key lives (it holds the lock),
        whether or not it answers yet."""
        with _open_lock(self.lock) as fd:
            try:  # shared: two clients asking at once both learn the truth
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False

    def pid(self) -> int | None:
        """The pid the last server of this key wrote into its lock file."""
        try:
            text = self.lock.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return int(text) if text.isdigit() else None


@contextlib.contextmanager
def _open_lock(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def held(path: Path, *, wait_s: float | None = None, what: str = "lock",
         patience_s: float = 0.0) -> Iterator[int | None]:
    """Hold the flock of ``path`` for the block and yield its descriptor;
    ``wait_s`` None: yield None when another process still holds it after
    ``patience_s`` (a client's :meth:`Address.alive` holds it for an instant),
    else wait up to ``wait_s`` seconds for it (a RagError after that)."""
    while True:  # again when a sweep removed the file between its opening and its locking
        with _held_once(path, wait_s=wait_s, what=what, patience_s=patience_s) as fd:
            if fd is None or _same_file(fd, path):
                yield fd
                return


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not one removed since it was opened)."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _held_once(path: Path, *, wait_s: float | None, what: str, patience_s: float) -> Iterator[int | None]:
    with _open_lock(path) as fd:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        patient_until = time.monotonic() + patience_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is None and time.monotonic() >= patient_until:
                    yield None
                    return
                if deadline is None:
                    time.sleep(0.02)
                    continue
                if time.monotonic() > deadline:
                    raise RagError(f"waited {wait_s:.0f} s for the {what} {path}; another rag is holding it") from None
                time.sleep(0.05)
        try:
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def sweep_stale(folder: Path, keep: str | None = None) -> list[str]:
    """Remove the socket, lock and start files that servers killed without
    a chance to clean up left in the runtime ``folder`` (all but ``keep``'s):
    those of a key whose lock no process holds and that no client is
    starting; the keys swept. Each lock file is removed while held, and
    :func:`held` locks again a file removed under it, so a server starting
    meanwhile never holds a lock file that is gone."""
    swept = []
    for lock in sorted(Path(folder).glob("*.lock")):
        address = Address(Path(folder), lock.stem)
        if address.key == keep:
            continue
        with held(address.start_lock) as starting:
            if starting is None:
                continue  # a client is starting this server
            with held(address.lock) as fd:
                if fd is None:
                    continue  # a server lives
                address.socket.unlink(missing_ok=True)
                address.lock.unlink(missing_ok=True)
            address.start_lock.unlink(missing_ok=True)
        swept.append(address.key)
    return swept
