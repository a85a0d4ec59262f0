"""The tool schemas real agents send, against the server's constraint limits.

tests/data/agent-tool-schemas.json.gz holds the `parameters` of 436 tools as their frameworks build
them (openai-agents 0.24, smolagents 1.26, aider 0.86, langchain-community 0.4, and the MCP servers
git, fetch, time, mcp-atlassian, workspace-mcp, excel-mcp-server, office-word-mcp-server and
awslabs-aws-api-mcp-server; how they were collected: tests/data/README.md). Every one must pass the
limits, alone and as a framework's whole tool set under `tool_choice: required`; one the converter
cannot express is a clean 400 like any unsupported schema, never a failure of the server.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from specchat.decoding.bounds import DEFAULT_LIMITS, check_gbnf_bounds, check_schema_bounds
from specchat.decoding.constraint import GrammarSpec
from specchat.errors import BadInput
from specchat.llama.grammar import gbnf_for
from specchat.server.api import MAX_DEPTH, Defaults, json_depth, parse_request
from specchat.server.fields import ApiError

DATA = Path(__file__).parent / "data" / "agent-tool-schemas.json.gz"
TOOLS: dict[str, list[dict[str, Any]]] = json.loads(gzip.decompress(DATA.read_bytes()))


def _request(tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "do it"}],
        "tools": [
            {"type": "function", "function": {"name": f"t{i}", "parameters": t["parameters"]}}
            for i, t in enumerate(tools)
        ],
        "tool_choice": "required",
    }


def test_the_collection_is_the_one_measured():
    assert sum(len(v) for v in TOOLS.values()) == 436 and len(TOOLS) == 14


@pytest.mark.parametrize("source", sorted(TOOLS))
def test_every_real_tool_schema_is_within_the_limits_and_compiles_or_is_refused_cleanly(source):
    for tool in TOOLS[source]:
        schema = tool["parameters"]
        check_schema_bounds(schema)  # never refused for its size: each limit is 10x what these ask
        try:
            gbnf = gbnf_for(GrammarSpec("json_schema", schema=schema))
        except BadInput:  # a keyword or pattern syntax the converter cannot enforce: a 400
            continue
        check_gbnf_bounds(gbnf)
        assert len(gbnf) < DEFAULT_LIMITS.grammar_chars // 10, tool["name"]


@pytest.mark.parametrize("source", sorted(TOOLS))
def test_a_frameworks_whole_tool_set_under_tool_choice_required_is_accepted(source):
    body = _request(TOOLS[source])
    assert json_depth(body) * 10 <= MAX_DEPTH + 20  # the body limit keeps ten times these depths
    try:
        req = parse_request("chat", body, Defaults(max_tokens=8))
    except ApiError as exc:  # a tool that is no JSON schema at all (smolagents' `"type": "audio"`)
        assert exc.status == 400 and "is not a valid JSON schema" in exc.message, exc.message
        assert source == "smolagents"
        return
    assert req.grammar is not None and req.grammar.param == "tool_choice"


def _tool(source: str, name: str) -> dict[str, Any]:
    return next(t for t in TOOLS[source] if t["name"] == name)


def test_a_real_200000_character_bound_is_served_and_the_answer_matches_it(tiny_url):
    """excel-mcp-server's write_vba_module asks for `code` of at most 200,000 characters: the
    converter's own grammar for it would nest 200,000 groups deep; written as repetitions it is
    served, and the answer is the start of JSON the schema allows."""
    import httpx

    schema = _tool("excel-mcp-server", "write_vba_module")["parameters"]
    body = {"messages": [{"role": "user", "content": "write it"}], "max_tokens": 24, "json_schema": schema}
    r = httpx.post(f"{tiny_url}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("{")
