"""roff's numeric expressions, as ``.if`` and ``.nr`` read them: read left
to right (roff has no precedence), parentheses first, units dropped.

Does not: put in registers or escapes (the engine does, see ``roff``).
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"\d+(?:\.\d*)?|\.\d+|<=|>=|==|<>|[-+*/%<>=&:()!]|.", re.S)


def evaluate(expr: str) -> float:
    """A roff numeric expression (left to right, parentheses first; units
    dropped), 0 for what cannot be read.

    ``evaluate("1+2*3") -> 9.0``; ``evaluate("(1+2)>2") -> 1.0``; ``evaluate("2i") -> 2.0``
    """
    expr = re.sub(r"(?<=[\d.])[icpPmMnvusfz]", "", expr[:200])
    tokens = _TOKEN.findall(expr)
    value, _ = _expression(tokens, 0, 0)
    return value


def _expression(tokens: list[str], pos: int, depth: int) -> tuple[float, int]:
    value, pos = _operand(tokens, pos, depth)
    while pos < len(tokens) and tokens[pos] in _OPS:
        op = tokens[pos]
        right, pos = _operand(tokens, pos + 1, depth)
        value = _OPS[op](value, right)
    return value, pos


def _operand(tokens: list[str], pos: int, depth: int) -> tuple[float, int]:
    if pos >= len(tokens):
        return 0.0, pos
    token = tokens[pos]
    if token == "(" and depth < 32:
        value, pos = _expression(tokens, pos + 1, depth + 1)
        return value, pos + 1 if pos < len(tokens) and tokens[pos] == ")" else pos
    if token in ("-", "+", "!") and depth < 32:
        value, pos = _operand(tokens, pos + 1, depth + 1)
        return (-value if token == "-" else float(value <= 0) if token == "!" else value), pos
    try:
        return float(token), pos + 1
    except ValueError:
        return 0.0, pos + 1


_OPS = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else 0.0, "%": lambda a, b: a % b if b else 0.0,
    "<": lambda a, b: float(a < b), ">": lambda a, b: float(a > b), "<=": lambda a, b: float(a <= b),
    ">=": lambda a, b: float(a >= b), "=": lambda a, b: float(a == b), "==": lambda a, b: float(a == b),
    "<>": lambda a, b: float(a != b), "&": lambda a, b: float(a > 0 and b > 0), ":": lambda a, b: float(a > 0 or b > 0),
}
