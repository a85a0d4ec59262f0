"""Extra variables for a chat template (`chat_template_kwargs`), checked alike by every front end.

A GGUF's chat template is Jinja, and besides the conversation it may read variables of its own: Qwen3's
`enable_thinking` (false: the template writes an empty think block, so the model answers without
reasoning first), gpt-oss's `reasoning_effort`, and so on. llama-server takes them as
`--chat-template-kwargs JSON` and as the request field `chat_template_kwargs` (the request's keys
over the command line's); specchat takes the same in `run`, `chat`, `serve` and the Python API and
hands them to the template as they are (`llama.template.render_chat`).

Why check them here, once, before anything loads or decodes:
  - a name specchat itself gives the template (`messages`, `tools`, `add_generation_prompt`, ...)
    would collide with it in the render call, and the error would then blame the model's template;
  - `enable_thinking` given as a string ("false", from a command line or a client) is true to Jinja,
    so thinking would stay on without a word: llama-server refuses a string there too;
  - values are JSON values, what the server's field can carry, so every front end means the same.

Pure standard library: the server, the CLI and the Python API each word the error their own way
(a 400 naming the field, one line naming the flag, a ValueError naming the keyword).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .settings import shown

#: The variables specchat (through llama-cpp-python's Jinja2ChatFormatter) gives every template itself.
RESERVED = frozenset(
    {
        "messages",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "bos_token",
        "eos_token",
        "add_generation_prompt",
        "raise_exception",
        "strftime_now",
    }
)
#: The variables whose values must be true or false, or null (llama-server's rule for `enable_thinking`).
BOOLEAN = frozenset({"enable_thinking"})
#: The deepest a value may nest (a request body is bounded deeper already: server/api.py's MAX_DEPTH).
MAX_DEPTH = 64


class TemplateVarsError(ValueError):
    """Template variables that cannot be used; `str()` says why, starting with the name it was given."""


def check_template_vars(value: object, name: str) -> dict[str, Any]:
    """`value` as the template's extra variables (a copy), or TemplateVarsError naming `name` (the
    flag, field or keyword they came from). None is no variables."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TemplateVarsError(
            f"{name} must be an object mapping template variables to values, such as enable_thinking "
            f"to false (got {shown(value)})"
        )
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise TemplateVarsError(f"{name}: variable names must be non-empty strings (got {shown(key)})")
        if key in RESERVED:
            raise TemplateVarsError(
                f"{name} cannot set `{key}`: specchat gives the template that variable itself"
            )
        if key in BOOLEAN and not isinstance(item, bool | None):
            raise TemplateVarsError(
                f"{name}: `{key}` must be true or false, not {_kind(item)} (a string such as "
                '"false" would count as true in the template)'
            )
        if not _is_json(item, MAX_DEPTH):
            raise TemplateVarsError(
                f"{name}: `{key}` must be a JSON value (null, true/false, a number, a string, or "
                f"arrays and objects of them) (got {shown(item)})"
            )
        out[key] = item
    return out


def _is_json(value: object, depth: int) -> bool:
    """Whether `value` is what JSON can say (objects with string keys), nested at most `depth` deep."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if depth <= 0:
        return False
    if isinstance(value, list | tuple):
        return all(_is_json(v, depth - 1) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_json(v, depth - 1) for k, v in value.items())
    return False


def _kind(value: object) -> str:
    """What a value is, as the message says it (JSON's words: it came from JSON, most often)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {shown(value)}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, list | tuple):
        return "an array"
    return "an object" if isinstance(value, Mapping) else shown(value)
