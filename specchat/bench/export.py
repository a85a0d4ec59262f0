"""Equivalent command lines for other servers, for users who outgrow one machine (`bench --export`).

`llama_server_command` gives llama.cpp's server and `vllm_command` vLLM's, whose speculative
decoding is configured by one JSON object (`--speculative-config`): method `draft_model` with the draft
and `num_speculative_tokens`, or method `ngram` with the prompt-lookup window. vLLM serves Hugging Face
weights rather than GGUF files, so the notes say where a name had to be guessed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerModel:
    """Where llama-server finds a model: a local path, or a Hub repo (+ file or quant) it downloads."""

    path: str | None = None
    repo: str | None = None
    file: str | None = None
    quant: str | None = None
    label: str = ""

    def args(self, *, draft: bool) -> list[str]:
        if self.path is not None:
            return ["-md" if draft else "-m", self.path]
        repo = f"{self.repo}:{self.quant}" if self.quant else str(self.repo)
        if draft:  # llama-server's draft Hub option takes REPO[:QUANT] only
            return ["-hfd", repo]
        return ["-hf", str(self.repo), "-hff", self.file] if self.file else ["-hf", repo]


def llama_server_command(
    target: ServerModel,
    drafts: Sequence[ServerModel],
    *,
    ngram: bool = False,
    draft_max: int,
    draft_min: int = 0,
    p_min: float,
    gpu_layers: int | None,
    draft_gpu_layers: int | None,
    ctx_size: int,
    threads: int | None = None,
) -> tuple[list[str], list[str]]:
    """The `llama-server` argv equivalent to these settings, and notes on what does not carry over.

    llama-server takes one draft model and has no cost model: it drafts up to --draft-max tokens every
    round (stopping early below --draft-p-min confidence). The notes say so rather than pretend that
    `-k auto` or the n-gram drafter carry over. GPU layers default to 99 (all), as specchat offloads
    everything by default when the build can.
    """
    notes: list[str] = []
    argv = ["llama-server", *target.args(draft=False)]
    if drafts:
        argv += drafts[0].args(draft=True)
        argv += ["--draft-max", str(draft_max), "--draft-min", str(draft_min), "--draft-p-min", f"{p_min:g}"]
        if len(drafts) > 1:
            left = ", ".join(d.label or str(d.path or d.repo) for d in drafts[1:])
            notes.append(f"llama-server takes one draft model: the first is used, {left} left out")
    argv += ["-ngl", str(_layers(gpu_layers))]
    if drafts:
        argv += ["-ngld", str(_layers(draft_gpu_layers if draft_gpu_layers is not None else gpu_layers))]
    argv += ["-c", str(ctx_size)]
    if threads is not None:
        argv += ["-t", str(threads)]
    if ngram:
        notes.append(
            "the n-gram drafter is left out (recent llama-server builds offer --spec-type ngram-simple)"
        )
    if drafts:
        notes.append(
            f"llama-server has no cost model: it drafts up to {draft_max} tokens every round, which can be "
            "slower than plain decoding on CPUs; `specchat bench` measures whether it pays here"
        )
    return argv, notes


def _layers(n: int | None) -> int:
    return 99 if n is None or n < 0 else n


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
