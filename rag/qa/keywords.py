"""The Python API keeps its word: a keyword renamed in a release is still
taken for one more, with a warning that names its new name, and a keyword
nobody takes is refused with the names that are taken (issue 56).

Does not: validate values (``AskOptions`` does) or know which calls take
which keywords: each public call says so.
"""

from __future__ import annotations

import warnings
from typing import Iterable, Mapping

# Public keywords renamed, old name -> new name; each is taken until the release after its rename.
RENAMED: Mapping[str, str] = {
    "index_dir": "index_location",  # Pipeline.open and Pipeline, renamed when indexes could be PostgreSQL URLs
}


def renamed(call: str, given: dict[str, object], *, stacklevel: int = 3) -> dict[str, object]:
    """``given`` with each keyword of :data:`RENAMED` under its new name, a
    DeprecationWarning naming the new name for each; a TypeError where both
    names were given.

    ``renamed("Pipeline.open", {"index_dir": "idx"}) -> {"index_location": "idx"}`` (and a warning)
    """
    out = dict(given)
    for old, new in RENAMED.items():
        if old not in out:
            continue
        if new in out and out[new] is not None:
            raise TypeError(f"{call}() got both {old!r} and {new!r}; {old!r} is the old name of {new!r}")
        warnings.warn(f"{call}(): the keyword {old!r} is renamed {new!r}; {old!r} will stop working "
                      "in the next release", DeprecationWarning, stacklevel=stacklevel)
        out[new] = out.pop(old)
    return out


def check_known(call: str, given: Iterable[str], accepted: Iterable[str],
                error: type[TypeError] = TypeError) -> None:
    """Raise ``error`` (a TypeError), naming the keywords ``call`` takes,
    for the first of ``given`` that is not among ``accepted``."""
    taken = set(accepted)
    unknown = [name for name in given if name not in taken]
    if unknown:
        raise error(f"{call}() got an unexpected keyword argument {unknown[0]!r}; "
                    f"it takes: {', '.join(sorted(taken))}")
