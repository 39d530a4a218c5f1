"""The table of tuned constants in engine/README.md says what the code
holds: every row's value is the value in the code, and every numeric
constant of the timing path's modules has a row."""

from __future__ import annotations

import importlib
import inspect
import math
import re
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "engine" / "README.md"
# | `module.NAME` | value | ... or | `module.function(parameter)` | value | ... (a default argument)
ROW = re.compile(r"^\|\s*`([\w.]+)(?:\((\w+)\))?`\s*\|\s*`?([^|`]+?)`?\s*\|")
TIMING_MODULES = (
    "engine.scheduler", "engine.llama_cpp.backend", "engine.llama_cpp.loop",
    "prompt_budget.cost", "rag.qa.planner", "rag.qa.dispatch", "rag.qa.arrivals", "engine.remote.in_flight",
)
# Not tuned: the context window (the model's and the memory's), codes and markers, a memory bound.
NOT_TUNED = {"DEFAULT_N_CTX", "FOREGROUND", "BACKGROUND", "SYSTEM_SEQ", "UNKNOWN_CONTEXT", "SESSIONS_REMEMBERED"}


def table_rows() -> list[tuple[str, str | None, str]]:
    rows = []
    text = TABLE.read_text(encoding="utf-8")
    for line in text[text.index("## Tuned constants"):].splitlines():
        match = ROW.match(line)
        if match:
            rows.append((match.group(1), match.group(2), match.group(3).strip()))
    return rows


def resolve(path: str, parameter: str | None) -> object:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:i]))
            break
        except ModuleNotFoundError:
            continue
    else:
        raise AssertionError(f"{path}: no such module")
    for name in parts[i:]:
        value = getattr(value, name)
    if parameter is not None:
        value = inspect.signature(value).parameters[parameter].default
    return value


def same(code: object, written: str) -> bool:
    number = float(written.replace("_", "").replace(",", ""))
    return isinstance(code, (int, float)) and math.isclose(float(code), number, rel_tol=1e-9)


def test_every_row_holds_the_value_in_the_code():
    rows = table_rows()
    assert len(rows) >= 20, "engine/README.md lists the tuned constants of the timing path"
    wrong = [f"{path}{f'({p})' if p else ''}: table {value}, code {resolve(path, p)!r}"
             for path, p, value in rows if not same(resolve(path, p), value)]
    assert not wrong, wrong


def test_every_numeric_constant_of_the_timing_path_has_a_row():
    listed = {path.rsplit(".", 1)[1] for path, parameter, _ in table_rows() if parameter is None}
    missing = []
    for module_name in TIMING_MODULES:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            # A constant imported from another timing module is listed where it is defined.
            if name.isupper() and not name.startswith("_") and type(value) in (int, float) and name not in NOT_TUNED:
                if name not in listed:
                    missing.append(f"{module_name}.{name}")
    assert not missing, f"tuned constants missing from engine/README.md: {missing}"
