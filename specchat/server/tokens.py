"""The tokenizer endpoints' wire format: POST /tokenize, POST /detokenize, GET /tokenizer_info.

Evaluation harnesses and agents count and cut prompts with the served model's own tokenizer instead of
downloading one (lm-eval's `tokenizer_backend=remote`, context budgeting in agents), so these speak the
two dialects clients already send: vLLM's (`prompt`, `add_special_tokens`, `return_token_strs`; reply
`count`, `max_model_len`, `tokens`, `token_strs`) and llama-server's (`content`, `add_special`,
`parse_special`, `with_pieces`; reply `tokens`, as `{id, piece}` objects with `with_pieces`). The
defaults follow the dialect of the text field: `prompt` adds special tokens (BOS) as vLLM does,
`content` does not, as llama-server does, so each client gets what its own server would give.

Pure functions over dicts, like api.py: the worker thread does the tokenizing (the tokenizer belongs to
the model, whose contexts are not thread-safe), these only check fields and shape replies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..decoding.model import Model
from .fields import ApiError, bool_field, is_int, json_kind

#: The most token ids one /detokenize (or tokenized prompt array) may hold: a bound on work and reply.
MAX_TOKENS = 1 << 20


class Tokenizer(Protocol):
    """What the endpoints need from the served model (loader.LoadedEngine has it): its tokenizer,
    token texts, and the facts /tokenizer_info reports."""

    @property
    def target(self) -> Model: ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def tokenizer_facts(self) -> Mapping[str, object]:
        """n_vocab, n_ctx, bos/eos/pad ids (-1: none) and texts, add_bos, add_eos, chat_template."""
        ...


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    text: str
    add_special: bool
    parse_special: bool
    pieces: bool  # llama-server's with_pieces: {id, piece} objects instead of ids
    strings: bool  # vLLM's return_token_strs: a parallel `token_strs` list


def parse_tokenize(body: Mapping[str, Any]) -> TokenizeRequest:
    """A /tokenize body in either dialect, or a 400 naming the field."""
    name = "content" if "content" in body and "prompt" not in body else "prompt"
    value = body.get(name)
    if not isinstance(value, str):
        if value is None:
            raise ApiError("prompt (or content) is required: the text to tokenize", param="prompt")
        raise ApiError(f"{name} must be a string, not {json_kind(value)}", param=name)
    add = _either(body, "add_special_tokens", "add_special", default=name == "prompt")
    parse_special = body.get("parse_special", True)
    if not isinstance(parse_special, bool):
        raise ApiError(
            f"parse_special must be true or false, not {json_kind(parse_special)}", param="parse_special"
        )
    return TokenizeRequest(
        text=value,
        add_special=add,
        parse_special=parse_special,
        pieces=bool_field(body, "with_pieces"),
        strings=bool_field(body, "return_token_strs"),
    )


def parse_detokenize(body: Mapping[str, Any]) -> list[int]:
    """A /detokenize body's `tokens` (ids below `n_vocab` are checked by `check_ids`)."""
    return token_ids(body.get("tokens"), "tokens", required=True)


def token_ids(value: object, param: str, *, required: bool = False) -> list[int]:
    """A JSON array of token ids (non-negative integers), or a 400 naming `param`."""
    if value is None and required:
        raise ApiError(f"{param} is required: an array of token ids", param=param)
    if not isinstance(value, list):
        raise ApiError(f"{param} must be an array of token ids, not {json_kind(value)}", param=param)
    if len(value) > MAX_TOKENS:
        raise ApiError(f"{param} holds {len(value)} tokens; at most {MAX_TOKENS} are accepted", param=param)
    for i, t in enumerate(value):
        if not is_int(t) or t < 0:
            raise ApiError(f"{param}[{i}] must be a token id (an integer >= 0), not {t!r}", param=param)
    return [int(t) for t in value]


def check_ids(tokens: Sequence[int], n_vocab: int, param: str) -> None:
    """Refuse ids the vocabulary does not have (llama.cpp would read past its tables)."""
    for i, t in enumerate(tokens):
        if t >= n_vocab:
            raise ApiError(
                f"{param}[{i}] is {t}, but the vocabulary has {n_vocab} tokens (ids 0..{n_vocab - 1})",
                param=param,
            )


def tokenize_reply(
    req: TokenizeRequest, tokens: Sequence[int], pieces: Sequence[bytes], n_ctx: int
) -> dict[str, object]:
    """Both dialects' fields at once (they do not collide): `tokens` (ids, or {id, piece} objects with
    with_pieces; a piece that is not whole UTF-8 is its byte values, as llama-server sends it),
    `count`, `max_model_len` and, with return_token_strs, `token_strs`."""
    out: dict[str, object] = {"count": len(tokens), "max_model_len": n_ctx}
    if req.pieces:
        out["tokens"] = [{"id": t, "piece": _piece(p)} for t, p in zip(tokens, pieces, strict=True)]
    else:
        out["tokens"] = list(tokens)
    out["token_strs"] = [p.decode("utf-8", errors="replace") for p in pieces] if req.strings else None
    return out


def detokenize_reply(text: str) -> dict[str, object]:
    """llama-server answers `content`, vLLM `prompt`: both, so either client finds its field."""
    return {"content": text, "prompt": text}


def tokenizer_info(facts: Mapping[str, object], model: str) -> dict[str, object]:
    """GET /tokenizer_info: vLLM's names (`bos_token`, `eos_token`, `pad_token`, `model_max_length`,
    `chat_template`, ...) plus the ids, which a client without the tokenizer files needs most."""
    out: dict[str, object] = {"model": model, "tokenizer_class": "llama.cpp", "backend": "gguf"}
    for name in ("bos", "eos", "pad"):
        tid = facts.get(f"{name}_id")
        has = isinstance(tid, int) and tid >= 0
        out[f"{name}_token"] = facts.get(f"{name}_text") if has else None
        out[f"{name}_token_id"] = tid if has else None
    out["add_bos_token"] = bool(facts.get("add_bos"))
    out["add_eos_token"] = bool(facts.get("add_eos"))
    out["vocab_size"] = facts.get("n_vocab")
    out["model_max_length"] = out["max_model_len"] = facts.get("n_ctx")
    out["chat_template"] = facts.get("chat_template")
    return out


# --- on the model thread (Worker.call) -------------------------------------------------------------------


def run_tokenize(req: TokenizeRequest, backend: Tokenizer) -> dict[str, object]:
    tokens = backend.tokenize(req.text, add_special=req.add_special, parse_special=req.parse_special)
    pieces = [backend.target.token_bytes(t) for t in tokens] if req.pieces or req.strings else []
    return tokenize_reply(req, tokens, pieces, backend.target.n_ctx)


def run_detokenize(tokens: Sequence[int], backend: Tokenizer) -> dict[str, object]:
    check_ids(tokens, backend.target.n_vocab, "tokens")
    return detokenize_reply(backend.detokenize(tokens))


def _piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _either(body: Mapping[str, Any], a: str, b: str, *, default: bool) -> bool:
    """A boolean sent under either dialect's name (the first present wins)."""
    for name in (a, b):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, bool):
                raise ApiError(f"{name} must be true or false, not {json_kind(value)}", param=name)
            return value
    return default
