"""Finding the files an ingest reads: folders walked, globs applied, and
everything that cannot or should not be read set aside with its reason.

Globs match a file's path relative to the folder given (``/``-separated) or
its name, case-insensitively (file types are recognised case-insensitively
too, so ``*.md`` finds ``B.MD``); ``**`` matches any number of folders,
none included, so ``**/*.md`` finds the top-level files too. ``--exclude``
applies to files named directly as well. Special files (named pipes,
devices, sockets) are never opened, a symbolic link is read only when it
leads to a file inside the folder walked, files over the size limit are not read,
and a name that is not valid UTF-8 is kept under a safe spelling (its bad
bytes written as ``\\xff``); a second file whose name comes out the same
(``b"caf\\xe9.md"`` beside a file really named ``caf\\xe9.md``) is set
aside with its reason, never merged with the first.

Does not: read file contents (``run`` does) or decide what is supported
beyond the file name (``formats`` does).
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import RagError
from ..globs import compile_glob
from .formats import format_suffix, is_supported
from .formats.document import DEFAULT_MAX_FILE_BYTES

DEFAULT_EXCLUDE = (".*", "**/.*", "**/.*/**", "__pycache__/**", "**/__pycache__/**")
MAX_DOUBLE_STARS = 4  # one ** is enough to cross folders; more is a mistake (matching is linear either way)
SAME_NAME = "another file has this name once bytes that are not UTF-8 are written as \\xNN: not read; rename one"


@dataclass(frozen=True)
class SourceFile:
    """A file found for ingest: ``path`` is where it lies; ``source`` its
    name in the index (relative to ``root``, ``/``-separated, safe to print);
    ``link`` whether ``path`` is a symbolic link."""

    root: str
    source: str
    path: Path
    size: int
    link: bool = False  # a symbolic link (inside the folder walked): the only kind of path read through one


@dataclass
class FoundFiles:
    """What a walk found: the files to read, the folders walked, files set
    aside (``ignored``: not read, with the reason), paths that failed
    (``failed``: missing, unreadable), folders that could not be listed
    (their files already indexed are kept), globs that matched nothing, and
    how many files of each type that cannot be read were passed over in
    folders (``unsupported``, by lower-case suffix)."""

    files: list[SourceFile] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    unlisted: list[tuple[str, str]] = field(default_factory=list)  # (root, folder source prefix)
    unmatched: list[str] = field(default_factory=list)
    unsupported: Counter[str] = field(default_factory=Counter)


def safe_name(name: str) -> str:
    """A file system name as printable text: bytes that are not UTF-8 (which
    Python keeps as surrogates) are written as ``\\xNN``.

    ``safe_name(os.fsdecode(b"caf\\xe9.txt")) -> "caf\\\\xe9.txt"``
    """
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")


def usable_glob(glob: str) -> str:
    """``glob`` without surrounding spaces, or ValueError saying why it cannot
    be used: empty, over 1000 characters, more than ``MAX_DOUBLE_STARS``
    ``**``, or a bad character range."""
    glob = glob.strip()
    if not glob or len(glob) > 1000:
        raise ValueError("a glob must be 1 to 1000 characters, e.g. 'reports/**/*.pdf'")
    if glob.count("**") > MAX_DOUBLE_STARS:
        raise ValueError(f"{glob!r} holds more than {MAX_DOUBLE_STARS} '**'; one is enough to cross folders")
    compile_glob(glob)  # ValueError for a bad [...] set
    return glob


def matches(source: str, globs: Sequence[str]) -> str | None:
    """The first of ``globs`` that matches ``source`` (its path or its name), or None."""
    name = source.rsplit("/", 1)[-1]
    for glob in globs:
        pattern = compile_glob(glob)  # linear in the name: no backtracking (issue 27)
        if pattern.match(source) or ("/" not in glob and pattern.match(name)):
            return glob
    return None


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (both absolute, resolved)."""
    return os.path.commonpath([path, folder]) == folder


