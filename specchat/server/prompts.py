"""/v1/completions' `prompt` in all of OpenAI's forms, and the response of a request with several.

OpenAI's legacy endpoint takes a string, an array of strings, an array of token ids or an array of such
arrays, and answers each prompt with `n` choices, prompt i's answer j at index i*n+j. Evaluation
harnesses depend on the token-id forms: lm-eval's local-completions sends its contexts already
tokenized (with the server's own /tokenize) and batched, `echo: true, logprobs: 1, max_tokens: 1`, and
reads each prompt token's log-probability back, so a token-id prompt is decoded as given, never
re-tokenized (no BOS added), and its echo is its tokens' text.

The worker answers the prompts one after the other (each reuses what the cache shares with the one
before); a prompt that does not fit is refused before any is answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .fields import ApiError, is_int, json_kind
from .responses import Choice, Reply, combined, speculative, usage

#: A prompt as sent: text (tokenized with the model's tokenizer) or token ids (decoded as they are).
Prompt = str | tuple[int, ...]
#: The most prompts one request may hold, and the most choices (prompts times n) it may ask for: a
#: request holds the worker for all of them, one after another.
MAX_PROMPTS = 64
MAX_CHOICES = 64


def parse_prompts(value: Any) -> tuple[Prompt, ...]:
    """The `prompt` field as a tuple of prompts, or a 400 naming `prompt`."""
    if value is None:
        raise ApiError("prompt is required: the text to continue (or token ids)", param="prompt")
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(is_int(t) for t in value):
        items = [value]  # one prompt of token ids
    elif isinstance(value, list):
        items = value
    else:
        raise ApiError(
            f"prompt must be a string, an array of strings, an array of token ids or an array of such "
            f"arrays, not {json_kind(value)}",
            param="prompt",
        )
    if not items:
        raise ApiError("prompt is an empty array", param="prompt")
    if len(items) > MAX_PROMPTS:
        raise ApiError(f"prompt holds {len(items)} prompts; at most {MAX_PROMPTS} are served", param="prompt")
    out: list[Prompt] = []
    for i, item in enumerate(items):
        where = f"prompt[{i}]" if len(items) > 1 or not isinstance(value, str) else "prompt"
        if isinstance(item, str):
            if not item:
                raise ApiError(f"{where} is empty", param="prompt")
            out.append(item)
        elif isinstance(item, list):
            if not item:
                raise ApiError(f"{where} is an empty array of token ids", param="prompt")
            for j, t in enumerate(item):
                if not is_int(t) or t < 0:
                    raise ApiError(
                        f"{where}[{j}] must be a token id (an integer >= 0), not {t!r}", param="prompt"
                    )
            out.append(tuple(int(t) for t in item))
        else:
            raise ApiError(
                f"{where} must be a string or an array of token ids, not {json_kind(item)}", param="prompt"
            )
    return tuple(out)


def check_choices(n_prompts: int, n: int) -> None:
    """Refuse more answers in one request than the worker should be held for."""
    if n_prompts * n > MAX_CHOICES:
        raise ApiError(
            f"{n_prompts} prompts times n={n} is {n_prompts * n} choices; at most {MAX_CHOICES} per request",
            param="n",
        )


def batch_body(parts: Sequence[tuple[Reply, Sequence[Choice], int]], n: int) -> dict[str, object]:
    """The whole response of a request with several prompts: per prompt (its Reply, which echoes that
    prompt; its n choices, already at their final indexes; its cached prompt tokens) the choices as one
    prompt's response has them, in index order; `usage` adds up every prompt's tokens, and
    `speculative` is the totals of all answers. One prompt: exactly that prompt's response."""
    bodies = [reply.body(choices, cached) for reply, choices, cached in parts]
    if len(bodies) == 1:
        return bodies[0]
    stats = [c.stats for _, choices, _ in parts for c in choices]
    return {
        **{k: v for k, v in bodies[0].items() if k not in ("choices", "usage", "speculative")},
        "choices": [c for b in bodies for c in b["choices"]],  # type: ignore[attr-defined]
        "usage": usage(stats, sum(c for _, _, c in parts), n),
        "speculative": speculative(combined(stats)),
    }
