"""Tool calls, the request side: OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`, the messages of
a tool conversation, and how they reach the model's prompt.

A model whose chat template knows tools (its source mentions `tools`, the test llama.cpp's chat.cpp
makes) gets them as the template's `tools` variable, and the conversation's assistant `tool_calls`
with their `arguments` as objects, not JSON strings, since templates such as Qwen2.5's write them with
`tojson` (chat.cpp's func_args_not_string). A template that does not know tools gets them described
in the system message (a JSON line per tool and the answer format `<tool_call>{...}</tool_call>`),
and the conversation's calls and results written as text it can render: tool results as user turns,
since many such templates (Gemma's) allow only alternating user and assistant roles.

`tool_choice: none` offers no tools; `required` or a named function make the prompt demand a call and
constrain the answer to one (`tool_grammar`: the JSON schema of the allowed calls, `call_schema`, as
the request's grammar). What the model answers is parsed by toolcalls.py. Pure functions, no models.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..decoding.constraint import GrammarSpec
from .fields import ApiError, bool_field, json_kind

#: OpenAI's rule for function names.
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_TOOLS = 128
Choice = Literal["auto", "required", "named"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """The tools a request offers: OpenAI tool objects ({type: function, function: {name,
    description, parameters}}), what the model must do (`auto`, `required`, or call `name`), and
    whether it may make several calls in one answer."""

    tools: tuple[dict[str, Any], ...]
    choice: Choice = "auto"
    name: str | None = None
    parallel: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        """The functions whose calls count: all declared ones, or the one tool_choice names."""
        if self.name is not None:
            return (self.name,)
        return tuple(t["function"]["name"] for t in self.tools)


def parse_tools(body: Mapping[str, Any]) -> ToolSpec | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat request; None when no tools are
    offered (none declared, or tool_choice none)."""
    raw = body.get("tools")
    tools: list[dict[str, Any]] = []
    if raw is not None:
        if not isinstance(raw, list):
            raise ApiError(f"tools must be an array of tool objects, not {json_kind(raw)}", param="tools")
        if len(raw) > MAX_TOOLS:
            raise ApiError(f"tools holds {len(raw)} tools; at most {MAX_TOOLS} are accepted", param="tools")
        tools = [_tool(t, i) for i, t in enumerate(raw)]
        names = [t["function"]["name"] for t in tools]
        if len(set(names)) < len(names):
            raise ApiError("tools declares the same function name twice", param="tools")
    parallel = (
        bool_field(body, "parallel_tool_calls") if body.get("parallel_tool_calls") is not None else True
    )
    choice, name = _choice(body.get("tool_choice"), [t["function"]["name"] for t in tools])
    if choice == "none" or not tools:
        return None
    return ToolSpec(tuple(tools), choice, name, parallel)


