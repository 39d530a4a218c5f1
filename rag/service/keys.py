"""Who holds a request's key, and what it may do in which collection.

``RAG_SERVE_KEYS_FILE`` names a TOML (``.toml``) or JSON file of keys, each
with its holder and its rights per collection (``"*"``: every collection)::

    [keys.alice]
    sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    collections = { handbook = "write", board = "read" }

``read`` is searching and asking; ``write`` is also uploading and deleting
documents, and creating and deleting the collection. ``RAG_SERVE_API_KEYS``
keys stay what they were: each may do everything.

A holder's name is 1 to 64 characters of letters, digits, ``.``, ``_``,
``@`` and ``-``, starting with a letter or digit (:func:`check_holder`):
never empty and never with a space, so never the name of the plain keys
(``key 1``...) or of the local user, whose conversations are theirs alone.

Keys are stored as their SHA-256, never as themselves. They are random
tokens of 256 bits (``rag keys new``), not passwords a person chose: no
guess finds one, so a slow password hash (bcrypt, scrypt, Argon2) would
protect nothing more and would add its tens of milliseconds to every
request's time to first token. A leaked key file then gives no key.

Does not: decide the status of a refused request (``gate`` and the routes
do: 404 where the key may not read, 403 where it may read but not write).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping

from ..errors import RagError
from ..index.collection_names import EVERY_COLLECTION_NAME, check_collection_name

Right = Literal["read", "write"]
EVERY_COLLECTION = EVERY_COLLECTION_NAME
_HEX = re.compile(r"^[0-9a-f]{64}$")
HOLDER_CHARS = 64
# Letters, digits and the marks of a user or e-mail name; no space, so no holder is "key 1" or "local user".
_HOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,%d}" % (HOLDER_CHARS - 1))


def check_holder(holder: object, where: str) -> str:
    """``holder`` if it can name a key's holder (1 to 64 of ``A-Z a-z 0-9 .
    _ @ -``, starting with a letter or digit); else a RagError saying so
    after ``where`` (which names the holder)."""
    if not isinstance(holder, str) or not _HOLDER.fullmatch(holder):
        raise RagError(f"{where}: a holder's name is 1 to {HOLDER_CHARS} letters, digits, '.', '_', '@' or '-', "
                       "starting with a letter or digit")
    return holder


def key_hash(key: str) -> str:
    """The SHA-256 of ``key`` as the key file stores it (lowercase hex)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> tuple[str, str]:
    """A new random key (256 bits, URL-safe) and its hash for the key file."""
    key = "rag_" + secrets.token_urlsafe(32)
    return key, key_hash(key)


@dataclass(frozen=True)
class Caller:
    """A key's holder and its rights: ``rights`` per collection, or every
    right on every collection (``everything``: a plain API key, the local
    user over stdio or the resident server's socket)."""

    holder: str
    rights: Mapping[str, Right] = field(default_factory=dict)
    everything: bool = False

    def right(self, collection: str) -> Right | None:
        """What this caller may do in ``collection``: "write", "read" or None."""
        if self.everything:
            return "write"
        return self.rights.get(collection) or self.rights.get(EVERY_COLLECTION)

    def may_read(self, collection: str) -> bool:
        """Whether it may search and ask in ``collection``."""
        return self.right(collection) is not None

    def may_write(self, collection: str) -> bool:
        """Whether it may also upload and delete in ``collection``."""
        return self.right(collection) == "write"


LOCAL_USER = Caller("local user", everything=True)


class KeyRing:
    """The keys a service accepts, by their hash."""

    def __init__(self, entries: Mapping[str, Caller]) -> None:
        self._by_hash = dict(entries)

    def __len__(self) -> int:
        return len(self._by_hash)

    @classmethod
    def plain(cls, keys: list[str]) -> "KeyRing":
        """``RAG_SERVE_API_KEYS``: every key may do everything (holders ``key 1``, ``key 2``...)."""
        return cls({key_hash(k): Caller(f"key {i}", everything=True) for i, k in enumerate(keys, start=1)})

    @classmethod
    def read(cls, path: Path) -> "KeyRing":
        """The keys of a TOML or JSON key file; a RagError naming the file and what is wrong."""
        try:
            text = Path(path).read_text(encoding="utf-8")
            raw = tomllib.loads(text) if Path(path).suffix.lower() == ".toml" else json.loads(text)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise RagError(f"cannot read the key file {path}: {exc}") from None
        keys = raw.get("keys") if isinstance(raw, dict) else None
        if not isinstance(keys, dict) or not keys:
            raise RagError(f"the key file {path} names no keys: write a [keys.HOLDER] table for each")
        entries: dict[str, Caller] = {}
        for holder, entry in keys.items():
            where = f"the key file {path}, keys.{holder}"
            # Quoted: an empty or spaced name must show as what the file says.
            check_holder(holder, f"the key file {path}, keys.{json.dumps(holder)}")
            if not isinstance(entry, dict):
                raise RagError(f"{where}: not a table")
            digest = str(entry.get("sha256", "")).lower()
            if not _HEX.match(digest):
                raise RagError(f"{where}: sha256 must be the 64 hex digits of the key's SHA-256 "
                               "(rag keys new makes a key and prints it)")
            if digest in entries:
                raise RagError(f"{where}: the same key as {entries[digest].holder}")
            rights = entry.get("collections", {})
            if not isinstance(rights, dict) or any(r not in ("read", "write") for r in rights.values()):
                raise RagError(f"{where}: collections maps each collection (or \"*\") to \"read\" or \"write\"")
            for name in rights:
                if name != EVERY_COLLECTION:
                    check_collection_name(name, where)
            entries[digest] = Caller(str(holder), dict(rights))
        return cls(entries)

    def merged(self, other: "KeyRing") -> "KeyRing":
        """These keys and ``other``'s (a key in both keeps ``other``'s rights)."""
        return KeyRing({**self._by_hash, **other._by_hash})

    def caller(self, presented: str) -> Caller | None:
        """The caller whose key is ``presented``, or None. Every stored hash
        is compared, in constant time, so the time taken says nothing of
        which key came close."""
        digest = key_hash(presented).encode("ascii")
        found = None
        for stored, caller in self._by_hash.items():
            if hmac.compare_digest(digest, stored.encode("ascii")):
                found = caller
        return found
