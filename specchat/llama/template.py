"""Rendering a GGUF's chat template (Jinja) into a prompt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def render_chat(
    template: str,
    messages: Sequence[dict[str, str]],
    *,
    bos: str,
    eos: str,
    add_generation_prompt: bool = True,
    tools: Sequence[dict[str, object]] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """Render a GGUF chat template with llama-cpp-python's Jinja2 formatter; `tools` (OpenAI tool
    objects) become the template's `tools`, for templates that describe them to the model, and
    `variables` (`chat_template_kwargs`, checked by decoding.template_vars: none of them a name the
    formatter sets) are further variables the template reads, such as `enable_thinking`.

    That formatter uses Jinja2's ImmutableSandboxedEnvironment: a template from a downloaded file is
    untrusted code, and the sandbox keeps it away from Python internals.
    """
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    fmt = Jinja2ChatFormatter(
        template=template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt
    )
    extra = dict(variables or {})
    return fmt(messages=list(messages), tools=list(tools) if tools else None, **extra).prompt
