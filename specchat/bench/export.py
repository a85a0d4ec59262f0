"""Equivalent command lines for other servers, for users who outgrow one machine (`bench --export`).

`bench.llama_server_command` gives llama.cpp's server; this module gives vLLM's, whose speculative
decoding is configured by one JSON object (`--speculative-config`): method `draft_model` with the draft
and `num_speculative_tokens`, or method `ngram` with the prompt-lookup window. vLLM serves Hugging Face
weights rather than GGUF files, so the notes say where a name had to be guessed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .run import ServerModel


def vllm_command(
    target: ServerModel,
    drafts: Sequence[ServerModel],
    *,
    ngram: bool,
    num_speculative_tokens: int,
    ngram_min: int,
    ngram_max: int,
    ctx_size: int,
) -> tuple[list[str], list[str]]:
    """The `vllm serve` argv for these settings, and notes on what does not carry over."""
    notes: list[str] = []
    argv = ["vllm", "serve", _model(target, notes), "--max-model-len", str(ctx_size)]
    config: dict[str, object] | None = None
    if drafts:
        config = {
            "method": "draft_model",
            "model": _model(drafts[0], notes),
            "num_speculative_tokens": num_speculative_tokens,
        }
        left = [d.label or str(d.path or d.repo) for d in drafts[1:]] + (["ngram"] if ngram else [])
        if left:
            notes.append(
                f"vLLM takes one speculative method: the draft model is used, {', '.join(left)} left out"
            )
    elif ngram:
        config = {
            "method": "ngram",
            "num_speculative_tokens": num_speculative_tokens,
            "prompt_lookup_max": ngram_max,
            "prompt_lookup_min": ngram_min,
        }
    if config is not None:
        argv += ["--speculative-config", json.dumps(config)]
        notes.append(
            f"vLLM drafts up to {num_speculative_tokens} tokens every round (it has no cost model); "
            "`specchat bench` measures what drafting gives on this machine"
        )
    return argv, notes


def _model(model: ServerModel, notes: list[str]) -> str:
    """vLLM's name for a model: the original Hub repo a GGUF repo was made from (a guess from its
    name, said so), or the local file (vLLM's GGUF loading is experimental and wants --tokenizer)."""
    if model.repo is not None:
        repo = model.repo
        if repo.lower().endswith("-gguf"):
            repo = repo[: -len("-gguf")]
            notes.append(
                f"{model.repo} holds GGUF files; vLLM serves the original weights, assumed at {repo}"
            )
        return repo
    notes.append(
        f"{model.path} is a GGUF file: vLLM's GGUF support is experimental and needs --tokenizer ORG/REPO "
        "of the original model"
    )
    return str(model.path)