def _tool(t: object, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if (
        not isinstance(t, dict)
        or t.get("type", "function") != "function"
        or not isinstance(t.get("function"), dict)
    ):
        raise ApiError(f"{where} must be {{type: function, function: {{name, parameters}}}}", param=where)
    fn = t["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ApiError(
            f"{where}.function.name must be 1-64 letters, digits, _ . or - (got {name!r})",
            param=f"{where}.function.name",
        )
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise ApiError(
            f"{where}.function.parameters must be a JSON schema object", param=f"{where}.function.parameters"
        )
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise ApiError(
            f"{where}.function.description must be a string", param=f"{where}.function.description"
        )
    out: dict[str, Any] = {"name": name}
    if description:
        out["description"] = description
    out["parameters"] = params
    return {"type": "function", "function": out}


def _choice(value: object, names: Sequence[str]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if value in ("none", "auto", "required"):
        if value == "required" and not names:
            raise ApiError("tool_choice required needs tools to call", param="tool_choice")
        return str(value), None
    fn = value.get("function") if isinstance(value, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or value.get("type", "function") != "function":  # type: ignore[union-attr]
        raise ApiError(
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if name not in names:
        raise ApiError(f"tool_choice names {name!r}, which tools does not declare", param="tool_choice")
    return "named", name


def message_fields(m: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A chat message's tool fields, checked: an assistant's `tool_calls` (arguments parsed from
    their JSON strings), a tool result's `tool_call_id` and `name`."""
    out: dict[str, Any] = {}
    if m.get("role") == "assistant" and m.get("tool_calls") is not None:
        calls = m["tool_calls"]
        if not isinstance(calls, list):
            raise ApiError(f"{where}.tool_calls must be an array", param=f"{where}.tool_calls")
        out["tool_calls"] = [_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    if m.get("role") == "tool":
        for key in ("tool_call_id", "name"):
            value = m.get(key)
            if value is not None and not isinstance(value, str):
                raise ApiError(f"{where}.{key} must be a string", param=f"{where}.{key}")
            if value is not None:
                out[key] = value
    return out


def _call(c: object, where: str) -> dict[str, Any]:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(f"{where} must be {{id, type: function, function: {{name, arguments}}}}", param=where)
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise ApiError(
                f"{where}.function.arguments is not valid JSON", param=f"{where}.function.arguments"
            ) from None
    call_id = c.get("id")  # type: ignore[union-attr]
    return {
        "id": call_id if isinstance(call_id, str) else "",
        "type": "function",
        "function": {"name": fn["name"], "arguments": args},
    }


# --- into the prompt ---------------------------------------------------------------------------------------


def template_knows_tools(template: str | None) -> bool:
    """Whether a chat template renders `tools` (chat.cpp's capability check reads the source too)."""
    return bool(template) and "tools" in template  # type: ignore[operator]


def prepare(
    messages: Sequence[dict[str, Any]], spec: ToolSpec | None, template: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages to render and the `tools` to hand the template (None: do not pass any), or a 400
    when a call is demanded of a model whose template cannot be told about tools."""
    knows = template_knows_tools(template)
    if spec is not None and spec.choice != "auto" and not knows:
        raise ApiError(
            f"tool_choice {'required' if spec.choice == 'required' else repr(spec.name)} needs a model whose "
            "chat template takes tools; this one's does not (use tool_choice auto: the tools are then "
            "described in the system message)",
            param="tool_choice",
        )
    if knows:
        out = [dict(m) for m in messages]
        if spec is not None and spec.choice != "auto":
            out = _with_system(out, demand(spec))
        return out, list(spec.tools) if spec is not None else None
    out = _as_text(messages)
    if spec is not None:
        out = _with_system(out, describe(spec))
    return out, None


def demand(spec: ToolSpec) -> str:
    if spec.name is not None:
        return f"You must answer by calling the function {spec.name}."
    return "You must answer by calling one of the functions."


def describe(spec: ToolSpec) -> str:
    """The tools in words for a template that cannot take them: one JSON line each, and the format."""
    listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in spec.tools)
    how_many = "one such block per call" if spec.parallel else "one call at most"
    return (
        "You can call these functions (JSON Schema of their arguments):\n"
        f"{listing}\n"
        "To call a function, answer with only\n"
        '<tool_call>{"name": "<function name>", "arguments": {<arguments as a JSON object>}}</tool_call>\n'
        f"({how_many}); the results come back as <tool_response> messages. "
        "If no function is needed, answer normally."
    )


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`text` at the end of the system message (one is added first when there is none)."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _as_text(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A tool conversation for a template that knows no tools: calls as `<tool_call>` text in the
    assistant's turn, results (one or several in a row) as one user turn of `<tool_response>`s."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "tool":
            block = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_results": True})
            continue
        msg = {"role": m["role"], "content": m.get("content") or ""}
        for call in m.get("tool_calls") or ():
            fn = call["function"]
            text = json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False)
            msg["content"] = f"{msg['content']}\n<tool_call>{text}</tool_call>".strip()
        out.append(msg)
    for m in out:
        m.pop("_results", None)
    return out


# --- for a grammar -----------------------------------------------------------------------------------------


#: JSON-schema keywords llama.cpp's converter cannot enforce (llama/grammar.py refuses them in a
#: response_format): in a tool's parameters they are left out of the call's grammar, which then
#: enforces the call's shape and lets the tool itself check the bounds
LOOSE = frozenset(
    {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not", "if", "then",
        "else", "dependentRequired", "dependentSchemas", "dependencies", "patternProperties",
        "propertyNames", "minProperties", "maxProperties", "unevaluatedProperties", "unevaluatedItems",
        "additionalItems", "uniqueItems", "contains", "minContains", "maxContains",
    }
)  # fmt: skip


def call_schema(spec: ToolSpec) -> dict[str, Any]:
    """The JSON schema of what the model may answer under `spec`: one call object {name, arguments}
    of an allowed function (`arguments` by that function's parameters), or with parallel calls that
    or an array of them. What `tool_grammar` constrains required / named tool_choice to."""
    allowed = set(spec.names)
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": _loose(t["function"]["parameters"]),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in spec.tools
        if t["function"]["name"] in allowed
    ]
    one: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    if not spec.parallel:
        return one
    return {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]}


def tool_grammar(spec: ToolSpec) -> GrammarSpec | None:
    """The constraint a request's tool_choice puts on the answer: for required or a named function,
    a JSON call of an allowed function (toolcalls.py reads it as a bare JSON call); None for auto."""
    if spec.choice == "auto":
        return None
    return GrammarSpec("json_schema", schema=call_schema(spec), param="tool_choice")


def _loose(schema: Any) -> Any:
    """`schema` without the keywords in LOOSE, at every depth."""
    if isinstance(schema, dict):
        return {k: _loose(v) for k, v in schema.items() if k not in LOOSE}
    if isinstance(schema, list):
        return [_loose(v) for v in schema]
    return schema
