"""The answer's JSON contract, read from its one declaration
(``rag.qa.answer.ANSWER_CONTRACT``): every surface that returns an answer
(``rag ask --json`` in process and through the resident server,
``/v1/ask``, the OpenAI reply's ``rag`` extension, the MCP ``ask`` result)
is checked against it, so a field added to the model and lost on the way
to any of them fails a test."""

from __future__ import annotations

from rag.qa.answer import ANSWER_CONTRACT

SCHEMA = ANSWER_CONTRACT.json_schema(by_alias=True)


def _object_schema(schema: dict) -> dict | None:
    """The object schema ``schema`` names, through ``$ref``, ``anyOf`` and arrays' ``items``."""
    if "$ref" in schema:
        return SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
    for option in schema.get("anyOf", ()):
        if (found := _object_schema(option)) is not None:
            return found
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        return _object_schema(schema["items"])
    return schema if "properties" in schema else None


def missing_fields(value: object, schema: dict = SCHEMA, at: str = "answer") -> list[str]:
    """The contract's fields that ``value`` (an answer as some surface
    returned it) lacks, by path ("answer.budget.decisions[0].spliced")."""
    found = _object_schema(schema)
    if found is None or value is None:
        return []
    if isinstance(value, list):
        return [m for k, item in enumerate(value) for m in missing_fields(item, schema, f"{at}[{k}]")]
    if not isinstance(value, dict):
        return [at]
    gaps = [f"{at}.{name}" for name in found["properties"] if name not in value]
    for name, inner in found["properties"].items():
        if name in value:
            gaps += missing_fields(value[name], inner, f"{at}.{name}")
    return gaps