class _Walk:
    """One find_files call's state."""

    def __init__(self, include: Sequence[str], exclude: Sequence[str], max_file_bytes: int,
                 follow_links: bool = True, skip: Iterable[Path] = ()) -> None:
        try:
            self.include = tuple(usable_glob(g) for g in include)
            self.exclude = tuple(usable_glob(g) for g in exclude)
        except ValueError as exc:
            raise RagError(f"--include/--exclude: {exc}") from None
        self.max_bytes = max_file_bytes
        self.follow_links = follow_links
        self.skip = {Path(p).resolve() for p in skip}
        self.found = FoundFiles()
        self.seen: dict[tuple[str, str], Path] = {}  # (root, source) -> the file that has that name
        self.shadowed: set[Path] = set()  # files not UTF-8 whose printable name is another file's real one
        self.used: set[str] = set()  # globs that matched something

    def consider(self, root: str, source: str, path: Path, *, named: bool, within: Path | None = None) -> None:
        """Add ``path`` to the files to read, or say why it is not read.
        ``within``: the folder walked, which a symbolic link must not leave.
        A file whose (root, source) another file already has is set aside:
        two names that differ only in bytes that are not UTF-8 (written
        ``\\xNN``) and a name spelled with those escapes. Of the latter the
        one whose name is not UTF-8 is set aside, whichever comes first:
        the name in the index leads back to the other."""
        spelled = safe_name(str(path))
        if spelled != str(path) and os.path.lexists(spelled):  # not registered in seen: the other file is read
            if path not in self.shadowed:
                self.shadowed.add(path)
                self.found.ignored.append((source, SAME_NAME))
            return
        first = self.seen.setdefault((root, source), path)
        if first is not path:
            if first != path:  # not the same file named twice: another file with the same printable name
                self.found.ignored.append((source, SAME_NAME))
            return
        excluded = matches(source, self.exclude) or (not named and matches(source, DEFAULT_EXCLUDE))
        if excluded:
            self.used.add(excluded)
            return
        if self.include and not named:
            hit = matches(source, self.include)
            if hit is None:
                return
            self.used.add(hit)
        if not is_supported(path):
            if path.is_symlink() and path.is_dir():
                self.found.ignored.append((source, "a symbolic link to a folder: not followed; ingest the folder "
                                                   "it leads to instead"))
            elif named:
                self.found.ignored.append((source, f"unsupported file type {format_suffix(path.name) or '(no suffix)'}"))
            else:
                self.found.unsupported[format_suffix(path.name) or "(no suffix)"] += 1
            return
        try:
            st = os.stat(path)
        except OSError as exc:
            self.found.failed.append((source, f"cannot read ({exc.strerror or exc}); check the file"))
            return
        link = path.is_symlink()
        if link and not self.follow_links:
            self.found.ignored.append((source, "a symbolic link: links are never followed in this folder; not read"))
            return
        kind = _kind(st.st_mode)
        if kind is not None:
            self.found.ignored.append((source, f"{kind}, not a regular file: not read"))
            return
        if link and within is not None and not _inside(os.path.realpath(path), str(within)):
            self.found.ignored.append((source, "a symbolic link to a file outside the folder ingested: not read; "
                                               "ingest that file where it lies"))
            return
        if st.st_size > self.max_bytes:
            self.found.ignored.append((source, (
                f"{st.st_size / 2**20:.1f} MiB is over the size limit of {self.max_bytes / 2**20:.0f} MiB; "
                "raise it with --max-file-mb (or RAG_MAX_FILE_MB) to index it")))
            return
        self.found.files.append(SourceFile(root, source, path, st.st_size, link))

    def folder(self, raw: str, path: Path) -> None:
        root = path.resolve()
        shown_root = safe_name(str(root))
        self.found.roots.append(shown_root)

        def unreadable(exc: OSError, where: Path) -> None:
            rel = safe_name(where.relative_to(root).as_posix()) if where != root else "."
            self.found.failed.append((f"{safe_name(str(raw))}/{rel}" if rel != "." else safe_name(str(raw)),
                                      f"cannot list this folder ({exc.strerror or exc}); its files were not read"))
            self.found.unlisted.append((shown_root, "" if rel == "." else rel + "/"))

        # An explicit stack, not recursion (os.walk recurses once per level
        # on Python 3.11: thousands of nested folders raised RecursionError).
        # Folders in name order, depth first, a folder's files before its
        # subfolders; symbolic links to folders are never followed.
        stack = [root]
        while stack:
            folder = stack.pop()
            try:
                with os.scandir(folder) as listing:
                    entries = sorted(listing, key=lambda e: e.name)
            except OSError as exc:
                unreadable(exc, folder)
                continue
            subfolders = []
            for entry in entries:
                full = Path(entry.path)
                source = safe_name(full.relative_to(root).as_posix())
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:
                    if full not in self.skip:
                        subfolders.append(full)
                else:
                    self.consider(shown_root, source, full, named=False, within=root)
            stack.extend(reversed(subfolders))

    def named_file(self, path: Path) -> None:
        full = path.resolve() if not path.is_symlink() else path.parent.resolve() / path.name
        self.consider(safe_name(str(full.parent)), safe_name(full.name), full, named=True)


def find_files(
    paths: Iterable[str | os.PathLike[str]],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    follow_links: bool = True,
    skip: Iterable[Path] = (),
) -> FoundFiles:
    """The supported files under ``paths``, the folders walked, and every
    file or path set aside with its reason.

    With ``include`` empty, every supported file of a folder is included;
    hidden files and folders are left out unless named directly. ``exclude``
    applies to files named directly too.

    A symbolic link in a folder is read only when it leads to a file inside
    that folder (never with ``follow_links`` False); one that leads outside
    is set aside in ``ignored``, as is a link to a folder (never walked).
    The folders ``skip`` (an index's own: its files and its uploads) are
    never walked when met inside a folder.
    """
    walk = _Walk(include, exclude, max_file_bytes, follow_links, skip)
    for raw in paths:
        path = Path(raw).expanduser()
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            shown = safe_name(str(raw))
            problem = "a broken symbolic link" if path.is_symlink() else "no such file or folder; check the path"
            walk.found.failed.append((shown, problem))
            continue
        except OSError as exc:
            walk.found.failed.append((safe_name(str(raw)), f"cannot read ({exc.strerror or exc})"))
            continue
        if stat.S_ISDIR(mode):
            walk.folder(str(raw), path)
        else:
            walk.named_file(path)
    walk.found.unmatched = [g for g in (*walk.include, *walk.exclude) if g not in walk.used]
    return walk.found
