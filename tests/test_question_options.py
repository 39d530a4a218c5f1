"""A question's options, declared once (rag.qa.options.AskOptions with
``Offered``): an option added there is found on every front end built from
the declaration (the command line, the HTTP bodies, the resident wire, MCP's
ask tool, the LangChain retriever), and each surface offers exactly what the
declaration says (pure logic: no model, no server)."""

from __future__ import annotations

import inspect
from typing import Annotated, Literal

import pytest
import typer
from pydantic import Field, create_model
from typer.testing import CliRunner

from rag.cli.asked import with_question_options
from rag.integrations.langchain import BudgetedRetriever, retriever_fields
from rag.mcp.server import asked_parameters
from rag.qa.options import SURFACES, AskOptions, Offered, offered
from rag.service.schemas import AskBody, ChatBody, asked_fields


class WithTone(AskOptions):
    """AskOptions with one option more, offered everywhere, as a developer would add it."""

    tone: Annotated[Literal["plain", "brief"], Offered(*SURFACES, flags=("-t",))] = Field(
        "plain", description="How the answer is worded")


def test_an_option_declared_once_is_on_the_command_line():
    app = typer.Typer()
    seen = {}

    def command(question: str = typer.Argument(...), asked: dict | None = None) -> None:
        seen.update(asked or {})

    app.command()(with_question_options(command, WithTone))
    app.command("other")(lambda: None)  # two commands: typer names the first
    shown = CliRunner().invoke(app, ["command", "--help"])
    assert "--tone" in shown.output and "How the answer is worded" in shown.output
    ran = CliRunner().invoke(app, ["command", "why?", "-t", "brief", "-k", "3"])
    assert ran.exit_code == 0, ran.output
    assert seen["tone"] == "brief" and seen["max_k"] == 3
    refused = CliRunner().invoke(app, ["command", "why?", "--tone", "loud"])
    assert refused.exit_code != 0


def test_an_option_declared_once_is_in_the_http_bodies_and_on_the_wire():
    body = create_model("Body", **asked_fields(options=WithTone))
    assert "tone" in body.model_json_schema()["properties"]
    assert body(tone="brief").tone == "brief"
    with pytest.raises(Exception):
        body(tone="loud")
    wire = WithTone(tone="brief", target_ttft=1.5).wire()
    assert wire["tone"] == "brief" and wire["target_ttft_s"] == 1.5  # by wire name


def test_an_option_declared_once_is_an_argument_of_mcps_ask_and_a_retriever_field():
    parameters = {p.name: p for p in asked_parameters(512, WithTone)}
    assert "tone" in parameters and parameters["tone"].default is None  # None: the set-up's default
    assert "tone" in retriever_fields(WithTone)


@pytest.mark.parametrize("surface", SURFACES)
def test_each_surface_offers_what_the_declaration_says(surface):
    declared = {o.name for o in offered(surface)}
    if surface == "cli":
        from rag.cli import ask as commands

        for command in (commands.ask, commands.chat):
            names = set(inspect.signature(command).parameters)
            assert declared <= names, declared - names
    elif surface == "http":
        wires = {o.wire for o in offered("http")}
        assert wires <= set(AskBody.model_fields) and wires - {"max_tokens"} <= set(ChatBody.model_fields)
        assert AskBody(question="q", target_ttft_s=1.0, max_k=2).options() == {"target_ttft": 1.0, "max_k": 2}
        # Read back what the resident client sends: the same options.
        sent = AskOptions.of(max_k=3, evidence="last", no_target=True)
        assert AskOptions.of(**AskBody(question="q", **sent.wire()).options()) == sent
    elif surface == "mcp":
        assert {p.name for p in asked_parameters(512)} == declared
    else:
        assert declared <= set(BudgetedRetriever.model_fields)


def test_an_unknown_surface_is_refused():
    with pytest.raises(ValueError, match="unknown surface"):
        Offered("fax")
    with pytest.raises(ValueError, match="unknown surface"):
        offered("fax")
